"""The classic control suite with the defaults: wall time and env steps to each task's target.

Runs ``python -m actorlearner run --env ID --actors 2 --target-return T`` once per task and seed,
with no other flag (`curves.run_seed`), until the learner's greedy evaluation (20 episodes)
reaches the task's target or ``--max-seconds`` pass, and prints a Markdown table of medians
beside the published figures of RL Zoo's tuned DQN for the same tasks. Its JSON keeps every
run's result and progress points.

    python benchmarks/bench_classic.py --tasks CartPole-v1,Acrobot-v1,LunarLander-v3,MountainCar-v0 \\
        --seeds 0,1,2 --max-seconds 300 --json /tmp/classic.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from curves import run_seed, split_passthrough, summary

# Gymnasium's reward_threshold for each task (LunarLander's 200, MountainCar's -110, ...).
TARGETS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "LunarLander-v3": 200.0, "MountainCar-v0": -110.0}

# RL Zoo's benchmark.md (rl-baselines3-zoo): its tuned DQN's mean evaluation return and the env steps
# it trained for (LunarLander on -v2, the same dynamics). RL Zoo publishes no wall times.
PUBLISHED = {
    "CartPole-v1": "500.0 +- 0.0 after 50k steps",
    "Acrobot-v1": "-76.6 +- 11.8 after 100k steps",
    "LunarLander-v3": "154.4 +- 79.2 after 100k steps (-v2; below the target)",
    "MountainCar-v0": "-100.8 +- 9.9 after 120k steps",
}


def table(results: dict[str, list[dict]]) -> str:
    """Markdown: per task, how many seeds solved, median wall and env steps of all runs, each seed's."""
    lines = ["| task | target | solved | median wall | median env steps | per seed (wall, env steps) | RL Zoo DQN |",
             "|---|---:|---|---:|---:|---|---|"]
    for task, runs in results.items():
        finals = [run["final"] or {} for run in runs]
        solved = sum(bool(final.get("solved")) for final in finals)
        walls = [final.get("seconds", run["wall_seconds"]) for run, final in zip(runs, finals)]
        steps = [final.get("env_steps", 0) for final in finals]
        seeds = ", ".join(f"{run['seed']}: {wall:.0f} s, {step / 1e3:.0f}k{'' if final.get('solved') else ' (not solved)'}"
                          for run, final, wall, step in zip(runs, finals, walls, steps))
        lines.append(f"| {task} | {TARGETS[task]:g} | {solved} of {len(runs)} | {statistics.median(walls):.1f} s | "
                     f"{statistics.median(steps) / 1e3:.0f}k | {seeds} | {PUBLISHED[task]} |")
    return "\n".join(lines)


def main() -> None:
    argv, passthrough = split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [options] [-- extra `actorlearner run` flags]")
    parser.add_argument("--tasks", default=",".join(TARGETS), help=f"comma-separated env ids among {', '.join(TARGETS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each")
    parser.add_argument("--actors", type=int, default=2, help="actor processes per run")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="wall-clock budget per run")
    parser.add_argument("--json", type=Path, help="write every run (result, progress points, command) here")
    parser.add_argument("--quiet", action="store_true", help="do not echo progress lines")
    args = parser.parse_args(argv)
    tasks = args.tasks.split(",")
    unknown = [task for task in tasks if task not in TARGETS]
    if unknown:
        parser.error(f"no target for {', '.join(unknown)}; known: {', '.join(TARGETS)}")

    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_classic-") as scratch:
        for task in tasks:
            results[task] = []
            for seed in (int(s) for s in args.seeds.split(",")):
                extra = ["--actors", str(args.actors), "--no-plot", "--run-dir", f"{scratch}/{task}-{seed}", *passthrough]
                run = run_seed(task, seed, sys.maxsize, args.max_seconds, extra, Path(scratch) / f"{task}-{seed}.log",
                               echo=not args.quiet, target_return=TARGETS[task])
                final = run["final"] or {}
                print(f"{task} seed {seed}: solved {final.get('solved')}, {final.get('seconds')} s, "
                      f"{final.get('env_steps')} env steps, eval {final.get('eval_return')}", file=sys.stderr, flush=True)
                results[task].append(run)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({**summary([r for runs in results.values() for r in runs]),
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
