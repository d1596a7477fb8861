"""The learner's own bookkeeping: counters many streams update at once, and options that do what they say."""

from __future__ import annotations

import logging
import sys
import threading

import pytest
import torch

from actorlearner import config as cfg
from actorlearner.algorithms import make_spec, resolve
from actorlearner.cli.common import warn_if_exposed
from actorlearner.config import LearnerConfig
from actorlearner.learner.exactly_once import ExactlyOnce
from actorlearner.learner.learner import Learner
from actorlearner.learner.registry import ActorRegistry
from actorlearner.transport import SecurityConfig
from actorlearner.v1 import learner_pb2 as pb
from actorlearner import wire
from streams import batch, hello


def test_env_steps_from_many_streams_add_up_exactly():
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0))
    streams = [learner.connect(hello(f"a{i}").hello) for i in range(8)]
    stats = pb.EpisodeStats(returns=[1.0], lengths=[1], env_steps=1, policy_version=0)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: an unlocked += loses updates
    try:
        threads = [threading.Thread(target=lambda s=s: [learner.record_episodes(s, stats) for _ in range(2000)])
                   for s in streams]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert learner.env_steps == 8 * 2000


def test_a_batchs_env_steps_count_once_as_it_is_stored():
    """Counted with the stored batch, not with a later EpisodeStats: a resend (a duplicate) and a refused batch
    add nothing; an EpisodeStats adds the steps it carries."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0))
    stream = learner.connect(hello("stepper").hello)
    carrying = pb.ActorMessage.FromString(batch(1).SerializeToString())
    carrying.batch.env_steps = 40
    assert learner.ingest(stream, carrying.batch) and learner.env_steps == 40
    assert not learner.ingest(stream, carrying.batch) and learner.env_steps == 40  # the resend
    refused = pb.ActorMessage.FromString(batch(2).SerializeToString())
    refused.batch.env_steps, refused.batch.num_transitions = 7, 15  # its payload holds 16
    with pytest.raises(wire.WireError):
        learner.ingest(stream, refused.batch)
    learner.record_episodes(stream, pb.EpisodeStats(env_steps=3, policy_version=0))
    assert learner.env_steps == 43 and learner.ingestion.inserted_batches == 1


def test_departed_actors_are_forgotten_in_one_hold_of_the_registry_lock():
    """A departed actor's record and seqs go together: the seqs are dropped while the registry still holds its
    lock, so the same id cannot reconnect and store a batch in between (its new seq would be dropped, and a
    resend stored twice)."""
    config = LearnerConfig(env="CartPole-v1", eval_every=0, actor_ttl=0.0)
    registry = ActorRegistry(config)
    exactly_once = ExactlyOnce(config, registry)
    registry.disconnect(registry.connect(hello("leaver").hello, "", 0, False))
    exactly_once.claim_seq("leaver", 5)
    held = []
    gone = registry.drop_departed(float("inf"), lambda ids: held.append((list(ids), registry.lock.locked())))
    assert gone == ["leaver"] and held == [(["leaver"], True)]
    registry.disconnect(registry.connect(hello("leaver").hello, "", 0, False))
    exactly_once.expire()
    assert exactly_once.stored("leaver") == -1 and not registry.records()


@pytest.mark.parametrize("host, exposed", [
    ("127.0.0.1", False), ("localhost", False), ("::1", False), ("[::1]", False),
    ("0.0.0.0", True), ("", True), ("[::]", True), ("learner-0.learner.default.svc", True), ("10.0.0.7", True),
])
def test_the_exposure_warning_takes_any_host(host, exposed, caplog):
    """A host name used to crash it (ValueError from ipaddress); a name other than localhost counts as exposed."""
    with caplog.at_level(logging.WARNING):
        warn_if_exposed(host, SecurityConfig())
        warn_if_exposed(host, SecurityConfig(auth_token="t"))
    assert [r.getMessage().count("WITHOUT AUTHENTICATION") for r in caplog.records] == ([1] if exposed else [])


def test_algorithm_device_and_seed_are_the_learners_not_options():
    """--dqn-device and --dqn-seed were documented but overwritten by --device and --seed: they are gone."""
    dqn = resolve("dqn")
    flags = {opt.flag for opt in cfg.options(cfg.LearnerConfig) + cfg.options(dqn.config_class, "dqn-")}
    assert {"--device", "--seed", "--dqn-lr"} <= flags
    assert not flags & {"--dqn-device", "--dqn-seed"}
    learner = Learner(cfg.build(cfg.LearnerConfig, environ={"ACTORLEARNER_SEED": "7", "ACTORLEARNER_DEVICE": "cpu"},
                                algorithm=dqn))
    assert learner.trainer.device == torch.device("cpu")
    seeded = make_spec("dqn", learner.observation_space, learner.action_space).make_policy(seed=7)
    for name, value in seeded.policy_state_dict().items():
        torch.testing.assert_close(learner.trainer.policy_state_dict()[name], value)
