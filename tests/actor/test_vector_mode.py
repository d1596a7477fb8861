"""``--vector-mode auto``, the actor's default: the env loop ahead (a process of its own) for a policy without
memory, sync for a recurrent one, and the choice in the actor's first log line."""

from __future__ import annotations

import subprocess

import pytest

from procs import NOT_TRAINING, start_actor, start_learner, status, stop, wait_until
from test_actor_settings import StderrLines
from test_ahead import loop_children


@pytest.mark.parametrize("algorithm, mode", [("dqn", "ahead"), ("r2d2", "sync")])
def test_the_default_fits_the_policy_and_the_first_log_line_says_which(algorithm, mode):
    learner, port = start_learner("--env", "CartPole-v1", *NOT_TRAINING, "--algorithm", algorithm)
    actor = None
    try:
        actor = start_actor(port, f"auto-{algorithm}", "--vector-mode", "auto", stderr=subprocess.PIPE)
        log = StderrLines(actor)
        first = wait_until(lambda: log.lines[:1], 120, "the actor's first log line")[0]
        assert f"{algorithm} network built" in first and first.rstrip().endswith(f"vector mode {mode} (auto)"), first
        wait_until(lambda: status(port).inserted > 0, 120, "batches stored at the learner")
        if mode == "ahead":
            assert loop_children(actor.pid), "no loop process"
        assert actor.poll() is None, "the actor exited early"
    finally:
        codes = stop(*(p for p in (actor, learner) if p is not None))
    assert codes == [0, 0]
    assert "Traceback" not in log.text()
