"""RemoteEnv(CartPole-v1) steps/s over loopback against a bare gRPC ping-pong, same run.

Ours: ``actorlearner env-server --env CartPole-v1`` in its own process and a RemoteEnv
client stepping it (random actions, reset at episode ends). Baseline: a bare gRPC
bidirectional stream in its own process that answers every message with a fixed reply;
requests and replies have the byte sizes of RemoteEnv's step request and response, and
the client uses the same queue-fed stream. The difference is everything env.proto adds:
encoding, decoding, validation and the env step itself.

    python benchmarks/bench_remote_env.py --runs 5 --seconds 3 --json
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent import futures

import grpc
import gymnasium as gym

from actorlearner.envs import RemoteEnv
from actorlearner.envs.steps import StepFormat
from actorlearner.lifeline import tied_to_this_process
from actorlearner.transport import grpc_options

BARE_METHOD = "/bench.PingPong/Stream"
LIMIT = 4 << 20


def step_message_sizes() -> tuple[int, int]:
    """Bytes of a CartPole step request and step response, as RemoteEnv and the server send them."""
    env = gym.make("CartPole-v1")
    steps = StepFormat(env.observation_space, env.action_space)
    obs, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, _ = env.step(0)
    return len(steps.encode_request(1)), len(steps.encode_response(obs, float(reward), terminated, truncated))


def serve_bare(reply_bytes: int) -> None:
    """The baseline server: one fixed reply per received message. Runs until SIGTERM."""
    reply = b"r" * reply_bytes

    def stream(request_iterator, context):
        for _ in request_iterator:
            yield reply

    handler = grpc.method_handlers_generic_handler("bench.PingPong", {
        "Stream": grpc.stream_stream_rpc_method_handler(stream)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=grpc_options(LIMIT))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"bare server listening on 127.0.0.1:{port}", flush=True)
    signal.sigwait([signal.SIGTERM])
    server.stop(0)


def start(command: list[str]) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, preexec_fn=tied_to_this_process())
    match = re.search(r"listening on [\d.]+:(\d+)", proc.stdout.readline())
    if not match:
        proc.kill()
        raise RuntimeError(f"{command} did not report a port")
    return proc, int(match.group(1))


def time_remote_env(port: int, warmup: float, seconds: float) -> float:
    """Steps/s of one RemoteEnv session (actions drawn beforehand: sampling is not RemoteEnv's cost)."""
    env = RemoteEnv(f"127.0.0.1:{port}")
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(4096)]

    def steps_for(duration: float) -> int:
        steps, deadline = 0, time.perf_counter() + duration
        while time.perf_counter() < deadline:
            _, _, terminated, truncated, _ = env.step(actions[steps % 4096])
            steps += 1
            if terminated or truncated:
                env.reset()
        return steps

    steps_for(warmup)
    began = time.perf_counter()
    steps = steps_for(seconds)
    rate = steps / (time.perf_counter() - began)
    env.close()
    return rate


def time_bare(port: int, request_bytes: int, warmup: float, seconds: float) -> float:
    """Round trips/s of the bare stream, fed the same way RemoteEnv feeds its session."""
    request = b"q" * request_bytes
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=grpc_options(LIMIT)) as channel:
        requests: queue.SimpleQueue = queue.SimpleQueue()
        responses = channel.stream_stream(BARE_METHOD)(iter(requests.get, None))

        def round_trips(duration: float) -> int:
            count, deadline = 0, time.perf_counter() + duration
            while time.perf_counter() < deadline:
                requests.put(request)
                next(responses)
                count += 1
            return count

        round_trips(warmup)
        began = time.perf_counter()
        count = round_trips(seconds)
        rate = count / (time.perf_counter() - began)
        requests.put(None)
        responses.cancel()
    return rate


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs per side, alternating; the median is reported")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds before measuring")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--serve-bare", type=int, metavar="REPLY_BYTES", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_bare is not None:
        return serve_bare(args.serve_bare)

    request_bytes, reply_bytes = step_message_sizes()
    env_server, env_port = start([sys.executable, "-m", "actorlearner", "env-server", "--env", "CartPole-v1",
                                  "--port", "0"])
    bare_server, bare_port = start([sys.executable, __file__, "--serve-bare", str(reply_bytes)])
    ours, baseline = [], []
    try:
        for _ in range(args.runs):
            ours.append(time_remote_env(env_port, args.warmup, args.seconds))
            baseline.append(time_bare(bare_port, request_bytes, args.warmup, args.seconds))
    finally:
        stop(env_server)
        stop(bare_server)
    ours_rate, base_rate = statistics.median(ours), statistics.median(baseline)
    result = {"env": "CartPole-v1", "request_bytes": request_bytes, "reply_bytes": reply_bytes,
              "remote_env_steps_s": round(ours_rate), "bare_round_trips_s": round(base_rate),
              "ratio": round(ours_rate / base_rate, 3), "runs": args.runs,
              "ours_all": [round(r) for r in ours], "bare_all": [round(r) for r in baseline]}
    print("| env | request / reply bytes | RemoteEnv steps/s | bare ping-pong round trips/s | ratio |")
    print("|---|---:|---:|---:|---:|")
    print(f"| CartPole-v1 | {request_bytes} / {reply_bytes} | {ours_rate:,.0f} | {base_rate:,.0f} | "
          f"{ours_rate / base_rate:.2f}x |")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
