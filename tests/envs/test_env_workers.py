"""``--vector-mode workers``: PairedWorkerEnvs (two spawned worker processes, shared memory) steps exactly as
gymnasium's SyncVectorEnv does; errors in a worker reach the parent with the worker's traceback; the
Pipelined stepper changes only when actions are chosen, never the env dynamics; and actors with worker
envs stream end to end (DQN pipelined, R2D2 acting on all envs at once) and leave no worker behind."""

from __future__ import annotations

import multiprocessing as mp
import threading
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from actorlearner.actor.profile import StepProfile
from actorlearner.envs import make_vector_env
from actorlearner.envs.factory import VECTOR_MODES
from actorlearner.envs.workers import PairedWorkerEnvs
from custom_envs import short_cartpole
from procs import (NOT_TRAINING, cmdline, loads_torch, process_children, start_actor, start_learner, start_time,
                   status_if, stop, wait_until)

if TYPE_CHECKING:
    from actorlearner.actor.stepping import VectorStep


# Spawned workers import this module by name: pytest puts its folder on sys.path, which they inherit. So the
# pipelined stepper and the algorithms, which import torch, are imported in the tests that use them: a worker
# that imports this module then starts without torch, in a fraction of the CPU.
def fails_in_a_worker() -> gym.Env:
    """A CartPole in the parent process (PairedWorkerEnvs probes the first factory there), an error in a worker."""
    if mp.parent_process() is not None:
        raise RuntimeError("this factory cannot make its env in a worker")
    return gym.make("CartPole-v1")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------- helpers

def random_actions(rng: np.random.Generator, space: gym.Space, n: int) -> np.ndarray:
    """``n`` uniformly random actions of ``space`` (Discrete or MultiDiscrete, with their starts)."""
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, n).astype(space.dtype)
    if isinstance(space, spaces.MultiDiscrete):
        return rng.integers(space.start, space.start + space.nvec, (n, *space.nvec.shape)).astype(space.dtype)
    raise TypeError(f"no random actions for {space}")


def assert_tree_equal(got, want, what: str) -> None:
    """Same structure (dict keys in order, tuples), dtypes, shapes and values."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and list(got) == list(want), f"{what}: keys {list(got)} != {list(want)}"
        for key in want:
            assert_tree_equal(got[key], want[key], f"{what}[{key!r}]")
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), what
        for i, (g, w) in enumerate(zip(got, want)):
            assert_tree_equal(g, w, f"{what}[{i}]")
    else:
        got, want = np.asarray(got), np.asarray(want)
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=what)


def wait_gone(envs: PairedWorkerEnvs) -> None:
    """Poll until every half's worker process has exited."""
    processes = [half._process for half in envs.halves]
    wait_until(lambda: not any(p.is_alive() for p in processes), 60, "the env workers to exit")


def close_within(envs, timeout: float = 60) -> None:
    """close() on a thread; fail (rather than hang the session) if it has not returned after ``timeout``."""
    failure = []

    def close():
        try:
            envs.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            failure.append(exc)
    thread = threading.Thread(target=close, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"close() did not return within {timeout}s"
    assert not failure, f"close() raised {failure[0]!r}"


# ---------------------------------------------------------------- 1. the same steps as SyncVectorEnv

STEPS = 320
RESEED_AT = 200  # both are reset with another seed here: the second half's envs are seeded seed + first half's size


@pytest.mark.parametrize("env, num_envs, ends", [
    ("custom_envs:short_cartpole", 5, {"terminated", "truncated"}),  # odd split: halves of 2 and 3
    ("custom_envs:dict_walk", 5, {"terminated", "truncated"}),  # Dict obs, MultiDiscrete actions; 30-step limit
], ids=["short-cartpole-5", "dict-walk-5"])
def test_paired_worker_envs_step_exactly_like_sync_vector_env(env, num_envs, ends):
    paired = make_vector_env(env, num_envs, "workers")
    sync = make_vector_env(env, num_envs, "sync")
    try:
        assert isinstance(paired, PairedWorkerEnvs) and isinstance(sync, gym.vector.SyncVectorEnv)
        assert [half.num_envs for half in paired.halves] == [num_envs // 2, num_envs - num_envs // 2]
        assert paired.num_envs == num_envs
        next_step = gym.vector.AutoresetMode.NEXT_STEP
        assert paired.metadata["autoreset_mode"] == sync.metadata["autoreset_mode"] == next_step
        assert paired.single_observation_space == sync.single_observation_space
        assert paired.single_action_space == sync.single_action_space
        assert paired.observation_space == sync.observation_space
        assert paired.action_space == sync.action_space

        obs, info = paired.reset(seed=3)
        want_obs, _ = sync.reset(seed=3)
        assert info == {}
        assert_tree_equal(obs, want_obs, "reset")
        assert paired.observation_space.contains(obs)
        rng = np.random.default_rng(0)
        seen = {"terminated": 0, "truncated": 0}
        for t in range(STEPS):
            if t == RESEED_AT:
                obs, _ = paired.reset(seed=11)
                want_obs, _ = sync.reset(seed=11)
                assert_tree_equal(obs, want_obs, f"reset at step {t}")
            actions = random_actions(rng, paired.single_action_space, num_envs)
            got = paired.step(actions)
            want = sync.step(actions)
            for i, name in enumerate(["obs", "rewards", "terminated", "truncated"]):
                assert_tree_equal(got[i], want[i], f"step {t} {name}")
            assert got[4] == {}
            seen["terminated"] += int(got[2].sum())
            seen["truncated"] += int((got[3] & ~got[2]).sum())
        # The run crossed the episode ends the case is about (next-step autoreset included).
        assert {name for name, count in seen.items() if count} == ends, seen
    finally:
        sync.close()
        paired.close()
    wait_gone(paired)


# ---------------------------------------------------------------- 2. errors and shutdown

def test_an_env_raising_in_a_worker_is_a_runtime_error_with_its_traceback_and_close_does_not_hang():
    envs = make_vector_env("custom_envs:failing", 4, "workers")  # FailingEnv raises on the action (1, 1)
    try:
        envs.reset(seed=0)
        fine = np.zeros((4, 2), np.int64)
        envs.step(fine)
        failing = fine.copy()
        failing[0] = (1, 1)  # the first half's worker fails; the second half's step is still under way
        with pytest.raises(RuntimeError, match="env worker failed") as failed:
            envs.step(failing)
        text = str(failed.value)
        assert "Traceback (most recent call last)" in text
        assert "diagonal moves are broken" in text and "custom_envs.py" in text and "in step" in text
    finally:
        close_within(envs)
    wait_gone(envs)


def test_a_factory_failing_in_the_worker_is_a_runtime_error_and_no_worker_is_left():
    """The factory works in the parent (the probe) and fails in the worker: construction raises the worker's
    traceback, and the halves already started are closed. (It also shows the workers import this module.)"""
    before = {p.pid for p in mp.active_children()}
    with pytest.raises(RuntimeError, match="cannot make its env in a worker") as failed:
        PairedWorkerEnvs([fails_in_a_worker] * 4)
    assert "Traceback (most recent call last)" in str(failed.value)
    assert "fails_in_a_worker" in str(failed.value)
    wait_until(lambda: {p.pid for p in mp.active_children()} <= before, 60, "no env worker left running")


def test_a_worker_that_died_between_steps_is_a_runtime_error_naming_its_exit_code():
    envs = make_vector_env("CartPole-v1", 4, "workers")
    try:
        envs.reset(seed=0)
        dead = envs.halves[1]._process
        dead.kill()  # as the OOM killer or a crash in an env's native code would
        dead.join(60)
        assert dead.exitcode == -9
        with pytest.raises(RuntimeError, match=r"env worker exited \(code -9\)"):
            envs.step(np.zeros(4, np.int64))
    finally:
        close_within(envs)
    wait_gone(envs)


def test_fewer_than_two_envs_is_a_value_error_and_starts_no_worker():
    assert "workers" in VECTOR_MODES
    before = {p.pid for p in mp.active_children()}
    with pytest.raises(ValueError, match="at least 2 envs"):
        make_vector_env("CartPole-v1", 1, "workers")
    with pytest.raises(ValueError, match="at least 2 envs"):
        PairedWorkerEnvs([short_cartpole])
    with pytest.raises(ValueError, match="at least 2 envs"):
        PairedWorkerEnvs([])
    assert {p.pid for p in mp.active_children()} <= before


# ---------------------------------------------------------------- 3. the pipelined stepper

PIPELINE_ENVS = 8
PIPELINE_STEPS = 150


def run_stepper(step, policy, exploration, steps: int) -> list[VectorStep]:
    """``steps`` calls, call i naming weights version i."""
    from actorlearner.actor.stepping import VectorStep
    out = [step.step(policy, exploration, version) for version in range(steps)]
    for i, vector_step in enumerate(out):
        assert isinstance(vector_step, VectorStep)
        if i + 1 < len(out):  # the observations the next actions were chosen on are this step's results
            assert_tree_equal(out[i + 1].obs, vector_step.next_obs, f"step {i + 1} obs")
    return out


def replay_on_sync(sync: gym.vector.VectorEnv, seed: int, steps: list[VectorStep], what: str) -> None:
    """The stepper's steps equal what SyncVectorEnv gives for the same seed and the same actions."""
    obs, _ = sync.reset(seed=seed)
    assert_tree_equal(steps[0].obs, obs, f"{what}: reset observations")
    for t, vector_step in enumerate(steps):
        next_obs, rewards, terminated, truncated, _ = sync.step(vector_step.actions)
        assert_tree_equal(vector_step.next_obs, next_obs, f"{what} step {t}: next_obs")
        assert_tree_equal(vector_step.rewards, rewards, f"{what} step {t}: rewards")
        assert_tree_equal(vector_step.terminated, terminated, f"{what} step {t}: terminated")
        assert_tree_equal(vector_step.truncated, truncated, f"{what} step {t}: truncated")


def test_pipelined_steps_are_the_sync_env_dynamics_with_the_actions_it_chose():
    from actorlearner.actor.stepping import Lockstep, Pipelined, stepper
    from actorlearner.algorithms import make_spec

    envs = make_vector_env("CartPole-v1", PIPELINE_ENVS, "workers")
    sync = make_vector_env("CartPole-v1", PIPELINE_ENVS, "sync")
    try:
        obs_space, act_space = envs.single_observation_space, envs.single_action_space
        spec = make_spec("dqn", obs_space, act_space, {"hidden_sizes": [32, 32]})
        policy = spec.make_policy(seed=0)
        step = stepper(envs, StepProfile())
        assert type(step) is Pipelined and not step.in_flight and step.obs is None
        assert type(stepper(sync, StepProfile())) is Lockstep

        # Greedy: every action is the argmax of the Q values acting returned, and those are the policy's Q
        # values of the step's own observations (each half's actions were chosen on that half's newest ones).
        reset_obs = step.reset(0)
        greedy = run_stepper(step, policy, 0.0, PIPELINE_STEPS)
        assert step.in_flight
        assert [s.version for s in greedy] == [0, *range(PIPELINE_STEPS - 1)], "chosen at the call before"
        assert_tree_equal(greedy[0].obs, reset_obs, "first obs")
        for t, vector_step in enumerate(greedy):
            assert vector_step.actions.shape == (PIPELINE_ENVS,) and envs.action_space.contains(vector_step.actions)
            assert vector_step.acted.shape == (PIPELINE_ENVS, 1, 2)
            _, q = policy.act_values(vector_step.obs, 0.0)
            np.testing.assert_allclose(vector_step.acted, q, rtol=1e-5, atol=1e-6, err_msg=f"step {t}")
            np.testing.assert_array_equal(vector_step.actions, vector_step.acted[:, 0].argmax(-1), err_msg=f"step {t}")

        # restart() collects the steps under way and drops them: a reset starts from the seed alone.
        step.restart()
        assert not step.in_flight and step.obs is None
        step.reset(1)
        exploring = run_stepper(step, policy, 0.5, PIPELINE_STEPS)
        assert step.in_flight
        for t, vector_step in enumerate(exploring):
            assert envs.action_space.contains(vector_step.actions), f"step {t}"
        assert len({int(a) for s in exploring for a in s.actions}) == 2

        replay_on_sync(sync, 0, greedy, "greedy")
        replay_on_sync(sync, 1, exploring, "exploring")
        ends = np.sum([s.terminated | s.truncated for s in greedy + exploring], axis=0)
        half = PIPELINE_ENVS // 2
        assert ends[:half].sum() > 0 and ends[half:].sum() > 0, ends  # autoresets in both halves, mid-pipeline

        # A recurrent policy acts on all envs at once (one memory row per env), nothing in flight between calls.
        step.restart()
        r2d2 = make_spec("r2d2", obs_space, act_space, {"hidden_sizes": [16], "core_size": 16}).make_policy(seed=0)
        step.reset(2)
        recurrent = []
        for _ in range(60):
            recurrent.append(step.step(r2d2, 0.5, 0))
            assert not step.in_flight
            assert all(len(v) == PIPELINE_ENVS for v in r2d2.memory.state.values())
        for i in range(len(recurrent) - 1):
            assert_tree_equal(recurrent[i + 1].obs, recurrent[i].next_obs, f"recurrent step {i + 1}")
        replay_on_sync(sync, 2, recurrent, "recurrent")
    finally:
        sync.close()
        envs.close()
    wait_gone(envs)


# ---------------------------------------------------------------- 4. end to end

def env_workers(actor_pid: int) -> dict[int, str] | None:
    """The actor's two spawned env workers (pid: start time), once both run; else None."""
    workers = {pid: start_time(pid) for pid in process_children(actor_pid) if "spawn_main" in cmdline(pid)}
    workers = {pid: started for pid, started in workers.items() if started is not None}
    return workers if len(workers) == 2 else None




def test_a_dqn_actor_with_worker_envs_streams_and_leaves_no_worker_behind():
    learner, port = start_learner("--env", "CartPole-v1", *NOT_TRAINING, "--dqn-hidden-sizes", "32,32")
    actor = None
    try:
        actor = start_actor(port, "workers-dqn", "--env", "CartPole-v1", "--vector-mode", "workers",
                            "--num-envs", "8")
        workers = wait_until(lambda: env_workers(actor.pid), 120, "the actor's two env workers")
        seen = wait_until(lambda: status_if(port, lambda s: s.env_steps >= 2000 and s.inserted > 0), 120,
                          "2000 env steps and stored batches at the learner")
        mine = {a.actor_id: a for a in seen.actors}["workers-dqn"]
        assert mine.inserted > 0 and mine.transitions > 0 and seen.buffer_size > 0 and seen.updates == 0
        assert actor.poll() is None, "the actor exited early"
        assert env_workers(actor.pid) == workers  # the same two workers all along
        assert not any(loads_torch(pid) for pid in workers), "env workers need no torch"
        code, = stop(actor)
        assert code == 0
        wait_until(lambda: all(start_time(pid) != started for pid, started in workers.items()), 60,
                   "the actor's env workers to exit")
    finally:
        codes = stop(*(p for p in (actor, learner) if p is not None))
    assert codes[-1] == 0
