"""Make single and vector environments from a gymnasium id."""

from __future__ import annotations

import gymnasium as gym


def make_env(name: str) -> gym.Env:
    """One environment from a registered gymnasium id, with a clear error for unknown names."""
    try:
        return gym.make(name)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make environment {name!r}: {exc}") from None


def make_vector_env(name: str, num_envs: int, mode: str = "sync") -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``name`` stepped together (``mode``: sync or async)."""
    if mode not in ("sync", "async"):
        raise ValueError(f"vector mode must be sync or async, got {mode!r}")
    make_env(name).close()  # fail early, in this process, with the clear error
    return gym.make_vec(name, num_envs=num_envs, vectorization_mode=mode)
