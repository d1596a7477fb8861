"""Algorithms by name: a registered one (``dqn``, ``sac``, ``td3``, ``r2d2``) or a user's own as ``package.module:Name``.

The learner, the actors, ``run`` and the config resolve ``--algorithm`` (and the name in a
Welcome's settings) here, and know nothing else about any algorithm.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from actorlearner.algorithms.base import AlgorithmSpec
from actorlearner.config import runtime_options

REGISTERED = {
    "dqn": "actorlearner.algorithms.dqn:DQN",
    "sac": "actorlearner.algorithms.sac:SAC",
    "td3": "actorlearner.algorithms.td3:TD3",
    "r2d2": "actorlearner.algorithms.r2d2:R2D2",
}
"""Registered algorithm names -> ``module:Class``; imported only when named."""

_REQUIRED = ("name", "config_class", "transition_fields", "make_assembler", "make_policy", "make_trainer")


class AlgorithmError(ValueError):
    """An algorithm name that resolves to nothing usable, or a config it cannot take."""


def resolve(name: str) -> type[AlgorithmSpec]:
    """The algorithm spec class ``name`` stands for; AlgorithmError saying why when there is none."""
    target = REGISTERED.get(name.lower(), name)
    module_name, colon, attribute = target.partition(":")
    if not colon or not module_name or not attribute:
        raise AlgorithmError(f"unknown algorithm {name!r}: use one of {', '.join(REGISTERED)} "
                             "or package.module:Name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AlgorithmError(f"algorithm {name!r}: cannot import {module_name}: {exc}") from None
    cls = getattr(module, attribute, None)
    if cls is None:
        raise AlgorithmError(f"algorithm {name!r}: {module_name} has no {attribute}")
    missing = [member for member in _REQUIRED
               if not hasattr(cls, member) or member in getattr(cls, "__abstractmethods__", ())]
    if missing or not dataclasses.is_dataclass(getattr(cls, "config_class", None)):
        what = f"lacks {', '.join(missing)}" if missing else "has no config_class dataclass"
        raise AlgorithmError(f"algorithm {name!r}: {attribute} is not an AlgorithmSpec: it {what}")
    return cls


def make_config(cls: type[AlgorithmSpec], values: Any = None) -> Any:
    """``cls``'s config from None (defaults), a mapping of fields, or an instance."""
    if values is None:
        return cls.config_class()
    if isinstance(values, cls.config_class):
        return values
    if isinstance(values, Mapping):
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls.config_class)})
        if unknown:
            raise AlgorithmError(f"{cls.name} has no option {', '.join(unknown)}")
        try:
            return cls.config_class(**values)
        except (TypeError, ValueError) as exc:
            raise AlgorithmError(f"{cls.name} config: {exc}") from None
    raise AlgorithmError(f"{cls.name} wants a {cls.config_class.__name__} or a mapping, got {type(values).__name__}")


def config_json(config: Any) -> str:
    """A config dataclass as the JSON object ``Settings.algorithm_config`` carries."""
    return json.dumps(dataclasses.asdict(config), sort_keys=True)


def fixed_config_json(algorithm: str, algorithm_config: str) -> str:
    """``Settings.algorithm_config`` without its runtime-tunable options: what decides the network
    and the replay items. The JSON as it is when the algorithm does not resolve here."""
    try:
        tunable = runtime_options(resolve(algorithm).config_class)
        values = json.loads(algorithm_config or "{}")
    except (AlgorithmError, ValueError):
        return algorithm_config
    if not isinstance(values, dict):
        return algorithm_config
    return json.dumps({name: value for name, value in values.items() if name not in tunable}, sort_keys=True)


def make_spec(name: str, observation_space: gym.Space, action_space: gym.Space, config: Any = None) -> AlgorithmSpec:
    """The spec of algorithm ``name`` for these spaces; ``config`` as `make_config` takes it."""
    cls = resolve(name)
    return cls(observation_space, action_space, make_config(cls, config))
