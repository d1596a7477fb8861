"""Fixed-length sequences of one env's steps, for recurrent agents (R2D2), from a NEXT_STEP vector env.

A sequence item of ``length`` T holds T steps of one episode: observations ``obs/<leaf>``
[T + 1] (each stored once; slot T, or the slot after the episode's last step, is the
observation the last step led to), ``action`` [T], ``reward`` [T], ``discount`` [T] (gamma,
0 where the episode terminated), ``mask`` [T] (False on the padding after an episode's
end), ``first`` (the sequence starts its episode, so its stored state is exact), and the
recurrent state the policy held before acting on the first step, ``state/<name>``.

Consecutive sequences of an episode share ``overlap`` steps: once full, a sequence is
emitted and the next begins with its last ``overlap`` steps. An episode's end emits the
sequence under way, padded; the next episode starts a new one.

The policy's recurrent state lives in a `RecurrentState` the policy shares with its
assembler, which reads the state each step was acted from. Zeroing it when an episode
starts is the policy's ``reset_memory``, which the actor calls after each autoreset.
"""

from __future__ import annotations

from typing import Protocol

import gymnasium as gym
import numpy as np
import torch

from actorlearner.algorithms.base import TransitionFields, torch_dtype
from actorlearner.networks.leaves import field_name, leaf_arrays, leaf_fields


class RecurrentState(Protocol):
    """An actor's per-env recurrent state, shared by its policy and its assembler."""

    def acted_from(self) -> dict[str, np.ndarray]:
        """The states [E, ...] the latest actions were chosen from, by name."""
        ...


def sequence_fields(observation_space: gym.Space, length: int, action_shape: tuple[int, ...],
                    action_dtype: torch.dtype, state_shapes: dict[str, tuple[int, ...]]) -> TransitionFields:
    """The replay item of a sequence of ``length`` steps (see the module docstring)."""
    return {
        **{field_name("obs", key): ((length + 1, *shape), torch_dtype(dtype))
           for key, (shape, dtype) in leaf_fields(observation_space).items()},
        "action": ((length, *action_shape), action_dtype),
        "reward": ((length,), torch.float32),
        "discount": ((length,), torch.float32),
        "mask": ((length,), torch.bool),
        "first": ((), torch.bool),
        **{f"state/{name}": (shape, torch.float32) for name, shape in state_shapes.items()},
    }


class SequenceAssembler:
    """Cuts each env's steps into overlapping fixed-length sequences, vectorized over envs."""

    def __init__(self, num_envs: int, length: int, overlap: int, gamma: float, observation_space: gym.Space,
                 action_shape: tuple[int, ...], action_dtype: np.dtype | type, memory: RecurrentState,
                 state_shapes: dict[str, tuple[int, ...]]):
        if length < 1 or not 0 <= overlap < length:
            raise ValueError(f"need length >= 1 and 0 <= overlap < length, got {length} and {overlap}")
        self.num_envs, self.length, self.overlap, self.gamma = num_envs, length, overlap, float(gamma)
        self.observation_space, self.memory = observation_space, memory
        leaves = leaf_fields(observation_space)
        self._obs = {key: np.zeros((num_envs, length + 1, *shape), dtype) for key, (shape, dtype) in leaves.items()}
        self._action = np.zeros((num_envs, length, *action_shape), action_dtype)
        self._reward = np.zeros((num_envs, length), np.float32)
        self._discount = np.zeros((num_envs, length), np.float32)
        self._states = {name: np.zeros((num_envs, length, *shape), np.float32) for name, shape in state_shapes.items()}
        self._count = np.zeros(num_envs, np.int64)  # steps in each env's sequence under way
        self._first = np.ones(num_envs, np.bool_)  # that sequence starts its episode
        self._autoreset = np.zeros(num_envs, np.bool_)  # env ended last step; its next step is a reset

    def push(self, obs, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
             next_obs) -> dict[str, np.ndarray] | None:
        """Record one vector step (as the vector env returns it); returns finished sequences."""
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.asarray(truncated, np.bool_)
        obs = leaf_arrays(self.observation_space, obs)
        next_obs = leaf_arrays(self.observation_space, next_obs)
        live = ~self._autoreset
        ended = live & (terminated | truncated)
        self._autoreset = ended

        envs = np.flatnonzero(live)
        slot = self._count[envs]
        for key, buf in self._obs.items():
            buf[envs, slot] = obs[key][envs]
            buf[envs, slot + 1] = next_obs[key][envs]  # overwritten by the next step's obs unless it is the last
        self._action[envs, slot] = np.asarray(action)[envs]
        self._reward[envs, slot] = np.asarray(reward, np.float32)[envs]
        self._discount[envs, slot] = np.where(terminated[envs], 0.0, self.gamma)
        for name, state in self.memory.acted_from().items():
            self._states[name][envs, slot] = state[envs]
        self._count[envs] += 1

        full = live & ~ended & (self._count == self.length)
        out = self._emit(ended | full)
        self._count[ended] = 0
        self._first[ended] = True
        self._carry_overlap(np.flatnonzero(full))
        return out

    def flush(self) -> dict[str, np.ndarray] | None:
        """Emit every sequence under way as if its episode were cut now."""
        pending = self._count > 0
        out = self._emit(pending)
        self._count[:] = 0
        self._first[pending] = False  # those episodes go on: their next sequence starts mid-episode
        return out

    def inherit(self, previous: SequenceAssembler) -> None:
        """Continue the episodes a flushed ``previous`` assembler (of other settings) was assembling."""
        self._autoreset[:] = previous._autoreset
        self._first[:] = previous._first

    def _emit(self, envs_mask: np.ndarray) -> dict[str, np.ndarray] | None:
        envs = np.flatnonzero(envs_mask & (self._count > 0))
        if envs.size == 0:
            return None
        count = self._count[envs]
        mask = np.arange(self.length)[None, :] < count[:, None]
        obs_mask = np.arange(self.length + 1)[None, :] <= count[:, None]
        return {
            **{field_name("obs", key): _zero_outside(buf[envs], obs_mask) for key, buf in self._obs.items()},
            "action": _zero_outside(self._action[envs], mask),
            "reward": _zero_outside(self._reward[envs], mask),
            "discount": _zero_outside(self._discount[envs], mask),
            "mask": mask,
            "first": self._first[envs].copy(),
            **{f"state/{name}": buf[envs, 0].copy() for name, buf in self._states.items()},
        }

    def _carry_overlap(self, envs: np.ndarray) -> None:
        """Start the next sequence of ``envs`` (just emitted full) with their last ``overlap`` steps."""
        if envs.size == 0:
            return
        shift = self.length - self.overlap
        for buf in self._obs.values():
            buf[envs, : self.overlap + 1] = buf[envs, shift:]
        for buf in (self._action, self._reward, self._discount, *self._states.values()):
            buf[envs, : self.overlap] = buf[envs, shift:]
        self._count[envs] = self.overlap
        self._first[envs] = False


def _zero_outside(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``values`` [N, T, ...] with the steps where ``mask`` [N, T] is False zeroed (stale slots)."""
    return values * mask.reshape(*mask.shape, *[1] * (values.ndim - 2)).astype(values.dtype)
