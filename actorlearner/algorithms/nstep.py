"""N-step transition assembly for a gymnasium vector env in NEXT_STEP autoreset mode.

Observations of any supported space travel as one field per leaf (``obs``, ``obs/camera``
...; see ``actorlearner.networks.leaves``), in their own dtypes.

Each real env step starts one window; a window is emitted once it holds `n_step` rewards,
or early when its episode ends. Emitted transitions carry the discounted reward sum
r_t + g r_{t+1} + ..., `discount` = g**k for the k steps summed (0.0 when the episode
terminated inside the window: termination cuts the bootstrap; truncation keeps it), and
`next_obs`, the observation after the last summed step (the final observation at an
episode's end).

NEXT_STEP autoreset: after a step where env i reported terminated or truncated, the next
`step()` ignores env i's action and returns its reset observation with reward 0 and both
flags False. The assembler remembers which envs ended and produces nothing from that step.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from actorlearner.algorithms.base import torch_dtype
from actorlearner.networks.leaves import field_name, leaf_arrays, leaf_fields


def nstep_fields(observation_space: gym.Space, action_shape: tuple[int, ...],
                 action_dtype: torch.dtype) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The replay item of an n-step transition: observation leaves in their own dtypes, the action,
    the n-step reward and discount, and the next observation's leaves."""
    obs = {key: (shape, torch_dtype(dtype)) for key, (shape, dtype) in leaf_fields(observation_space).items()}
    return {
        **{field_name("obs", key): spec for key, spec in obs.items()},
        "action": (action_shape, action_dtype),
        "reward": ((), torch.float32),
        "discount": ((), torch.float32),
        **{field_name("next_obs", key): spec for key, spec in obs.items()},
    }


class NStepAssembler:
    """Turns per-step vector-env results into n-step transitions, vectorized over envs."""

    def __init__(
        self,
        num_envs: int,
        n_step: int,
        gamma: float,
        observation_space: gym.Space,
        action_shape: tuple[int, ...] = (),
        action_dtype: np.dtype | type = np.int64,
    ):
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.num_envs = num_envs
        self.n_step = n_step
        self.gamma = float(gamma)
        self.observation_space = observation_space
        leaves = leaf_fields(observation_space)
        self._obs = {key: np.zeros((num_envs, n_step, *shape), dtype) for key, (shape, dtype) in leaves.items()}
        self._last_next_obs = {key: np.zeros((num_envs, *shape), dtype) for key, (shape, dtype) in leaves.items()}
        self._action = np.zeros((num_envs, n_step, *action_shape), action_dtype)
        self._reward = np.zeros((num_envs, n_step), np.float64)
        self._count = np.zeros(num_envs, np.int64)  # pending windows per env, oldest at slot 0
        self._autoreset = np.zeros(num_envs, np.bool_)  # env ended last step; its next step is a reset

    @property
    def pending(self) -> np.ndarray:
        """Windows started but not yet emitted, per env [E]."""
        return self._count.copy()

    def reset(self) -> None:
        """Drop every pending window; call after an explicit `env.reset()`."""
        self._count[:] = 0
        self._autoreset[:] = False

    def push(
        self,
        obs,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs,
    ) -> dict[str, np.ndarray] | None:
        """Record one vector step (obs is what the actions were chosen on, both as the vector env
        returns them); returns completed transitions."""
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.asarray(truncated, np.bool_)
        obs = leaf_arrays(self.observation_space, obs)
        next_obs = leaf_arrays(self.observation_space, next_obs)
        live = ~self._autoreset  # envs whose step was a real env step, not an autoreset
        ended = live & (terminated | truncated)
        self._autoreset = ended

        envs = np.flatnonzero(live)
        slot = self._count[envs]
        for key, buf in self._obs.items():
            buf[envs, slot] = obs[key][envs]
            self._last_next_obs[key][envs] = next_obs[key][envs]
        self._action[envs, slot] = np.asarray(action)[envs]
        self._reward[envs, slot] = np.asarray(reward, np.float64)[envs]
        self._count[envs] += 1

        full = live & ~ended & (self._count == self.n_step)
        out = self._emit(ended, full, live & terminated, next_obs)

        self._count[ended] = 0
        shift = np.flatnonzero(full)  # drop the emitted oldest window
        if shift.size:
            for buf in (*self._obs.values(), self._action, self._reward):
                buf[shift, :-1] = buf[shift, 1:]
            self._count[shift] -= 1
        return out

    def flush(self) -> dict[str, np.ndarray] | None:
        """Emit every pending window as if truncated now (bootstrapping from the last next_obs)."""
        has_pending = self._count > 0
        out = self._emit(has_pending, np.zeros_like(has_pending), np.zeros_like(has_pending), self._last_next_obs)
        self._count[:] = 0
        return out

    def inherit(self, previous: NStepAssembler) -> None:
        """Continue the episodes ``previous`` (flushed, of other settings) was assembling.

        The flushed windows were ordinary truncated transitions (their `discount` carries
        the old gamma**k), so every env step still starts exactly one transition. This
        assembler takes over which envs are about to autoreset, so those reset steps still
        produce nothing.
        """
        self._autoreset[:] = previous._autoreset

    def _emit(
        self, all_windows: np.ndarray, oldest_window: np.ndarray, terminated: np.ndarray,
        next_obs: dict[str, np.ndarray],
    ) -> dict[str, np.ndarray] | None:
        """Transitions for all pending windows of `all_windows` envs and the oldest one of `oldest_window` envs."""
        start = np.arange(self.n_step)
        pending = start[None, :] < self._count[:, None]
        emit = (all_windows[:, None] & pending) | (oldest_window[:, None] & (start[None, :] == 0))
        env_idx, start_idx = np.nonzero(emit)
        if env_idx.size == 0:
            return None
        count = self._count[env_idx]
        # reward_sum[m] = sum_{s <= j < count} gamma**(j - s) r[j] for window m starting at slot s.
        offset = start[None, :] - start_idx[:, None]
        in_window = (offset >= 0) & (start[None, :] < count[:, None])
        weights = np.where(in_window, self.gamma ** np.maximum(offset, 0), 0.0)
        reward_sum = (self._reward[env_idx] * weights).sum(axis=1)
        discount = np.where(terminated[env_idx], 0.0, self.gamma ** (count - start_idx))
        return {
            **{field_name("obs", key): buf[env_idx, start_idx] for key, buf in self._obs.items()},
            "action": self._action[env_idx, start_idx],
            "reward": reward_sum.astype(np.float32),
            "discount": discount.astype(np.float32),
            **{field_name("next_obs", key): buf[env_idx] for key, buf in next_obs.items()},
        }
