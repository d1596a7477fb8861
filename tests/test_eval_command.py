"""``actorlearner eval``: a checkpoint's policy played greedily, without a learner."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.learner.checkpoint import CheckpointError
from actorlearner.learner.learner import Learner
from actorlearner.trained import evaluate_trained, load_trained
from procs import CHILD_ENV


def eval_json(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "actorlearner", "eval", *args], capture_output=True, text=True,
                          timeout=120, env=CHILD_ENV)


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory):
    """A learner's checkpoint (under a run directory's ``checkpoints/``) and the learner that wrote it."""
    run_dir = tmp_path_factory.mktemp("run")
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, checkpoint_dir=str(run_dir / "checkpoints")))
    learner.checkpoint()
    return run_dir, learner


def test_the_loaded_policy_acts_as_the_learner_s_own(checkpointed):
    run_dir, learner = checkpointed
    trained = load_trained(run_dir)
    assert (trained.env, trained.algorithm) == ("CartPole-v1", "dqn")
    env = make_env("CartPole-v1")
    obs = np.stack([env.observation_space.sample() for _ in range(64)])
    env.close()
    np.testing.assert_array_equal(trained.policy.act(obs, 0.0), learner.algorithm.act(obs, 0.0))


def test_eval_prints_one_json_line_with_the_returns_of_the_episodes_it_played(checkpointed):
    run_dir, _ = checkpointed
    done = eval_json("--checkpoint", str(run_dir), "--episodes", "6", "--envs", "3", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {"episodes", "mean_return", "std_return", "min_return", "max_return"}
    expected = evaluate_trained(load_trained(run_dir / "checkpoints"), 6, 3, 0)  # greedy and seeded: the same
    assert result == {"episodes": 6, "mean_return": expected.mean, "std_return": expected.std,
                      "min_return": expected.min, "max_return": expected.max}
    assert result["min_return"] <= result["mean_return"] <= result["max_return"]


def test_eval_refuses_what_is_not_a_usable_checkpoint(tmp_path):
    done = eval_json("--checkpoint", str(tmp_path / "missing"))
    assert done.returncode == 1 and "does not exist" in done.stderr
    done = eval_json("--checkpoint", str(tmp_path))
    assert done.returncode == 1 and "no usable checkpoint" in done.stderr
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        load_trained(tmp_path)
