"""End to end: env steps/s of a learner + K actor processes against one-process loops, at the env's speed.

Ours: ``actorlearner learner`` and K ``actorlearner actor`` processes on loopback (each actor
``--num-envs N``, with the actor's default ``--vector-mode``, auto, unless ``--vector-mode`` names
one; the table names the mode each actor's first log line reports); env steps/s is the learner's
status ``env_steps`` over a window of ``--seconds`` after ``--warmup`` seconds. Modes
(``--modes``, default streaming only): streaming (``--min-replay-size`` 1e12: training never
starts, the actors run as fast as acting and streaming let them) and training (the rate limiter
holds the actors to ``samples_per_insert``, as in a real run).

Baselines, same run: two one-process loops over the same N envs acting epsilon-greedily (0.1,
torch threads 1), no learning, no streaming. The project's loop: its ``make_vector_env`` (sync)
and the DQN policy's ``act``. The plain loop: gymnasium, torch and numpy only
(``gymnasium.make_vec(..., vectorization_mode="sync")``, a dueling network of the default DQN
shape defined here, greedy under ``no_grad``, epsilon-greedy with numpy). Each runs alone (one
loop) and as K separate processes side by side over one shared window (K loops, their steps/s
summed). Ratios are taken against the faster kind: ours / one loop (the project's targets:
1 actor >= 0.8x, 2 actors >= 0.9x) and ours / K loops (scaling). The learner is an extra process
on top of K.

Envs (``--envs``): cartpole (CartPole-v1), minatar (MinAtar/Breakout-v0, the paper's 6 actions), atari
(ALE/Pong-v5, 4 frames stacked). Each actor writes its per-step time profile
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

from actorlearner.lifeline import tied_to_this_process
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

HERE = Path(__file__).resolve().parent
PRESETS = {"cartpole": ("CartPole-v1", 0), "minatar": ("MinAtar/Breakout-v0", 0), "atari": ("ALE/Pong-v5", 4)}
"""Preset name -> (env name as the CLI takes it, frames stacked; 0: none)."""
MODES = ("streaming", "training")
LOOPS = ("project", "plain")
"""The one-process loops: the project's (`make_vector_env` + `Policy.act`) and a plain one (gymnasium, torch, numpy)."""


def subprocess_env() -> dict[str, str]:
    """This environment with the benchmarks directory on PYTHONPATH."""
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
                                env=subprocess_env(), preexec_fn=tied_to_this_process(), **popen)


def tail(path: Path, chars: int = 2000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def ours(preset: str, actors: int, num_envs: int, vector_mode: str | None, mode: str,
         warmup: float, seconds: float) -> tuple[float, dict[str, float], str]:
    """Env steps/s of a learner and ``actors`` actor processes, the actors' mean profile (us per env step) and
    the vector mode the first actor ran (as its log says; ``vector_mode`` None: the actor's default)."""
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
                     *(["--vector-mode", vector_mode] if vector_mode else []), "--seed", str(i),
                     "--actor-id", f"actor-{i}",
                     "--profile-file", str(tmp / f"actor-{i}.json")], tmp / f"actor-{i}.log"))
            time.sleep(warmup)
            start_steps, start = env_steps(port), time.monotonic()
            time.sleep(seconds)
            rate = (env_steps(port) - start_steps) / (time.monotonic() - start)
        finally:
            stop(actor_procs)  # first, while the learner still acks their last batches
            stop([learner])
        return rate, mean_profile([tmp / f"actor-{i}.json" for i in range(actors)], tmp), ran_mode(tmp / "actor-0.log")


def ran_mode(log_path: Path) -> str:
    """The vector mode an actor's log says it ran ("?" when it says none)."""
    match = re.search(r"vector mode (\w+(?: \(auto\))?)", tail(log_path, 10**6))
    return match.group(1) if match else "?"


def mean_profile(paths: list[Path], logs: Path) -> dict[str, float]:
    """``us_per_step`` of the actors' profile files, averaged over the actors, section by section."""
    for path in paths:
        if not path.exists():  # reported, not fatal: the throughput figure stands
            log(f"warning: no profile from {path.stem}; its log ends:\n{tail(logs / f'{path.stem}.log')}")
    profiles = [json.loads(p.read_text())["us_per_step"] for p in paths if p.exists()]
    sections = dict.fromkeys(key for p in profiles for key in p)
    return {key: statistics.fmean(p.get(key, 0.0) for p in profiles) for key in sections}


def loops(kind: str, preset: str, k: int, num_envs: int, warmup: float, seconds: float) -> float:
    """Env steps/s of ``k`` one-process loops of ``kind`` (project or plain) run side by side over the same
    window, summed."""
    start_at = time.time() + warmup  # wall clock: shared by the processes
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--loop", kind, preset, str(num_envs),
                               str(seconds), "--start-at", str(start_at), "--seed", str(i)],
                              stdout=subprocess.PIPE, text=True, env=subprocess_env(),
                              preexec_fn=tied_to_this_process()) for i in range(k)]
    try:
        outputs = [proc.communicate(timeout=warmup + seconds + 300)[0] for proc in procs]
    finally:
        stop([p for p in procs if p.poll() is None])
    if any(proc.returncode for proc in procs):
        raise RuntimeError(f"a loop process failed: exit codes {[p.returncode for p in procs]}")
    return sum(json.loads(out.strip().splitlines()[-1])["steps_per_s"] for out in outputs)


def loop(kind: str, preset: str, num_envs: int, seconds: float, start_at: float, seed: int) -> float:
    """A one-process loop (``kind``: project or plain) stepping ``num_envs`` envs with a DQN network acting
    epsilon-greedily (0.1) until ``start_at`` (wall clock), then its env steps/s over ``seconds``."""
    import torch

    torch.set_num_threads(1)
    envs, act = project_loop(preset, num_envs) if kind == "project" else plain_loop(preset, num_envs, seed)
    try:
        obs, _ = envs.reset(seed=seed)
        while time.time() < start_at:
            obs, *_ = envs.step(act(obs))
        steps, start = 0, time.monotonic()
        while time.monotonic() - start < seconds:
            obs, *_ = envs.step(act(obs))
            steps += num_envs
        return steps / (time.monotonic() - start)
    finally:
        envs.close()


def project_loop(preset: str, num_envs: int):
    """The project's loop: its `make_vector_env` (sync) and its DQN policy's `act`."""
    from actorlearner.algorithms import make_spec
    from actorlearner.envs import make_vector_env

    env, frame_stack = PRESETS[preset]
    envs = make_vector_env(env, num_envs, "sync", frame_stack=frame_stack)
    policy = make_spec("dqn", envs.single_observation_space, envs.single_action_space).make_policy()
    return envs, lambda obs: policy.act(obs, 0.1)


def plain_loop(preset: str, num_envs: int, seed: int):
    """The plain loop, gymnasium, torch and numpy only: ``gymnasium.make_vec(..., "sync")`` and a dueling
    network of the project's default DQN shape (a conv torso for images, then 128x128), greedy under
    ``no_grad``, each env's action random with probability 0.1."""
    import gymnasium as gym
    import numpy as np
    import torch
    from torch import nn

    if preset == "minatar":  # the paper's 6 actions (v0, deprecated, on purpose)
        import warnings

        import minatar.gym
        minatar.gym.register_envs()
        warnings.simplefilter("ignore", DeprecationWarning)
        envs = gym.make_vec("MinAtar/Breakout-v0", num_envs, vectorization_mode="sync")
    elif preset == "atari":
        import ale_py
        gym.register_envs(ale_py)
        wrappers = [lambda e: gym.wrappers.AtariPreprocessing(e, frame_skip=4, screen_size=84),
                    lambda e: gym.wrappers.TransformReward(e, lambda r: float(np.sign(r))),
                    lambda e: gym.wrappers.FrameStackObservation(e, 4, padding_type="reset")]
        envs = gym.make_vec("ALE/Pong-v5", num_envs, vectorization_mode="sync", wrappers=wrappers, frameskip=1)
    else:
        envs = gym.make_vec("CartPole-v1", num_envs, vectorization_mode="sync")
    shape, actions = envs.single_observation_space.shape, int(envs.single_action_space.n)
    if len(shape) == 1:
        torso, width, to_input = nn.Identity(), shape[0], lambda x: x.float()
    elif preset == "minatar":  # [H, W, C] bools
        torso = nn.Sequential(nn.Conv2d(shape[2], 16, 3), nn.ReLU(), nn.Flatten())
        width = 16 * (shape[0] - 2) * (shape[1] - 2)
        to_input = lambda x: x.float().permute(0, 3, 1, 2)  # noqa: E731
    else:  # [4, 84, 84] uint8 frames
        torso = nn.Sequential(nn.Conv2d(shape[0], 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2),
                              nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(), nn.Flatten())
        width, to_input = 64 * 7 * 7, lambda x: x.float() / 255  # noqa: E731
    mlp = nn.Sequential(torso, nn.Linear(width, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
    advantage, value = nn.Linear(128, actions), nn.Linear(128, 1)
    rng = np.random.default_rng(seed)

    @torch.no_grad()
    def act(obs):
        h = mlp(to_input(torch.as_tensor(obs)))
        a = advantage(h)
        greedy = (value(h) + a - a.mean(1, keepdim=True)).argmax(1).numpy()
        return np.where(rng.random(num_envs) < 0.1, rng.integers(0, actions, num_envs), greedy)
    return envs, act


def measure(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """Every (env, num_envs, actors, mode) ``args.runs`` times, runs interleaved; medians as rows and profiles."""
    keys = [(preset, n, k, mode) for preset in args.envs for n in args.num_envs for k in args.actors
            for mode in args.modes]
    ours_runs: dict[tuple, list[float]] = {key: [] for key in keys}
    profile_runs: dict[tuple, list[dict[str, float]]] = {key: [] for key in keys}
    ran: dict[tuple, set[str]] = {key: set() for key in keys}
    loop_runs: dict[tuple, list[float]] = {}  # (kind, preset, n, k) -> summed steps/s per run
    for run in range(1, args.runs + 1):
        for preset in args.envs:
            for n in args.num_envs:
                for k in sorted({1, *args.actors}):
                    for kind in LOOPS:
                        rate = loops(kind, preset, k, n, args.warmup, args.seconds)
                        loop_runs.setdefault((kind, preset, n, k), []).append(rate)
                        log(f"run {run}/{args.runs} {preset} num_envs {n}: {k} {kind} loop(s) side by side "
                            f"{rate:,.0f} steps/s")
                for k in args.actors:
                    for mode in args.modes:
                        rate, profile, vector_mode = ours(preset, k, n, args.vector_mode, mode, args.warmup,
                                                          args.seconds)
                        ours_runs[preset, n, k, mode].append(rate)
                        profile_runs[preset, n, k, mode].append(profile)
                        ran[preset, n, k, mode].add(vector_mode)
                        log(f"run {run}/{args.runs} {preset} num_envs {n}: {k} actor(s) {mode}, vector mode "
                            f"{vector_mode}: {rate:,.0f} steps/s, "
                            f"profile total {profile.get('total', 0.0):.1f} us/step")
    rows, profiles = [], []
    for preset, n, k, mode in keys:
        o = statistics.median(ours_runs[preset, n, k, mode])
        median = {(kind, j): statistics.median(loop_runs[kind, preset, n, j]) for kind in LOOPS for j in {1, k}}
        one, side = (max(median[kind, j] for kind in LOOPS) for j in (1, k))  # the faster loop
        head = {"env": preset, "num_envs": n, "actors": k, "mode": mode,
                "vector_mode": ", ".join(sorted(ran[preset, n, k, mode]))}
        rows.append({**head, "steps_s": round(o), **{f"{kind}_loop_steps_s": round(median[kind, 1]) for kind in LOOPS},
                     "one_loop_steps_s": round(one), "k_loops_steps_s": round(side),
                     "ratio_one_loop": round(o / one, 3), "ratio_k_loops": round(o / side, 3),
                     "runs": {"steps_s": [round(r) for r in ours_runs[preset, n, k, mode]],
                              **{f"{kind}_loops_steps_s": {j: [round(r) for r in loop_runs[kind, preset, n, j]]
                                                           for j in sorted({1, k})} for kind in LOOPS}}})
        runs = profile_runs[preset, n, k, mode]
        sections = dict.fromkeys(s for p in runs for s in p)
        profiles.append({**head, "us_per_step": {s: round(statistics.median(p[s] for p in runs if s in p), 2)
                                                 for s in sections}})
    return rows, profiles


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def print_tables(args: argparse.Namespace, rows: list[dict], profiles: list[dict]) -> None:
    print(f"Env steps/s, median of {args.runs} run(s); vector mode {args.vector_mode or 'the default'}; "
          f"warm-up {args.warmup:g} s, measured {args.seconds:g} s; one loop and K loops: the faster kind\n")
    print("| env | envs/actor | actors | mode | vector mode | ours: env steps/s | project loop | plain loop "
          "| K loops side by side | ours / one loop | ours / K loops |")
    print("|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['env']} | {r['num_envs']} | {r['actors']} | {r['mode']} | {r['vector_mode']} | {r['steps_s']:,} "
              f"| {r['project_loop_steps_s']:,} | {r['plain_loop_steps_s']:,} | {r['k_loops_steps_s']:,} "
              f"| {r['ratio_one_loop']:.2f}x | {r['ratio_k_loops']:.2f}x |")
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
    parser.add_argument("--vector-mode", choices=("auto", "sync", "async", "workers", "ahead"),
                        help="vector env of the actors (default: the actor's own, auto; the loops are one process)")
    parser.add_argument("--modes", type=comma_list(str, MODES), default="streaming",
                        help="comma list: streaming (training never starts), training")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds before measuring (startup, replay fill)")
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per run")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--loop", nargs=4, metavar=("KIND", "ENV", "NUM_ENVS", "SECONDS"),
                        help="internal: run one baseline loop (project or plain, env preset, envs, seconds) and "
                             "print its steps/s as JSON")
    parser.add_argument("--start-at", type=float, default=0.0, help="internal (--loop): wall-clock start of the window")
    parser.add_argument("--seed", type=int, default=0, help="internal (--loop): env seed")
    args = parser.parse_args()

    if args.loop:
        kind, preset, num_envs, seconds = args.loop
        rate = loop(kind, preset, int(num_envs), float(seconds), args.start_at, args.seed)
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
