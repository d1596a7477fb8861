"""Self-play: the league (snapshots, bounds, draws, ratings), seats of multi-agent envs, and
learner sessions and batches that carry games (exactly once, checkpoints, hostile input)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import gymnasium
import numpy as np
import pytest
import torch

from actorlearner import wire
from actorlearner.config import LeagueConfig, LearnerConfig
from actorlearner.envs.tictactoe import heuristic_player, random_player, tic_tac_toe
from actorlearner.league import SELF, League, SeatEnv
from actorlearner.league.opponents import ScriptedPlayer, one_row
from actorlearner.league.ratings import INITIAL_RATING, expected_score
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.metrics import serve_metrics
from actorlearner.v1 import learner_pb2 as pb
from league_streams import game, ttt_batch, ttt_config, ttt_hello, ttt_learner_at
from multiagent_envs import HEURISTIC, RANDOM, TICTACTOE
from procs import wait_until
from streams import RawStream



def results_batch(games: list[pb.GameResult], opponents: list[str], n: int = 4) -> pb.TrajectoryBatch:
    return pb.TrajectoryBatch(seq=1, num_transitions=n, games=games, opponents=opponents)


def league_of(**options) -> League:
    return League(LeagueConfig(**options), chunk_bytes=1 << 20)


def payload(value: float) -> bytes:
    return wire.encode_state_dict({"w": torch.full((3,), value)})


# -- the league ---------------------------------------------------------------------------


def test_snapshots_every_k_versions_stay_bounded_dropping_the_oldest():
    league = league_of(snapshot_every=5, max_snapshots=3)
    taken = [v for v in range(1, 41) if league.published(v, payload(v))]
    assert taken == [5, 10, 15, 20, 25, 30, 35, 40]
    assert league.snapshots == 3
    assert [o.opponent.id for o in league.status().opponents] == [SELF, "v30", "v35", "v40"]
    assert not league.published(40, payload(40)), "a version published again (after a resume) is taken once"


def test_a_full_league_can_drop_its_weakest_snapshot_instead():
    league = league_of(snapshot_every=1, max_snapshots=2, drop="weakest")
    league.published(1, payload(1))
    league.published(2, payload(2))
    for _ in range(10):  # v1 loses every game: its rating falls below v2's
        league.record(results_batch([game("v1", pb.OUTCOME_WIN)], ["v1"]))
    league.published(3, payload(3))
    assert sorted(o.opponent.id for o in league.status().opponents if o.opponent.version >= 0) == ["v2", "v3"]


def test_elo_and_records_move_with_results_and_self_games_move_no_rating():
    league = league_of(snapshot_every=1, elo_k=32.0, scripted=RANDOM)
    league.published(1, payload(1))
    league.record(results_batch([game("v1", pb.OUTCOME_WIN), game(RANDOM, pb.OUTCOME_DRAW),
                                 game(SELF, pb.OUTCOME_LOSS)], ["v1", RANDOM, SELF], n=12))
    status = league.status()
    by_id = {o.opponent.id: o for o in status.opponents}
    assert (by_id["v1"].wins, by_id[RANDOM].draws, by_id[SELF].losses) == (1, 1, 1)
    assert by_id["v1"].transitions == 12
    assert status.games == 3
    win = 32.0 * (1 - expected_score(INITIAL_RATING, INITIAL_RATING))
    assert by_id["v1"].opponent.rating == pytest.approx(INITIAL_RATING - win)
    assert by_id[SELF].opponent.rating == INITIAL_RATING
    assert status.rating > INITIAL_RATING


def test_pfsp_draws_opponents_the_policy_beats_less_often_more_often():
    league = league_of(snapshot_every=1, self_play=0.2, sampling="pfsp")
    league.published(1, payload(1))
    league.published(2, payload(2))
    league.record(results_batch([game("v1", pb.OUTCOME_WIN)] * 8 + [game("v2", pb.OUTCOME_LOSS)] * 8, []))
    league.published(3, payload(3))  # a membership change sends new weights at once
    weights = {o.id: o.weight for o in league.menu(set())[1][-1].league.opponents}
    assert weights[SELF] == pytest.approx(0.2)
    assert weights["v2"] > 5 * weights["v1"]
    assert sum(weights.values()) == pytest.approx(1.0)
    uniform = league_of(snapshot_every=1, sampling="uniform", self_play=0.0)
    uniform.published(1, payload(1))
    uniform.published(2, payload(2))
    assert {o.id: o.weight for o in uniform.menu(set())[1][-1].league.opponents} == {SELF: 0.0, "v1": 0.5, "v2": 0.5}


def test_a_stream_gets_each_snapshots_weights_once_then_the_menu():
    league = league_of(snapshot_every=1)
    league.published(1, payload(1))
    sent: set[str] = set()
    _, first = league.menu(sent)
    assert [m.WhichOneof("kind") for m in first] == ["policy_update", "league"]
    assert first[0].policy_update.opponent == "v1" and first[0].policy_update.version == 1
    league.published(2, payload(2))
    _, second = league.menu(sent)
    assert [m.policy_update.opponent for m in second[:-1]] == ["v2"]


def test_league_state_round_trips_members_records_ratings_and_weights():
    league = league_of(snapshot_every=1, scripted=RANDOM)
    for version in (1, 2):
        league.published(version, payload(version))
    league.record(results_batch([game("v1", pb.OUTCOME_WIN), game(RANDOM, pb.OUTCOME_LOSS),
                                 game("gone", pb.OUTCOME_WIN)], ["v1"]))
    restored = league_of(snapshot_every=1, scripted=RANDOM)
    restored.load_state(league.state())
    assert without_weights(restored.status()) == without_weights(league.status()), \
        "draw weights are recomputed on loading; everything else is as saved"
    assert restored.sample_snapshots(2) == league.sample_snapshots(2)


def without_weights(status: pb.LeagueStatus) -> pb.LeagueStatus:
    for opponent in status.opponents:
        opponent.opponent.weight = 0.0
    return status


def test_malformed_games_are_refused_before_anything_counts():
    league = league_of()
    for bad, why in [([game("v1", 0)], "no valid outcome"), ([game("v1", 7)], "no valid outcome"),
                     ([game("", pb.OUTCOME_WIN)], "1 to 256 characters"),
                     ([game("v1", pb.OUTCOME_WIN, length=0)], "length 0"),
                     ([game("x" * 300, pb.OUTCOME_WIN)], "1 to 256 characters"),
                     ([game("v1", pb.OUTCOME_WIN)] * 65537, "at most 65536 games")]:
        with pytest.raises(wire.WireError, match=why):
            league.check(results_batch(bad, []))
    assert league.status().games == 0


# -- a seat of a multi-agent env --------------------------------------------------------------


class Relay:
    """A three-agent race: every live agent moves each step; an agent that reaches 3 leaves with +1,
    the others go on; everyone still in at step 6 is truncated."""

    possible_agents = ["a", "b", "c"]

    def __init__(self):
        from gymnasium import spaces
        self._obs, self._act = spaces.Box(0, 10, (1,), np.float32), spaces.Discrete(2)
        self.agents: list[str] = []

    def observation_space(self, agent):
        return self._obs

    def action_space(self, agent):
        return self._act

    def reset(self, seed=None, options=None):
        self.agents, self.position, self.t = list(self.possible_agents), dict.fromkeys(self.possible_agents, 0), 0
        return {a: np.array([0.0], np.float32) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        assert set(actions) == set(self.agents), (actions, self.agents)
        self.t += 1
        for agent, move in actions.items():
            self.position[agent] += int(move)
        done = {a: self.position[a] >= 3 for a in self.agents}
        cut = {a: self.t >= 6 and not done[a] for a in self.agents}
        obs = {a: np.array([self.position[a]], np.float32) for a in self.agents}
        rewards = {a: 1.0 if done[a] else 0.0 for a in self.agents}
        infos = {a: {"t": self.t} for a in self.agents}
        self.agents = [a for a in self.agents if not (done[a] or cut[a])]
        return obs, rewards, done, cut, infos

    def close(self):
        pass


def test_the_seat_rotates_and_a_seat_that_leaves_early_waits_for_the_games_outcome():
    games = []
    opponent = ScriptedPlayer("slow", lambda obs: 0)  # never moves: is truncated at step 6
    env = SeatEnv(Relay(), lambda: opponent, games.append, first_seat=1)
    seats = []
    for _ in range(3):
        obs, _ = env.reset()
        seats.append(env.seat)
        steps, done = 0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(1)
            steps += 1
            done = terminated or truncated
        assert (steps, reward, terminated, truncated, obs[0]) == (3, 1.0, True, False, 3.0)
    assert seats == ["b", "c", "a"]
    assert [(g.opponent, g.outcome, g.length) for g in games] == [("slow", "win", 6)] * 3, \
        "the game is played out to step 6 after the seat left at step 3"


def test_turn_based_seat_sees_only_its_own_moves_and_collects_the_replys_reward():
    games = []
    env = SeatEnv(tic_tac_toe(), lambda: ScriptedPlayer(HEURISTIC, heuristic_player(None, None, 0)), games.append)
    policy = random_player(None, None, 1)
    for _ in range(40):
        obs, _ = env.reset()
        done, total = False, 0.0
        while not done:
            assert obs["action_mask"].sum() in ((9, 7, 5, 3, 1) if env.seat == "x" else (8, 6, 4, 2)), "only the mover observes"
            obs, reward, terminated, truncated, _ = env.step(policy(obs))
            total += reward
            done = terminated or truncated
        assert {"win": 1.0, "draw": 0.0, "loss": -1.0}[games[-1].outcome] == total
    assert {g.seat for g in games} == {"x", "o"}
    assert sum(g.outcome == "loss" for g in games) > sum(g.outcome == "win" for g in games), \
        "a random seat loses more often than it beats the heuristic"


def test_a_policy_player_batches_its_one_observation_as_a_vector_env_of_one_would():
    space = gymnasium.spaces.Dict({"board": gymnasium.spaces.Box(-1, 1, (3, 3), np.float32),
                                   "turn": gymnasium.spaces.Discrete(2),
                                   "pair": gymnasium.spaces.Tuple((gymnasium.spaces.MultiBinary(4),
                                                                   gymnasium.spaces.Box(0, 9, (), np.int16)))})
    space.seed(0)
    for _ in range(5):
        observation = space.sample()
        ours = one_row(space, observation)
        theirs = gymnasium.vector.utils.concatenate(space, [observation],
                                                    gymnasium.vector.utils.create_empty_array(space, 1))
        assert ours.keys() == theirs.keys() and len(ours["pair"]) == len(theirs["pair"]) == 2
        for mine, expected in [(ours["board"], theirs["board"]), (ours["turn"], theirs["turn"]),
                               *zip(ours["pair"], theirs["pair"])]:
            assert mine.dtype == expected.dtype and mine.shape == expected.shape
            np.testing.assert_array_equal(mine, expected)


# -- learner sessions and batches ---------------------------------------------------------------


@pytest.fixture
def ttt_learner(tmp_path):
    with ttt_learner_at(tmp_path) as served:
        yield served


def test_a_self_play_session_gets_league_settings_snapshot_weights_and_the_menu(ttt_learner):
    learner, address = ttt_learner
    stream = RawStream(address, ttt_hello("a1"))
    welcome = stream.next("welcome").welcome
    assert welcome.settings.league.enabled
    assert [o.id for o in stream.next("league").league.opponents] == [SELF, RANDOM]
    for version in range(1, 5):  # snapshots at versions 2 and 4
        learner.progress.version = version
        learner.training.publish(); learner.publishing.flush()
    updates = []
    while len(updates) < 2:
        message = stream.next("policy_update")
        if message.policy_update.opponent:
            updates.append(message.policy_update)
    assert [(u.opponent, u.version) for u in updates] == [("v2", 2), ("v4", 4)]
    snapshot = wire.decode_state_dict(updates[1].payload)
    own = learner.trainer.policy_state_dict()
    assert all(torch.equal(snapshot[k], own[k]) for k in own)
    menu = wait_until(lambda: next((m.league for m in stream.messages() if m.WhichOneof("kind") == "league"
                                    and len(m.league.opponents) == 4), None), 30, "the menu with both snapshots")
    assert [o.id for o in menu.opponents] == [SELF, RANDOM, "v2", "v4"]
    stream.close()
    server, metrics_port = serve_metrics("127.0.0.1", 0, learner.metrics)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            scraped = response.read().decode()
    finally:
        server.shutdown()
    assert "actorlearner_league_rating 1000.0" in scraped and "actorlearner_league_snapshots 2.0" in scraped
    assert 'actorlearner_league_opponent_rating{opponent="v4"} 1000.0' in scraped
    printed = subprocess.run([sys.executable, "-m", "actorlearner", "status", "--learner", address],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert "league: rating 1000, 0 games, 2/3 snapshots" in printed.stdout and RANDOM in printed.stdout


def test_games_count_once_however_often_their_batch_comes(ttt_learner):
    learner, address = ttt_learner
    games = [game(RANDOM, pb.OUTCOME_WIN), game(SELF, pb.OUTCOME_DRAW, seat="o")]
    first = RawStream(address, ttt_hello("a1"), ttt_batch(learner.fields, 1, games, [RANDOM, SELF]))
    assert first.next("ack").ack.reason == ""
    first.cancel()  # the actor's stream breaks: it resends its window on a new one
    again = RawStream(address, ttt_hello("a1"), ttt_batch(learner.fields, 1, games, [RANDOM, SELF]),
                      ttt_batch(learner.fields, 2, [game(RANDOM, pb.OUTCOME_LOSS)], [RANDOM]))
    assert again.next("ack").ack.reason == "duplicate"
    assert again.next("ack").ack.seq == 2
    by_id = {o.opponent.id: o for o in learner.status().league.opponents}
    assert (by_id[RANDOM].wins, by_id[RANDOM].losses, by_id[SELF].draws) == (1, 1, 1)
    assert learner.status().league.games == 3
    assert by_id[RANDOM].transitions == 16
    again.close()


def test_bad_self_play_input_ends_the_stream_and_counts_nothing(ttt_learner, tmp_path):
    learner, address = ttt_learner
    for bad in (ttt_batch(learner.fields, 1, [game(RANDOM, 0)], []), ttt_batch(learner.fields, 1, [game("", pb.OUTCOME_WIN)], [])):
        stream = RawStream(address, ttt_hello("bad"), bad)
        code, details = stream.wait_end()
        assert code.name == "INVALID_ARGUMENT", details
    assert learner.status().league.games == 0 and len(learner.replay) == 0
    from streams import hello as cartpole_hello
    code, details = RawStream(address, cartpole_hello("single")).wait_end()
    assert code.name == "FAILED_PRECONDITION" and "agents ['x', 'o'] != none" in details
    plain = Learner(LearnerConfig(env="CartPole-v1", port=0, eval_every=0))
    try:
        with serve(plain, "127.0.0.1", 0) as port:
            from streams import batch as cartpole_batch
            message = cartpole_batch(1)
            message.batch.games.append(game("v1", pb.OUTCOME_WIN))
            code, details = RawStream(f"127.0.0.1:{port}", cartpole_hello("c"), message).wait_end()
            assert code.name == "INVALID_ARGUMENT" and "keeps no league" in details
            assert len(plain.replay) == 0
    finally:
        plain.stop()


def test_a_resumed_learner_has_the_league_ratings_records_and_snapshots_it_saved(tmp_path):
    config = ttt_config(tmp_path)
    learner = Learner(config)
    with serve(learner, "127.0.0.1", 0) as port:
        stream = RawStream(f"127.0.0.1:{port}", ttt_hello("a1"))
        for version in range(1, 5):
            learner.progress.version = version
            learner.training.publish(); learner.publishing.flush()
        stream.send(ttt_batch(learner.fields, 1, [game("v2", pb.OUTCOME_WIN), game(RANDOM, pb.OUTCOME_LOSS)], ["v2"]))
        assert stream.next("ack").ack.seq == 1
        stream.close()
    learner.stop()  # the final checkpoint
    saved, snapshots = without_weights(learner.status().league), learner.roles.league.sample_snapshots(3)
    resumed = Learner(config)
    try:
        restored = without_weights(resumed.status().league)
        assert restored.rating == saved.rating and restored.games == saved.games == 2
        assert list(restored.opponents) == list(saved.opponents)
        assert resumed.roles.league.sample_snapshots(3) == snapshots
    finally:
        resumed.stop()


def test_r2d2_plays_self_play_on_a_game_served_by_env_server_in_real_processes(tmp_path):
    """The recurrent Q-learner fits a discrete game too: actors and learner reach tic-tac-toe through
    `actorlearner env-server` (grpc://), games are counted, snapshots taken, ratings reach
    TensorBoard, and SIGTERM ends all cleanly."""
    from procs import start_actor, start_env_server, start_learner, status, stop
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    server, env_port = start_env_server(TICTACTOE)
    env = f"grpc://127.0.0.1:{env_port}"
    learner, port = start_learner("--env", env, "--algorithm", "r2d2", "--min-replay-size", "64", "--batch-size", "16",
                                  "--publish-every", "2", "--eval-every", "0", "--league-snapshot-every", "2",
                                  "--league-max-snapshots", "2", "--num-actors", "1", "--logdir", str(tmp_path / "tb"))
    actor = start_actor(port, "r2d2-player", "--env", env)
    try:
        league = wait_until(lambda: (s := status(port).league).games >= 30 and s.snapshots == 2 and s, 240,
                            "30 games and two snapshots")
        wait_until(lambda: status(port).updates >= 100, 240, "100 updates (TensorBoard scalars every 100)")
        recorded = sum(o.wins + o.draws + o.losses for o in league.opponents) + league.unrated_games
        assert 0 < recorded <= league.games, "dropped snapshots take their records with them"
    finally:
        codes = stop(actor, learner, server)
    assert codes == [0, 0, 0]
    tags = EventAccumulator(str(tmp_path / "tb")).Reload().Tags()["scalars"]
    assert {"league/rating", "league/snapshots", "league/games"} <= set(tags)
