"""Publishing off the training thread: its publish only queues asynchronous copies into pinned buffers (no
blocking copy, no read); every version goes out once, in order, as the weights were when it was
published, however slow serialization is; a publisher failure is logged and raised to the caller."""

import logging
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from procs import CHILD_ENV, wait_until
from streams import RawStream, hello
from test_device_step import make_step

from actorlearner import wire
from actorlearner.algorithms.dqn import DQNConfig
from actorlearner.audit import HostTraffic
from actorlearner.config import LearnerConfig
from actorlearner.learner import publishing as publishing_module
from actorlearner.learner.learner import Learner
from actorlearner.learner.publishing import DEPTH, Publishing
from actorlearner.learner.roles import Roles
from actorlearner.learner.server import serve
from actorlearner.pinned import pinned_empty
from actorlearner.streaming.broadcast import PolicyBroadcast


class Recording(Roles):
    """Records the versions and payloads it is told of, after ``gate`` opens (a slow serialization); fails
    on the versions in ``fail``."""

    def __init__(self, gate: threading.Event | None = None, fail: tuple[int, ...] = ()):
        self.gate, self.fail = gate, fail
        self.versions: list[int] = []
        self.payloads: dict[int, bytes] = {}

    def published(self, version: int, payload: bytes) -> None:
        if self.gate is not None:
            assert self.gate.wait(120), "the test never opened the gate"
        if version in self.fail:
            raise ValueError(f"no room for version {version}")
        self.versions.append(version)
        self.payloads[version] = payload


def publishing_of(roles: Roles) -> Publishing:
    return Publishing(PolicyBroadcast(1 << 20), None, roles)


def test_the_training_threads_publish_makes_no_blocking_copy_and_reads_nothing(device):
    step = make_step("dqn", device)
    roles = Recording()
    publishing = publishing_of(roles)
    traffic = HostTraffic(step.trainer, step.replay)
    want = {}
    for version in range(1, 9):  # a training loop publishing every update
        want[version] = step.trainer.policy_state_dict()
        with traffic:
            publishing.publish(version, step.trainer.policy_tensors())
        assert step()  # the weights change right after publish returns
    publishing.flush()
    assert traffic.blocking() == 0, traffic.calls
    assert traffic.counts["read"] == 0, traffic.calls
    tensors = len(step.trainer.policy_tensors())
    assert traffic.counts["d2h_async"] == 8 * tensors, traffic.calls
    assert roles.versions == list(range(1, 9))
    assert (publishing.broadcast.version, publishing.broadcast.serializations) == (8, 8)
    for version, payload in roles.payloads.items():  # the weights as they were at each publish
        got = wire.decode_state_dict(payload)
        assert got.keys() == want[version].keys()
        for name, value in want[version].items():
            assert torch.equal(got[name], value), (version, name)
    first, last = (wire.decode_state_dict(roles.payloads[v]) for v in (1, 8))
    assert any(not torch.equal(first[name], last[name]) for name in first), "training changed nothing"
    publishing.stop()


def test_every_version_goes_out_in_order_while_serializing_is_slower(device, monkeypatch):
    made = []
    monkeypatch.setattr(publishing_module, "pinned_empty", lambda *args: made.append(args) or pinned_empty(*args))
    gate = threading.Event()
    roles = Recording(gate)
    publishing = publishing_of(roles)
    heard = []
    publishing.broadcast.listen(lambda: heard.append(publishing.broadcast.version))
    tensors = {"w": torch.ones(256, device=device), "steps": torch.zeros(3, dtype=torch.int64, device=device)}
    returned = []

    def train() -> None:
        for version in range(1, 21):
            publishing.publish(version, tensors)
            returned.append(version)
            tensors["w"].fill_(-1.0)  # training goes on at once: the copy must already be taken
            tensors["w"].fill_(version + 1)
            tensors["steps"].add_(1)

    trainer = threading.Thread(target=train)
    trainer.start()
    wait_until(lambda: len(returned) >= DEPTH, 60, f"{DEPTH} publishes while the first is being serialized")
    gate.set()
    trainer.join(120)
    assert not trainer.is_alive()
    publishing.flush()
    assert len(made) == DEPTH * len(tensors), "buffer sets are reused, never more than DEPTH of them"
    assert roles.versions == heard == list(range(1, 21))
    assert (publishing.broadcast.version, publishing.broadcast.serializations) == (20, 20)
    for version, payload in roles.payloads.items():
        got = wire.decode_state_dict(payload)
        assert torch.equal(got["w"], torch.full((256,), float(version))), version
        assert torch.equal(got["steps"], torch.full((3,), version - 1)), version
    publishing.stop()


def test_a_publisher_failure_is_logged_and_raised_and_later_versions_still_go_out(caplog):
    gate = threading.Event()
    roles = Recording(gate, fail=(2,))
    publishing = publishing_of(roles)
    weights = {"w": torch.arange(4.0)}
    with caplog.at_level(logging.ERROR, logger=publishing_module.__name__):
        for version in (1, 2, 3):
            publishing.publish(version, weights)
        gate.set()
        with pytest.raises(RuntimeError, match="publishing policy version 2 failed"):
            publishing.flush()
    assert "publishing policy version 2 failed" in caplog.text and "no room for version 2" in caplog.text
    assert roles.versions == [1, 3] and publishing.failures == 1
    publishing.publish(4, weights)  # raised once: the next versions go out as before
    publishing.flush()
    assert roles.versions == [1, 3, 4]
    publishing.stop()


def test_stop_publishes_what_is_queued_first():
    gate = threading.Event()
    roles = Recording(gate)
    publishing = publishing_of(roles)
    for version in (1, 2, 3):
        publishing.publish(version, {"w": torch.full((2,), float(version))})
    gate.set()
    publishing.stop()
    assert roles.versions == [1, 2, 3] and publishing.broadcast.version == 3


def test_an_idle_publisher_thread_ends_and_the_next_publish_starts_another(monkeypatch):
    monkeypatch.setattr(publishing_module, "IDLE_SECONDS", 0.05)
    roles = Recording()
    publishing = publishing_of(roles)
    publishing.publish(1, {"w": torch.ones(2)})
    publishing.flush()
    wait_until(lambda: publishing._thread is None, 60, "the idle publisher thread to end", interval=0.01)
    publishing.publish(2, {"w": torch.ones(2)})
    publishing.flush()
    assert roles.versions == [1, 2]
    publishing.stop()


def test_the_learner_publishes_from_its_training_loop_without_waiting_and_at_once_when_asked(device):
    learner = Learner(LearnerConfig(env="CartPole-v1", device=device, replay_capacity=256, min_replay_size=32,
                                    batch_size=32, eval_every=0, algorithm_config=DQNConfig(hidden_sizes=(16,))))
    try:
        assert learner.broadcast.version == 0  # the start-up publish is out when the learner is built
        with HostTraffic(learner.trainer) as traffic:  # publishing touches the trainer's tensors only
            for _ in range(3):
                learner.progress.version += 1
                learner.training.publish()
        assert traffic.blocking() == 0 and traffic.counts["d2h_async"] > 0, traffic.calls
        learner.publishing.flush()
        assert (learner.broadcast.version, learner.broadcast.serializations) == (3, 4)
        learner.progress.version += 1
        learner.training.publish(); learner.publishing.flush()
        assert learner.broadcast.version == 4
        got = wire.decode_state_dict(learner.broadcast.payload)
        for name, value in learner.trainer.policy_state_dict().items():
            assert torch.equal(got[name], value), name
    finally:
        learner.stop()


# A client that reads the Welcome and then nothing more (it never drains its stream).
STALLED_READER = """
import sys, time, grpc
from streams import CONNECT, hello
channel = grpc.insecure_channel(sys.argv[1], options=[("grpc.max_receive_message_length", 64 << 20)])
call = channel.stream_stream(CONNECT, request_serializer=None, response_deserializer=None)(
    iter([hello("stalled").SerializeToString()]))
next(call)
print("welcomed", flush=True)
time.sleep(3600)
"""


def resident_bytes() -> int:
    """This process's resident set (VmRSS)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_stream_that_stops_reading_holds_no_more_than_a_version_and_the_others_are_served():
    """60 versions of a 4 MB policy go out while one actor reads nothing: its stream's sender waits on gRPC's
    flow control with one version in hand (latest wins, nothing queues behind it), so the learner's memory
    does not grow by the versions it skipped (60 payloads if they queued), and a stream opened meanwhile
    gets the newest version."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, algorithm_config=DQNConfig(hidden_sizes=(1024, 1024))))
    payload = len(learner.broadcast.payload)
    assert payload > 4 << 20

    def publish(versions: int) -> None:
        for _ in range(versions):
            learner.progress.version += 1
            learner.training.publish()
            learner.publishing.flush()

    with serve(learner, "127.0.0.1", 0) as port:
        stalled = subprocess.Popen([sys.executable, "-c", STALLED_READER, f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                                   text=True, env=CHILD_ENV)
        try:
            assert stalled.stdout.readline().strip() == "welcomed"
            publish(5)  # the stalled stream's transport buffers fill; allocator pools warm up
            before = resident_bytes()
            publish(60)
            assert resident_bytes() - before < 4 * payload
            reading = RawStream(f"127.0.0.1:{port}", hello("reading"))
            try:
                assert reading.next("welcome").welcome.policy_version == learner.broadcast.version
                assert reading.next("policy_update").policy_update.version == learner.broadcast.version
            finally:
                reading.close()
            assert stalled.poll() is None
        finally:
            stalled.kill()
    learner.stop()
