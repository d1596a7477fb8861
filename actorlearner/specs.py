"""Gymnasium spaces <-> proto messages.

Two schemas: learner.proto's ``EnvSpec`` (a Box observation and a Discrete action, what
the learner checks in Hello) and env.proto's ``Space`` (every space a custom env may use,
converted exactly both ways). Unsupported spaces raise ValueError naming them; malformed
messages raise ``wire.WireError``.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

from actorlearner import wire
from actorlearner.values import MAX_DEPTH, tensor_from_proto, tensor_to_proto, text_key
from actorlearner.v1 import env_pb2, learner_pb2


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
    return learner_pb2.ActionSpec(discrete=learner_pb2.DiscreteSpec(n=int(space.n), start=int(space.start)))


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
    # Bounds are built as float64 arrays of this shape: refuse what could not travel as one anyway.
    if len(shape) > wire.MAX_RANK or math.prod(shape) * 8 > wire.DEFAULT_MAX_BYTES:
        raise ValueError(f"tensor spec {spec.name!r} of shape {shape} is too large "
                         f"(rank <= {wire.MAX_RANK}, at most {wire.DEFAULT_MAX_BYTES // 8} elements)")
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
    return box_from_spec(spec.observation), spaces.Discrete(int(discrete.n), start=int(discrete.start))


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
        if expected.action.discrete.start != got.action.discrete.start:
            reasons.append(f"action start {expected.action.discrete.start} != {got.action.discrete.start}")
    elif expected.action != got.action:
        reasons.append("action specs differ")
    return "; ".join(reasons) or None


def _short(values) -> str:
    """A bounds list for a message, cut after a few values."""
    values = list(values)
    head = ", ".join(f"{v:g}" for v in values[:4])
    return f"[{head}{', ...' if len(values) > 4 else ''}]"


# --------------------------------------------------------------------------- env.proto spaces


def space_to_proto(space: spaces.Space, _depth: int = 0) -> env_pb2.Space:
    """The Space message of a gymnasium space; ValueError naming an unsupported one."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"spaces nested deeper than {MAX_DEPTH} are not supported")
    if isinstance(space, spaces.Box):
        return env_pb2.Space(box=env_pb2.BoxSpace(
            dtype=_dtype_name(space), shape=space.shape,
            low=tensor_to_proto(space.low), high=tensor_to_proto(space.high)))
    if isinstance(space, spaces.Discrete):
        return env_pb2.Space(discrete=env_pb2.DiscreteSpace(
            n=int(space.n), start=int(space.start), dtype=_dtype_name(space)))
    if isinstance(space, spaces.MultiDiscrete):
        return env_pb2.Space(multi_discrete=env_pb2.MultiDiscreteSpace(
            nvec=tensor_to_proto(space.nvec), start=tensor_to_proto(space.start)))
    if isinstance(space, spaces.MultiBinary):
        scalar = isinstance(space.n, (int, np.integer))
        return env_pb2.Space(multi_binary=env_pb2.MultiBinarySpace(shape=space.shape, n_is_scalar=scalar))
    if isinstance(space, spaces.Dict):
        return env_pb2.Space(dict=env_pb2.DictSpace(entries=[
            env_pb2.DictSpace.Entry(key=text_key(key, space), space=space_to_proto(sub, _depth + 1))
            for key, sub in space.spaces.items()]))
    if isinstance(space, spaces.Tuple):
        return env_pb2.Space(tuple=env_pb2.TupleSpace(spaces=[space_to_proto(sub, _depth + 1) for sub in space]))
    raise ValueError(f"space {space} ({type(space).__name__}) is not supported: "
                     "use Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple")


def space_from_proto(message: env_pb2.Space, _depth: int = 0) -> spaces.Space:
    """The gymnasium space a Space message describes; WireError if it is malformed."""
    if _depth > MAX_DEPTH:
        raise wire.WireError(f"spaces nested deeper than {MAX_DEPTH}")
    kind = message.WhichOneof("kind")
    try:
        if kind == "box":
            box = message.box
            low, high = tensor_from_proto(box.low), tensor_from_proto(box.high)
            shape = tuple(int(d) for d in box.shape)
            if low.dtype.name != box.dtype or high.dtype.name != box.dtype or low.shape != shape or high.shape != shape:
                raise wire.WireError(f"box bounds must be {box.dtype} tensors of shape {shape}, got "
                                     f"{low.dtype} {low.shape} and {high.dtype} {high.shape}")
            return spaces.Box(low=low, high=high, shape=shape, dtype=box.dtype)
        if kind == "discrete":
            d = message.discrete
            if d.n < 1:
                raise wire.WireError(f"discrete space needs n >= 1, got {d.n}")
            return spaces.Discrete(d.n, start=d.start, dtype=_integer_dtype(d.dtype or "int64"))
        if kind == "multi_discrete":
            nvec, start = tensor_from_proto(message.multi_discrete.nvec), tensor_from_proto(message.multi_discrete.start)
            _integer_dtype(nvec.dtype.name)
            if start.dtype != nvec.dtype or start.shape != nvec.shape:
                raise wire.WireError(f"multi-discrete start must match nvec's {nvec.dtype} {nvec.shape}, "
                                     f"got {start.dtype} {start.shape}")
            return spaces.MultiDiscrete(nvec, dtype=nvec.dtype, start=start)
        if kind == "multi_binary":
            shape = [int(d) for d in message.multi_binary.shape]
            if message.multi_binary.n_is_scalar:
                if len(shape) != 1:
                    raise wire.WireError(f"multi-binary with a scalar n needs a rank-1 shape, got {shape}")
                return spaces.MultiBinary(shape[0])
            return spaces.MultiBinary(shape)
        if kind == "dict":
            keys = [entry.key for entry in message.dict.entries]
            if len(set(keys)) != len(keys):
                raise wire.WireError(f"dict space has repeated keys: {keys}")
            return spaces.Dict([(entry.key, space_from_proto(entry.space, _depth + 1))
                                for entry in message.dict.entries])
        if kind == "tuple":
            return spaces.Tuple([space_from_proto(sub, _depth + 1) for sub in message.tuple.spaces])
    except (ValueError, TypeError, AssertionError, OverflowError) as exc:
        if isinstance(exc, wire.WireError):
            raise
        raise wire.WireError(f"invalid {kind} space: {exc}") from None
    raise wire.WireError("space message has no kind set")


def _dtype_name(space: spaces.Space) -> str:
    if space.dtype is None or space.dtype.name not in wire.DTYPES:
        raise ValueError(f"space {space} has dtype {space.dtype}; allowed: {', '.join(wire.DTYPES)}")
    return space.dtype.name


def _integer_dtype(name: str) -> np.dtype:
    if name not in wire.DTYPES or wire.DTYPES[name].kind not in "iu":
        raise wire.WireError(f"{name!r} is not an integer dtype")
    return np.dtype(name)
