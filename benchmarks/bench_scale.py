"""Learner ingest as concurrent actor streams multiply: aggregate transitions/s at 1..1,024 streams.

Lightweight clients: each stream is a thread (a few client processes hold them all) that, once
every stream is welcomed, sends the same pre-encoded CartPole batch with rising seqs, at most
``--window`` unacked, exactly as the actor's link does. The learner runs in this process (real gRPC server,
decode, validate, insert; no training). Each count's rate is also given as a ratio to the
rate with 1 stream and with 8 streams (above 1: more throughput). Writes a PNG of
throughput against streams.

    python benchmarks/bench_scale.py --streams 1,8,64,256,1024 --json --plot benchmarks/scale.png
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import threading
import time

import grpc
import numpy as np

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.lifeline import end_with_parent
from actorlearner.streaming.service import CONNECT_METHOD
from actorlearner.transport import grpc_options
from actorlearner.v1 import learner_pb2 as pb

MESSAGE_LIMIT = 16 << 20


def cartpole_payload(transitions: int) -> bytes:
    rng = np.random.default_rng(0)
    obs = rng.random((transitions, 4), dtype=np.float32)
    return wire.encode_batch({"obs": obs, "action": np.zeros(transitions, np.int64),
                              "reward": np.ones(transitions, np.float32),
                              "discount": np.full(transitions, 0.99, np.float32), "next_obs": obs})


def client_process(parent_pid: int, address: str, hello_bytes: bytes, first_id: int, streams: int, payload: bytes,
                   n: int, window: int, stop, ready, go) -> None:
    """``streams`` streams as threads, each sending batches with a bounded unacked window once ``go`` is set (every
    client's streams welcomed: streams opening while others already send would measure connection storms); it ends
    with the benchmark."""
    end_with_parent(parent_pid)
    priorities = [1.0] * n  # the learner's Welcome asks dqn actors for them
    def one_stream(actor_id: str, connected: threading.Event) -> None:
        hello = pb.Hello.FromString(hello_bytes)
        hello.actor_id = actor_id
        hello_message = pb.ActorMessage(hello=hello).SerializeToString()
        credits = threading.Semaphore(window)
        with grpc.insecure_channel(address, options=grpc_options(MESSAGE_LIMIT)) as channel:
            connect = channel.stream_stream(CONNECT_METHOD, request_serializer=None,
                                            response_deserializer=pb.LearnerMessage.FromString)

            def requests():
                yield hello_message
                while not (go.wait(0.2) or stop.is_set()):
                    pass
                seq = 0
                while not stop.is_set():
                    if credits.acquire(timeout=0.2):
                        seq += 1
                        yield wire.encode_batch_message(seq, 0, n, payload, wire.Codec.MSGPACK, priorities)

            call = connect(requests())
            try:
                for message in call:
                    kind = message.WhichOneof("kind")
                    if kind == "welcome":
                        connected.set()
                    elif kind == "ack":
                        credits.release()
            except grpc.RpcError:
                pass

    events = [threading.Event() for _ in range(streams)]
    threads = [threading.Thread(target=one_stream, args=(f"s{first_id + i}", e), daemon=True)
               for i, e in enumerate(events)]
    for thread in threads:
        thread.start()
    for event in events:
        event.wait(60)
    ready.set()
    stop.wait()
    for thread in threads:
        thread.join(5)


def measure(counter, clients: list[mp.Process], stop, readies, go, warmup: float, seconds: float) -> float:
    """Count per second of ``counter()`` over ``seconds`` after ``warmup``, clients running."""
    for proc in clients:
        proc.start()
    try:
        for ready in readies:
            if not ready.wait(120):
                raise RuntimeError("a client never got ready")
        go.set()
        time.sleep(warmup)
        start_count, start = counter(), time.monotonic()
        time.sleep(seconds)
        return (counter() - start_count) / (time.monotonic() - start)
    finally:
        stop.set()
        for proc in clients:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()


def aggregate_rate(streams: int, args, payload: bytes, n: int) -> float:
    """Aggregate transitions/s into the buffer with ``streams`` concurrent streams."""
    learner = Learner(LearnerConfig(env="CartPole-v1", replay_capacity=200_000, eval_every=0, min_replay_size=10**12,
                                    max_message_bytes=MESSAGE_LIMIT, max_unacked=args.window))
    ctx = mp.get_context("spawn")
    with serve(learner, "127.0.0.1", 0, max_streams=streams + 8) as port:
        hello = pb.Hello(protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn", env_spec=learner.env_spec,
                         policy_version=-1).SerializeToString()
        processes = min(args.client_processes, streams)
        shares = [streams // processes + (i < streams % processes) for i in range(processes)]
        stop, go, readies, procs, first = ctx.Event(), ctx.Event(), [], [], 0
        for share in shares:
            ready = ctx.Event()
            readies.append(ready)
            procs.append(ctx.Process(target=client_process, daemon=True,
                                     args=(os.getpid(), f"127.0.0.1:{port}", hello, first, share, payload, n,
                                           args.window, stop, ready, go)))
            first += share
        batches_per_s = measure(lambda: learner.ingestion.inserted_batches, procs, stop, readies, go, args.warmup,
                                args.seconds)
    return batches_per_s * n


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["streams"] for r in rows], [r["transitions_s"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent actor streams")
    ax.set_ylabel("transitions/s into the replay buffer")
    ax.set_title("Learner ingest against concurrent streams (CartPole batches)")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", default="1,8,64,256", help="comma-separated stream counts")
    parser.add_argument("--transitions", type=int, default=256, help="transitions per batch (256: a 12.5 KB message)")
    parser.add_argument("--window", type=int, default=8, help="unacked batches per stream")
    parser.add_argument("--client-processes", type=int, default=4, help="processes the streams are spread over")
    parser.add_argument("--runs", type=int, default=3, help="runs per count; the median is reported")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--plot", default="", help="write a PNG of throughput against streams here")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()

    payload = cartpole_payload(args.transitions)
    rows = []
    for streams in [int(s) for s in args.streams.split(",")]:
        rate = statistics.median(aggregate_rate(streams, args, payload, args.transitions) for _ in range(args.runs))
        rows.append({"streams": streams, "transitions_s": round(rate), "mb_s": round(rate * len(payload) / args.transitions / 1e6, 1)})
    references = {"vs_1_stream": 1, "vs_8_streams": 8}  # ratio to that count's rate, if it was measured
    for key, count in references.items():
        reference = next((r["transitions_s"] for r in rows if r["streams"] == count), None)
        for r in rows:
            r[key] = round(r["transitions_s"] / reference, 3) if reference else None
    print("| streams | transitions/s | MB/s | vs 1 stream | vs 8 streams |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        ratios = " | ".join("-" if r[key] is None else f"{r[key]:.2f}x" for key in references)
        print(f"| {r['streams']} | {r['transitions_s']:,} | {r['mb_s']} | {ratios} |")
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        print(json.dumps({"transitions_per_batch": args.transitions, "message_bytes": len(payload), "rows": rows}))


if __name__ == "__main__":
    main()
