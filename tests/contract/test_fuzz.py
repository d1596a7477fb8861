"""Property tests for every decoder of untrusted bytes: only typed errors escape, and caps hold.

Each decoder gets arbitrary bytes and structured near misses (a valid input with one
thing wrong). The allowed outcomes are a result that honours the caps, or the project's
typed error: ``wire.WireError`` (or ``ValueError`` where a function documents it). A crash
of any other type, or an allocation beyond the caps, is a bug. The last tests feed
whole ActorMessages to a real :class:`Learner` and whole EnvRequests to a real env
session, as the servers do. About 7,000 examples in all (``max_examples`` per test).
"""

from __future__ import annotations

import itertools
import math
import tracemalloc
import zlib

import msgpack
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import HealthCheck, assume, event, example, given, settings
from hypothesis import strategies as st

from actorlearner import specs, wire
from actorlearner.algorithms.dqn import DQNConfig
from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.envs.server import EnvSession
from actorlearner.envs.steps import StepFormat
from actorlearner.learner.learner import Learner
from actorlearner.learner.spec import Refusal
from actorlearner.streaming.service import parse_actor_message
from actorlearner.v1 import env_pb2, learner_pb2
from actorlearner.values import MAX_DEPTH, dict_from_proto, tensor_to_proto, value_from_proto, value_to_proto
from actorlearner.wire import DTYPES, MAX_RANK, ChunkAssembler, Codec, WireError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # fuzzed bounds overflow float16, on purpose

CAP = 4096
"""max_bytes given to every decoder: small, so that the caps are what stops big inputs."""

N = 3
SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
        "discount": ((), np.float32), "next_obs": ((4,), np.float32)}


def fuzz(examples: int):
    return settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))


def typed(call, *args, allowed: tuple[type[BaseException], ...] = (WireError,), **kwargs):
    """``call(*args, **kwargs)``, or None if it raised one of ``allowed``; anything else propagates."""
    try:
        return call(*args, **kwargs)
    except allowed:
        return None


# --------------------------------------------------------------------------- strategies

DTYPE_NAMES = sorted(DTYPES)
BAD_DTYPES = ["complex64", "object", "float", "<f4", ">i4", "U8", "V4", "", "bfloat16", "datetime64", "bool_"]
int64s = st.integers(-(2**63), 2**63 - 1)
msgpack_ints = st.integers(-(2**63), 2**64 - 1)
dtype_names = st.sampled_from(DTYPE_NAMES) | st.sampled_from(BAD_DTYPES) | st.text(max_size=6)
dims = st.integers(-2, 6) | st.sampled_from([2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1, -(2**63)])
shapes = st.lists(dims, max_size=MAX_RANK + 2)

msgpack_scalars = (st.none() | st.booleans() | msgpack_ints | st.floats() | st.text(max_size=8)
                   | st.binary(max_size=16))
msgpack_values = st.recursive(
    msgpack_scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["dtype", "shape", "data", "obs", "x", ""]), children, max_size=4),
    max_leaves=12,
)


def valid_array(draw, name: str | None = None, shape: list[int] | None = None) -> dict:
    name = name or draw(st.sampled_from(DTYPE_NAMES))
    shape = shape if shape is not None else draw(st.lists(st.integers(0, 4), max_size=3))
    nbytes = math.prod(shape) * DTYPES[name].itemsize
    data = draw(st.binary(min_size=nbytes, max_size=nbytes))
    if name == "bool":
        data = bytes(b & 1 for b in data)
    elif DTYPES[name].kind == "f":  # finite, so that only a mutation makes the array invalid
        data = np.nan_to_num(np.frombuffer(data, DTYPES[name]), nan=0.0, posinf=1.0, neginf=-1.0).tobytes()
    return {"dtype": name, "shape": list(shape), "data": data}


def mutate_array(draw, obj: dict) -> tuple[dict | object, bool]:
    """``obj`` with at most one thing wrong; also whether it is unchanged."""
    mutation = draw(st.sampled_from(["none", "dtype", "shape", "data", "extra", "missing", "other"]))
    obj = dict(obj)
    if mutation == "dtype":
        obj["dtype"] = draw(dtype_names | msgpack_ints | st.none())
    elif mutation == "shape":
        obj["shape"] = draw(shapes | st.lists(st.floats() | st.booleans() | st.text(max_size=2), max_size=3)
                            | st.text(max_size=3) | msgpack_ints)
    elif mutation == "data":
        obj["data"] = draw(st.binary(max_size=2 * len(obj["data"]) + 8) | st.text(max_size=4) | msgpack_ints)
    elif mutation == "extra":
        obj[draw(st.text(max_size=4))] = draw(msgpack_scalars)
    elif mutation == "missing":
        del obj[draw(st.sampled_from(sorted(obj)))]
    elif mutation == "other":
        return draw(msgpack_values), False
    return obj, mutation == "none"


@st.composite
def array_maps(draw) -> tuple[object, bool]:
    return mutate_array(draw, valid_array(draw))


@st.composite
def batch_payloads(draw, spec=SPEC) -> tuple[bytes, int, int, bool]:
    """``(payload, codec, num_transitions, intact)``: a batch for ``spec``, maybe with one thing wrong."""
    n = draw(st.integers(1, 4))
    fields = {}
    for name, (shape, dtype) in spec.items():
        fields[name] = valid_array(draw, np.dtype(dtype).name, [n, *shape])
    intact = True
    change = draw(st.sampled_from(["none", "none", "none", "array", "nonfinite", "drop", "add", "num_transitions",
                                   "toplevel"]))
    if change == "array":
        name = draw(st.sampled_from(sorted(fields)))
        fields[name], intact = mutate_array(draw, fields[name])
    elif change == "nonfinite":
        name = draw(st.sampled_from(["obs", "reward", "discount", "next_obs"]))
        array = np.frombuffer(fields[name]["data"], np.float32).copy()
        array[draw(st.integers(0, array.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
        fields[name] = {**fields[name], "data": array.tobytes()}
        intact = False
    elif change == "drop":
        del fields[draw(st.sampled_from(sorted(fields)))]
        intact = False
    elif change == "add":
        fields[draw(st.text(max_size=6))] = draw(array_maps())[0]
        intact = False
    elif change == "num_transitions":
        other = draw(st.integers(-2, 6) | int64s)
        intact, n = other == n, other
    elif change == "toplevel":
        fields, intact = draw(msgpack_values), False
    raw = msgpack.packb(fields, use_bin_type=True)
    codec = draw(st.sampled_from([Codec.MSGPACK, Codec.MSGPACK_ZLIB]))
    payload = zlib.compress(raw, 1) if codec is Codec.MSGPACK_ZLIB else raw
    return payload, int(codec), n, intact


def check_batch(out: dict[str, np.ndarray], n: int, cap: int = CAP, spec=SPEC) -> None:
    """A decoded batch honours the spec, the cap and finiteness."""
    assert list(out) == list(spec)
    for name, (shape, dtype) in spec.items():
        array = out[name]
        assert array.dtype == np.dtype(dtype) and array.shape == (n, *shape)
        assert array.nbytes <= cap
        if array.dtype.kind == "f":
            assert np.isfinite(array).all()


# --------------------------------------------------------------------------- wire: arrays


@fuzz(750)
@given(array_maps() | st.tuples(msgpack_values, st.just(False)), st.booleans(),
       st.sampled_from([bytes, bytearray, memoryview]))
def test_decode_array(case, writable, buffer_type):
    obj, intact = case
    if isinstance(obj, dict) and isinstance(obj.get("data"), bytes):
        obj = {**obj, "data": buffer_type(obj["data"])}
    array = typed(wire.decode_array, obj, CAP, writable=writable)
    if intact:
        assert array is not None
    if array is None:
        return
    assert array.dtype.name in DTYPES and array.dtype.isnative
    assert array.shape == tuple(obj["shape"]) and array.nbytes <= CAP
    assert array.tobytes() == bytes(obj["data"])
    assert not writable or array.flags.writeable


# --------------------------------------------------------------------------- wire: batches


@fuzz(500)
@given(st.binary(max_size=512), st.sampled_from([0, 1, 2, 3, -1, "msgpack+zlib", "gzip"]), st.integers(-1, 5))
def test_decode_batch_arbitrary_bytes(payload, codec, n):
    out = typed(wire.decode_batch, payload, codec, SPEC, n, CAP)
    if out is not None:
        check_batch(out, n)


@fuzz(750)
@given(batch_payloads(), st.booleans())
def test_decode_batch_near_misses(case, writable):
    payload, codec, n, intact = case
    out = typed(wire.decode_batch, payload, codec, SPEC, n, CAP, writable=writable)
    event("decoded" if out is not None else "rejected")
    if intact:
        assert out is not None, "an intact batch was rejected"
    if out is not None:
        check_batch(out, n)
        assert not writable or all(a.flags.writeable for a in out.values())


def amplifiers(k: int) -> list[bytes]:
    """Payloads that cost far more memory decoded than they take on the wire, if nothing stops them."""
    def array32(count: int, item: bytes) -> bytes:
        return b"\xdd" + count.to_bytes(4, "big") + item * count

    def map32(count: int, value: bytes) -> bytes:  # distinct keys of 4 hex digits
        keys = (b"\xa4" + f"{i:04x}".encode() for i in range(count))
        return b"\xdf" + count.to_bytes(4, "big") + b"".join(key + value for key in keys)

    nested = b"\x91" * min(k, 2000) + b"\xc0"
    fields = b"".join(b"\xa1" + bytes([97 + i % 26]) + b"\x80" for i in range(min(k, 1000)))
    return [
        array32(k, b"\x80"),  # k empty maps
        array32(k, b"\x90"),  # k empty arrays
        map32(k // 6, b"\x80"),
        b"\x85" + b"\xa3obs" + array32(k, b"\xc0") + b"\xa0\x80" * 4,
        b"\xdf" + min(k, 1000).to_bytes(4, "big") + fields,
        nested,
        b"\x95" + b"\x95\x95\x95\x95\x95" * (k // 6 + 1),
    ]


@fuzz(150)
@given(st.integers(1, 60_000), st.integers(0, 6), st.sampled_from([Codec.MSGPACK, Codec.MSGPACK_ZLIB]))
@example(60_000, 0, Codec.MSGPACK).via("an array of empty maps: ~80 bytes each, from 1 byte")
@example(60_000, 1, Codec.MSGPACK_ZLIB).via("the same with arrays, compressed")
@example(60_000, 2, Codec.MSGPACK).via("a flat map of empty maps")
@example(60_000, 3, Codec.MSGPACK).via("a field that is a long array")
def test_decode_batch_memory_stays_near_the_cap(k, which, codec):
    """Peak allocation while decoding stays within a small multiple of max_bytes, whatever the bytes say."""
    cap = 64 * 1024
    payload = amplifiers(k)[which]
    if codec is Codec.MSGPACK_ZLIB:
        payload = zlib.compress(payload, 9)
    assume(len(payload) <= cap or codec is Codec.MSGPACK)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        typed(wire.decode_batch, payload, codec, SPEC, N, cap)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak <= 4 * cap + 64 * 1024, f"decoding {len(payload)} bytes allocated {peak} bytes"


@fuzz(150)
@given(st.integers(1, 4 << 20), st.sampled_from([b"\x00", b"\x80", b"\xc0", b"\xff"]))
def test_zlib_bombs_stop_at_the_cap(size, byte):
    bomb = zlib.compress(byte * size, 9)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        typed(wire.decode_batch, bomb, Codec.MSGPACK_ZLIB, SPEC, N, CAP)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak <= 4 * CAP + 64 * 1024


@fuzz(300)
@given(st.lists(st.floats(width=32), max_size=6), st.integers(0, 6))
def test_decode_priorities(values, n):
    message = learner_pb2.TrajectoryBatch(priorities=values, num_transitions=n)
    out = typed(wire.decode_priorities, message.priorities, message.num_transitions)
    if out is None:
        return
    assert out.dtype == np.float32 and out.shape == (n,)
    assert np.isfinite(out).all() and (out >= 0).all()


@fuzz(200)
@given(st.integers() | st.text(max_size=16) | st.floats() | st.none() | st.binary(max_size=4)
       | st.sampled_from(["msgpack", "MSGPACK_ZLIB", "codec_msgpack", "msgpack+zlib", " msgpack "]))
def test_codec_parse(value):
    codec = typed(Codec.parse, value)
    assert codec is None or codec in (Codec.MSGPACK, Codec.MSGPACK_ZLIB)


# --------------------------------------------------------------------------- wire: weights


STATE_SPEC = {"w": ((2, 3), torch.float32), "b": ((3,), torch.float32), "steps": ((), torch.int64)}


@st.composite
def state_payloads(draw) -> tuple[bytes, bool]:
    params = {name: valid_array(draw, wire.TORCH_DTYPES[dtype], list(shape))
              for name, (shape, dtype) in STATE_SPEC.items()}
    intact = True
    change = draw(st.sampled_from(["none", "array", "drop", "add", "bytes", "toplevel"]))
    if change == "array":
        name = draw(st.sampled_from(sorted(params)))
        params[name], intact = mutate_array(draw, params[name])
    elif change == "drop":
        del params[draw(st.sampled_from(sorted(params)))]
        intact = False
    elif change == "add":
        params[draw(st.text(max_size=4).filter(lambda k: k not in params))] = draw(array_maps())[0]
        intact = False
    elif change == "toplevel":
        params, intact = draw(msgpack_values), False
    if change == "bytes":
        return draw(st.binary(max_size=256)), False
    return msgpack.packb(params, use_bin_type=True), intact


@fuzz(400)
@given(state_payloads(), st.booleans())
def test_decode_state_dict(case, with_expected):
    payload, intact = case
    expected = STATE_SPEC if with_expected else None
    out = typed(wire.decode_state_dict, payload, CAP, expected)
    if intact:
        assert out is not None
    if out is None:
        return
    for name, tensor in out.items():
        assert isinstance(tensor, torch.Tensor) and tensor.numpy().flags.writeable
        assert tensor.numel() * tensor.element_size() <= CAP
        if expected is not None:
            assert tuple(tensor.shape) == expected[name][0] and tensor.dtype == expected[name][1]


chunks = st.tuples(st.integers(-3, 4) | int64s, st.integers(-1, 4) | st.integers(0, 2**32 - 1),
                   st.integers(-1, 4) | st.integers(0, 2**32 - 1), st.integers(-1, 40) | st.integers(0, 2**64 - 1),
                   st.binary(max_size=12))


@fuzz(400)
@given(st.lists(chunks | st.tuples(st.just("whole"), st.binary(max_size=40), st.integers(1, 16)), max_size=10))
def test_chunk_assembler(steps):
    """Garbage chunks raise WireError; a whole version sent in order after them still comes out intact."""
    cap = 32
    assembler = ChunkAssembler(max_total_bytes=cap)
    for step in steps:
        if step[0] == "whole":
            _, payload, size = step
            version = (assembler.latest_version or 0) + 1
            parts = wire.split_chunks(payload, size)
            results = [typed(assembler.add, version, i, len(parts), len(payload), part) for i, part in enumerate(parts)]
            if len(payload) <= cap:
                assert results[-1] == payload and not any(results[:-1])
            else:
                assert results == [None] * len(parts)
        else:
            out = typed(assembler.add, *step)
            if out is not None:
                assert len(out) == step[3] <= cap
        assert assembler._received <= cap  # nothing buffered beyond the cap


# --------------------------------------------------------------------------- specs


def tensors(draw, valid: bool) -> env_pb2.Tensor:
    if valid:
        obj = valid_array(draw)
    else:
        obj = {"dtype": draw(dtype_names), "shape": draw(st.lists(dims.filter(lambda d: -(2**63) <= d < 2**63),
                                                                   max_size=4)),
               "data": draw(st.binary(max_size=32))}
    return env_pb2.Tensor(dtype=obj["dtype"], shape=obj["shape"], data=obj["data"])


@st.composite
def space_leaves(draw) -> env_pb2.Space:
    kind = draw(st.sampled_from(["box", "box", "discrete", "multi_discrete", "multi_binary", "unset"]))
    if kind == "box":
        name = draw(st.sampled_from(DTYPE_NAMES))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        a, b = (np.frombuffer(valid_array(draw, name, shape)["data"], DTYPES[name]).reshape(shape) for _ in range(2))
        low, high = np.minimum(a, b), np.maximum(a, b)
        if DTYPES[name].kind == "f" and draw(st.booleans()):  # unbounded sides, as gymnasium allows
            low, high = np.full(shape, -np.inf, name), np.where(high > 0, np.inf, high).astype(name)
        box = env_pb2.BoxSpace(dtype=name, shape=shape, low=tensor_to_proto(low), high=tensor_to_proto(high))
        change = draw(st.sampled_from(["none", "none", "dtype", "shape", "low", "high", "swap"]))
        if change == "dtype":
            box.dtype = draw(dtype_names)
        elif change == "shape":
            box.ClearField("shape")
            box.shape.extend(draw(st.lists(dims.filter(lambda d: d < 2**63), max_size=3)))
        elif change in ("low", "high"):
            getattr(box, change).CopyFrom(tensors(draw, draw(st.booleans())))
        elif change == "swap":
            box.low.CopyFrom(tensor_to_proto(high))
            box.high.CopyFrom(tensor_to_proto(low))
        return env_pb2.Space(box=box)
    if kind == "discrete":
        return env_pb2.Space(discrete=env_pb2.DiscreteSpace(
            n=draw(st.integers(1, 10) | st.integers(-2, 0) | int64s), start=draw(st.integers(-5, 5) | int64s),
            dtype=draw(st.sampled_from(["", "int64", "int8", "uint8", "uint64", "int32"]) | dtype_names)))
    if kind == "multi_discrete":
        name = draw(st.sampled_from(["int64", "int32", "uint8", "int8", "float32"]))
        shape = draw(st.lists(st.integers(0, 3), max_size=2))
        size = math.prod(shape)
        nvec = np.asarray(draw(st.lists(st.integers(-2, 300), min_size=size, max_size=size)), dtype=np.int64)
        start = np.asarray(draw(st.lists(st.integers(-300, 300), min_size=size, max_size=size)), dtype=np.int64)
        as_tensor = lambda a: env_pb2.Tensor(dtype=name, shape=shape, data=a.astype(name).tobytes())  # noqa: E731
        return env_pb2.Space(multi_discrete=env_pb2.MultiDiscreteSpace(
            nvec=as_tensor(nvec) if draw(st.booleans()) else tensors(draw, False),
            start=as_tensor(start) if draw(st.booleans()) else tensors(draw, False)))
    if kind == "multi_binary":
        return env_pb2.Space(multi_binary=env_pb2.MultiBinarySpace(
            shape=draw(st.lists(st.integers(-1, 4) | dims.filter(lambda d: d < 2**63), max_size=3)),
            n_is_scalar=draw(st.booleans())))
    return env_pb2.Space()


space_messages = st.recursive(
    space_leaves(),
    lambda children: st.builds(lambda entries: env_pb2.Space(dict=env_pb2.DictSpace(entries=[
        env_pb2.DictSpace.Entry(key=k, space=v) for k, v in entries])),
        st.lists(st.tuples(st.sampled_from(["a", "b", "", "c"]), children), max_size=3))
    | st.builds(lambda items: env_pb2.Space(tuple=env_pb2.TupleSpace(spaces=items)), st.lists(children, max_size=3)),
    max_leaves=6,
)


def nested_spaces(depth: int) -> env_pb2.Space:
    space = env_pb2.Space(discrete=env_pb2.DiscreteSpace(n=2))
    for _ in range(depth):
        space = env_pb2.Space(tuple=env_pb2.TupleSpace(spaces=[space]))
    return space


@fuzz(500)
@given(space_messages | st.integers(MAX_DEPTH - 1, MAX_DEPTH + 3).map(nested_spaces)
       | st.binary(max_size=128).map(lambda b: typed(env_pb2.Space.FromString, b, allowed=(Exception,))))
def test_space_from_proto(message):
    assume(message is not None)
    space = typed(specs.space_from_proto, message)
    event(type(space).__name__ if space is not None else "rejected")
    if space is None:
        return
    assert isinstance(space, spaces.Space)
    again = typed(specs.space_to_proto, space, allowed=(ValueError,))  # what it decoded can be sent back
    assert again is None or isinstance(again, env_pb2.Space)


@st.composite
def env_specs(draw) -> learner_pb2.EnvSpec:
    spec = learner_pb2.EnvSpec(env_id=draw(st.text(max_size=8)))
    for role in ("observation", "action"):
        if draw(st.booleans()):
            getattr(spec, role).CopyFrom(draw(space_messages))
    return spec


_cartpole = make_env("CartPole-v1")
CARTPOLE_SPEC = specs.env_spec("CartPole-v1", _cartpole.observation_space, _cartpole.action_space)
_cartpole.close()


@fuzz(400)
@given(env_specs() | st.binary(max_size=96).map(lambda b: typed(learner_pb2.EnvSpec.FromString, b, allowed=(Exception,)))
       | st.just(CARTPOLE_SPEC))
def test_env_spec_decoders(spec):
    """spaces_from_spec raises only WireError (documented); spec_mismatch, on every Hello, never raises."""
    assume(spec is not None)
    reason = specs.spec_mismatch(CARTPOLE_SPEC, spec)
    assert reason is None or isinstance(reason, str)
    decoded = typed(specs.spaces_from_spec, spec)
    if decoded is not None:
        assert all(isinstance(space, spaces.Space) for space in decoded)
    if spec == CARTPOLE_SPEC:
        assert reason is None and decoded is not None


# --------------------------------------------------------------------------- values


def value_leaves(draw) -> env_pb2.Value:
    kind = draw(st.sampled_from(["tensor", "bad tensor", "text", "unset"]))
    if kind == "tensor":
        return env_pb2.Value(tensor=tensors(draw, True))
    if kind == "bad tensor":
        return env_pb2.Value(tensor=tensors(draw, False))
    if kind == "text":
        return env_pb2.Value(text=draw(st.text(max_size=8)))
    return env_pb2.Value()


value_messages = st.recursive(
    st.composite(value_leaves)(),
    lambda children: st.builds(lambda entries: env_pb2.Value(dict=env_pb2.DictValue(entries=[
        env_pb2.DictValue.Entry(key=k, value=v) for k, v in entries])),
        st.lists(st.tuples(st.sampled_from(["a", "b", "", "a"]), children), max_size=3))
    | st.builds(lambda items: env_pb2.Value(tuple=env_pb2.TupleValue(items=items)), st.lists(children, max_size=3)),
    max_leaves=8,
)


def nested_values(depth: int) -> env_pb2.Value:
    value = env_pb2.Value(text="leaf")
    for i in range(depth):
        value = (env_pb2.Value(tuple=env_pb2.TupleValue(items=[value])) if i % 2
                 else env_pb2.Value(dict=env_pb2.DictValue(entries=[env_pb2.DictValue.Entry(key="k", value=value)])))
    return value


VALUE_SPACES = [None, spaces.Box(-1, 1, (2,), np.float32), spaces.Discrete(3), spaces.MultiBinary(2),
                spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(0, 1, (1,))}),
                spaces.Tuple([spaces.Discrete(2), spaces.MultiDiscrete([2, 3])])]


def arrays_in(value) -> list[np.ndarray]:
    if isinstance(value, dict):
        return [a for v in value.values() for a in arrays_in(v)]
    if isinstance(value, tuple):
        return [a for v in value for a in arrays_in(v)]
    return [np.asarray(value)] if isinstance(value, (np.ndarray, np.generic)) else []


@fuzz(750)
@given(value_messages | st.integers(MAX_DEPTH - 1, MAX_DEPTH + 3).map(nested_values)
       | st.binary(max_size=128).map(lambda b: typed(env_pb2.Value.FromString, b, allowed=(Exception,))),
       st.sampled_from(VALUE_SPACES))
def test_value_from_proto(message, space):
    assume(message is not None)
    value = typed(value_from_proto, message, space, CAP)
    event("decoded" if value is not None else "rejected")
    if value is not None:
        assert all(a.nbytes <= CAP and a.dtype.name in DTYPES for a in arrays_in(value))
    if message.WhichOneof("kind") == "dict":
        as_dict = typed(dict_from_proto, message.dict, CAP)
        assert as_dict is None or isinstance(as_dict, dict)


# --------------------------------------------------------------------------- env sessions


STEP_SPACES = [
    (spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2)),
    (spaces.Box(0, 255, (3,), np.uint8), spaces.Discrete(5000, start=-7)),  # too big for the action table
    (spaces.Box(-1, 1, (2,), np.float64), spaces.Box(-2, 2, (1,), np.float32)),
    (spaces.Box(0, 1, (), np.float32), spaces.Discrete(3, start=1)),
]


def variant(draw, raw: bytes, max_random: int = 64) -> bytes:
    """``raw`` as it is, with a few bytes changed, cut or added, or replaced by random bytes."""
    how = draw(st.sampled_from(["same", "edited", "edited", "random"]))
    if how == "same":
        return raw
    if how == "random":
        return draw(st.binary(max_size=max_random))
    raw = bytearray(raw)
    for _ in range(draw(st.integers(0, 3))):
        edit = draw(st.sampled_from(["flip", "cut", "add"]))
        if edit == "flip" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif edit == "cut" and raw:
            del raw[draw(st.integers(0, len(raw) - 1)):]
        else:
            raw += draw(st.binary(min_size=1, max_size=4))
    return bytes(raw)


@fuzz(500)
@given(st.sampled_from(range(len(STEP_SPACES))), st.data())
def test_step_format(which, data):
    """Canonical step bytes, a few bits off or not: a value in the space, or None; never an exception."""
    observation_space, action_space = STEP_SPACES[which]
    steps = StepFormat(observation_space, action_space)
    action_space.seed(data.draw(st.integers(0, 2**32 - 1)))
    observation_space.seed(data.draw(st.integers(0, 2**32 - 1)))
    request = steps.encode_request(action_space.sample()) or b""
    response = steps.encode_response(observation_space.sample(), data.draw(st.floats()),
                                     *data.draw(st.tuples(st.booleans(), st.booleans()))) or b""
    request, response = variant(data.draw, request), variant(data.draw, response)
    decoded = steps.decode_request(request)
    assert decoded is None or action_space.contains(decoded)
    out = steps.decode_response(response)
    if out is not None:
        obs, reward, terminated, truncated = out
        assert obs.dtype == observation_space.dtype and obs.shape == observation_space.shape
        assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)


_step_formats: dict[str, tuple[StepFormat, spaces.Space]] = {}


def step_format(name: str) -> tuple[StepFormat, spaces.Space]:
    """The canonical step bytes of env ``name`` and its action space."""
    if name not in _step_formats:
        env = make_env(name)
        _step_formats[name] = StepFormat(env.observation_space, env.action_space), env.action_space
        env.close()
    return _step_formats[name]


@st.composite
def env_requests(draw, name: str) -> bytes:
    kind = draw(st.sampled_from(["reset", "reset", "step", "valid step", "canonical", "canonical", "close", "empty",
                                 "bytes"]))
    if kind == "reset":
        request = env_pb2.EnvRequest(reset=env_pb2.ResetRequest())
        if draw(st.booleans()):
            request.reset.seed = draw(int64s)
        for key, value in draw(st.lists(st.tuples(st.sampled_from(["start", "x", ""]), value_messages), max_size=2)):
            request.reset.options.entries.add(key=key, value=value)
        return request.SerializeToString()
    if kind == "step":
        value = draw(value_messages | st.sampled_from([env_pb2.Value(tensor=env_pb2.Tensor(dtype="int64", data=bytes(8)))]))
        return env_pb2.EnvRequest(step=env_pb2.StepRequest(action=value)).SerializeToString()
    if kind == "valid step":
        _, action_space = step_format(name)
        action_space.seed(draw(st.integers(0, 2**32 - 1)))
        action = value_to_proto(action_space.sample())
        return env_pb2.EnvRequest(step=env_pb2.StepRequest(action=action)).SerializeToString()
    if kind == "canonical":
        steps, action_space = step_format(name)
        action_space.seed(draw(st.integers(0, 2**32 - 1)))
        return variant(draw, steps.encode_request(action_space.sample()) or b"")
    if kind == "close":
        return env_pb2.EnvRequest(close=env_pb2.CloseRequest()).SerializeToString()
    if kind == "empty":
        return b""
    return draw(st.binary(max_size=64))


VALID_RESET = env_pb2.EnvRequest(reset=env_pb2.ResetRequest(seed=0)).SerializeToString()


def check_session(name: str, requests: list[bytes]) -> None:
    """A fresh session (as a server makes per client) answers every request with one parseable response."""
    env_session = EnvSession(make_env(name), CAP)
    try:
        answer_all(env_session, requests)
    finally:
        env_session.env.close()


def answer_all(env_session: EnvSession, requests: list[bytes]) -> None:
    for raw in requests:
        answer = env_pb2.EnvResponse.FromString(env_session.handle(raw))  # bytes, always, and parseable
        kind = answer.WhichOneof("kind")
        event(kind if kind != "error" else f"error {answer.error.code}")
        assert kind in ("reset", "step", "close", "error")
        if kind == "error":
            # INVALID_ARGUMENT, FAILED_PRECONDITION, RESOURCE_EXHAUSTED (over the cap), INTERNAL (the env raised)
            assert answer.error.code in (3, 8, 9, 13) and answer.error.message
    reset = env_pb2.EnvResponse.FromString(env_session.handle(VALID_RESET))
    assert reset.WhichOneof("kind") == "reset", "the session did not survive the requests before"


@fuzz(350)
@given(st.data())
def test_env_session_cartpole(data):
    first = [VALID_RESET] if data.draw(st.booleans()) else []
    check_session("CartPole-v1", first + data.draw(st.lists(env_requests("CartPole-v1"), max_size=6)))


@fuzz(250)
@given(st.data())
def test_env_session_dict_spaces(data):
    first = [VALID_RESET] if data.draw(st.booleans()) else []
    check_session("custom_envs:dict_walk", first + data.draw(st.lists(env_requests("custom_envs:dict_walk"), max_size=6)))


# --------------------------------------------------------------------------- the learner


_learner: list[Learner] = []


def learner() -> Learner:
    """A real learner (not serving: its servicer's calls are made directly), built once."""
    if not _learner:
        # It never trains, so nothing is sampled: a rate limiter with a practically endless error
        # buffer lets every fuzzed insert through instead of waiting for samples that never come.
        config = LearnerConfig(env="CartPole-v1", device="cpu", replay_capacity=512, min_replay_size=64,
                               batch_size=32, rate_error_buffer=1e12, max_message_bytes=CAP, eval_every=0,
                               algorithm_config=DQNConfig(hidden_sizes=(8,)))
        _learner.append(Learner(config))
    return _learner[0]


_seqs = itertools.count(1)


@st.composite
def actor_messages(draw) -> bytes:
    kind = draw(st.sampled_from(["batch", "batch", "batch", "hello", "stats", "bytes", "flipped batch"]))
    if kind in ("batch", "flipped batch"):
        payload, codec, n, _ = draw(batch_payloads())
        n = n if 0 <= n < 2**32 else 0
        other = draw(st.integers(0, 6))
        length = draw(st.sampled_from([0, n, n, n, other] if n <= 16 else [0, other]))
        batch = learner_pb2.TrajectoryBatch(
            seq=next(_seqs), policy_version=draw(st.integers(0, 5)), num_transitions=n, payload=payload, codec=codec,
            priorities=draw(st.lists(st.floats(0, 10, width=32), min_size=length, max_size=length)))
        change = draw(st.sampled_from(["none", "none", "priorities", "codec", "policy_version"]))
        if change == "priorities":
            batch.priorities[:] = draw(st.lists(st.floats(width=32), min_size=length, max_size=length))
        elif change == "codec":
            batch.codec = draw(st.integers(-1, 4))
        elif change == "policy_version":
            batch.policy_version = draw(int64s)
        raw = learner_pb2.ActorMessage(batch=batch).SerializeToString()
        return variant(draw, raw) if kind == "flipped batch" else raw
    if kind == "hello":
        return learner_pb2.ActorMessage(hello=learner_pb2.Hello(
            actor_id=draw(st.text(max_size=6)), protocol_version=draw(st.integers(0, 3) | st.integers(0, 2**32 - 1)),
            env_spec=draw(env_specs() | st.just(CARTPOLE_SPEC)), algorithm=draw(st.sampled_from(["dqn", "", "ppo"])),
            policy_version=draw(int64s))).SerializeToString()
    if kind == "stats":
        returns = draw(st.lists(st.floats(width=32), max_size=4))
        return learner_pb2.ActorMessage(episode_stats=learner_pb2.EpisodeStats(
            returns=returns, lengths=draw(st.lists(st.integers(0, 2**32 - 1), max_size=4)),
            env_steps=draw(st.integers(0, 2**64 - 1)), policy_version=draw(int64s))).SerializeToString()
    return draw(st.binary(max_size=96))


@fuzz(750)
@given(actor_messages())
def test_actor_messages_through_the_learner(raw):
    """What LearnerService does with one message: parse, then Hello check / ingest / stats."""
    the_learner = learner()
    stream = the_learner.connect(learner_pb2.Hello(actor_id="fuzz", policy_version=-1))
    try:
        one_message(the_learner, stream, raw)
    finally:
        the_learner.disconnect(stream)


def one_message(the_learner, stream, raw: bytes) -> None:
    message = parse_actor_message(raw)
    if isinstance(message, WireError):
        event("does not parse")
        return
    kind = message.WhichOneof("kind")
    if kind == "hello":
        refusal = the_learner.check_hello(message.hello)
        assert refusal is None or (isinstance(refusal, Refusal) and refusal.reason)
        event(f"hello {'refused ' + refusal.code if refusal else 'accepted'}")
    elif kind == "batch":
        before, size = the_learner.ingestion.inserted_batches, len(the_learner.replay)
        inserted = typed(the_learner.ingest, stream, message.batch, allowed=(WireError, ValueError))
        event(f"batch {'inserted' if inserted else 'duplicate' if inserted is False else 'rejected'}")
        if inserted:
            assert the_learner.ingestion.inserted_batches == before + 1
            assert len(the_learner.replay) == min(size + message.batch.num_transitions, the_learner.replay.buffer.capacity)
        else:
            assert (the_learner.ingestion.inserted_batches, len(the_learner.replay)) == (before, size)
        assert the_learner.replay.limiter.inserts == the_learner.replay.buffer.inserted  # nothing counted that was not stored
    elif kind == "episode_stats":
        the_learner.record_episodes(stream, message.episode_stats)
