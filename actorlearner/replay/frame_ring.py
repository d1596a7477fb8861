"""A frame-stacked replay's frames, each kept once in a ring beside the items' rows.

An insert's frames take the next slots of the ring, and its items' frame indices become frame
keys (the frame's insertion number; slot = key % capacity). Sampling gathers each item's frames by
key and rebuilds its stacks. Frames and items are inserted in the same order (both reserved under
the replay's lock), so the oldest frames belong to the oldest items: when an insert's frames would
overwrite frames that stored items still refer to, the replay first drops those items, the oldest
(:meth:`FrameRing.items_to_drop`). A sampled item's frames are therefore always its own.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from actorlearner.frames import FrameLayout
from actorlearner.replay.layout import gather_rows, typed_column

FRAME = "frame"
"""The one field of the ring's own rows."""


class FrameRing:
    """The frames of a :class:`~actorlearner.replay.buffer.PrioritizedReplay` built with a :class:`FrameLayout`.

    ``store`` is a replay of the same path holding one frame per item (its priorities unused):
    it brings the ring, the copy-on-write snapshots and the checkpoints of the items' rows.
    """

    def __init__(self, layout: FrameLayout, store):
        self.layout, self.store = layout, store
        # (first item key, first frame key) of each insert whose items may still be stored, oldest first.
        self.inserts: deque[tuple[int, int]] = deque()

    @property
    def capacity(self) -> int:
        return self.store.capacity

    def check(self, frames, columns: dict, n: int):
        """The batch's frames as the store takes them; ValueError for a missing or malformed frames
        field, a batch with more frames than the ring holds, or an index outside the batch's frames."""
        if frames is None:
            raise ValueError("a frame-stacked batch needs its 'frames' field")
        frames = self.store._check_batch({FRAME: frames})[0][FRAME]
        m = frames.shape[0]
        if m > self.capacity:
            raise ValueError(f"the batch holds {m} frames, more than the {self.capacity} the replay keeps")
        for name in self.layout.refs:
            index = columns[name]
            if n and (int(index.min()) < 0 or int(index.max()) >= m):
                raise ValueError(f"field {name!r} refers to a frame outside the batch's {m} frames")
        return frames

    def items_to_drop(self, m: int, inserted: int) -> int | None:
        """The first item key that keeps its frames once ``m`` more frames are in (``inserted`` items so
        far): every item below it refers to a frame about to be overwritten. None: every item keeps them."""
        oldest_kept = self.store.inserted + m - self.capacity
        lost = False
        while self.inserts and self.inserts[0][1] < oldest_kept:
            self.inserts.popleft()
            lost = True
        if not lost:
            return None
        return self.inserts[0][0] if self.inserts else inserted

    def reserve(self, frames, columns: dict, first_item: int, overwritten_below: int):
        """Claim slots for an insert's frames and turn its items' frame indices into frame keys (in
        ``columns``, in place of the indices); returns the frames' reservation."""
        reservation = self.store.reserve({FRAME: frames})
        for name in self.layout.refs:
            columns[name] = columns[name] + reservation.first_key
        while len(self.inserts) > 1 and self.inserts[1][0] <= overwritten_below:
            self.inserts.popleft()  # every item of the oldest insert is overwritten
        self.inserts.append((first_item, reservation.first_key))
        return reservation

    def stacks(self, keys: torch.Tensor) -> torch.Tensor:
        """The frames of frame keys ``(..., K)``: ``(..., K, *frame)``, gathered on the store's device."""
        slots = torch.remainder(keys.reshape(-1), self.capacity)
        frames = typed_column(gather_rows(self.store._rows, slots), self.store._layout, FRAME)
        return frames.reshape(*keys.shape, *self.layout.frame_shape)

    def state(self) -> torch.Tensor:
        """The inserts whose items may still be stored, ``(n, 2)`` int64, for a checkpoint."""
        return torch.tensor(np.array(self.inserts, dtype=np.int64).reshape(-1, 2))

    def load(self, inserts: torch.Tensor) -> None:
        self.inserts = deque((int(item), int(frame)) for item, frame in inserts.tolist())
