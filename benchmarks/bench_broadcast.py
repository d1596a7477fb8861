"""Policy fan-out: time from publishing a version until every actor stream holds all of it.

Ours: an in-process ``Learner`` served by ``serve()`` on 127.0.0.1; ``learner.broadcast.publish``
encodes the state dict once, chunks it (``chunk_bytes``) and every ``Connect`` stream sends
the chunks. Baseline, same run: a bare ``grpc.server`` whose one generic stream-stream
handler, on a trigger, yields pre-built ``bytes`` (the same serialized LearnerMessage chunks,
so the same bytes in the same sizes) down each stream, with no serializer at all.

Clients are the same for both: N real gRPC streams (a channel each), run as threads spread
over a few spawned client processes so they do not share the learner's GIL. Each sends a
Hello (the learner's env spec, passed as serialized proto bytes), then only reads: it
reassembles PolicyUpdate chunks with ``wire.ChunkAssembler`` and reports the
``time.monotonic()`` (CLOCK_MONOTONIC, comparable across processes on Linux) at which a
version completed. One run = publish (or trigger) one new version, wait for all N streams,
record max(receive time) - publish time. Runs alternate between ours and the baseline so
machine noise hits both alike; medians of ``--runs`` are reported. The ratio is
baseline time / our time, so above 1 means ours is faster.

    python benchmarks/bench_broadcast.py --actors 1,16,64 --mbytes 10 --runs 5 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import threading
import time
from concurrent import futures

import grpc
import torch

from actorlearner import wire
from actorlearner.transport import grpc_options
from actorlearner.v1 import learner_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Learner"].full_name
CONNECT_METHOD = f"/{SERVICE}/Connect"
HOST = "127.0.0.1"
TARGET_RATIO, TARGET_ACTORS = 1 / 1.5, 64  # at most 1.5x the baseline's time


# --------------------------------------------------------------------------- clients (child processes)


class ClientStream:
    """One Connect stream: Hello, then read and reassemble; reports each completed version."""

    def __init__(self, address: str, sid: str, env_spec: pb.EnvSpec, max_message_bytes: int, results):
        self.sid, self.results, self.max_message_bytes = sid, results, max_message_bytes
        self.done = threading.Event()
        self.channel = grpc.insecure_channel(
            address, options=grpc_options(max_message_bytes) + [("grpc.use_local_subchannel_pool", 1)])
        hello = pb.ActorMessage(hello=pb.Hello(actor_id=f"bench-{sid}", protocol_version=wire.PROTOCOL_VERSION,
                                               algorithm="dqn", env_spec=env_spec, policy_version=-1))
        connect = self.channel.stream_stream(CONNECT_METHOD, request_serializer=None,  # requests are bytes
                                             response_deserializer=pb.LearnerMessage.FromString)
        self.call = connect(self._requests(hello.SerializeToString()))
        self.thread = threading.Thread(target=self._read, name=f"client-{sid}", daemon=True)
        self.thread.start()

    def _requests(self, hello: bytes):
        yield hello
        while not self.done.wait(1.0):  # only reads from now on; half-closes when told to stop
            pass

    def _read(self) -> None:
        assembler = wire.ChunkAssembler(self.max_message_bytes * 64)
        try:
            for message in self.call:
                if message.WhichOneof("kind") != "policy_update":
                    continue
                u = message.policy_update
                payload = assembler.add(u.version, u.chunk_index, u.chunk_count, u.total_bytes, u.payload)
                if payload is not None:
                    self.results.put(("got", self.sid, u.version, time.monotonic(), len(payload)))
        except grpc.RpcError as exc:
            if not self.done.is_set():
                self.results.put(("error", self.sid, f"{exc.code().name}: {exc.details()}"))
        except Exception as exc:  # a broken reassembly must not pass for a slow stream
            self.results.put(("error", self.sid, f"{type(exc).__name__}: {exc}"))

    def close(self) -> None:
        self.done.set()
        self.call.cancel()
        self.thread.join(timeout=5)
        self.channel.close()


def client_worker(index: int, commands, results, env_spec_bytes: bytes, max_message_bytes: int,
                  parent_pid: int) -> None:
    """A client process: opens and closes streams on command; exits on "stop" or if orphaned."""
    env_spec = pb.EnvSpec.FromString(env_spec_bytes)
    streams: list[ClientStream] = []
    try:
        while True:
            try:
                command = commands.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent_pid:
                    return
                continue
            if command[0] == "open":
                _, address, sids = command
                streams += [ClientStream(address, sid, env_spec, max_message_bytes, results) for sid in sids]
            elif command[0] == "close":
                for stream in streams:
                    stream.close()
                streams = []
                results.put(("closed", index))
            else:
                return
    finally:
        for stream in streams:
            stream.close()


class Clients:
    """A fixed set of spawned client processes; streams are spread round robin over them."""

    def __init__(self, processes: int, env_spec_bytes: bytes, max_message_bytes: int, timeout: float):
        ctx = mp.get_context("spawn")
        self.timeout = timeout
        self.seen: dict[tuple[str, int], float] = {}  # (stream id, version) -> receive-complete time
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(processes)]
        self.processes = [ctx.Process(target=client_worker, name=f"bench-client-{i}", daemon=True,
                                      args=(i, q, self.results, env_spec_bytes, max_message_bytes, os.getpid()))
                          for i, q in enumerate(self.commands)]
        for p in self.processes:
            p.start()

    def open(self, address: str, sids: list[str]) -> None:
        for i, q in enumerate(self.commands):
            mine = sids[i::len(self.commands)]
            if mine:
                q.put(("open", address, mine))

    def wait_version(self, version: int, sids: set[str]) -> dict[str, float]:
        """Receive-complete time of ``version`` on every stream in ``sids``."""
        deadline = time.monotonic() + self.timeout
        times = {sid: self.seen[sid, version] for sid in sids if (sid, version) in self.seen}
        while len(times) < len(sids):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"version {version}: {len(times)}/{len(sids)} streams complete "
                                   f"after {self.timeout:.0f}s")
            try:
                report = self.results.get(timeout=min(remaining, 1.0))
            except queue.Empty:
                dead = [p.name for p in self.processes if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"client processes exited: {', '.join(dead)}") from None
                continue
            if report[0] == "error" and report[1] in sids:
                raise RuntimeError(f"stream {report[1]} failed: {report[2]}")
            if report[0] == "got":  # reports of the other server's streams are kept for later
                self.seen[report[1], report[2]] = report[3]
                if report[1] in sids and report[2] == version:
                    times[report[1]] = report[3]
        return times

    def close_streams(self) -> None:
        for q in self.commands:
            q.put(("close",))
        closed, deadline = set(), time.monotonic() + self.timeout
        while len(closed) < len(self.commands) and time.monotonic() < deadline:
            try:
                report = self.results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                continue
            if report[0] == "closed":
                closed.add(report[1])

    def shutdown(self) -> None:
        for q in self.commands:
            try:
                q.put(("stop",))
            except (OSError, ValueError):
                pass
        for p in self.processes:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


# --------------------------------------------------------------------------- baseline server


class BareFanout:
    """A bare gRPC server: each stream, once it has a first request, yields the newest pre-built bytes."""

    def __init__(self, max_streams: int, max_message_bytes: int, first: list[bytes]):
        self.cond = threading.Condition()
        self.version, self.messages, self.stopping = 0, first, False
        # No (de)serializers: requests arrive and responses leave as the bytes objects they are.
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Connect": grpc.stream_stream_rpc_method_handler(self._connect)})
        workers = max_streams + 8
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bare"),
                                  options=grpc_options(max_message_bytes), maximum_concurrent_rpcs=workers)
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port(f"{HOST}:0")
        if self.port == 0:
            raise OSError(f"cannot listen on {HOST}")
        self.server.start()

    def push(self, version: int, messages: list[bytes]) -> None:
        with self.cond:
            self.version, self.messages = version, messages
            self.cond.notify_all()

    def _connect(self, request_iterator, context):
        if next(request_iterator, None) is None:
            return
        sent = -1
        while True:
            with self.cond:
                while not (self.stopping or self.version > sent) and context.is_active():
                    self.cond.wait(0.5)
                if self.stopping or not context.is_active():
                    return
                sent, messages = self.version, self.messages
            yield from messages

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.server.stop(grace=2.0).wait(timeout=10)


def prebuilt(version: int, payload: bytes, chunk_bytes: int) -> list[bytes]:
    """The serialized LearnerMessages ours sends for ``payload`` as ``version``."""
    chunks = wire.split_chunks(payload, chunk_bytes)
    return [pb.LearnerMessage(policy_update=pb.PolicyUpdate(
        version=version, chunk_index=i, chunk_count=len(chunks), total_bytes=len(payload), payload=chunk)
    ).SerializeToString() for i, chunk in enumerate(chunks)]


# --------------------------------------------------------------------------- measurement


def make_state(mbytes: float) -> dict[str, torch.Tensor]:
    """Float32 tensors totalling ``mbytes`` MiB: four layers of weights (1024 wide) and biases."""
    floats = int(mbytes * 2**20) // 4
    rows = (floats - 4 * 1024) // 1024
    sizes = [rows // 2, rows // 4, rows // 8, rows - rows // 2 - rows // 4 - rows // 8]
    gen = torch.Generator().manual_seed(0)
    state = {}
    for i, r in enumerate(sizes):
        state[f"layers.{i}.weight"] = torch.randn(r, 1024, generator=gen)
        state[f"layers.{i}.bias"] = torch.randn(1024, generator=gen)
    rest = floats - sum(t.numel() for t in state.values())
    if rest > 0:
        state["head.bias"] = torch.randn(rest, generator=gen)
    return state


def measure(n: int, clients: Clients, config, state, runs: int, warmup: int) -> dict:
    """Alternating runs of ours and the baseline with ``n`` streams each; medians in ms."""
    from actorlearner.learner.learner import Learner
    from actorlearner.learner.server import serve

    learner = Learner(config)  # publishes version 0 on construction
    payload = wire.encode_state_dict(state)
    ours_ms, base_ms, publish_ms, serializations = [], [], [], []
    bare = BareFanout(max(n, 64), config.max_message_bytes,
                      prebuilt(0, wire.encode_state_dict({}), config.chunk_bytes))
    try:
        with serve(learner, HOST, 0, max_streams=max(n, 64)) as port:
            ours_ids = [f"ours{n}-{i}" for i in range(n)]
            bare_ids = [f"bare{n}-{i}" for i in range(n)]
            clients.open(f"{HOST}:{port}", ours_ids)
            clients.open(f"{HOST}:{bare.port}", bare_ids)
            try:
                clients.wait_version(0, set(ours_ids))  # every stream holds version 0 before we start
                clients.wait_version(0, set(bare_ids))
                for run in range(warmup + runs):
                    version = run + 1
                    # Ours: publish() = encode once + chunk + wake every stream; each stream sends.
                    before = learner.broadcast.serializations
                    t0 = time.monotonic()
                    learner.broadcast.publish(version, state)
                    t_published = time.monotonic()
                    ours = max(clients.wait_version(version, set(ours_ids)).values()) - t0
                    serializations.append(learner.broadcast.serializations - before)
                    # Baseline: the same bytes, serialized beforehand, pushed down bare streams.
                    messages = prebuilt(version, payload, config.chunk_bytes)
                    t1 = time.monotonic()
                    bare.push(version, messages)
                    base = max(clients.wait_version(version, set(bare_ids)).values()) - t1
                    if run >= warmup:
                        ours_ms.append(ours * 1e3)
                        base_ms.append(base * 1e3)
                        publish_ms.append((t_published - t0) * 1e3)
            finally:
                clients.close_streams()
    finally:
        bare.stop()
    ours, base = statistics.median(ours_ms), statistics.median(base_ms)
    return {"actors": n, "ours_ms": ours, "baseline_ms": base, "ratio": base / ours,
            "ours_publish_call_ms": statistics.median(publish_ms),
            "ours_runs_ms": ours_ms, "baseline_runs_ms": base_ms,
            "serializations": serializations, "payload_bytes": len(payload)}


def main() -> None:
    from actorlearner.config import LearnerConfig
    from actorlearner.learner.learner import Learner

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", default="1,16,64", help="comma-separated stream counts")
    parser.add_argument("--mbytes", type=float, default=10.0, help="policy size in MiB of float32 tensors")
    parser.add_argument("--runs", type=int, default=5, help="timed versions per actor count; the median is reported")
    parser.add_argument("--warmup", type=int, default=1, help="untimed versions first")
    parser.add_argument("--procs", type=int, default=4, help="client processes the streams are spread over")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds any one wait may take")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    actors = [int(a) for a in args.actors.split(",")]

    started = time.monotonic()
    config = LearnerConfig(env="CartPole-v1", eval_every=0, max_unacked=8)  # chunk 4 MiB, messages 16 MiB
    env_spec_bytes = Learner(config).env_spec.SerializeToString()
    state = make_state(args.mbytes)
    clients = Clients(max(1, min(args.procs, max(actors))), env_spec_bytes, config.max_message_bytes, args.timeout)
    try:
        rows = [measure(n, clients, config, state, args.runs, args.warmup) for n in actors]
    finally:
        clients.shutdown()
    published = [s for r in rows for s in r["serializations"]]
    per_version = sum(published) / len(published)
    per_version = int(per_version) if per_version.is_integer() else per_version
    elapsed = time.monotonic() - started

    payload = rows[0]["payload_bytes"]
    print(f"policy {payload / 2**20:.2f} MiB encoded, {config.chunk_bytes // 2**20} MiB chunks; "
          f"median of {args.runs} versions; serializations per version: {per_version} "
          f"(each version: {sorted(set(published))}); {elapsed:.0f} s")
    print()
    print("| actors | ours (ms) | baseline (ms) | ratio baseline/ours | ours publish() call (ms) | target |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        target = ""
        if r["actors"] == TARGET_ACTORS:
            target = f">= {TARGET_RATIO:.2f}x: {'met' if r['ratio'] >= TARGET_RATIO else 'missed'}"
        print(f"| {r['actors']} | {r['ours_ms']:,.1f} | {r['baseline_ms']:,.1f} | {r['ratio']:.2f}x "
              f"| {r['ours_publish_call_ms']:,.1f} | {target} |")
    if args.json:
        out_rows = [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()
                     if k not in ("serializations", "payload_bytes", "ours_runs_ms", "baseline_runs_ms")}
                    for r in rows]
        for out, r in zip(out_rows, rows):
            out["ours_runs_ms"] = [round(x, 1) for x in r["ours_runs_ms"]]
            out["baseline_runs_ms"] = [round(x, 1) for x in r["baseline_runs_ms"]]
        print(json.dumps({"mbytes": args.mbytes, "payload_bytes": payload, "chunk_bytes": config.chunk_bytes,
                          "runs": args.runs, "client_processes": len(clients.processes),
                          "rows": out_rows, "serializations_per_version": per_version,
                          "elapsed_s": round(elapsed, 1)}))


if __name__ == "__main__":
    main()
