"""The algorithm is a plug-in and the contract is enough: no algorithm by name in the actor, the learner,
``run`` or the config; spaces no algorithm can learn from are refused at start; a learner restarted with
another algorithm refuses an actor holding the old one; GetSpec tells a foreign actor everything."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest
from procs import CHILD_ENV, free_port, run_command, start_actor, start_learner, status, stop, wait_until
from streams import RawStream

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

PACKAGE = Path(__file__).resolve().parents[2] / "actorlearner"
FROZEN_LAKE = ["--env", "custom_envs:frozen_lake", "--min-replay-size", "256", "--batch-size", "64",
               "--publish-every", "5", "--eval-every", "0"]


def test_actor_learner_cli_and_config_import_no_algorithm():
    files = [*(PACKAGE / "actor").glob("*.py"), *(PACKAGE / "learner").glob("*.py"),
             *(PACKAGE / "cli").glob("*.py"), *(PACKAGE / "config").glob("*.py")]
    imports = [f"{path.name}: {line.strip()}" for path in files for line in path.read_text().splitlines()
               if re.match(r"\s*(from|import)\s.*dqn", line, re.I)]
    assert len(files) > 6 and imports == []


@pytest.mark.parametrize("env, words", [
    ("Pendulum-v1", ["action space Box(-2.0, 2.0, (1,), float32) is not supported", "continuous actions"]),
    ("custom_envs:text_observation", ["observation space Text(", "is not supported"]),
    ("custom_envs:dict_action", ["action space Dict('move': MultiDiscrete(", "is not supported"]),
])
def test_a_space_no_algorithm_here_learns_from_is_refused_at_learner_start_in_one_line(env, words):
    done = run_command([sys.executable, "-m", "actorlearner", "learner", "--env", env, "--port", "0"], timeout=120,
                       env=CHILD_ENV)
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and all(word in errors[0] for word in words), done.stderr
    assert "Traceback" not in done.stderr


def test_a_learner_restarted_with_another_algorithm_refuses_the_actor_holding_the_old_one():
    port = free_port()
    first, _ = start_learner(*FROZEN_LAKE, port=port)
    actor = start_actor(port, "holder", "--env", "custom_envs:frozen_lake", "--reconnect-max", "1",
                        stderr=subprocess.PIPE)
    second = None
    try:
        wait_until(lambda: status(port).inserted >= 2, 60, "the dqn learner storing the actor's batches")
        assert stop(first) == [0]
        second, _ = start_learner(*FROZEN_LAKE, "--algorithm", "plugin_algorithm:TabularQ", port=port)
        code = actor.wait(90)
        stderr = actor.stderr.read().decode()
    finally:
        stop(actor, *([second] if second else []))
        first.kill()
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert code == 2, stderr
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert all(word in errors[0] for word in ("FAILED_PRECONDITION", "algorithm 'dqn'",
                                              "runs 'plugin_algorithm:TabularQ'", "restart the actor")), errors[0]


@pytest.fixture(scope="module")
def goal_image_learner():
    learner = Learner(LearnerConfig(env="custom_envs:goal_image", min_replay_size=128, batch_size=64, eval_every=0))
    with serve(learner, "127.0.0.1", 0) as port:
        learner.start()
        yield learner, port
    learner.stop()


def test_get_spec_alone_is_enough_to_stream_batches_and_read_the_policy(goal_image_learner):
    """An actor in another language: GetSpec, then a Hello, batches built from the fields it names, and
    weights laid out as it says; nothing else needs reading."""
    learner, port = goal_image_learner
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        spec = pb_grpc.LearnerStub(channel).GetSpec(pb.LearnerSpecRequest(), timeout=10)
    assert spec.protocol_version == wire.PROTOCOL_VERSION and spec.algorithm == "dqn"
    assert spec.env_spec.observation.WhichOneof("kind") == "dict"
    fields = {f.name: (tuple(f.shape), f.dtype) for f in spec.batch_fields}
    assert fields["obs/image"] == ((5, 5, 1), "uint8") and fields["action"] == ((2,), "int64")
    assert {"obs/noise_tuple/0", "obs/noise_tuple/1", "next_obs/position"} <= set(fields)

    hello = pb.Hello(actor_id="foreign", protocol_version=spec.protocol_version, env_spec=spec.env_spec,
                     policy_version=-1)
    n = 8
    payload = wire.encode_batch({name: np.zeros((n, *shape), dtype) for name, (shape, dtype) in fields.items()})
    raw = RawStream(f"127.0.0.1:{port}", pb.ActorMessage(hello=hello), pb.ActorMessage.FromString(
        wire.encode_batch_message(1, 0, n, payload, wire.Codec.MSGPACK, priorities=[1.0] * n)))
    try:
        welcome = raw.next("welcome").welcome
        assert list(welcome.batch_fields) == list(spec.batch_fields)
        assert (welcome.settings.algorithm, welcome.settings.algorithm_config) == (spec.algorithm,
                                                                                    spec.algorithm_config)
        update = raw.next("policy_update").policy_update
        assert raw.next("ack").ack.seq == 1
    finally:
        raw.close()
    assert update.chunk_count == 1
    state = wire.decode_state_dict(update.payload)
    assert {name: (tuple(t.shape), wire.np_dtype(t.dtype).name) for name, t in state.items()} == {
        f.name: (tuple(f.shape), f.dtype) for f in spec.policy}
