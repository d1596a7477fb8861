"""Greedy policy evaluation over several environments, spread evenly and seeded.

Each env runs its fixed share of the episodes (``episodes // num_envs``, the first
``episodes % num_envs`` envs one more) and then stops, so envs with short episodes do
not fill the sample with their episodes; with a fixed seed and a deterministic policy
the result is the same every time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class EvalResult:
    """Statistics of the undiscounted returns of ``episodes`` evaluation episodes."""

    mean: float
    std: float
    """Population standard deviation (ddof=0)."""
    min: float
    max: float
    episodes: int
    lengths: tuple[int, ...]
    """Length in env steps of each episode, ordered by env index, then episode."""
    returns: tuple[float, ...] = ()
    """Return of each episode, in the same order as ``lengths``."""


def summarize(returns: list[float], lengths: list[int]) -> EvalResult:
    """The statistics of episodes' returns (and their lengths, in the same order)."""
    values = np.asarray(returns, dtype=np.float64)
    return EvalResult(mean=float(values.mean()), std=float(values.std()), min=float(values.min()),
                      max=float(values.max()), episodes=len(values), lengths=tuple(lengths),
                      returns=tuple(float(r) for r in values))


def episode_shares(episodes: int, num_envs: int) -> list[int]:
    """Episodes each env runs: ``episodes // num_envs``, the first ``episodes % num_envs`` one more."""
    if episodes < 1 or num_envs < 1:
        raise ValueError(f"need episodes >= 1 and num_envs >= 1, got {episodes} and {num_envs}")
    base, extra = divmod(episodes, num_envs)
    return [base + (i < extra) for i in range(num_envs)]


def _batch(space: gym.Space, items: list):
    """Single observations of ``space`` stacked as a vector env of ``len(items)`` would return them."""
    return gym.vector.utils.concatenate(space, items, gym.vector.utils.create_empty_array(space, len(items)))


def evaluate(
    policy_act: Callable[[np.ndarray], np.ndarray],
    make_env: Callable[[], gym.Env],
    episodes: int,
    num_envs: int,
    seed: int,
    reset_memory: Callable[[np.ndarray], None] | None = None,
    wrap_env: Callable[[int, gym.Env], gym.Env] | None = None,
    max_steps: int = 0,
) -> EvalResult:
    """Run ``episodes`` greedy episodes over ``num_envs`` envs and summarize their returns.

    ``policy_act`` maps a batch of every env's observation (batched as a vector env batches
    them: arrays ``[E, ...]``, dicts and tuples of them) to actions ``[E, ...]``; an env that
    has done its share keeps its last observation in the batch and its action is dropped, so
    row i is always env i (a recurrent policy keeps one state per row). ``reset_memory``, when
    given, gets a mask [E] of the envs whose episodes begin, before their first observation is
    acted on. Env ``i`` is reset with ``seed + i`` once, then continues its own RNG. Envs with
    no share (``num_envs > episodes``) are not created. ``wrap_env``, when given, gets each env
    ``i`` as it is made, before any is played, and returns the env to play (a video recorder).
    ``max_steps`` (0: none) cuts an episode after that many steps, as a time limit would.
    """
    shares = [s for s in episode_shares(episodes, num_envs) if s > 0]
    envs: list[gym.Env] = []
    try:
        for i in range(len(shares)):
            envs.append(make_env())  # closed below even if a later one cannot be made
            if wrap_env is not None:
                envs[i] = wrap_env(i, envs[i])
        returns: list[list[float]] = [[] for _ in envs]
        lengths: list[list[int]] = [[] for _ in envs]
        obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
        episode_return = [0.0] * len(envs)
        episode_length = [0] * len(envs)
        active = np.ones(len(envs), bool)
        begins = active.copy()
        while active.any():
            if reset_memory is not None and begins.any():
                reset_memory(begins)
            begins = np.zeros(len(envs), bool)
            actions = np.asarray(policy_act(_batch(envs[0].observation_space, obs)))
            if actions.shape[:1] != (len(envs),):
                raise ValueError(f"policy_act returned shape {actions.shape} for {len(envs)} observations")
            for i in np.flatnonzero(active):
                obs[i], reward, terminated, truncated, _ = envs[i].step(actions[i])
                episode_return[i] += float(reward)
                episode_length[i] += 1
                if terminated or truncated or episode_length[i] == max_steps:
                    returns[i].append(episode_return[i])
                    lengths[i].append(episode_length[i])
                    episode_return[i], episode_length[i] = 0.0, 0
                    if len(returns[i]) == shares[i]:
                        active[i] = False  # This env has done its share.
                        continue
                    obs[i] = envs[i].reset()[0]
                    begins[i] = True
    finally:
        for env in envs:
            env.close()
    return summarize([r for per_env in returns for r in per_env], [n for per_env in lengths for n in per_env])
