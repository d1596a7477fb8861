"""Tic-tac-toe learned by self-play: Elo and win-or-draw rates against wall time, beside a minimax player.

For each seed, starts a real ``actorlearner learner`` (the settings of the learning test in
tests/league/test_selfplay.py: DQN against itself and its own snapshots only) and two ``actorlearner
actor`` processes of 4 envs, polls GetStatus every 2 s for ``--seconds`` of wall time
(env steps, the policy's Elo, snapshots held, the latest evaluation's win/draw/loss against
random_player, heuristic_player and the newest snapshot), then stops them with SIGTERM and
checks their exit codes. The reference, measured in the same run: a perfect player (negamax
over every board), playing the same number of games per scripted player, seats alternated.
Tic-tac-toe is a draw under perfect play, so a perfect player never loses. Writes a JSON of
every curve and a PNG to ``--out``:

    python benchmarks/bench_selfplay.py --seeds 0,1,2 --seconds 180 --out benchmarks/selfplay
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import cache
from pathlib import Path

import grpc
import numpy as np
from curves import HERE, REPO

from actorlearner.envs.tictactoe import LINES, TicTacToe, heuristic_player, random_player
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

TTT = "actorlearner.envs.tictactoe"
ENV = f"{TTT}:tic_tac_toe"
RANDOM, HEURISTIC = f"{TTT}:random_player", f"{TTT}:heuristic_player"
SCRIPTED = {RANDOM: random_player, HEURISTIC: heuristic_player}
BARS = {RANDOM: 0.95, HEURISTIC: 0.80}  # win-or-draw in one evaluation, as in the learning test
EVAL_GAMES = 100
LEARNER_FLAGS = ["--env", ENV, "--num-actors", "2", "--min-replay-size", "1000", "--eval-every", "8",
                 "--league-eval-scripted", f"{RANDOM},{HEURISTIC}", "--league-eval-games", str(EVAL_GAMES),
                 "--league-eval-snapshots", "1", "--league-max-snapshots", "8", "--league-opponent-exploration", "0.2"]
FACT = "tic-tac-toe is a draw under perfect play: a perfect player never loses (win-or-draw 100% against anyone)"


# -- the reference: a perfect player ------------------------------------------------------------

@cache
def negamax(board: tuple[int, ...]) -> int:
    """The value of ``board`` (1: the player to move, 2: the other) to the player to move: +/-(1 + empty
    cells left) for a win or loss (sooner is bigger), 0 for a draw."""
    for a, b, c in LINES:
        if board[a] == board[b] == board[c] == 2:  # the player who just moved won
            return -(1 + board.count(0))
    if 0 not in board:
        return 0
    return max(-negamax(child(board, cell)) for cell in range(9) if board[cell] == 0)


def child(board: tuple[int, ...], cell: int) -> tuple[int, ...]:
    """The board after the mover takes ``cell``, seen by the next mover."""
    marks = list(board)
    marks[cell] = 1
    return tuple((0, 2, 1)[m] for m in marks)


def minimax_player(observation_space, action_space, seed: int = 0):
    """A perfect player: a move of the best negamax value, uniformly among equals."""
    rng = np.random.default_rng(seed)

    def act(observation):
        planes = np.asarray(observation["observation"]).reshape(3, 9) > 0.5
        board = tuple(int(m) for m in planes[0] + 2 * planes[1])
        values = {cell: -negamax(child(board, cell)) for cell in range(9) if board[cell] == 0}
        best = max(values.values())
        return int(rng.choice([cell for cell, value in values.items() if value == best]))
    return act


def play(first, second) -> str:
    """One game of ``first`` (x) against ``second`` (o): x's outcome, win, draw or loss."""
    env = TicTacToe()
    players = {"x": first, "o": second}
    observations, _ = env.reset()
    while True:
        (mover, observation), = observations.items()
        observations, rewards, done, _, _ = env.step({mover: players[mover](observation)})
        if all(done.values()):
            return {1.0: "win", 0.0: "draw", -1.0: "loss"}[rewards["x"]]


def minimax_reference(seed: int, games: int) -> dict:
    """``games`` games of the minimax player against each scripted player, seats alternated."""
    env = TicTacToe()
    spaces = env.observation_space("x"), env.action_space("x")
    result = {}
    for name, factory in SCRIPTED.items():
        counts = {"win": 0, "draw": 0, "loss": 0}
        for game in range(games):
            ours, theirs = minimax_player(*spaces, seed=seed * 1000 + game), factory(*spaces, seed=seed * 1000 + game)
            if game % 2 == 0:
                outcome = play(ours, theirs)
            else:
                outcome = {"win": "loss", "draw": "draw", "loss": "win"}[play(theirs, ours)]
            counts[outcome] += 1
        result[name] = {"wins": counts["win"], "draws": counts["draw"], "losses": counts["loss"],
                        "win_or_draw": (counts["win"] + counts["draw"]) / games}
    return result


# -- the learning runs --------------------------------------------------------------------------

def child_env() -> dict:
    """The children's environment: the repo importable, no ACTORLEARNER_* settings from this shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTORLEARNER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env


def win_or_draw(record: dict) -> float:
    return (record["wins"] + record["draws"]) / max(record["wins"] + record["draws"] + record["losses"], 1)


def get_status(port: int) -> pb.StatusResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=5)


def run_seed(seed: int, seconds: float, logs: Path, echo: bool, interval: float = 2.0) -> dict:
    """One learner and two actors for ``seconds`` of wall time: a point per poll, an evaluation per new one."""
    env = child_env()
    learner_cmd = [sys.executable, "-m", "actorlearner", "learner", "--port", "0", *LEARNER_FLAGS[:2],
                   "--seed", str(seed), *LEARNER_FLAGS[2:]]
    load = os.getloadavg()[0]
    start = time.monotonic()
    learner_log = open(logs / f"seed{seed}_learner.log", "w")
    learner = subprocess.Popen(learner_cmd, stdout=subprocess.PIPE, stderr=learner_log, text=True, cwd=REPO, env=env)
    line = learner.stdout.readline()
    match = re.search(r"listening on [\d.]+:(\d+)", line)
    if not match:
        learner.kill()
        raise RuntimeError(f"seed {seed}: the learner did not report its port: {line!r} (see {learner_log.name})")
    port = int(match.group(1))
    drain = threading.Thread(target=lambda: learner_log.writelines(learner.stdout), daemon=True)
    drain.start()
    actor_cmds = [[sys.executable, "-m", "actorlearner", "actor", "--learner", f"127.0.0.1:{port}",
                   "--actor-id", f"player-{i}", "--env", ENV, "--num-envs", "4", "--seed", str(i)] for i in range(2)]
    actor_logs = [open(logs / f"seed{seed}_actor{i}.log", "w") for i in range(2)]
    actors = [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env)
              for cmd, log in zip(actor_cmds, actor_logs)]
    points, evaluations, seen = [], [], 0
    try:
        next_poll = start
        while (now := time.monotonic()) - start < seconds:
            if any(p.poll() is not None for p in (learner, *actors)):
                raise RuntimeError(f"seed {seed}: a process exited early (see the logs in {logs})")
            time.sleep(max(0.0, next_poll - now))
            next_poll += interval
            try:
                status = get_status(port)
            except grpc.RpcError:
                continue  # busy or not serving yet: the next poll
            league = status.league
            records = {r.opponent: {"wins": r.wins, "draws": r.draws, "losses": r.losses} for r in league.evaluation}
            point = {"seconds": round(time.monotonic() - start, 2), "env_steps": status.env_steps,
                     "rating": round(league.rating, 2), "snapshots": league.snapshots, "games": league.games,
                     "evaluations": status.evaluations, "evaluation": records}
            points.append(point)
            if status.evaluations > seen and records:
                seen = status.evaluations
                snapshot = next((k for k in records if k not in SCRIPTED), None)
                evaluation = {"seconds": point["seconds"], "env_steps": point["env_steps"], "index": seen,
                              **{k: {**v, "win_or_draw": win_or_draw(v)} for k, v in records.items() if k in SCRIPTED},
                              "snapshot": {"id": snapshot, **records[snapshot], "win_or_draw": win_or_draw(records[snapshot])}
                              if snapshot else None}
                evaluations.append(evaluation)
                if echo:
                    print(f"seed {seed} [{point['seconds']:6.1f}s] steps {point['env_steps']} | Elo {league.rating:.0f} "
                          f"| snapshots {league.snapshots} | win-or-draw vs random "
                          f"{evaluation[RANDOM]['win_or_draw']:.2f}, heuristic {evaluation[HEURISTIC]['win_or_draw']:.2f}"
                          + (f", {snapshot} {evaluation['snapshot']['win_or_draw']:.2f}" if snapshot else ""),
                          file=sys.stderr, flush=True)
    finally:
        for proc in (*actors, learner):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        codes = []
        for proc in (*actors, learner):
            try:
                codes.append(proc.wait(60))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(f"killed ({proc.wait()})")
        drain.join(10)
        for log in (learner_log, *actor_logs):
            log.close()
    reached = next((e for e in evaluations if all(e[k]["win_or_draw"] >= bar for k, bar in BARS.items())), None)
    first = {k: next(({"seconds": e["seconds"], "env_steps": e["env_steps"]} for e in evaluations
                      if e[k]["win_or_draw"] >= bar), None) for k, bar in BARS.items()}
    last = evaluations[-1] if evaluations else None
    return {"seed": seed, "learner": " ".join(learner_cmd), "actors": [" ".join(c) for c in actor_cmds],
            "exit_codes": {"actors": codes[:2], "learner": codes[2]}, "load_average_at_start": load,
            "wall_seconds": round(time.monotonic() - start, 1),
            "both_bars": {"seconds": reached["seconds"], "env_steps": reached["env_steps"]} if reached else None,
            "first_at_bar": first,
            "final": {"seconds": points[-1]["seconds"], "env_steps": points[-1]["env_steps"],
                      "rating": points[-1]["rating"], "snapshots": points[-1]["snapshots"], "games": points[-1]["games"],
                      "evaluation_seen_at": {"seconds": last["seconds"], "env_steps": last["env_steps"]},
                      **{k: last[k]["win_or_draw"] for k in SCRIPTED}} if last else None,
            "evaluations": evaluations, "points": points}


# -- summary and figure -------------------------------------------------------------------------

def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict], minimax: dict) -> dict:
    finals = [r["final"] for r in runs if r["final"]]
    pooled = {k: {f: sum(m[k][f] for m in minimax.values()) for f in ("wins", "draws", "losses")} for k in SCRIPTED}
    reference = {k: {**v, "win_or_draw": win_or_draw(v)} for k, v in pooled.items()}
    for run in runs:  # the first evaluation from which every later one passes both bars too
        passing = [all(e[k]["win_or_draw"] >= bar for k, bar in BARS.items()) for e in run["evaluations"]]
        held = next((i for i in range(len(passing)) if all(passing[i:])), None)
        run["bars_held_from"] = ({"seconds": run["evaluations"][held]["seconds"],
                                  "env_steps": run["evaluations"][held]["env_steps"]} if held is not None else None)
    return {
        "seeds_reaching_both_bars": sum(r["both_bars"] is not None for r in runs),
        "median_both_bars": {"seconds": median([r["both_bars"]["seconds"] for r in runs if r["both_bars"]]),
                             "env_steps": median([r["both_bars"]["env_steps"] for r in runs if r["both_bars"]])},
        "median_bars_held_from": {"seconds": median([r["bars_held_from"]["seconds"] for r in runs if r["bars_held_from"]]),
                                  "env_steps": median([r["bars_held_from"]["env_steps"]
                                                       for r in runs if r["bars_held_from"]])},
        "median_final": {"rating": median([f["rating"] for f in finals]),
                         "env_steps": median([f["env_steps"] for f in finals]),
                         "snapshots": median([f["snapshots"] for f in finals]),
                         **{k: median([f[k] for f in finals]) for k in SCRIPTED}},
        "minimax_pooled": reference,
        "ratio_to_minimax": {k: {"per_seed": [f[k] / reference[k]["win_or_draw"] for f in finals],
                                 "median": median([f[k] / reference[k]["win_or_draw"] for f in finals])}
                             for k in SCRIPTED},
    }


def plot(runs: list[dict], reference: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (elo, rates) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for run, color in zip(runs, colors):
        elo.plot([p["seconds"] for p in run["points"]], [p["rating"] for p in run["points"]], color=color,
                 linewidth=1.2, label=f"seed {run['seed']}")
        evals = run["evaluations"]
        for name, style, short in ((RANDOM, "-", "random"), (HEURISTIC, "--", "heuristic")):
            rates.plot([e["seconds"] for e in evals], [e[name]["win_or_draw"] for e in evals], style, color=color,
                       marker="o", markersize=2.5, linewidth=1, label=f"seed {run['seed']} vs {short}")
    elo.axhline(1000, color="gray", linestyle=":", linewidth=1, label="initial rating (1000)")
    elo.set_ylabel("Elo of the current policy (against its league)")
    for name, color, short in ((RANDOM, "tab:red", "random"), (HEURISTIC, "tab:purple", "heuristic")):
        rates.axhline(reference[name]["win_or_draw"], color=color, linestyle="-.", linewidth=1.5 if name == RANDOM else 1,
                      label=f"minimax vs {short}: {reference[name]['win_or_draw']:.0%}")
        rates.axhline(BARS[name], color=color, linestyle=":", linewidth=1, label=f"bar vs {short}: {BARS[name]:.0%}")
    rates.set_ylabel(f"win-or-draw rate ({EVAL_GAMES} greedy games, seats alternated)")
    rates.set_ylim(-0.02, 1.05)
    for ax in (elo, rates):
        ax.set_xlabel("wall seconds since the learner started")
        ax.set_xlim(0, None)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5, ncol=2 if ax is rates else 1)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated learner seeds, one run each")
    parser.add_argument("--seconds", type=float, default=180.0, help="wall seconds per run")
    parser.add_argument("--out", type=Path, default=HERE / "selfplay", help="directory for the JSON and PNG")
    parser.add_argument("--logs", type=Path, default=None, help="directory for the processes' logs [a temp dir]")
    parser.add_argument("--quiet", action="store_true", help="do not echo each evaluation")
    parser.add_argument("--replot", type=Path, default=None,
                        help="run nothing: summarize and plot the runs of this JSON again (into the same directory)")
    args = parser.parse_args()
    name = "tictactoe_selfplay"
    title = "Tic-tac-toe, DQN by self-play ({} seeds, {:.0f} s each): Elo and win-or-draw against scripted players never trained against"
    if args.replot:
        result = json.loads(args.replot.read_text())
        runs, minimax = result["runs"], result["minimax"]
        result["summary"] = summarize(runs, minimax)
        args.replot.write_text(json.dumps(result, indent=1))
        plot(runs, result["summary"]["minimax_pooled"], args.replot.with_suffix(".png"),
             title.format(len(runs), result["seconds"]))
        print(json.dumps(result["summary"]))
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="bench_selfplay_"))
    logs.mkdir(parents=True, exist_ok=True)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True).stdout
    minimax = {seed: minimax_reference(seed, EVAL_GAMES) for seed in seeds}  # before the runs: none share the cores
    runs = []
    for seed in seeds:
        run = run_seed(seed, args.seconds, logs, echo=not args.quiet)
        print(f"seed {seed}: exit codes {run['exit_codes']}, both bars {run['both_bars']}, final {run['final']}",
              file=sys.stderr, flush=True)
        runs.append(run)
    summary = summarize(runs, minimax)
    result = {"command": " ".join(["python", "benchmarks/bench_selfplay.py", *sys.argv[1:]]), "commit": commit.strip(),
              "date": time.strftime("%Y-%m-%d"), "seconds": args.seconds, "eval_games": EVAL_GAMES,
              "bars": BARS, "fact": FACT, "summary": summary,
              "minimax": {str(seed): m for seed, m in minimax.items()}, "logs": str(logs), "runs": runs}
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
    plot(runs, summary["minimax_pooled"], args.out / f"{name}.png", title.format(len(runs), args.seconds))
    print(json.dumps({"summary": summary, "final": {r["seed"]: r["final"] for r in runs},
                      "both_bars": {r["seed"]: r["both_bars"] for r in runs},
                      "exit_codes": {r["seed"]: r["exit_codes"] for r in runs}}))


if __name__ == "__main__":
    main()
