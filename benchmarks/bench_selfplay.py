"""Tic-tac-toe learned by self-play: Elo and win-or-draw rates against wall time, beside a minimax player.

For each seed, starts real ``actorlearner learner`` processes (the settings of the learning test in
tests/league/test_selfplay.py: DQN against itself and its own snapshots only) and two ``actorlearner
actor`` processes of 4 envs, connected as ``--via`` says: ``direct`` (both actors to one learner),
``relay`` (both to one ``actorlearner relay`` in front of the learner) or ``ranks`` (two data-parallel
learners, ``--world-size 2``, one actor each). The learner flags are the same in every mode but
``--num-actors``, which counts one rank's actors: 1 per rank, so that the world's two actors explore
as the other modes' two do (the exploration ladder spans the ranks). It polls GetStatus every 2 s for ``--seconds`` of wall time (env steps, the policy's Elo,
snapshots held, the latest evaluation's win/draw/loss against random_player, heuristic_player and
the newest snapshot), then stops every process with SIGTERM and checks the exit codes. With
``ranks`` all of it is rank 0's but env steps: a learner counts only the steps of its own actors'
batches (learner/progress.py), so they are summed over the ranks. A process that exits early or
prints no port ends the script with its log's tail. The reference, measured in the same run: a
perfect player (negamax over every board), playing the same number of games per scripted player,
seats alternated. Tic-tac-toe is a draw under perfect play, so a perfect player never loses. Writes
a JSON of every curve and a PNG to ``--out`` (``tictactoe_selfplay[_relay|_ranks]``):

    python benchmarks/bench_selfplay.py --seeds 0,1,2 --seconds 180 --out benchmarks/selfplay
    python benchmarks/bench_selfplay.py --via relay --seeds 0,1,2 --seconds 180 --out benchmarks/selfplay
    python benchmarks/bench_selfplay.py --via ranks --seeds 0,1,2 --seconds 180 --out benchmarks/selfplay
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TextIO

import grpc
import numpy as np
from curves import HERE, REPO

from actorlearner.envs.tictactoe import LINES, TicTacToe, heuristic_player, random_player
from actorlearner.lifeline import tied_to_this_process
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
VIA = {"direct": "the two actors connect to the learner",
       "relay": "the two actors connect to one `actorlearner relay`, which connects to the learner",
       "ranks": "two data-parallel learners (--world-size 2), one actor each; status from rank 0, env steps "
                "summed over the ranks"}
LISTENING = re.compile(r"listening on [\d.]+:(\d+)")  # a server's first line with --port 0
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

@dataclass
class Child:
    """A process of a run: its log (stdout and stderr); a server's first line of output goes to ``first`` too."""
    name: str
    cmd: list[str]
    popen: subprocess.Popen
    log: TextIO
    first: queue.Queue | None = None
    drain: threading.Thread | None = None

    def tail(self, lines: int = 20) -> str:
        """The last ``lines`` of the log, once the process has exited (10 s at most)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        if self.drain:
            self.drain.join(5)
        text = Path(self.log.name).read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(f"  | {line}" for line in text) or "  (an empty log)"


def spawn(name: str, cmd: list[str], log: Path, env: dict, server: bool) -> Child:
    """``cmd`` as a process logging to ``log``; a ``server`` prints its port first (``--port 0``)."""
    out = open(log, "w", buffering=1)
    if not server:
        return Child(name, cmd, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env,
                                                     preexec_fn=tied_to_this_process()), out)
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=out, text=True, cwd=REPO, env=env,
                             preexec_fn=tied_to_this_process())
    child = Child(name, cmd, popen, out, queue.Queue())

    def drain():
        line = popen.stdout.readline()
        out.write(line)
        child.first.put(line)
        out.writelines(popen.stdout)
    child.drain = threading.Thread(target=drain, daemon=True)
    child.drain.start()
    return child


def check_running(children: list[Child]) -> None:
    for child in children:
        if child.popen.poll() is not None:
            raise RuntimeError(f"{child.name} exited early with code {child.popen.returncode}:\n{child.tail()}")


def ports(servers: list[Child], children: list[Child], timeout: float = 300) -> list[int]:
    """The port each of ``servers`` prints first; RuntimeError with a log's tail when one prints anything else,
    or any of ``children`` exits meanwhile, or ``timeout`` passes."""
    deadline, found = time.monotonic() + timeout, []
    for server in servers:
        while True:
            try:
                line = server.first.get(timeout=0.5)
                break
            except queue.Empty:
                check_running(children)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{server.name} printed no port in {timeout:.0f} s:\n{server.tail()}") from None
        match = LISTENING.search(line)
        if not match:
            tail = server.tail()  # once it has exited, if it does
            said = f"its first line: {line.strip()!r}" if line else f"it exited with code {server.popen.returncode}"
            raise RuntimeError(f"{server.name} did not report its port ({said}):\n{tail}")
        found.append(int(match.group(1)))
    return found


def stop(children: list[Child]) -> dict:
    """SIGTERM to each, the last started first; their exit codes (SIGKILL after 60 s)."""
    for child in reversed(children):
        if child.popen.poll() is None:
            child.popen.send_signal(signal.SIGTERM)
    codes = {}
    for child in reversed(children):
        try:
            codes[child.name] = child.popen.wait(60)
        except subprocess.TimeoutExpired:
            child.popen.kill()
            codes[child.name] = f"killed ({child.popen.wait()})"
        if child.drain:
            child.drain.join(10)
        child.log.close()
    return codes


def child_env() -> dict:
    """The children's environment: the repo importable, no ACTORLEARNER_* settings from this shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACTORLEARNER_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def win_or_draw(record: dict) -> float:
    return (record["wins"] + record["draws"]) / max(record["wins"] + record["draws"] + record["losses"], 1)


def get_status(port: int) -> pb.StatusResponse:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return pb_grpc.LearnerStub(channel).GetStatus(pb.StatusRequest(), timeout=5)


def run_seed(seed: int, seconds: float, via: str, logs: Path, echo: bool, interval: float = 2.0) -> dict:
    """The learner(s), relay if any, and two actors for ``seconds`` of wall time: a point per poll, an evaluation
    per new one."""
    env, module = child_env(), [sys.executable, "-m", "actorlearner"]
    learner_cmd = [*module, "learner", "--port", "0", *LEARNER_FLAGS[:2], "--seed", str(seed), *LEARNER_FLAGS[2:]]
    if via == "ranks":
        address = f"127.0.0.1:{free_port()}"
        learners = [(f"learner-rank{rank}", [*learner_cmd, "--num-actors", "1", "--world-size", "2", "--rank",
                                              str(rank), "--dist-address", address], {**env, "LOCAL_RANK": str(rank)})
                    for rank in range(2)]
    else:
        learners = [("learner", learner_cmd, env)]
    load = os.getloadavg()[0]
    start = time.monotonic()
    children, points, evaluations, seen = [], [], [], 0
    try:
        for name, cmd, learner_env in learners:  # every rank before any port: a rank serves once the world has met
            children.append(spawn(name, cmd, logs / f"seed{seed}_{name}.log", learner_env, server=True))
        learner_ports = upstream = ports(children, children)
        if via == "relay":
            relay_cmd = [*module, "relay", "--upstream", f"127.0.0.1:{learner_ports[0]}", "--port", "0",
                         "--relay-id", "selfplay-relay"]
            children.append(spawn("relay", relay_cmd, logs / f"seed{seed}_relay.log", env, server=True))
            upstream = ports(children[-1:], children)
        for i in range(2):
            cmd = [*module, "actor", "--learner", f"127.0.0.1:{upstream[i % len(upstream)]}", "--actor-id",
                   f"player-{i}", "--env", ENV, "--num-envs", "4", "--seed", str(i)]
            children.append(spawn(f"actor{i}", cmd, logs / f"seed{seed}_actor{i}.log", env, server=False))
        next_poll = start
        while (now := time.monotonic()) - start < seconds:
            check_running(children)
            time.sleep(max(0.0, next_poll - now))
            next_poll += interval
            try:
                statuses = [get_status(port) for port in learner_ports]
            except grpc.RpcError:
                continue  # busy or not serving yet: the next poll
            status, league = statuses[0], statuses[0].league
            records = {r.opponent: {"wins": r.wins, "draws": r.draws, "losses": r.losses} for r in league.evaluation}
            point = {"seconds": round(time.monotonic() - start, 2), "env_steps": sum(s.env_steps for s in statuses),
                     "rating": round(league.rating, 2), "snapshots": league.snapshots, "games": league.games,
                     "evaluations": status.evaluations, "evaluation": records}
            if len(statuses) > 1:
                point["env_steps_by_rank"] = [s.env_steps for s in statuses]
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
        codes = stop(children)
    reached = next((e for e in evaluations if all(e[k]["win_or_draw"] >= bar for k, bar in BARS.items())), None)
    first = {k: next(({"seconds": e["seconds"], "env_steps": e["env_steps"]} for e in evaluations
                      if e[k]["win_or_draw"] >= bar), None) for k, bar in BARS.items()}
    last = evaluations[-1] if evaluations else None
    return {"seed": seed, "commands": {c.name: " ".join(c.cmd) for c in children}, "exit_codes": codes,
            "load_average_at_start": load, "wall_seconds": round(time.monotonic() - start, 1),
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
    parser.add_argument("--via", choices=VIA, default="direct",
                        help="how the actors reach the learner: " + "; ".join(f"{k}: {v}" for k, v in VIA.items()))
    parser.add_argument("--seconds", type=float, default=180.0, help="wall seconds per run")
    parser.add_argument("--out", type=Path, default=HERE / "selfplay", help="directory for the JSON and PNG")
    parser.add_argument("--logs", type=Path, default=None, help="directory for the processes' logs [a temp dir]")
    parser.add_argument("--quiet", action="store_true", help="do not echo each evaluation")
    parser.add_argument("--replot", type=Path, default=None,
                        help="run nothing: summarize and plot the runs of this JSON again (into the same directory)")
    args = parser.parse_args()
    title = ("Tic-tac-toe, DQN by self-play via {} ({} seeds, {:.0f} s each): Elo and win-or-draw against scripted "
             "players never trained against")
    if args.replot:
        result = json.loads(args.replot.read_text())
        runs, minimax = result["runs"], result["minimax"]
        result["summary"] = summarize(runs, minimax)
        args.replot.write_text(json.dumps(result, indent=1))
        plot(runs, result["summary"]["minimax_pooled"], args.replot.with_suffix(".png"),
             title.format(result.get("via", "direct"), len(runs), result["seconds"]))
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
        try:
            run = run_seed(seed, args.seconds, args.via, logs, echo=not args.quiet)
        except RuntimeError as error:
            sys.exit(f"seed {seed}, via {args.via}: {error}")
        print(f"seed {seed}: exit codes {run['exit_codes']}, both bars {run['both_bars']}, final {run['final']}",
              file=sys.stderr, flush=True)
        runs.append(run)
    summary = summarize(runs, minimax)
    result = {"command": " ".join(["python", "benchmarks/bench_selfplay.py", *sys.argv[1:]]), "commit": commit.strip(),
              "via": args.via, "date": time.strftime("%Y-%m-%d"), "seconds": args.seconds, "eval_games": EVAL_GAMES,
              "bars": BARS, "fact": FACT, "summary": summary,
              "minimax": {str(seed): m for seed, m in minimax.items()}, "logs": str(logs), "runs": runs}
    name = "tictactoe_selfplay" + ("" if args.via == "direct" else f"_{args.via}")
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1))
    plot(runs, summary["minimax_pooled"], args.out / f"{name}.png", title.format(args.via, len(runs), args.seconds))
    print(json.dumps({"summary": summary, "final": {r["seed"]: r["final"] for r in runs},
                      "both_bars": {r["seed"]: r["both_bars"] for r in runs},
                      "exit_codes": {r["seed"]: r["exit_codes"] for r in runs}}))


if __name__ == "__main__":
    main()
