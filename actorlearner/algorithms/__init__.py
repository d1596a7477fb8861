"""RL algorithms behind one small protocol (`Algorithm`), resolved by name in `registry`."""

from actorlearner.algorithms.base import (
           Algorithm,
           FlatState,
           SampleLike,
           TransitionAssembler,
           TransitionFields,
)
from actorlearner.algorithms.registry import (
           AlgorithmError,
           config_json,
           make_algorithm,
           make_config,
           resolve,
)

__all__ = ["Algorithm", "AlgorithmError", "FlatState", "SampleLike", "TransitionAssembler", "TransitionFields",
           "config_json", "make_algorithm", "make_config", "resolve"]
