"""Atari Pong and Breakout: DQN's eval return against frames and wall time, over seeds,
beside Dopamine's published DQN curve at the same frame counts.

Runs ``python -m actorlearner run`` once per game and seed (`curves.run_seeds`) up to ``--frames``
emulator frames (env steps x 4: one agent step is 4 frames) or ``--max-seconds``. The games are
ALE v5 with the standard preprocessing (`actorlearner.envs.atari`: 1-30 noop starts, frame skip
4 with max-pooling, 84x84 grey, sticky actions 0.25, no life-loss episodes, rewards clipped to
their sign for training only) and ``--frame-stack 4``; the learner's evaluator plays whole
games at epsilon 0.001 and reports the raw score. Writes ``atari.json`` (every run's progress points),
``atari.csv`` (game, seed, wall seconds, env steps, frames, eval return), one PNG per game and a
table on stdout.

DQN settings (``DQN_FLAGS``; flags after ``--`` override them): the Nature/Dopamine network
(the Nature-DQN conv torso, then 512 units; dueling heads, double Q), Adam at lr 1e-4 (CleanRL's
dqn_atari), 3-step returns (Ape-X), batch 32 at 8 samples per insert (one batch of 32 per 4 agent
steps, Nature DQN's replay ratio), a hard target update every 2,000 updates (8,000 agent steps =
32,000 frames, Dopamine's), training from 20,000 stored transitions (Dopamine's 80,000 frames), a
100k-transition prioritized replay (smaller than the papers' 1M so that the learner fits a
laptop and learns early), 2 actors with Ape-X epsilons 0.4 and 0.4**4 = 0.026, and evaluations at
epsilon 0.001 (Dopamine's; a greedy Breakout policy that never presses FIRE would stall a game for
27,000 steps).

Reference: Dopamine's DQN baseline (Castro et al. 2018, arXiv:1812.06110; sticky actions 0.25,
RMSProp lr 2.5e-4, 1M replay, training epsilon 0.01), from
github.com/google/dopamine ``baselines/atari/data/{pong,breakout}.json``: the mean return of the
training episodes in each iteration of 1M frames, for DQN runs 1, 2 and 4 of that file
(``DOPAMINE``, iterations 0-9, plotted at the end of each iteration). Dopamine's figures are
training returns with epsilon 0.01; ours are evaluations at epsilon 0.001, so they are close but
not the same statistic.

    python benchmarks/bench_atari.py --games pong,breakout --seeds 0,1,2 --frames 10000000 \\
        --max-seconds 36000 --out benchmarks/atari
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import statistics
import sys
from pathlib import Path

from curves import HERE, eval_curve, run_seeds, split_passthrough, summary

from actorlearner.envs.atari import FRAME_SKIP

GAMES = {"pong": "ALE/Pong-v5", "breakout": "ALE/Breakout-v5"}
DQN_FLAGS = ["--frame-stack", "4", "--actors", "2", "--num-envs", "4", "--dqn-hidden-sizes", "512",
             "--dqn-lr", "1e-4", "--dqn-n-step", "3", "--dqn-target-update-period", "2000",
             "--dqn-epsilon-base", "0.4", "--dqn-epsilon-alpha", "3", "--batch-size", "32",
             "--samples-per-insert", "8", "--replay-capacity", "100000", "--min-replay-size", "20000",
             "--publish-every", "50", "--eval-every", "300", "--eval-episodes", "8", "--eval-envs", "8",
             "--eval-exploration", "0.001", "--checkpoint-every", "1800"]
"""The `run` flags of every run (see the module docstring)."""

DOPAMINE_FRAMES_PER_ITERATION = 1_000_000
DOPAMINE = {
    "pong": [[-20.333, -19.309, -17.855, -17.304, -17.200, -15.515, -14.097, -13.702, -12.584, -9.847],
             [-20.316, -19.191, -17.314, -15.303, -13.220, -9.134, -3.310, 4.891, 4.484, 6.912],
             [-20.559, -20.703, -20.260, -20.110, -20.258, -20.514, -20.301, -20.211, -19.000, -19.063]],
    "breakout": [[1.571, 2.964, 4.510, 5.882, 10.560, 13.374, 15.921, 18.984, 22.841, 28.510],
                 [1.651, 3.056, 3.976, 7.511, 10.090, 13.605, 15.354, 16.523, 18.751, 21.044],
                 [1.636, 3.270, 3.329, 6.000, 6.676, 8.915, 11.405, 15.593, 16.959, 19.273]],
}
"""Dopamine DQN, mean training return per iteration of 1M frames (iterations 0-9), DQN runs 1, 2
and 4 of google/dopamine baselines/atari/data/<game>.json."""
DOPAMINE_SOURCE = "Dopamine DQN (github.com/google/dopamine baselines/atari/data), runs 1, 2, 4"


def dopamine_mean(game: str) -> list[tuple[float, float]]:
    """(frames at the end of iteration i, mean over Dopamine's runs of that iteration's return)."""
    return [((i + 1) * DOPAMINE_FRAMES_PER_ITERATION, statistics.fmean(values))
            for i, values in enumerate(zip(*DOPAMINE[game]))]


def dopamine_at(game: str, frames: float) -> float:
    """Dopamine's mean return in the iteration that holds ``frames`` (the last one past iteration 9)."""
    curve = dopamine_mean(game)
    return curve[min(int(frames // DOPAMINE_FRAMES_PER_ITERATION), len(curve) - 1)][1]


def rows(game: str, runs: list[dict]) -> list[dict]:
    """One CSV row per evaluation of every run (progress lines repeat the latest one: kept once, where it
    first shows): wall seconds, env steps, frames, eval return."""
    out = []
    for run in runs:
        previous = None
        for (steps, value), (seconds, _) in zip(eval_curve(run, "env_steps"), eval_curve(run, "seconds")):
            if value == previous:
                continue
            previous = value
            out.append({"game": game, "seed": run["seed"], "wall_seconds": round(seconds, 1), "env_steps": int(steps),
                        "frames": int(steps * FRAME_SKIP), "eval_return": value})
    return out


def plot(game: str, runs: list[dict], path: Path) -> None:
    """Eval return against frames (with Dopamine's curve) and against wall seconds, every seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_frames, by_time) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for run in runs:
        steps = eval_curve(run, "env_steps")
        if steps:
            by_frames.plot([s * FRAME_SKIP for s, _ in steps], [v for _, v in steps], label=f"seed {run['seed']}")
            by_time.plot(*zip(*eval_curve(run, "seconds")), label=f"seed {run['seed']}")
    last = max([s * FRAME_SKIP for run in runs for s, _ in eval_curve(run, "env_steps")], default=1e6)
    reference = [(f, v) for f, v in dopamine_mean(game) if f <= max(last, DOPAMINE_FRAMES_PER_ITERATION)]
    by_frames.plot(*zip(*reference), "k--o", markersize=3, label="Dopamine DQN (mean of 3 runs, training return)")
    by_frames.set_xlabel("frames (env steps x 4, all actors)")
    by_time.set_xlabel("wall seconds")
    by_frames.set_ylabel("eval return (epsilon 0.001, raw score)")
    for ax in (by_frames, by_time):
        ax.set_xlim(0, None)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{GAMES[game]}: DQN, {len(runs)} seed{'s' * (len(runs) > 1)}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(results: dict[str, dict]) -> str:
    """One line per game: seeds, wall time, frames reached, frames/s, final eval, Dopamine at those frames."""
    lines = [f"{'game':<9} {'seeds':>5} {'wall s':>8} {'frames':>10} {'frames/s':>9} {'final eval':>16} "
             f"{'Dopamine then':>13}"]
    for game, result in results.items():
        finals = [(r["final"] or {}) for r in result["runs"]]
        frames = [f["env_steps"] * FRAME_SKIP for f in finals if f.get("env_steps")]
        evals = [f["eval_return"] for f in finals if f.get("eval_return") is not None]
        rates = [f["env_steps"] * FRAME_SKIP / f["seconds"] for f in finals if f.get("env_steps") and f.get("seconds")]
        median_frames = statistics.median(frames) if frames else 0
        final = (f"{statistics.fmean(evals):.1f} [{min(evals):g}, {max(evals):g}]" if evals else "-")
        lines.append(f"{game:<9} {len(result['runs']):>5} {result['median_wall_seconds']:>8.0f} {median_frames:>10.0f} "
                     f"{statistics.median(rates) if rates else 0:>9.0f} {final:>16} "
                     f"{dopamine_at(game, median_frames):>13.1f}")
    return "\n".join(lines)


def main() -> None:
    argv, passthrough = split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [options] [-- extra `actorlearner run` flags]")
    parser.add_argument("--games", default="pong,breakout", help=f"comma-separated, of {', '.join(GAMES)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each per game")
    parser.add_argument("--frames", type=int, default=2_000_000, help="emulator frames (env steps x 4, all actors) per run")
    parser.add_argument("--max-seconds", type=float, default=7200.0, help="wall-clock budget per run")
    parser.add_argument("--out", type=Path, default=HERE / "atari", help="directory for the JSON, CSV, PNGs and logs")
    parser.add_argument("--quiet", action="store_true", help="do not echo progress lines")
    args = parser.parse_args(argv)

    extra = DQN_FLAGS + passthrough  # later flags win
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, dict] = {}
    for game in args.games.split(","):
        runs = run_seeds(GAMES[game], seeds, args.frames // FRAME_SKIP, args.max_seconds, extra, args.out, game,
                         echo=not args.quiet)
        results[game] = {**summary(runs, env=GAMES[game], frames=args.frames, max_seconds=args.max_seconds,
                                   extra=extra, reference=DOPAMINE_SOURCE, reference_curve=dopamine_mean(game)),
                         "runs": runs}
        try:
            plot(game, runs, args.out / f"{game}.png")
        except ImportError as exc:
            print(f"no plot ({exc})", file=sys.stderr)
    (args.out / "atari.json").write_text(json.dumps(results, indent=1))
    with open(args.out / "atari.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["game", "seed", "wall_seconds", "env_steps", "frames", "eval_return"])
        writer.writeheader()
        for game, result in results.items():
            writer.writerows(rows(game, result["runs"]))
    print(f"run flags: {shlex.join(extra)}")
    print(table(results))


if __name__ == "__main__":
    main()
