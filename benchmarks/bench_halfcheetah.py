"""HalfCheetah-v5 learning curves for SAC and TD3: eval return against env steps and wall time.

Runs ``python -m actorlearner run --env HalfCheetah-v5 --algorithm A`` once per algorithm and
seed (`curves.run_seeds`) up to ``--steps`` or ``--max-seconds``, with settings close to
CleanRL's single-process scripts: one update of 256 per env step (``--samples-per-insert
256``), a 1M replay, learning rate 3e-4, and the first 5k env steps uniformly random before
learning starts; the learner trains on 2 torch threads. Writes one JSON with every curve per algorithm and a PNG each, eval return
against env steps and against wall seconds, beside CleanRL's published final returns.

Needs MuJoCo (the optional ``bench`` extra: ``pip install -e '.[bench]'``).

    python benchmarks/bench_halfcheetah.py --algorithms sac,td3 --seeds 0,1,2 \\
        --max-seconds 600 --out benchmarks/halfcheetah
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from curves import HERE, plot, run_seeds, split_passthrough, summary

ENV = "HalfCheetah-v5"

CLEANRL = {
    "sac": {"return": 9634.89, "std": 1423.73, "steps": 1_000_000,
            "source": "CleanRL docs, rl-algorithms/sac.md: sac_continuous_action.py, HalfCheetah, 3 seeds, "
                      "mean of the last 100 training episodes at 1M steps"},
    "td3": {"return": 9583.22, "std": 126.09, "steps": 1_000_000,
            "source": "CleanRL docs, rl-algorithms/td3.md: td3_continuous_action.py, HalfCheetah-v4, 3 seeds, "
                      "mean of the last 100 training episodes at 1M steps"},
}
"""CleanRL's published HalfCheetah returns; it publishes no figure at fewer steps in text."""

RANDOM_STEPS = 5_000
"""Env steps (all actors) of uniformly random actions before the policy acts, as CleanRL's SAC."""


def run_flags(algorithm: str, actors: int, num_envs: int) -> list[str]:
    """The `run` flags of one algorithm's runs."""
    per_actor = RANDOM_STEPS // (actors * num_envs)  # random_steps counts each actor's vector steps
    return ["--algorithm", algorithm, "--actors", str(actors), "--num-envs", str(num_envs),
            "--samples-per-insert", "256", "--batch-size", "256", "--replay-capacity", "1000000",
            "--min-replay-size", str(RANDOM_STEPS), f"--{algorithm}-lr", "3e-4",
            f"--{algorithm}-random-steps", str(per_actor),
            "--eval-every", "30", "--eval-episodes", "5", "--eval-envs", "5", "--torch-threads", "2"]


def main() -> None:
    argv, passthrough = split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [options] [-- extra `actorlearner run` flags]")
    parser.add_argument("--algorithms", default="sac,td3", help="comma-separated: sac, td3")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each")
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps (all actors) per run")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="wall-clock budget per run")
    parser.add_argument("--actors", type=int, default=2, help="actor processes per run")
    parser.add_argument("--num-envs", type=int, default=4, help="envs per actor")
    parser.add_argument("--out", type=Path, default=HERE / "halfcheetah", help="directory for the JSON, PNG and logs")
    parser.add_argument("--quiet", action="store_true", help="do not echo progress lines")
    args = parser.parse_args(argv)

    seeds = [int(s) for s in args.seeds.split(",")]
    for algorithm in args.algorithms.split(","):
        extra = run_flags(algorithm, args.actors, args.num_envs) + passthrough
        name = f"{ENV}_{algorithm}"
        runs = run_seeds(ENV, seeds, args.steps, args.max_seconds, extra, args.out, name, echo=not args.quiet)
        reference = CLEANRL[algorithm]
        result = summary(runs, env=ENV, algorithm=algorithm, steps=args.steps, max_seconds=args.max_seconds,
                         extra=extra, reference=reference)
        (args.out / f"{name}.json").write_text(json.dumps({**result, "runs": runs}, indent=1))
        try:  # CleanRL's 1M-step level is not drawn: it would flatten curves of a few 10k steps
            plot(runs, f"{ENV}, {algorithm.upper()}: eval return ({len(runs)} seeds, "
                       f"median wall {result['median_wall_seconds']:.0f} s)", args.out / f"{name}.png", [],
                 note=f"CleanRL {algorithm.upper()}: {reference['return']:.0f} +- {reference['std']:.0f} "
                      "at 1M env steps (its docs); flags of these runs in the JSON")
        except ImportError as exc:
            print(f"no plot ({exc}); install the bench extra", file=sys.stderr)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
