"""Prioritized replay: a wide sum tree, the buffer built on it, and a rate limiter."""

from actorlearner.replay.buffer import PrioritizedReplay, Sample
from actorlearner.replay.limiter import RateLimiter
from actorlearner.replay.sumtree import SumTree

__all__ = ["PrioritizedReplay", "RateLimiter", "Sample", "SumTree"]
