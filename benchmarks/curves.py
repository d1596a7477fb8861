"""Learning-curve runs shared by the learning benchmarks: run ``actorlearner run``, read its progress.

`run_seed` starts one ``python -m actorlearner run`` and reads the progress lines it prints
to stderr every 2 s (``[  12.0s] steps 1.2M | 4.5k sps | return 8.1 | ... | eval 9.3``) into
points of (wall seconds, env steps, training return, eval return). A run stops at the step
budget (SIGTERM once the progress passes it; ``run`` then joins the evaluation under way and
prints its final JSON line) or at its ``--max-seconds``, whichever comes first. Progress
numbers are printed with 3 significant digits, so points are that precise; the final point
is ``run``'s own JSON (exact env steps). `plot` draws eval return against env steps and
against wall time, every seed and their mean with a min-max band, beside reference levels.
"""

from __future__ import annotations

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

from actorlearner.curve import PANELS, new_panels, save_panels
from actorlearner.lifeline import tied_to_this_process

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

PROGRESS = re.compile(r"^\[\s*(?P<seconds>[\d.]+)s\] (?P<fields>.+)$")
FIELDS = {"steps": "env_steps", "return": "return", "eval": "eval", "updates": "updates"}
SUFFIXES = {"k": 1e3, "M": 1e6, "G": 1e9}


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


def run_seed(env: str, seed: int, steps: int, max_seconds: float, extra: list[str], log_path: Path,
             echo: bool, grace: float = 120.0, target_return: float = 1e9) -> dict:
    """One ``actorlearner run`` up to ``steps`` env steps or ``target_return`` (by default out of reach):
    its progress points, final result and wall time."""
    command = [sys.executable, "-m", "actorlearner", "run", "--port", "0", "--env", env, "--seed", str(seed),
               "--max-seconds", str(max_seconds), "--target-return", str(target_return), *extra]
    path = os.pathsep.join(p for p in (str(HERE), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    points: list[dict] = []
    stdout: list[str] = []
    reached = threading.Event()
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": path}, start_new_session=True,
                            preexec_fn=tied_to_this_process())

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
                if point["env_steps"] >= steps:
                    reached.set()

    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=lambda: stdout.append(proc.stdout.read()), daemon=True)]
    for reader in readers:
        reader.start()
    stopped_by = "exited"  # by itself: its --max-seconds, or a failure (see returncode and the log)
    while proc.poll() is None:
        if reached.wait(0.5):
            stopped_by = "steps"
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


def eval_curve(run: dict, x: str = "env_steps") -> list[tuple[float, float]]:
    """(x, eval return) of a run, x being ``env_steps`` or ``seconds``: each progress point with an
    eval, then the final result."""
    curve = [(p[x], p["eval"]) for p in run["points"] if p.get("eval") is not None]
    final = run["final"] or {}
    if final.get("eval_return") is not None and final.get(x) is not None:
        curve.append((float(final[x]), float(final["eval_return"])))
    return curve


def plot(runs: list[dict], title: str, path: Path, references: list[tuple[float, str]], note: str = "") -> None:
    """Eval return against env steps (left) and wall seconds (right); ``references`` are
    (return, label) levels drawn across both."""
    import numpy as np

    fig, axes = new_panels()
    for ax, (x, _) in zip(axes, PANELS):
        curves = [(run, curve) for run in runs if (curve := eval_curve(run, x))]
        for run, curve in curves:
            ax.plot(*zip(*curve), alpha=0.35 if len(curves) > 1 else 1.0, linewidth=1, label=f"seed {run['seed']}")
        if len(curves) > 1:
            # where every seed has an evaluation: from the latest first one to the earliest last one
            grid = np.linspace(max(c[0][0] for _, c in curves), min(c[-1][0] for _, c in curves), 200)
            ys = np.array([np.interp(grid, *zip(*c)) for _, c in curves])
            ax.plot(grid, ys.mean(0), color="black", linewidth=2, label=f"mean of {len(curves)} seeds")
            ax.fill_between(grid, ys.min(0), ys.max(0), color="gray", alpha=0.2, label="min-max over seeds")
        for (value, text), color in zip(references, ("tab:red", "tab:purple", "tab:brown")):
            ax.axhline(value, color=color, linestyle="--", linewidth=1, label=text)
    save_panels(fig, axes, path, title, "eval return (learner's evaluator, deterministic)", note=note, dpi=120,
                legend_size=7)


def split_passthrough(argv: list[str]) -> tuple[list[str], list[str]]:
    """(own arguments, the `run` flags after ``--``)."""
    if "--" not in argv:
        return argv, []
    return argv[:argv.index("--")], argv[argv.index("--") + 1:]


def run_seeds(env: str, seeds: list[int], steps: int, max_seconds: float, extra: list[str], out: Path,
              name: str, echo: bool) -> list[dict]:
    """`run_seed` for each seed in turn, a one-line summary of each on stderr."""
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for seed in seeds:
        run = run_seed(env, seed, steps, max_seconds, extra, out / f"{name}_seed{seed}.log", echo=echo)
        final = run["final"] or {}
        print(f"{name} seed {seed}: {run['stopped_by']}, rc {run['returncode']}, {run['wall_seconds']:.0f} s wall, "
              f"{final.get('env_steps', '?')} env steps, eval {final.get('eval_return')}, "
              f"{len(run['points'])} progress points", file=sys.stderr, flush=True)
        runs.append(run)
    return runs


def summary(runs: list[dict], **fields) -> dict:
    """What a learning benchmark's JSON holds besides its runs: ``fields``, commit, date, medians."""
    walls = [r["wall_seconds"] for r in runs]
    finals = [r["final"]["eval_return"] for r in runs if r["final"] and r["final"].get("eval_return") is not None]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    return {**fields, "commit": commit.strip(), "date": time.strftime("%Y-%m-%d"),
            "median_wall_seconds": statistics.median(walls),
            "median_final_eval": statistics.median(finals) if finals else None}
