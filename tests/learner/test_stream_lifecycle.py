"""A stream's end ends everything done on its behalf: limiter waits, reader threads, failures stay on one stream."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest

from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from procs import alive, descendants, launch, wait_until
from streams import RawStream, batch, fill_limiter, hello

STREAMS = 50
KILLED = 10
RAW_ACTOR = str(Path(__file__).parents[1] / "support" / "raw_actor.py")


def reader_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("read-")]


def reader_task() -> str:
    """The name of the learner's reader task running this code ("" outside one)."""
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no loop in this thread
        return ""
    return task.get_name() if task else ""


def pool_threads() -> int:
    """Threads of the server's worker pool (``grpc_N``): it grows up to its bound, max_streams + 8, and stays."""
    return sum(1 for t in threading.enumerate() if t.name.startswith("grpc_"))


def other_threads() -> int:
    """Every other thread: reader threads, clients' threads, and whatever a stream might leave behind.

    Counted apart from the pool: a handler still returning its worker when the baseline is taken makes
    the pool grow by one later, for good, which is no leak (the pool's bound is checked instead)."""
    return threading.active_count() - pool_threads()


def warm_pool(learner: Learner, address: str) -> int:
    """Open as many streams as the cap at once and close them: gRPC's worker pool grows towards its size
    and stays (bounded, not a leak). Returns the count of threads outside the pool after."""
    warm = [RawStream(address, hello(f"warm-{i}")) for i in range(learner.config.max_streams)]
    for stream in warm:
        stream.next("welcome")
        stream.close()
    wait_until(lambda: not reader_threads() and not any(a.connected for a in learner.status().actors), 30,
               "the warm-up streams to end")
    return other_threads()


def test_cut_streams_end_their_limiter_waits_and_leave_nothing_behind():
    """50 streams whose batches wait on the limiter are cut: readers exit, the limiter counts nothing of them."""
    learner = Learner(LearnerConfig(env="CartPole-v1", max_streams=STREAMS + 4, eval_every=0))  # default limiter
    fill_limiter(learner)
    with serve(learner, "127.0.0.1", 0) as port:
        address = f"127.0.0.1:{port}"
        threads = warm_pool(learner, address)
        inserts, stored = learner.replay.limiter.inserts, learner.replay.buffer.inserted

        held = [RawStream(address, hello(f"held-{i}"), batch(1)) for i in range(STREAMS)]
        wait_until(lambda: learner.replay.limiter.waiting["inserts"] == STREAMS, 60, f"{STREAMS} batches waiting on the limiter")
        for stream in held:
            stream.cancel()  # as a SIGKILLed actor's stream ends
        wait_until(lambda: not reader_threads(), 30, "every reader thread to end")
        for stream in held:
            assert stream.wait_end()[0] == grpc.StatusCode.CANCELLED
            assert not [m for m in stream.messages() if m.WhichOneof("kind") == "ack"]
            stream.close()  # and the client's own threads go too
        wait_until(lambda: other_threads() <= threads, 30, f"thread count outside the pool back to {threads}")
        assert pool_threads() <= learner.config.max_streams + 8
        assert (learner.replay.limiter.inserts, learner.replay.buffer.inserted) == (inserts, stored)
        assert learner.replay.limiter.waiting["inserts"] == 0
        assert not any(a.connected for a in learner.status().actors)
    learner.stop()


def test_actor_processes_killed_one_after_another_while_held_leave_no_threads():
    """The issue's measurement: 10 actors SIGKILLed one after another while the limiter held their inserts."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, max_streams=KILLED + 2))
    fill_limiter(learner)
    with serve(learner, "127.0.0.1", 0) as port:
        threads, inserts = warm_pool(learner, f"127.0.0.1:{port}"), learner.replay.limiter.inserts
        actors = [subprocess.Popen([sys.executable, RAW_ACTOR, f"127.0.0.1:{port}", f"killed-{i}", "7"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for i in range(KILLED)]
        below: dict[int, str] = {}  # what the actors started
        try:
            for i, actor in enumerate(actors):
                assert actor.stdout.readline().strip() == "welcome"
                actor.stdin.write("send 1 16\n")
                actor.stdin.flush()
                wait_until(lambda: learner.replay.limiter.waiting["inserts"] == 1, 60, f"actor {i}'s batch to wait")
                below.update(descendants(actor.pid))
                actor.kill()
                actor.wait()
                wait_until(lambda: learner.replay.limiter.waiting["inserts"] == 0, 30, f"actor {i}'s wait to end")
        finally:
            for actor in actors:
                actor.kill()
                actor.wait()
        wait_until(lambda: not alive(below), 30, "no process left of the killed actors")
        wait_until(lambda: not reader_threads(), 30, "every reader thread to end")
        wait_until(lambda: other_threads() <= threads, 30, f"thread count outside the pool back to {threads}")
        assert pool_threads() <= learner.config.max_streams + 8
        assert learner.replay.limiter.inserts == inserts and learner.replay.limiter.waiting["inserts"] == 0
    learner.stop()


def test_a_failure_inside_ingest_ends_that_stream_alone_with_internal(caplog):
    """Any exception (here an injected device failure) ends its stream with a status, logged once."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0))
    real_write = learner.replay.buffer.write

    def write(reservation):
        if reader_task() == "read-doomed":
            raise RuntimeError("CUDA out of memory (injected)")
        return real_write(reservation)

    learner.replay.buffer.write = write  # fault injection: a failure this CPU-only machine cannot produce for real
    with serve(learner, "127.0.0.1", 0) as port, caplog.at_level(logging.WARNING):
        address = f"127.0.0.1:{port}"
        good = RawStream(address, hello("good"), batch(1))
        assert good.next("ack").ack.seq == 1
        doomed = RawStream(address, hello("doomed"), batch(1))
        code, details = doomed.wait_end()
        assert code == grpc.StatusCode.INTERNAL and "RuntimeError: CUDA out of memory (injected)" in details
        good.send(batch(2))
        assert good.next("ack").ack.seq == 2  # the same stream goes on
        again = RawStream(address, hello("after"), batch(1))  # and new streams are served
        assert again.next("ack").ack.seq == 1
        for stream in (good, again):
            stream.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "doomed" in errors[0].getMessage() and errors[0].exc_info
    assert learner.replay.buffer.abandoned == 16 and learner.replay.buffer.pending == 0  # the doomed batch's slots: empty
    assert learner.replay.limiter.inserts == learner.replay.buffer.inserted - learner.replay.buffer.abandoned == 2 * 16 + 16
    learner.stop()


def test_a_failure_in_training_stops_the_learner_loudly_instead_of_serving_untrained(caplog):
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, min_replay_size=32, batch_size=32))

    def update(sample):
        raise RuntimeError("CUDA out of memory (injected)")

    learner.trainer.update = update  # fault injection, as above
    stream = learner.connect(hello("feeder").hello)
    assert learner.ingest(stream, batch(1, n=64).batch)
    with caplog.at_level(logging.ERROR):
        learner.start()
        assert learner.failed.wait(60), "the trainer's failure went unnoticed"
    learner.stop()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == ["training failed; the learner stops"]
    assert learner.replay.limiter.samples == 32  # the one sample drawn before the failure


def test_train_step_hands_back_samples_it_could_not_draw():
    """With nothing recent enough to sample, the limiter's sample count stays what was trained on."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, min_replay_size=32, batch_size=32,
                                    publish_every=1, max_policy_lag=1))
    stream = learner.connect(hello("old").hello)
    assert learner.ingest(stream, batch(1, n=64, policy_version=0).batch)
    attempts = [learner.training.train_step() for _ in range(6)]
    assert attempts[:2] == [True, True] and not any(attempts[2:])  # version 0 items fall out of the lag bound
    assert learner.replay.limiter.samples == learner.updates * 32

    def sample(batch_size, min_policy_version=None):
        raise ValueError("a bug in sampling (injected)")

    learner.replay.buffer.sample = sample  # any other error is a bug: it must surface, not read as "wait"
    with pytest.raises(ValueError, match="injected"):
        learner.training.train_step()


def test_sigterm_with_a_batch_waiting_sends_shutdown_and_ends_ok(tmp_path):
    """A draining learner drops a batch it has not stored (the actor resends it) and says Shutdown, not an error."""
    log = tmp_path / "learner.log"
    learner = launch(
        [sys.executable, "-m", "actorlearner", "learner", "--port", "0", "--eval-every", "0", "--max-updates", "1",
         "--min-replay-size", "64", "--batch-size", "32", "--samples-per-insert", "1", "--rate-error-buffer", "64"],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True)  # one update, then inserts wait: a full limiter
    try:
        port = int(learner.stdout.readline().rsplit(":", 1)[1])
        stream = RawStream(f"127.0.0.1:{port}", hello("drained"))
        stream.next("welcome")
        seq = 0
        while True:  # send until a batch goes unacked: it waits on the limiter
            seq += 1
            stream.send(batch(seq, n=64))
            try:
                stream.next("ack", timeout=5)
            except AssertionError:
                break
            assert seq < 100, "the limiter never held a batch"
        learner.send_signal(signal.SIGTERM)
        assert stream.next("shutdown", timeout=60).shutdown.reason
        assert not [m for m in stream.messages() if m.WhichOneof("kind") == "ack"]  # the waiting batch: not acked
        stream.close()  # as an actor does on Shutdown
        assert stream.wait_end(60)[0] in (grpc.StatusCode.OK, grpc.StatusCode.CANCELLED)  # no error from the learner
        assert learner.wait(60) == 0
    finally:
        learner.kill()
    text = log.read_text()
    assert "bad input" not in text and "Traceback" not in text, text[-3000:]
    assert "was not stored (the learner is shutting down)" in text


def test_after_shutdown_the_learner_ends_each_stream_with_ok_whether_or_not_the_actor_ends_it(tmp_path):
    """The proto's step 7: Shutdown, then OK, both for an actor that half-closes on the Shutdown and for one
    that only reads and waits for the learner to end the stream (the server's own grace outlasts the wait)."""
    learner = launch([sys.executable, "-m", "actorlearner", "learner", "--port", "0", "--eval-every", "0"],
                     stdout=subprocess.PIPE, stderr=(tmp_path / "learner.log").open("w"), text=True)
    try:
        port = int(learner.stdout.readline().rsplit(":", 1)[1])
        polite, waiting = (RawStream(f"127.0.0.1:{port}", hello(name)) for name in ("polite", "waiting"))
        for stream in (polite, waiting):
            stream.next("welcome", timeout=60)
        learner.send_signal(signal.SIGTERM)
        for stream in (polite, waiting):
            assert stream.next("shutdown", timeout=60).shutdown.reason
        polite.half_close()
        assert polite.wait_end(60) == (grpc.StatusCode.OK, "")
        assert waiting.wait_end(60) == (grpc.StatusCode.OK, "")
        assert learner.wait(60) == 0
    finally:
        learner.kill()
