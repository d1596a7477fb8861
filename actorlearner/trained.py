"""A trained policy from a checkpoint, without a learner: what ``actorlearner eval`` runs."""

from __future__ import annotations

import itertools
import json
import os
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym

from actorlearner.algorithms import Policy, make_config, resolve
from actorlearner.checkpoint.parts import CheckpointError
from actorlearner.checkpoint.store import read_checkpoint
from actorlearner.envs import make_env
from actorlearner.envs.multiagent import is_multi_agent, seat_spaces
from actorlearner.evaluation import EvalResult, episode_shares, evaluate


@dataclass(frozen=True)
class TrainedPolicy:
    """A checkpoint's policy on the CPU, and what it was trained on."""

    policy: Policy
    env: str
    frame_stack: int
    """Frames each observation stacks (0: none), as it was trained."""
    algorithm: str
    seed: int
    source: Path
    """The checkpoint directory it was read from."""
    observation_space: gym.Space
    action_space: gym.Space
    """The spaces it acts in: the env's, or every seat's of a game."""
    game: bool
    """Trained by self-play on an env with several agents."""
    updates: int | None
    """The trainer's update count in the checkpoint (its ``num_updates``), if it keeps one."""

    def make_env(self, render_mode: str | None = None):
        """An env it was trained on, frames stacked as they were."""
        return make_env(self.env, render_mode=render_mode, frame_stack=self.frame_stack)


def load_trained(path: str | os.PathLike[str], env: str = "") -> TrainedPolicy:
    """The policy of the checkpoint at ``path``: a run directory (its ``checkpoints/``), a checkpoint
    directory (its newest usable checkpoint; data-parallel, rank 0's) or one checkpoint. ``env`` replaces the env it was
    trained on (it must have the same spaces). Raises CheckpointError for anything unusable."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if (path / "checkpoints").is_dir():
        path = path / "checkpoints"
    if (path / "rank-0").is_dir():  # data-parallel learners': every rank holds the same networks
        path = path / "rank-0"
    source, parts = read_checkpoint(path)
    run = parts.get("run")
    if not run or "algorithm" not in parts:
        raise CheckpointError(f"{source} does not say what it trained (no 'run' or 'algorithm' part): it was "
                              "written by an older actorlearner or is a best-policy snapshot")
    cls = resolve(run["algorithm"])
    config = make_config(cls, json.loads(run["algorithm_config"]))
    env = env or run["env"]
    frame_stack = int(run.get("frame_stack", 0))
    probe = make_env(env, frame_stack=frame_stack)
    try:
        spaces, game = seat_spaces(probe), is_multi_agent(probe)
    finally:
        probe.close()
    spec = cls(*spaces, config)
    trainer = spec.make_trainer(device="cpu", seed=int(run["seed"]))  # reads (and checks) the whole checkpointed state
    trainer.load_state_dict(parts["algorithm"])
    policy = spec.make_policy(device="cpu", seed=int(run["seed"]))
    policy.load_policy_state_dict(trainer.policy_state_dict())
    updates = parts["algorithm"].get("num_updates")
    return TrainedPolicy(policy, env, frame_stack, run["algorithm"], int(run["seed"]), source, *spaces, game,
                         None if updates is None else int(updates))


def play_trained(trained: TrainedPolicy, opponents: list[str], games: int, num_envs: int,
                 seed: int) -> list[tuple[str, EvalResult, Counter]]:
    """For each scripted player ``module:function`` in ``opponents``: ``games`` greedy games of a
    self-play policy against it, seats alternated; its returns and outcomes (win, draw, loss)."""
    from actorlearner.league.evaluation import play_games, scripted

    spaces = (trained.observation_space, trained.action_space)
    return [(name, *play_games(trained.policy, trained.make_env, scripted(name, spaces, seed), games,
                               num_envs, seed)) for name in opponents]


def evaluate_trained(trained: TrainedPolicy, episodes: int, num_envs: int, seed: int, max_steps: int = 0) -> EvalResult:
    """Greedy episodes of a trained policy, spread evenly over ``num_envs`` envs (each cut after ``max_steps``)."""
    policy = trained.policy
    return evaluate(lambda obs: policy.act(obs, 0.0), trained.make_env, episodes, num_envs, seed, policy.reset_memory,
                    max_steps=max_steps)


def record_trained(trained: TrainedPolicy, episodes: int, num_envs: int, seed: int,
                   folder: str | os.PathLike[str], video_episodes: int, max_steps: int = 0) -> tuple[EvalResult, list[Path]]:
    """``evaluate_trained``'s episodes, the first ``video_episodes`` of them (in its order: env 0's,
    then env 1's, ...) recorded by the envs that play them as MP4s in ``folder``; the result and
    those paths. Every env is made with render_mode="rgb_array", so the returns are those of
    ``evaluate_trained``. ValueError, before anything is played, for an env that cannot render it."""
    folder = Path(folder)
    shares = episode_shares(episodes, num_envs)
    starts = itertools.accumulate(shares, initial=0)
    recorded = [min(share, max(0, video_episodes - start)) for share, start in zip(shares, starts)]

    def recorder(i: int, env: gym.Env) -> gym.Env:
        if not recorded[i]:
            return env
        with warnings.catch_warnings():
            if i > 0:  # env 0 made the folder, or warned already that it exists
                warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
            return gym.wrappers.RecordVideo(env, str(folder), episode_trigger=lambda episode: episode < recorded[i],
                                            name_prefix=f"env-{i}")

    policy = trained.policy
    result = evaluate(lambda obs: policy.act(obs, 0.0), lambda: trained.make_env("rgb_array"),
                      episodes, num_envs, seed, policy.reset_memory, recorder, max_steps)
    return result, [folder / f"env-{i}-episode-{j}.mp4" for i, count in enumerate(recorded) for j in range(count)]
