"""Learner ingest (decode, validate, insert into replay) against a bare gRPC stream sink, same run.

K client processes send pre-generated ~1 MB TrajectoryBatches (no env cost) through the
actor's real streaming client (window, acks). The clients start once and serve every run, both
sides, one line printed per run (starting K interpreters per run made ``--actors 8`` look hung). Ours: a learner that decodes, validates
and inserts each batch into the replay buffer before acking it. Baseline: a bare gRPC
bidirectional stream that receives the same bytes and acks each message, nothing else.

    python benchmarks/bench_ingest.py --actors 2 --obs cartpole --json
    python benchmarks/bench_ingest.py --actors 2 --obs atari --json
    python benchmarks/bench_ingest.py --actors 2 --obs atari --server aio   # Connect on grpc.aio instead
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
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

def client(payload: bytes, n: int, window: int, commands, stop, ready, done) -> None:
    """Serve runs until told to end (None): each command ``(side, address, hello bytes)`` sends until
    ``stop``, then sets ``done``. Torch and the link import once, not once per run."""
    from actorlearner.actor.link import LearnerLink

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
        self.procs = [ctx.Process(target=client, daemon=True, args=(payload, n, window, q, self.stop, r, d))
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


def serialize(message: pb.LearnerMessage | bytes) -> bytes:
    """A LearnerMessage's bytes; bytes (a policy version, serialized once) as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


class AioLearnerServer:
    """The learner's Connect stream on grpc.aio, to weigh against the sync server the product runs:
    Welcome and the current policy, then each batch ingested on the event loop and acked. Only what
    this benchmark exercises (no Hello checks, auth, status or drain)."""

    def __init__(self, learner: Learner):
        self.learner = learner
        self._started = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self._thread.start()
        self._started.wait(30)

    async def _connect(self, request_iterator, context):
        first = await context.read()
        stream = self.learner.connect(first.hello)
        version, messages = self.learner.broadcast.latest()
        await context.write(pb.LearnerMessage(welcome=self.learner.welcome(stream, version)))
        for message in messages:
            await context.write(message)
        try:
            while (message := await context.read()) is not grpc.aio.EOF:
                inserted = self.learner.ingest(stream, message.batch)
                await context.write(pb.LearnerMessage(ack=pb.Ack(seq=message.batch.seq, accepted=True,
                                                                 reason="" if inserted else "duplicate")))
        finally:
            self.learner.disconnect(stream)

    async def _serve(self):
        server = grpc.aio.server(options=grpc_options(MESSAGE_LIMIT))
        handler = grpc.stream_stream_rpc_method_handler(self._connect, request_deserializer=pb.ActorMessage.FromString,
                                                        response_serializer=serialize)
        name = pb.DESCRIPTOR.services_by_name["Learner"].full_name
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, {"Connect": handler}),))
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._started.set()
        await self._stop.wait()
        await server.stop(1)

    def stop(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@contextlib.contextmanager
def learner_server(learner: Learner, kind: str):
    """The learner served by the product's sync server or by :class:`AioLearnerServer`; yields the port."""
    if kind == "sync":
        with serve(learner, "127.0.0.1", 0) as port:
            yield port
        return
    server = AioLearnerServer(learner)
    try:
        yield server.port
    finally:
        server.stop()


def run_ours(clients: Clients, args, n: int, message_bytes: int) -> tuple[float, float]:
    """Bytes per second of accepted payload into our learner's replay buffer, and the learner's
    CPU seconds per batch."""
    capacity = max(50_000, n * 64) if args.obs == "cartpole" else 4_000
    config = LearnerConfig(env=env_id(args.obs), replay_capacity=capacity, eval_every=0, max_unacked=args.window,
                           min_replay_size=10**12, max_message_bytes=MESSAGE_LIMIT)
    learner = Learner(config)
    with learner_server(learner, args.server) as port:
        hello = pb.Hello(protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn", env_spec=learner.env_spec,
                         policy_version=-1)
        batches_per_s, cpu = clients.run("ours", f"127.0.0.1:{port}", hello, lambda: learner.ingestion.inserted_batches,
                                         args.warmup, args.seconds)
    return batches_per_s * message_bytes, cpu


def run_baseline(clients: Clients, args, message_bytes: int) -> tuple[float, float]:
    """Bytes per second into the bare sink, and its CPU seconds per message."""
    sink = BareSink()
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
    parser.add_argument("--server", choices=("sync", "aio"), default="sync",
                        help="our side: the product's sync gRPC server, or the same Connect stream on grpc.aio")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()

    payload, n = make_payload(args.obs, int(args.message_mb * 1e6))
    clients = Clients(mp.get_context("spawn"), args.actors, payload, n, args.window)
    ours, baseline, ours_cpu, base_cpu = [], [], [], []
    try:
        for run in range(args.runs):
            rate, cpu = run_ours(clients, args, n, len(payload))
            ours.append(rate)
            ours_cpu.append(cpu)
            rate, cpu = run_baseline(clients, args, len(payload))
            baseline.append(rate)
            base_cpu.append(cpu)
            print(f"run {run + 1}/{args.runs}: ours {ours[-1] / 1e6:.1f} MB/s ({1e3 * ours_cpu[-1]:.2f} ms CPU/message), "
                  f"bare {baseline[-1] / 1e6:.1f} MB/s ({1e3 * base_cpu[-1]:.2f} ms CPU/message)", flush=True)
    finally:
        clients.close()
    ours_mb, base_mb = statistics.median(ours) / 1e6, statistics.median(baseline) / 1e6
    ours_ms, base_ms = 1e3 * statistics.median(ours_cpu), 1e3 * statistics.median(base_cpu)
    result = {"obs": args.obs, "server": args.server, "actors": args.actors, "message_bytes": len(payload),
              "transitions_per_message": n, "ingest_mb_s": round(ours_mb, 1), "baseline_mb_s": round(base_mb, 1),
              "ratio": round(ours_mb / base_mb, 3), "ratios": [round(o / b, 3) for o, b in zip(ours, baseline)],
              "server_cpu_ms_per_message": round(ours_ms, 3), "baseline_cpu_ms_per_message": round(base_ms, 3),
              "transitions_s": round(ours_mb * 1e6 / len(payload) * n), "runs": args.runs}
    print("| obs | server | actors | message | ours MB/s | bare gRPC MB/s | ratio | server CPU ms/message: ours, bare "
          "| transitions/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {args.obs} | {args.server} | {args.actors} | {len(payload) / 1e6:.2f} MB | {ours_mb:.1f} | {base_mb:.1f} | "
          f"{ours_mb / base_mb:.2f}x | {ours_ms:.2f}, {base_ms:.2f} | {result['transitions_s']:,} |")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
