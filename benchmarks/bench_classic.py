"""The classic control suite with the defaults: wall time and env steps to each task's target, beside a peer.

Runs ``python -m actorlearner run --env ID --actors 2 --target-return T --target-holds H`` once per task and
seed, with no other flag (`curves.run_seed`), until the learner's greedy evaluation (20 episodes, every 5 s
by the classic preset) reaches the task's target in H evaluations in a row (2 by default: a first lucky
one does not count) or ``--max-seconds`` pass, and prints a Markdown table of medians beside the
published figures of RL Zoo's tuned DQN for the same tasks. With ``--peer sb3`` each seed of this
project is followed by the same seed of Stable-Baselines3's DQN with RL Zoo's settings (peer_sb3.py),
on the same protocol (greedy, the same episodes, the same wall-time schedule, evaluation time counted,
the same held-solve rule), and a second table gives both sides' medians and their ratio. A seed not
solved within the cap counts as the cap. Its JSON keeps every run's result and evaluation points.

    python benchmarks/bench_classic.py --tasks CartPole-v1,Acrobot-v1,LunarLander-v3,MountainCar-v0 \\
        --seeds 0,1,2,3,4,5 --max-seconds 300 --peer sb3 --json /tmp/classic.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from curves import HERE, run_seed, split_passthrough, summary

from actorlearner.config import LearnerConfig
from actorlearner.config.presets import AUTO, preset
from actorlearner.curve import target_reached
from actorlearner.lifeline import tied_to_this_process

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


def evaluation_protocol(task: str) -> tuple[float, int]:
    """(seconds between evaluations, episodes each) that ``run`` uses on ``task`` with no flag: the peer's too."""
    defaults = LearnerConfig()
    return float(preset("dqn", AUTO, task).get("eval-every", defaults.eval_every)), defaults.eval_episodes


def ours_held(run: dict, target: float, cap: float) -> dict:
    """This project's run on the protocol: first hit and held solve (wall seconds, env steps) from its result."""
    final = run["final"] or {}
    first, held = final.get("first_hit"), final.get("solved_at")
    return {"solved": held is not None, "seconds": held["seconds"] if held else cap,
            "env_steps": held["env_steps"] if held else final.get("env_steps", 0),
            "first_hit_seconds": first["seconds"] if first else None}


def run_peer(task: str, seed: int, target: float, holds: int, cap: float, echo: bool) -> dict:
    """One seed of peer_sb3.py: its evaluations, first hit and held solve under the same rule."""
    every, episodes = evaluation_protocol(task)
    command = [sys.executable, str(HERE / "peer_sb3.py"), "--env", task, "--seed", str(seed), "--target", str(target),
               "--holds", str(holds), "--eval-every", str(every), "--eval-episodes", str(episodes),
               "--max-seconds", str(cap)]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=cap + 600, preexec_fn=tied_to_this_process())
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    points = [(line["seconds"], line["env_steps"], line["eval_return"]) for line in lines if "eval_return" in line]
    final = next((line for line in lines if line.get("final")), {})
    first, held = target_reached(points, target, holds)
    if echo:
        print(f"sb3 {task} seed {seed}: {points[-3:]}", file=sys.stderr, flush=True)
    return {"seed": seed, "command": " ".join(command), "returncode": done.returncode,
            "wall_seconds": round(time.monotonic() - start, 1), "points": points, "final": final,
            "stderr_tail": done.stderr[-2000:] if done.returncode else "",
            "solved": held is not None, "seconds": held[0] if held else cap,
            "env_steps": held[1] if held else final.get("env_steps", 0),
            "first_hit_seconds": first[0] if first else None}


def peer_table(sides: dict[str, dict[str, list[dict]]], cap: float) -> str:
    """Markdown: per task, each side's solved count, median held-solve wall and env steps, median first hit,
    per seed walls, and the ratio of median walls (peer / ours: above 1, this project is faster)."""
    lines = ["| task | side | solved | median wall (held) | median env steps (held) | median first hit | "
             "per seed wall (s) | peer / ours |", "|---|---|---|---:|---:|---:|---|---:|"]
    for task in sides["actorlearner"]:
        medians = {side: statistics.median(run["seconds"] for run in runs[task]) for side, runs in sides.items()}
        for side, runs in sides.items():
            rows = runs[task]
            firsts = [run["first_hit_seconds"] for run in rows if run["first_hit_seconds"] is not None]
            first = f"{statistics.median(firsts):.1f} s" if firsts else "none"
            walls = ", ".join(f"{run['seconds']:.0f}{'' if run['solved'] else ' (cap)'}" for run in rows)
            ratio = f"{medians['sb3'] / medians['actorlearner']:.2f}" if side == "actorlearner" else ""
            steps = statistics.median(run["env_steps"] for run in rows) / 1e3
            lines.append(f"| {task} | {side} | {sum(run['solved'] for run in rows)} of {len(rows)} | "
                         f"{medians[side]:.1f} s | {steps:.0f}k | {first} | {walls} | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    argv, passthrough = split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [options] [-- extra `actorlearner run` flags]")
    parser.add_argument("--tasks", default=",".join(TARGETS), help=f"comma-separated env ids among {', '.join(TARGETS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each")
    parser.add_argument("--actors", type=int, default=2, help="actor processes per run")
    parser.add_argument("--max-seconds", type=float, default=300.0, help="wall-clock budget per run")
    parser.add_argument("--holds", type=int, default=2, help="evaluations in a row at the target that solve a task")
    parser.add_argument("--peer", choices=("none", "sb3"), default="none",
                        help="also run Stable-Baselines3's DQN with RL Zoo's settings, seed by seed after ours")
    parser.add_argument("--json", type=Path, help="write every run (result, progress points, command) here")
    parser.add_argument("--quiet", action="store_true", help="do not echo progress lines")
    args = parser.parse_args(argv)
    tasks = args.tasks.split(",")
    unknown = [task for task in tasks if task not in TARGETS]
    if unknown:
        parser.error(f"no target for {', '.join(unknown)}; known: {', '.join(TARGETS)}")

    results: dict[str, list[dict]] = {}
    sides: dict[str, dict[str, list[dict]]] = {"actorlearner": {}, "sb3": {}}
    with tempfile.TemporaryDirectory(prefix="bench_classic-") as scratch:
        for task in tasks:
            results[task], sides["actorlearner"][task], sides["sb3"][task] = [], [], []
            for seed in (int(s) for s in args.seeds.split(",")):
                extra = ["--actors", str(args.actors), "--no-plot", "--run-dir", f"{scratch}/{task}-{seed}",
                         "--target-holds", str(args.holds), *passthrough]
                run = run_seed(task, seed, sys.maxsize, args.max_seconds, extra, Path(scratch) / f"{task}-{seed}.log",
                               echo=not args.quiet, target_return=TARGETS[task])
                final = run["final"] or {}
                print(f"{task} seed {seed}: solved {final.get('solved')}, {final.get('seconds')} s, "
                      f"{final.get('env_steps')} env steps, eval {final.get('eval_return')}, "
                      f"first hit {final.get('first_hit')}", file=sys.stderr, flush=True)
                results[task].append(run)
                sides["actorlearner"][task].append(ours_held(run, TARGETS[task], args.max_seconds))
                if args.peer == "sb3":
                    peer = run_peer(task, seed, TARGETS[task], args.holds, args.max_seconds, not args.quiet)
                    print(f"sb3 {task} seed {seed}: solved {peer['solved']}, {peer['seconds']} s, "
                          f"{peer['env_steps']} env steps, first hit {peer['first_hit_seconds']}",
                          file=sys.stderr, flush=True)
                    sides["sb3"][task].append(peer)
    print(table(results))
    if args.peer == "sb3":
        print()
        print(peer_table(sides, args.max_seconds))
    if args.json:
        args.json.write_text(json.dumps({**summary([r for runs in results.values() for r in runs]), "holds": args.holds,
                                         "results": results, "sides": sides}, indent=1))


if __name__ == "__main__":
    main()
