"""Actors come and go (every pod restart is a new id): what the learner keeps of them stays bounded."""

from __future__ import annotations

import socket
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from procs import FAST_LEARNER, rss_kib, start_learner, status, stop, wait_until
from streams import RawStream, batch, hello

CHURN = 2000
TTL = 2.0
WARM_ITEMS = 2
"""Transitions each of the 200 warm-up actors sends: 400 in all, past FAST_LEARNER's --min-replay-size (256)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def short_lived(address: str, actor_ids: list[str], items: int = 1) -> None:
    """Each id: connect, have one batch of ``items`` transitions acked, go away."""
    def one(actor_id: str) -> None:
        stream = RawStream(address, hello(actor_id), batch(1, n=items))
        try:
            stream.next("ack")
        finally:
            stream.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, actor_ids))


def trained(port: int, checkpoints: Path) -> bool:
    """The learner has trained, published and saved a checkpoint since: every path the churn takes has run
    once, with its one-off growth (a device's kernels, workspaces and allocator cache) behind it."""
    learner = status(port)
    saved = [int(path.name.removeprefix("ckpt-")) for path in checkpoints.glob("ckpt-" + "[0-9]" * 12)]
    return learner.updates > 0 and learner.policy_version > 0 and max(saved, default=0) > 0


def footprint(port: int, metrics_port: int, pid: int) -> tuple[int, int, int]:
    """(status bytes, /metrics bytes, RSS KiB) once every short-lived actor has been forgotten."""
    wait_until(lambda: not status(port).actors, 10 * TTL + 30, "departed actors to be forgotten")
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    return status(port).ByteSize(), len(metrics), rss_kib(pid)


def test_2000_short_lived_actor_ids_leave_memory_status_and_metrics_bounded(tmp_path):
    metrics_port = free_port()
    learner, port = start_learner(*FAST_LEARNER, "--actor-ttl", str(TTL), "--metrics-port", str(metrics_port),
                                  "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "2")
    address = f"127.0.0.1:{port}"
    try:
        # Imports, pools and buffers settle, and training starts: the baseline is a learner at work.
        short_lived(address, [f"warm-{i}" for i in range(200)], WARM_ITEMS)
        wait_until(lambda: trained(port, tmp_path / "ckpt"), 120, "training, a published version and a checkpoint")
        warm = footprint(port, metrics_port, learner.pid)
        short_lived(address, [f"pod-{i}" for i in range(CHURN)])
        after = footprint(port, metrics_port, learner.pid)
    finally:
        codes = stop(learner)
    assert codes == [0]
    status_bytes, metrics_bytes, rss = after
    # Bounded: the same lines as before the churn; only counters' digits may grow.
    assert status_bytes <= warm[0] + 64 and metrics_bytes <= warm[1] + 1024, (warm, after)
    assert rss < warm[2] * 1.1, f"learner RSS {warm[2]} -> {rss} KiB over {CHURN} actor ids"
    seq_table = CheckpointStore(tmp_path / "ckpt").load_latest()[1]["learner"]["seq_table"]
    assert seq_table == {}, f"{len(seq_table)} departed actors still in the checkpoint's seq table"


def test_an_actor_back_within_the_ttl_keeps_its_duplicate_filter():
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, actor_ttl=TTL))
    stream = learner.connect(hello("returning").hello)
    assert learner.ingest(stream, batch(5).batch)
    learner.disconnect(stream)

    stream = learner.connect(hello("returning").hello)  # back in time: its resend is a duplicate
    assert learner.ingest(stream, batch(5).batch) is False
    assert learner.ingest(stream, batch(6).batch) is True
    learner.disconnect(stream)
    assert [a.actor_id for a in learner.status().actors] == ["returning"]

    wait_until(lambda: not learner.status().actors, 10 * TTL, "the actor to be forgotten")
    stream = learner.connect(hello("returning").hello)  # back too late: a new actor, as documented
    assert learner.ingest(stream, batch(5).batch) is True
    learner.disconnect(stream)


def test_connected_actors_hold_distinct_apex_indices():
    """Ape-X epsilons come from the actor index: two live actors must not share one after churn."""
    learner = Learner(LearnerConfig(env="CartPole-v1", eval_every=0, num_actors=4))

    def join(actor_id: str):
        stream = learner.connect(hello(actor_id).hello)
        return stream, learner.welcome(stream, 0).settings.actor_index

    streams = {name: join(name) for name in "abcd"}
    assert sorted(index for _, index in streams.values()) == [0, 1, 2, 3]
    learner.disconnect(streams.pop("b")[0])
    e = join("e")
    assert e[1] == 1  # b's index is free again
    again = join("a")  # a second stream of a live actor (a reconnect overlapping the old one) keeps its index
    assert again[1] == streams["a"][1]
    learner.disconnect(streams.pop("a")[0])
    live = [index for _, index in streams.values()] + [e[1], again[1]]
    assert sorted(live) == [0, 1, 2, 3]
    fifth = join("f")  # more actors than indices: the least shared one
    assert fifth[1] in range(4)
