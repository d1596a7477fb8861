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
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from actorlearner.actor.profile import StepProfile
from actorlearner.actor.stepping import VectorStep
from actorlearner.algorithms import Policy
from actorlearner.envs.workers import CLOSE_SECONDS, Interrupted, SharedSteps, copy_into, probe, tree_map
from actorlearner.lifeline import end_with_parent

AHEAD_MODE = "ahead"
"""The ``--vector-mode`` that runs the env loop in a process of its own."""

AHEAD = 32
"""Vector steps the child may take before the actor has taken them (fewer where they would outgrow
`SLOT_BYTES`)."""

SLOT_BYTES = 64 * 1024 * 1024
"""Shared memory the slots may take together, at least two steps' worth: 32 steps of 16 MB observations
would take half a GiB."""

HANDOFF = 16
"""Vector steps announced per message (at most half the slots): each wakes the actor's process, which
costs about what a step of a few light envs does."""


class Mailbox:
    """Messages from the loop process to the actor's: a pipe, and a semaphore counting the messages begun.

    The actor waits on the semaphore, never on the pipe: a pipe write wakes its reader as a "sync"
    wake-up, which Linux serves on the writer's core, so the actor's process preempted the loop
    process on its core (about 250 us per message, measured on two cores) instead of running on
    the idle one. The count rises before the message is written, so a message of any size flows
    while the actor reads it (one larger than the pipe's buffer, counted once written, waited for a
    reader that waited for the count).
    """

    def __init__(self, ctx):
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self._count = ctx.Semaphore(0)

    def post(self, message: tuple) -> None:
        """Send ``message`` (in the loop process)."""
        self._count.release()
        self._writer.send(message)

    def take(self, timeout: float) -> tuple | None:
        """The next message; None if none began within ``timeout`` seconds. EOFError once the loop is gone."""
        return self._reader.recv() if self._count.acquire(timeout=timeout) else None

    def close(self, writer_only: bool = False) -> None:
        self._writer.close()
        if not writer_only:
            self._reader.close()


class Inbox:
    """The actor's commands as the loop process sees them: a thread reads the pipe as they come, so the
    actor's writes (weights of any size) never wait on the loop's stepping or posting; the pipe's end (the
    actor closed it, or died) reads as a close.

    ``sent`` counts the commands the actor began to write (a shared integer it raises first): the loop
    sees one coming at its next step, not once this thread got the GIL and the whole message.
    """

    def __init__(self, connection, sent):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._sent, self._taken = sent, 0
        threading.Thread(target=self._read, args=(connection,), daemon=True, name="commands").start()

    def _read(self, connection) -> None:
        try:
            while True:
                self._queue.put(connection.recv())
        except (EOFError, OSError):
            self._queue.put(("close", None))

    def waiting(self) -> bool:
        return self._sent.value > self._taken or not self._queue.empty()

    def next(self) -> tuple[str, Any]:
        """The next command, waiting for it."""
        command = self._queue.get()
        self._taken += 1
        return command


def _run_loop(env_fns: list[Callable[[], gym.Env]], slots: list[SharedSteps], torch_threads: int,
              control, sent, steps: Mailbox, credits, parent_pid: int) -> None:
    """The loop process: apply the actor's commands between steps; while running, act, step and hand
    each step over in the next slot (a credit says the actor has read it out).

    Commands are taken between steps, so they apply at once. The steps made before one are announced
    before it applies (the actor takes every slot in order). Steps go out ``handoff`` at a time, at most
    half the slots: with every slot full, fewer than ``handoff`` are unannounced, so the actor always has
    one to take.
    """
    end_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the actor's process decides when this one ends
    torch.set_num_threads(torch_threads)
    commands = Inbox(control, sent)
    views = [slot.views() for slot in slots]
    handoff = min(HANDOFF, max(1, len(slots) // 2))
    envs = None
    try:
        envs = gym.vector.SyncVectorEnv(env_fns, copy=False)
        steps.post(("ready", None, None))
        policy, version, exploration, epoch, obs, running, taken = None, -1, 0.0, 0, None, False, 0
        versions, acted_list = [], []  # of the steps in slots not yet announced

        def announce():
            if versions:
                steps.post(("steps", epoch, _announcement(versions, acted_list)))
                versions.clear()
                acted_list.clear()

        while True:
            while not running or commands.waiting():
                command, data = commands.next()
                announce()
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
                if commands.waiting():  # a command came meanwhile: it applies to this step
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
            if len(versions) == handoff:
                announce()
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
    """The child process stepping a sync vector env of ``env_fns``; it ends with this process, however this
    one ends. It is forked where this process has no other thread (an actor command as it starts): it begins
    with the modules imported here, torch's among them, instead of importing them again. Elsewhere it is
    spawned (``env_fns`` picklable): a lock another thread held at a fork would stay held in the child.

    It stands in for the vector env where the actor reads one: spaces, ``num_envs``, ``metadata``. Once
    ``interrupt`` is set, waiting for the loop gives up (`Interrupted`) after a second without news.
    """

    def __init__(self, env_fns: list[Callable[[], gym.Env]], torch_threads: int = 1,
                 interrupt: threading.Event | None = None):
        self.single_observation_space, self.single_action_space, self.metadata = probe(env_fns[0])
        self.num_envs = len(env_fns)
        self._interrupt = interrupt or threading.Event()
        ctx = mp.get_context("fork" if threading.active_count() == 1 else "spawn")
        spaces = (self.single_observation_space, self.single_action_space, self.num_envs)
        first = SharedSteps(ctx, *spaces)
        self.slots = max(2, min(AHEAD, SLOT_BYTES // max(first.nbytes(), 1)))
        self._slots = [first, *(SharedSteps(ctx, *spaces) for _ in range(self.slots - 1))]
        self._views = [slot.views() for slot in self._slots]
        self._taken = 0  # steps copied out of their slots
        self._announced: collections.deque[tuple[int, Any]] = collections.deque()  # (epoch, (version, acted))
        self._control, control = ctx.Pipe()
        self._sent = ctx.RawValue(ctypes.c_int64, 0)  # commands begun; only this process writes it
        self._steps = Mailbox(ctx)
        self._credits = ctx.Semaphore(self.slots)
        self._process = ctx.Process(target=_run_loop, daemon=True, name="env-loop", args=(
            env_fns, self._slots, torch_threads, control, self._sent, self._steps, self._credits, os.getpid()))
        self._process.start()
        control.close()
        self._steps.close(writer_only=True)
        try:
            self.receive("ready")
        except BaseException:
            self.close()
            raise

    def send(self, command: str, data: Any = None) -> None:
        self._sent.value += 1
        try:
            self._control.send((command, data))
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
            obs, actions, rewards, flags = self._views[self._taken % self.slots]
            step = (version, acted, tree_map(np.copy, obs), tree_map(np.copy, actions), rewards.copy(),
                    flags[0].copy(), flags[1].copy())
            self._taken += 1
            self._credits.release()
            if kind == "step" and (epoch is None or got_epoch == epoch):
                return step

    def _next(self) -> tuple[str, int | None, Any]:
        try:
            while (message := self._steps.take(timeout=1.0)) is None:
                if not self._process.is_alive():
                    raise RuntimeError(f"the env loop process exited (code {self._process.exitcode})")
                if self._interrupt.is_set():
                    raise Interrupted("stopped while waiting for the env loop process")
        except EOFError:
            self._process.join(1)
            raise RuntimeError(f"the env loop process exited (code {self._process.exitcode})") from None
        return message

    def close(self) -> None:
        """Ask the loop to end, reading what it still posts meanwhile; kill it if it does not end within
        `CLOSE_SECONDS` (an env that stopped answering)."""
        deadline = time.monotonic() + CLOSE_SECONDS
        if self._process.is_alive():
            try:
                self.send("close")
            except RuntimeError:
                pass
            while self._process.is_alive() and time.monotonic() < deadline:
                try:
                    self._steps.take(timeout=0.05)
                except (EOFError, OSError):
                    self._process.join(max(0.0, deadline - time.monotonic()))
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
