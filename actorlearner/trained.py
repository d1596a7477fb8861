"""A trained policy from a checkpoint, without a learner: what ``actorlearner eval`` runs."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from actorlearner.algorithms import make_config, resolve
from actorlearner.algorithms.base import Algorithm
from actorlearner.envs import make_env
from actorlearner.learner.checkpoint import CheckpointError, read_checkpoint
from actorlearner.learner.evaluator import EvalResult, evaluate


@dataclass(frozen=True)
class TrainedPolicy:
    """A checkpoint's policy on the CPU, and what it was trained on."""

    policy: Algorithm
    env: str
    algorithm: str
    seed: int
    source: Path
    """The checkpoint directory it was read from."""


def load_trained(path: str | os.PathLike[str], env: str = "") -> TrainedPolicy:
    """The policy of the checkpoint at ``path``: a run directory (its ``checkpoints/``), a checkpoint
    directory (its newest usable checkpoint) or one checkpoint. ``env`` replaces the env it was
    trained on (it must have the same spaces). Raises CheckpointError for anything unusable."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    source, parts = read_checkpoint(path)
    run = parts.get("run")
    if not run or "algorithm" not in parts:
        raise CheckpointError(f"{source} does not say what it trained (no 'run' or 'algorithm' part): it was "
                              "written by an older actorlearner or is a best-policy snapshot")
    cls = resolve(run["algorithm"])
    config = make_config(cls, json.loads(run["algorithm_config"]))
    env = env or run["env"]
    probe = make_env(env)
    try:
        policy = cls(probe.observation_space, probe.action_space, config, device="cpu", seed=int(run["seed"]))
    finally:
        probe.close()
    policy.load_state_dict(parts["algorithm"])
    return TrainedPolicy(policy, env, run["algorithm"], int(run["seed"]), source)


def evaluate_trained(trained: TrainedPolicy, episodes: int, num_envs: int, seed: int) -> EvalResult:
    """Greedy episodes of a trained policy, spread evenly over ``num_envs`` envs."""
    policy = trained.policy
    return evaluate(lambda obs: policy.act(obs, 0.0), lambda: make_env(trained.env), episodes, num_envs, seed,
                    getattr(policy, "reset_memory", None))
