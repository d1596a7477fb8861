"""RL algorithms behind one small protocol (`Algorithm`); `make_algorithm` builds one by name."""

from actorlearner.algorithms.base import Algorithm, FlatState, SampleLike, TransitionFields, make_algorithm

__all__ = ["Algorithm", "FlatState", "SampleLike", "TransitionFields", "make_algorithm"]
