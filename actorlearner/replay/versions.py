"""The replay's policy versions as the host keeps them: how many stored items a sample may draw, and which
slots an eviction must zero, without reading the device and without scanning the capacity."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from actorlearner.replay.layout import ring_parts


class VersionIndex:
    """Stored items by policy version, from the commits and overwrites the replay reports.

    :attr:`eligible` counts the stored items at or above the eviction version (all of them before
    any eviction). Each version keeps its inserts (first key, count) while any of their items may be
    stored, so raising the eviction version visits the slots of the versions it passes and no others.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.versions = np.zeros(capacity, dtype=np.int64)
        """Each slot's version, as committed."""
        self.stored = np.zeros(capacity, dtype=bool)
        """Whether a slot holds a committed item."""
        self.lowest: int | None = None
        """The eviction version: items below it are never sampled again (None: nothing evicted)."""
        self.eligible = 0
        self._counts: dict[int, int] = {}  # eligible stored items per version
        self._inserts: dict[int, deque[tuple[int, int]]] = {}  # per version: (first key, count) of its inserts
        self._heap: list[int] = []  # the versions of _counts, lowest first (and some gone since: skipped)

    def store(self, start: int, first_key: int, n: int, versions: np.ndarray) -> None:
        """``n`` items, keys ``first_key ...``, were committed from slot ``start`` with ``versions`` (one per
        item, or one for all)."""
        for at, stop, offset in ring_parts(start, n, self.capacity):
            self.versions[at:stop] = versions if versions.shape[0] == 1 else versions[offset:offset + stop - at]
            self.stored[at:stop] = True
        for version, count in self._eligible_counts(versions):
            self._add(version, count if versions.shape[0] > 1 else n, (first_key, n))

    def hide(self, start: int, n: int, first_key: int) -> None:
        """The slots from ``start``, which keys ``first_key ...`` are about to take, lose their items."""
        overwritten_below = first_key + n - self.capacity
        for at, stop, _ in ring_parts(start, n, self.capacity):
            stored = self.stored[at:stop]
            for version, count in self._eligible_counts(self.versions[at:stop][stored]):
                self.eligible -= count
                self._counts[version] -= count
                if self._counts[version]:
                    inserts = self._inserts[version]
                    while inserts and sum(inserts[0]) <= overwritten_below:  # every key of it overwritten
                        inserts.popleft()
                else:
                    del self._counts[version], self._inserts[version]
            stored[:] = False

    def evict_below(self, version: int) -> np.ndarray:
        """Raise the eviction version to ``version``; returns the slots that may hold the items it evicts
        (those of the versions passed; some overwritten since by newer items, which the caller keeps)."""
        self.lowest = version
        runs = set()  # an insert of several versions passed is visited once
        while self._heap and self._heap[0] < version:
            passed = heapq.heappop(self._heap)
            if passed in self._counts:
                self.eligible -= self._counts.pop(passed)
                runs.update(self._inserts.pop(passed))
        if not runs:
            return np.zeros(0, dtype=np.int64)
        slots = [np.arange(key, key + count, dtype=np.int64) for key, count in sorted(runs)]
        return np.concatenate(slots) % self.capacity

    def rebuild(self, keys: np.ndarray, versions: np.ndarray, lowest: int | None) -> None:
        """Start again from every slot's key (-1: none) and version, as a loaded checkpoint holds them."""
        self.__init__(self.capacity)
        self.lowest = lowest
        slots = np.flatnonzero(keys >= 0)
        slots = slots[np.argsort(keys[slots], kind="stable")]
        keys, versions = keys[slots], versions[slots]
        # Runs of consecutive keys with one version: as if each had been one insert.
        breaks = np.flatnonzero((np.diff(keys) != 1) | (np.diff(versions) != 0)) + 1
        for begin, end in zip(np.r_[0, breaks], np.r_[breaks, len(slots)]):
            if end > begin:
                self.store(int(slots[begin]), int(keys[begin]), int(end - begin), versions[begin:begin + 1])

    def _eligible_counts(self, versions: np.ndarray) -> list[tuple[int, int]]:
        """(version, count) of the versions given at or above the eviction version."""
        if self.lowest is not None:
            versions = versions[versions >= self.lowest]
        if versions.size and versions.min() == versions.max():
            return [(int(versions[0]), int(versions.size))]
        unique, counts = np.unique(versions, return_counts=True)
        return list(zip(unique.tolist(), counts.tolist()))

    def _add(self, version: int, count: int, insert: tuple[int, int]) -> None:
        if version not in self._counts:
            self._counts[version], self._inserts[version] = 0, deque()
            if len(self._heap) > 2 * len(self._counts) + 64:  # versions long gone: start the heap afresh
                self._heap = list(self._counts)
                heapq.heapify(self._heap)
            heapq.heappush(self._heap, version)
        self._counts[version] += count
        self.eligible += count
        self._inserts[version].append(insert)
