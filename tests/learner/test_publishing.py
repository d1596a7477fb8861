"""Publishing off the training thread: its publish only queues asynchronous copies into pinned buffers (no
blocking copy, no read); every version goes out once, in order, as the weights were when it was
published, however slow serialization is; a publisher failure is logged and raised to the caller."""

import logging
import threading

import pytest
import torch
from procs import wait_until
from test_device_step import make_step

from actorlearner import wire
from actorlearner.algorithms.dqn import DQNConfig
from actorlearner.audit import HostTraffic
from actorlearner.config import LearnerConfig
from actorlearner.learner import publishing as publishing_module
from actorlearner.learner.learner import Learner
from actorlearner.learner.publishing import DEPTH, Publishing
from actorlearner.learner.roles import Roles
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
        with HostTraffic(learner.algorithm) as traffic:  # publishing touches the trainer's tensors only
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
        for name, value in learner.algorithm.policy_state_dict().items():
            assert torch.equal(got[name], value), name
    finally:
        learner.stop()
