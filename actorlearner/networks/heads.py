"""Discrete action spaces as branches, and the action-branching dueling Q head (Tavakoli et al. 2018)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from torch import Tensor, nn

from actorlearner.networks.encoders import bound
from actorlearner.networks.leaves import UnsupportedSpace

DISCRETE_ACTIONS = "use Discrete, MultiDiscrete or MultiBinary"


@dataclass(frozen=True)
class ActionBranches:
    """An action space as D independent discrete choices.

    Attributes:
        sizes: the number of actions of each branch.
        starts: the action value of each branch's index 0.
        shape: the per-item action shape as stored (``()`` for Discrete).
        dtype: the dtype actions are stored in.
    """

    sizes: tuple[int, ...]
    starts: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype

    def to_indices(self, actions: Tensor) -> Tensor:
        """Actions ``[B, *shape]`` -> branch indices ``[B, D]`` (long, starts subtracted): device work only,
        so a captured step may call it. Branches with one start subtract a number; others a tensor of
        starts made on a device's first call (a trainer's eager warm-up step), then kept."""
        indices = actions.reshape(actions.shape[0], len(self.sizes)).long()
        if len(set(self.starts)) == 1:
            return indices - self.starts[0] if self.starts[0] else indices
        return indices - self._starts_on(actions.device)

    def _starts_on(self, device: torch.device) -> Tensor:
        kept = self.__dict__.setdefault("_device_starts", {})  # not a field: the dataclass is frozen
        if device not in kept:
            kept[device] = torch.tensor(self.starts, dtype=torch.long, device=device)
        return kept[device]

    def from_indices(self, indices: Tensor | np.ndarray) -> np.ndarray:
        """Branch indices ``[B, D]`` -> actions ``[B, *shape]`` in the space's dtype (starts added)."""
        if isinstance(indices, Tensor):
            indices = indices.detach().cpu().numpy()
        actions = np.asarray(indices, dtype=np.int64) + self._host_starts  # a new array, in any case
        return actions.astype(self.dtype, copy=False).reshape(len(actions), *self.shape)

    @functools.cached_property
    def _host_starts(self) -> np.ndarray:
        """The starts as one int64 array, made once (cached_property writes past the frozen dataclass)."""
        return np.asarray(self.starts, dtype=np.int64)


def action_branches(space: gym.Space) -> ActionBranches:
    """The branches of a Discrete, MultiDiscrete (row-major) or MultiBinary action space."""
    if isinstance(space, spaces.Discrete):
        return ActionBranches((int(space.n),), (int(space.start),), (), np.dtype(space.dtype))
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)) and not np.prod(space.shape):
        raise UnsupportedSpace("action", space, reason=f"its shape {space.shape} has no elements")
    if isinstance(space, spaces.MultiDiscrete):
        return ActionBranches(tuple(space.nvec.reshape(-1).tolist()), tuple(space.start.reshape(-1).tolist()),
                              space.shape, np.dtype(space.dtype))
    if isinstance(space, spaces.MultiBinary):
        count = int(np.prod(space.shape))
        return ActionBranches((2,) * count, (0,) * count, space.shape, np.dtype(space.dtype))
    if isinstance(space, spaces.Box):
        raise UnsupportedSpace("action", space, reason=f"continuous actions are not supported by this algorithm yet; "
                                                       f"{DISCRETE_ACTIONS}")
    raise UnsupportedSpace("action", space, reason=DISCRETE_ACTIONS)


class BranchingDuelingHead(nn.Module):
    """Q values ``[B, D, N_max]`` of D action branches from features ``[B, in_features]``.

    One shared state value V(s) and one advantage layer per branch (all in one Linear):
    ``Q_d = V + A_d - mean(A_d)`` with the mean over branch d's own actions, or ``Q_d = A_d``
    without dueling. Entries past a branch's size are -inf, so argmax never picks them.
    """

    def __init__(self, in_features: int, sizes: tuple[int, ...], dueling: bool = True):
        super().__init__()
        if not sizes or min(sizes) < 1:
            raise ValueError(f"branch sizes {sizes} must be one or more positive counts")
        self.sizes = tuple(sizes)
        self.n_max = max(sizes)
        self.advantages = nn.Linear(in_features, sum(sizes))
        self.value = nn.Linear(in_features, 1) if dueling else None
        branch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        slot = torch.cat([torch.arange(size) for size in sizes])
        self.register_buffer("branch", branch, persistent=False)
        self.register_buffer("padded_index", branch * self.n_max + slot, persistent=False)
        self.register_buffer("size_of_branch", torch.tensor(sizes, dtype=torch.float32), persistent=False)

    def forward(self, h: Tensor) -> Tensor:
        q = self.advantages(h)
        if len(self.sizes) == 1:  # one branch (Discrete): nothing to pad, a third of the ops
            return _one_branch(q, self.value(h) if self.value is not None else None)
        if self.value is not None:
            sums = torch.zeros(h.shape[0], len(self.sizes), dtype=q.dtype, device=q.device).index_add(1, self.branch, q)
            q = self.value(h) + q - (sums / self.size_of_branch)[:, self.branch]
        padded = torch.full((h.shape[0], len(self.sizes) * self.n_max), float("-inf"), dtype=q.dtype, device=q.device)
        return padded.index_copy(1, self.padded_index, q).view(h.shape[0], len(self.sizes), self.n_max)

    def function(self) -> Callable[[Tensor], Tensor]:
        """`forward` as a function of the parameters held now (see `encoders.bound`): one branch's layers
        applied as functions; several branches call the module."""
        if len(self.sizes) != 1:
            return self
        advantages = bound(self.advantages)
        if self.value is None:
            return lambda h: _one_branch(advantages(h), None)
        value = bound(self.value)
        return lambda h: _one_branch(advantages(h), value(h))


def _one_branch(advantages: Tensor, value: Tensor | None) -> Tensor:
    """Q values ``[B, 1, N]`` of one branch: dueling when there is a ``value``."""
    return (value + advantages - advantages.mean(1, keepdim=True) if value is not None else advantages).unsqueeze(1)


MASK_KEY = "action_mask"
"""The Dict observation entry that marks legal actions (PettingZoo's convention): 1 legal, 0 not."""
ILLEGAL_Q = -1e9
"""What a masked Q value becomes: never the argmax while any action is legal, finite so that a
terminal next state (every action masked, discount 0) still gives a finite target."""


def action_mask_key(observation_space: gym.Space, branches: ActionBranches) -> str | None:
    """The observation leaf masking illegal actions, if the space has one: a Dict entry ``action_mask``
    of one 0/1 per action of a single discrete branch (MultiBinary(n) or a Box of shape (n,))."""
    if not isinstance(observation_space, spaces.Dict) or MASK_KEY not in observation_space.spaces:
        return None
    leaf = observation_space[MASK_KEY]
    fits = isinstance(leaf, (spaces.MultiBinary, spaces.Box)) and tuple(leaf.shape) == branches.sizes
    return MASK_KEY if fits and len(branches.sizes) == 1 else None


def mask_q(q: Tensor, legal: Tensor) -> Tensor:
    """Q values ``[..., 1, N]`` with the actions ``legal`` ``[..., N]`` marks 0 set to `ILLEGAL_Q`."""
    return q.masked_fill((legal < 0.5).unsqueeze(-2), ILLEGAL_Q)
