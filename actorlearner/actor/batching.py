"""Transitions an actor has assembled but not yet sent, cut into batches in the order they came."""

from __future__ import annotations

import numpy as np

Block = dict[str, np.ndarray]


class PendingTransitions:
    """Blocks of transitions (each made by one policy version) waiting to fill batches."""

    def __init__(self):
        self._blocks: list[Block] = []
        self._versions: list[int] = []  # the policy version that produced each block
        self.count = 0

    def add(self, block: Block | None, version: int) -> None:
        """Queue a block of transitions (nothing for None or an empty one)."""
        if block is None or not rows(block):
            return
        self._blocks.append(block)
        self._versions.append(version)
        self.count += rows(block)

    @property
    def first(self) -> Block | None:
        """The oldest block waiting, if any."""
        return self._blocks[0] if self._blocks else None

    def ready(self, size: int, everything: bool = False) -> bool:
        """Whether a batch of ``size`` can go (with ``everything``, a smaller last one too)."""
        return self.count >= size or (everything and self.count > 0)

    def take(self, size: int) -> tuple[Block, int]:
        """The next batch of at most ``size`` transitions and the oldest policy version that made any of it."""
        version = self._versions[0]
        batch, self._blocks, self._versions = cut(self._blocks, self._versions, size)
        self.count -= rows(batch)
        return batch, version


def cut(blocks: list[Block], versions: list[int], size: int) -> tuple[Block, list[Block], list[int]]:
    """Split the first ``size`` transitions off blocks made by ``versions``: (head, the rest as at most
    one block, its version)."""
    merged = {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]}
    head = {k: v[:size] for k, v in merged.items()}
    rest = {k: v[size:] for k, v in merged.items()}
    if not rows(rest):
        return head, [], []
    ends = np.cumsum([rows(b) for b in blocks])
    return head, [rest], [versions[int(np.searchsorted(ends, size, side="right"))]]


def rows(block: Block) -> int:
    """Transitions in a block of fields (every field has them as its leading dimension)."""
    return len(next(iter(block.values())))
