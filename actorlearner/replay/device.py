"""The replay's device path: batched torch operations on any device (what CUDA runs), with no host read.

Sampling and priority updates are a fixed sequence of device operations that never read a value
back to the host, so on CUDA nothing waits for the GPU and a fixed-size :meth:`DeviceReplay.draw`
with :meth:`~DeviceReplay.update_priorities` can be captured in a CUDA graph. What the host must
know (is anything eligible to sample?) it keeps itself from what it inserted; what only the device
knows (was a priority NaN?) is counted there and raised by :meth:`DeviceReplay.check_errors`.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import torch

from actorlearner.replay.buffer import PrioritizedReplay, Reservation, Sample
from actorlearner.replay.layout import gather_rows, ring_parts
from actorlearner.replay.staging import RowStaging
from actorlearner.replay.sumtree import SumTree

# The buffer only reads its inputs, so read-only arrays (views of a received payload) are fine.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=re.escape(__name__))

_NO_VERSION = int(np.iinfo(np.int64).min)  # the device's "nothing evicted"
_ERRORS = ("NaN", "infinite", "negative", "out of range")  # what update_priorities counts on the device


class DeviceReplay(PrioritizedReplay, compiled=False):
    """:class:`PrioritizedReplay` as torch operations on its device, over a :class:`SumTree`.

    Runtime values the device operations read (alpha, beta, the eviction version, the largest
    priority) are device tensors, refilled from the host when they change, never baked into a
    captured graph. The host mirrors each slot's version and whether it holds an item, so it
    knows without asking the device whether any item may be sampled.
    """

    def __init__(self, capacity: int, *args, device: str | torch.device = "cpu", **kwargs):
        self.device = torch.device(device)  # the runtime values' device tensors are made from the start
        self._host_versions = np.zeros(capacity, dtype=np.int64)
        self._host_stored = np.zeros(capacity, dtype=bool)
        self._eligible = 0  # stored items at or above the eviction version: all have positive leaves
        super().__init__(capacity, *args, device=device, **kwargs)
        self._errors = torch.zeros(len(_ERRORS), dtype=torch.long, device=self.device)
        self._beta_t = torch.zeros((), dtype=torch.float64, device=self.device)
        self._staging = RowStaging(self._rows, self._layout) if self.device.type == "cuda" else None

    # -- runtime values kept on the device too -------------------------------------------------

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._alpha = value
        self._device_scalar("_alpha_t", value, torch.float64)

    @property
    def _inserted(self) -> int:
        return self._issued

    @_inserted.setter
    def _inserted(self, value: int) -> None:
        self._issued = value
        self._device_scalar("_inserted_t", value, torch.long)  # the keys a priority update may name

    @property
    def _max_priority(self) -> float:
        """The largest priority seen (read from the device: only snapshots ask)."""
        return float(self._max_priority_t)

    @_max_priority.setter
    def _max_priority(self, value: float) -> None:
        self._device_scalar("_max_priority_t", value, torch.float64)

    @property
    def _min_version(self) -> int | None:
        return self._evicted_below

    @_min_version.setter
    def _min_version(self, value: int | None) -> None:
        self._evicted_below = value
        self._device_scalar("_min_version_t", _NO_VERSION if value is None else value, torch.long)
        self._eligible = int(np.count_nonzero(self._host_stored & (self._host_versions >= self._lowest_eligible())))

    def _device_scalar(self, name: str, value, dtype: torch.dtype) -> None:
        """Set the 0-d device tensor ``name`` to ``value`` in place (a captured graph keeps reading it)."""
        if name in vars(self):
            getattr(self, name).fill_(value)
        else:
            setattr(self, name, torch.tensor(value, dtype=dtype, device=self.device))

    def _lowest_eligible(self) -> int:
        return _NO_VERSION if self._evicted_below is None else self._evicted_below

    # -- sampling: a host half, then device operations only ------------------------------------

    def start_sample(self, batch_size: int, min_policy_version: int | None = None) -> bool:
        """The host half of :meth:`sample` (checks, eviction, beta's annealing); True when :meth:`draw`
        may follow, False when only :meth:`draw_on_host` can (nothing eligible, or zero priorities)."""
        return self._set_beta(self._begin_sample(batch_size, min_policy_version))

    def draw(self, batch_size: int) -> Sample:
        """Stratified draws and IS weights after :meth:`start_sample` said True: device operations only."""
        with torch.no_grad():  # not inference mode: what it returns goes into the trainer's autograd
            slots = self._tree.sample_positive(batch_size)
            leaf = self._tree.leaves.index_select(0, slots)
            weights = leaf.div_(self._tree.min_positive()).pow_(-self._beta_t).float()
            return self._sample_of_rows(gather_rows(self._rows, slots), weights)

    def draw_on_host(self, batch_size: int) -> Sample:
        """What :meth:`draw` can't: uniform over eligible items when their priorities are all zero
        (raising :class:`NothingRecentEnough` when none is eligible); reads the device."""
        return super()._draw(batch_size, self._host_beta)

    def _draw(self, batch_size: int, beta: float) -> Sample:
        return self.draw(batch_size) if self._set_beta(beta) else self.draw_on_host(batch_size)

    def _set_beta(self, beta: float) -> bool:
        """Take this sample's beta (on the device too); whether :meth:`draw` may follow."""
        self._beta_t.fill_(beta)
        self._host_beta = beta
        return self._eligible > 0 and self.eps ** self.alpha > 0  # then every eligible leaf is positive

    def _sample_by_priority(self, batch_size: int, beta: float) -> Sample:
        return self.draw(batch_size)

    def _evict_older_than(self, min_version: int) -> None:
        if self._min_version is not None and min_version <= self._min_version:
            return
        self._min_version = min_version
        with torch.inference_mode():
            leaves = self._tree.leaves
            self._tree.update_range(0, torch.where(self._versions < self._min_version_t, 0.0, leaves))

    # -- priority updates: checked on the device ------------------------------------------------

    @torch.inference_mode()
    def update_priorities(self, indices, priorities) -> None:
        """As :meth:`PrioritizedReplay.update_priorities`; values given as device tensors are checked on
        the device: a call with any NaN, infinite or negative priority or unknown key changes nothing,
        and :meth:`check_errors` raises the error. Host values (numpy, lists) raise at once."""
        keys = self._as_input(indices, torch.long).reshape(-1)
        if not isinstance(priorities, torch.Tensor):
            self._check_host_priorities(np.asarray(priorities, dtype=np.float64).reshape(-1))
        if not isinstance(indices, torch.Tensor):
            self._check_host_keys(np.asarray(indices, dtype=np.int64).reshape(-1))
        p = self._as_input(priorities, torch.float64).reshape(-1)
        if p.shape[0] != keys.shape[0]:
            raise ValueError(f"got {p.shape[0]} priorities for {keys.shape[0]} items")
        if keys.numel() == 0:
            return
        slots = keys.remainder(self.capacity)
        known = (keys >= 0) & (keys < self._inserted_t)
        counts = torch.stack([p.isnan().sum(), p.isinf().sum(), (p < 0).sum(), (~known).sum()])
        self._errors += counts
        accepted = counts.sum() == 0
        p = torch.where(accepted, p, 0.0)
        torch.maximum(self._max_priority_t, p.max(), out=self._max_priority_t)
        live = (self._keys.index_select(0, slots) == keys) & accepted
        # Items overwritten since they were sampled keep their slot's value; sorted before the live
        # writes to the same slot, so the last live write wins (the tree keeps this stable order).
        order = torch.sort(slots * 2 + live, stable=True).indices
        slots, live, p = slots.index_select(0, order), live.index_select(0, order), p.index_select(0, order)
        values = torch.where(live, self._leaf_values(p, self._versions.index_select(0, slots)),
                             self._tree.leaves.index_select(0, slots))
        self._tree.update(slots, values)

    def check_errors(self) -> None:
        counts = self._errors.tolist()
        if not any(counts):
            return
        self._errors.zero_()
        nan, inf, negative, unknown = counts
        if unknown:
            raise ValueError(f"indices out of range [0, {self._inserted}): {unknown} keys in refused updates")
        kind = "NaN" if nan else "infinite" if inf else "negative"
        raise ValueError(f"priorities must be finite and >= 0; got {kind} values")

    def _check_host_priorities(self, p: np.ndarray) -> None:
        if p.size and not (np.all(p >= 0) and np.all(p < math.inf)):  # NaN fails both comparisons
            kind = "NaN" if np.isnan(p).any() else "infinite" if np.isinf(p).any() else "negative"
            raise ValueError(f"priorities must be finite and >= 0; got {kind} values")

    def _check_host_keys(self, keys: np.ndarray) -> None:
        bad = keys[(keys < 0) | (keys >= self._inserted)]
        if bad.size:
            raise ValueError(f"indices out of range [0, {self._inserted}): {bad[:5].tolist()}")

    def _check_priorities(self, priorities, n: int) -> torch.Tensor:
        """An insert's priorities, checked on the host (read back if given on the device: inserts may wait)."""
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().cpu()
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if p.shape[0] != n:
            raise ValueError(f"got {p.shape[0]} priorities for {n} items")
        self._check_host_priorities(p)
        if n:
            torch.maximum(self._max_priority_t, torch.tensor(p.max(), device=self.device), out=self._max_priority_t)
        return torch.from_numpy(p)

    # -- inserts --------------------------------------------------------------------------------

    def _copy_in(self, reservation: Reservation) -> None:
        if reservation.n == 0:
            return
        with torch.inference_mode():
            if self._staging is not None:
                self._staging.write(reservation.columns, reservation.start)
                return
            for name, col in reservation.columns.items():
                self._write(self._columns[name], reservation.start, col)

    def _make_tree(self, branching: int) -> SumTree:
        return SumTree(self.capacity, branching, self.device)

    def _as_input(self, value, dtype: torch.dtype) -> torch.Tensor:
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        return torch.as_tensor(value, device=self.device).to(dtype)

    def _as_versions(self, value) -> np.ndarray:
        """Versions stay on the host, as numpy, until the commit (the host mirrors them)."""
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
        return np.asarray(value, dtype=np.int64)

    def _input_column(self, value, dtype: torch.dtype):
        """Columns stay where they are until :meth:`write` copies them (no lock, no device work)."""
        return torch.from_numpy(value) if isinstance(value, np.ndarray) else value

    def _highest_priority(self, priorities) -> float:
        raise NotImplementedError("the device path checks priorities in _check_priorities")

    def _hide(self, start: int, n: int) -> None:
        for at, stop, _ in ring_parts(start, n, self.capacity):
            stored = self._host_stored[at:stop]
            self._eligible -= int(np.count_nonzero(stored & (self._host_versions[at:stop] >= self._lowest_eligible())))
            stored[:] = False
        with torch.inference_mode():
            self._write(self._keys, start, torch.full((n,), -1, dtype=torch.long, device=self.device))
            self._write(None, start, torch.zeros(n, dtype=torch.float64, device=self.device))

    def _store(self, reservation: Reservation, keys: torch.Tensor) -> None:
        n, start = reservation.n, reservation.start
        host_versions = np.broadcast_to(reservation.versions, (n,))  # one version for all items, or one each
        for at, stop, offset in ring_parts(start, n, self.capacity):
            versions_part = host_versions[offset:offset + stop - at]
            self._host_versions[at:stop] = versions_part
            self._host_stored[at:stop] = True
            self._eligible += int(np.count_nonzero(versions_part >= self._lowest_eligible()))
        with torch.inference_mode():
            versions = torch.from_numpy(np.ascontiguousarray(host_versions)).to(self.device, non_blocking=True)
            if reservation.priorities is None:
                priorities = self._max_priority_t.expand(n)
            else:
                priorities = reservation.priorities.to(self.device, non_blocking=True)
            self._write(self._keys, start, keys)
            self._write(self._versions, start, versions)
            self._write(None, start, self._leaf_values(priorities, versions))

    def _loaded(self) -> None:
        n = len(self)
        self._host_stored[:] = False
        self._host_stored[:n] = (self._keys[:n] >= 0).cpu().numpy()
        self._host_versions[:] = self._versions.cpu().numpy()
        self._min_version = self._min_version  # recounts the eligible items

    def _leaf_values(self, priorities: torch.Tensor, versions: torch.Tensor) -> torch.Tensor:
        leaf = (priorities + self.eps).pow_(self._alpha_t)
        return torch.where(versions >= self._min_version_t, leaf, 0.0)  # evicted versions stay at zero

    def _write(self, store: torch.Tensor | None, start: int, values: torch.Tensor) -> None:
        """Copy ``values`` into the circular ``store`` (or the tree's leaves) from ``start``, wrapping once."""
        for at, stop, offset in ring_parts(start, values.shape[0], self.capacity):
            part = values[offset:offset + stop - at]
            if store is None:
                self._tree.update_range(at, part)
            else:
                store[at:stop].copy_(part, non_blocking=True)
