"""RL algorithms as a spec, a policy and a trainer (`base`), resolved by name in `registry`."""

from actorlearner.algorithms.base import (
           AlgorithmSpec,
           ClassPartsSpec,
           PRIORITY,
           FlatState,
           Policy,
           SampleLike,
           Trainer,
           TransitionAssembler,
           TransitionFields,
)
from actorlearner.algorithms.registry import (
           AlgorithmError,
           config_json,
           fixed_config_json,
           make_config,
           make_spec,
           resolve,
)

__all__ = ["PRIORITY", "AlgorithmError", "AlgorithmSpec", "ClassPartsSpec", "FlatState", "Policy", "SampleLike", "Trainer",
           "TransitionAssembler", "TransitionFields", "config_json", "fixed_config_json", "make_config", "make_spec",
           "resolve"]
