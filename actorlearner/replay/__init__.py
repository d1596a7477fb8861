"""Prioritized replay: a wide sum tree, the buffer built on it (a compiled CPU path and a device
path behind one interface, built by :func:`make_replay`), and a rate limiter."""

from actorlearner.replay.buffer import PrioritizedReplay
from actorlearner.replay.compiled import CompiledReplay
from actorlearner.replay.device import DeviceReplay
from actorlearner.replay.factory import make_replay
from actorlearner.replay.limiter import RateLimiter
from actorlearner.replay.sampling import DeviceSampling, NothingRecentEnough, Sample
from actorlearner.replay.snapshot import ReplaySnapshot, SnapshotColumn
from actorlearner.replay.sumtree import SumTree

__all__ = ["CompiledReplay", "DeviceReplay", "DeviceSampling", "NothingRecentEnough", "PrioritizedReplay",
           "RateLimiter", "ReplaySnapshot", "Sample", "SnapshotColumn", "SumTree", "make_replay"]
