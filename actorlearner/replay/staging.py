"""Inserts into a GPU replay that never wait for the GPU: rows built in pinned host memory, copied asynchronously."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from actorlearner.replay.layout import KEY, Layout, ring_parts, typed_columns

MAX_BUFFERS = 8
"""Pinned staging buffers kept at most; an insert waits for a copy only when all are in flight."""


class RowStaging:
    """Builds an insert's byte rows in a pinned host buffer and copies them to the device's ring
    with one asynchronous copy (two when it wraps); a buffer is reused once its copy is done.

    The rows' key column is written as -1 (no item): the commit writes the keys, under the lock.
    """

    def __init__(self, rows: torch.Tensor, layout: Layout):
        self.rows, self.layout = rows, layout
        self.capacity, self.row_bytes = rows.shape
        self._free: list[tuple[torch.Tensor, torch.cuda.Event]] = []  # buffers whose last copy was recorded
        self._count = 0
        self._lock = threading.Lock()

    def write(self, columns: Mapping[str, torch.Tensor], start: int) -> None:
        """Copy one insert's columns (host tensors, ``n`` items each) into ring slots from ``start``."""
        n = next(iter(columns.values())).shape[0]
        buffer = self._take(n)
        staged = buffer[:n]
        typed = typed_columns(staged, self.layout)
        for name, column in columns.items():
            typed[name].copy_(column)
        typed[KEY].fill_(-1)
        for at, stop, offset in ring_parts(start, n, self.capacity):
            self.rows[at:stop].copy_(staged[offset:offset + stop - at], non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        with self._lock:
            self._free.append((buffer, done))

    def _take(self, n: int) -> torch.Tensor:
        """A pinned buffer of at least ``n`` rows that no copy is reading."""
        with self._lock:
            for i, (buffer, done) in enumerate(self._free):
                if buffer.shape[0] >= n and done.query():
                    return self._free.pop(i)[0]
            if self._count < MAX_BUFFERS:
                self._count += 1
                return torch.empty((max(n, 64), self.row_bytes), dtype=torch.uint8, pin_memory=True)
            fits = [i for i, (buffer, _) in enumerate(self._free) if buffer.shape[0] >= n]
            buffer, done = self._free.pop(fits[0] if fits else 0)
        done.synchronize()  # every buffer in flight: wait for the oldest copy (outside the lock)
        if buffer.shape[0] < n:
            buffer = torch.empty((n, self.row_bytes), dtype=torch.uint8, pin_memory=True)
        return buffer
