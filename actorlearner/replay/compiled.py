"""The replay's CPU path: add, sample and update each one compiled kernel call that releases the GIL."""

from __future__ import annotations

import numpy as np
import torch

from actorlearner.replay import kernels
from actorlearner.replay.buffer import PrioritizedReplay, Reservation, Sample
from actorlearner.replay.layout import numpy_dtype
from actorlearner.replay.sumtree import CpuSumTree

_LOWEST_VERSION = int(np.iinfo(np.int64).min)  # "no version evicted" for the kernels
_NUMPY_DTYPES = {torch.long: np.int64, torch.float64: np.float64}
_PRIORITY_ERRORS = {kernels.NAN: "NaN", kernels.INFINITE: "infinite", kernels.NEGATIVE: "negative"}


class CompiledReplay(PrioritizedReplay):
    """:class:`PrioritizedReplay` on the CPU over the kernels of :mod:`actorlearner.replay.kernels`,
    which work on numpy views of the buffer's rows and tree. No device sampling (the kernels read
    the host's memory directly)."""

    compiled = True

    def __init__(self, *args, **kwargs):
        device, choice = torch.device(kwargs.get("device", "cpu")), kwargs.get("kernels", "auto")
        if device.type != "cpu" or choice != "auto":
            raise ValueError(f"the compiled path runs on the CPU with kernels='auto', got {device} and {choice!r}")
        super().__init__(*args, **kwargs)
        self._rows_np = self._rows.numpy()
        self._words_np = self._rows_np.view(np.int64)
        self._keys_np, self._versions_np = self._keys.numpy(), self._versions.numpy()
        numpy_dtypes = {name: numpy_dtype(dtype) for name, (_, _, _, dtype) in self._layout.items()}
        # Inserts write whole rows in the widest word that divides every field's offset and size.
        placed = [self._layout[name][:2] for name in self.fields]
        self._word = next(np.dtype(f"u{size}") for size in (8, 4, 2, 1)
                          if all(offset % size == nbytes % size == 0 for offset, nbytes in placed))
        self._row_words = self._rows_np.view(self._word)
        self._word_offsets = np.array([offset // self._word.itemsize for offset, _ in placed], dtype=np.int64)
        wide = max(nbytes for _, nbytes in placed) > 256
        self._write_rows = kernels.write_wide_rows if wide else kernels.write_rows
        self._numpy_layout = [(name, numpy_dtypes[name], offset // numpy_dtypes[name].itemsize,
                               (offset + nbytes) // numpy_dtypes[name].itemsize, shape)
                              for name, (offset, nbytes, shape, _) in self._layout.items()]
        _compile_kernels(self.fields)

    def device_sampling(self) -> None:
        return None

    def _copy_in(self, reservation: Reservation) -> None:
        n = reservation.n
        if n == 0:
            return
        self._write_rows(self._row_words, self._word_offsets, tuple(
            _read_only(np.ascontiguousarray(reservation.columns[name]).reshape(n, -1).view(self._word))
            for name in self.fields), reservation.start)

    def update_priorities(self, indices, priorities) -> None:
        keys = self._as_input(indices, torch.long).reshape(-1)
        priorities = self._as_input(priorities, torch.float64).reshape(-1)
        if priorities.shape[0] != keys.shape[0]:
            raise ValueError(f"got {priorities.shape[0]} priorities for {keys.shape[0]} items")
        tree = self._tree
        code, bad, high = kernels.update_priorities(
            tree.tree, tree.mins, tree.offsets, tree.branching, keys, priorities, self._inserted,
            self._keys_np, self._versions_np, self._min_version_or_lowest(), self.eps, self.alpha)
        _raise_for_priorities(code)
        if bad >= 0:
            raise ValueError(f"indices out of range [0, {self._inserted}): {[int(keys[bad])]}")
        self._raise_max_priority(high)

    def _make_tree(self, branching: int) -> CpuSumTree:
        return CpuSumTree(self.capacity, branching)

    def _as_input(self, value, dtype: torch.dtype) -> np.ndarray:
        values = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        return np.ascontiguousarray(values, dtype=_NUMPY_DTYPES[dtype])

    def _input_column(self, value, dtype: torch.dtype):
        if isinstance(value, torch.Tensor) and value.dtype == dtype:
            return value.detach().cpu().numpy()
        return value

    def _highest_priority(self, priorities: np.ndarray) -> float:
        code, high = kernels.check_priorities(priorities)
        _raise_for_priorities(code)
        return high

    def _hide(self, start: int, n: int) -> None:
        tree = self._tree
        kernels.hide_slots(tree.tree, tree.mins, tree.offsets, tree.branching, self.capacity, start, n, self._keys_np)

    def _store(self, reservation: Reservation, keys: torch.Tensor) -> None:
        priorities = reservation.priorities
        priorities = np.array([self._max_priority]) if priorities is None else priorities
        tree = self._tree
        kernels.insert_items(tree.tree, tree.mins, tree.offsets, tree.branching, self.capacity, reservation.start,
                             reservation.n, priorities, reservation.versions, self._min_version_or_lowest(),
                             self.eps, self.alpha, self._keys_np, reservation.first_key, self._versions_np)

    def _sample_by_priority(self, batch_size: int, beta: float) -> Sample:
        uniforms = torch.rand(batch_size, dtype=torch.float64).numpy()
        slots, weights = np.empty(batch_size, dtype=np.int64), np.empty(batch_size, dtype=np.float32)
        rows = np.empty((batch_size, self._words_np.shape[1]), dtype=np.int64)
        tree = self._tree
        kernels.sample_rows(tree.tree, tree.mins, tree.offsets, tree.branching, uniforms, beta,
                            self._words_np, slots, weights, rows)
        return self._sample(torch.from_numpy(weights), self._numpy_columns(rows))

    def _numpy_columns(self, rows: np.ndarray) -> dict[str, torch.Tensor]:
        """Tensors over typed views ``(len(rows), *shape)`` of each field in gathered rows (numpy
        views cost a fraction of torch's, which matters at a few microseconds per sample)."""
        out = {}
        for name, dtype, start, stop, shape in self._numpy_layout:
            typed = rows.view(dtype)
            out[name] = torch.from_numpy(typed[:, start] if not shape else typed[:, start:stop].reshape(-1, *shape))
        return out

    def _zero_evicted(self, slots: np.ndarray) -> None:
        leaves = self._tree.leaves.numpy()
        self._tree.update(slots, np.where(self._versions_np[slots] < self._min_version, 0.0, leaves[slots]))

    def _min_version_or_lowest(self) -> int:
        return _LOWEST_VERSION if self._min_version is None else self._min_version


_compiled_for: set[tuple] = set()  # the field layouts whose kernels this process has run


def _compile_kernels(fields) -> None:
    """Run every kernel once on a scratch buffer of these fields (columns read-only as from the wire, and
    writable), so that numba compiles them, or loads its cache, now: not in a learner's first insert and
    sample, where on a loaded machine it stalled the streams and even status calls for up to a minute."""
    layout = tuple((name, shape, dtype) for name, (shape, dtype) in fields.items())
    if layout in _compiled_for:
        return
    _compiled_for.add(layout)  # first: the scratch buffer's own __init__ comes back here
    scratch = CompiledReplay(2, fields)
    for writable in (True, False):
        columns = {name: np.zeros((1, *shape), numpy_dtype(dtype)) for name, (shape, dtype) in fields.items()}
        for column in columns.values():
            column.setflags(write=writable)
        for version, priorities in enumerate((None, np.ones(1))):  # 4 items in 2 slots: wraps too
            scratch.add(columns, priorities, policy_version=version)
    with torch.random.fork_rng(devices=[]):  # sampling draws from torch's generator: leave it as it was
        sample = scratch.sample(1)
        scratch.update_priorities(sample.indices, torch.ones(1))
        scratch.sample(1, min_policy_version=1)


def _raise_for_priorities(code: int) -> None:
    """The ValueError for a kernel's priority check ``code`` (nothing for 0)."""
    if code:
        raise ValueError(f"priorities must be finite and >= 0; got {_PRIORITY_ERRORS[code]} values")


def _read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view: the kernel's columns must all be typed alike (a decoded batch's are read-only)."""
    view = array.view()
    view.flags.writeable = False
    return view
