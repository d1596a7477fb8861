"""Prioritized experience replay: the :class:`PrioritizedReplay` interface and what its paths share.

:func:`~actorlearner.replay.factory.make_replay` builds the compiled CPU path
(:mod:`~actorlearner.replay.compiled`) or the torch device path (:mod:`~actorlearner.replay.device`);
both keep their items in the same rows (:mod:`~actorlearner.replay.layout`) and checkpoint the same
way. The runtime values the device path also keeps on the device (alpha, the keys issued, the
largest priority, the eviction version) change only through the hook methods named for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from actorlearner.frames import FrameLayout
from actorlearner.replay.checkpoint import ReplayState
from actorlearner.replay.frame_ring import FRAME, FrameRing
from actorlearner.replay.layout import KEY, VERSION, FieldSpec, gather_rows, numpy_dtype, row_layout, typed_columns
from actorlearner.replay.sampling import DeviceSampling, NothingRecentEnough, Sample
from actorlearner.replay.snapshot import ReplaySnapshot
from actorlearner.replay.sumtree import CpuSumTree, SumTree
from actorlearner.replay.versions import VersionIndex
from actorlearner.wire import FRAMES

KERNELS = ("auto", "torch", "triton")
"""The kernel choices: the compiled path takes ``"auto"`` only, the device path any
(:class:`~actorlearner.replay.device.DeviceReplay`)."""


@dataclass(frozen=True)
class Reservation:
    """Slots claimed by :meth:`PrioritizedReplay.reserve` for a checked batch, to write and commit."""

    columns: dict
    n: int
    start: int
    first_key: int
    priorities: torch.Tensor | np.ndarray | None
    versions: torch.Tensor | np.ndarray
    frames: Reservation | None = None
    """A frame-stacked replay's: the reservation of the batch's frames in its frame ring."""


class PrioritizedReplay(ReplayState, ABC):
    """Proportional prioritized replay (Schaul et al.) with batched, loop-free operations.

    Each item's fields, key and policy version sit in one fixed-width byte row, so
    sampling gathers one row per item (one memory access instead of one per field).

    Stored priority of an item is ``(p + eps) ** alpha``. IS weights are
    ``(N * P(i)) ** -beta`` divided by the largest possible weight; ``beta`` anneals
    linearly to 1 over ``beta_steps`` calls to :meth:`sample`.

    An abstract base of two paths, which :func:`~actorlearner.replay.factory.make_replay` chooses
    between: :class:`~actorlearner.replay.compiled.CompiledReplay` (compiled CPU kernels) and
    :class:`~actorlearner.replay.device.DeviceReplay` (what CUDA runs). ``kernels`` is the device
    path's choice of kernels (``"auto"``, ``"torch"``, ``"triton"``); the compiled path takes ``"auto"`` only.

    With ``frames`` (a :class:`~actorlearner.frames.FrameLayout`), the fields it names hold frame
    indices into each batch's ``frames`` field, and the frames are kept once, in a ring of
    ``frame_capacity`` frames (:mod:`~actorlearner.replay.frame_ring`); a sample holds the stacks.
    """

    compiled: ClassVar[bool]
    """Whether this is the compiled CPU path."""

    def __init__(
        self,
        capacity: int,
        fields: Mapping[str, FieldSpec],
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        *,
        device: str | torch.device = "cpu",
        branching: int = 16,
        kernels: str = "auto",
        frames: FrameLayout | None = None,
        frame_capacity: int = 0,
    ):
        if kernels not in KERNELS:
            raise ValueError(f"kernels must be 'auto', 'torch' or 'triton', got {kernels!r}")
        if not fields:
            raise ValueError("fields must name at least one field")
        if alpha < 0 or not 0 <= beta <= 1 or eps < 0 or beta_steps < 1:
            raise ValueError(f"need alpha >= 0, 0 <= beta <= 1, eps >= 0, beta_steps >= 1; got "
                             f"alpha={alpha}, beta={beta}, eps={eps}, beta_steps={beta_steps}")
        self.capacity = capacity
        self.fields = {name: (tuple(int(d) for d in shape), dtype) for name, (shape, dtype) in fields.items()}
        self.alpha, self.beta0, self.beta_steps, self.eps = alpha, beta, beta_steps, eps
        self.device, self.kernels = torch.device(device), kernels
        self._tree = self._make_tree(branching)
        self._layout, row_bytes = row_layout({**self.fields, KEY: ((), torch.long), VERSION: ((), torch.long)})
        self._rows = torch.zeros((capacity, row_bytes), dtype=torch.uint8, device=self.device)
        self._columns = typed_columns(self._rows, self._layout)
        self._keys, self._versions = self._columns[KEY], self._columns[VERSION]
        self._keys.fill_(-1)
        self._frame_ring = None
        if frames is not None:
            if frame_capacity < 1:
                raise ValueError(f"a frame-stacked replay needs frame_capacity >= 1, got {frame_capacity}")
            store = type(self)(frame_capacity, {FRAME: (frames.frame_shape, frames.frame_dtype)},
                               device=device, kernels=kernels, branching=branching)  # the same path
            self._frame_ring = FrameRing(frames, store)
        # alpha, the keys issued, the largest priority and the eviction version change only through the
        # hooks below (_set_alpha, _issue_keys, ...): the device path extends them to refill its device copies.
        self._max_priority = 1.0
        self._inserted = 0
        self._sample_calls = 0
        self._min_version: int | None = None  # items below it were evicted by sample()
        self._versions_index = VersionIndex(capacity)
        self._snapshots: list[ReplaySnapshot] = []  # open ones: add() saves the rows they still need
        self.pending = 0
        """Reservations not yet committed or aborted."""
        self.abandoned = 0
        """Keys of aborted reservations, and of items a frame-stacked replay dropped early for their frames:
        :attr:`inserted` counts them, nothing stored them."""

    def __len__(self) -> int:
        return min(self._inserted, self.capacity)

    @property
    def inserted(self) -> int:
        """Items added since creation (keys issued: reserved, overwritten and abandoned ones included)."""
        return self._inserted

    @property
    def beta(self) -> float:
        """Current IS exponent, annealed from ``beta`` to 1 over ``beta_steps`` samples."""
        frac = min(1.0, self._sample_calls / self.beta_steps)
        return self.beta0 + (1.0 - self.beta0) * frac

    def set_exponents(self, alpha: float, beta: float) -> None:
        """A new priority exponent and initial IS exponent (the annealing goes on from where it is).

        Stored priorities ``q = (p + eps) ** alpha`` become ``q ** (new / alpha)``, so sampling
        follows the new exponent at once; after alpha 0 (every q is 1) only priorities written
        from now on carry it. Empty and reserved slots stay at 0. No reservation may be open.
        """
        if alpha < 0 or not 0 <= beta <= 1:
            raise ValueError(f"need alpha >= 0 and 0 <= beta <= 1; got alpha={alpha}, beta={beta}")
        if self.pending:
            raise RuntimeError(f"cannot change alpha while {self.pending} reservations are open")
        if alpha != self.alpha and self.alpha > 0:
            leaves = torch.as_tensor(self._tree.state_dict()["leaves"]).cpu()
            leaves = torch.where(leaves > 0, leaves.pow(alpha / self.alpha), 0.0)
            self._tree.load_state_dict({"capacity": self.capacity, "leaves": leaves})
        self._set_alpha(alpha)
        self.beta0 = beta

    @abstractmethod
    def device_sampling(self) -> DeviceSampling | None:
        """This replay's :class:`DeviceSampling` (what a captured learner step draws through), or None
        where it has none (the compiled path)."""

    def add(self, batch: Mapping[str, torch.Tensor | np.ndarray], priorities=None,
            policy_version: int | torch.Tensor | np.ndarray = 0) -> torch.Tensor:
        """Store a batch; return its item keys. Without priorities, items get the max seen.

        A batch larger than the capacity keeps only its newest ``capacity`` items. The same
        as :meth:`reserve`, :meth:`write` and :meth:`commit` in a row.
        """
        reservation = self.reserve(batch, priorities, policy_version)
        self.write(reservation)
        return self.commit(reservation)

    def reserve(self, batch: Mapping[str, torch.Tensor | np.ndarray], priorities=None,
                policy_version: int | torch.Tensor | np.ndarray = 0) -> Reservation:
        """Check a batch and claim the slots it will fill: the first of three steps of an insert.

        Call it, and :meth:`commit`, under the lock that every other call runs under;
        :meth:`write`, the copying, needs no lock, so inserts from several threads copy
        their rows at once. Claimed slots are hidden until the commit: their old items are
        gone (never sampled, updates to them ignored) and the new ones not yet there. While
        any claim is open, no snapshot may be taken (see :attr:`pending`).
        """
        frames = None
        if self._frame_ring is not None and isinstance(batch, Mapping):
            batch = dict(batch)
            frames = batch.pop(FRAMES, None)
        columns, n = self._check_batch(batch)
        if self._frame_ring is not None:
            frames = self._frame_ring.check(frames, columns, n)
        versions = self._as_versions(policy_version)
        if versions.ndim > 1 or math.prod(versions.shape) not in (1, n):
            raise ValueError(f"policy_version must be one int or one per item ({n}), got shape {tuple(versions.shape)}")
        versions = versions.reshape(-1)
        if priorities is not None:
            priorities = self._check_priorities(priorities, n)
        dropped = 0
        if frames is not None:  # first the oldest items whose frames this batch's will overwrite
            keep_from = self._frame_ring.items_to_drop(frames.shape[0], self._inserted)
            dropped = 0 if keep_from is None else max(0, keep_from + self.capacity - self._inserted)
        for snapshot in self._snapshots:
            snapshot._save_rows_before_insert(dropped + n)
        if dropped:
            self._hide_for(self._inserted, min(dropped, self.capacity))
            self._issue_keys(dropped)
            self.abandoned += dropped
        if n > self.capacity:
            skip = n - self.capacity
            columns = {name: col[skip:] for name, col in columns.items()}
            versions = versions[skip:] if len(versions) > 1 else versions
            priorities = None if priorities is None else priorities[skip:]
            self._issue_keys(skip)
            n = self.capacity
        frame_reservation = None
        if frames is not None:
            frame_reservation = self._frame_ring.reserve(frames, columns, self._inserted,
                                                         self._inserted + n - self.capacity)
        reservation = Reservation(columns, n, self._inserted % self.capacity, self._inserted, priorities, versions,
                                  frame_reservation)
        if n:
            self._hide_for(self._inserted, n)
            self._issue_keys(n)
            self.pending += 1
        return reservation

    def write(self, reservation: Reservation) -> None:
        """Copy a reserved batch's fields (and frames) into its slots; no lock needed (the GIL is released on the CPU)."""
        if reservation.frames is not None:
            self._frame_ring.store.write(reservation.frames)
        self._copy_in(reservation)

    def commit(self, reservation: Reservation) -> torch.Tensor:
        """Make a written batch's items sampleable (under the lock, like :meth:`reserve`); return their keys."""
        keys = torch.arange(reservation.first_key, reservation.first_key + reservation.n, device=self.device)
        if reservation.frames is not None:
            self._frame_ring.store.commit(reservation.frames)
        if reservation.n == 0:
            return keys
        self._store(reservation, keys)
        self._versions_index.store(reservation.start, reservation.first_key, reservation.n, reservation.versions)
        self.pending -= 1
        return keys

    def abort(self, reservation: Reservation) -> None:
        """Give up a reservation (under the lock): its slots stay empty, its keys unused (counted in :attr:`abandoned`)."""
        if reservation.frames is not None:
            self._frame_ring.store.abort(reservation.frames)
        if reservation.n:
            self.pending -= 1
            self.abandoned += reservation.n

    def sample(self, batch_size: int, min_policy_version: int | None = None) -> Sample:
        """Draw ``batch_size`` items with probability proportional to their priority.

        With ``min_policy_version``, items produced by an older policy are evicted (their
        priority set to zero, for good) and never returned.
        """
        return self._draw(batch_size, self._begin_sample(batch_size, min_policy_version))

    def check_errors(self) -> None:
        """Raise what an earlier call refused without saying so yet (the device path checks device
        tensors' values on the device and tells at this read); the compiled path raised at once."""

    def _begin_sample(self, batch_size: int, min_policy_version: int | None) -> float:
        """The host half of :meth:`sample`: checks, eviction and annealing; returns beta."""
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size > len(self):
            raise ValueError(f"batch_size {batch_size} is larger than the {len(self)} items stored")
        if min_policy_version is not None:
            self._evict_older_than(int(min_policy_version))
        beta = self.beta
        self._sample_calls += 1
        return beta

    def _draw(self, batch_size: int, beta: float) -> Sample:
        """Draw by priority, or uniformly over the eligible items when every priority is zero."""
        if self._tree.total() > 0:
            return self._sample_by_priority(batch_size, beta)
        # Every eligible priority is zero: uniform over eligible items.
        rows = gather_rows(self._rows, self._uniform_eligible(batch_size))
        return self._sample_of_rows(rows, torch.ones(batch_size, dtype=torch.float32, device=self.device))

    @abstractmethod
    def update_priorities(self, indices, priorities) -> None:
        """Set new priorities for item keys from a :class:`Sample`.

        Keys whose slot has been overwritten since they were sampled are ignored; with
        repeated keys the last priority wins.
        """

    # -- what each path does its own way ----------------------------------------------------

    @abstractmethod
    def _copy_in(self, reservation: Reservation) -> None:
        """:meth:`write`'s copy of the items' fields into their rows."""

    @abstractmethod
    def _make_tree(self, branching: int) -> SumTree | CpuSumTree:
        """The sum tree of this path's priorities."""

    @abstractmethod
    def _as_input(self, value, dtype: torch.dtype) -> torch.Tensor | np.ndarray:
        """``value`` (a tensor, array or number) in the form this path computes on."""

    def _as_versions(self, value) -> torch.Tensor | np.ndarray:
        """An insert's policy versions (one, or one per item) in the form this path keeps them until commit."""
        return self._as_input(value, torch.long)

    @abstractmethod
    def _input_column(self, value, dtype: torch.dtype):
        """A batch's column in the form this path copies from, before it is checked."""

    @abstractmethod
    def _highest_priority(self, priorities: torch.Tensor | np.ndarray) -> float:
        """The largest of some priorities (at least one), each checked to be finite and >= 0."""

    @abstractmethod
    def _hide(self, start: int, n: int) -> None:
        """Empty ``n`` slots from ``start`` (wrapping): priority zero and no key, so nothing finds the old items."""

    @abstractmethod
    def _store(self, reservation: Reservation, keys: torch.Tensor) -> None:
        """Write a reservation's keys, versions and priorities: the part of :meth:`commit` that differs."""

    @abstractmethod
    def _sample_by_priority(self, batch_size: int, beta: float) -> Sample:
        """Stratified draws from the tree (whose total is positive) with their IS weights."""

    @abstractmethod
    def _zero_evicted(self, slots: np.ndarray) -> None:
        """Set to zero the leaves of those ``slots`` whose item's version is below the eviction version."""

    # -- runtime values: the only writes (the device path extends each to refill its device copy) --

    def _set_alpha(self, alpha: float) -> None:
        """A new priority exponent."""
        self.alpha = alpha

    def _issue_keys(self, n: int) -> None:
        """Issue the next ``n`` keys (reserved, skipped or dropped items alike)."""
        self._inserted += n

    def _raise_max_priority(self, priority: float) -> None:
        """Raise the largest priority seen (new items' default) to at least ``priority``."""
        self._max_priority = max(self._max_priority, priority)

    def _read_max_priority(self) -> float:
        """The largest priority seen (the device path reads it from the device: only snapshots ask)."""
        return self._max_priority

    def _set_min_version(self, version: int | None) -> None:
        """The eviction version: items below it are never sampled again (None: none evicted)."""
        self._min_version = version

    def _restore_counters(self, inserted: int, max_priority: float) -> None:
        """Keys issued and largest priority as a loaded state had them."""
        self._inserted, self._max_priority = inserted, max_priority

    # -- shared helpers -----------------------------------------------------------------------

    def _check_batch(self, batch: Mapping) -> tuple[dict, int]:
        """Validate names, dtypes and shapes; return the columns (in this path's form) and the item count."""
        if not isinstance(batch, Mapping):
            raise ValueError(f"batch must be a mapping of field name to array, got {type(batch).__name__}")
        if batch.keys() != self.fields.keys():
            missing, unknown = set(self.fields) - set(batch), set(batch) - set(self.fields)
            raise ValueError(f"batch fields do not match: missing {sorted(missing)}, unknown {sorted(unknown)}")
        columns, n = {}, None
        for name, (shape, dtype) in self.fields.items():
            value = self._input_column(batch[name], dtype)
            if isinstance(value, np.ndarray):
                if value.dtype != numpy_dtype(dtype):
                    raise ValueError(f"field {name!r} has dtype {value.dtype}, expected {dtype}")
            elif not isinstance(value, torch.Tensor):
                raise ValueError(f"field {name!r} must be a tensor or ndarray, got {type(value).__name__}")
            elif value.dtype != dtype:
                raise ValueError(f"field {name!r} has dtype {value.dtype}, expected {dtype}")
            if value.ndim != len(shape) + 1 or tuple(value.shape[1:]) != shape:
                raise ValueError(f"field {name!r} has shape {tuple(value.shape)}, expected (n, *{shape})")
            if n is not None and value.shape[0] != n:
                raise ValueError(f"field {name!r} has {value.shape[0]} items, other fields have {n}")
            n = value.shape[0]
            columns[name] = value
        return columns, n

    def _check_priorities(self, priorities, n: int) -> torch.Tensor | np.ndarray:
        """Validate one priority per item; raise the running max priority."""
        p = self._as_input(priorities, torch.float64).reshape(-1)
        if p.shape[0] != n:
            raise ValueError(f"got {p.shape[0]} priorities for {n} items")
        if n:
            self._raise_max_priority(self._highest_priority(p))
        return p

    def _sample_of_rows(self, rows: torch.Tensor, weights: torch.Tensor) -> Sample:
        """A :class:`Sample` over gathered rows: typed views of their fields, keys and versions."""
        columns = typed_columns(rows, self._layout)
        return self._sample(weights, columns)

    def _sample(self, weights: torch.Tensor, columns: dict[str, torch.Tensor]) -> Sample:
        """A :class:`Sample` of sampled rows' typed columns (keys and versions among them), frames stacked."""
        keys, versions = columns.pop(KEY), columns.pop(VERSION)
        if self._frame_ring is not None:
            for name in self._frame_ring.layout.refs:
                columns[name] = self._frame_ring.stacks(columns[name])
        return Sample(keys, weights, columns, versions)

    def _evict_older_than(self, min_version: int) -> None:
        """Zero the items below ``min_version`` for good: the slots of the versions passed, no others."""
        if self._min_version is not None and min_version <= self._min_version:
            return
        self._set_min_version(min_version)
        slots = self._versions_index.evict_below(min_version)
        if slots.size:
            self._zero_evicted(slots)

    def _hide_for(self, first_key: int, n: int) -> None:
        """Empty the slots that keys ``first_key ...`` (``n`` of them) are about to take."""
        self._hide(first_key % self.capacity, n)
        self._versions_index.hide(first_key % self.capacity, n, first_key)

    def _uniform_eligible(self, batch_size: int) -> torch.Tensor:
        n = len(self)
        stored = self._keys[:n] >= 0  # reserved slots hold no item yet
        if self._min_version is not None:
            stored &= self._versions[:n] >= self._min_version
        eligible = torch.arange(n, device=self.device)[stored]
        if eligible.numel() == 0:
            raise NothingRecentEnough(f"no stored item has policy_version >= {self._min_version}")
        pick = torch.randint(eligible.numel(), (batch_size,), device=self.device)
        return eligible.index_select(0, pick)
