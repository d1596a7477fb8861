"""Inserts into a device replay that never wait for the device: what goes in is built in pinned host buffers
and copied asynchronously (on the CPU the same code runs, its copies synchronous)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np
import torch

from actorlearner.pinned import pinned_empty
from actorlearner.replay.layout import KEY, VERSION, Layout, ring_parts, typed_columns

MAX_BUFFERS = 8
"""Pinned buffers a pool keeps at most; a copy waits for another only when all of them are in flight."""


class PinnedPool:
    """Pinned byte buffers for copies to ``device``, each reused once the copies reading it are done (told
    by an event on CUDA; at once elsewhere, where copies are synchronous)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._free: list[tuple[torch.Tensor, torch.cuda.Event | None]] = []  # buffers and their last copies
        self._count = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """A buffer of at least ``nbytes`` (uint8) that no copy is reading; give it back with :meth:`release`."""
        with self._lock:
            for i, (buffer, done) in enumerate(self._free):
                if buffer.shape[0] >= nbytes and (done is None or done.query()):
                    return self._free.pop(i)[0]
            if self._count < MAX_BUFFERS or not self._free:
                self._count += 1
                return pinned_empty((max(nbytes, 4096),), torch.uint8, self.device)
            fits = [i for i, (buffer, _) in enumerate(self._free) if buffer.shape[0] >= nbytes]
            buffer, done = self._free.pop(fits[0] if fits else 0)
        if done is not None:
            done.synchronize()  # every buffer in flight: wait for the oldest copy (outside the lock)
        return buffer if buffer.shape[0] >= nbytes else pinned_empty((nbytes,), torch.uint8, self.device)

    def release(self, buffer: torch.Tensor) -> None:
        """Give ``buffer`` back once the copies queued from it so far are done."""
        done = None
        if self.device.type == "cuda":
            done = torch.cuda.Event()
            done.record()
        with self._lock:
            self._free.append((buffer, done))

    def upload(self, values: np.ndarray) -> torch.Tensor:
        """``values`` as a new device tensor, copied asynchronously through a pinned buffer."""
        source = torch.from_numpy(np.ascontiguousarray(values))
        buffer = self.take(source.numel() * source.element_size())
        staged = buffer[:source.numel() * source.element_size()].view(source.dtype)
        staged.copy_(source)
        out = torch.empty(source.shape[0], dtype=source.dtype, device=self.device)
        out.copy_(staged, non_blocking=True)
        self.release(buffer)
        return out


class RowStaging:
    """An insert's rows (its fields and versions, keys -1 until the commit writes them) and priorities, built
    in one pinned buffer and copied to the device's ring with one asynchronous copy each (two when they
    wrap). ``priorities`` is the device's staging column, one float64 per slot, read by the commit."""

    def __init__(self, rows: torch.Tensor, layout: Layout, priorities: torch.Tensor):
        self.rows, self.layout, self.priorities = rows, layout, priorities
        self.capacity, self.row_bytes = rows.shape
        self.pool = PinnedPool(rows.device)

    def write(self, columns: Mapping[str, torch.Tensor], versions: np.ndarray, priorities: np.ndarray | None,
              start: int) -> None:
        """Copy one insert (``n`` items: columns, versions one or one each, priorities or None) into the slots
        from ``start``."""
        n = next(iter(columns.values())).shape[0]
        rows_bytes = n * self.row_bytes
        buffer = self.pool.take(rows_bytes + 8 * n)
        staged = buffer[:rows_bytes].view(n, self.row_bytes)
        staged_priorities = buffer[rows_bytes:rows_bytes + 8 * n].view(torch.float64)
        typed = typed_columns(staged, self.layout)
        for name, column in columns.items():
            typed[name].copy_(column)
        typed[KEY].fill_(-1)
        typed[VERSION].copy_(torch.from_numpy(np.ascontiguousarray(versions)))
        if priorities is not None:
            staged_priorities.copy_(torch.from_numpy(np.ascontiguousarray(priorities, dtype=np.float64)))
        for at, stop, offset in ring_parts(start, n, self.capacity):
            self.rows[at:stop].copy_(staged[offset:offset + stop - at], non_blocking=True)
            if priorities is not None:
                self.priorities[at:stop].copy_(staged_priorities[offset:offset + stop - at], non_blocking=True)
        self.pool.release(buffer)
