"""Exactly once across broken streams, and chunked policy broadcast, against a live in-process learner:
DQN's transitions and R2D2's sequences alike."""

import time

import numpy as np
import pytest
import torch

from actorlearner.actor.link import LearnerLink
from actorlearner.algorithms import make_spec
from actorlearner.algorithms.r2d2 import R2D2Config
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from procs import wait_until
from streams import BATCH, batch_for, make_hello
from tcp_proxy import TcpProxy

SEQS, CUTS, HELD = 200, 4, 4  # batches in all, connection cuts, batches in flight at each cut
ALGORITHMS = {"dqn": {}, "r2d2": {"algorithm": "r2d2", "algorithm_config": R2D2Config(sequence_length=8, overlap=4,
                                                                                      burn_in=2, core_size=16)}}


@pytest.fixture(params=list(ALGORITHMS))
def learner(request):
    return Learner(LearnerConfig(env="CartPole-v1", replay_capacity=10_000, eval_every=0, max_unacked=8,
                                 **ALGORITHMS[request.param]))


def test_cut_streams_lose_nothing_acked_and_insert_nothing_twice(learner):
    """The connection is cut CUTS times with HELD batches in flight: alternately after the learner
    stored them but before their acks got back, and before they reached the learner."""
    # No learner.start(): nothing trains, so nothing is sampled, and the default rate limiter admits
    # min_replay_size + rate_error_buffer / samples_per_insert items in all. The test stays below
    # that, so no insert ever waits on it.
    limit = learner.config.min_replay_size + learner.config.rate_error_buffer / learner.config.samples_per_insert
    assert SEQS * BATCH <= limit
    with serve(learner, "127.0.0.1", 0) as port:
        proxy = TcpProxy(port)
        link = LearnerLink(f"127.0.0.1:{proxy.port}", make_hello(learner, "cutter"), 16 << 20,
                           reconnect_initial=0.05, reconnect_max=0.2).start()
        seq, in_flight_at_cut = 0, []

        def send(n: int) -> None:
            nonlocal seq
            for _ in range(n):
                seq += 1
                assert link.send_batch(seq, batch_for(learner, seq), timeout=60)

        for cut in range(CUTS):
            send(SEQS // (CUTS + 1) - HELD)
            assert link.flush(timeout=60), f"{link.unacked} batches never acked"  # the window is empty
            acks_lost = cut % 2 == 0
            proxy.stall(up_after=None if acks_lost else 0, down_after=0 if acks_lost else None)
            send(HELD)
            if acks_lost:
                wait_until(lambda: learner.ingestion.inserted_batches == seq, 60, "the learner to store the held batches")
            in_flight_at_cut.append(link.unacked)
            proxy.cut()
            proxy.resume()
        send(SEQS - seq)
        assert link.flush(timeout=60), f"{link.unacked} batches never acked"
        link.close()
        proxy.close()

    assert in_flight_at_cut == [HELD] * CUTS and link.reconnects >= CUTS
    state = learner.replay.buffer.state_dict()
    obs = state["field.obs"].numpy().reshape(len(learner.replay), -1)
    counts = np.bincount(obs[:, 0].astype(np.int64), minlength=SEQS + 1)
    assert (counts[1:] == BATCH).all(), f"per-seq item counts: {dict(enumerate(counts))}"
    assert len(learner.replay) == BATCH * SEQS and learner.ingestion.inserted_batches == SEQS
    for seq in range(1, SEQS + 1):  # every transition of every batch, once
        rows = np.sort(obs[obs[:, 0] == seq, 1])
        assert np.array_equal(rows, np.arange(BATCH))


def test_state_dict_over_20mb_reaches_every_actor_intact(learner):
    big = {"torso.weight": torch.randn(3000, 2000), "head.bias": torch.arange(7, dtype=torch.float64),
           "steps": torch.tensor([1, 2, 3], dtype=torch.int64)}
    size = sum(t.numel() * t.element_size() for t in big.values())
    assert size > 20 * 1024 * 1024
    with serve(learner, "127.0.0.1", 0) as port:
        links = [LearnerLink(f"127.0.0.1:{port}", make_hello(learner, f"a{i}"), 16 << 20).start() for i in range(2)]
        learner.broadcast.publish(1, big)
        assert len(learner.broadcast.latest()[1]) >= 5  # chunked: 4 MiB each
        received = []
        for link in links:
            deadline = time.monotonic() + 60
            got = None
            while time.monotonic() < deadline:
                got = link.take_policy() or got
                if got and got[0] == 1:
                    break
                time.sleep(0.05)
            received.append(got)
            link.close()
    assert learner.broadcast.serializations == 2  # version 0 at start, version 1: once each
    for got in received:
        assert got is not None and got[0] == 1
        state = got[1]
        assert set(state) == set(big)
        for name, tensor in big.items():
            assert state[name].dtype == tensor.dtype and torch.equal(state[name], tensor)


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_the_learners_own_network_goes_out_in_chunks_and_loads_on_an_actor(algorithm):
    """The learner's policy (R2D2's includes its LSTM) in 4 KiB chunks, loaded by a network built as an actor builds it."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, chunk_bytes=4096, **ALGORITHMS[algorithm]))
    with serve(learner, "127.0.0.1", 0) as port:
        link = LearnerLink(f"127.0.0.1:{port}", make_hello(learner, "chunks"), 16 << 20).start()
        learner.training.publish(); learner.publishing.flush()
        assert len(learner.broadcast.latest()[1]) > 3
        got = wait_until(lambda: (p := link.take_policy()) and p.version == learner.version and p, 60,
                         "the policy to arrive")
        link.close()
    actor_side = make_spec(algorithm, learner.observation_space, learner.action_space,
                           learner.algorithm_config).make_policy()
    actor_side.load_policy_state_dict(got.state)
    for name, tensor in learner.trainer.policy_state_dict().items():
        assert torch.equal(actor_side.policy_state_dict()[name], tensor), name
