"""Learner ingest (decode, validate, insert into replay) against a bare gRPC stream sink, same run.

K client processes send pre-generated ~1 MB TrajectoryBatches (no env cost) through the
actor's real streaming client (window, acks). The clients start once and serve every run, every
side, one line printed per run (starting K interpreters per run made ``--actors 8`` look hung). Ours:
a learner that decodes, validates and inserts each batch into the replay buffer before acking it.
Baselines: a bare gRPC bidirectional stream that receives the same bytes and acks each message,
nothing else, on grpcio's sync server (the target's reference) and on grpc.aio (the learner's kind).

    python benchmarks/bench_ingest.py --actors 2 --obs cartpole --json
    python benchmarks/bench_ingest.py --actors 2 --obs atari --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import threading
import time
from concurrent import futures

import grpc
import gymnasium as gym
import numpy as np

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.learner import Learner
from actorlearner.learner.server import serve
from actorlearner.lifeline import end_with_parent
from actorlearner.transport import grpc_options
from actorlearner.v1 import learner_pb2 as pb

MESSAGE_LIMIT = 16 << 20
OBS = {"cartpole": ((4,), np.float32), "atari": ((84, 84, 4), np.uint8)}
BARE_METHOD = "/bench.Sink/Stream"


class AtariShapedEnv(gym.Env):
    """An env with Atari-sized frames, only so the learner's spec and buffer have that shape."""

    observation_space = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    action_space = gym.spaces.Discrete(6)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


def env_id(obs: str) -> str:
    if obs == "cartpole":
        return "CartPole-v1"
    if "BenchAtariShaped-v0" not in gym.registry:
        gym.register("BenchAtariShaped-v0", entry_point=AtariShapedEnv)
    return "BenchAtariShaped-v0"


def make_payload(obs: str, message_bytes: int) -> tuple[bytes, int]:
    """An encoded batch of about ``message_bytes`` and its number of transitions."""
    shape, dtype = OBS[obs]
    per_item = 2 * int(np.prod(shape)) * np.dtype(dtype).itemsize + 16
    n = max(1, message_bytes // per_item)
    rng = np.random.default_rng(0)
    frames = (rng.random((n, *shape)) * (255 if dtype == np.uint8 else 1)).astype(dtype)
    fields = {"obs": frames, "action": rng.integers(0, 2, n).astype(np.int64),
              "reward": np.ones(n, np.float32), "discount": np.full(n, 0.99, np.float32), "next_obs": frames.copy()}
    return wire.encode_batch(fields), n


# -- clients (separate processes, started once and kept for every run) ------------------------

def client(parent_pid: int, payload: bytes, n: int, window: int, commands, stop, ready, done) -> None:
    """Serve runs until told to end (None) or the benchmark ends: each command ``(side, address, hello bytes)``
    sends until ``stop``, then sets ``done``. Torch and the link import once, not once per run."""
    from actorlearner.actor.link import LearnerLink

    end_with_parent(parent_pid)

    while (command := commands.get()) is not None:
        side, address, hello_bytes = command
        if side == "ours":
            learner_client(LearnerLink, address, hello_bytes, payload, n, stop, ready)
        else:
            bare_client(address, payload, window, stop, ready)
        done.set()


def learner_client(link_class, address: str, hello_bytes: bytes, payload: bytes, n: int, stop, ready) -> None:
    """Send the same batch with rising seqs through the actor's real streaming client."""
    link = link_class(address, pb.Hello.FromString(hello_bytes), MESSAGE_LIMIT).start()
    link.welcomed.wait(30)
    ready.set()
    seq, priorities = 0, [1.0] * n  # the learner's Welcome asks dqn actors for priorities
    while not stop.is_set():
        seq += 1
        message = wire.encode_batch_message(seq, 0, n, payload, wire.Codec.MSGPACK, priorities)
        while not link.send_batch(seq, message, timeout=0.2):
            if stop.is_set():
                break
    link.close()


def bare_client(address: str, payload: bytes, window: int, stop, ready) -> None:
    """Send the same bytes down a bare stream, at most ``window`` unacked, like the real client."""
    with grpc.insecure_channel(address, options=grpc_options(MESSAGE_LIMIT)) as channel:
        stream = channel.stream_stream(BARE_METHOD, request_serializer=None, response_deserializer=None)
        credits = threading.Semaphore(window)

        def requests():
            ready.set()
            while not stop.is_set():
                if credits.acquire(timeout=0.2):
                    yield payload

        call = stream(requests())
        try:
            for _ack in call:
                credits.release()
        except grpc.RpcError:
            pass


class Clients:
    """K client processes kept across runs; :meth:`run` points them at a server for one measurement."""

    def __init__(self, ctx, count: int, payload: bytes, n: int, window: int):
        self.stop = ctx.Event()
        self.readies = [ctx.Event() for _ in range(count)]
        self.dones = [ctx.Event() for _ in range(count)]
        self.queues = [ctx.Queue() for _ in range(count)]
        self.procs = [ctx.Process(target=client, daemon=True, args=(os.getpid(), payload, n, window, q, self.stop, r, d))
                      for q, r, d in zip(self.queues, self.readies, self.dones)]
        for proc in self.procs:
            proc.start()

    def run(self, side: str, address: str, hello: pb.Hello | None, counter, warmup: float, seconds: float) -> tuple[float, float]:
        """Count per second of ``counter()`` and this process's CPU seconds per count, over ``seconds``
        after ``warmup``, with every client sending to ``address``."""
        self.stop.clear()
        for i, (queue, ready, done) in enumerate(zip(self.queues, self.readies, self.dones)):
            ready.clear()
            done.clear()
            if hello is not None:
                hello.actor_id = f"bench-{i}"
            queue.put((side, address, b"" if hello is None else hello.SerializeToString()))
        try:
            for ready in self.readies:
                if not ready.wait(120):
                    raise RuntimeError("a client never got ready")
            time.sleep(warmup)
            start_count, start, cpu = counter(), time.monotonic(), time.process_time()
            time.sleep(seconds)
            count, cpu = counter() - start_count, time.process_time() - cpu
            return count / (time.monotonic() - start), cpu / max(count, 1)
        finally:
            self.stop.set()
            for done in self.dones:
                done.wait(30)

    def close(self) -> None:
        for queue in self.queues:
            queue.put(None)
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()


# -- servers ---------------------------------------------------------------------------------

class BareSink:
    """A gRPC server that counts the bytes it receives and acks each message."""

    def __init__(self):
        self.bytes = 0
        self._lock = threading.Lock()
        handler = grpc.stream_stream_rpc_method_handler(self._stream)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=grpc_options(MESSAGE_LIMIT))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Sink", {"Stream": handler}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _stream(self, request_iterator, context):
        for message in request_iterator:
            with self._lock:
                self.bytes += len(message)
            yield b"k"

    def stop(self):
        self.server.stop(1).wait()


class AioBareSink:
    """:class:`BareSink` written on grpc.aio (one event loop of its own), the server kind the learner runs."""

    def __init__(self):
        self.bytes = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()

    async def _start(self) -> int:
        self.server = grpc.aio.server(options=grpc_options(MESSAGE_LIMIT))
        handler = grpc.stream_stream_rpc_method_handler(self._stream)
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Sink", {"Stream": handler}),))
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    async def _stream(self, request_iterator, context):
        while (message := await context.read()) is not grpc.aio.EOF:
            self.bytes += len(message)
            await context.write(b"k")

    def stop(self):
        asyncio.run_coroutine_threadsafe(self.server.stop(1), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


def run_ours(clients: Clients, args, n: int, message_bytes: int) -> tuple[float, float]:
    """Bytes per second of accepted payload into our learner's replay buffer, and the learner's
    CPU seconds per batch."""
    capacity = max(50_000, n * 64) if args.obs == "cartpole" else 4_000
    config = LearnerConfig(env=env_id(args.obs), replay_capacity=capacity, eval_every=0, max_unacked=args.window,
                           min_replay_size=10**12, max_message_bytes=MESSAGE_LIMIT)
    learner = Learner(config)
    with serve(learner, "127.0.0.1", 0) as port:
        hello = pb.Hello(protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn", env_spec=learner.env_spec,
                         policy_version=-1)
        batches_per_s, cpu = clients.run("ours", f"127.0.0.1:{port}", hello, lambda: learner.ingestion.inserted_batches,
                                         args.warmup, args.seconds)
    return batches_per_s * message_bytes, cpu


def run_baseline(clients: Clients, args, message_bytes: int, sink_class) -> tuple[float, float]:
    """Bytes per second into a bare sink (``sink_class``), and its CPU seconds per message."""
    sink = sink_class()
    try:
        bytes_per_s, cpu = clients.run("bare", f"127.0.0.1:{sink.port}", None, lambda: sink.bytes, args.warmup,
                                       args.seconds)
        return bytes_per_s, cpu * message_bytes
    finally:
        sink.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, default=2, help="client processes")
    parser.add_argument("--obs", choices=sorted(OBS), default="cartpole", help="observation size of the batches")
    parser.add_argument("--message-mb", type=float, default=1.0, help="size of one batch message, MB")
    parser.add_argument("--window", type=int, default=8, help="unacked batches per client (both sides)")
    parser.add_argument("--runs", type=int, default=5, help="runs per side; the median is reported")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()

    payload, n = make_payload(args.obs, int(args.message_mb * 1e6))
    clients = Clients(mp.get_context("spawn"), args.actors, payload, n, args.window)
    sides = {"ours": lambda: run_ours(clients, args, n, len(payload)),
             "bare": lambda: run_baseline(clients, args, len(payload), BareSink),
             "bare_aio": lambda: run_baseline(clients, args, len(payload), AioBareSink)}
    rates, cpus = {side: [] for side in sides}, {side: [] for side in sides}
    try:
        for run in range(args.runs):
            for side, measure in sides.items():
                rate, cpu = measure()
                rates[side].append(rate)
                cpus[side].append(cpu)
            print(f"run {run + 1}/{args.runs}: " + ", ".join(
                f"{side} {rates[side][-1] / 1e6:.1f} MB/s ({1e3 * cpus[side][-1]:.2f} ms CPU/message)" for side in sides),
                  flush=True)
    finally:
        clients.close()
    mb = {side: statistics.median(r) / 1e6 for side, r in rates.items()}
    ms = {side: 1e3 * statistics.median(c) for side, c in cpus.items()}
    result = {"obs": args.obs, "actors": args.actors, "message_bytes": len(payload),
              "transitions_per_message": n, "ingest_mb_s": round(mb["ours"], 1), "baseline_mb_s": round(mb["bare"], 1),
              "baseline_aio_mb_s": round(mb["bare_aio"], 1), "ratio": round(mb["ours"] / mb["bare"], 3),
              "ratios": [round(o / b, 3) for o, b in zip(rates["ours"], rates["bare"])],
              "ratio_aio": round(mb["ours"] / mb["bare_aio"], 3),
              "server_cpu_ms_per_message": round(ms["ours"], 3), "baseline_cpu_ms_per_message": round(ms["bare"], 3),
              "baseline_aio_cpu_ms_per_message": round(ms["bare_aio"], 3),
              "transitions_s": round(mb["ours"] * 1e6 / len(payload) * n), "runs": args.runs}
    print("| obs | actors | message | ours MB/s | bare gRPC MB/s (sync, aio) | ratio (sync, aio) "
          "| server CPU ms/message: ours, bare sync, bare aio | transitions/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.obs} | {args.actors} | {len(payload) / 1e6:.2f} MB | {mb['ours']:.1f} | {mb['bare']:.1f}, "
          f"{mb['bare_aio']:.1f} | {result['ratio']:.2f}x, {result['ratio_aio']:.2f}x | {ms['ours']:.2f}, "
          f"{ms['bare']:.2f}, {ms['bare_aio']:.2f} | {result['transitions_s']:,} |")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
