"""CartPole-v1 without velocities, learned by R2D2: eval return against env steps and wall time.

The observation keeps the cart position and the pole angle and drops both velocities, so a
policy must infer them from what it remembers: a partially observed task. Runs ``python -m
actorlearner run --env bench_cartpole_positions:cartpole_positions --algorithm r2d2`` once
per seed (`curves.run_seeds`) up to ``--steps`` or ``--max-seconds``, and writes a JSON of
every curve and a PNG beside the anchor: RLlib's tuned R2D2 example on the same task stops
at a return of 150 within 1M env steps.

    python benchmarks/bench_cartpole_positions.py --seeds 0,1,2 --steps 1000000 --max-seconds 900 \\
        --out benchmarks/cartpole_positions
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from curves import HERE, plot, run_seeds, split_passthrough, summary

ANCHOR = {"return": 150.0, "steps": 1_000_000,
          "source": "RLlib's tuned example r2d2/stateless-cartpole: stops at episode return 150 within 1M env steps"}


class PositionsOnly(gym.ObservationWrapper):
    """CartPole's observation without the two velocities: [cart position, pole angle]."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        low, high = env.observation_space.low[[0, 2]], env.observation_space.high[[0, 2]]
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[[0, 2]].astype(np.float32)


def cartpole_positions() -> gym.Env:
    """CartPole-v1 (500-step limit) showing positions only."""
    return PositionsOnly(gym.make("CartPole-v1"))


def main() -> None:
    argv, passthrough = split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [options] [-- extra `actorlearner run` flags]")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each")
    parser.add_argument("--steps", type=int, default=1_000_000, help="env steps (all actors) per run")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="wall-clock budget per run")
    parser.add_argument("--out", type=Path, default=HERE / "cartpole_positions",
                        help="directory for the JSON, PNG and logs")
    parser.add_argument("--quiet", action="store_true", help="do not echo progress lines")
    args = parser.parse_args(argv)

    env = "bench_cartpole_positions:cartpole_positions"
    extra = ["--algorithm", "r2d2", "--actors", "2", "--target-return", "475", *passthrough]
    name = "cartpole_positions_r2d2"
    runs = run_seeds(env, [int(s) for s in args.seeds.split(",")], args.steps, args.max_seconds, extra, args.out,
                     name, echo=not args.quiet)
    result = summary(runs, env=env, steps=args.steps, max_seconds=args.max_seconds, extra=extra, reference=ANCHOR)
    (args.out / f"{name}.json").write_text(json.dumps({**result, "runs": runs}, indent=1))
    try:
        plot(runs, f"CartPole-v1, positions only, R2D2: eval return ({len(runs)} seeds, "
                   f"median wall {result['median_wall_seconds']:.0f} s)", args.out / f"{name}.png",
             [(ANCHOR["return"], "RLlib's tuned R2D2 example: stops at 150 (within 1M steps)"),
              (400.0, "goal: 400")])
    except ImportError as exc:
        print(f"no plot ({exc}); install the bench extra", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
