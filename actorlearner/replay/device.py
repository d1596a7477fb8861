"""The replay's device path: batched torch operations on any device (what CUDA runs)."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import torch

from actorlearner.replay.buffer import PrioritizedReplay, Reservation, Sample
from actorlearner.replay.layout import gather_rows
from actorlearner.replay.sumtree import SumTree

# The buffer only reads its inputs, so read-only arrays (views of a received payload) are fine.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=re.escape(__name__))


class DeviceReplay(PrioritizedReplay, compiled=False):
    """:class:`PrioritizedReplay` as torch operations on its device, over a :class:`SumTree`."""

    def write(self, reservation: Reservation) -> None:
        if reservation.n == 0:
            return
        with torch.inference_mode():
            for name, col in reservation.columns.items():
                self._write(self._columns[name], reservation.start, col)

    @torch.inference_mode()
    def update_priorities(self, indices, priorities) -> None:
        keys = self._as_input(indices, torch.long).reshape(-1)
        priorities = self._check_priorities(priorities, keys.shape[0])
        if keys.numel() == 0:
            return
        low, high = (int(x) for x in torch.aminmax(keys))
        if low < 0 or high >= self._inserted:
            bad = keys[(keys < 0) | (keys >= self._inserted)][:5].tolist()
            raise ValueError(f"indices out of range [0, {self._inserted}): {bad}")
        slots = keys % self.capacity
        live = self._keys.index_select(0, slots) == keys
        if not bool(live.all()):
            slots, priorities = slots[live], priorities[live]
        versions = None if self._min_version is None else self._versions.index_select(0, slots)
        self._tree.update(slots, self._leaf_values(priorities, versions))

    def _make_tree(self, branching: int) -> SumTree:
        return SumTree(self.capacity, branching, self.device)

    def _as_input(self, value, dtype: torch.dtype) -> torch.Tensor:
        if isinstance(value, np.ndarray):
            value = _from_numpy(value)
        return torch.as_tensor(value, device=self.device).to(dtype)

    def _input_column(self, value, dtype: torch.dtype):
        if isinstance(value, np.ndarray):
            value = _from_numpy(value)
        return value.to(self.device, non_blocking=True) if isinstance(value, torch.Tensor) else value

    def _highest_priority(self, priorities: torch.Tensor) -> float:
        low, high = (float(x) for x in torch.aminmax(priorities))
        if not (low >= 0 and high < math.inf):  # NaN fails both comparisons
            kind = "NaN" if bool(priorities.isnan().any()) else "infinite" if high == math.inf else "negative"
            raise ValueError(f"priorities must be finite and >= 0; got {kind} values")
        return high

    def _hide(self, start: int, n: int) -> None:
        with torch.inference_mode():
            self._write(self._keys, start, torch.full((n,), -1, dtype=torch.long, device=self.device))
            self._write(None, start, torch.zeros(n, dtype=torch.float64, device=self.device))

    def _store(self, reservation: Reservation, keys: torch.Tensor) -> None:
        n, start, priorities = reservation.n, reservation.start, reservation.priorities
        versions = reservation.versions.expand(n)  # one version for all items, or one each
        with torch.inference_mode():
            if priorities is None:
                priorities = torch.full((n,), self._max_priority, dtype=torch.float64, device=self.device)
            self._write(self._keys, start, keys)
            self._write(self._versions, start, versions)
            self._write(None, start, self._leaf_values(priorities, versions))

    def _sample_by_priority(self, batch_size: int, beta: float) -> Sample:
        slots = self._tree.sample(batch_size)
        leaf = self._tree.leaves.index_select(0, slots)
        weights = leaf.div_(self._tree.min_positive()).pow_(-beta).float()
        return self._sample_of_rows(gather_rows(self._rows, slots), weights)

    def _leaf_values(self, priorities: torch.Tensor, versions: torch.Tensor | None) -> torch.Tensor:
        leaf = (priorities + self.eps).pow_(self.alpha)
        if self._min_version is not None:  # evicted versions stay at zero
            leaf = torch.where(versions >= self._min_version, leaf, 0.0)
        return leaf

    def _write(self, store: torch.Tensor | None, start: int, values: torch.Tensor) -> None:
        """Copy ``values`` into the circular ``store`` (or the tree's leaves) from ``start``, wrapping once."""
        first = min(values.shape[0], self.capacity - start)
        for at, part in ((start, values[:first]), (0, values[first:])):
            if part.shape[0] == 0:
                continue
            if store is None:
                self._tree.update_range(at, part)
            else:
                store[at:at + part.shape[0]].copy_(part)


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array`` without copying (read-only arrays too: see the filter above)."""
    return torch.from_numpy(array)
