"""Prioritized experience replay over preallocated circular torch storage on any device."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
import contextlib
import math
import re
import warnings
from dataclasses import dataclass
from typing import Self

import numpy as np
import torch

from actorlearner.replay import kernels as cpu_kernels
from actorlearner.replay.sumtree import CpuSumTree, SumTree

FieldSpec = tuple[tuple[int, ...], torch.dtype]
# The buffer only reads its inputs, so read-only arrays (views of a received payload) are fine.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=re.escape(__name__))
# Per-item bookkeeping stored in the same row as the item's fields.
_KEY, _VERSION = "__key__", "__version__"
_LOWEST_VERSION = int(np.iinfo(np.int64).min)  # "no version evicted" for the kernels
_NUMPY_DTYPES = {torch.long: np.int64, torch.float64: np.float64}
_PRIORITY_ERRORS = {cpu_kernels.NAN: "NaN", cpu_kernels.INFINITE: "infinite", cpu_kernels.NEGATIVE: "negative"}


class NothingRecentEnough(ValueError):
    """Every stored item is older than ``min_policy_version``: nothing can be sampled yet."""


@dataclass(frozen=True)
class Reservation:
    """Slots claimed by :meth:`PrioritizedReplay.reserve` for a checked batch, to write and commit."""

    columns: dict
    n: int
    start: int
    first_key: int
    priorities: torch.Tensor | np.ndarray | None
    versions: torch.Tensor | np.ndarray


@dataclass(frozen=True)
class Sample:
    """One sampled batch.

    Attributes:
        indices: item keys (the item's insertion number, int64). A key names one item,
            not a slot: once the slot is overwritten, updates for the old key are ignored.
        weights: importance-sampling weights, float32, at most 1.
        data: field name -> tensor of shape ``(batch, *field_shape)`` (views into one
            gathered block of rows, so not contiguous; ``.contiguous()`` if you need it).
        policy_version: version of the policy that produced each item, int64.
    """

    indices: torch.Tensor
    weights: torch.Tensor
    data: dict[str, torch.Tensor]
    policy_version: torch.Tensor


class PrioritizedReplay:
    """Proportional prioritized replay (Schaul et al.) with batched, loop-free operations.

    Each item's fields, key and policy version sit in one fixed-width byte row, so
    sampling gathers one row per item (one memory access instead of one per field).

    Stored priority of an item is ``(p + eps) ** alpha``. IS weights are
    ``(N * P(i)) ** -beta`` divided by the largest possible weight; ``beta`` anneals
    linearly to 1 over ``beta_steps`` calls to :meth:`sample`.

    ``kernels``: on the CPU, ``"auto"`` runs add, sample and update as compiled kernels
    (one call each, GIL released; :mod:`actorlearner.replay.kernels`); ``"torch"`` runs
    the device path (batched torch operations, what CUDA runs) on any device.
    """

    def __init__(
        self,
        capacity: int,
        fields: Mapping[str, FieldSpec],
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_steps: int = 100_000,
        eps: float = 1e-6,
        device: str | torch.device = "cpu",
        branching: int = 16,
        kernels: str = "auto",
    ):
        if not fields:
            raise ValueError("fields must name at least one field")
        if alpha < 0 or not 0 <= beta <= 1 or eps < 0 or beta_steps < 1:
            raise ValueError(f"need alpha >= 0, 0 <= beta <= 1, eps >= 0, beta_steps >= 1; got "
                             f"alpha={alpha}, beta={beta}, eps={eps}, beta_steps={beta_steps}")
        self.capacity = capacity
        self.fields = {name: (tuple(int(d) for d in shape), dtype) for name, (shape, dtype) in fields.items()}
        self.alpha, self.beta0, self.beta_steps, self.eps = alpha, beta, beta_steps, eps
        self.device = torch.device(device)
        if kernels not in ("auto", "torch"):
            raise ValueError(f"kernels must be 'auto' or 'torch', got {kernels!r}")
        self.compiled = self.device.type == "cpu" and kernels == "auto"
        self._tree = CpuSumTree(capacity, branching) if self.compiled else SumTree(capacity, branching, self.device)
        self._layout, row_bytes = _row_layout({**self.fields, _KEY: ((), torch.long), _VERSION: ((), torch.long)})
        self._rows = torch.zeros((capacity, row_bytes), dtype=torch.uint8, device=self.device)
        self._columns = _columns(self._rows, self._layout)
        self._keys, self._versions = self._columns[_KEY], self._columns[_VERSION]
        if self.compiled:  # numpy views of the same memory, for the kernels
            self._rows_np = self._rows.numpy()
            self._words_np = self._rows_np.view(np.int64)
            self._keys_np, self._versions_np = self._keys.numpy(), self._versions.numpy()
            self._numpy_dtypes = {name: torch.empty(0, dtype=dtype).numpy().dtype
                                  for name, (_, dtype) in self.fields.items()}
            self._numpy_dtypes.update({_KEY: np.dtype(np.int64), _VERSION: np.dtype(np.int64)})
            # Inserts write whole rows in the widest word that divides every field's offset and size.
            placed = [self._layout[name][:2] for name in self.fields]
            self._word = next(np.dtype(f"u{size}") for size in (8, 4, 2, 1)
                              if all(offset % size == nbytes % size == 0 for offset, nbytes in placed))
            self._row_words = self._rows_np.view(self._word)
            self._word_offsets = np.array([offset // self._word.itemsize for offset, _ in placed], dtype=np.int64)
            wide = max(nbytes for _, nbytes in placed) > 256
            self._write_rows = cpu_kernels.write_wide_rows if wide else cpu_kernels.write_rows
            self._numpy_layout = [(name, self._numpy_dtypes[name], offset // self._numpy_dtypes[name].itemsize,
                                   (offset + nbytes) // self._numpy_dtypes[name].itemsize, shape)
                                  for name, (offset, nbytes, shape, _) in self._layout.items()]
        self._keys.fill_(-1)
        self._max_priority = 1.0
        self._inserted = 0
        self._sample_calls = 0
        self._min_version: int | None = None  # items below it were evicted by sample()
        self._snapshots: list[ReplaySnapshot] = []  # open ones: add() saves the rows they still need
        self.pending = 0
        """Reservations not yet committed or aborted."""
        self.abandoned = 0
        """Items of aborted reservations: :attr:`inserted` counts them, nothing stored them."""

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
        self.alpha, self.beta0 = alpha, beta

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
        columns, n = self._check_batch(batch)
        versions = self._as_device(policy_version, torch.long)
        if versions.ndim > 1 or math.prod(versions.shape) not in (1, n):
            raise ValueError(f"policy_version must be one int or one per item ({n}), got shape {tuple(versions.shape)}")
        versions = versions.reshape(-1)
        if not self.compiled:  # the kernels take one version for all items as it is
            versions = versions.expand(n)
        if priorities is not None:
            priorities = self._check_priorities(priorities, n)
        for snapshot in self._snapshots:
            snapshot._save_rows_before_insert(n)
        if n > self.capacity:
            skip = n - self.capacity
            columns = {name: col[skip:] for name, col in columns.items()}
            versions = versions[skip:] if len(versions) > 1 else versions
            priorities = None if priorities is None else priorities[skip:]
            self._inserted += skip
            n = self.capacity
        reservation = Reservation(columns, n, self._inserted % self.capacity, self._inserted, priorities, versions)
        if n:
            self._hide(reservation.start, n)
            self._inserted += n
            self.pending += 1
        return reservation

    def write(self, reservation: Reservation) -> None:
        """Copy a reserved batch's fields into its slots; no lock needed (the GIL is released on the CPU)."""
        n, start = reservation.n, reservation.start
        if n == 0:
            return
        if self.compiled:
            self._write_rows(self._row_words, self._word_offsets, tuple(
                np.ascontiguousarray(reservation.columns[name]).reshape(n, -1).view(self._word) for name in self.fields),
                start)
        else:
            with torch.inference_mode():
                for name, col in reservation.columns.items():
                    self._write(self._columns[name], start, col)

    def commit(self, reservation: Reservation) -> torch.Tensor:
        """Make a written batch's items sampleable (under the lock, like :meth:`reserve`); return their keys."""
        n, start = reservation.n, reservation.start
        keys = torch.arange(reservation.first_key, reservation.first_key + n, device=self.device)
        if n == 0:
            return keys
        priorities, versions = reservation.priorities, reservation.versions
        if self.compiled:
            priorities = np.array([self._max_priority]) if priorities is None else priorities
            tree = self._tree
            cpu_kernels.insert_items(tree.tree, tree.mins, tree.offsets, tree.branching, self.capacity, start, n,
                                     priorities, versions, self._min_version_or_lowest(), self.eps, self.alpha,
                                     self._keys_np, reservation.first_key, self._versions_np)
        else:
            with torch.inference_mode():
                if priorities is None:
                    priorities = torch.full((n,), self._max_priority, dtype=torch.float64, device=self.device)
                self._write(self._keys, start, keys)
                self._write(self._versions, start, versions)
                self._write(None, start, self._leaf_values(priorities, versions))
        self.pending -= 1
        return keys

    def abort(self, reservation: Reservation) -> None:
        """Give up a reservation (under the lock): its slots stay empty, its keys unused (counted in :attr:`abandoned`)."""
        if reservation.n:
            self.pending -= 1
            self.abandoned += reservation.n

    def _hide(self, start: int, n: int) -> None:
        """Empty ``n`` slots from ``start`` (wrapping): priority zero and no key, so nothing finds the old items."""
        if self.compiled:
            tree = self._tree
            cpu_kernels.hide_slots(tree.tree, tree.mins, tree.offsets, tree.branching, self.capacity, start, n,
                                   self._keys_np)
            return
        with torch.inference_mode():
            self._write(self._keys, start, torch.full((n,), -1, dtype=torch.long, device=self.device))
            self._write(None, start, torch.zeros(n, dtype=torch.float64, device=self.device))

    def sample(self, batch_size: int, min_policy_version: int | None = None) -> Sample:
        """Draw ``batch_size`` items with probability proportional to their priority.

        With ``min_policy_version``, items produced by an older policy are evicted (their
        priority set to zero, for good) and never returned.
        """
        if not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if batch_size > len(self):
            raise ValueError(f"batch_size {batch_size} is larger than the {len(self)} items stored")
        if min_policy_version is not None:
            self._evict_older_than(int(min_policy_version))
        beta = self.beta
        self._sample_calls += 1

        has_mass = self._tree.total() > 0
        if self.compiled and has_mass:
            uniforms = torch.rand(batch_size, dtype=torch.float64).numpy()
            slots, weights = np.empty(batch_size, dtype=np.int64), np.empty(batch_size, dtype=np.float32)
            rows = np.empty((batch_size, self._words_np.shape[1]), dtype=np.int64)
            tree = self._tree
            cpu_kernels.sample_rows(tree.tree, tree.mins, tree.offsets, tree.branching, uniforms, beta,
                                self._words_np, slots, weights, rows)
            columns = self._numpy_columns(rows)
            keys, versions = columns.pop(_KEY), columns.pop(_VERSION)
            return Sample(keys, torch.from_numpy(weights), columns, versions)
        if has_mass:
            slots = self._tree.sample(batch_size)
            leaf = self._tree.leaves.index_select(0, slots)
            weights = leaf.div_(self._tree.min_positive()).pow_(-beta).float()
            rows = _gather_rows(self._rows, slots)
        else:  # every eligible priority is zero: uniform over eligible items
            slots = self._uniform_eligible(batch_size)
            weights = torch.ones(batch_size, dtype=torch.float32, device=self.device)
            rows = _gather_rows(self._rows, slots)
        columns = _columns(rows, self._layout)
        keys, versions = columns.pop(_KEY), columns.pop(_VERSION)
        return Sample(keys, weights, columns, versions)

    def update_priorities(self, indices, priorities) -> None:
        """Set new priorities for item keys from a :class:`Sample`.

        Keys whose slot has been overwritten since they were sampled are ignored; with
        repeated keys the last priority wins.
        """
        if self.compiled:
            self._update_compiled(indices, priorities)
        else:
            self._update_device(indices, priorities)

    @torch.inference_mode()
    def _update_device(self, indices, priorities) -> None:
        keys = self._as_device(indices, torch.long).reshape(-1)
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

    def state_dict(self) -> dict[str, torch.Tensor | int | float]:
        """Everything needed to restore the buffer: plain CPU tensors and numbers only."""
        with self.snapshot() as snapshot:
            return {key: value.materialize() if isinstance(value, SnapshotColumn)
                    else value.cpu() if isinstance(value, torch.Tensor) else value
                    for key, value in snapshot.state().items()}

    def snapshot(self, lock: contextlib.AbstractContextManager | None = None,
                 chunk_bytes: int = 64 << 20) -> ReplaySnapshot:
        """The buffer's state as of now, to be read out later in chunks while inserts go on.

        Call it holding ``lock``, the lock every :meth:`add` runs under (None: no other
        thread touches the buffer). Reading a chunk (``chunk_bytes`` of buffer rows: fewer
        chunks, fewer lock holds) copies it without the lock and then takes it for a moment,
        as closing does. Costs a copy of the priorities now and, while the snapshot is open,
        a copy of each row an insert overwrites. Close it (or use ``with``).
        """
        if self.pending:
            raise RuntimeError(f"cannot snapshot the buffer while {self.pending} reservations are open")
        return ReplaySnapshot(self, contextlib.nullcontext() if lock is None else lock, chunk_bytes)

    def load_state_dict(self, state: Mapping[str, torch.Tensor | int | float]) -> None:
        """Restore a :meth:`state_dict` made on any device into this buffer's device."""
        if self._snapshots or self.pending:
            raise RuntimeError("cannot load a state while a snapshot of this buffer or a reservation is open")
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"capacity mismatch: saved {state['capacity']}, buffer has {self.capacity}")
        saved = {k[len("field."):] for k in state if k.startswith("field.")}
        if saved != set(self.fields):
            raise ValueError(f"field mismatch: saved {sorted(saved)}, buffer has {sorted(self.fields)}")
        n = min(int(state["inserted"]), self.capacity)
        for name, (shape, dtype) in self.fields.items():
            value = state[f"field.{name}"]
            if tuple(value.shape) != (n, *shape) or value.dtype != dtype:
                raise ValueError(f"field {name!r}: saved {tuple(value.shape)} {value.dtype}, "
                                 f"expected {(n, *shape)} {dtype}")
            self._columns[name][:n].copy_(value)
        self._keys.fill_(-1)
        self._keys[:n].copy_(state["keys"])
        self._versions.zero_()
        self._versions[:n].copy_(state["versions"])
        leaves = torch.zeros(self.capacity, dtype=torch.float64)
        leaves[:n] = state["priorities"]
        self._tree.load_state_dict({"capacity": self.capacity, "leaves": leaves})
        self._inserted = int(state["inserted"])
        self._sample_calls = int(state["sample_calls"])
        self._min_version = None if int(state["min_version"]) < 0 else int(state["min_version"])
        self._max_priority = float(state["max_priority"])

    # -- helpers ---------------------------------------------------------------------------

    def _as_device(self, value, dtype: torch.dtype) -> torch.Tensor | np.ndarray:
        """``value`` as a tensor on the buffer's device, or as a contiguous numpy array for the kernels."""
        if self.compiled:
            return np.ascontiguousarray(_as_numpy(value), dtype=_NUMPY_DTYPES[dtype])
        if isinstance(value, np.ndarray):
            value = _from_numpy(value)
        return torch.as_tensor(value, device=self.device).to(dtype)

    def _check_batch(self, batch: Mapping) -> tuple[dict, int]:
        """Validate names, dtypes and shapes; return the columns (numpy arrays for the
        compiled kernels, device tensors otherwise) and the item count."""
        if not isinstance(batch, Mapping):
            raise ValueError(f"batch must be a mapping of field name to array, got {type(batch).__name__}")
        if batch.keys() != self.fields.keys():
            missing, unknown = set(self.fields) - set(batch), set(batch) - set(self.fields)
            raise ValueError(f"batch fields do not match: missing {sorted(missing)}, unknown {sorted(unknown)}")
        columns, n = {}, None
        for name, (shape, dtype) in self.fields.items():
            value = batch[name]
            if self.compiled and isinstance(value, torch.Tensor) and value.dtype == dtype:
                value = value.detach().cpu().numpy()
            elif not self.compiled and isinstance(value, np.ndarray):
                value = _from_numpy(value)
            if isinstance(value, np.ndarray):
                if value.dtype != self._numpy_dtypes[name]:
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
            columns[name] = value if self.compiled else value.to(self.device, non_blocking=True)
        return columns, n

    def _update_compiled(self, indices, priorities) -> None:
        """The compiled path of :meth:`update_priorities`."""
        keys = self._as_device(indices, torch.long).reshape(-1)
        priorities = self._as_device(priorities, torch.float64).reshape(-1)
        if priorities.shape[0] != keys.shape[0]:
            raise ValueError(f"got {priorities.shape[0]} priorities for {keys.shape[0]} items")
        tree = self._tree
        code, bad, high = cpu_kernels.update_priorities(
            tree.tree, tree.mins, tree.offsets, tree.branching, keys, priorities, self._inserted,
            self._keys_np, self._versions_np, self._min_version_or_lowest(), self.eps, self.alpha)
        _raise_for_priorities(code)
        if bad >= 0:
            raise ValueError(f"indices out of range [0, {self._inserted}): {[int(keys[bad])]}")
        self._max_priority = max(self._max_priority, high)

    def _numpy_columns(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """Tensors over typed views ``(len(rows), *shape)`` of each field in gathered rows (numpy
        views cost a fraction of torch's, which matters at a few microseconds per sample)."""
        out = {}
        for name, dtype, start, stop, shape in self._numpy_layout:
            typed = rows.view(dtype)
            out[name] = torch.from_numpy(typed[:, start] if not shape else typed[:, start:stop].reshape(-1, *shape))
        return out

    def _min_version_or_lowest(self) -> int:
        return _LOWEST_VERSION if self._min_version is None else self._min_version

    def _check_priorities(self, priorities, n: int) -> torch.Tensor | np.ndarray:
        """Validate one priority per item; raise the running max priority."""
        p = self._as_device(priorities, torch.float64).reshape(-1)
        if p.shape[0] != n:
            raise ValueError(f"got {p.shape[0]} priorities for {n} items")
        if n == 0:
            return p
        if self.compiled:
            code, high = cpu_kernels.check_priorities(p)
            _raise_for_priorities(code)
            self._max_priority = max(self._max_priority, high)
            return p
        low, high = (float(x) for x in torch.aminmax(p))
        if not (low >= 0 and high < math.inf):  # NaN fails both comparisons
            kind = "NaN" if bool(p.isnan().any()) else "infinite" if high == math.inf else "negative"
            raise ValueError(f"priorities must be finite and >= 0; got {kind} values")
        self._max_priority = max(self._max_priority, high)
        return p

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

    def _evict_older_than(self, min_version: int) -> None:
        if self._min_version is not None and min_version <= self._min_version:
            return
        self._min_version = min_version
        n = len(self)
        stale = torch.nonzero((self._versions[:n] < min_version) & (self._tree.leaves[:n] > 0)).squeeze(1)
        if stale.numel():
            self._tree.update(stale, torch.zeros(stale.numel(), dtype=torch.float64, device=self.device))

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


class ReplaySnapshot:
    """A :class:`PrioritizedReplay` as of one instant, read out in chunks while inserts go on.

    Taken under the buffer's lock: scalars and a copy of the priorities. Rows are read
    later, chunk by chunk, without holding the lock while copying. Copy-on-write keeps that
    consistent: while the snapshot is open, ``add`` first copies aside the old rows of the
    slots it is about to overwrite (each slot at most once), and a read replaces every row
    overwritten by then, even during its own copy, with the copy set aside.

    Slots are overwritten in insertion order, so the snapshot numbers its rows by that
    order: row ``q`` is slot ``(base + q) % capacity``; the first ``_saved_rows()`` of them
    have been copied aside, ``q`` to position ``q`` of a list of fixed-size blocks.
    """

    def __init__(self, buffer: PrioritizedReplay, lock: contextlib.AbstractContextManager, chunk_bytes: int):
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._buffer, self._lock = buffer, lock
        self.rows = len(buffer)
        self._inserted = buffer.inserted
        self._scalars = {"capacity": buffer.capacity, "inserted": buffer.inserted,
                         "sample_calls": buffer._sample_calls,
                         "min_version": -1 if buffer._min_version is None else buffer._min_version,
                         "max_priority": buffer._max_priority}
        self._priorities = buffer._tree.leaves[:self.rows].clone()
        self._base = (buffer.inserted - self.rows) % buffer.capacity  # slot of the oldest row
        # Rows per chunk read and per block of copies: whole rows, however narrow the column
        # read, since copying a 4-byte field of 64-byte rows still pulls every row's cache line.
        self.chunk_rows = max(1, chunk_bytes // buffer._rows.shape[1])
        self._aside: list[torch.Tensor] = []
        self._closed = False
        buffer._snapshots.append(self)

    def state(self) -> dict[str, SnapshotColumn | torch.Tensor | int | float]:
        """The keys and values of :meth:`PrioritizedReplay.state_dict`, columns left unread."""
        return {**self._scalars, "keys": SnapshotColumn(self, _KEY), "versions": SnapshotColumn(self, _VERSION),
                "priorities": self._priorities,
                **{f"field.{name}": SnapshotColumn(self, name) for name in self._buffer.fields}}

    def close(self) -> None:
        """Stop copying rows aside and free the copies (outside the lock); reading is no longer possible."""
        with self._lock:
            if not self._closed:
                self._buffer._snapshots.remove(self)
                self._closed = True
            aside, self._aside = self._aside, []
        del aside

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def read(self, name: str, start: int, stop: int) -> torch.Tensor:
        """Rows ``[start, stop)`` of layout column ``name`` as of the snapshot, contiguous, on the buffer's device."""
        if not 0 <= start <= stop <= self.rows:
            raise ValueError(f"rows [{start}, {stop}) are outside [0, {self.rows})")
        # Copied without the lock, so an insert may overwrite rows meanwhile. Every insert sets
        # the old rows aside before overwriting them and holds the lock throughout; so once we
        # hold the lock after the copy, every row overwritten before or during it is counted in
        # ``saved``, and its copy aside (never changed once made) replaces what we copied.
        out = self._buffer._columns[name][start:stop].clone(memory_format=torch.contiguous_format)
        with self._lock:
            if self._closed:
                raise RuntimeError("the snapshot is closed")
            saved = self._saved_rows(self._buffer.inserted)
            aside = self._aside
        base = self._base
        pieces = [(start, stop)] if not start < base < stop else [(start, base), (base, stop)]
        for low, high in pieces:
            first = (low - base) % self._buffer.capacity
            for q, slot, length in self._segments(first, min(first + high - low, saved)):
                block, offset = divmod(q, self.chunk_rows)
                rows = aside[block][offset:offset + length]
                out[slot - start:slot - start + length].copy_(_column(rows, self._buffer._layout, name))
        return out

    def _saved_rows(self, inserted: int) -> int:
        """How many rows (in overwrite order) inserts have overwritten once ``inserted`` items are in."""
        capacity = self._buffer.capacity
        return min(max(inserted - self._inserted - (capacity - self.rows), 0), self.rows)

    def _segments(self, first: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """``(q, slot, length)`` pieces of rows ``[first, stop)`` in overwrite order, none crossing the
        buffer's end or a block boundary."""
        capacity, q = self._buffer.capacity, first
        while q < stop:
            slot = (self._base + q) % capacity
            length = min(stop - q, capacity - slot, self.chunk_rows - q % self.chunk_rows)
            yield q, slot, length
            q += length

    def _save_rows_before_insert(self, count: int) -> None:
        """Under the lock, in ``add``: copy aside the rows the next ``count`` inserts overwrite first."""
        buffer = self._buffer
        for q, slot, length in self._segments(self._saved_rows(buffer.inserted),
                                              self._saved_rows(buffer.inserted + count)):
            block, offset = divmod(q, self.chunk_rows)
            if block == len(self._aside):  # blocks fill in order; the last one only as long as needed
                block_rows = min(self.chunk_rows, self.rows - block * self.chunk_rows)
                with torch.inference_mode(False):  # plain tensors: readers use them outside inference mode
                    self._aside.append(torch.empty((block_rows, buffer._rows.shape[1]),
                                                   dtype=torch.uint8, device=buffer.device))
            self._aside[block][offset:offset + length].copy_(buffer._rows[slot:slot + length])


@dataclass(frozen=True)
class SnapshotColumn:
    """One column of a :class:`ReplaySnapshot`, ``(rows, *shape)``, readable in chunks."""

    snapshot: ReplaySnapshot
    name: str

    @property
    def dtype(self) -> torch.dtype:
        return self.snapshot._buffer._layout[self.name][3]

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.snapshot.rows, *self.snapshot._buffer._layout[self.name][2])

    def chunks(self) -> Iterator[torch.Tensor]:
        """Consecutive ranges of ``snapshot.chunk_rows`` rows, each read when it is taken."""
        step = self.snapshot.chunk_rows
        for start in range(0, self.snapshot.rows, step):
            yield self.snapshot.read(self.name, start, min(start + step, self.snapshot.rows))

    def materialize(self) -> torch.Tensor:
        """The whole column as one CPU tensor, in one read."""
        return self.snapshot.read(self.name, 0, self.snapshot.rows).cpu()


def _raise_for_priorities(code: int) -> None:
    """The ValueError for a kernel's priority check ``code`` (nothing for 0)."""
    if code:
        raise ValueError(f"priorities must be finite and >= 0; got {_PRIORITY_ERRORS[code]} values")


def _as_numpy(values) -> np.ndarray:
    """A numpy array over a tensor's (CPU copy of its) data, or over any array-like."""
    return values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)


def _from_numpy(array: np.ndarray) -> torch.Tensor:
    """A tensor over ``array`` without copying (read-only arrays too: see the filter above)."""
    return torch.from_numpy(array)


def _row_layout(fields: Mapping[str, FieldSpec]) -> tuple[dict[str, tuple[int, int, tuple[int, ...], torch.dtype]], int]:
    """Byte offsets of each field in a row: widest dtypes first so every field is aligned."""
    layout, offset = {}, 0
    for name, (shape, dtype) in sorted(fields.items(), key=lambda kv: -kv[1][1].itemsize):
        nbytes = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        layout[name] = (offset, nbytes, shape, dtype)
        offset += nbytes
    return layout, -(-offset // 8) * 8


def _gather_rows(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``rows[slots]`` as a fresh tensor, copied as int64 words (rows are padded to 8 bytes).

    On CPU the output is allocated by numpy, which asks for transparent huge pages: a large
    sample (e.g. 4096 Atari frames, 230 MB) then faults in far fewer pages, 3x faster.
    """
    words = rows.view(torch.int64)
    if rows.device.type == "cpu":
        out = torch.from_numpy(np.empty((slots.shape[0], words.shape[1]), dtype=np.int64))
        return torch.index_select(words, 0, slots, out=out).view(torch.uint8)
    return words.index_select(0, slots).view(torch.uint8)


def _columns(rows: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """Typed views ``(len(rows), *shape)`` of each field inside a block of byte rows."""
    by_dtype: dict[torch.dtype, torch.Tensor] = {}
    out = {}
    for name, (offset, nbytes, shape, dtype) in layout.items():
        if dtype not in by_dtype:
            by_dtype[dtype] = rows.view(dtype)
        start, stop = offset // dtype.itemsize, (offset + nbytes) // dtype.itemsize
        column = by_dtype[dtype][:, start:stop]
        out[name] = column.view(rows.shape[0], *shape) if len(shape) != 1 else column
    return out


def _column(rows: torch.Tensor, layout, name: str) -> torch.Tensor:
    """The typed view ``(len(rows), *shape)`` of field ``name`` inside a block of byte rows."""
    return _columns(rows, {name: layout[name]})[name]
