"""Snapshots of a replay buffer: its state as of one instant, read out in chunks while inserts go on."""

from __future__ import annotations

from collections.abc import Iterator
import contextlib
from dataclasses import dataclass
from typing import Self

import torch

from actorlearner.replay.layout import KEY, VERSION, typed_column


class ReplaySnapshot:
    """A :class:`~actorlearner.replay.buffer.PrioritizedReplay` (``buffer``; not imported here: the buffer
    imports this module) as of one instant, read out in chunks while inserts go on.

    Taken under the buffer's lock: scalars and a copy of the priorities. Rows are read
    later, chunk by chunk, without holding the lock while copying. Copy-on-write keeps that
    consistent: while the snapshot is open, ``add`` first copies aside the old rows of the
    slots it is about to overwrite (each slot at most once), and a read replaces every row
    overwritten by then, even during its own copy, with the copy set aside.

    Slots are overwritten in insertion order, so the snapshot numbers its rows by that
    order: row ``q`` is slot ``(base + q) % capacity``; the first ``_saved_rows()`` of them
    have been copied aside, ``q`` to position ``q`` of a list of fixed-size blocks.
    """

    def __init__(self, buffer, lock: contextlib.AbstractContextManager, chunk_bytes: int):
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._buffer, self._lock = buffer, lock
        self.rows = len(buffer)
        self._inserted = buffer.inserted
        self._scalars = {"capacity": buffer.capacity, "inserted": buffer.inserted,
                         "sample_calls": buffer._sample_calls,
                         "min_version": -1 if buffer._min_version is None else buffer._min_version,
                         "max_priority": buffer._read_max_priority()}
        self._priorities = buffer._tree.leaves[:self.rows].clone()
        self._base = (buffer.inserted - self.rows) % buffer.capacity  # slot of the oldest row
        # Rows per chunk read and per block of copies: whole rows, however narrow the column
        # read, since copying a 4-byte field of 64-byte rows still pulls every row's cache line.
        self.chunk_rows = max(1, chunk_bytes // buffer._rows.shape[1])
        self._aside: list[torch.Tensor] = []
        self._closed = False
        buffer._snapshots.append(self)
        ring = buffer._frame_ring  # a frame-stacked buffer's frames: a snapshot of their ring, taken at once
        self._frames = None if ring is None else ReplaySnapshot(ring.store, lock, chunk_bytes)
        self._frame_inserts = None if ring is None else ring.state()

    def state(self) -> dict[str, SnapshotColumn | torch.Tensor | int | float]:
        """The keys and values of :meth:`PrioritizedReplay.state_dict`, columns left unread."""
        frames = {} if self._frames is None else {
            "frame_inserts": self._frame_inserts, **{f"frames.{k}": v for k, v in self._frames.state().items()}}
        return {**self._scalars, "keys": SnapshotColumn(self, KEY), "versions": SnapshotColumn(self, VERSION),
                "priorities": self._priorities,
                **{f"field.{name}": SnapshotColumn(self, name) for name in self._buffer.fields}, **frames}

    def close(self) -> None:
        """Stop copying rows aside and free the copies (outside the lock); reading is no longer possible."""
        with self._lock:
            if not self._closed:
                self._buffer._snapshots.remove(self)
                self._closed = True
            aside, self._aside = self._aside, []
        del aside
        if self._frames is not None:
            self._frames.close()

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
                out[slot - start:slot - start + length].copy_(typed_column(rows, self._buffer._layout, name))
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
