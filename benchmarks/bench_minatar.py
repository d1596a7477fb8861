"""MinAtar Breakout learning curves: greedy eval return against env frames, over seeds.

Runs ``python -m actorlearner run`` once per seed (`curves.run_seeds`) up to ``--frames`` or
``--max-seconds``. Writes a JSON with every curve and a PNG of eval return against frames and
wall time, the mean over seeds with its min-max band, next to the MinAtar paper's DQN.

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
import shlex
import sys
from pathlib import Path

from curves import HERE, plot, run_seeds, split_passthrough, summary

REFERENCE = {"return": 10.0, "frames": 5_000_000,
             "source": "about 10: DQN on MinAtar Breakout at 5M frames, Young & Tian 2019 (arXiv:1903.03176)"}
"""The MinAtar paper's DQN on Breakout, approximately."""


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


def main() -> None:
    argv, passthrough = split_passthrough(sys.argv[1:])
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
    name = args.env.replace(":", "_").replace("/", "_")
    runs = run_seeds(args.env, [int(s) for s in args.seeds.split(",")], args.frames, args.max_seconds, extra,
                     args.out, name, echo=not args.quiet)
    result = summary(runs, env=args.env, frames=args.frames, max_seconds=args.max_seconds, extra=extra,
                     reference=REFERENCE)
    (args.out / f"{name}.json").write_text(json.dumps({**result, "runs": runs}, indent=1))
    title = (f"{args.env}: eval return ({len(runs)} seed{'s' * (len(runs) > 1)}, "
             f"median wall {result['median_wall_seconds']:.0f} s)")
    references = ([(REFERENCE["return"], f"MinAtar paper DQN: about {REFERENCE['return']:g} at 5M frames")]
                  if "breakout" in args.env.lower() else [])
    try:
        plot(runs, title, args.out / f"{name}.png", references,
             note="Reference: Young & Tian 2019, arXiv:1903.03176 (approximate; a training-return curve)")
    except ImportError as exc:
        print(f"no plot ({exc}); install the bench extra", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
