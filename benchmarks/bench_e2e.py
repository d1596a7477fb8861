"""End to end: env steps/s of a training learner + K actor processes against a one-process loop.

Ours: ``actorlearner learner`` and K ``actorlearner actor`` processes on loopback, with the
settings ``actorlearner run`` uses; env steps/s is read from the learner's status over a
steady-state window. Two modes: training (the rate limiter holds actors to
``samples_per_insert``, as in a real run) and streaming only (training never starts, so
the actors run as fast as streaming lets them). Baseline, same run: one process stepping
the same vector env with the same policy network (epsilon-greedy acting, no learning, no
streaming). Ours uses K + 1 processes and the baseline one, so each rate is also given per
process (ours / (K + 1), the baseline / 1) with the ratio of those next to the totals'.
Ratios are ours / baseline: above 1 means ours steps faster.

    python benchmarks/bench_e2e.py --actors 1,2 --json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

import grpc
import torch

from actorlearner.algorithms import make_spec
from actorlearner.envs import make_vector_env
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc


def env_steps(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=10).env_steps


def ours(env: str, actors: int, num_envs: int, warmup: float, seconds: float, train: bool) -> float:
    """Steady-state env steps/s of a learner and ``actors`` actor processes."""
    no_training = [] if train else ["--min-replay-size", str(10**12)]  # sampling never allowed
    learner = subprocess.Popen([sys.executable, "-m", "actorlearner", "learner", "--port", "0", "--env", env,
                                "--num-actors", str(actors), "--eval-every", "0", *no_training],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    procs = [learner]
    try:
        port = int(re.search(r":(\d+)$", learner.stdout.readline().strip()).group(1))
        for i in range(actors):
            procs.append(subprocess.Popen([sys.executable, "-m", "actorlearner", "actor", "--learner",
                                           f"127.0.0.1:{port}", "--env", env, "--num-envs", str(num_envs),
                                           "--seed", str(i), "--actor-id", f"actor-{i}"], stderr=subprocess.DEVNULL))
        time.sleep(warmup)
        start_steps, start = env_steps(port), time.monotonic()
        time.sleep(seconds)
        return (env_steps(port) - start_steps) / (time.monotonic() - start)
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def baseline(env: str, num_envs: int, seconds: float) -> float:
    """Env steps/s of one process: the same vector env and network, acting epsilon-greedily."""
    torch.set_num_threads(1)
    envs = make_vector_env(env, num_envs)
    policy = make_spec("dqn", envs.single_observation_space, envs.single_action_space).make_policy()
    obs, _ = envs.reset(seed=0)
    steps, start = 0, time.monotonic()
    while time.monotonic() - start < seconds:
        obs, *_ = envs.step(policy.act(obs, 0.1))
        steps += num_envs
    envs.close()
    return steps / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--actors", default="1,2", help="comma-separated actor counts")
    parser.add_argument("--num-envs", type=int, default=4, help="envs per actor (as `run` uses)")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring (startup, replay fill)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per run")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()

    rows = []
    for actors in [int(a) for a in args.actors.split(",")]:
        train_runs, stream_runs, base_runs = [], [], []
        for _ in range(args.runs):
            train_runs.append(ours(args.env, actors, args.num_envs, args.warmup, args.seconds, train=True))
            stream_runs.append(ours(args.env, actors, args.num_envs, args.warmup, args.seconds, train=False))
            base_runs.append(baseline(args.env, args.num_envs, args.seconds))
        t, st, b = (statistics.median(r) for r in (train_runs, stream_runs, base_runs))
        processes = actors + 1  # the learner and its actors
        rows.append({"actors": actors, "processes": processes,
                     "training_steps_s": round(t), "streaming_steps_s": round(st), "baseline_steps_s": round(b),
                     "training_steps_s_per_process": round(t / processes),
                     "streaming_steps_s_per_process": round(st / processes),
                     "training_ratio": round(t / b, 3), "streaming_ratio": round(st / b, 3),
                     "training_ratio_per_process": round(t / processes / b, 3),
                     "streaming_ratio_per_process": round(st / processes / b, 3)})
    print("| actors | processes | training: env steps/s (per process) | streaming only: env steps/s (per process) "
          "| one-process loop | ratio training: total, per process | ratio streaming only: total, per process |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['actors']} | {r['processes']} | {r['training_steps_s']:,} ({r['training_steps_s_per_process']:,}) "
              f"| {r['streaming_steps_s']:,} ({r['streaming_steps_s_per_process']:,}) | {r['baseline_steps_s']:,} "
              f"| {r['training_ratio']:.2f}x, {r['training_ratio_per_process']:.2f}x "
              f"| {r['streaming_ratio']:.2f}x, {r['streaming_ratio_per_process']:.2f}x |")
    if args.json:
        print(json.dumps({"env": args.env, "num_envs": args.num_envs, "rows": rows}))


if __name__ == "__main__":
    main()
