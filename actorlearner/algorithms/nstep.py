"""N-step transition assembly for a gymnasium vector env in NEXT_STEP autoreset mode.

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

import numpy as np


class NStepAssembler:
    """Turns per-step vector-env results into n-step transitions, vectorized over envs."""

    def __init__(
        self,
        num_envs: int,
        n_step: int,
        gamma: float,
        obs_shape: tuple[int, ...],
        action_shape: tuple[int, ...] = (),
        action_dtype: np.dtype | type = np.int64,
        obs_dtype: np.dtype | type = np.float32,
    ):
        if n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {n_step}")
        self.num_envs = num_envs
        self.n_step = n_step
        self.gamma = float(gamma)
        self.obs_shape = tuple(obs_shape)
        self.obs_dtype = np.dtype(obs_dtype)
        self._obs = np.zeros((num_envs, n_step, *self.obs_shape), self.obs_dtype)
        self._action = np.zeros((num_envs, n_step, *action_shape), action_dtype)
        self._reward = np.zeros((num_envs, n_step), np.float64)
        self._count = np.zeros(num_envs, np.int64)  # pending windows per env, oldest at slot 0
        self._autoreset = np.zeros(num_envs, np.bool_)  # env ended last step; its next step is a reset
        self._last_next_obs = np.zeros((num_envs, *self.obs_shape), self.obs_dtype)

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
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
    ) -> dict[str, np.ndarray] | None:
        """Record one vector step (obs is what the actions were chosen on); returns completed transitions."""
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.asarray(truncated, np.bool_)
        next_obs = np.asarray(next_obs, self.obs_dtype)
        live = ~self._autoreset  # envs whose step was a real env step, not an autoreset
        ended = live & (terminated | truncated)
        self._autoreset = ended

        envs = np.flatnonzero(live)
        slot = self._count[envs]
        self._obs[envs, slot] = np.asarray(obs, self.obs_dtype)[envs]
        self._action[envs, slot] = np.asarray(action)[envs]
        self._reward[envs, slot] = np.asarray(reward, np.float64)[envs]
        self._count[envs] += 1
        self._last_next_obs[envs] = next_obs[envs]

        full = live & ~ended & (self._count == self.n_step)
        out = self._emit(ended, full, live & terminated, next_obs)

        self._count[ended] = 0
        shift = np.flatnonzero(full)  # drop the emitted oldest window
        if shift.size:
            for buf in (self._obs, self._action, self._reward):
                buf[shift, :-1] = buf[shift, 1:]
            self._count[shift] -= 1
        return out

    def flush(self) -> dict[str, np.ndarray] | None:
        """Emit every pending window as if truncated now (bootstrapping from the last next_obs)."""
        has_pending = self._count > 0
        out = self._emit(has_pending, np.zeros_like(has_pending), np.zeros_like(has_pending), self._last_next_obs)
        self._count[:] = 0
        return out

    def rebuild(self, n_step: int, gamma: float) -> tuple[NStepAssembler, dict[str, np.ndarray] | None]:
        """Flush this assembler and return one for new settings that continues the same episodes.

        The flushed windows are ordinary truncated transitions (their `discount` carries the
        old gamma**k), so every env step still starts exactly one transition. The new
        assembler inherits which envs are about to autoreset, so those reset steps still
        produce nothing.
        """
        flushed = self.flush()
        fresh = NStepAssembler(self.num_envs, n_step, gamma, self.obs_shape, self._action.shape[2:],
                               self._action.dtype, self.obs_dtype)
        fresh._autoreset[:] = self._autoreset
        return fresh, flushed

    def _emit(
        self, all_windows: np.ndarray, oldest_window: np.ndarray, terminated: np.ndarray, next_obs: np.ndarray
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
            "obs": self._obs[env_idx, start_idx],
            "action": self._action[env_idx, start_idx],
            "reward": reward_sum.astype(np.float32),
            "discount": discount.astype(np.float32),
            "next_obs": next_obs[env_idx].astype(self.obs_dtype, copy=True),
        }
