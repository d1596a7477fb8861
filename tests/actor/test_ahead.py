"""The env loop in a process of its own (``--vector-mode ahead``): its steps are exactly those of acting and
stepping in lockstep, each labelled with the weights that chose it; a restart drops the steps under way;
an actor streams with it end to end, refuses a recurrent policy, and leaves no process behind; an actor
that cannot be built says why in one line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from actorlearner.actor.ahead import AHEAD, Ahead, LoopProcess
from actorlearner.actor.profile import StepProfile
from actorlearner.actor.stepping import Lockstep
from actorlearner.algorithms import make_spec
from actorlearner.envs import make_vector_env
from actorlearner.envs.factory import env_factories
from procs import (CHILD_ENV, NOT_TRAINING, process_children, run_command, start_actor, start_learner, start_time,
                   status, status_if, stop, wait_until)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FIELDS = ("obs", "actions", "acted", "next_obs", "rewards", "terminated", "truncated")
NUM_ENVS = 3


@pytest.fixture
def pair():
    """A loop process and a sync vector env of the same CartPole envs (a 15-step limit: episodes end often)."""
    loop = LoopProcess(env_factories("custom_envs:short_cartpole", NUM_ENVS))
    envs = make_vector_env("custom_envs:short_cartpole", NUM_ENVS)
    yield loop, envs
    loop.close()
    envs.close()


def policies(loop: LoopProcess, seed: int):
    spec = make_spec("dqn", loop.single_observation_space, loop.single_action_space, {"hidden_sizes": [16]})
    return spec.make_policy(seed=seed), spec.make_policy(seed=seed)


def assert_same(got, want, what: str) -> None:
    for field in FIELDS:
        assert np.array_equal(getattr(got, field), getattr(want, field)), f"{what}: {field}"


def test_steps_are_lockstep_s_exactly_and_a_restart_with_a_new_network_starts_them_afresh(pair):
    loop, envs = pair
    ahead, lockstep = Ahead(loop, StepProfile(), seed=5), Lockstep(envs, StepProfile())
    mine, reference = policies(loop, seed=5)
    assert np.array_equal(ahead.reset(7), lockstep.reset(7))
    for i in range(60):
        assert_same(ahead.step(mine, 0.3, 0), lockstep.step(reference, 0.3, 0), f"step {i}")
    assert ahead.in_flight
    ahead.restart()  # a new network: the steps the child made ahead with the old one are dropped
    mine, reference = policies(loop, seed=5)
    assert np.array_equal(ahead.reset(11), lockstep.reset(11))
    for i in range(60):
        got = ahead.step(mine, np.array([0.0, 0.5, 1.0]), 0)
        assert_same(got, lockstep.step(reference, np.array([0.0, 0.5, 1.0]), 0), f"after the restart, step {i}")


def test_closing_a_loop_that_runs_ahead_ends_it_without_a_kill(pair):
    """A loop waiting for the actor to take its slots still reads commands: it answers close by returning
    (exit 0) instead of being killed once its time to answer is out."""
    loop, _ = pair
    ahead = Ahead(loop, StepProfile(), seed=5)
    policy, _ = policies(loop, seed=5)
    ahead.reset(3)
    ahead.step(policy, 0.0, 0)  # the loop runs ahead now, then waits for the actor to take its slots
    loop.close()
    assert loop._process.exitcode == 0


def test_each_step_names_the_weights_that_chose_it(pair):
    """Greedy acting, weights changed mid-run: every step's actions are the argmax of its version's Q values,
    the versions never go back, and the new weights take over within the steps the child may run ahead."""
    loop, _ = pair
    ahead = Ahead(loop, StepProfile(), seed=5)
    policy, other = policies(loop, seed=5)
    weights = {0: policy.policy_state_dict(), 1: {k: v + 0.5 * torch.randn_like(v)
                                                  for k, v in other.policy_state_dict().items()}}
    judge, _ = policies(loop, seed=5)
    ahead.reset(3)
    versions = []
    for i in range(15 + AHEAD + 10):
        if i == 15:
            policy.load_policy_state_dict(weights[1])
        step = ahead.step(policy, 0.0, 0 if i < 15 else 1)
        judge.load_policy_state_dict(weights[step.version])
        assert np.array_equal(step.actions, judge.act(step.obs, 0.0)), f"step {i}, version {step.version}"
        versions.append(step.version)
    assert versions == sorted(versions) and versions[:15] == [0] * 15
    assert versions[15 + AHEAD:] == [1] * 10


def loop_children(actor_pid: int) -> dict[int, str] | None:
    """The actor's spawned loop process (pid: start time), once it runs; else None."""
    children = {pid: start_time(pid) for pid in process_children(actor_pid)}
    children = {pid: started for pid, started in children.items() if started is not None}
    return children or None


def test_an_actor_with_the_loop_ahead_streams_and_leaves_no_process_behind():
    learner, port = start_learner("--env", "CartPole-v1", *NOT_TRAINING, "--dqn-hidden-sizes", "32,32")
    actor = None
    try:
        actor = start_actor(port, "ahead-dqn", "--env", "CartPole-v1", "--vector-mode", "ahead", "--num-envs", "8")
        children = wait_until(lambda: loop_children(actor.pid), 120, "the actor's loop process")
        seen = wait_until(lambda: status_if(port, lambda s: s.env_steps >= 2000 and s.inserted > 0), 120,
                          "2000 env steps and stored batches at the learner")
        mine = {a.actor_id: a for a in seen.actors}["ahead-dqn"]
        assert mine.inserted > 0 and mine.transitions > 0 and seen.updates == 0
        assert actor.poll() is None, "the actor exited early"
        code, = stop(actor)
        assert code == 0
        wait_until(lambda: all(start_time(pid) != started for pid, started in children.items()), 60,
                   "the actor's loop process to exit")
    finally:
        codes = stop(*(p for p in (actor, learner) if p is not None))
    assert codes[-1] == 0


def test_a_recurrent_policy_is_refused_with_the_reason():
    learner, port = start_learner("--env", "CartPole-v1", *NOT_TRAINING, "--algorithm", "r2d2")
    try:
        actor = start_actor(port, "ahead-r2d2", "--vector-mode", "ahead", stderr=subprocess.PIPE)
        _, err = actor.communicate(timeout=120)
        assert actor.returncode == 2
        assert "vector mode ahead needs a policy without memory" in err.decode()
        assert status(port).inserted == 0
    finally:
        stop(learner)


@pytest.mark.parametrize("args, words", [
    (["--vector-mode", "bogus"], ["vector mode must be one of auto, sync, async, workers, ahead", "'bogus'"]),
    (["--env", "NoSuchEnv-v0"], ["cannot make environment 'NoSuchEnv-v0'"]),
])
def test_an_actor_that_cannot_be_built_says_why_in_one_line_and_exits_2(args, words):
    done = run_command([sys.executable, "-m", "actorlearner", "actor", "--learner", "127.0.0.1:1", *args], timeout=120,
                       env=CHILD_ENV)
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1 and all(word in errors[0] for word in words), done.stderr
    assert "Traceback" not in done.stderr
