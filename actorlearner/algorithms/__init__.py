"""RL algorithms behind one small protocol (`Algorithm`), resolved by name in `registry`."""

from actorlearner.algorithms.base import (
           RUNTIME,
           Algorithm,
           FlatState,
           SampleLike,
           TransitionAssembler,
           TransitionFields,
)
from actorlearner.algorithms.registry import (
           AlgorithmError,
           config_json,
           fixed_config_json,
           make_algorithm,
           make_config,
           resolve,
           retune,
)

__all__ = ["RUNTIME", "Algorithm", "AlgorithmError", "FlatState", "SampleLike", "TransitionAssembler",
           "TransitionFields", "config_json", "fixed_config_json", "make_algorithm", "make_config", "resolve", "retune"]
