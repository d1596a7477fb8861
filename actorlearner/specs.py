"""Gymnasium spaces <-> proto messages.

One schema for spaces in the whole system: env.proto's ``Space`` (every space a custom env
may use, converted exactly both ways), also inside learner.proto's ``EnvSpec`` (what the
learner checks in Hello). Unsupported spaces raise ValueError naming them; malformed
messages raise ``wire.WireError``.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from actorlearner import wire
from actorlearner.values import MAX_DEPTH, tensor_from_proto, tensor_to_proto, text_key
from actorlearner.v1 import env_pb2, learner_pb2


def env_spec(env_id: str, observation_space: spaces.Space, action_space: spaces.Space,
             agents: list[str] | None = None) -> learner_pb2.EnvSpec:
    """The EnvSpec an actor sends in Hello and the learner compares with its own; ValueError naming
    a space env.proto cannot describe. ``agents``: a multi-agent env's, whose seats share the spaces."""
    messages = {}
    for role, space in (("observation", observation_space), ("action", action_space)):
        try:
            messages[role] = space_to_proto(space)
        except ValueError as exc:
            raise ValueError(f"{role} {exc}") from None
    return learner_pb2.EnvSpec(env_id=env_id, agents=agents or [], **messages)


def spaces_from_spec(spec: learner_pb2.EnvSpec) -> tuple[spaces.Space, spaces.Space]:
    """``(observation_space, action_space)`` of an EnvSpec; WireError if either is missing or malformed."""
    for role in ("observation", "action"):
        if not spec.HasField(role):
            raise wire.WireError(f"env spec has no {role} space")
    return space_from_proto(spec.observation), space_from_proto(spec.action)


def spec_mismatch(expected: learner_pb2.EnvSpec, got: learner_pb2.EnvSpec) -> str | None:
    """Why ``got`` (an actor's env) differs from ``expected`` (the learner's), or None.

    ``env_id`` is informational and not compared. Reasons read like
    ``observation/camera shape (84, 84, 3) != (64, 64, 3)``, expected on the left; all of
    them, joined by "; ". A malformed space in ``got`` is a reason too.
    """
    reasons: list[str] = []
    if list(got.agents) != list(expected.agents):
        reasons.append(f"agents {list(expected.agents) or 'none (a single-agent env)'} != "
                       f"{list(got.agents) or 'none (a single-agent env)'}")
    for role in ("observation", "action"):
        if not got.HasField(role):
            reasons.append(f"{role} space missing")
            continue
        try:
            have = space_from_proto(getattr(got, role))
        except wire.WireError as exc:
            reasons.append(f"{role} space malformed: {exc}")
            continue
        _differences(space_from_proto(getattr(expected, role)), have, role, reasons)
    return "; ".join(reasons) or None


def _differences(want: spaces.Space, have: spaces.Space, path: str, out: list[str]) -> None:
    """Append to ``out`` how ``have`` differs from ``want``, leaf by leaf."""
    if type(want) is not type(have):
        out.append(f"{path} {type(want).__name__} != {type(have).__name__}")
        return
    if isinstance(want, spaces.Dict):
        if list(want.spaces) != list(have.spaces):
            out.append(f"{path} keys {list(want.spaces)} != {list(have.spaces)}")
            return
        for key in want.spaces:
            _differences(want[key], have[key], f"{path}/{key}", out)
        return
    if isinstance(want, spaces.Tuple):
        if len(want) != len(have):
            out.append(f"{path} has {len(want)} items != {len(have)}")
            return
        for i, (w, h) in enumerate(zip(want, have)):
            _differences(w, h, f"{path}/{i}", out)
        return
    if want.dtype != have.dtype:
        out.append(f"{path} dtype {want.dtype} != {have.dtype}")
    if want.shape != have.shape:
        out.append(f"{path} shape {want.shape} != {have.shape}")
    elif not _same_values(want, have):
        out.append(f"{path} {_describe(want)} != {_describe(have)}")


def _same_values(want: spaces.Space, have: spaces.Space) -> bool:
    """Exact equality of what defines a leaf space besides dtype and shape (gymnasium's == is approximate)."""
    names = {spaces.Box: ("low", "high"), spaces.Discrete: ("n", "start"),
             spaces.MultiDiscrete: ("nvec", "start"), spaces.MultiBinary: ()}.get(type(want))
    if names is None:
        return want == have
    return all(np.array_equal(getattr(want, name), getattr(have, name)) for name in names)


def _describe(space: spaces.Space) -> str:
    """A space's values for a message: bounds, n and start, nvec..., cut after a few values."""
    if isinstance(space, spaces.Box):
        return f"bounds [{_short(space.low)}]..[{_short(space.high)}]"
    if isinstance(space, spaces.Discrete):
        return f"Discrete(n={space.n}, start={space.start})"
    if isinstance(space, spaces.MultiDiscrete):
        return f"MultiDiscrete(nvec=[{_short(space.nvec)}], start=[{_short(space.start)}])"
    return str(space)


def _short(values) -> str:
    """Array values for a message, cut after a few."""
    flat = np.asarray(values).reshape(-1)
    head = ", ".join(f"{v:g}" for v in flat[:4].tolist())
    return f"{head}{', ...' if flat.size > 4 else ''}"


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
