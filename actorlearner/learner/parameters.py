"""Runtime parameters: the options ``actorlearner set`` may change while the learner trains.

A parameter is named as its flag without the dashes: a learner option marked `RUNTIME` in
`LearnerConfig` (``samples-per-insert``) or one of the algorithm's (``dqn-lr``). A request
is planned whole before anything changes: every name must be a runtime parameter, every
value must parse and pass the checks the learner's parts and the algorithm's config make.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from actorlearner.algorithms import AlgorithmError, make_config
from actorlearner.config import LearnerConfig, parse_value, runtime_options, show_value


class ParameterError(ValueError):
    """A request naming no runtime parameter, or a value one cannot take; nothing was changed."""


@dataclass(frozen=True)
class Change:
    """One parameter's value before and after a request, as text."""

    name: str
    previous: str
    value: str


@dataclass(frozen=True)
class Plan:
    """What a request changes: the learner's config and the algorithm's config to apply, and the changes."""

    learner: LearnerConfig
    algorithm: Any
    changes: list[Change]


def flag_name(prefix: str, field: str) -> str:
    return f"{prefix}{field}".replace("_", "-")


def current_values(learner: LearnerConfig, algorithm_name: str, algorithm_config: Any) -> dict[str, str]:
    """Every runtime parameter and its value now, learner options first."""
    values = {flag_name("", name): show_value(getattr(learner, name)) for name in runtime_options(LearnerConfig)}
    values.update({flag_name(f"{algorithm_name}-", name): show_value(getattr(algorithm_config, name))
                   for name in runtime_options(type(algorithm_config))})
    return values


def plan(learner: LearnerConfig, algorithm_class: type, algorithm_config: Any,
         request: Sequence[tuple[str, str]]) -> Plan:
    """The configs ``request`` ((parameter name, value text) pairs) leads to; ParameterError, naming
    the parameter and the reason, for anything it cannot apply."""
    if not request:
        raise ParameterError("name at least one parameter to set")
    prefix = f"{algorithm_class.name}-"
    known = {flag_name("", name): ("learner", name) for name in runtime_options(LearnerConfig)}
    known.update({flag_name(prefix, name): ("algorithm", name) for name in runtime_options(algorithm_class.config_class)})
    learner_values, algorithm_values, changes = {}, {}, []
    before = current_values(learner, algorithm_class.name, algorithm_config)
    for raw_name, text in request:
        name = raw_name.strip().lstrip("-").replace("_", "-")
        if any(change.name == name for change in changes):
            raise ParameterError(f"{name} is named more than once")
        if name not in known:
            fixed = ({flag_name("", f.name) for f in dataclasses.fields(LearnerConfig)}
                     | {flag_name(prefix, f.name) for f in dataclasses.fields(algorithm_class.config_class)})
            why = "is fixed while training runs: restart the learner to change it" if name in fixed else \
                "is not a parameter"
            raise ParameterError(f"{raw_name!r} {why}; runtime parameters: {', '.join(known)}")
        part, field = known[name]
        owner = LearnerConfig if part == "learner" else algorithm_class.config_class
        try:
            value = parse_value(text, typing.get_type_hints(owner)[field], name)
        except ValueError as exc:
            raise ParameterError(str(exc)) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise ParameterError(f"{name}: {text!r} is not a finite number")
        (learner_values if part == "learner" else algorithm_values)[field] = value
        changes.append(Change(name, before[name], show_value(value)))
    new_learner = dataclasses.replace(learner, **learner_values)
    check_learner(new_learner)
    try:
        new_algorithm = make_config(algorithm_class, {**dataclasses.asdict(algorithm_config), **algorithm_values})
    except AlgorithmError as exc:
        raise ParameterError(str(exc)) from None
    return Plan(new_learner, new_algorithm, changes)


def check_learner(config: LearnerConfig) -> None:
    """The checks the replay, the rate limiter and the trainer make of the learner's runtime options."""
    if config.alpha < 0:
        raise ParameterError(f"alpha must be >= 0, got {config.alpha}")
    if not 0 <= config.beta <= 1:
        raise ParameterError(f"beta must be in [0, 1], got {config.beta}")
    if config.samples_per_insert <= 0:
        raise ParameterError(f"samples-per-insert must be > 0, got {config.samples_per_insert}")
    if config.rate_error_buffer < max(1.0, config.samples_per_insert):
        raise ParameterError(f"samples-per-insert must be <= rate-error-buffer ({config.rate_error_buffer}), "
                             f"or inserts and samples can block each other; got {config.samples_per_insert}")
    if config.publish_every < 1:
        raise ParameterError(f"publish-every must be >= 1, got {config.publish_every}")
    if config.max_policy_lag < 0:
        raise ParameterError(f"max-policy-lag must be >= 0, got {config.max_policy_lag}")
