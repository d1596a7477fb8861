"""The env loop process at the sizes users run: whatever one vector step's observations weigh (1 KB to 16 MB),
whatever the Q values a handoff carries and the weights a command carries (up to 100 MB), the actor's process
and the loop process never wait on each other: a reset, steps past every slot, new weights while the loop runs
ahead, and a close that the loop answers (exit 0), each within a bound.

On 5c6f918 a reset whose observations outgrew a pipe's buffer (113 KB: four envs of stacked 84x84 frames)
hung for good: the loop counted a message for the actor only once it was written whole, and the actor read
none before the count rose."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

from actorlearner.actor.ahead import Ahead, LoopProcess
from actorlearner.actor.profile import StepProfile
from actorlearner.algorithms import make_spec
from custom_envs import SizedObservation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KB, MB = 1024, 1024 * 1024
BOUND = 180.0
"""Seconds a case may take before it counts as a hang (each takes a few on a busy two-core machine)."""

# (envs, bytes per env's observation, discrete actions, hidden sizes): one vector step's observations from 1 KB
# to 16 MB, the Atari edge where 5c6f918 hung, Q values of 1 MB per handoff, weights of 100 MB.
CASES = {
    "1KB": (4, 256, 2, [16]),
    "atari-4x84x84x4-113KB": (4, 84 * 84 * 4, 6, [16]),
    "atari-16x84x84x4-452KB": (16, 84 * 84 * 4, 18, [16]),
    "1MB-q-values": (256, 16, 64, [16]),
    "16MB": (4, 4 * MB, 2, [1]),
    "weights-100MB": (2, 256, 2, [5000, 5000]),
}


def exercise(loop: LoopProcess, hidden: list[int]) -> dict:
    """Reset, step past every slot, load new weights mid-run and step on; what came back."""
    spec = make_spec("dqn", loop.single_observation_space, loop.single_action_space, {"hidden_sizes": hidden})
    policy = spec.make_policy(seed=1)
    ahead = Ahead(loop, StepProfile(), seed=1)
    first = ahead.reset(3)
    versions = []
    for i in range(60):
        if i == 20:  # while the loop runs ahead with version 0
            policy.load_policy_state_dict({k: v + 1.0 for k, v in policy.policy_state_dict().items()})
        step = ahead.step(policy, 0.1, 0 if i < 20 else 1)
        versions.append(step.version)
    return {"first": first, "last": step, "versions": versions}


@pytest.mark.parametrize("case", CASES)
def test_the_loop_and_the_actor_never_wait_on_each_other_whatever_the_sizes(case):
    envs, length, actions, hidden = CASES[case]
    loop = LoopProcess([functools.partial(SizedObservation, length, actions=actions)] * envs)
    outcome: dict = {}

    def drive():
        try:
            outcome.update(exercise(loop, hidden))
            loop.close()
        except BaseException as exc:  # reported by the test's thread
            outcome["error"] = exc

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    driver.join(BOUND)
    if driver.is_alive():
        loop._process.kill()
        pytest.fail(f"{case}: the actor's process and the loop process waited on each other (no answer in {BOUND:.0f} s)")
    if "error" in outcome:
        raise outcome["error"]
    assert loop._process.exitcode == 0, "the loop did not answer its close"
    assert outcome["first"].shape == (envs, length)
    assert outcome["last"].next_obs.shape == (envs, length) and outcome["last"].acted.shape == (envs, 1, actions)
    versions = outcome["versions"]
    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == 1
    assert np.any(outcome["last"].next_obs), "observations came back empty"
