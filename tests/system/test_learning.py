"""Learning evidence in the default suite, every learning test in this one module (`make test` runs
them in turn on one worker): ``actorlearner run``, seeded, as a user runs it, reaches its target, and
so do data-parallel learners and self-play in real processes."""

import json
import logging
import subprocess
import sys
import tempfile
import time

import pytest

from actorlearner.league import SELF
from actorlearner.v1 import learner_pb2 as pb
from custom_envs import GOAL_IMAGE_OPTIMAL_RETURN, GOAL_IMAGE_RANDOM_RETURN
from multiagent_envs import HEURISTIC, RANDOM, TICTACTOE
from procs import (CHILD_ENV, free_port, listening_port, run_command, start_actor, start_learner, start_rank,
                   start_relay, status, stop, wait_until)

logger = logging.getLogger(__name__)

# `make run` solves CartPole in about 42 s on a quiet machine; the suite runs on two busy cores.
MAX_SECONDS = 240


# One actor process stepping its envs itself, for the tests about what a network or an algorithm learns: on two
# cores beside a learner, a second actor and each actor's loop process (the defaults) only add processes to
# start and to share the cores with. CartPole, Pendulum and MinAtar keep `run`'s defaults.
ONE_ACTOR = ("--actors", "1", "--vector-mode", "sync")


def run(target: float, seconds: float, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    """``actorlearner run`` (its defaults, two actor processes, unless ``args`` say otherwise) until the
    evaluated return reaches ``target`` or ``seconds`` pass: its result line, and the finished process."""
    with tempfile.TemporaryDirectory() as run_dir:
        done = run_command([sys.executable, "-m", "actorlearner", "run", "--port", "0", "--seed", "0",
                            "--target-return", str(target), "--max-seconds", str(seconds), "--run-dir", run_dir,
                            "--no-plot", *args], timeout=seconds + 120, env=CHILD_ENV)
    lines = done.stdout.strip().splitlines()
    assert lines, f"run printed no result (exit {done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(lines[-1]), done


def run_until(target: float, *args: str) -> dict:
    """``actorlearner run`` until the evaluated return reaches ``target``, within MAX_SECONDS."""
    result, done = run(target, MAX_SECONDS, *args)
    assert done.returncode == 0 and result["solved"] is True and result["eval_return"] >= target, (
        f"exit {done.returncode}, {result}\n{done.stderr[-3000:]}")
    return result


def test_every_learning_test_is_in_this_module(request):
    """`make test` runs this module's tests in turn on one worker, beside the other workers' modules."""
    strays = [item.nodeid for item in request.session.items
              if item.get_closest_marker("learning") and item.path.name != "test_learning.py"]
    assert not strays


@pytest.mark.learning
def test_run_solves_cartpole_with_two_actor_processes():
    run_until(475, "--env", "CartPole-v1")


@pytest.mark.learning
def test_run_learns_a_dict_observation_with_an_image_and_multidiscrete_actions():
    """The goal is only in the uint8 image (conv torso); noise keys of four other space types; two action
    branches. Random play scores 0.19, the shortest path 0.99. Here and in the TD3 and R2D2 tests below, an
    evaluation every 3 s (not 10) ends the run sooner after it learned; the targets are what they were."""
    target = 0.8
    assert GOAL_IMAGE_RANDOM_RETURN < target / 4 and target < GOAL_IMAGE_OPTIMAL_RETURN
    run_until(target, "--env", "custom_envs:goal_image", "--eval-every", "3", *ONE_ACTOR)


@pytest.mark.learning
def test_run_solves_pendulum_with_sac_and_no_other_flag():
    """Continuous actions: SAC's own learner defaults (256 per update, one update per 2 inserted) and its
    Pendulum preset (64-unit layers)."""
    run_until(-200, "--env", "Pendulum-v1", "--algorithm", "sac")


@pytest.mark.learning
def test_td3_learns_asymmetric_per_dimension_bounds_and_never_acts_outside_them():
    """low = [-1, 0], high = [3, 0.5]: pointing at the middle scores -1.67, the targets 0. The env raises
    on any action outside its bounds, so every action the actors and the evaluator sent was inside."""
    result = run_until(-0.25, "--env", "custom_envs:reach", "--algorithm", "td3", "--eval-every", "3", *ONE_ACTOR)
    assert result["env_steps"] > 1000


@pytest.mark.learning
def test_r2d2_remembers_a_cue_that_feed_forward_dqn_cannot():
    """The cue shows at the first step only and is asked for 8 to 10 steps later (+1 right, -1 wrong)."""
    run_until(0.9, "--env", "custom_envs:memory_cue", "--algorithm", "r2d2", "--eval-every", "3", *ONE_ACTOR)


@pytest.mark.learning
def test_feed_forward_dqn_stays_near_zero_on_the_memory_task():
    """Without memory the best policy is a guess: over 200 evaluation episodes its mean stays near 0 (sd 0.07),
    after 1000 updates (R2D2 solves the task in about 100 on this seed, its first evaluation past 0.9)."""
    result, _ = run(0.9, MAX_SECONDS, "--env", "custom_envs:memory_cue", "--eval-episodes", "200",
                    "--max-updates", "1000", "--eval-every", "3", *ONE_ACTOR)
    assert result["ended"] == "trained" and result["updates"] == 1000, result
    assert abs(result["eval_return"]) <= 0.3, result


@pytest.mark.learning
def test_dqn_tells_which_way_a_dot_moves_from_stacked_frames():
    """Two frames stacked, each stored once: only the first step of 6 is a guess (best mean 5.5)."""
    run_until(5.2, "--env", "custom_envs:moving_dot", "--frame-stack", "2", "--eval-episodes", "50", *ONE_ACTOR)


@pytest.mark.learning
def test_dqn_cannot_tell_which_way_a_dot_moves_from_one_frame():
    """From one frame every policy scores 3 on average (sd 0.17 over 50 episodes), however long it trains: here
    1000 updates, more than twice the stacked run's when its first evaluation past 5.2 began (about 400)."""
    result, _ = run(5.2, MAX_SECONDS, "--env", "custom_envs:moving_dot", "--eval-episodes", "50",
                    "--max-updates", "1000", "--eval-every", "3", *ONE_ACTOR)
    assert result["ended"] == "trained" and result["updates"] == 1000, result
    assert result["eval_return"] <= 4.0, result


@pytest.mark.learning
def test_run_learns_minatar_breakout_from_pixels_with_no_other_flag():
    """MinAtar's Breakout (10x10x4 bool frames, 3 actions, sticky actions): a random policy's episodes score 0.38 on
    average and at most 5 in 1,000 (benchmarks/bench_minatar.py's random_return); a greedy mean of 3 over 20 is
    far past it. The preset's network, and the default vector mode (the loop ahead) in each actor."""
    result = run_until(3.0, "--env", "MinAtar/Breakout-v1")
    assert result["env_steps"] > 10_000


@pytest.mark.learning
def test_two_data_parallel_learners_with_an_actor_each_learn_cartpole():
    """Rank 0 evaluates until 300 (random play scores about 20; `run` solves to 475 in the test above and
    RESULTS.md has the data-parallel runs to 475); each rank's updates per second are logged."""
    budget = 600
    address = f"127.0.0.1:{free_port()}"
    learners = [start_rank(rank, address, "--num-actors", "1", "--eval-every", "0" if rank else "3") for rank in (0, 1)]
    actors = []
    try:
        ports = [listening_port(proc) for proc in learners]
        # One actor a rank: four processes, not six, share the suite's two busy cores.
        actors = [start_actor(port, f"rank{rank}-actor", "--num-envs", "4", "--seed", str(10 * rank))
                  for rank, port in enumerate(ports)]
        start = time.monotonic()

        def solved():
            answer = status(ports[0])
            return answer if answer.evaluations and answer.eval_mean_return >= 300 else None
        final = wait_until(solved, budget, "rank 0's evaluation to reach 300", interval=2.0)
        elapsed = time.monotonic() - start
        answers = [final, status(ports[1]), status(ports[0])]
        rates = [answer.updates / elapsed for answer in answers[:2]]
        logger.warning("data-parallel CartPole at 300 in %.0f s: updates/s per rank %s, env steps %s, versions %s",
                       elapsed, [round(r, 1) for r in rates], [a.env_steps for a in answers[:2]],
                       [a.policy_version for a in answers[:2]])
        # Lockstep: rank 1's count, read between two reads of rank 0's, lies between them (one step either way).
        assert answers[0].updates - 1 <= answers[1].updates <= answers[2].updates + 1
    finally:
        stop(*actors)
        codes = stop(*learners)
    assert codes == [0, 0]


SELF_PLAY_DEADLINE = 300  # seconds; on a quiet machine both bars are met in about 60-90 s


def win_or_draw(record: pb.EvalRecord) -> float:
    return (record.wins + record.draws) / max(record.wins + record.draws + record.losses, 1)


@pytest.mark.learning
def test_self_play_learns_tic_tac_toe_that_beats_random_play_and_holds_the_heuristic(tmp_path):
    """DQN against itself and its own snapshots only (neither scripted player is ever trained
    against): one evaluation of 100 games against each, seats alternated, must lose at most 5% to
    random play and 20% to the heuristic. Its checkpoint then plays through `actorlearner eval` and
    exports (masked actions and all) through `actorlearner export`."""
    learner, port = start_learner(
        "--env", TICTACTOE, "--seed", "0", "--num-actors", "2", "--min-replay-size", "1000", "--eval-every", "8",
        "--checkpoint-dir", str(tmp_path / "ckpt"),
        "--league-eval-scripted", f"{RANDOM},{HEURISTIC}", "--league-eval-games", "100",
        "--league-eval-snapshots", "1", "--league-max-snapshots", "8", "--league-opponent-exploration", "0.2")
    actors = [start_actor(port, f"player-{i}", "--env", TICTACTOE, "--num-envs", "4", "--seed", str(i))
              for i in range(2)]
    try:
        def passed():
            league = status(port).league
            rates = {r.opponent: win_or_draw(r) for r in league.evaluation}
            return (league, rates) if rates.get(RANDOM, 0) >= 0.95 and rates.get(HEURISTIC, 0) >= 0.80 else None
        league, rates = wait_until(passed, SELF_PLAY_DEADLINE, "an evaluation with >= 95% win-or-draw against random "
                                                               "play and >= 80% against the heuristic", interval=1.0)
        assert 1 <= league.snapshots <= league.max_snapshots == 8
        assert league.games > 1000 and league.rating > 0
        assert {o.opponent.id for o in league.opponents if o.opponent.version < 0} == {SELF}, "no scripted training"
    finally:
        codes = stop(*actors, learner)
    assert codes == [0, 0, 0]
    played = run_command([sys.executable, "-m", "actorlearner", "eval", "--checkpoint", str(tmp_path / "ckpt"),
                          "--opponents", f"{RANDOM},{HEURISTIC}", "--episodes", "40", "--json"],
                         timeout=300, env=CHILD_ENV)
    assert played.returncode == 0, played.stderr[-2000:]
    records = json.loads(played.stdout)["opponents"]
    assert [sum(records[name][k] for k in ("wins", "draws", "losses")) for name in (RANDOM, HEURISTIC)] == [40, 40]
    exported = run_command([sys.executable, "-m", "actorlearner", "export", "--checkpoint", str(tmp_path / "ckpt"),
                            "--out", str(tmp_path / "ttt.onnx"), "--json"], timeout=300, env=CHILD_ENV)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert json.loads(exported.stdout)["verified"]


RACE = "actorlearner.envs.race:race_to_10"
RACE_RANDOM, RACE_PERFECT = "actorlearner.envs.race:random_player", "actorlearner.envs.race:perfect_player"
RACE_DEADLINE = 240  # seconds; on a quiet machine the target is met 5-10 s after the learner starts
# Self-play only: the scripted players are evaluated against, never trained against. An evaluation
# every second (20 games against each, seats alternated, no snapshots), Monte-Carlo returns
# (a seat makes at most 5 moves) and a small, quick network.
RACE_LEARNER_FLAGS = [
    "--env", RACE, "--num-actors", "2", "--min-replay-size", "200", "--eval-every", "1",
    "--league-eval-scripted", f"{RACE_RANDOM},{RACE_PERFECT}", "--league-eval-games", "20",
    "--league-eval-snapshots", "0", "--league-opponent-exploration", "0.2",
    "--dqn-n-step", "5", "--dqn-target-update-period", "100", "--dqn-hidden-sizes", "64,64", "--dqn-lr", "0.001"]


def race_learned(status_port: int, actor_ports: list[int]) -> pb.LeagueStatus:
    """One actor process per entry of ``actor_ports`` (the port it connects to) until the learner at
    ``status_port`` evaluates perfect play of race to 10: a 50% win rate against the perfect player (the
    best there is: every game it moves first in) and 90% against random play (race to 10 never draws).
    Stops the actors (each must exit 0); returns the league at that evaluation."""
    actors = [start_actor(port, f"racer-{i}", "--env", RACE, "--seed", str(i)) for i, port in enumerate(actor_ports)]
    try:
        def perfect():
            league = status(status_port).league
            rates = {r.opponent: win_or_draw(r) for r in league.evaluation}
            return league if rates.get(RACE_PERFECT, 0) >= 0.5 and rates.get(RACE_RANDOM, 0) >= 0.9 else None
        # Polled twice a second, evaluated once a second: no evaluation that meets the target goes unseen.
        league = wait_until(perfect, RACE_DEADLINE, "an evaluation with a 50% win rate against the perfect player "
                                                    "and 90% against random play", interval=0.5)
    finally:
        codes = stop(*actors)
    assert codes == [0] * len(actors)
    return league


@pytest.mark.learning
def test_self_play_learns_to_race_to_10_perfectly():
    """Two actors on one learner; its league holds only itself and its snapshots."""
    learner, port = start_learner(*RACE_LEARNER_FLAGS, "--seed", "0")
    try:
        league = race_learned(port, [port, port])
        assert {o.opponent.id for o in league.opponents if o.opponent.version < 0} == {SELF}, "no scripted training"
        assert league.games > 100
    finally:
        codes = stop(learner)
    assert codes == [0]


@pytest.mark.learning
def test_self_play_learns_to_race_to_10_perfectly_through_a_relay():
    """The same, the actors behind a relay: the league passed down, the games up; status at the relay shows it."""
    learner, port = start_learner(*RACE_LEARNER_FLAGS, "--seed", "0")
    relay, relay_port = start_relay(port, "race-relay")
    try:
        league = race_learned(port, [relay_port, relay_port])
        assert {o.opponent.id for o in league.opponents if o.opponent.version < 0} == {SELF}
        assert status(relay_port).league.games >= league.games > 100
    finally:
        codes = stop(relay, learner)
    assert codes == [0, 0]


@pytest.mark.learning
def test_self_play_learns_to_race_to_10_perfectly_with_two_data_parallel_ranks():
    """The same with two ranks, an actor each: one league for the world, the same on both ranks."""
    address = f"127.0.0.1:{free_port()}"
    ranks = [start_rank(rank, address, *RACE_LEARNER_FLAGS, "--seed", "0") for rank in (0, 1)]
    try:
        ports = [listening_port(rank) for rank in ranks]
        league = race_learned(ports[0], ports)
        assert {o.opponent.id for o in league.opponents if o.opponent.version < 0} == {SELF}
        assert league.games > 100

        def alike():  # the actors stopped: every rank's games shared, on both ranks
            shown = [status(port).league for port in ports]
            return shown[0].games == shown[1].games and shown[0].rating == shown[1].rating
        wait_until(alike, 60, "both ranks to show the same league")
    finally:
        codes = stop(*ranks)
    assert codes == [0, 0]


# Two quick ones last: the worker running this module is handed its next module with two tests to go.
@pytest.mark.learning
def test_run_solves_frozen_lake_from_its_discrete_observation():
    """Discrete(16) observations, one-hot inside the network; not slippery, so 1.0 is reachable. Evaluated every
    3 s, not 10: solved in about 1,000 updates, the run ends that much sooner."""
    run_until(1.0, "--env", "custom_envs:frozen_lake", "--eval-every", "3", *ONE_ACTOR)


@pytest.mark.learning
def test_a_plugin_algorithm_from_a_test_module_trains_through_real_processes():
    """Tabular Q-learning defined in tests/support/plugin_algorithm.py, with its own option (--tabq-lr)."""
    run_until(1.0, "--env", "custom_envs:frozen_lake", "--algorithm", "plugin_algorithm:TabularQ", "--tabq-lr", "0.5",
              "--eval-every", "3", *ONE_ACTOR)
