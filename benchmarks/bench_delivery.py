"""Weight delivery, learner CPU and ingest with K simulated actors, straight to the learner or through relays.

A simulated actor is a real Connect stream without an env: it sends a pre-encoded CartPole
batch every ``--batch-interval`` seconds (at most ``--window`` unacked, as the actor's link
does) and reassembles every policy version it is sent. Streams are threads spread over a few
client processes. The learner runs in this process (real gRPC server, no training); relays
are ``actorlearner relay`` processes, each serving an equal share of the actors. The harness
publishes ``--versions`` policy versions ``--publish-interval`` apart and measures, per
version, the time from publish until the last actor holds it (or a newer one: a slow actor
skips versions, latest wins), as p50 and p99 over the versions; the learner process's CPU
seconds per second over that phase, and per stored batch (publishing included); and the transitions per
second stored.

    python benchmarks/bench_delivery.py --actors 64,256,1000 --relays 0,4 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import statistics
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.lifeline import tied_to_this_process
from actorlearner.streaming.service import CONNECT_METHOD
from actorlearner.transport import grpc_options
from actorlearner.v1 import learner_pb2 as pb
from bench_scale import cartpole_payload

MESSAGE_LIMIT = 16 << 20


def client_process(addresses: list[str], hello_bytes: bytes, first_id: int, streams: int, payload: bytes, n: int,
                   window: int, interval: float, stop, ready, received) -> None:
    """``streams`` simulated actors as threads (actor i dials ``addresses[i % len]``); puts into ``received``
    each actor's list of (version, monotonic time it was whole)."""
    calls = []
    priorities = [1.0] * n  # the learner's Welcome asks dqn actors for them

    def one_stream(index: int, connected: threading.Event, log: list) -> None:
        hello = pb.Hello.FromString(hello_bytes)
        hello.actor_id = f"sim-{first_id + index}"
        hello_message = pb.ActorMessage(hello=hello).SerializeToString()
        credits = threading.Semaphore(window)
        assembler = wire.ChunkAssembler(MESSAGE_LIMIT)
        address = addresses[(first_id + index) % len(addresses)]
        with grpc.insecure_channel(address, options=grpc_options(MESSAGE_LIMIT)) as channel:
            connect = channel.stream_stream(CONNECT_METHOD, request_serializer=None,
                                            response_deserializer=pb.LearnerMessage.FromString)

            def requests():
                yield hello_message
                seq, next_at = time.time_ns() // 1000, time.monotonic()
                while not stop.is_set():
                    if time.monotonic() < next_at:
                        stop.wait(min(0.05, next_at - time.monotonic()))
                        continue
                    if credits.acquire(timeout=0.2):
                        seq += 1
                        next_at += interval
                        yield wire.encode_batch_message(seq, 0, n, payload, wire.Codec.MSGPACK, priorities)

            call = connect(requests())
            calls.append(call)
            try:
                for message in call:
                    kind = message.WhichOneof("kind")
                    if kind == "policy_update":
                        u = message.policy_update
                        if assembler.add(u.version, u.chunk_index, u.chunk_count, u.total_bytes, u.payload) is not None:
                            log.append((u.version, time.monotonic()))
                    elif kind == "welcome":
                        connected.set()
                    elif kind == "ack":
                        credits.release()
            except grpc.RpcError as exc:
                if not stop.is_set():
                    print(f"simulated actor {hello.actor_id}: {exc.code().name} {exc.details()}", file=sys.stderr)

    events = [threading.Event() for _ in range(streams)]
    logs: list[list] = [[] for _ in range(streams)]
    threads = [threading.Thread(target=one_stream, args=(i, events[i], logs[i]), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    for event in events:
        event.wait(120)
    ready.set()
    stop.wait()
    received.put([list(log) for log in logs])  # the versions were all published before the stop
    for call in list(calls):  # the learner keeps a half-closed stream open for weights: end it from here
        call.cancel()
    deadline = time.monotonic() + 30
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def start_relay(upstream: str, max_streams: int) -> tuple[subprocess.Popen, str]:
    """An ``actorlearner relay`` process and the address it listens on."""
    proc = subprocess.Popen([sys.executable, "-m", "actorlearner", "relay", "--upstream", upstream, "--port", "0",
                             "--max-streams", str(max_streams), "--max-message-bytes", str(MESSAGE_LIMIT)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=tied_to_this_process())
    line = proc.stdout.readline()
    match = re.search(r"listening on ([\d.]+:\d+)", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"relay did not report its address: {line!r}")
    return proc, match.group(1)


def held_at(log: list[tuple[int, float]], version: int) -> float | None:
    """When an actor first held ``version`` or a newer one."""
    return next((t for v, t in log if v >= version), None)


def measure(actors: int, relays: int, args, payload: bytes) -> dict:
    learner = Learner(LearnerConfig(env="CartPole-v1", replay_capacity=500_000, eval_every=0,
                                    min_replay_size=10**12, max_message_bytes=MESSAGE_LIMIT, max_unacked=args.window,
                                    num_actors=actors))
    ctx = mp.get_context("spawn")
    relay_procs = []
    with serve(learner, "127.0.0.1", 0, max_streams=(relays or actors) + 8) as port:
        try:
            addresses = [f"127.0.0.1:{port}"]
            if relays:
                started = [start_relay(addresses[0], actors // relays + 8) for _ in range(relays)]
                relay_procs = [proc for proc, _ in started]
                addresses = [address for _, address in started]
            hello = pb.Hello(protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn", env_spec=learner.env_spec,
                             policy_version=-1).SerializeToString()
            processes = min(args.client_processes, actors)
            shares = [actors // processes + (i < actors % processes) for i in range(processes)]
            stop, received, readies, procs, first = ctx.Event(), ctx.Queue(), [], [], 0
            for share in shares:
                ready = ctx.Event()
                readies.append(ready)
                procs.append(ctx.Process(target=client_process, daemon=True, args=(
                    addresses, hello, first, share, payload, args.transitions, args.window, args.batch_interval,
                    stop, ready, received)))
                first += share
            for proc in procs:
                proc.start()
            for ready in readies:
                if not ready.wait(300):
                    raise RuntimeError("simulated actors did not all connect")
            time.sleep(args.warmup)
            published: dict[int, float] = {}
            cpu0, wall0, stored0 = time.process_time(), time.monotonic(), learner.ingestion.inserted_batches
            for _ in range(args.versions):
                learner.progress.version += 1
                published[learner.version] = time.monotonic()
                learner.training.publish(); learner.publishing.flush()
                time.sleep(args.publish_interval)
            time.sleep(args.drain)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            batches = learner.ingestion.inserted_batches - stored0
            stored = batches * args.transitions
            stop.set()
            logs = [log for _ in procs for log in received.get(timeout=120)]
            for proc in procs:
                proc.join(30)
        finally:
            for proc in relay_procs:
                proc.terminate()
                proc.wait(30)
    delays, missing = [], 0
    for version, at in published.items():
        held = [held_at(log, version) for log in logs]
        if any(t is None for t in held):
            missing += 1
            continue
        delays.append(max(held) - at)
    return {"actors": actors, "relays": relays, "learner_streams": relays or actors,
            "delivery_p50_ms": round(1000 * float(np.percentile(delays, 50)), 1) if delays else None,
            "delivery_p99_ms": round(1000 * float(np.percentile(delays, 99)), 1) if delays else None,
            "versions_not_delivered": missing, "learner_cpu_s_per_s": round(cpu / wall, 3),
            "learner_cpu_ms_per_batch": round(1000 * cpu / batches, 3) if batches else None,
            "ingest_transitions_s": round(stored / wall),
            "offered_transitions_s": round(actors * args.transitions / args.batch_interval)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", default="64,256,1000", help="comma-separated actor counts")
    parser.add_argument("--relays", default="0,4", help="comma-separated relay counts (0: straight to the learner)")
    parser.add_argument("--transitions", type=int, default=64, help="transitions per batch")
    parser.add_argument("--batch-interval", type=float, default=1.0, help="seconds between an actor's batches")
    parser.add_argument("--window", type=int, default=4, help="unacked batches per actor")
    parser.add_argument("--versions", type=int, default=20, help="policy versions published per run")
    parser.add_argument("--publish-interval", type=float, default=0.5, help="seconds between versions")
    parser.add_argument("--client-processes", type=int, default=4, help="processes the actors are spread over")
    parser.add_argument("--runs", type=int, default=3, help="runs per setting; medians are reported")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--drain", type=float, default=3.0, help="seconds after the last version before counting")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()

    payload = cartpole_payload(args.transitions)
    rows = []
    for actors in [int(a) for a in args.actors.split(",")]:
        for relays in [int(r) for r in args.relays.split(",")]:
            runs = [measure(actors, relays, args, payload) for _ in range(args.runs)]
            row = dict(runs[0])
            for key in ("delivery_p50_ms", "delivery_p99_ms", "learner_cpu_s_per_s", "learner_cpu_ms_per_batch",
                        "ingest_transitions_s", "versions_not_delivered"):
                values = [r[key] for r in runs if r[key] is not None]
                row[key] = statistics.median(values) if values else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("| actors | relays | learner streams | delivery p50 ms | delivery p99 ms | learner CPU s/s | "
          "learner CPU ms/batch | ingest transitions/s (offered) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['actors']} | {r['relays']} | {r['learner_streams']} | {r['delivery_p50_ms']} | "
              f"{r['delivery_p99_ms']} | {r['learner_cpu_s_per_s']} | {r['learner_cpu_ms_per_batch']} | "
              f"{r['ingest_transitions_s']:,} "
              f"({r['offered_transitions_s']:,}) |")
    if args.json:
        print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    main()
