"""learner.proto says what the learner does: one test per rule an actor written from the proto alone relies on."""

from __future__ import annotations

import grpc
import pytest

from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from streams import RawStream, batch, hello

WINDOW = 4


@pytest.fixture
def served():
    """A live learner (not training, default rate limiter) and its address."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, max_unacked=WINDOW))
    with serve(learner, "127.0.0.1", 0) as port:
        yield learner, f"127.0.0.1:{port}"
    learner.stop()


def kinds(stream: RawStream, until_acks: int) -> list[str]:
    """Kinds of the messages received until ``until_acks`` acks have arrived."""
    seen, acks = [], 0
    while acks < until_acks:
        kind = stream.next().WhichOneof("kind")
        seen.append(kind)
        acks += kind == "ack"
    return seen


def test_no_policy_update_follows_the_welcome_when_the_actor_holds_that_version(served):
    learner, address = served
    fresh = RawStream(address, hello("fresh", policy_version=-1), batch(1))
    assert kinds(fresh, 1) == ["welcome", "policy_update", "ack"]
    holder = RawStream(address, hello("holder", policy_version=learner.version), batch(1))
    assert kinds(holder, 1) == ["welcome", "ack"]
    for stream in (fresh, holder):
        stream.close()


def test_acks_are_accepted_and_a_batch_that_cannot_be_stored_gets_none(served):
    learner, address = served
    stream = RawStream(address, hello("acked"), batch(1), batch(1))
    acks = [stream.next("ack").ack for _ in range(2)]
    assert [(a.seq, a.accepted, a.reason) for a in acks] == [(1, True, ""), (1, True, "duplicate")]
    stream.send(batch(2, n=0))  # bad input
    code, details = stream.wait_end()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "num_transitions" in details
    assert not [m for m in stream.messages() if m.WhichOneof("kind") == "ack"]
    stream.close()


def test_status_inserted_counts_stored_batches_not_acks(served):
    learner, address = served
    stream = RawStream(address, hello("counted"), batch(1), batch(2), batch(2), batch(3))
    assert [stream.next("ack").ack.reason for _ in range(4)] == ["", "", "duplicate", ""]
    status = learner.status()
    assert status.inserted == 3 and status.buffer_size == 3 * 16
    assert {a.actor_id: a.duplicates for a in status.actors} == {"counted": 1}
    stream.close()


def test_actor_version_is_its_hello_then_its_reports_and_never_ahead_of_the_learner(served):
    learner, address = served
    learner.progress.version = 3
    learner.training.publish(); learner.publishing.flush()
    stream = RawStream(address, hello("reporter", policy_version=1), batch(1, policy_version=2))
    stream.next("ack")
    [actor] = learner.status().actors
    assert (actor.policy_version, actor.lag) == (2, 1)
    stream.close()
    # A Hello ahead of the learner (an actor that ran a version a crashed learner published
    # after its last checkpoint): its batches are accepted, and its lag reads 0, not negative.
    ahead = RawStream(address, hello("reporter", policy_version=7), batch(2, policy_version=7))
    assert ahead.next("ack").ack.reason == ""
    [actor] = learner.status().actors
    assert (actor.policy_version, actor.lag) == (3, 0)
    ahead.close()
    # Reconnecting with nothing (a restarted actor process): the Hello's -1 is what it runs.
    restarted = RawStream(address, hello("reporter", policy_version=-1))
    restarted.next("policy_update")
    [actor] = learner.status().actors
    assert (actor.policy_version, actor.lag) == (-1, 4)
    restarted.close()


def test_a_batch_from_a_future_policy_version_is_invalid_argument(served):
    learner, address = served
    before = learner.status()
    stream = RawStream(address, hello("prophet"), batch(1, policy_version=999))
    code, details = stream.wait_end()
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "policy_version must be in [0, 0]" in details
    after = learner.status()
    assert (after.inserted, after.buffer_size) == (before.inserted, before.buffer_size)
    assert all(a.lag >= 0 for a in after.actors)
    stream.close()


def test_an_actor_whose_seqs_restarted_is_not_dropped_silently(served, caplog):
    """A restarted actor counting seq from 0 under its old id is acked "duplicate" and nothing is stored:
    the learner says so, once per stream, in its log and in status."""
    learner, address = served
    first = RawStream(address, hello("pod-0"), *[batch(seq) for seq in range(101, 111)])
    assert [first.next("ack").ack.seq for _ in range(10)] == list(range(101, 111))
    first.close()
    restarted = RawStream(address, hello("pod-0"), *[batch(seq) for seq in range(1, 3 * WINDOW + 1)])
    assert {restarted.next("ack").ack.reason for _ in range(3 * WINDOW)} == {"duplicate"}
    assert {a.actor_id: a.duplicates for a in learner.status().actors} == {"pod-0": 3 * WINDOW}
    assert learner.status().inserted == 10
    warnings = [r.getMessage() for r in caplog.records if "If the actor's seqs restarted" in r.getMessage()]
    assert len(warnings) == 1 and "not above 110" in warnings[0] and "continue above 110" in warnings[0]
    restarted.close()


def test_a_resent_window_larger_than_the_learners_is_stored_not_refused(served, caplog):
    """After a restart with a smaller max_unacked, the actor still resends its older, larger window."""
    learner, address = served
    first = RawStream(address, hello("big-window"), *[batch(seq) for seq in range(1, 2 * WINDOW + 1)])
    [first.next("ack") for _ in range(2 * WINDOW)]
    first.close()
    resent = RawStream(address, hello("big-window"), *[batch(seq) for seq in range(1, 2 * WINDOW + 2)])
    acks = [resent.next("ack").ack for _ in range(2 * WINDOW + 1)]
    assert [a.reason for a in acks] == ["duplicate"] * (2 * WINDOW) + [""]  # and the stream goes on
    assert learner.status().inserted == 2 * WINDOW + 1
    resent.close()
