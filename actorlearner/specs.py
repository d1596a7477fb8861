"""Gymnasium spaces <-> proto ``EnvSpec``, so the learner can check an actor's env in Hello.

Deliberately small: a Box observation of any wire dtype and a Discrete action. Other
spaces raise ValueError naming the space; a richer schema for custom envs is env.proto's.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from actorlearner import wire
from actorlearner.v1 import learner_pb2

_DISCRETE_HAS_START = "start" in learner_pb2.DiscreteSpec.DESCRIPTOR.fields_by_name


def _bounds(values: np.ndarray) -> list[float]:
    """Bounds as proto doubles: one value when all are equal, else every value in C order."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size and (flat == flat[0]).all():
        return [float(flat[0])]
    return flat.tolist()


def tensor_spec(name: str, space: spaces.Space) -> learner_pb2.TensorSpec:
    """The TensorSpec of a Box space; ValueError for any other space or a non-wire dtype."""
    if not isinstance(space, spaces.Box):
        raise ValueError(f"{name} space {space} is not supported: only Box is")
    if space.dtype is None or space.dtype.name not in wire.DTYPES:
        raise ValueError(f"{name} space {space} has dtype {space.dtype}; allowed: {', '.join(wire.DTYPES)}")
    return learner_pb2.TensorSpec(
        name=name, dtype=space.dtype.name, shape=list(space.shape),
        low=_bounds(space.low), high=_bounds(space.high),
    )


def action_spec(space: spaces.Space) -> learner_pb2.ActionSpec:
    """The ActionSpec of a Discrete space; ValueError naming any other space."""
    if not isinstance(space, spaces.Discrete):
        raise ValueError(f"action space {space} is not supported: only Discrete is")
    start = int(space.start)
    if _DISCRETE_HAS_START:
        return learner_pb2.ActionSpec(discrete=learner_pb2.DiscreteSpec(n=int(space.n), start=start))
    if start != 0:
        raise ValueError(f"action space {space} has start={start}; DiscreteSpec carries only n")
    return learner_pb2.ActionSpec(discrete=learner_pb2.DiscreteSpec(n=int(space.n)))


def env_spec(env_id: str, observation_space: spaces.Space, action_space: spaces.Space) -> learner_pb2.EnvSpec:
    """The EnvSpec an actor sends in Hello and the learner compares with its own."""
    return learner_pb2.EnvSpec(
        env_id=env_id,
        observation=tensor_spec("obs", observation_space),
        action=action_spec(action_space),
    )


def _as_dtype(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Bounds cast to ``dtype``; for ints, out-of-range doubles (inf, int64 extremes) saturate."""
    if dtype.kind not in "iu":
        return values.astype(dtype)
    info = np.iinfo(dtype)
    high, low = values >= float(info.max), values <= float(info.min)
    out = np.where(high | low, 0, values).astype(dtype)
    out[high], out[low] = info.max, info.min
    return out


def _full_bounds(values, shape: tuple[int, ...], default: float) -> np.ndarray | None:
    """Proto bounds as doubles of ``shape``: empty -> ``default``, one value -> broadcast; None if malformed."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return np.full(shape, default)
    if values.size == 1:
        return np.full(shape, values[0])
    if values.size == int(np.prod(shape, dtype=np.int64)):
        return values.reshape(shape)
    return None


def box_from_spec(spec: learner_pb2.TensorSpec) -> spaces.Box:
    """The Box space a TensorSpec describes (empty bounds mean unbounded)."""
    if spec.dtype not in wire.DTYPES:
        raise ValueError(f"tensor spec {spec.name!r} has unknown dtype {spec.dtype!r}")
    dtype = np.dtype(spec.dtype)
    shape = tuple(int(d) for d in spec.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"tensor spec {spec.name!r} has a negative dimension in {shape}")
    bounds = []
    for which, default in (("low", -np.inf), ("high", np.inf)):
        values = _full_bounds(getattr(spec, which), shape, default)
        if values is None:
            raise ValueError(f"tensor spec {spec.name!r} has {len(getattr(spec, which))} {which} "
                             f"values for shape {shape}")
        bounds.append(_as_dtype(values, dtype))
    return spaces.Box(low=bounds[0], high=bounds[1], shape=shape, dtype=dtype)


def spaces_from_spec(spec: learner_pb2.EnvSpec) -> tuple[spaces.Box, spaces.Discrete]:
    """``(observation_space, action_space)`` of an EnvSpec."""
    if not spec.HasField("observation"):
        raise ValueError("env spec has no observation")
    kind = spec.action.WhichOneof("kind")
    if kind != "discrete":
        raise ValueError(f"env spec action kind {kind or 'unset'} is not supported: only discrete is")
    discrete = spec.action.discrete
    if discrete.n < 1:
        raise ValueError(f"env spec has a discrete action space with n={discrete.n}")
    start = int(getattr(discrete, "start", 0))
    return box_from_spec(spec.observation), spaces.Discrete(int(discrete.n), start=start)


def spec_mismatch(expected: learner_pb2.EnvSpec, got: learner_pb2.EnvSpec) -> str | None:
    """Why ``got`` (an actor's env) differs from ``expected`` (the learner's), or None.

    ``env_id`` is informational and not compared. Reasons read like
    ``observation shape (4,) != (8,)``, expected on the left; all of them, joined by "; ".
    """
    reasons = []
    eo, go = expected.observation, got.observation
    if eo.dtype != go.dtype:
        reasons.append(f"observation dtype {eo.dtype} != {go.dtype}")
    if tuple(eo.shape) != tuple(go.shape):
        reasons.append(f"observation shape {tuple(eo.shape)} != {tuple(go.shape)}")
    else:
        shape = tuple(eo.shape)
        for which, default in (("low", -np.inf), ("high", np.inf)):
            want = _full_bounds(getattr(eo, which), shape, default)
            have = _full_bounds(getattr(go, which), shape, default)
            if want is None or have is None or not np.array_equal(want, have):
                reasons.append(f"observation {which} bounds differ: {_short(getattr(eo, which))} "
                               f"!= {_short(getattr(go, which))}")
    ea, ga = expected.action.WhichOneof("kind"), got.action.WhichOneof("kind")
    if ea != ga:
        reasons.append(f"action kind {ea} != {ga}")
    elif ea == "discrete":
        if expected.action.discrete.n != got.action.discrete.n:
            reasons.append(f"action n {expected.action.discrete.n} != {got.action.discrete.n}")
        if _DISCRETE_HAS_START and expected.action.discrete.start != got.action.discrete.start:
            reasons.append(f"action start {expected.action.discrete.start} != {got.action.discrete.start}")
    elif expected.action != got.action:
        reasons.append("action specs differ")
    return "; ".join(reasons) or None


def _short(values) -> str:
    """A bounds list for a message, cut after a few values."""
    values = list(values)
    head = ", ".join(f"{v:g}" for v in values[:4])
    return f"[{head}{', ...' if len(values) > 4 else ''}]"
