"""How an actor's policy and its vector env take turns: in lockstep, or pipelined over two worker halves.

A stepper keeps the observations the next actions are chosen on and returns each vector step
whole: the actions, what acting computed (`Policy.act_values`), the env's results and the version
of the weights that chose the actions. (`actorlearner.actor.ahead` has a third: the env loop in a
process of its own.) With
``--vector-mode workers`` (two worker processes, `PairedWorkerEnvs`) and a policy without
memory, one half's envs step while the policy acts on the other half's: the env's time and the
policy's overlap. A step's actions were then chosen at the previous call, with the weights the
actor ran then.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from actorlearner.actor.profile import StepProfile
from actorlearner.algorithms import Policy
from actorlearner.envs.workers import concatenate, tree_map


class VectorStep(NamedTuple):
    """One step of every env, and the actions and acting that made it."""

    obs: Any  # what the actions were chosen on
    actions: np.ndarray
    acted: Any  # what acting computed besides the actions (None: nothing)
    next_obs: Any
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    version: int  # of the policy that chose the actions


class Lockstep:
    """Act on every env's observation, then step them all."""

    def __init__(self, envs: gym.vector.VectorEnv, profile: StepProfile):
        self.envs, self.profile = envs, profile
        self.obs = None  # None until reset

    @property
    def in_flight(self) -> bool:
        """Whether actions chosen earlier are being stepped now."""
        return False

    def reset(self, seed: int) -> Any:
        """Reset the envs (env i seeded ``seed + i``); their observations."""
        self.obs, _ = self.envs.reset(seed=seed)
        return self.obs

    def step(self, policy: Policy, exploration: Any, version: int) -> VectorStep:
        """The next vector step, its actions chosen by ``policy`` (weights ``version``) now or at the call before."""
        actions, acted = policy.act_values(self.obs, exploration)
        self.profile.mark("act")
        next_obs, rewards, terminated, truncated, _ = self.envs.step(actions)
        self.profile.mark("env")
        obs, self.obs = self.obs, next_obs
        return VectorStep(obs, actions, acted, next_obs, rewards, terminated, truncated, version)

    def restart(self) -> None:
        """Forget the envs' state: the next call must be :meth:`reset`."""
        self.obs = None


class Pipelined(Lockstep):
    """Two worker halves: while one steps, the policy acts on the other's newest observations.

    A policy with memory (recurrent state per env) acts on all envs at once, so both halves
    step side by side but not beside acting.
    """

    def __init__(self, envs, profile: StepProfile):
        super().__init__(envs, profile)
        self.halves = envs.halves
        self._in_flight: list[tuple[np.ndarray, Any]] | None = None  # per half: (actions, acted) stepping now
        self._in_flight_version = -1  # of the weights that chose them

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    def reset(self, seed: int) -> Any:
        self._in_flight = None
        return super().reset(seed)

    def step(self, policy: Policy, exploration: Any, version: int) -> VectorStep:
        if policy.recurrent:  # one forward pass over every env
            return super().step(policy, exploration, version)
        if self._in_flight is None:
            self._in_flight = [self._act_and_start(half, obs, policy, exploration)
                               for half, obs in zip(self.halves, self._split(self.obs))]
            self._in_flight_version = version
        results, started = [], []
        for half in self.halves:
            results.append(half.wait())
            self.profile.mark("env")
            started.append(self._act_and_start(half, results[-1][0], policy, exploration))
        (actions, acted), self._in_flight = self._joined(self._in_flight), started
        acted_version, self._in_flight_version = self._in_flight_version, version
        next_obs = concatenate([r[0] for r in results])
        obs, self.obs = self.obs, next_obs
        rewards, terminated, truncated = (np.concatenate([r[i] for r in results]) for i in (1, 2, 3))
        return VectorStep(obs, actions, acted, next_obs, rewards, terminated, truncated, acted_version)

    def restart(self) -> None:
        """Collect the steps under way and drop them with the envs' state: the next call must be :meth:`reset`."""
        if self._in_flight is not None:
            for half in self.halves:
                half.wait()
        self._in_flight = None
        super().restart()

    def _act_and_start(self, half, obs: Any, policy: Policy, exploration: Any) -> tuple[np.ndarray, Any]:
        actions, acted = policy.act_values(obs, exploration)
        half.step_async(actions)
        self.profile.mark("act")
        return actions, acted

    def _split(self, obs: Any) -> list[Any]:
        middle = self.halves[0].num_envs
        return [tree_map(lambda a: a[:middle], obs), tree_map(lambda a: a[middle:], obs)]

    @staticmethod
    def _joined(parts: list[tuple[np.ndarray, Any]]) -> tuple[np.ndarray, Any]:
        actions = concatenate([p[0] for p in parts])
        acted = None if parts[0][1] is None else concatenate([p[1] for p in parts])
        return actions, acted


def stepper(envs: gym.vector.VectorEnv, profile: StepProfile) -> Lockstep:
    """The stepper for ``envs``: pipelined for worker halves, lockstep otherwise."""
    return Pipelined(envs, profile) if hasattr(envs, "halves") else Lockstep(envs, profile)
