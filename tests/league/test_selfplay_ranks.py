"""Self-play across two data-parallel ranks in real processes: one league for the world. Each rank's
actors' games count once, on every rank, with identical ratings; snapshots are the same on both; a world
resumed from its common checkpoint has the league it saved."""

from __future__ import annotations

import grpc

from actorlearner.league import SELF
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from league_streams import game, spec_fields, ttt_batch, ttt_hello
from multiagent_envs import RANDOM, TICTACTOE
from procs import free_port, listening_port, start_rank, status, stop, wait_until
from streams import RawStream

RANK_FLAGS = ["--env", TICTACTOE, "--league-scripted", RANDOM, "--league-snapshot-every", "2",
              "--league-max-snapshots", "3", "--publish-every", "1", "--min-replay-size", "64", "--batch-size", "32",
              "--max-updates", "12", "--eval-every", "0"]
# Rank 0's actor wins and draws against the scripted player, rank 1's loses to it and draws with itself.
RESULTS = {0: [game(RANDOM, pb.OUTCOME_WIN), game(RANDOM, pb.OUTCOME_DRAW, seat="o")],
           1: [game(RANDOM, pb.OUTCOME_LOSS, seat="o"), game(SELF, pb.OUTCOME_DRAW)]}
BATCHES = 10  # per rank, 8 transitions each: past --min-replay-size, so that the world trains and snapshots


def start_world(tmp_path) -> tuple[list, list[int]]:
    address = f"127.0.0.1:{free_port()}"
    ranks = [start_rank(rank, address, *RANK_FLAGS, "--checkpoint-dir", str(tmp_path / "ckpt")) for rank in (0, 1)]
    return ranks, [listening_port(rank) for rank in ranks]


def league_view(league: pb.LeagueStatus) -> tuple:
    """What every rank must show alike: counts, the rating, and each opponent's record, rating and version."""
    return (league.games, league.unrated_games, league.rating,
            sorted((o.opponent.id, o.opponent.version, o.opponent.rating, o.wins, o.draws, o.losses, o.transitions)
                   for o in league.opponents))


def same_league_on_both(ports: list[int], games: int) -> tuple | None:
    """The league both ranks show, once it holds ``games`` games and the snapshots of every update."""
    views = [league_view(status(port).league) for port in ports]
    newest = any(opponent == "v12" for opponent, *_ in views[0][3])  # the last update's snapshot, taken at a round after
    return views[0] if newest and views[0][0] == games and views[0] == views[1] else None


def test_two_ranks_keep_one_league_count_each_ranks_games_once_and_resume_it(tmp_path):
    ranks, ports = start_world(tmp_path)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{ports[0]}") as channel:
            fields = spec_fields(pb_grpc.LearnerStub(channel).GetSpec(pb.LearnerSpecRequest(), timeout=30))
        streams = [RawStream(f"127.0.0.1:{port}", ttt_hello(f"player-{rank}")) for rank, port in enumerate(ports)]
        for rank, stream in enumerate(streams):  # the world's exploration ladder: 2 actors per rank, interleaved
            settings = stream.next("welcome").welcome.settings
            assert settings.league.enabled and (settings.actor_index, settings.num_actors) == (rank, 4)
        for seq in range(1, BATCHES + 1):
            for rank, stream in enumerate(streams):
                stream.send(ttt_batch(fields, seq, RESULTS[rank], [RANDOM, SELF]))
                assert stream.next("ack").ack.seq == seq
        again = ttt_batch(fields, BATCHES, RESULTS[1], [RANDOM, SELF])  # a resent batch counts once
        streams[1].send(again)
        assert streams[1].next("ack").ack.reason == "duplicate"
        games = 2 * 2 * BATCHES
        view = wait_until(lambda: same_league_on_both(ports, games), 120, "both ranks to show the same league of "
                          f"{games} games after 12 updates")
        records = {opponent: (wins, draws, losses) for opponent, _, _, wins, draws, losses, _ in view[3]}
        assert records[RANDOM] == (BATCHES, BATCHES, BATCHES) and records[SELF] == (0, BATCHES, 0)
        snapshots = [(opponent, version) for opponent, version, *_ in view[3] if version >= 0]
        assert sorted(snapshots) == [("v10", 10), ("v12", 12), ("v8", 8)], "3 kept of every 2nd of 12 versions"
        for stream in streams:
            stream.close()
    finally:
        codes = stop(*ranks)
    assert codes == [0, 0]

    ranks, ports = start_world(tmp_path)  # the common checkpoint: written by both at their stop
    try:
        resumed = wait_until(lambda: same_league_on_both(ports, games), 120, "the resumed ranks to show the league")
        assert resumed == view
    finally:
        codes = stop(*ranks)
    assert codes == [0, 0]
