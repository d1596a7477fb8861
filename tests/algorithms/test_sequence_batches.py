"""Sequence batches (R2D2) on a live learner: stored exactly once and intact; bad ones refused, nothing stored."""

from __future__ import annotations

import grpc
import msgpack
import numpy as np
import pytest

from actorlearner import wire
from actorlearner.algorithms.r2d2 import R2D2Config
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.v1 import learner_pb2 as pb
from streams import RawStream

N = 3  # sequences per batch
LENGTH = 8


@pytest.fixture(scope="module")
def live():
    """An R2D2 learner on the memory task that never trains (so the replay holds exactly what arrived)."""
    learner = Learner(LearnerConfig(env="custom_envs:memory_cue", algorithm="r2d2", eval_every=0,
                                    replay_capacity=1000, min_replay_size=1000, batch_size=32,
                                    algorithm_config=R2D2Config(sequence_length=LENGTH, overlap=4, burn_in=2,
                                                                core_size=16, hidden_sizes=(16,))))
    with serve(learner, "127.0.0.1", 0) as port:
        yield learner, f"127.0.0.1:{port}"


def hello(learner: Learner, actor_id: str) -> pb.ActorMessage:
    return pb.ActorMessage(hello=pb.Hello(actor_id=actor_id, protocol_version=wire.PROTOCOL_VERSION, algorithm="r2d2",
                                          env_spec=learner.env_spec, batch_fields=learner.batch_fields,
                                          policy_version=-1))


def sequences(learner: Learner, tag: float, n: int = N) -> dict[str, np.ndarray]:
    """``n`` well-formed sequences whose first observation says (tag, row); the last is padded after 5 steps."""
    fields = {}
    for name, (shape, dtype) in learner.fields.items():
        fields[name] = np.zeros((n, *shape), wire.np_dtype(dtype))
    fields["obs"][:, 0, 0], fields["obs"][:, 0, 1] = tag, np.arange(n)
    fields["mask"][:] = True
    fields["mask"][-1, 5:] = False
    fields["discount"][:] = 0.99 * fields["mask"]
    fields["reward"][:, 4] = 1.0
    fields["first"][0] = True
    fields["state/h"][:] = np.linspace(-1, 1, 16, dtype=np.float32)
    return fields


def message(seq: int, fields: dict[str, np.ndarray] | bytes, n: int = N) -> pb.ActorMessage:
    payload = fields if isinstance(fields, bytes) else wire.encode_batch(fields)
    return pb.ActorMessage.FromString(wire.encode_batch_message(seq, 0, n, payload, wire.Codec.MSGPACK))


def stored(learner: Learner) -> dict[str, np.ndarray]:
    state = learner.replay.buffer.state_dict()
    size = len(learner.replay)
    return {name[len("field."):]: value.numpy()[:size] for name, value in state.items() if name.startswith("field.")}


def test_sequences_are_stored_once_and_intact(live):
    learner, address = live
    before = len(learner.replay)
    stream = RawStream(address, hello(learner, "seq-good"))
    welcome = stream.next("welcome").welcome
    assert [f.name for f in welcome.batch_fields] == [f.name for f in learner.batch_fields]
    sent = sequences(learner, tag=7.0)
    for seq in (1, 1, 2):  # the resend of seq 1 is acked and not stored again
        stream.send(message(seq, sequences(learner, tag=7.0 + (seq == 2))))
        assert stream.next("ack").ack.seq == seq
    stream.close()
    assert len(learner.replay) == before + 2 * N
    rows = stored(learner)
    mine = np.flatnonzero(rows["obs"][:, 0, 0] == 7.0)
    assert len(mine) == N
    for name, value in sent.items():
        np.testing.assert_array_equal(rows[name][mine], value, err_msg=name)


BAD = {
    "a sequence too short": (lambda f: {**f, "obs": f["obs"][:, :LENGTH]}, "expected"),
    "mask as uint8": (lambda f: {**f, "mask": f["mask"].astype(np.uint8)}, "expected bool"),
    "a missing stored state": (lambda f: {k: v for k, v in f.items() if k != "state/c"}, "missing fields: state/c"),
    "NaN in the stored state": (lambda f: {**f, "state/h": np.full_like(f["state/h"], np.nan)}, "'state/h' contains NaN"),
    "inf in the padding": (lambda f: {**f, "obs": np.where(np.arange(LENGTH + 1)[None, :, None] > 6, np.inf,
                                                             f["obs"]).astype(np.float32)}, "'obs' contains inf"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_sequence_batches_are_refused_and_store_nothing(live, case):
    learner, address = live
    change, reason = BAD[case]
    before = len(learner.replay)
    stream = RawStream(address, hello(learner, f"seq-bad-{case}"))
    stream.next("welcome")
    stream.send(message(1, change(sequences(learner, tag=99.0))))
    code, details = stream.wait_end()
    stream.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and reason in details, (code, details)
    assert len(learner.replay) == before


def test_bool_bytes_other_than_zero_and_one_are_refused(live):
    learner, address = live
    fields = {name: wire.encode_array(value) for name, value in sequences(learner, tag=98.0).items()}
    fields["first"] = {**fields["first"], "data": bytes([2] * N)}
    stream = RawStream(address, hello(learner, "seq-bad-bool"))
    stream.next("welcome")
    before = len(learner.replay)
    stream.send(message(1, msgpack.packb(fields, use_bin_type=True)))
    code, details = stream.wait_end()
    stream.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "bool array" in details, (code, details)
    assert len(learner.replay) == before
