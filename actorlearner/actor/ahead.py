"""The env loop in a process of its own, running ahead (``--vector-mode ahead``; what ``auto``, the default,
picks for a policy without memory).

A child process holds the vector env and a copy of the actor's policy: it acts and steps, as a
one-process loop does, and hands each vector step to the actor, up to `AHEAD` steps before the
actor takes them. The actor's process keeps the rest (the learner link, sessions, assembly,
encoding, the stream) and tells the child of every new network, weights, tuning and exploration
it applies; a step records the policy version that chose its actions. So on two cores acting and
stepping get one core to themselves, and the actor's own work runs beside them.

A restart (a new network while steps are under way) begins a new epoch: the child's steps of
earlier epochs are dropped, and it acts again only once told to after the next reset. A policy
with memory cannot act here (its recurrent state belongs to the actor's assembler).
"""

from __future__ import annotations

import collections
import ctypes
import multiprocessing as mp
import signal
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from actorlearner.actor.profile import StepProfile
from actorlearner.actor.stepping import VectorStep
from actorlearner.algorithms import Policy
from actorlearner.envs.workers import SharedSteps, copy_into, probe, tree_map

AHEAD_MODE = "ahead"
"""The ``--vector-mode`` that runs the env loop in a process of its own."""

AHEAD = 32
"""Vector steps the child may take before the actor has taken them."""

HANDOFF = 16
"""Vector steps announced per message: each wakes the actor's process, which costs about what a step
of a few light envs does."""


class Mailbox:
    """Messages from the loop process to the actor's: a pipe, and a semaphore counting what it holds.

    The actor waits on the semaphore, never on the pipe: a pipe write wakes its reader as a "sync"
    wake-up, which Linux serves on the writer's core, so the actor's process preempted the loop
    process on its core (about 250 us per message, measured on two cores) instead of running on
    the idle one.
    """

    def __init__(self, ctx):
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self._count = ctx.Semaphore(0)

    def post(self, message: tuple) -> None:
        """Send ``message`` (in the loop process)."""
        self._writer.send(message)
        self._count.release()

    def take(self, timeout: float) -> tuple | None:
        """The next message; None if none came within ``timeout`` seconds."""
        return self._reader.recv() if self._count.acquire(timeout=timeout) else None

    def close(self, writer_only: bool = False) -> None:
        self._writer.close()
        if not writer_only:
            self._reader.close()


def _run_loop(env_fns: list[Callable[[], gym.Env]], slots: list[SharedSteps], torch_threads: int,
              control, commands, steps: Mailbox, credits) -> None:
    """The loop process: apply the actor's commands between steps; while running, act, step and hand
    each step over in the next slot (a credit says the actor has read it out).

    Commands are read between steps, so they apply at once; ``commands`` counts those sent (a
    shared integer: reading it costs less than polling the pipe). The actor's process raises it after
    writing the command, so this process may have read more than it says: only a count above ``read``
    promises one waiting in the pipe. What this sends back never blocks on the actor sending a
    command: steps are announced in small messages, at most ``AHEAD / HANDOFF`` unread, and a reset's
    observations (large for images) go out while the actor waits for them.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the actor's process decides when this one ends
    torch.set_num_threads(torch_threads)
    views = [slot.views() for slot in slots]
    envs = None
    try:
        envs = gym.vector.SyncVectorEnv(env_fns, copy=False)
        steps.post(("ready", None, None))
        policy, version, exploration, epoch, obs, running, taken, read = None, -1, 0.0, 0, None, False, 0, 0
        versions, acted_list = [], []  # of the steps in slots not yet announced
        while True:
            while not running or commands.value > read:
                if versions:  # before any command: the actor takes every slot in order
                    steps.post(("steps", epoch, _announcement(versions, acted_list)))
                    versions, acted_list = [], []
                command, data = control.recv()
                read += 1
                if command == "network":
                    spec, seed = data
                    policy = spec.make_policy(device="cpu", seed=seed)
                elif command == "weights":
                    version, state = data
                    policy.load_policy_state_dict(state)
                elif command == "retune":
                    policy.retune(data)
                elif command == "exploration":
                    exploration = data
                elif command == "reset":
                    seed, epoch = data
                    obs, _ = envs.reset(seed=seed)
                    running = False
                    steps.post(("reset", epoch, obs))
                elif command == "run":
                    running = True
                else:  # close
                    return
            if not credits.acquire(False):  # the actor is behind: wait for a slot, minding commands
                if not credits.acquire(timeout=0.05):
                    continue
                if commands.value > read:  # a command came meanwhile: it applies to this step
                    credits.release()
                    continue
            actions, acted = policy.act_values(obs, exploration)
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            slot_obs, slot_actions, slot_rewards, slot_flags = views[taken % len(views)]
            copy_into(slot_obs, obs)
            copy_into(slot_actions, actions)
            slot_rewards[:], slot_flags[0], slot_flags[1] = rewards, terminated, truncated
            versions.append(version)
            acted_list.append(acted)
            if len(versions) == HANDOFF:
                steps.post(("steps", epoch, _announcement(versions, acted_list)))
                versions, acted_list = [], []
            taken += 1
    except (BrokenPipeError, EOFError):  # the actor's process is gone
        pass
    except Exception:  # the actor raises it with this traceback
        steps.post(("error", None, traceback.format_exc()))
    finally:
        if envs is not None:
            envs.close()


def _announcement(versions: list[int], acted: list[Any]) -> tuple[list[int], Any]:
    """Steps' versions, and what acting computed for them stacked (one array pickles in a fraction of
    the time of several)."""
    return versions, None if acted[0] is None else tree_map(lambda *arrays: np.stack(arrays), *acted)


class LoopProcess:
    """The child process stepping a sync vector env of ``env_fns`` (picklable: start method ``spawn``).

    It stands in for the vector env where the actor reads one: spaces, ``num_envs``, ``metadata``.
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]], torch_threads: int = 1):
        self.single_observation_space, self.single_action_space, self.metadata = probe(env_fns[0])
        self.num_envs = len(env_fns)
        ctx = mp.get_context("spawn")
        self._slots = [SharedSteps(ctx, self.single_observation_space, self.single_action_space, self.num_envs)
                       for _ in range(AHEAD)]
        self._views = [slot.views() for slot in self._slots]
        self._taken = 0  # steps copied out of their slots
        self._announced: collections.deque[tuple[int, Any]] = collections.deque()  # (epoch, (version, acted))
        self._control, control = ctx.Pipe()
        self._commands = ctx.RawValue(ctypes.c_int64, 0)  # sent; only this process writes it
        self._steps = Mailbox(ctx)
        self._credits = ctx.Semaphore(AHEAD)
        self._process = ctx.Process(target=_run_loop, daemon=True, name="env-loop", args=(
            env_fns, self._slots, torch_threads, control, self._commands, self._steps, self._credits))
        self._process.start()
        control.close()
        self._steps.close(writer_only=True)
        try:
            self.receive("ready")
        except BaseException:
            self.close()
            raise

    def send(self, command: str, data: Any = None) -> None:
        try:
            self._control.send((command, data))
            self._commands.value += 1
        except OSError:
            raise RuntimeError(f"the env loop process exited (code {self._process.exitcode})") from None

    def receive(self, kind: str, epoch: int | None = None) -> Any:
        """The next message of ``kind`` (and ``epoch``); steps of other epochs are dropped. A step comes
        back as ``(version, acted, obs, actions, rewards, terminated, truncated)``, copied out of its slot."""
        while True:
            if not self._announced:
                got, got_epoch, data = self._next()
                if got == "error":
                    raise RuntimeError(f"the env loop process failed:\n{data}")
                if got != "steps":
                    if got == kind and (epoch is None or got_epoch == epoch):
                        return data
                    continue
                versions, acted = data
                for i, version in enumerate(versions):
                    step_acted = None if acted is None else tree_map(lambda array: array[i], acted)  # noqa: B023
                    self._announced.append((got_epoch, (version, step_acted)))
            got_epoch, (version, acted) = self._announced.popleft()
            obs, actions, rewards, flags = self._views[self._taken % AHEAD]
            step = (version, acted, tree_map(np.copy, obs), tree_map(np.copy, actions), rewards.copy(),
                    flags[0].copy(), flags[1].copy())
            self._taken += 1
            self._credits.release()
            if kind == "step" and (epoch is None or got_epoch == epoch):
                return step

    def _next(self) -> tuple[str, int | None, Any]:
        while (message := self._steps.take(timeout=1.0)) is None:
            if not self._process.is_alive():
                raise RuntimeError(f"the env loop process exited (code {self._process.exitcode})")
        return message

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self.send("close")  # counted: a running loop reads commands only when the count says so
            except RuntimeError:
                pass
            self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._control.close()
        self._steps.close()


class Ahead:
    """The stepper over a `LoopProcess`: each call takes the next vector step the child made, after
    telling it of what the actor changed since (network, weights, tuning, exploration)."""

    def __init__(self, loop: LoopProcess, profile: StepProfile, seed: int):
        self.loop, self.profile, self.seed = loop, profile, seed  # seed: the policy's, as the actor makes it
        self.obs = None  # None until reset
        self._epoch = 0
        self._running = False
        self._policy: Policy | None = None
        self._config = self._version = self._exploration = None

    @property
    def in_flight(self) -> bool:
        return self._running

    def reset(self, seed: int) -> Any:
        """Reset the envs (env i seeded ``seed + i``) in a new epoch; their observations."""
        self._epoch += 1
        self._running = False
        self.loop.send("reset", (seed, self._epoch))
        self.obs = self.loop.receive("reset", self._epoch)
        return self.obs

    def step(self, policy: Policy, exploration: Any, version: int) -> VectorStep:
        self._follow(policy, exploration, version)
        if not self._running:
            self.loop.send("run")
            self._running = True
        self.profile.mark("act")
        acted_version, acted, next_obs, actions, rewards, terminated, truncated = self.loop.receive("step", self._epoch)
        self.profile.mark("env")
        obs, self.obs = self.obs, next_obs
        return VectorStep(obs, actions, acted, next_obs, rewards, terminated, truncated, acted_version)

    def restart(self) -> None:
        """Drop the steps under way (their epoch ends) and the envs' state: the next call must be :meth:`reset`."""
        self._epoch += 1
        self._running = False
        self.obs = None

    def _follow(self, policy: Policy, exploration: Any, version: int) -> None:
        """Send the child what changed since the last step: a new network, tuning, weights, exploration."""
        if policy is not self._policy:
            if policy.recurrent:
                raise ValueError(f"vector mode {AHEAD_MODE} needs a policy without memory: use sync or workers")
            self.loop.send("network", (policy.spec, self.seed))
            self._policy, self._config, self._version = policy, policy.config, None
        if policy.config is not self._config:  # retune replaces the config
            self.loop.send("retune", policy.config)
            self._config = policy.config
        if version != self._version:
            self.loop.send("weights", (version, policy.policy_state_dict()))
            self._version = version
        if exploration is not self._exploration:  # the actor sets a new one per session
            self.loop.send("exploration", exploration)
            self._exploration = exploration
