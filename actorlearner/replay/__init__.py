"""Prioritized replay: a wide sum tree, the buffer built on it, and a rate limiter."""

from actorlearner.replay.buffer import (
    NothingRecentEnough,
    PrioritizedReplay,
    ReplaySnapshot,
    Sample,
    SnapshotColumn,
)
from actorlearner.replay.limiter import RateLimiter
from actorlearner.replay.sumtree import SumTree

__all__ = ["NothingRecentEnough", "PrioritizedReplay", "RateLimiter", "ReplaySnapshot", "Sample", "SnapshotColumn", "SumTree"]
