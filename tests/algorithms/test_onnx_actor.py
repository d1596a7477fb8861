"""An actor that asks for its policy as ONNX (``Hello.policy_format = "onnx"``) runs the learner's greedy
policy with onnxruntime alone; the learner exports only while such a stream is open, once per version."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import torch
from procs import CHILD_ENV, WITHOUT_ACTORLEARNER, wait_until
from streams import RawStream, batch, hello

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.v1 import learner_pb2 as pb

# Runs the model bytes on CartPole observations where ``import actorlearner`` fails, with nothing but what
# learner.proto says: input "obs" (then any "state/NAME", zeros at an episode's start), output "action".
CHILD = WITHOUT_ACTORLEARNER + """
import numpy as np
import onnxruntime

model, observations, written = sys.argv[1:]
session = onnxruntime.InferenceSession(open(model, "rb").read(), providers=["CPUExecutionProvider"])
obs = np.load(observations)
inputs = [i.name for i in session.get_inputs()]
assert inputs[0] == "obs" and all(name.startswith("state/") for name in inputs[1:])
assert session.get_outputs()[0].name == "action"
states = {i.name: np.zeros((len(obs), i.shape[1]), np.float32) for i in session.get_inputs()[1:]}  # episode start
np.save(written, session.run(["action"], {"obs": obs, **states})[0])
assert "torch" not in sys.modules
"""


def onnx_hello(actor_id: str) -> pb.ActorMessage:
    message = hello(actor_id)
    message.hello.policy_format = "onnx"
    return message


def next_model(stream: RawStream, after: int = -1) -> tuple[int, bytes]:
    """The next whole policy the stream receives of a version above ``after``: (version, payload)."""
    assembler = wire.ChunkAssembler()
    while True:
        update = stream.next("policy_update").policy_update
        payload = assembler.add(update.version, update.chunk_index, update.chunk_count, update.total_bytes,
                                update.payload)
        if payload is not None and update.version > after:
            return update.version, payload


def onnx_actions(tmp_path, model: bytes, observations: np.ndarray) -> np.ndarray:
    (tmp_path / "model.onnx").write_bytes(model)
    np.save(tmp_path / "obs.npy", observations)
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "model.onnx"), str(tmp_path / "obs.npy"),
                           str(tmp_path / "actions.npy")], capture_output=True, text=True, timeout=60, env=CHILD_ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return np.load(tmp_path / "actions.npy")


def learner_policy(learner: Learner):
    """A policy acting with the learner's current weights."""
    policy = learner.trainer.spec.make_policy()
    policy.load_policy_state_dict(learner.trainer.policy_state_dict())
    return policy


def scramble(learner: Learner, seed: int) -> None:
    """Large random weights and a new published version, so that greedy actions vary with the observation."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in learner.trainer.online.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 2 / max(param[0].numel(), 1) ** 0.5)
    learner.progress.version += 1
    learner.training.publish(); learner.publishing.flush()


def test_an_onnx_actor_runs_each_new_version_as_the_learner_s_greedy_policy_without_actorlearner(tmp_path):
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, replay_capacity=1000,
                                    algorithm_config={"hidden_sizes": (32, 32)}))
    observations = np.random.default_rng(0).normal(0, 1.5, (256, 4)).astype(np.float32)
    with serve(learner, "127.0.0.1", 0) as port:
        scramble(learner, 1)
        assert learner.onnx_feed.exports == 0  # no ONNX stream yet: nothing exported
        stream = RawStream(f"127.0.0.1:{port}", onnx_hello("onnx-actor"))
        welcome = stream.next("welcome").welcome  # sent once the model of the version it names is ready
        assert welcome.policy_version == learner.version == 1 and learner.onnx_feed.exports == 1
        assert not welcome.settings.actor_priorities  # the model returns actions only: the learner prioritizes
        version, model = next_model(stream)
        assert version == 1
        stream.send(batch(1, priorities=False))
        assert stream.next("ack").ack.accepted
        actions = onnx_actions(tmp_path, model, observations)
        np.testing.assert_array_equal(actions, learner_policy(learner).act(observations, 0.0))
        assert 0 < actions.mean() < 1  # both actions occur: the comparison says something

        scramble(learner, 2)  # a new version: the same graph with the new weights, not a new export
        version, model = next_model(stream, after=version)
        assert version == 2 and learner.onnx_feed.exports == 1
        np.testing.assert_array_equal(onnx_actions(tmp_path, model, observations),
                                      learner_policy(learner).act(observations, 0.0))

        second = RawStream(f"127.0.0.1:{port}", onnx_hello("onnx-actor-2"))  # joins: gets version 2 as it is
        assert second.next("welcome").welcome.policy_version == 2 and next_model(second)[0] == 2
        serialized = learner.onnx_feed.broadcast.serializations
        scramble(learner, 3)
        assert next_model(stream, after=2)[0] == next_model(second, after=2)[0] == 3
        assert learner.onnx_feed.broadcast.serializations == serialized + 1  # once for both streams

        state_dict_stream = RawStream(f"127.0.0.1:{port}", hello("state-dict-actor"))
        assert state_dict_stream.next("welcome").welcome.settings.actor_priorities
        assert wire.decode_state_dict(next_model(state_dict_stream)[1])  # the others still get state dicts
        for opened in (stream, second, state_dict_stream):
            opened.close()
        wait_until(lambda: learner.onnx_feed._streams == 0, 30, "the ONNX streams to close")
        scramble(learner, 4)
        scramble(learner, 5)
        assert learner.onnx_feed.broadcast.version == 3  # nobody asks: nothing exported
    learner.stop()


def test_an_unknown_policy_format_is_refused():
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, replay_capacity=1000))
    with serve(learner, "127.0.0.1", 0) as port:
        message = hello("odd")
        message.hello.policy_format = "tflite"
        stream = RawStream(f"127.0.0.1:{port}", message)
        assert stream.ended.wait(30)
        assert stream.code.name == "INVALID_ARGUMENT" and "policy_format 'tflite' is not one of" in stream.details
    learner.stop()


def test_onnx_is_refused_by_a_learner_whose_algorithm_cannot_export():
    learner = Learner(LearnerConfig(env="custom_envs:frozen_lake", eval_every=0, replay_capacity=1000,
                                    algorithm="plugin_algorithm:TabularQ"))
    assert learner.onnx_feed is None
    with serve(learner, "127.0.0.1", 0) as port:
        message = pb.ActorMessage(hello=pb.Hello(actor_id="onnx-actor", protocol_version=wire.PROTOCOL_VERSION,
                                                 env_spec=learner.env_spec, policy_version=-1, policy_format="onnx"))
        stream = RawStream(f"127.0.0.1:{port}", message)
        assert stream.ended.wait(30)
        assert stream.code.name == "FAILED_PRECONDITION" and "has no export_policy" in stream.details
    learner.stop()


def test_a_recurrent_policy_whose_graph_folds_weights_is_exported_again_for_each_version(tmp_path):
    learner = Learner(LearnerConfig(env="CartPole-v1", algorithm="r2d2", eval_every=0, replay_capacity=1000,
                                    algorithm_config={"hidden_sizes": (32,), "core_size": 16}))
    observations = np.random.default_rng(1).normal(0, 1.5, (64, 4)).astype(np.float32)
    learner.onnx_feed.subscribe()  # as an ONNX stream does
    try:
        for seed in (1, 2):
            scramble(learner, seed)
            wait_until(lambda: learner.onnx_feed.broadcast.version == learner.version, 60, "the ONNX version")
            actions = onnx_actions(tmp_path, learner.onnx_feed.broadcast.payload, observations)
            policy = learner_policy(learner)
            policy.reset_memory(np.ones(len(observations), bool))
            np.testing.assert_array_equal(actions, policy.act(observations, 0.0))
            assert 0 < actions.mean() < 1
        # An LSTM's two biases fold into one constant: every version it sent was a whole export.
        assert learner.onnx_feed.exports == learner.onnx_feed.broadcast.serializations >= 2
    finally:
        learner.onnx_feed.unsubscribe()
        learner.stop()
