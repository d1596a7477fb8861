"""The committed generated code is fresh, and the contract's messages round-trip."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures
from importlib.metadata import version
from pathlib import Path

import grpc
import gymnasium as gym
import numpy as np

from actorlearner import specs, wire
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
PROTOS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "proto" / "actorlearner" / "v1").glob("*.proto"))
GENERATED = [f"{Path(p).stem}{suffix}" for p in PROTOS for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")]


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    """Regenerating from the .proto gives byte-identical files to the committed ones."""
    cmd = [sys.executable, "-m", "grpc_tools.protoc", "-Iproto", f"--python_out={tmp_path}",
           f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}", *PROTOS]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    for name in GENERATED:
        fresh = (tmp_path / "actorlearner" / "v1" / name).read_bytes()
        committed = (ROOT / "actorlearner" / "v1" / name).read_bytes()
        assert fresh == committed, (
            f"actorlearner/v1/{name} is stale: run `make proto` and commit the result "
            f"(grpcio-tools here is {version('grpcio-tools')}; pyproject pins the one to use)"
        )


def test_codec_enum_matches_wire() -> None:
    """wire.Codec and the proto enum agree on names and values."""
    assert {f"CODEC_{c.name}": c.value for c in wire.Codec} == dict(pb.Codec.items())


def test_actor_messages_round_trip() -> None:
    """Every ActorMessage kind survives serialize/parse with its oneof set."""
    spec = specs.env_spec("CartPole-v1", gym.spaces.Box(-1.0, 1.0, (4,), np.float32), gym.spaces.Discrete(2))
    fields = [pb.FieldSpec(name="obs", dtype="float32", shape=[4]), pb.FieldSpec(name="action", dtype="int64")]
    messages = [
        pb.ActorMessage(hello=pb.Hello(actor_id="a0", protocol_version=wire.PROTOCOL_VERSION,
                                       env_spec=spec, algorithm="dqn", batch_fields=fields, policy_version=-1)),
        pb.ActorMessage(batch=pb.TrajectoryBatch(seq=7, policy_version=3, num_transitions=2,
                                                 payload=b"\x80", codec=pb.CODEC_MSGPACK_ZLIB,
                                                 priorities=[0.5, 1.5])),
        pb.ActorMessage(episode_stats=pb.EpisodeStats(returns=[10.0], lengths=[10], env_steps=12,
                                                      policy_version=3)),
    ]
    for kind, msg in zip(["hello", "batch", "episode_stats"], messages):
        back = pb.ActorMessage.FromString(msg.SerializeToString())
        assert back == msg and back.WhichOneof("kind") == kind
    assert back.episode_stats.lengths == [10]
    hello = pb.ActorMessage.FromString(messages[0].SerializeToString()).hello
    assert specs.spaces_from_spec(hello.env_spec)[1] == gym.spaces.Discrete(2) and list(hello.batch_fields) == fields


def test_learner_messages_round_trip() -> None:
    """Every LearnerMessage kind survives serialize/parse with its oneof set."""
    settings = pb.Settings(batch_size=64, max_unacked=8, codec=pb.CODEC_MSGPACK, actor_priorities=True,
                           num_actors=4, actor_index=1, max_message_bytes=4 << 20, algorithm="dqn",
                           algorithm_config='{"n_step": 3, "gamma": 0.99}')
    fields = [pb.FieldSpec(name="obs/camera", dtype="uint8", shape=[84, 84, 3])]
    messages = {
        "welcome": pb.LearnerMessage(welcome=pb.Welcome(learner_id="L", policy_version=5,
                                                        settings=settings, batch_fields=fields)),
        "policy_update": pb.LearnerMessage(policy_update=pb.PolicyUpdate(
            version=5, chunk_index=0, chunk_count=1, total_bytes=3, payload=b"abc")),
        "ack": pb.LearnerMessage(ack=pb.Ack(seq=7, accepted=False, reason="bad dtype")),
        "shutdown": pb.LearnerMessage(shutdown=pb.Shutdown(reason="drain")),
    }
    for kind, msg in messages.items():
        back = pb.LearnerMessage.FromString(msg.SerializeToString())
        assert back == msg and back.WhichOneof("kind") == kind
    status = pb.StatusResponse(policy_version=5, updates=10, buffer_size=100, inserted=4,
                               insert_rate=1.5, sample_rate=2.5,
                               actors=[pb.ActorStatus(actor_id="a0", policy_version=4, lag=1,
                                                      batches_per_second=0.5,
                                                      last_seen_unix=1.7e9, connected=True)])
    assert pb.StatusResponse.FromString(status.SerializeToString()) == status


class _EchoLearner(pb_grpc.LearnerServicer):
    """Welcomes a Hello and acks each batch: enough to exercise the generated stubs."""

    def Connect(self, request_iterator, context):
        for msg in request_iterator:
            if msg.WhichOneof("kind") == "hello":
                yield pb.LearnerMessage(welcome=pb.Welcome(learner_id="L", policy_version=0))
            elif msg.WhichOneof("kind") == "batch":
                yield pb.LearnerMessage(ack=pb.Ack(seq=msg.batch.seq, accepted=True))

    def GetStatus(self, request, context):
        return pb.StatusResponse(policy_version=9)


def test_stubs_over_loopback() -> None:
    """The generated service works end to end over a real loopback channel."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_LearnerServicer_to_server(_EchoLearner(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.LearnerStub(channel)
            assert stub.GetStatus(pb.StatusRequest(), timeout=10).policy_version == 9
            up = [pb.ActorMessage(hello=pb.Hello(actor_id="a0", protocol_version=1))]
            up += [pb.ActorMessage(batch=pb.TrajectoryBatch(seq=s)) for s in (1, 2)]
            down = list(stub.Connect(iter(up), timeout=10))
            assert [m.WhichOneof("kind") for m in down] == ["welcome", "ack", "ack"]
            assert [m.ack.seq for m in down[1:]] == [1, 2]
    finally:
        server.stop(None)
