"""Learning evidence in the default suite: ``actorlearner run`` solves CartPole-v1, seeded, as a user runs it."""

import json
import subprocess
import sys

import pytest

# `make run` solves it in about 42 s on a quiet machine; the suite runs on two busy cores.
MAX_SECONDS = 240


@pytest.mark.learning
def test_run_solves_cartpole_with_two_actor_processes():
    done = subprocess.run([sys.executable, "-m", "actorlearner", "run", "--env", "CartPole-v1", "--actors", "2",
                           "--target-return", "475", "--max-seconds", str(MAX_SECONDS), "--seed", "0"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=MAX_SECONDS + 120)
    lines = done.stdout.strip().splitlines()
    assert lines, f"run printed no result (exit {done.returncode}):\n{done.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert done.returncode == 0 and result["solved"] is True and result["eval_return"] >= 475, (
        f"exit {done.returncode}, {result}\n{done.stderr[-3000:]}")
