"""Soak: many actor streams against one learner for minutes; resident memory must stay flat.

A real ``actorlearner learner`` process (training, evaluating, checkpointing) and
``--processes`` client processes that together hold ``--streams`` Connect streams: each
stream is a real :class:`actorlearner.actor.actor.Actor` (CartPole envs, a local policy
that takes every published version, the real link with its window, acks and chunked
policy updates), several per process in threads so that 32 streams fit on 2 cores. The
learner's rate limiter paces them all. Every ``--sample-every`` seconds the script reads
VmRSS from /proc for the learner and each client process, and GetStatus for progress.

After ``--warmup`` (replay full, allocator pools grown), growth is the mean RSS over the
last minute against the mean over the first minute after warm-up. The run fails (exit 1)
when any process grows more than ``--max-growth``, or on any error: a process that
dies or exits non-zero, a stream that reconnects or is refused, a stream not connected at
the end, an error logged by the learner, or ingest that stops.

    python benchmarks/soak.py --minutes 10 --streams 32            # table, then one JSON line
    python benchmarks/soak.py --minutes 1 --streams 8 --warmup 20  # a quick check
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

from actorlearner.lifeline import tied_to_this_process
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

ENV = "CartPole-v1"


def rss_mib(pid: int) -> float | None:
    """Resident memory of a process in MiB (VmRSS), or None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def status(port: int) -> pb.StatusResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=10)


# --------------------------------------------------------------------------- client processes


def worker(learner: str, index: int, streams: int, num_envs: int) -> int:
    """Run ``streams`` actors in threads until SIGTERM; print a JSON summary; 0 if none failed."""
    from actorlearner.actor.actor import Actor
    from actorlearner.config import ActorConfig

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    actors = [Actor(ActorConfig(learner=learner, env=ENV, actor_id=f"soak-{index}-{i}", num_envs=num_envs,
                                seed=1000 * index + i)) for i in range(streams)]
    errors: list[str] = []

    def run(actor: Actor) -> None:
        try:
            actor.run()
        except Exception as exc:  # noqa: BLE001 - every failure is reported, none is fatal to the others
            errors.append(f"{actor.actor_id}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(a,), name=a.actor_id, daemon=True) for a in actors]
    for thread in threads:
        thread.start()
    while not stop.wait(1.0):
        if not any(t.is_alive() for t in threads):
            break
    for actor in actors:
        actor.stop()
    for thread in threads:
        thread.join(30)
    stuck = [t.name for t in threads if t.is_alive()]
    errors += [f"{name}: did not stop within 30 s" for name in stuck]
    summary = {"index": index, "streams": streams, "env_steps": sum(a.env_steps for a in actors),
               "batches": sum(a.batches_sent for a in actors), "reconnects": sum(a.link.reconnects for a in actors),
               "errors": errors}
    print(json.dumps(summary), flush=True)
    return 0 if not errors and summary["reconnects"] == 0 else 1


# --------------------------------------------------------------------------- the run


def growth(samples: list[tuple[float, float]], start: float, window: float) -> dict:
    """RSS at the start and end of the measured part (means over ``window`` s), growth and slope."""
    measured = [(t, m) for t, m in samples if t >= start]
    if len(measured) < 2:
        return {"start_mib": None, "end_mib": None, "growth": None, "slope_mib_per_min": None, "peak_mib": None}
    first = [m for t, m in measured if t < measured[0][0] + window] or [measured[0][1]]
    last = [m for t, m in measured if t > measured[-1][0] - window] or [measured[-1][1]]
    begin, end = statistics.fmean(first), statistics.fmean(last)
    slope = statistics.linear_regression([t for t, _ in measured], [m for _, m in measured]).slope * 60
    return {"start_mib": round(begin, 1), "end_mib": round(end, 1), "growth": round(end / begin - 1, 4),
            "slope_mib_per_min": round(slope, 2), "peak_mib": round(max(m for _, m in measured), 1)}


def learner_errors(log: Path) -> list[str]:
    """Lines of the learner's log that mean something went wrong."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return [line for line in text.splitlines() if re.search(r" (ERROR|CRITICAL) |Traceback|sent bad input", line)]


def soak(args: argparse.Namespace, workdir: Path) -> dict:
    duration, warmup = args.minutes * 60, args.warmup
    learner_log = workdir / "learner.log"
    learner_cmd = [sys.executable, "-m", "actorlearner", "learner", "--port", "0", "--env", ENV,
                   "--num-actors", str(args.streams), "--max-streams", str(args.streams + 8),
                   "--replay-capacity", str(args.replay_capacity), "--eval-every", "30", "--eval-episodes", "5",
                   "--eval-envs", "5", "--checkpoint-dir", str(workdir / "ckpt"), "--checkpoint-every", "60"]
    with open(learner_log, "w") as log:
        learner = subprocess.Popen(learner_cmd, stdout=subprocess.PIPE, stderr=log, text=True,
                                   preexec_fn=tied_to_this_process())
    errors: list[str] = []
    workers: list[subprocess.Popen] = []
    samples: dict[str, list[tuple[float, float]]] = {"learner": []}
    progress: list[dict] = []
    try:
        match = re.search(r":(\d+)$", learner.stdout.readline().strip())
        if not match:
            raise RuntimeError(f"the learner did not start; see {learner_log}")
        port = int(match.group(1))
        per_process = [args.streams // args.processes + (i < args.streams % args.processes)
                       for i in range(args.processes)]
        for i, streams in enumerate(per_process):
            with open(workdir / f"worker-{i}.log", "w") as log:
                workers.append(subprocess.Popen(
                    [sys.executable, __file__, "worker", "--learner", f"127.0.0.1:{port}", "--index", str(i),
                     "--streams", str(streams), "--num-envs", str(args.num_envs)],
                    stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=tied_to_this_process()))
            samples[f"clients-{i}"] = []
        start = time.monotonic()
        deadline = time.monotonic() + 180
        while sum(a.connected for a in status(port).actors) < args.streams:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {sum(a.connected for a in status(port).actors)} of {args.streams} "
                                   "streams connected after 180 s")
            time.sleep(1)
        print(f"[{time.monotonic() - start:5.0f}s] {args.streams} streams connected", file=sys.stderr, flush=True)
        start = time.monotonic()  # the clock starts with every stream open
        next_sample = start
        while (now := time.monotonic()) < start + duration:
            time.sleep(max(0.0, next_sample - now))
            next_sample += args.sample_every
            t = time.monotonic() - start
            for name, proc in [("learner", learner), *((f"clients-{i}", w) for i, w in enumerate(workers))]:
                mib = rss_mib(proc.pid) if proc.poll() is None else None
                if mib is None:
                    errors.append(f"{name} exited early with code {proc.poll()}")
                else:
                    samples[name].append((t, mib))
            if errors:
                break
            try:
                s = status(port)
            except grpc.RpcError as exc:
                errors.append(f"GetStatus failed at {t:.0f}s: {exc.code().name}")
                continue
            connected = [a for a in s.actors if a.connected]
            progress.append({"t": round(t, 1), "inserted": s.inserted, "updates": s.updates, "env_steps": s.env_steps,
                             "version": s.policy_version, "connected": len(connected),
                             "max_lag": max((a.lag for a in connected), default=0), "buffer": s.buffer_size})
            if len(progress) % max(1, int(60 / args.sample_every)) == 1:
                p = progress[-1]
                print(f"[{t:5.0f}s] learner {samples['learner'][-1][1]:.0f} MiB, clients "
                      f"{sum(v[-1][1] for k, v in samples.items() if k != 'learner'):.0f} MiB | {p['connected']} streams"
                      f" | {p['inserted']:,} batches | {p['updates']:,} updates | v{p['version']} (max lag "
                      f"{p['max_lag']}) | buffer {p['buffer']:,}", file=sys.stderr, flush=True)
    finally:
        for proc in workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        summaries = []
        for i, proc in enumerate(workers):
            try:
                out, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            lines = [line for line in (out or "").splitlines() if line.startswith("{")]
            summaries.append(json.loads(lines[-1]) if lines else {"index": i, "errors": ["no summary"]})
            if proc.returncode != 0:
                errors.append(f"clients-{i} exited with code {proc.returncode}")
        if learner.poll() is None:
            learner.send_signal(signal.SIGTERM)
        try:
            learner.wait(60)
        except subprocess.TimeoutExpired:
            learner.kill()
            errors.append("the learner did not stop within 60 s of SIGTERM")
        if learner.returncode not in (0, None):
            errors.append(f"the learner exited with code {learner.returncode}")

    for summary in summaries:
        errors += [f"clients-{summary['index']}: {e}" for e in summary.get("errors", [])]
        if summary.get("reconnects"):
            errors.append(f"clients-{summary['index']}: {summary['reconnects']} reconnects")
    errors += [f"learner log: {line}" for line in learner_errors(learner_log)[:10]]
    if progress:
        if progress[-1]["connected"] != args.streams:
            errors.append(f"{progress[-1]['connected']} of {args.streams} streams connected at the end")
        minute_ago = [p for p in progress if p["t"] <= progress[-1]["t"] - 60]
        if minute_ago and progress[-1]["inserted"] <= minute_ago[-1]["inserted"]:
            errors.append("no batch was inserted in the last minute")

    window = min(60.0, (duration - warmup) / 4)
    memory = {name: growth(series, warmup, window) for name, series in samples.items()}
    clients_total = [(t, sum(samples[k][i][1] for k in samples if k != "learner"))
                     for i, (t, _) in enumerate(samples[next(k for k in samples if k != "learner")])
                     if all(len(samples[k]) > i for k in samples if k != "learner")] if len(samples) > 1 else []
    memory["clients (all)"] = growth(clients_total, warmup, window)
    for name, m in memory.items():
        if m["growth"] is None:
            errors.append(f"{name}: too few samples after warm-up")
        elif m["growth"] > args.max_growth:
            errors.append(f"{name}: RSS grew {m['growth']:.1%} after warm-up (limit {args.max_growth:.0%})")
    measured = [p for p in progress if p["t"] >= warmup]
    rates = {}
    if len(measured) >= 2:
        span = measured[-1]["t"] - measured[0]["t"]
        rates = {"batches_per_s": round((measured[-1]["inserted"] - measured[0]["inserted"]) / span, 1),
                 "env_steps_per_s": round((measured[-1]["env_steps"] - measured[0]["env_steps"]) / span, 1),
                 "updates_per_s": round((measured[-1]["updates"] - measured[0]["updates"]) / span, 1),
                 "versions": measured[-1]["version"] - measured[0]["version"],
                 "max_lag": max(p["max_lag"] for p in measured)}
    return {"minutes": args.minutes, "streams": args.streams, "processes": args.processes,
            "warmup_s": warmup, "samples": len(progress), "memory": memory, "rates": rates,
            "final": progress[-1] if progress else None, "clients": summaries, "errors": errors,
            "ok": not errors}


def markdown(result: dict) -> str:
    rows = ["| process | RSS after warm-up | RSS at the end | growth | slope | peak |", "|---|---:|---:|---:|---:|---:|"]
    for name, m in result["memory"].items():
        if m["growth"] is None:
            rows.append(f"| {name} | - | - | - | - | - |")
            continue
        rows.append(f"| {name} | {m['start_mib']:,.1f} MiB | {m['end_mib']:,.1f} MiB | {m['growth']:+.1%} "
                    f"| {m['slope_mib_per_min']:+.2f} MiB/min | {m['peak_mib']:,.1f} MiB |")
    r = result["rates"]
    if r:
        rows.append("")
        rows.append(f"After warm-up: {r['batches_per_s']:,} batches/s, {r['env_steps_per_s']:,} env steps/s, "
                    f"{r['updates_per_s']:,} updates/s, {r['versions']:,} policy versions, max lag {r['max_lag']}; "
                    f"errors: {len(result['errors'])}.")
    return "\n".join(rows)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        parser = argparse.ArgumentParser(prog="soak.py worker")
        parser.add_argument("worker")
        parser.add_argument("--learner", required=True)
        parser.add_argument("--index", type=int, required=True)
        parser.add_argument("--streams", type=int, required=True)
        parser.add_argument("--num-envs", type=int, default=2)
        args = parser.parse_args()
        return worker(args.learner, args.index, args.streams, args.num_envs)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="measured minutes, from the moment every stream is open")
    parser.add_argument("--streams", type=int, default=32, help="actor streams in all")
    parser.add_argument("--processes", type=int, default=4, help="client processes the streams are spread over")
    parser.add_argument("--num-envs", type=int, default=2, help="CartPole envs per stream")
    parser.add_argument("--warmup", type=float, default=None, help="seconds not measured (default: 2 min, at most 20%%)")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--max-growth", type=float, default=0.10, help="largest RSS growth after warm-up that passes")
    parser.add_argument("--replay-capacity", type=int, default=50_000, help="small, so the buffer is full early")
    parser.add_argument("--workdir", help="keep logs and checkpoints here (default: a temporary directory)")
    args = parser.parse_args()
    if args.warmup is None:
        args.warmup = min(120.0, 0.2 * args.minutes * 60)
    if args.streams < 1 or args.processes < 1 or args.processes > args.streams:
        parser.error("need 1 <= processes <= streams")
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        result = soak(args, Path(args.workdir))
    else:
        with tempfile.TemporaryDirectory(prefix="soak-") as workdir:
            result = soak(args, Path(workdir))
    print(markdown(result))
    for error in result["errors"]:
        print(f"error: {error}", file=sys.stderr)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
