"""A replay buffer's checkpoint: ``state_dict`` from a snapshot, ``load_state_dict`` into either path.

The keys and tensors are the same whichever path wrote them, so a checkpoint loads into any
device and kernel path.
"""

from __future__ import annotations

from collections.abc import Mapping
import contextlib

import torch

from actorlearner.replay.snapshot import ReplaySnapshot, SnapshotColumn


class ReplayState:
    """Snapshots and state dicts: a mixin of :class:`~actorlearner.replay.buffer.PrioritizedReplay`, whose
    storage and counters it reads and restores."""

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
        if ("frame_inserts" in state) != (self._frame_ring is not None):
            have = "keeps frames once" if self._frame_ring is not None else "keeps whole observations"
            raise ValueError(f"frame stacking mismatch: this buffer {have}, the saved one does not")
        if self._frame_ring is not None and int(state["frames.capacity"]) != self._frame_ring.capacity:
            raise ValueError(f"frame capacity mismatch: saved {state['frames.capacity']}, "
                             f"buffer has {self._frame_ring.capacity}")
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
        self._restore_counters(int(state["inserted"]), float(state["max_priority"]))
        self._sample_calls = int(state["sample_calls"])
        self._set_min_version(None if int(state["min_version"]) < 0 else int(state["min_version"]))
        if self._frame_ring is not None:
            self._frame_ring.store.load_state_dict({k.removeprefix("frames."): v for k, v in state.items()
                                                    if k.startswith("frames.")})
            self._frame_ring.load(state["frame_inserts"])
        self._versions_index.rebuild(self._keys.cpu().numpy(), self._versions.cpu().numpy(), self._min_version)
