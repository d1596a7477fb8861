"""actorlearner.wire: round trips, every rejection path, and fuzzing that only WireError escapes."""

from __future__ import annotations

import zlib

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actorlearner import wire
from actorlearner.v1 import learner_pb2

from actorlearner.wire import (
    DTYPES,
    MAX_RANK,
    ChunkAssembler,
    Codec,
    WireError,
    decode_array,
    decode_batch,
    decode_priorities,
    decode_state_dict,
    encode_array,
    encode_batch,
    encode_state_dict,
    split_chunks,
    state_dict_spec,
)

N = 5
SPEC = {
    "obs": ((4,), np.dtype(np.float32)),
    "action": ((), np.dtype(np.int64)),
    "reward": ((), np.dtype(np.float32)),
    "done": ((), np.dtype(np.bool_)),
}


def make_batch(n: int = N) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "obs": rng.standard_normal((n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n),
        "reward": np.ones(n, np.float32),
        "done": np.arange(n) % 2 == 0,
    }


def packed(fields: dict[str, object]) -> bytes:
    """A batch payload built by hand, to smuggle in malformed array maps."""
    return msgpack.packb(fields, use_bin_type=True)


def raw_array(dtype: object = "float32", shape: object = (2,), data: object = None) -> dict:
    if data is None:
        data = bytes(4 * 2)
    return {"dtype": dtype, "shape": list(shape) if isinstance(shape, tuple) else shape, "data": data}


def rejects(code: str = "INVALID_ARGUMENT", match: str | None = None):
    """pytest.raises for a WireError, then checks its gRPC status name."""
    return _Rejects(code, match)


class _Rejects:
    def __init__(self, code: str, match: str | None) -> None:
        self.code, self.raises = code, pytest.raises(WireError, match=match)

    def __enter__(self):
        self.info = self.raises.__enter__()
        return self.info

    def __exit__(self, *exc):
        result = self.raises.__exit__(*exc)
        assert self.info.value.code == self.code, self.info.value
        return result


# --------------------------------------------------------------------------- arrays


@pytest.mark.parametrize("name", sorted(DTYPES))
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (2, 3)])
def test_array_round_trip_all_dtypes(name: str, shape: tuple[int, ...]) -> None:
    array = (np.arange(int(np.prod(shape))) % 2).astype(name).reshape(shape)
    obj = msgpack.unpackb(msgpack.packb(encode_array(array)))
    back = decode_array(obj)
    assert back.dtype == np.dtype(name) and back.shape == shape
    np.testing.assert_array_equal(back, array)


def test_array_zero_copy_and_writable() -> None:
    data = np.arange(6, dtype=np.float32).tobytes()
    back = decode_array({"dtype": "float32", "shape": [2, 3], "data": data})
    assert not back.flags.writeable and np.shares_memory(back, np.frombuffer(data, np.uint8))
    assert decode_array({"dtype": "float32", "shape": [2, 3], "data": data}, writable=True).flags.writeable


def test_encode_array_big_endian_and_non_contiguous() -> None:
    array = np.arange(12, dtype=">i4").reshape(3, 4)[:, ::2]
    back = decode_array(msgpack.unpackb(msgpack.packb(encode_array(array))))
    np.testing.assert_array_equal(back, array)
    assert back.dtype == np.dtype("int32")


@pytest.mark.parametrize("bad", [np.zeros(2, np.complex64),
                                 np.array(["a"]), np.array([object()]),
                                 np.zeros(2, dtype=[("a", "f4")])])
def test_encode_array_rejects_unlisted_dtypes(bad: np.ndarray) -> None:
    with rejects(match="not allowed"):
        encode_array(bad)


@pytest.mark.parametrize(
    "obj, code, match",
    [
        ([1, 2], "INVALID_ARGUMENT", "must be a map"),
        ({"dtype": "float32", "shape": [2]}, "INVALID_ARGUMENT", "keys"),
        ({**raw_array(), "extra": 1}, "INVALID_ARGUMENT", "keys"),
        (raw_array(dtype="complex64"), "INVALID_ARGUMENT", "unknown dtype"),
        (raw_array(dtype="object"), "INVALID_ARGUMENT", "unknown dtype"),
        (raw_array(dtype=3), "INVALID_ARGUMENT", "unknown dtype"),
        (raw_array(shape=[2.0]), "INVALID_ARGUMENT", "list of ints"),
        (raw_array(shape=[True, 2]), "INVALID_ARGUMENT", "list of ints"),
        (raw_array(shape="2"), "INVALID_ARGUMENT", "list of ints"),
        (raw_array(shape=[-1, -2], data=bytes(8)), "INVALID_ARGUMENT", "negative"),
        (raw_array(shape=[1] * (MAX_RANK + 1), data=bytes(4)), "INVALID_ARGUMENT", "rank"),
        (raw_array(shape=[3]), "INVALID_ARGUMENT", "needs 12 bytes, got 8"),
        (raw_array(shape=[1]), "INVALID_ARGUMENT", "needs 4 bytes, got 8"),
        (raw_array(data="text"), "INVALID_ARGUMENT", "binary"),
        (raw_array(shape=[2**20, 2**20]), "RESOURCE_EXHAUSTED", "over the cap"),
        (raw_array(shape=[0, 2**62], data=b""), "RESOURCE_EXHAUSTED", "dimension"),
        (raw_array(dtype="bool", shape=[2], data=b"\x01\x02"), "INVALID_ARGUMENT", "bool"),
    ],
)
def test_decode_array_rejects(obj: object, code: str, match: str) -> None:
    with rejects(code, match):
        decode_array(obj)


def test_decode_array_byte_cap_before_allocating() -> None:
    with rejects("RESOURCE_EXHAUSTED", "over the cap of 16"):
        decode_array(raw_array(shape=[5], data=bytes(20)), max_bytes=16)
    assert decode_array(raw_array(shape=[4], data=bytes(16)), max_bytes=16).shape == (4,)


# --------------------------------------------------------------------------- batches


@pytest.mark.parametrize("codec", [Codec.MSGPACK, Codec.MSGPACK_ZLIB, "msgpack", "msgpack+zlib", 1, 2])
def test_batch_round_trip(codec: object) -> None:
    batch = make_batch()
    back = decode_batch(encode_batch(batch, codec), codec, SPEC, N)
    assert list(back) == list(SPEC)
    for name, array in batch.items():
        np.testing.assert_array_equal(back[name], array)
        assert back[name].dtype == SPEC[name][1]


def test_batch_spec_accepts_torch_and_str_dtypes() -> None:
    spec = {"obs": ([4], torch.float32), "action": ((), "int64"), "reward": ((), np.float32),
            "done": ((), torch.bool)}
    back = decode_batch(encode_batch(make_batch()), Codec.MSGPACK, spec, N, writable=True)
    assert all(a.flags.writeable for a in back.values())


def test_codec_parse_and_labels() -> None:
    assert Codec.parse("CODEC_MSGPACK_ZLIB") is Codec.MSGPACK_ZLIB
    assert [c.label for c in (Codec.MSGPACK, Codec.MSGPACK_ZLIB)] == ["msgpack", "msgpack+zlib"]
    for bad in (0, 3, "gzip", "unspecified", None):
        with rejects(match="codec"):
            Codec.parse(bad)


def test_batch_missing_and_unknown_fields_are_named() -> None:
    batch = make_batch()
    del batch["reward"]
    batch["bonus"] = np.zeros(N, np.float32)
    with rejects(match="missing fields: reward; unknown fields: bonus"):
        decode_batch(encode_batch(batch), Codec.MSGPACK, SPEC, N)


def test_batch_wrong_dtype() -> None:
    batch = make_batch()
    batch["obs"] = batch["obs"].astype(np.float64)
    with rejects(match="'obs' has dtype float64, expected float32"):
        decode_batch(encode_batch(batch), Codec.MSGPACK, SPEC, N)


def test_batch_wrong_leading_dim_and_trailing_shape() -> None:
    with rejects(match=r"'obs' has shape \(5, 4\), expected \(6, 4\)"):
        decode_batch(encode_batch(make_batch()), Codec.MSGPACK, SPEC, N + 1)
    batch = make_batch()
    batch["obs"] = np.zeros((N, 3), np.float32)
    with rejects(match=r"expected \(5, 4\)"):
        decode_batch(encode_batch(batch), Codec.MSGPACK, SPEC, N)


@pytest.mark.parametrize("n", [0, -1, 2.0])
def test_batch_bad_num_transitions(n: object) -> None:
    with rejects(match="num_transitions"):
        decode_batch(encode_batch(make_batch()), Codec.MSGPACK, SPEC, n)


@pytest.mark.parametrize("value, word", [(np.nan, "NaN"), (np.inf, "inf"), (-np.inf, "inf")])
def test_batch_non_finite(value: float, word: str) -> None:
    batch = make_batch()
    batch["reward"][2] = value
    with rejects(match=f"'reward' contains {word}"):
        decode_batch(encode_batch(batch), Codec.MSGPACK, SPEC, N)


def test_batch_field_errors_name_the_field() -> None:
    payload = packed({**{k: encode_array(v) for k, v in make_batch().items()},
                      "obs": raw_array(dtype="complex64")})
    with rejects(match="field 'obs': unknown dtype"):
        decode_batch(payload, Codec.MSGPACK, SPEC, N)


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"\x92\x01", packed([1, 2]), packed(7),
                                     packed({"obs": 1}), b"\x81\xa3obs" + b"\xdb" + b"\xff" * 4])
def test_batch_garbage(payload: bytes) -> None:
    with rejects():
        decode_batch(payload, Codec.MSGPACK, SPEC, N)


def test_batch_not_a_map_of_fields() -> None:
    with rejects(match="must be a map of fields"):
        decode_batch(packed([1]), Codec.MSGPACK, SPEC, N)


def test_batch_compressed_size_cap() -> None:
    payload = encode_batch(make_batch())
    with rejects("RESOURCE_EXHAUSTED", "over the cap"):
        decode_batch(payload, Codec.MSGPACK, SPEC, N, max_bytes=len(payload) - 1)
    assert decode_batch(payload, Codec.MSGPACK, SPEC, N, max_bytes=len(payload))


def test_zlib_bomb_is_capped() -> None:
    bomb = zlib.compress(bytes(64 * 2**20), 9)  # 64 MiB of zeros in ~64 KiB
    assert len(bomb) < 2**20
    with rejects("RESOURCE_EXHAUSTED", "decompressed payload exceeds"):
        decode_batch(bomb, Codec.MSGPACK_ZLIB, SPEC, N, max_bytes=2**20)


def test_zlib_exact_cap_passes_and_zero_cap_is_not_unlimited() -> None:
    payload = encode_batch(make_batch(), Codec.MSGPACK_ZLIB)
    size = len(zlib.decompress(payload))
    assert decode_batch(payload, Codec.MSGPACK_ZLIB, SPEC, N, max_bytes=size)
    with rejects("RESOURCE_EXHAUSTED"):
        decode_batch(payload, Codec.MSGPACK_ZLIB, SPEC, N, max_bytes=size - 1)
    with rejects("RESOURCE_EXHAUSTED"):
        decode_batch(payload, Codec.MSGPACK_ZLIB, SPEC, N, max_bytes=0)


@pytest.mark.parametrize("mangle, match", [
    (lambda p: b"not zlib" + p, "not valid zlib"),
    (lambda p: p[:-3], "truncated"),
    (lambda p: p + b"junk", "trailing"),
])
def test_zlib_garbage(mangle, match: str) -> None:
    payload = mangle(encode_batch(make_batch(), Codec.MSGPACK_ZLIB))
    with rejects(match=match):
        decode_batch(payload, Codec.MSGPACK_ZLIB, SPEC, N)


def test_batch_unspecified_codec() -> None:
    with rejects(match="unspecified"):
        decode_batch(encode_batch(make_batch()), 0, SPEC, N)


def test_priorities() -> None:
    assert decode_priorities([], 3) is None
    np.testing.assert_array_equal(decode_priorities([0.0, 1.0, 2.0], 3), [0, 1, 2])
    for bad in ([1.0, 2.0], [1.0, -1.0, 0.0], [1.0, float("nan"), 0.0], [float("inf")] * 3):
        with rejects():
            decode_priorities(bad, 3)


# --------------------------------------------------------------------------- state dicts


def small_model_state() -> dict[str, torch.Tensor]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    return model.state_dict()


def test_state_dict_round_trip_into_model() -> None:
    state = small_model_state()
    back = decode_state_dict(encode_state_dict(state), expected=state_dict_spec(state))
    assert list(back) == list(state)
    for name, tensor in state.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor)
        assert back[name].numpy().flags.writeable
    back_any = decode_state_dict(encode_state_dict(state))
    assert set(back_any) == set(state)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    model.load_state_dict(back)


def test_state_dict_requires_grad_and_rejects_unlisted_dtype() -> None:
    assert decode_state_dict(encode_state_dict({"w": torch.ones(2, requires_grad=True)}))["w"].sum() == 2
    with rejects(match="bfloat16"):
        encode_state_dict({"w": torch.ones(2, dtype=torch.bfloat16)})


@pytest.mark.parametrize("change, match", [
    (lambda s: s.pop("0.bias"), "missing parameters: 0.bias"),
    (lambda s: s.update(extra=torch.zeros(1)), "unknown parameters: extra"),
    (lambda s: s.update({"0.weight": torch.zeros(8, 5)}), r"'0.weight' is float32\[8, 5\], expected float32\[8, 4\]"),
    (lambda s: s.update({"0.weight": torch.zeros(8, 4, dtype=torch.float64)}), "float64"),
])
def test_state_dict_mismatch(change, match: str) -> None:
    state = small_model_state()
    expected = state_dict_spec(state)
    state = dict(state)
    change(state)
    with rejects("FAILED_PRECONDITION", match):
        decode_state_dict(encode_state_dict(state), expected=expected)


def test_state_dict_garbage_and_caps() -> None:
    for payload in (b"", b"\xc1", packed([1]), packed({"w": [1]}), packed({b"w": raw_array()}),
                    packed({"w": raw_array(shape=[9])})):
        with rejects():
            decode_state_dict(payload)
    payload = encode_state_dict({"w": torch.zeros(100)})
    with rejects("RESOURCE_EXHAUSTED"):
        decode_state_dict(payload, max_bytes=len(payload) - 1)
    with rejects(match="must be bytes"):
        decode_state_dict("text")  # type: ignore[arg-type]


def test_large_state_dict_chunked_round_trip() -> None:
    gen = torch.Generator().manual_seed(0)
    state = {f"layer{i}.weight": torch.randn(1024, 1024, generator=gen) for i in range(6)}
    state["steps"] = torch.tensor(7)
    payload = encode_state_dict(state)
    assert len(payload) > 20 * 2**20
    chunks = split_chunks(payload, 4 * 2**20)
    assert len(chunks) == -(-len(payload) // (4 * 2**20)) and all(isinstance(c, bytes) for c in chunks)
    assembler = ChunkAssembler(max_total_bytes=64 * 2**20)
    results = [assembler.add(9, i, len(chunks), len(payload), c) for i, c in enumerate(chunks)]
    assert results[:-1] == [None] * (len(chunks) - 1) and results[-1] == payload
    back = decode_state_dict(results[-1], max_bytes=64 * 2**20, expected=state_dict_spec(state))
    assert all(torch.equal(back[k], v) for k, v in state.items())


# --------------------------------------------------------------------------- chunks


def test_split_chunks_edges() -> None:
    assert split_chunks(b"", 4) == [b""]
    assert split_chunks(b"abcdefghij", 4) == [b"abcd", b"efgh", b"ij"]
    assert split_chunks(bytearray(b"abcd"), 4) == [b"abcd"]
    with pytest.raises(ValueError):
        split_chunks(b"abc", 0)


def test_assembler_empty_and_single_chunk() -> None:
    assembler = ChunkAssembler()
    assert assembler.add(1, 0, 1, 0, b"") == b""
    assert assembler.add(2, 0, 1, 3, b"abc") == b"abc"
    assert assembler.latest_version == 2


def test_assembler_newer_version_drops_incomplete_older_and_ignores_stale() -> None:
    assembler = ChunkAssembler()
    assert assembler.add(1, 0, 2, 4, b"ab") is None
    assert assembler.add(2, 0, 2, 4, b"wx") is None
    assert assembler.dropped_versions == 1
    assert assembler.add(1, 1, 2, 4, b"cd") is None  # stale: ignored
    assert assembler.add(2, 1, 2, 4, b"yz") == b"wxyz"
    assert assembler.add(1, 0, 1, 1, b"a") is None


@pytest.mark.parametrize("chunks, code, match", [
    ([(1, 0, 1, 100, b"x")], "RESOURCE_EXHAUSTED", "over the cap"),
    ([(1, 0, 0, 4, b"")], "INVALID_ARGUMENT", "chunk_count 0"),
    ([(1, 0, 5, 4, b"")], "INVALID_ARGUMENT", "chunk_count 5"),
    ([(1, 2, 2, 4, b"ab")], "INVALID_ARGUMENT", "out of range"),
    ([(1, 1, 2, 4, b"ab")], "INVALID_ARGUMENT", "starts at chunk 1"),
    ([(1, 0, 2, 4, b"ab"), (1, 1, 3, 4, b"cd")], "INVALID_ARGUMENT", "changed chunk_count"),
    ([(1, 0, 2, 4, b"ab"), (1, 1, 2, 5, b"cd")], "INVALID_ARGUMENT", "changed chunk_count"),
    ([(1, 0, 3, 6, b"ab"), (1, 2, 3, 6, b"cd")], "INVALID_ARGUMENT", "expected 1"),
    ([(1, 0, 2, 4, b"ab"), (1, 0, 2, 4, b"ab")], "INVALID_ARGUMENT", "expected 1"),
    ([(1, 0, 2, 4, b"abc"), (1, 1, 2, 4, b"de")], "INVALID_ARGUMENT", "exceed total_bytes"),
    ([(1, 0, 2, 4, b"a"), (1, 1, 2, 4, b"b")], "INVALID_ARGUMENT", "add up to 2, not 4"),
])
def test_assembler_rejects(chunks: list[tuple], code: str, match: str) -> None:
    assembler = ChunkAssembler(max_total_bytes=64)
    with rejects(code, match):
        for chunk in chunks:
            assembler.add(*chunk)
    assert assembler.add(5, 0, 1, 2, b"ok") == b"ok"  # a broken version leaves it usable


# --------------------------------------------------------------------------- properties

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["dtype", "shape", "data", "obs", "x"]), children, max_size=4),
    max_leaves=12,
)
array_like_maps = st.fixed_dictionaries({
    "dtype": st.sampled_from([*DTYPES, "complex64", "", "float"]) | st.integers(-(2**63), 2**64 - 1),
    "shape": st.lists(st.integers(-3, 2**64 - 1) | st.booleans() | st.floats(), max_size=MAX_RANK + 2),
    "data": st.binary(max_size=64) | st.text(max_size=4),
})


@FUZZ
@given(st.binary(max_size=256), st.sampled_from([Codec.MSGPACK, Codec.MSGPACK_ZLIB]))
def test_fuzz_decode_batch_bytes(payload: bytes, codec: Codec) -> None:
    try:
        decode_batch(payload, codec, SPEC, N, max_bytes=1024)
    except WireError:
        pass


@FUZZ
@given(st.dictionaries(st.sampled_from([*SPEC, "x"]), array_like_maps | msgpack_values, max_size=5),
       st.integers(1, 4))
def test_fuzz_decode_batch_structured(fields: dict, n: int) -> None:
    try:
        decode_batch(packed(fields), Codec.MSGPACK, SPEC, n, max_bytes=4096)
    except WireError:
        pass


@FUZZ
@given(array_like_maps | msgpack_values)
def test_fuzz_decode_array(obj: object) -> None:
    try:
        decode_array(msgpack.unpackb(packed(obj), strict_map_key=False), max_bytes=4096)
    except WireError:
        pass


@FUZZ
@given(st.binary(max_size=256) | st.builds(packed, st.dictionaries(st.text(max_size=3), array_like_maps)))
def test_fuzz_decode_state_dict(payload: bytes) -> None:
    try:
        decode_state_dict(payload, max_bytes=4096, expected=None)
        decode_state_dict(payload, max_bytes=4096, expected={"w": ((2,), torch.float32)})
    except WireError:
        pass


@FUZZ
@given(st.lists(st.tuples(st.integers(-2, 3), st.integers(-1, 3), st.integers(-1, 3),
                          st.integers(-1, 8), st.binary(max_size=4)), max_size=8))
def test_fuzz_assembler(chunks: list[tuple]) -> None:
    assembler = ChunkAssembler(max_total_bytes=6)
    for chunk in chunks:
        try:
            out = assembler.add(*chunk)
        except WireError:
            continue
        assert out is None or len(out) == chunk[3]


@FUZZ
@given(st.sampled_from(sorted(DTYPES)), st.lists(st.integers(0, 3), max_size=4), st.data())
def test_property_array_round_trip(name: str, shape: list[int], data: st.DataObject) -> None:
    nbytes = int(np.prod(shape)) * DTYPES[name].itemsize
    raw = data.draw(st.binary(min_size=nbytes, max_size=nbytes))
    if name == "bool":
        raw = bytes(b & 1 for b in raw)
    array = np.frombuffer(raw, DTYPES[name]).reshape(shape)
    back = decode_array(msgpack.unpackb(msgpack.packb(encode_array(array))))
    assert back.tobytes() == array.tobytes() and back.shape == array.shape


@pytest.mark.parametrize("size", [0, 1, 127, 128, 16_383, 16_384, 1 << 20])
def test_encode_batch_message_matches_protobuf(size):
    """The spliced encoding parses to exactly the message protobuf itself would build."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    data = wire.encode_batch_message(2**40 + 3, 7, 12, payload, "msgpack+zlib", [0.5, 1.5])
    expected = learner_pb2.ActorMessage(batch=learner_pb2.TrajectoryBatch(
        seq=2**40 + 3, policy_version=7, num_transitions=12, payload=payload,
        codec=int(wire.Codec.MSGPACK_ZLIB), priorities=[0.5, 1.5]))
    assert learner_pb2.ActorMessage.FromString(data) == expected
