"""Learning evidence in the default suite: ``actorlearner run``, seeded, as a user runs it, reaches its target."""

import json
import subprocess
import sys
import tempfile

import pytest
from custom_envs import GOAL_IMAGE_OPTIMAL_RETURN, GOAL_IMAGE_RANDOM_RETURN
from procs import CHILD_ENV

# `make run` solves CartPole in about 42 s on a quiet machine; the suite runs on two busy cores.
MAX_SECONDS = 240


def run_until(target: float, *args: str) -> dict:
    """``actorlearner run`` with two actor processes until the evaluated return reaches ``target``."""
    with tempfile.TemporaryDirectory() as run_dir:
        done = subprocess.run([sys.executable, "-m", "actorlearner", "run", "--actors", "2", "--seed", "0",
                               "--target-return", str(target), "--max-seconds", str(MAX_SECONDS), "--run-dir", run_dir,
                               *args], capture_output=True, text=True, timeout=MAX_SECONDS + 120, env=CHILD_ENV)
    lines = done.stdout.strip().splitlines()
    assert lines, f"run printed no result (exit {done.returncode}):\n{done.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert done.returncode == 0 and result["solved"] is True and result["eval_return"] >= target, (
        f"exit {done.returncode}, {result}\n{done.stderr[-3000:]}")
    return result


@pytest.mark.learning
def test_run_solves_cartpole_with_two_actor_processes():
    run_until(475, "--env", "CartPole-v1")


@pytest.mark.learning
def test_run_solves_frozen_lake_from_its_discrete_observation():
    """Discrete(16) observations, one-hot inside the network; not slippery, so 1.0 is reachable."""
    run_until(1.0, "--env", "custom_envs:frozen_lake")


@pytest.mark.learning
def test_run_learns_a_dict_observation_with_an_image_and_multidiscrete_actions():
    """The goal is only in the uint8 image (conv torso); noise keys of four other space types; two action
    branches. Random play scores 0.19, the shortest path 0.99."""
    target = 0.8
    assert GOAL_IMAGE_RANDOM_RETURN < target / 4 and target < GOAL_IMAGE_OPTIMAL_RETURN
    run_until(target, "--env", "custom_envs:goal_image")


@pytest.mark.learning
def test_a_plugin_algorithm_from_a_test_module_trains_through_real_processes():
    """Tabular Q-learning defined in tests/plugin_algorithm.py, with its own option (--tabq-lr)."""
    run_until(1.0, "--env", "custom_envs:frozen_lake", "--algorithm", "plugin_algorithm:TabularQ", "--tabq-lr", "0.5")


@pytest.mark.learning
def test_run_solves_pendulum_with_sac_and_no_other_flag():
    """Continuous actions: SAC's own learner defaults (256 per update, one update per 2 inserted)."""
    run_until(-200, "--env", "Pendulum-v1", "--algorithm", "sac")


@pytest.mark.learning
def test_td3_learns_asymmetric_per_dimension_bounds_and_never_acts_outside_them():
    """low = [-1, 0], high = [3, 0.5]: pointing at the middle scores -1.67, the targets 0. The env raises
    on any action outside its bounds, so every action the actors and the evaluator sent was inside."""
    result = run_until(-0.25, "--env", "custom_envs:reach", "--algorithm", "td3")
    assert result["env_steps"] > 1000


@pytest.mark.learning
def test_r2d2_remembers_a_cue_that_feed_forward_dqn_cannot():
    """The cue shows at the first step only and is asked for 8 to 10 steps later (+1 right, -1 wrong)."""
    run_until(0.9, "--env", "custom_envs:memory_cue", "--algorithm", "r2d2")


@pytest.mark.learning
def test_feed_forward_dqn_stays_near_zero_on_the_memory_task():
    """Without memory the best policy is a guess: over 200 evaluation episodes its mean stays near 0 (sd 0.07)."""
    with tempfile.TemporaryDirectory() as run_dir:
        done = subprocess.run([sys.executable, "-m", "actorlearner", "run", "--actors", "2", "--seed", "0",
                               "--env", "custom_envs:memory_cue", "--target-return", "0.9", "--max-seconds", "40",
                               "--eval-episodes", "200", "--run-dir", run_dir],
                              capture_output=True, text=True, timeout=300, env=CHILD_ENV)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["solved"] is False and abs(result["eval_return"]) <= 0.3, result
    assert result["updates"] > 500  # it trained, and still cannot tell the cue
