"""End to end: env steps/s of a learner + K actor processes against one-process loops, at the env's speed.

Ours: ``actorlearner learner`` and K ``actorlearner actor`` processes on loopback (each actor
``--num-envs N --vector-mode M``); env steps/s is the learner's status ``env_steps`` over a
window of ``--seconds`` after ``--warmup`` seconds. Modes (``--modes``, default streaming only):
streaming (``--min-replay-size`` 1e12: training never starts, the actors run as fast as acting
and streaming let them) and training (the rate limiter holds the actors to
``samples_per_insert``, as in a real run).

Baseline, same run: the one-process loop, the same N envs (a sync vector env: one process) stepped with
the same DQN policy acting epsilon-greedily (0.1, torch threads 1), no learning, no streaming.
It runs alone (one loop) and as K separate processes side by side over one shared window (K
loops, their steps/s summed). Ratios: ours / one loop (the project's targets: 1 actor >= 0.8x,
2 actors >= 0.9x) and ours / K loops (scaling). The learner is an extra process on top of K.

Envs (``--envs``): cartpole (CartPole-v1), minatar (bench_minatar:breakout), atari
(ALE/Breakout-v5, 4 frames stacked). Each actor writes its per-step time profile
(``--profile-file``, its whole life, warm-up included): microseconds per env step by section,
averaged over the actors of a run. Every figure is the median over ``--runs``.

    python benchmarks/bench_e2e.py --envs cartpole,minatar --num-envs 4,64 --actors 1,2 --json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

HERE = Path(__file__).resolve().parent
PRESETS = {"cartpole": ("CartPole-v1", 0), "minatar": ("bench_minatar:breakout", 0), "atari": ("ALE/Breakout-v5", 4)}
"""Preset name -> (env name as the CLI takes it, frames stacked; 0: none)."""
MODES = ("streaming", "training")


def subprocess_env() -> dict[str, str]:
    """This environment with the benchmarks directory on PYTHONPATH (for ``bench_minatar:breakout``)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), path] if path else [str(HERE)])}


def stop(procs: list[subprocess.Popen], timeout: float = 30.0) -> None:
    """SIGTERM every process, wait for it to exit (SIGKILL past ``timeout``)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def env_steps(port: int) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=10).env_steps


def spawn(command: list[str], log_path: Path, **popen) -> subprocess.Popen:
    """``python -m actorlearner COMMAND...``, its stderr to ``log_path``."""
    with log_path.open("w") as stderr:
        return subprocess.Popen([sys.executable, "-m", "actorlearner", *command], stderr=stderr,
                                env=subprocess_env(), **popen)


def tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def ours(preset: str, actors: int, num_envs: int, vector_mode: str, mode: str,
         warmup: float, seconds: float) -> tuple[float, dict[str, float]]:
    """Env steps/s of a learner and ``actors`` actor processes, and the actors' mean profile (us per env step)."""
    env, frame_stack = PRESETS[preset]
    common = ["--env", env, "--frame-stack", str(frame_stack)]
    no_training = ["--min-replay-size", str(10**12)] if mode == "streaming" else []  # sampling never allowed
    with tempfile.TemporaryDirectory(prefix="bench_e2e-") as tmp:
        tmp = Path(tmp)
        learner = spawn(["learner", "--port", "0", *common, "--num-actors", str(actors), "--eval-every", "0",
                         *no_training], tmp / "learner.log", stdout=subprocess.PIPE, text=True)
        actor_procs: list[subprocess.Popen] = []
        try:
            match = re.search(r":(\d+)$", learner.stdout.readline().strip())
            if match is None:
                raise RuntimeError(f"the learner did not start:\n{tail(tmp / 'learner.log')}")
            port = int(match.group(1))
            for i in range(actors):
                actor_procs.append(spawn(
                    ["actor", "--learner", f"127.0.0.1:{port}", *common, "--num-envs", str(num_envs),
                     "--vector-mode", vector_mode, "--seed", str(i), "--actor-id", f"actor-{i}",
                     "--profile-file", str(tmp / f"actor-{i}.json")], tmp / f"actor-{i}.log"))
            time.sleep(warmup)
            start_steps, start = env_steps(port), time.monotonic()
            time.sleep(seconds)
            rate = (env_steps(port) - start_steps) / (time.monotonic() - start)
        finally:
            stop(actor_procs)  # first, while the learner still acks their last batches
            stop([learner])
        return rate, mean_profile([tmp / f"actor-{i}.json" for i in range(actors)], tmp)


def mean_profile(paths: list[Path], logs: Path) -> dict[str, float]:
    """``us_per_step`` of the actors' profile files, averaged over the actors, section by section."""
    for path in paths:
        if not path.exists():  # reported, not fatal: the throughput figure stands
            log(f"warning: no profile from {path.stem}; its log ends:\n{tail(logs / f'{path.stem}.log')}")
    profiles = [json.loads(p.read_text())["us_per_step"] for p in paths if p.exists()]
    sections = dict.fromkeys(key for p in profiles for key in p)
    return {key: statistics.fmean(p.get(key, 0.0) for p in profiles) for key in sections}


def loops(preset: str, k: int, num_envs: int, vector_mode: str, warmup: float, seconds: float) -> float:
    """Env steps/s of ``k`` one-process loops run side by side over the same window, summed."""
    start_at = time.time() + warmup  # wall clock: shared by the processes
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--loop", preset, str(num_envs),
                               vector_mode, str(seconds), "--start-at", str(start_at), "--seed", str(i)],
                              stdout=subprocess.PIPE, text=True, env=subprocess_env()) for i in range(k)]
    try:
        outputs = [proc.communicate(timeout=warmup + seconds + 300)[0] for proc in procs]
    finally:
        stop([p for p in procs if p.poll() is None])
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a loop process failed: exit codes {[p.returncode for p in procs]}")
    return sum(json.loads(out.strip().splitlines()[-1])["steps_per_s"] for out in outputs)


def loop(preset: str, num_envs: int, vector_mode: str, seconds: float, start_at: float, seed: int) -> float:
    """The one-process loop: step the vector env with the DQN policy (epsilon 0.1) until ``start_at``
    (wall clock), then count env steps/s over ``seconds``."""
    import torch

    from actorlearner.algorithms import make_spec
    from actorlearner.envs import make_vector_env

    torch.set_num_threads(1)
    env, frame_stack = PRESETS[preset]
    envs = make_vector_env(env, num_envs, vector_mode, frame_stack=frame_stack)
    try:
        policy = make_spec("dqn", envs.single_observation_space, envs.single_action_space).make_policy()
        obs, _ = envs.reset(seed=seed)
        while time.time() < start_at:
            obs, *_ = envs.step(policy.act(obs, 0.1))
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            obs, *_ = envs.step(policy.act(obs, 0.1))
            steps += num_envs
        return steps / (time.monotonic() - start)
    finally:
        envs.close()


def measure(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Every (env, num_envs, actors, mode) ``args.runs`` times, runs interleaved; medians as rows and profiles."""
    keys = [(preset, n, k, mode) for preset in args.envs for n in args.num_envs for k in args.actors
            for mode in args.modes]
    ours_runs: dict[tuple, list[float]] = {key: [] for key in keys}
    profile_runs: dict[tuple, list[dict[str, float]]] = {key: [] for key in keys}
    loop_runs: dict[tuple, list[float]] = {}
    for run in range(1, args.runs + 1):
        for preset in args.envs:
            for n in args.num_envs:
                for k in sorted({1, *args.actors}):
                    rate = loops(preset, k, n, "sync", args.warmup, args.seconds)
                    loop_runs.setdefault((preset, n, k), []).append(rate)
                    log(f"run {run}/{args.runs} {preset} num_envs {n}: {k} loop(s) side by side {rate:,.0f} steps/s")
                for k in args.actors:
                    for mode in args.modes:
                        rate, profile = ours(preset, k, n, args.vector_mode, mode, args.warmup, args.seconds)
                        ours_runs[preset, n, k, mode].append(rate)
                        profile_runs[preset, n, k, mode].append(profile)
                        log(f"run {run}/{args.runs} {preset} num_envs {n}: {k} actor(s) {mode} {rate:,.0f} steps/s, "
                            f"profile total {profile.get('total', 0.0):.1f} us/step")
    rows, profiles = [], []
    for preset, n, k, mode in keys:
        o, one, side = (statistics.median(r) for r in
                        (ours_runs[preset, n, k, mode], loop_runs[preset, n, 1], loop_runs[preset, n, k]))
        head = {"env": preset, "num_envs": n, "actors": k, "mode": mode}
        rows.append({**head, "steps_s": round(o), "one_loop_steps_s": round(one), "k_loops_steps_s": round(side),
                     "ratio_one_loop": round(o / one, 3), "ratio_k_loops": round(o / side, 3),
                     "runs": {"steps_s": [round(r) for r in ours_runs[preset, n, k, mode]],
                              "one_loop_steps_s": [round(r) for r in loop_runs[preset, n, 1]],
                              "k_loops_steps_s": [round(r) for r in loop_runs[preset, n, k]]}})
        runs = profile_runs[preset, n, k, mode]
        sections = dict.fromkeys(s for p in runs for s in p)
        profiles.append({**head, "us_per_step": {s: round(statistics.median(p[s] for p in runs if s in p), 2)
                                                 for s in sections}})
    return rows, profiles


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def print_tables(args: argparse.Namespace, rows: list[dict], profiles: list[dict]) -> None:
    print(f"Env steps/s, median of {args.runs} run(s); vector mode {args.vector_mode}; "
          f"warm-up {args.warmup:g} s, measured {args.seconds:g} s\n")
    print("| env | envs/actor | actors | mode | ours: env steps/s | one loop | K loops side by side "
          "| ours / one loop | ours / K loops |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['env']} | {r['num_envs']} | {r['actors']} | {r['mode']} | {r['steps_s']:,} "
              f"| {r['one_loop_steps_s']:,} | {r['k_loops_steps_s']:,} | {r['ratio_one_loop']:.2f}x "
              f"| {r['ratio_k_loops']:.2f}x |")
    sections = list(dict.fromkeys(s for p in profiles for s in p["us_per_step"]))
    print("\nActor profile: microseconds per env step by section (whole life, warm-up included), "
          "mean over actors, median over runs\n")
    print("| env | envs/actor | actors | mode | " + " | ".join(sections) + " |")
    print("|---|---:|---:|---|" + "---:|" * len(sections))
    for p in profiles:
        cells = " | ".join(f"{p['us_per_step'].get(s, 0.0):.1f}" for s in sections)
        print(f"| {p['env']} | {p['num_envs']} | {p['actors']} | {p['mode']} | {cells} |")


def comma_list(kind, allowed=None):
    def parse(text: str) -> list:
        items = [kind(item.strip()) for item in text.split(",") if item.strip()]
        bad = [item for item in items if allowed is not None and item not in allowed]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"expected a comma list of {', '.join(allowed or ['values'])}: {text!r}")
        return items
    return parse


def default_actors() -> str:
    counts, k = [], 1
    while k <= (os.cpu_count() or 1):
        counts.append(str(k))
        k *= 2
    return ",".join(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=comma_list(str, PRESETS), default="cartpole,minatar",
                        help=f"comma list of env presets: {', '.join(PRESETS)}")
    parser.add_argument("--num-envs", type=comma_list(int), default="4,64", help="comma list: envs per actor process")
    parser.add_argument("--actors", type=comma_list(int), default=default_actors(),
                        help="comma list of actor counts (default: 1, 2, 4, ... up to the CPU count)")
    parser.add_argument("--vector-mode", choices=("sync", "async", "workers", "ahead"), default="sync",
                        help="vector env of the actors (the loops are always one process: sync)")
    parser.add_argument("--modes", type=comma_list(str, MODES), default="streaming",
                        help="comma list: streaming (training never starts), training")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring (startup, replay fill)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per run")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--loop", nargs=4, metavar=("ENV", "NUM_ENVS", "MODE", "SECONDS"),
                        help="internal: run one baseline loop (env preset, envs, vector mode, seconds) and "
                             "print its steps/s as JSON")
    parser.add_argument("--start-at", type=float, default=0.0, help="internal (--loop): wall-clock start of the window")
    parser.add_argument("--seed", type=int, default=0, help="internal (--loop): env seed")
    args = parser.parse_args()

    if args.loop:
        preset, num_envs, vector_mode, seconds = args.loop
        rate = loop(preset, int(num_envs), vector_mode, float(seconds), args.start_at, args.seed)
        print(json.dumps({"steps_per_s": rate}))
        return
    rows, profiles = measure(args)
    print_tables(args, rows, profiles)
    if args.json:
        settings = {name: getattr(args, name) for name in
                    ("envs", "num_envs", "actors", "vector_mode", "modes", "runs", "warmup", "seconds")}
        print(json.dumps({"settings": settings, "rows": rows, "profiles": profiles}))


if __name__ == "__main__":
    main()
