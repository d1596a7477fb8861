"""Atari games (`actorlearner.envs.atari`): the DQN preprocessing checked frame by frame against the
emulator, training-only reward clipping and episodic life, and a real `run` + `eval` on Pong."""

from __future__ import annotations

import json
import sys

import cv2
import gymnasium as gym
import numpy as np
import pytest
import torch

from actorlearner.algorithms.dqn import DQNConfig, QNetwork
from actorlearner.envs import make_env, make_vector_env
from actorlearner.envs.atari import AtariOptions, make_atari, parse_name
from actorlearner.networks import action_branches
from actorlearner.trained import evaluate_trained, load_trained
from procs import CHILD_ENV, run_command

DETERMINISTIC = "ALE/Pong-v5?noop_max=0&repeat_action_probability=0"


def emulator(game: str = "ALE/Pong-v5") -> gym.Env:
    """The bare game, one emulator frame a step, no sticky actions: the reference."""
    return gym.make(game, frameskip=1, repeat_action_probability=0.0)


def test_frames_are_84x84_grey_uint8_and_stack_to_4x84x84():
    env = make_env("ALE/Pong-v5")
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84), np.uint8)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84) and obs.dtype == np.uint8 and obs.max() > obs.min()
    env.close()
    stacked = make_env("ALE/Pong-v5", frame_stack=4)
    obs, _ = stacked.reset(seed=0)
    assert stacked.observation_space.shape == obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    stacked.close()


def test_a_step_is_4_emulator_frames_max_pooled_over_the_last_two():
    env, reference = make_atari(DETERMINISTIC), emulator()
    env.reset(seed=3)
    reference.reset(seed=3)
    ale = reference.unwrapped.ale
    pooled_differs = False
    rng = np.random.default_rng(0)
    for step in range(1, 201):
        action = int(rng.integers(env.action_space.n))
        reward, frames = 0.0, []
        for _ in range(4):
            reward += reference.step(action)[1]
            frames.append(ale.getScreenGrayscale())
        obs, got_reward, *_ = env.step(action)
        pooled = np.maximum(frames[-2], frames[-1])
        pooled_differs |= not np.array_equal(pooled, frames[-1])
        assert np.array_equal(obs, cv2.resize(pooled, (84, 84), interpolation=cv2.INTER_AREA)), step
        assert got_reward == reward
        assert env.unwrapped.ale.getEpisodeFrameNumber() == 4 * step
    assert pooled_differs, "the max over two frames never mattered: the test saw nothing move"
    env.close()
    reference.close()


def test_each_game_starts_after_1_to_30_noops():
    env = make_atari("ALE/Pong-v5?repeat_action_probability=0")
    starts = []
    for seed in range(12):
        env.reset(seed=seed)
        starts.append(env.unwrapped.ale.getEpisodeFrameNumber())
    assert all(1 <= n <= 30 for n in starts) and len(set(starts)) > 3, starts
    env.reset(seed=0)
    first = env.unwrapped.ale.getEpisodeFrameNumber()
    env.reset(seed=0)
    assert env.unwrapped.ale.getEpisodeFrameNumber() == first, "the noops are not seeded"
    none = make_atari(DETERMINISTIC)
    none.reset(seed=0)
    assert none.unwrapped.ale.getEpisodeFrameNumber() == 0
    env.close()
    none.close()


def play(env: gym.Env, actions: list[int], seed: int) -> list[tuple[float, bool]]:
    """(reward, terminated) of each step of ``actions`` from ``reset(seed)``, stopping at the first termination."""
    env.reset(seed=seed)
    steps = []
    for action in actions:
        _, reward, terminated, truncated, _ = env.step(action)
        steps.append((reward, terminated))
        if terminated or truncated:
            break
    return steps


def test_training_envs_clip_rewards_to_their_sign_and_evaluation_keeps_the_score():
    actions = [int(a) for a in np.random.default_rng(0).integers(6, size=400)]
    raw = play(make_env("ALE/SpaceInvaders-v5"), actions, seed=1)
    clipped = play(make_env("ALE/SpaceInvaders-v5", training=True), actions, seed=1)
    assert max(r for r, _ in raw) > 1, "no reward above 1: nothing for clipping to change"
    assert [r for r, _ in clipped] == [float(np.sign(r)) for r, _ in raw]
    unclipped = play(make_env("ALE/SpaceInvaders-v5?clip_rewards=false", training=True), actions, seed=1)
    assert unclipped == raw


def test_episodic_life_ends_training_episodes_at_a_lost_life_and_plays_on():
    name = "ALE/Breakout-v5?episodic_life=true"
    env = make_env(name, training=True)
    ale = env.unwrapped.ale
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(5000):
        *_, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
        if terminated or truncated:
            break
    assert terminated and ale.lives() == 4, "the first lost life did not end the episode"
    frame = ale.getEpisodeFrameNumber()
    env.reset()
    assert ale.lives() == 4 and ale.getEpisodeFrameNumber() == frame + 4, "the reset restarted the game"
    env.close()
    # Evaluation plays whole games with the same name; so does training with the switch off (the default).
    for whole_game in (make_env(name), make_env("ALE/Breakout-v5", training=True)):
        steps = play(whole_game, [int(a) for a in rng.integers(4, size=600)], seed=0)
        lives = whole_game.unwrapped.ale.lives()
        assert lives < 4 or steps[-1][1], "the random play lost no life: nothing to check"
        assert all(not done for _, done in steps[:-1]) and (not steps[-1][1] or lives == 0)
        whole_game.close()


def test_a_vector_env_of_a_game_trains_on_clipped_rewards_of_stacked_frames():
    envs = make_vector_env("ALE/Pong-v5", 2, frame_stack=4)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
    for _ in range(50):
        obs, reward, *_ = envs.step(envs.action_space.sample())
        assert set(reward.tolist()) <= {-1.0, 0.0, 1.0}
    envs.close()


def test_options_ride_on_the_name_and_bad_ones_are_refused():
    assert parse_name("ALE/Pong-v5") == ("ALE/Pong-v5", AtariOptions())
    assert parse_name("ALE/Breakout-v5?episodic_life=1&noop_max=0&repeat_action_probability=0") == (
        "ALE/Breakout-v5", AtariOptions(episodic_life=True, noop_max=0, repeat_action_probability=0.0))
    for name, reason in [("ALE/Pong-v5?lives=1", "unknown Atari option 'lives'"),
                         ("ALE/Pong-v5?episodic_life=yes", "use true or false"),
                         ("ALE/Pong-v5?noop_max=-1", "noop_max must be >= 0"),
                         ("ALE/Pong-v5?noop_max", "key=value pairs"),
                         ("ALE/NoSuchGame-v5", "cannot make environment")]:
        with pytest.raises(ValueError, match=reason):
            make_env(name)


def test_without_ale_py_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # importing it now raises ImportError
    with pytest.raises(ValueError, match=r"pip install actorlearner\[atari\]"):
        make_env("ALE/Pong-v5")


def test_dqn_sees_stacked_frames_through_the_nature_dqn_torso():
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    network = QNetwork(space, action_branches(gym.spaces.Discrete(6)), DQNConfig(hidden_sizes=(512,)))
    convs = [m for m in network.encoder.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (4, 32, (8, 8), (4, 4)), (32, 64, (4, 4), (2, 2)), (64, 64, (3, 3), (1, 1))]
    assert network.encoder.leaf_encoders[0].output_dim == 64 * 7 * 7
    q = network({"": torch.from_numpy(np.stack([space.sample(), space.sample()]))})
    assert q.shape == (2, 1, 6) and torch.isfinite(q).all()


def test_run_trains_on_pong_with_stacked_frames_and_eval_reports_the_game_score(tmp_path):
    """The run ends at its first evaluation: every Pong score reaches the target of -21, and evaluations begin
    once training has. (A fixed 10 s of run once ended with no batch sent, on a busy machine.)"""
    run_dir = tmp_path / "run"
    done = run_command(
        [sys.executable, "-m", "actorlearner", "run", "--port", "0", "--vector-mode", "sync",
         "--env", "ALE/Pong-v5", "--frame-stack", "4", "--actors", "1",
         "--num-envs", "2", "--max-seconds", "240", "--target-return", "-21", "--min-replay-size", "200",
         "--replay-capacity", "2000", "--batch-size", "16", "--publish-every", "5", "--dqn-hidden-sizes", "64",
         "--eval-every", "3", "--eval-episodes", "1", "--eval-envs", "1", "--no-plot", "--run-dir", str(run_dir)],
        timeout=300, env=CHILD_ENV)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["solved"] and result["updates"] > 0 and result["env_steps"] > 200, (result, done.stderr[-3000:])
    assert result["eval_return"] is not None and -21 <= result["eval_return"] <= 21, result
    trained = load_trained(run_dir)  # what `actorlearner eval --checkpoint` plays, in this process
    assert (trained.env, trained.frame_stack) == ("ALE/Pong-v5", 4)
    score = evaluate_trained(trained, 1, 1, seed=0).mean
    assert -21 <= score <= 21 and score == int(score), score
