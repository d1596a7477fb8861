"""Learner and actor processes over loopback: versions, lag, late joiners, dead actors, clean stops."""

import json
import signal
import subprocess
import sys

import grpc
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from actorlearner import specs, wire
from actorlearner.envs import make_env
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from procs import FAST_LEARNER, PACED, run_command, start_actor, start_learner, status, stop, wait_until


def actor_versions(port: int) -> dict[str, tuple[int, int, bool]]:
    return {a.actor_id: (a.policy_version, a.lag, a.connected) for a in status(port).actors}


def test_two_actors_train_and_both_end_on_the_newest_version(tmp_path):
    # Once max_updates stops training, the rate limiter holds inserts for good; an actor whose window
    # fills before the last version reaches it can then never report that version (its stream's next
    # message waits behind the held batch). A wide error buffer keeps inserts flowing: this test is
    # about versions, not backpressure.
    learner, port = start_learner(*FAST_LEARNER, "--max-updates", "100", "--checkpoint-dir", str(tmp_path / "ckpt"),
                                  "--logdir", str(tmp_path / "tb"), "--rate-error-buffer", "1e9")
    actors = [start_actor(port, "a0", *PACED), start_actor(port, "a1", "--seed", "1", *PACED)]
    try:
        first = wait_until(lambda: (s := status(port)).policy_version >= 2 and s, 90, "a few versions")
        final = wait_until(lambda: (s := status(port)).updates >= 100 and s, 90, "training to reach max_updates")
        assert final.policy_version >= first.policy_version >= 2  # the first poll may come after training ended
        assert final.policy_version == 100 // 5
        # Lag shows per actor, and both actors catch up with the newest version.
        # Each actor by name: on a busy machine a1 may connect only after a0 alone fed all 100 updates.
        wait_until(lambda: {name: v[:2] for name, v in actor_versions(port).items()}
                   == {"a0": (final.policy_version, 0), "a1": (final.policy_version, 0)}, 60,
                   "both actors to run the newest version with lag 0")
        seen = wait_until(lambda: (s := status(port)).env_steps > 0 and s, 30, "episode statistics (sent each second)")
        assert {a.actor_id for a in seen.actors} == {"a0", "a1"} and all(a.connected for a in seen.actors)
        assert seen.inserted > 0 and seen.buffer_size > 0
        # The status command prints the same numbers as one JSON object.
        out = subprocess.run([sys.executable, "-m", "actorlearner", "status", "--learner", f"127.0.0.1:{port}", "--json"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        doc = json.loads(out.strip().splitlines()[-1])
        assert doc["policy_version"] == final.policy_version and doc["updates"] >= 100
        assert {a["id"] for a in doc["actors"]} == {"a0", "a1"} and all("lag" in a for a in doc["actors"])
        assert doc["buffer_size"] > 0 and doc["inserted"] > 0
        assert all(a["inserted"] > 0 and a["duplicates"] == 0 for a in doc["actors"])  # per actor: stored, resent
    finally:
        codes = stop(*actors, learner)
    assert codes == [0, 0, 0], f"exit codes actors/learner: {codes}"
    assert list((tmp_path / "ckpt").glob("ckpt-*/manifest.json")), "the learner wrote no final checkpoint on SIGTERM"
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"losses/td_loss", "charts/episodic_return", "replay/size", "policy/version", "policy/lag_max"} <= tags


@pytest.fixture(scope="module")
def shared_learner():
    """One learner for the tests that only need one running: (process, port)."""
    proc, port = start_learner(*FAST_LEARNER)
    yield proc, port
    stop(proc)


def test_late_actor_gets_the_current_version_in_welcome(shared_learner):
    learner, port = shared_learner
    early = start_actor(port, "early", *PACED)
    try:
        version = wait_until(lambda: status(port).policy_version >= 3 and status(port).policy_version, 90, "version 3")
        env = make_env("CartPole-v1")
        hello = pb.Hello(actor_id="late", protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn",
                         env_spec=specs.env_spec("CartPole-v1", env.observation_space, env.action_space),
                         policy_version=-1)
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = pb_grpc.LearnerStub(channel).Connect(iter([pb.ActorMessage(hello=hello)]), timeout=30)
            welcome = next(stream)
            update = next(stream)
            stream.cancel()
        assert welcome.WhichOneof("kind") == "welcome"
        assert welcome.welcome.policy_version >= version
        assert update.policy_update.version == welcome.welcome.policy_version
        settings = welcome.welcome.settings
        assert settings.batch_size > 0 and settings.algorithm == "dqn" and json.loads(settings.algorithm_config)["n_step"] == 3
        assert [f.name for f in welcome.welcome.batch_fields] == ["obs", "action", "reward", "discount", "next_obs"]
    finally:
        stop(early)


def test_killing_one_actor_leaves_the_learner_and_the_other_running():
    learner, port = start_learner(*FAST_LEARNER, "--actor-batch-size", "32")  # paced actors' batches come often
    survivor, victim = start_actor(port, "survivor", *PACED), start_actor(port, "victim", "--seed", "7", *PACED)
    try:
        wait_until(lambda: {a.actor_id for a in status(port).actors if a.connected} == {"survivor", "victim"},
                   60, "both actors connected")
        wait_until(lambda: status(port).inserted > 10, 60, "batches flowing")
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        wait_until(lambda: not actor_versions(port)["victim"][2], 30, "the learner to notice the dead actor")
        before = status(port)
        wait_until(lambda: status(port).inserted > before.inserted + 5, 30, "the survivor's batches to keep arriving")
        assert learner.poll() is None and survivor.poll() is None
        assert actor_versions(port)["survivor"][2]
    finally:
        codes = stop(survivor, learner)
    assert codes == [0, 0]


def test_actor_with_a_different_env_is_refused_with_failed_precondition(shared_learner):
    learner, port = shared_learner
    # sync: the default (ahead) would start its env loop's process too before it is refused
    wrong = run_command([sys.executable, "-m", "actorlearner", "actor", "--learner", f"127.0.0.1:{port}",
                         "--env", "Acrobot-v1", "--actor-id", "wrong", "--vector-mode", "sync"], timeout=60)
    assert wrong.returncode == 2
    assert "FAILED_PRECONDITION" in wrong.stderr and "env spec" in wrong.stderr
    assert learner.poll() is None
