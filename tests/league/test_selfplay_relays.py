"""Self-play through relays: the league passed on (each snapshot's weights once per stream, before the menu
naming it), and games counted once when the relay that carried them is SIGKILLed and the actor resends."""

from __future__ import annotations

from actorlearner.config import RelayConfig
from actorlearner.league import SELF
from actorlearner.relay.server import serve as serve_relay
from actorlearner.transport import SecurityConfig, open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from league_streams import game, snapshots_then_menu, ttt_batch, ttt_hello, ttt_learner_at
from multiagent_envs import RANDOM
from procs import start_relay, stop, wait_until
from streams import RawStream


def welcomed(address: str, hello: pb.ActorMessage) -> RawStream:
    """A stream that got its Welcome: a relay process refuses streams (UNAVAILABLE) until it is connected upstream."""
    def attempt() -> RawStream | None:
        stream = RawStream(address, hello)
        try:
            stream.next("welcome")
        except AssertionError:
            return None
        return stream
    return wait_until(attempt, 60, f"a stream through {address} to be welcomed")


def test_a_relay_passes_the_league_on_each_snapshot_once_per_stream(tmp_path):
    with ttt_learner_at(tmp_path) as (learner, address):
        config = RelayConfig(upstream=address, port=0, relay_id="league-relay", reconnect_initial=0.05)
        with serve_relay(config) as (relay, relay_port):
            wait_until(lambda: relay.up, 60, "the relay to connect upstream")
            early = RawStream(f"127.0.0.1:{relay_port}", ttt_hello("early"))
            assert early.next("welcome").welcome.settings.league.enabled  # the learner's Welcome, passed on
            assert [o.id for o in early.next("league").league.opponents] == [SELF, RANDOM]
            for version in range(1, 5):  # snapshots at versions 2 and 4
                learner.progress.version = version
                learner.training.publish(); learner.publishing.flush()
            snapshots, menu = snapshots_then_menu(early, 4)
            assert [(s, v) for s, v, _ in snapshots] == [("v2", 2), ("v4", 4)] and menu == [SELF, RANDOM, "v2", "v4"]
            late = RawStream(f"127.0.0.1:{relay_port}", ttt_hello("late"))  # joins after both snapshots
            assert late.next("welcome").welcome.settings.league.enabled
            snapshots, menu = snapshots_then_menu(late, 4)
            assert sorted((s, v) for s, v, _ in snapshots) == [("v2", 2), ("v4", 4)] and menu == [SELF, RANDOM, "v2", "v4"]
            by_id = {a.actor_id: a for a in learner.status().actors}
            assert by_id["early"].via == "league-relay" and by_id["league-relay"].relay
            with open_channel(f"127.0.0.1:{relay_port}", SecurityConfig(), []) as channel:  # status at the relay
                shown = pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=30)
            assert {a.actor_id for a in shown.actors} == {"early", "late"}
            assert shown.league.snapshots == 2 and [o.opponent.id for o in shown.league.opponents] == menu
            early.close()
            late.close()


def test_games_acked_through_a_relay_killed_mid_game_count_once(tmp_path):
    with ttt_learner_at(tmp_path) as (learner, address):
        relay, relay_port = start_relay(int(address.rsplit(":", 1)[1]), "doomed-relay")
        try:
            stream = welcomed(f"127.0.0.1:{relay_port}", ttt_hello("p1"))
            first = [game(RANDOM, pb.OUTCOME_WIN), game(SELF, pb.OUTCOME_DRAW, seat="o")]
            stream.send(ttt_batch(learner.fields, 1, first, [RANDOM, SELF]))
            assert stream.next("ack").ack.seq == 1
            stream.send(ttt_batch(learner.fields, 2, [game(RANDOM, pb.OUTCOME_LOSS)], [RANDOM]))
            wait_until(lambda: learner.status().league.games == 3, 60, "the learner to count batch 2's game")
            relay.kill()  # batch 2 stored; its ack may never reach the actor
            relay.wait()
            stream.cancel()
        finally:
            stop(relay)
        # The actor resends its window (batch 2) to the learner itself, then plays on.
        direct = RawStream(address, ttt_hello("p1"), ttt_batch(learner.fields, 2, [game(RANDOM, pb.OUTCOME_LOSS)], [RANDOM]),
                           ttt_batch(learner.fields, 3, [game(RANDOM, pb.OUTCOME_WIN)], [RANDOM]))
        assert direct.next("ack").ack.reason == "duplicate"
        assert direct.next("ack").ack.seq == 3
        league = learner.status().league
        by_id = {o.opponent.id: o for o in league.opponents}
        assert league.games == 4
        assert (by_id[RANDOM].wins, by_id[RANDOM].losses, by_id[SELF].draws) == (2, 1, 1)
        direct.close()
