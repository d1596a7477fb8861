"""Longest ingest stall while the learner writes a checkpoint, two source trees side by side.

A real ``Learner`` (CPU) with its replay filled to capacity; one thread keeps calling
``learner.ingest`` with a pre-encoded batch (64 transitions, rising seqs) at a fixed pace
while the main thread runs ``learner.checkpoint()`` (replay included). The learner's
replay lock is wrapped to time every acquisition: the stall of a run is the longest wait
of an ingest-thread acquisition overlapping the checkpoint; the checkpoint thread's own
holds are reported too, with the CPU time it ran while holding (a hold far longer than
its CPU time was descheduled, not working). The rate limiter never blocks
(``rate_error_buffer`` 1e15), so only the checkpoint can hold an insert up. Each
checkpoint is preceded by 2 s without one, whose longest insert wait is the noise floor.

Cases: ``cartpole`` (1M transitions, obs/next_obs 4 float32) and ``atari`` (100k
transitions, obs/next_obs (84, 84, 4) uint8: 5.6 GB of rows and of checkpoint). Each
tree is measured in its own child process (``PYTHONPATH=<tree>``), one after the other:

    python benchmarks/bench_checkpoint.py --case cartpole --runs 5 --before-tree /tmp/ckpt-before
    python benchmarks/bench_checkpoint.py --case atari --runs 3 --before-tree /tmp/ckpt-before --json

Without ``--before-tree`` only one tree is measured: ``--tree``, by default this repository's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from actorlearner.lifeline import tied_to_this_process

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 0.050
"""The longest an insert may wait on a checkpoint."""
BATCH = 64
"""Transitions per ingested batch (the default actor batch size)."""


@dataclass(frozen=True)
class Case:
    """A learner to checkpoint and the pace of the ingest beside it."""

    env: str
    capacity: int
    ingest_interval: float
    """Seconds between the starts of two ingest calls."""


CASES = {
    "cartpole": Case("CartPole-v1", 1_000_000, 0.002),  # 32k transitions/s
    # bench_ingest's Atari-shaped env (this directory is on sys.path when run as a script).
    "atari": Case("bench_ingest:AtariShapedEnv", 100_000, 0.02),  # 3.2k transitions/s, 180 MB/s
}


@dataclass(frozen=True)
class Hold:
    """One acquisition of the lock: by which thread, when it asked, got and released it, and the
    CPU time that thread ran while holding it (far below the hold's length: it was descheduled)."""

    thread: int
    asked: float
    acquired: float
    released: float
    cpu: float


class TimedLock:
    """A real lock that records every acquisition as a :class:`Hold`."""

    def __init__(self, lock) -> None:
        self._lock = lock
        self._current: tuple[float, float, float] | None = None
        self.holds: list[Hold] = []

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        asked = time.perf_counter()
        acquired = self._lock.acquire(blocking, timeout)
        if acquired:
            self._current = (asked, time.perf_counter(), time.thread_time())
        return acquired

    def release(self) -> None:
        asked, acquired, cpu = self._current
        self.holds.append(Hold(threading.get_ident(), asked, acquired, time.perf_counter(), time.thread_time() - cpu))
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# -- child: one tree ----------------------------------------------------------------------------

def random_columns(fields, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` random items for the learner's replay fields."""
    import torch

    out = {}
    for name, (shape, dtype) in fields.items():
        np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        if np_dtype == np.uint8:
            out[name] = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        elif np_dtype.kind == "i":
            out[name] = rng.integers(0, 2, (n, *shape)).astype(np_dtype)
        else:
            out[name] = rng.standard_normal((n, *shape)).astype(np_dtype)
    return out


def fill(learner, rng: np.random.Generator) -> None:
    """Fill the replay to capacity in ~64 MB adds (straight into the buffer: the seq table stays empty)."""
    replay = learner.replay.buffer
    row_bytes = sum(a.nbytes for a in random_columns(learner.fields, 1, rng).values())
    block = random_columns(learner.fields, min(replay.capacity, max(1, (64 << 20) // row_bytes)), rng)
    while replay.inserted < replay.capacity:
        n = min(len(block["obs"]), replay.capacity - replay.inserted)
        replay.add({k: v[:n] for k, v in block.items()})


def measure(case_name: str, runs: int, workdir: str) -> dict:
    """Fill a learner, then ``runs`` checkpoints while one thread keeps ingesting."""
    import actorlearner
    from actorlearner import wire
    from actorlearner.config import LearnerConfig
    from actorlearner.learner.learner import Learner
    from actorlearner.v1 import learner_pb2 as pb

    case = CASES[case_name]
    config = LearnerConfig(env=case.env, device="cpu", replay_capacity=case.capacity, batch_size=32,
                           min_replay_size=32, rate_error_buffer=1e15, eval_every=0, checkpoint_dir=workdir,
                           keep_checkpoints=1, max_message_bytes=64 << 20)
    learner = Learner(config)
    rng = np.random.default_rng(0)
    fill(learner, rng)
    service = learner.replay  # every holder of the replay's lock takes it through the service
    lock = service._lock = TimedLock(service._lock)
    service.inserts_changed = threading.Condition(lock)
    payload = wire.encode_batch(random_columns(learner.fields, BATCH, rng))
    batch = pb.ActorMessage.FromString(wire.encode_batch_message(0, 0, BATCH, payload, wire.Codec.MSGPACK,
                                                                [1.0] * BATCH)).batch
    record = learner.connect(pb.Hello(actor_id="bench", policy_version=-1))
    stop = threading.Event()

    def ingest_loop() -> None:
        next_at = time.perf_counter()
        while not stop.is_set():
            batch.seq += 1
            if not learner.ingest(record, batch):
                raise RuntimeError(f"batch {batch.seq} was refused as a duplicate")
            next_at = max(next_at + case.ingest_interval, time.perf_counter())
            stop.wait(max(0.0, next_at - time.perf_counter()))

    ingester = threading.Thread(target=ingest_loop, daemon=True)
    ingester.start()

    def waits_overlapping(start: float, end: float) -> list[Hold]:
        """The ingest thread's acquisitions whose wait overlaps ``[start, end]``."""
        return [h for h in list(lock.holds) if h.thread == ingester.ident and h.asked <= end and h.acquired >= start]

    def overlap(wait: Hold, holds: list[Hold]) -> float:
        """How long, during ``wait``, the lock was held by one of ``holds``."""
        return sum(max(0.0, min(wait.acquired, h.released) - max(wait.asked, h.acquired)) for h in holds)

    results = []
    try:
        for _ in range(runs):
            quiet_start = time.perf_counter()
            time.sleep(2.0)
            quiet = [h.acquired - h.asked for h in waits_overlapping(quiet_start, time.perf_counter())]
            start = time.perf_counter()
            learner.checkpoint()
            end = time.perf_counter()
            deadline = end + 60  # the insert that waited on the checkpoint's end must be recorded
            while not any(h.thread == ingester.ident and h.asked > end for h in list(lock.holds)[-3:]):
                if not ingester.is_alive() or time.perf_counter() > deadline:
                    raise RuntimeError("the ingest thread stopped")
                time.sleep(0.01)
            during = waits_overlapping(start, end)
            holds = [h for h in list(lock.holds) if h.thread == threading.get_ident() and start <= h.acquired <= end]
            longest = max(holds, key=lambda h: h.released - h.acquired)
            stall = max(during, key=lambda h: h.acquired - h.asked)
            results.append({"stall_s": stall.acquired - stall.asked, "stall_held_s": overlap(stall, holds),
                            "checkpoint_s": end - start, "load_1min": os.getloadavg()[0],
                            "inserts_during": len(during), "quiet_stall_s": max(quiet, default=0.0),
                            "longest_hold_s": longest.released - longest.acquired, "longest_hold_cpu_s": longest.cpu,
                            "hold_cpu_max_s": max(h.cpu for h in holds), "holds": len(holds),
                            "held_s": sum(h.released - h.acquired for h in holds)})
            lock.holds.clear()
    finally:
        stop.set()
        ingester.join()
    checkpoint_bytes = sum(p.stat().st_size for p in Path(workdir).rglob("*.part"))
    medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    return {"case": case_name, "actorlearner": actorlearner.__file__, "runs": results, "median": medians,
            "checkpoint_bytes": checkpoint_bytes, "items_in_replay": len(learner.replay), "peak_rss_bytes": peak_rss}


def run_tree(tree: Path, case: str, runs: int, workroot: str) -> dict:
    """``measure`` in a child process that imports actorlearner from ``tree``."""
    workdir = tempfile.mkdtemp(prefix=f"bench-ckpt-{case}-", dir=workroot)
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, __file__, "--child", "--case", case, "--runs", str(runs),
                              "--workdir", workdir], env=env, check=True, stdout=subprocess.PIPE, text=True,
                             preexec_fn=tied_to_this_process())
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected = tree.resolve() / "actorlearner" / "__init__.py"
    if Path(result["actorlearner"]).resolve() != expected:
        raise RuntimeError(f"the child imported {result['actorlearner']}, not {expected}")
    return result


def report(case: str, after: dict, before: dict | None) -> None:
    """A before/after table of the medians, the stall ratio and the target."""
    a = after["median"]
    print(f"{case}: {after['items_in_replay']:,} items, checkpoint {after['checkpoint_bytes'] / 2**30:.2f} GiB, "
          f"ingest every {CASES[case].ingest_interval * 1e3:.0f} ms, median of {len(after['runs'])} runs")
    ms, count = (lambda v: f"{v * 1e3:9.1f} ms"), (lambda v: f"{v:12.0f}")
    rows = [("longest insert wait during the checkpoint", "stall_s", ms),
            ("  of it, the lock held by the checkpoint", "stall_held_s", ms), ("checkpoint duration", "checkpoint_s", ms),
            ("inserts overlapping the checkpoint", "inserts_during", count),
            ("longest insert wait, no checkpoint", "quiet_stall_s", ms),
            ("longest lock hold by the checkpoint", "longest_hold_s", ms),
            ("  CPU time the checkpoint ran during that hold", "longest_hold_cpu_s", ms),
            ("most CPU time in one hold", "hold_cpu_max_s", ms),
            ("lock holds by the checkpoint", "holds", count), ("time the checkpoint held the lock", "held_s", ms),
            ("load average (1 min) at the checkpoint's end", "load_1min", lambda v: f"{v:12.1f}")]
    print(f"  {'':45s} {'before':>12s} {'after':>12s}")
    for label, key, fmt in rows:
        print(f"  {label:45s} {fmt(before['median'][key]) if before else '':>12s} {fmt(a[key])}")
    gib = [f"{result['peak_rss_bytes'] / 2**30:8.2f} GiB" if result else "" for result in (before, after)]
    print(f"  {'peak RSS of the process':45s} {gib[0]:>12s} {gib[1]}")
    if before:
        print(f"  stall ratio before/after (above 1: after is better): {before['median']['stall_s'] / a['stall_s']:.1f}x")
    worst = max(after["runs"], key=lambda r: r["stall_s"])
    print(f"  50 ms target (median): {'met' if a['stall_s'] <= TARGET_S else 'missed'} (after: {a['stall_s'] * 1e3:.1f} ms; "
          f"worst run {worst['stall_s'] * 1e3:.1f} ms, of it the lock held by the checkpoint "
          f"{worst['stall_held_s'] * 1e3:.1f} ms, load {worst['load_1min']:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=sorted(CASES), default="cartpole")
    parser.add_argument("--runs", type=int, default=5, help="checkpoints measured per tree; medians are reported")
    parser.add_argument("--before-tree", type=Path, help="a source tree (e.g. a git worktree) to measure first")
    parser.add_argument("--tree", type=Path, default=REPO, help="the source tree measured as 'after' (default: this one)")
    parser.add_argument("--workroot", default=tempfile.gettempdir(), help="where checkpoint directories go")
    parser.add_argument("--json", action="store_true", help="also print one JSON line with every run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.case, args.runs, args.workdir)))
        return
    before = run_tree(args.before_tree, args.case, args.runs, args.workroot) if args.before_tree else None
    after = run_tree(args.tree, args.case, args.runs, args.workroot)
    report(args.case, after, before)
    if args.json:
        print(json.dumps({"case": args.case, "before": before, "after": after}))


if __name__ == "__main__":
    main()
