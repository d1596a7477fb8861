"""MinAtar learning curves, the five games: greedy eval return against env frames and wall time, per seed.

Runs ``python -m actorlearner run --env MinAtar/<Game>-v0`` once per game and seed (`curves.run_seeds`)
with the defaults and the game's preset (``--preset auto``), up to ``--frames`` or ``--max-seconds``.
Writes per game a JSON with every curve and a PNG of eval return against frames and wall time, and a
random policy's return over 100 episodes (the floor a learner must leave). ``-v0`` is MinAtar's full
6-action set with sticky actions (0.1) and difficulty ramping, as in the paper; ``--actions minimal``
takes ``-v1``.

MinAtar (GPL-3, the optional ``bench`` and ``test`` extras) registers its gymnasium ids when the
project's env factory first meets a ``MinAtar/`` name.

Reference: Young & Tian 2019, "MinAtar: An Atari-Inspired Testbed for Thorough and Reproducible
Reinforcement Learning Experiments" (arXiv:1903.03176), Figure "learning curves" and the repository's
``img/learning_curves.gif``: DQN (replay and a target network, 5M frames, 30 runs) is given as
curves of the smoothed return of training episodes (epsilon 0.1), with no table. The only value
used here is Breakout's "about 10 by 5M frames", read off that curve (approximate); the other
games have no reference figure that could be checked, and say so.

    python benchmarks/bench_minatar.py --games breakout --seeds 0,1,2 --max-seconds 600 --out benchmarks/minatar
    python benchmarks/bench_minatar.py --seeds 0 --max-seconds 600 --out benchmarks/minatar
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from curves import HERE, eval_curve, plot, run_seeds, split_passthrough, summary

GAMES = {"asterix": "Asterix", "breakout": "Breakout", "freeway": "Freeway", "seaquest": "Seaquest",
         "space_invaders": "SpaceInvaders"}

SOURCE = "Young & Tian 2019 (arXiv:1903.03176), DQN learning curves (no table)"
REFERENCES: dict[str, dict] = {
    "breakout": {"return": 10.0, "frames": 5_000_000,
                 "source": f"about 10 at 5M frames, read off the curve: {SOURCE}"},
}
"""Per game, the paper's DQN return where one could be read; the others have none (see the docstring)."""


def env_id(game: str, actions: str) -> str:
    return f"MinAtar/{GAMES[game]}-{'v0' if actions == 'full' else 'v1'}"


def random_return(env: str, episodes: int = 100, seed: int = 0) -> dict:
    """A uniformly random policy's mean and best episode return over ``episodes`` episodes."""
    from actorlearner.envs.factory import make_env

    game = make_env(env)
    game.action_space.seed(seed)
    returns = []
    for episode in range(episodes):
        game.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = game.step(game.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    game.close()
    return {"mean": sum(returns) / len(returns), "max": max(returns), "episodes": episodes}


def reached(run: dict, target: float) -> dict | None:
    """The first progress point whose eval return is at least ``target`` (frames and wall seconds)."""
    for (frames, value), (seconds, _) in zip(eval_curve(run), eval_curve(run, "seconds")):
        if value >= target:
            return {"frames": frames, "seconds": seconds}
    return None


def main() -> None:
    argv, passthrough = split_passthrough(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     usage="%(prog)s [options] [-- extra `actorlearner run` flags]")
    parser.add_argument("--games", default=",".join(GAMES), help=f"comma-separated, of: {', '.join(GAMES)}")
    parser.add_argument("--actions", choices=("full", "minimal"), default="full",
                        help="MinAtar's 6 actions (-v0, as in the paper) or each game's minimal set (-v1)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, one run each per game")
    parser.add_argument("--frames", type=int, default=5_000_000, help="env frames (all actors) per run")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="wall-clock budget per run")
    parser.add_argument("--out", type=Path, default=HERE / "minatar", help="directory for the JSON, PNG and logs")
    parser.add_argument("--quiet", action="store_true", help="do not echo progress lines")
    args = parser.parse_args(argv)

    games = args.games.split(",")
    unknown = set(games) - set(GAMES)
    if unknown:
        parser.error(f"unknown games: {', '.join(sorted(unknown))}")
    rows = []
    for game in games:
        env = env_id(game, args.actions)
        name = f"minatar_{game}_{args.actions}"
        floor = random_return(env)
        runs = run_seeds(env, [int(s) for s in args.seeds.split(",")], args.frames, args.max_seconds, passthrough,
                         args.out, name, echo=not args.quiet)
        reference = REFERENCES.get(game)
        result = summary(runs, env=env, frames=args.frames, max_seconds=args.max_seconds, extra=passthrough,
                         reference=reference, random_policy=floor)
        if reference:
            result["reached_reference"] = [reached(run, reference["return"]) for run in runs]
        result["best_eval"] = [max((value for _, value in eval_curve(run)), default=None) for run in runs]
        (args.out / f"{name}.json").write_text(json.dumps({**result, "runs": runs}, indent=1))
        lines = [(floor["mean"], f"random policy: {floor['mean']:.2f}")]
        if reference:
            lines.append((reference["return"], f"paper's DQN: about {reference['return']:g} at 5M frames"))
        plot(runs, f"{env}: eval return ({len(runs)} seed{'s' * (len(runs) > 1)}, preset auto)",
             args.out / f"{name}.png", lines, note=f"Reference: {SOURCE}" if reference else "")
        rows.append({k: result[k] for k in ("env", "median_wall_seconds", "median_final_eval", "best_eval",
                                             "random_policy", "reference")} | {"reached": result.get("reached_reference")})
        print(json.dumps(rows[-1]), flush=True)
    print(f"command: {shlex.join([sys.executable, *sys.argv])}", file=sys.stderr)


if __name__ == "__main__":
    main()
