"""The replay's host index of versions (actorlearner/replay/versions.py) against a slot-by-slot reference:
the eligible count after any mix of inserts, overwrites and evictions, and evictions that visit the slots
of the versions they pass and no others."""

import numpy as np
import pytest

from actorlearner.replay.versions import VersionIndex


class Reference:
    """Each slot's key and version, and the eviction version: what the index must agree with."""

    def __init__(self, capacity: int):
        self.keys = np.full(capacity, -1)
        self.versions = np.zeros(capacity, dtype=np.int64)
        self.lowest = None

    def eligible(self) -> np.ndarray:
        stored = self.keys >= 0
        return stored if self.lowest is None else stored & (self.versions >= self.lowest)


@pytest.mark.parametrize("seed", range(6))
def test_the_index_agrees_with_every_slot_through_inserts_overwrites_and_evictions(seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(5, 60))
    index, reference = VersionIndex(capacity), Reference(capacity)
    inserted, newest = 0, 0
    inserts: list[tuple[int, set]] = []  # every insert's size and versions
    for _ in range(300):
        if rng.random() < 0.8:  # an insert: reserve (hide) then commit, wrapping the ring
            n = int(rng.integers(1, capacity + 1))
            newest += int(rng.integers(0, 2))
            if rng.random() < 0.5:
                versions = np.array([newest - int(rng.integers(0, 4))])  # a lagging actor, one version
            else:
                versions = newest - rng.integers(0, 6, n)
            start = inserted % capacity
            index.hide(start, n, inserted)
            slots = (start + np.arange(n)) % capacity
            reference.keys[slots] = -1
            index.store(start, inserted, n, versions)
            reference.keys[slots], reference.versions[slots] = inserted + np.arange(n), versions
            inserts.append((n, set(versions.tolist())))
            inserted += n
        else:  # an eviction: its slots cover every slot it evicts, and come from the inserts of passed versions
            lowest, previous = newest - int(rng.integers(0, 5)), reference.lowest
            if previous is not None and lowest <= previous:
                continue
            before = reference.eligible()
            slots = index.evict_below(lowest)
            reference.lowest = lowest
            evicted = np.flatnonzero(before & ~reference.eligible())
            assert set(evicted.tolist()) <= set(slots.tolist())
            floor = -10**9 if previous is None else previous  # the versions passed: [floor, lowest)
            assert len(slots) <= sum(n for n, versions in inserts if any(floor <= v < lowest for v in versions))
        assert index.eligible == int(reference.eligible().sum())
        assert np.array_equal(index.stored, reference.keys >= 0)
    rebuilt = VersionIndex(capacity)
    rebuilt.rebuild(reference.keys, reference.versions, reference.lowest)
    assert rebuilt.eligible == index.eligible


def test_an_eviction_visits_the_inserts_of_the_versions_it_passes_not_the_capacity():
    index = VersionIndex(1_000_000)
    for version in range(100):  # 100 inserts of 1,000 items, one version each
        start = version * 1_000
        index.hide(start, 1_000, start)
        index.store(start, start, 1_000, np.array([version]))
    assert index.eligible == 100_000
    slots = index.evict_below(3)
    assert sorted(slots.tolist()) == list(range(3_000))  # versions 0-2 only
    assert index.eligible == 97_000
    assert index.evict_below(3).size == 0  # nothing passed twice
    index.hide(3_000, 500, 3_000)  # overwritten items leave the count of their version
    assert index.eligible == 96_500 and index.evict_below(4).size == 1_000  # its whole insert, to check
