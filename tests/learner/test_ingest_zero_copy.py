"""The learner's zero-copy ingest path: a large batch's payload is cut out of the protobuf parse and its
arrays are views of the received bytes; it decodes, stores and refuses exactly as the copying path does."""

from __future__ import annotations

import random

import msgpack
import numpy as np
import pytest

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.streaming.service import Received, parse_actor_message, parse_keeping_payload
from actorlearner.wire import batches
from actorlearner.wire.arrays import ZERO_COPY_MIN_BYTES, unpack_array_maps
from streams import RawStream, batch, hello

SPEC = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
        "discount": ((), np.float32), "next_obs": ((4,), np.float32)}
BIG = 5000  # transitions: a 240 KB payload, past ZERO_COPY_MIN_BYTES


def payload(n: int = BIG) -> bytes:
    return batch(1, n).batch.payload


def plain(obj):
    """``obj`` with every view as bytes, to compare with what msgpack returns."""
    return {k: {kk: bytes(vv) if kk == "data" else vv for kk, vv in v.items()} for k, v in obj.items()}


def test_the_common_layout_unpacks_to_views_equal_to_msgpack():
    data = payload()
    assert len(data) >= ZERO_COPY_MIN_BYTES
    fast = unpack_array_maps(data, 13)
    assert plain(fast) == msgpack.unpackb(data, raw=False)
    assert all(isinstance(v["data"], memoryview) for v in fast.values())
    wide = wire.encode_batch({"x": np.zeros((70_000, 1, 2), np.uint8), "y": np.arange(3, dtype=np.uint64)})
    assert plain(unpack_array_maps(wide, 10)) == msgpack.unpackb(wide, raw=False)  # 16- and 32-bit lengths


@pytest.mark.parametrize("obj", [
    [1, 2], {"a": {"dtype": "uint8", "shape": [-1], "data": b""}}, {1: {}},
    {"a": {"dtype": "uint8", "shape": [1], "data": b"x", "extra": 1}}, {"a": {"dtype": "uint8", "shape": [1]}},
    {"a": {"dtype": "uint8", "shape": [1.0], "data": b"x"}}, {"a": {"dtype": 3, "shape": [1], "data": b"x"}},
])
def test_anything_else_is_left_to_msgpack(obj):
    assert unpack_array_maps(msgpack.packb(obj), 10) is None
    assert unpack_array_maps(payload() + b"\x00", 13) is None  # trailing bytes
    assert unpack_array_maps(payload()[:-1], 13) is None  # truncated data


def test_mutated_large_payloads_decode_or_fail_as_the_copying_path_does(monkeypatch):
    rng = random.Random(0)
    good = payload(2000)
    for _ in range(300):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(0, 200) if rng.random() < 0.8 else rng.randrange(len(data))] = rng.randrange(256)
        outcomes = []
        for threshold in (ZERO_COPY_MIN_BYTES, 1 << 40):
            monkeypatch.setattr(batches, "ZERO_COPY_MIN_BYTES", threshold)
            try:
                arrays = wire.decode_batch(bytes(data), wire.Codec.MSGPACK, SPEC, 2000)
                outcomes.append({k: (a.dtype, a.tobytes()) for k, a in arrays.items()})
            except wire.WireError as exc:
                outcomes.append((exc.code, str(exc)))
        assert outcomes[0] == outcomes[1]


def test_a_large_batch_is_split_and_a_small_one_or_garbage_is_left_whole():
    message = batch(7, BIG)
    message.actor_id = "behind-a-relay"
    message.batch.priorities.extend([1.0] * BIG)
    data = message.SerializeToString()
    received = parse_keeping_payload(data)
    assert isinstance(received, Received) and bytes(received.payload) == message.batch.payload
    message.batch.payload = b""
    assert received.message == message
    small = batch(1, 16).SerializeToString()
    assert parse_keeping_payload(small) == Received(parse_actor_message(small), None)
    assert isinstance(parse_keeping_payload(data[:-3]), wire.WireError)


def test_a_large_batch_through_the_server_is_stored_and_a_bad_one_refused():
    learner = Learner(LearnerConfig(env="CartPole-v1", replay_capacity=20_000, eval_every=0,
                                    min_replay_size=10**9, max_message_bytes=16 << 20))
    with serve(learner, "127.0.0.1", 0) as port:
        stream = RawStream(f"127.0.0.1:{port}", hello("big"), batch(1, BIG, tag=3.0))
        assert stream.next("ack").ack.seq == 1
        sample = learner.replay.sample(64)
        obs = sample.data["obs"].numpy()
        assert (obs[:, 0] == 1).all() and (obs[:, 2] == 3.0).all()
        assert sorted(obs[:, 1].astype(int).tolist()) == sorted(sample.indices.tolist())
        bad = batch(2, BIG)
        bad.batch.num_transitions = BIG + 1
        stream.send(bad)
        code, details = stream.wait_end()
        assert code.name == "INVALID_ARGUMENT" and "shape" in details
        stream.close()
        assert len(learner.replay) == BIG
