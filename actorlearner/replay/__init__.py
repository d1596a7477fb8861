"""Prioritized replay: a wide sum tree, the buffer built on it (a compiled CPU path and a device
path behind one interface), and a rate limiter."""

from actorlearner.replay.buffer import NothingRecentEnough, PrioritizedReplay, Sample
from actorlearner.replay.compiled import CompiledReplay
from actorlearner.replay.device import DeviceReplay
from actorlearner.replay.limiter import RateLimiter
from actorlearner.replay.snapshot import ReplaySnapshot, SnapshotColumn
from actorlearner.replay.sumtree import SumTree

__all__ = ["CompiledReplay", "DeviceReplay", "NothingRecentEnough", "PrioritizedReplay", "RateLimiter",
           "ReplaySnapshot", "Sample", "SnapshotColumn", "SumTree"]
