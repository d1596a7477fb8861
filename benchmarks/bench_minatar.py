"""MinAtar Breakout learning curves: greedy eval return against env frames, over seeds.

Runs ``python -m actorlearner run`` once per seed and reads the progress lines it prints to
stderr every 2 s (``[  12.0s] steps 1.2M | 4.5k sps | return 8.1 | ... | eval 9.3``) into
points of (wall seconds, env steps, training return, eval return). A run stops at the frame
budget (SIGTERM once the progress passes ``--frames``; ``run`` then joins the evaluation under
way and prints its final JSON line) or at ``--max-seconds``, whichever comes first. Progress
numbers are printed with 3 significant digits, so points are that precise; the final point
is ``run``'s own JSON (exact env steps). Writes a JSON with every curve and a PNG of eval
return against frames, the mean over seeds with its min-max band, next to the MinAtar
paper's DQN.

MinAtar (GPL-3, the optional ``bench`` extra: ``pip install -e '.[bench]'``) registers its
gymnasium ids (``MinAtar/Breakout-v0``: 6 actions, ``-v1``: the minimal 3) only when
``minatar.gym.register_envs()`` is called: gymnasium 1.x no longer loads its
``gymnasium.envs`` entry point, and ``gym.make("minatar.gym:MinAtar/Breakout-v1")`` imports
the module without registering. So the env is named by a factory in this file,
``bench_minatar:breakout`` (this directory goes on the runs' PYTHONPATH). Observations are
Box(False, True, (10, 10, 4), bool); sticky actions (0.1) and difficulty ramping are on, as
in the paper.

Reference: Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed for Thorough and
Reproducible Reinforcement Learning Experiments" (arXiv:1903.03176): DQN (replay and a
target network) reaches about 10 average return on Breakout by 5M frames. The figure is
approximate, read off the paper's learning curves (not re-checked here against the paper's
data), and, as far as we know, those curves average episodes played while training, not
greedy evaluations as plotted here. The default env keeps MinAtar's full 6 actions (``Environment.num_actions()``,
what MinAtar's own DQN example uses); ``bench_minatar:breakout_minimal`` has the minimal 3.

    python benchmarks/bench_minatar.py --seeds 0,1,2 --frames 5000000 --max-seconds 36000 \\
        --out benchmarks/minatar -- --actors 4 --num-envs 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

REFERENCE = {"return": 10.0, "frames": 5_000_000,
             "source": "about 10: DQN on MinAtar Breakout at 5M frames, Young & Tian 2019 (arXiv:1903.03176)"}
"""The MinAtar paper's DQN on Breakout, approximately."""

PROGRESS = re.compile(r"^\[\s*(?P<seconds>[\d.]+)s\] (?P<fields>.+)$")
FIELDS = {"steps": "env_steps", "return": "return", "eval": "eval", "updates": "updates"}
SUFFIXES = {"k": 1e3, "M": 1e6, "G": 1e9}


# -- environments (imported by the learner and actors as bench_minatar:NAME) ---------------

def _minatar(env_id: str):
    import warnings

    import gymnasium as gym
    import minatar.gym

    if env_id not in gym.registry:
        minatar.gym.register_envs()
    with warnings.catch_warnings():  # "-v0 is out of date": it is the paper's action set, on purpose
        warnings.simplefilter("ignore", DeprecationWarning)
        return gym.make(env_id)


def breakout():
    """MinAtar Breakout with the full 6-action set, as in the paper (``MinAtar/Breakout-v0``)."""
    return _minatar("MinAtar/Breakout-v0")


def breakout_minimal():
    """MinAtar Breakout with its minimal 3-action set (``MinAtar/Breakout-v1``)."""
    return _minatar("MinAtar/Breakout-v1")


# -- progress lines ------------------------------------------------------------------------

def parse_number(text: str) -> float | None:
    """A number as ``telemetry.human`` writes it (950, 12.3k, 1.5M, 2G); None for ``-``."""
    text = text.strip()
    if text in ("-", ""):
        return None
    scale = SUFFIXES.get(text[-1], 1.0)
    value = float(text[:-1] if text[-1] in SUFFIXES else text)
    return value * scale if math.isfinite(value) else None


def parse_progress(line: str) -> dict | None:
    """One ``run`` progress line as a point, or None for any other line.

    Keeps seconds, env_steps, sps, return (recent training episodes), eval (the latest
    greedy evaluation, repeated until the next) and updates; other fields are skipped.
    """
    match = PROGRESS.match(line.strip())
    if not match:
        return None
    point: dict = {"seconds": float(match["seconds"])}
    for field in match["fields"].split(" | "):
        key, _, value = field.strip().partition(" ")
        try:
            if value == "sps":
                point["sps"] = parse_number(key)
            elif key in FIELDS:
                point[FIELDS[key]] = parse_number(value)
        except ValueError:
            continue  # a field whose format changed: skip it, keep the rest
    return point if point.get("env_steps") is not None else None


# -- runs ----------------------------------------------------------------------------------

def run_seed(env: str, seed: int, frames: int, max_seconds: float, extra: list[str], log_path: Path,
             echo: bool, grace: float = 120.0) -> dict:
    """One ``actorlearner run``: its progress points, final result and wall time."""
    command = [sys.executable, "-m", "actorlearner", "run", "--env", env, "--seed", str(seed),
               "--max-seconds", str(max_seconds), "--target-return", "1e9", *extra]
    path = os.pathsep.join(p for p in (str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    points: list[dict] = []
    stdout: list[str] = []
    reached = threading.Event()
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": path}, start_new_session=True)

    def read_stderr() -> None:
        with open(log_path, "w") as log:
            for line in proc.stderr:
                log.write(line)
                point = parse_progress(line)
                if point is None:
                    continue
                points.append(point)
                if echo:
                    print(f"seed {seed}: {line.strip()}", file=sys.stderr, flush=True)
                if point["env_steps"] >= frames:
                    reached.set()

    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)]
    for reader in readers:
        reader.start()
    stopped_by = "exited"  # by itself: its --max-seconds, or a failure (see returncode and the log)
    while proc.poll() is None:
        if reached.wait(0.5):
            stopped_by = "frames"
            proc.send_signal(signal.SIGTERM)
            break
        if time.monotonic() - start > max_seconds + grace:
            stopped_by = "overran"
            proc.send_signal(signal.SIGTERM)
            break
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # this run's own process group: it and its actors
        proc.wait()
        stopped_by += ", killed"
    wall = time.monotonic() - start
    for reader in readers:
        reader.join(10)
    final = None
    for line in reversed("".join(stdout).splitlines()):
        try:
            final = json.loads(line)
            break
        except ValueError:
            continue
    return {"seed": seed, "command": shlex.join(command), "returncode": proc.returncode, "stopped_by": stopped_by,
            "wall_seconds": round(wall, 1), "final": final, "points": points, "log": str(log_path)}


def eval_curve(run: dict) -> list[tuple[float, float]]:
    """(env steps, eval return) of a run: each progress point with an eval, then the final result."""
    curve = [(p["env_steps"], p["eval"]) for p in run["points"] if p.get("eval") is not None]
    final = run["final"] or {}
    if final.get("eval_return") is not None and final.get("env_steps") is not None:
        curve.append((float(final["env_steps"]), float(final["eval_return"])))
    return curve


def plot(runs: list[dict], frames: int, title: str, path: Path, reference: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    curves = [(run, curve) for run in runs if (curve := eval_curve(run))]
    for run, curve in curves:
        x, y = zip(*curve)
        ax.plot(x, y, alpha=0.35 if len(curves) > 1 else 1.0, linewidth=1, label=f"seed {run['seed']}")
    if len(curves) > 1:
        # where every seed has an evaluation: from the latest first one to the earliest last one
        grid = np.linspace(max(c[0][0] for _, c in curves), min(c[-1][0] for _, c in curves), 200)
        ys = np.array([np.interp(grid, *zip(*c)) for _, c in curves])
        ax.plot(grid, ys.mean(0), color="black", linewidth=2, label=f"mean of {len(curves)} seeds")
        ax.fill_between(grid, ys.min(0), ys.max(0), color="gray", alpha=0.2, label="min-max over seeds")
    right = max([frames] + [c[-1][0] for _, c in curves])
    if reference:  # a level, not a curve: the paper reaches it at 5M frames, far right of most runs here
        ax.axhline(REFERENCE["return"], color="tab:red", linestyle="--", linewidth=1,
                   label=f"MinAtar paper DQN: about {REFERENCE['return']:g} at {REFERENCE['frames'] / 1e6:g}M frames")
        fig.text(0.01, 0.01, "Reference: Young & Tian 2019, arXiv:1903.03176 (approximate; a training-return curve)",
                 fontsize=7)
    ax.set_xlim(0, right * 1.02)
    ax.set_xlabel("env frames (all actors)")
    ax.set_ylabel("greedy eval return (learner's evaluator)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    argv = sys.argv[1:]
    passthrough = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [options] [-- extra `actorlearner run` flags]")
    parser.add_argument("--env", default="bench_minatar:breakout",
                        help="env name as `run` takes it (default: Breakout, full action set, as in the paper)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each")
    parser.add_argument("--frames", type=int, default=5_000_000, help="env frames (all actors) per run")
    parser.add_argument("--max-seconds", type=float, default=36_000.0, help="wall-clock budget per run")
    parser.add_argument("--extra", default="", help="more `run` flags, one shell-quoted string (as after --)")
    parser.add_argument("--out", type=Path, default=HERE / "minatar", help="directory for the JSON, PNG and logs")
    parser.add_argument("--quiet", action="store_true", help="do not echo progress lines")
    args = parser.parse_args(argv)

    extra = shlex.split(args.extra) + passthrough
    args.out.mkdir(parents=True, exist_ok=True)
    name = args.env.replace(":", "_").replace("/", "_")
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        run = run_seed(args.env, seed, args.frames, args.max_seconds, extra, args.out / f"{name}_seed{seed}.log",
                       echo=not args.quiet)
        final = run["final"] or {}
        print(f"seed {seed}: {run['stopped_by']}, rc {run['returncode']}, {run['wall_seconds']:.0f} s wall, "
              f"{final.get('env_steps', '?')} env steps, eval {final.get('eval_return')}, "
              f"{len(run['points'])} progress points", file=sys.stderr, flush=True)
        runs.append(run)

    walls = [r["wall_seconds"] for r in runs]
    finals = [r["final"]["eval_return"] for r in runs if r["final"] and r["final"].get("eval_return") is not None]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    result = {"env": args.env, "frames": args.frames, "max_seconds": args.max_seconds, "extra": extra,
              "commit": commit.strip(), "date": time.strftime("%Y-%m-%d"), "reference": REFERENCE,
              "median_wall_seconds": statistics.median(walls),
              "median_final_eval": statistics.median(finals) if finals else None, "runs": runs}
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
    title = (f"{args.env}: eval return vs frames ({len(runs)} seed{'s' * (len(runs) > 1)}, "
             f"median wall {result['median_wall_seconds']:.0f} s)")
    try:
        plot(runs, args.frames, title, args.out / f"{name}.png", reference="breakout" in args.env.lower())
    except ImportError as exc:
        print(f"no plot ({exc}); install the bench extra", file=sys.stderr)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))


if __name__ == "__main__":
    main()
