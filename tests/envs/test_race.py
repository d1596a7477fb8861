"""Race to 10: its rules, its scripted players, and the env through an env server and a league seat."""

from __future__ import annotations

import numpy as np
import pytest
from test_multiagent_env import play_both

from actorlearner.envs import make_env
from actorlearner.envs.race import RaceTo10, perfect_player, race_to_10, random_player
from actorlearner.envs.server import serve
from actorlearner.league import SeatEnv
from actorlearner.league.opponents import ScriptedPlayer

RACE = "actorlearner.envs.race:race_to_10"


def play(env: RaceTo10, moves: list[int]):
    """Reset ``env`` and make ``moves`` in turn; the last step's results (the reset's, with no moves)."""
    result = env.reset()
    for action in moves:
        result = env.step({env.agents[env.to_move]: action})
    return result


def winner(first, second, env: RaceTo10) -> str:
    """Play one game of two scripted players; the winner's name."""
    players = {"first": first, "second": second}
    observations, _ = env.reset()
    while env.agents:
        (mover, observation), = observations.items()
        observations, rewards, *_ = env.step({mover: players[mover](observation)})
    return max(rewards, key=rewards.get)


def test_only_the_mover_sees_the_one_hot_count_and_moves_past_10_are_masked():
    env = race_to_10()
    for moves, mover, count, mask in [([], "first", 0, [1, 1]), ([1, 0], "first", 3, [1, 1]),
                                      ([1, 1, 1, 1], "first", 8, [1, 1]), ([1, 1, 1, 1, 0], "second", 9, [1, 0])]:
        observations = play(env, moves)[0]
        assert list(observations) == [mover]
        np.testing.assert_array_equal(observations[mover]["observation"], np.eye(11, dtype=np.float32)[count])
        assert observations[mover]["action_mask"].dtype == np.int8 and list(observations[mover]["action_mask"]) == mask
    with pytest.raises(ValueError, match="it is second's move"):
        env.step({"first": 0})


def test_reaching_exactly_10_wins():
    env = race_to_10()
    observations, rewards, terminations, truncations, infos = play(env, [1, 1, 1, 1, 0, 0])
    assert rewards == {"first": -1.0, "second": 1.0} and infos["first"] == {"winner": "second"}
    assert all(terminations.values()) and not any(truncations.values()) and env.agents == []
    assert list(observations["first"]["action_mask"]) == [0, 0]
    with pytest.raises(RuntimeError, match="reset first"):
        env.step({"first": 0})


def test_a_move_past_10_loses_on_the_spot():
    env = race_to_10()
    _, rewards, terminations, _, infos = play(env, [1, 1, 1, 1, 0, 1])
    assert rewards == {"first": 1.0, "second": -1.0} and all(terminations.values())
    assert infos["second"] == {"illegal_move": 1, "loser": "second"} and env.count == 9


def test_perfect_play_beats_random_play_and_the_first_mover_wins_under_perfect_play():
    env = race_to_10()
    wins = sum(winner(perfect_player(None, None, i), random_player(None, None, i), env) == "first"
               for i in range(100))
    wins += sum(winner(random_player(None, None, i), perfect_player(None, None, i), env) == "second"
                for i in range(100))
    assert wins >= 180
    assert all(winner(perfect_player(None, None, i), perfect_player(None, None, 100 + i), env) == "first"
               for i in range(50))


def test_the_env_server_plays_it_as_the_env_itself_does():
    with serve(lambda: make_env(RACE), "race") as (_, port):
        remote, local = make_env(f"grpc://127.0.0.1:{port}"), RaceTo10()
        try:
            def choose(agent, observation, rng):  # mostly legal moves, now and then one past 10
                legal = np.flatnonzero(observation["action_mask"])
                return np.int64(rng.integers(2) if rng.random() < 0.3 else rng.choice(legal))
            events = play_both(remote, local, range(20), choose)
        finally:
            remote.close()
    assert all(len(actions) == 1 for actions, *_ in events)
    endings = [want[4]["first"] for _, want, agents in events if not agents]
    assert len(endings) == 20 and {"winner", "loser"} <= {key for info in endings for key in info}


def test_a_league_seat_that_plays_perfectly_wins_exactly_the_games_it_moves_first():
    games = []
    env = SeatEnv(race_to_10(), lambda: ScriptedPlayer("perfect", perfect_player(None, None, 1)), games.append)
    policy = perfect_player(None, None, 2)
    for _ in range(20):
        observation, _ = env.reset()
        done, total = False, 0.0
        while not done:
            observation, reward, terminated, truncated, _ = env.step(policy(observation))
            total += reward
            done = terminated or truncated
        assert total == (1.0 if env.seat == "first" else -1.0)
    assert [g.outcome for g in games] == ["win", "loss"] * 10
