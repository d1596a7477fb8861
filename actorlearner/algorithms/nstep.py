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
from actorlearner.networks.leaves import field_name, leaf_fields, leaf_splitter


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
    """Turns per-step vector-env results into n-step transitions, vectorized over envs.

    The last ``n_step`` steps of every env sit in rings indexed by the vector step, so a step
    is written with one slice per field; an env's windows are its last ``count`` steps. A step
    where no episode ends emits every full env's oldest window with a few array operations.
    """

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
        self._split = leaf_splitter(observation_space)
        leaves = leaf_fields(observation_space)
        self._obs = {key: np.zeros((num_envs, n_step, *shape), dtype) for key, (shape, dtype) in leaves.items()}
        self._last_next_obs = {key: np.zeros((num_envs, *shape), dtype) for key, (shape, dtype) in leaves.items()}
        self._action = np.zeros((num_envs, n_step, *action_shape), action_dtype)
        self._reward = np.zeros((num_envs, n_step), np.float64)
        self._powers = self.gamma ** np.arange(n_step + 1)  # gamma**k: reward weights and discounts
        self._step = 0  # vector steps pushed; step t sits at ring position t % n_step
        self._count = np.zeros(num_envs, np.int64)  # pending windows per env: its last `count` steps start them
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
        next_obs = self._split(next_obs)
        live = ~self._autoreset  # envs whose step was a real env step, not an autoreset
        ended = live & (terminated | np.asarray(truncated, np.bool_))
        self._autoreset = ended

        position = self._step % self.n_step  # an env not live has no windows: its slot is free too
        for key, array in self._split(obs).items():
            self._obs[key][:, position] = array
        self._action[:, position] = action
        self._reward[:, position] = reward
        everyone = live.all()
        for key, array in next_obs.items():
            if everyone:
                self._last_next_obs[key][:] = array
            else:
                self._last_next_obs[key][live] = array[live]
        self._count += live
        full = live & ~ended & (self._count == self.n_step)
        if ended.any():
            out = self._emit(ended, full, live & terminated, next_obs)
            self._count[ended] = 0
        else:
            out = self._emit_full(full, next_obs)
        self._count[full] -= 1
        self._step += 1
        return out

    def flush(self) -> dict[str, np.ndarray] | None:
        """Emit every pending window as if truncated now (bootstrapping from the last next_obs)."""
        has_pending = self._count > 0
        self._step -= 1  # emit as of the last step pushed
        out = self._emit(has_pending, np.zeros_like(has_pending), np.zeros_like(has_pending), self._last_next_obs)
        self._step += 1
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

    def _emit_full(self, full: np.ndarray, next_obs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
        """The oldest window of each ``full`` env: all n steps in the rings, the oldest at the next position."""
        env_idx = np.flatnonzero(full)
        if env_idx.size == 0:
            return None
        start = (self._step + 1) % self.n_step
        rewards = self._reward[env_idx]
        reward_sum = rewards[:, start] * self._powers[0]
        for j in range(1, self.n_step):
            reward_sum += rewards[:, (start + j) % self.n_step] * self._powers[j]
        discount = np.full(env_idx.size, self._powers[self.n_step], np.float32)
        return self._transitions(env_idx, np.full(env_idx.size, start), reward_sum, discount, next_obs)

    def _emit(
        self, all_windows: np.ndarray, oldest_window: np.ndarray, terminated: np.ndarray,
        next_obs: dict[str, np.ndarray],
    ) -> dict[str, np.ndarray] | None:
        """Transitions for all pending windows of `all_windows` envs and the oldest one of `oldest_window` envs."""
        window = np.arange(self.n_step)  # k: an env's k-th pending window, oldest first
        pending = window[None, :] < self._count[:, None]
        emit = (all_windows[:, None] & pending) | (oldest_window[:, None] & (window[None, :] == 0))
        env_idx, k = np.nonzero(emit)
        if env_idx.size == 0:
            return None
        length = self._count[env_idx] - k  # steps in the window, up to the last pushed
        first = self._step - length + 1  # the window's first step
        reward_sum = np.zeros(env_idx.size)
        for j in range(self.n_step):
            in_window = j < length
            reward_sum += np.where(in_window, self._reward[env_idx, (first + j) % self.n_step] * self._powers[j], 0.0)
        discount = np.where(terminated[env_idx], 0.0, self._powers[length])
        return self._transitions(env_idx, first % self.n_step, reward_sum, discount.astype(np.float32), next_obs)

    def _transitions(self, env_idx: np.ndarray, start: np.ndarray, reward_sum: np.ndarray, discount: np.ndarray,
                     next_obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The fields of windows of envs ``env_idx`` starting at ring positions ``start``."""
        return {
            **{field_name("obs", key): buf[env_idx, start] for key, buf in self._obs.items()},
            "action": self._action[env_idx, start],
            "reward": reward_sum.astype(np.float32),
            "discount": discount,
            **{field_name("next_obs", key): buf[env_idx] for key, buf in next_obs.items()},
            **self._extra(env_idx, start),
        }

    def _extra(self, env_idx: np.ndarray, start: np.ndarray) -> dict[str, np.ndarray]:
        """More entries for windows of ``env_idx`` starting at ring positions ``start`` (none here)."""
        return {}
