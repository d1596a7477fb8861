"""Inserts from several streams overlap: rows are copied outside the replay lock, and a checkpoint waits for them."""

from __future__ import annotations

import threading

import numpy as np
import torch

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.replay import PrioritizedReplay, make_replay
from procs import wait_until
from streams import RawStream, batch, hello

FIELDS = {"obs": ((2,), torch.float32), "action": ((), torch.int64)}


def items(first: int, n: int) -> dict[str, np.ndarray]:
    """``n`` items whose action (and obs) is their own number, ``first`` on."""
    obs = np.repeat(np.arange(first, first + n, dtype=np.float32)[:, None], 2, axis=1)
    return {"obs": obs, "action": np.arange(first, first + n)}


def drawn(buf: PrioritizedReplay, calls: int = 40) -> dict[int, int]:
    """Key -> action of every item drawn in ``calls`` samples of 20."""
    out = {}
    for _ in range(calls):
        sample = buf.sample(20)
        out.update(zip(sample.indices.tolist(), sample.data["action"].tolist()))
    return out


def test_reserved_slots_stay_hidden_until_committed_and_inserts_interleave(replay_path):
    buf = make_replay(20, FIELDS, **replay_path)
    old = buf.add(items(0, 20))  # full: the next two inserts overwrite slots 0-4 and 5-9
    first, second = buf.reserve(items(100, 5)), buf.reserve(items(200, 5))
    assert buf.pending == 2
    buf.update_priorities(old[:10], torch.full((10,), 50.0))  # updates to the overwritten items: ignored
    assert all(key >= 10 for key in drawn(buf)), "an item of a reserved slot was sampled"

    buf.write(second)  # the later reservation finishes first
    assert buf.commit(second).tolist() == list(range(25, 30)) and buf.pending == 1
    seen = drawn(buf)
    assert not any(20 <= key < 25 for key in seen) and all(key >= 10 for key in seen)
    assert {key: action for key, action in seen.items() if key >= 25} == {k: 200 + k - 25 for k in range(25, 30)}

    buf.write(first)
    assert buf.commit(first).tolist() == list(range(20, 25)) and buf.pending == 0
    seen = drawn(buf)
    assert {key: action for key, action in seen.items() if key >= 20} == {
        **{k: 100 + k - 20 for k in range(20, 25)}, **{k: 200 + k - 25 for k in range(25, 30)}}


def test_a_batch_is_stored_while_another_insert_is_open_and_a_checkpoint_waits_for_it(tmp_path):
    """One insert is mid-copy (its reservation open, as in Learner.ingest); another stream's batches are
    stored and acked meanwhile; a checkpoint waits for the open insert, holding new ones at its gate,
    and the checkpoint holds the whole of it."""
    config = LearnerConfig(env="CartPole-v1", eval_every=0, min_replay_size=10**9, checkpoint_dir=str(tmp_path))
    learner = Learner(config)
    slow = batch(1, n=64).batch
    slow_items = wire.decode_batch(slow.payload, slow.codec, learner.fields, slow.num_transitions)
    with serve(learner, "127.0.0.1", 0) as port:
        with learner.replay.inserts_changed:  # the service's lock, held as an insert holds it to reserve
            open_insert = learner.replay.buffer.reserve(slow_items)
        stream = RawStream(f"127.0.0.1:{port}", hello("fast"), *(batch(seq, n=32) for seq in (1, 2, 3)))
        try:
            acks = [stream.next("ack").ack for _ in range(3)]
            assert [(a.seq, a.accepted) for a in acks] == [(1, True), (2, True), (3, True)]
            assert learner.ingestion.inserted_batches == 3 and learner.replay.buffer.pending == 1

            checkpoint = threading.Thread(target=learner.checkpoint)
            checkpoint.start()
            wait_until(lambda: learner.replay.gate_closed, 30, "the checkpoint to wait for the open insert")
            stream.send(batch(4, n=32))  # a new insert: held at the gate until the checkpoint's instant
            assert checkpoint.is_alive()
            learner.replay.buffer.write(open_insert)
            with learner.replay.inserts_changed:
                learner.replay.buffer.commit(open_insert)
                learner.replay.inserts_changed.notify_all()
            checkpoint.join(60)
            assert not checkpoint.is_alive()
            assert stream.next("ack").ack.seq == 4  # the gate opened again
        finally:
            stream.close()
    restored = Learner(config)  # from the checkpoint: the open insert whole and batches 1-3, not batch 4
    assert len(restored.replay) == 64 + 3 * 32 and restored.replay.exactly_once.seq_table == {"fast": 3}
