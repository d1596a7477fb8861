"""Envs stepped in worker processes, observations and results in shared memory.

``WorkerEnvs`` steps k envs (a gymnasium ``SyncVectorEnv``, next-step autoreset) in one worker
process; ``step_async`` returns at once, so the caller can act on other envs meanwhile.
``PairedWorkerEnvs`` is a vector env of two such halves: stepped as one (``step``) it lets the two
workers run side by side, and the actor pipelines its halves (``actorlearner.actor.stepping``).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_shared_memory, read_from_shared_memory

from actorlearner.lifeline import end_with_parent

CLOSE_SECONDS = 5.0
"""How long a closing env process may take to answer before it is killed."""


class Interrupted(RuntimeError):
    """The owner stopped (its ``interrupt`` set) while it waited for an env process that did not answer."""

Tree = Any  # an observation or action batch: an array, or a dict or tuple of them (as the space nests)


def tree_map(fn: Callable[..., Any], *trees: Tree) -> Tree:
    """``fn`` applied leaf by leaf over batches of the same structure."""
    first = trees[0]
    if isinstance(first, dict):
        return {key: tree_map(fn, *(tree[key] for tree in trees)) for key in first}
    if isinstance(first, tuple):
        return tuple(tree_map(fn, *parts) for parts in zip(*trees))
    return fn(*trees)


def concatenate(batches: Sequence[Tree]) -> Tree:
    """Batches of the same structure joined along the env axis."""
    return tree_map(lambda *arrays: np.concatenate(arrays), *batches)


def copy_into(target: Tree, value: Tree) -> None:
    tree_map(lambda t, v: t.__setitem__(Ellipsis, v), target, value)


class SharedSteps:
    """One step of ``n`` envs' observations, actions, rewards and flags in shared memory, with array views
    (made before the processes that share it start: they inherit it)."""

    def __init__(self, ctx, observation_space: gym.Space, action_space: gym.Space, n: int):
        self.spaces, self.n = (observation_space, action_space), n
        self.obs_memory = create_shared_memory(observation_space, n, ctx)
        self.action_memory = create_shared_memory(action_space, n, ctx)
        self.rewards_memory = ctx.RawArray(ctypes.c_double, n)
        self.flags_memory = ctx.RawArray(ctypes.c_bool, 2 * n)  # terminated, then truncated

    def nbytes(self) -> int:
        """Bytes the step takes in shared memory."""
        obs, actions, rewards, flags = self.views()
        sizes: list[int] = []
        tree_map(lambda array: sizes.append(array.nbytes), (obs, actions))
        return sum(sizes) + rewards.nbytes + flags.nbytes

    def views(self) -> tuple[Tree, Tree, np.ndarray, np.ndarray]:
        """(observations, actions, rewards, flags [2, n]) as arrays over the shared memory."""
        observation_space, action_space = self.spaces
        return (read_from_shared_memory(observation_space, self.obs_memory, self.n),
                read_from_shared_memory(action_space, self.action_memory, self.n),
                np.frombuffer(self.rewards_memory, np.float64),
                np.frombuffer(self.flags_memory, np.bool_).reshape(2, self.n))


def _work(env_fns: list[Callable[[], gym.Env]], pipe, shared: SharedSteps, parent_pid: int) -> None:
    """A worker process: step its envs on each command, results into shared memory, then reply; it ends
    with its parent, however that ends."""
    end_with_parent(parent_pid)
    obs_view, action_view, rewards, flags = shared.views()
    envs = None
    try:
        envs = gym.vector.SyncVectorEnv(env_fns, copy=False)
        pipe.send(("ready", None))
        while True:
            command, data = pipe.recv()
            if command == "step":
                obs, rewards[:], flags[0], flags[1], _ = envs.step(tree_map(np.copy, action_view))
            elif command == "reset":
                obs, _ = envs.reset(seed=data)
                rewards[:], flags[:] = 0.0, False
            else:  # close
                break
            copy_into(obs_view, obs)
            pipe.send(("ok", None))
    except (KeyboardInterrupt, EOFError):
        pass
    except Exception:  # the parent raises it with this traceback
        pipe.send(("error", traceback.format_exc()))
    finally:
        if envs is not None:
            envs.close()


class WorkerEnvs:
    """``len(env_fns)`` envs stepped by one worker process (start method ``spawn``: the env factories
    must pickle); results come back through shared memory. Once ``interrupt`` is set, waiting for the
    worker gives up (`Interrupted`) after half a second without an answer."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]], observation_space: gym.Space, action_space: gym.Space,
                 interrupt: threading.Event | None = None):
        self._interrupt = interrupt or threading.Event()
        ctx = mp.get_context("spawn")
        self.num_envs = len(env_fns)
        self._shared = SharedSteps(ctx, observation_space, action_space, self.num_envs)
        self._obs, self._actions, self._rewards, self._flags = self._shared.views()
        self._pipe, child = ctx.Pipe()
        self._process = ctx.Process(target=_work, args=(env_fns, child, self._shared, os.getpid()), daemon=True,
                                    name="env-worker")
        self._process.start()
        child.close()
        self._waiting = False
        self._receive()

    def reset_async(self, seed: int | None) -> None:
        self._send("reset", seed)

    def step_async(self, actions: Tree) -> None:
        """Start a step of every env with ``actions``; :meth:`wait` collects it."""
        copy_into(self._actions, actions)
        self._send("step", None)

    def wait(self) -> tuple[Tree, np.ndarray, np.ndarray, np.ndarray]:
        """(observations, rewards, terminated, truncated) of the step or reset started last (copies)."""
        self._receive()
        return tree_map(np.copy, self._obs), self._rewards.copy(), self._flags[0].copy(), self._flags[1].copy()

    def close(self) -> None:
        """End the worker once the step under way is in; kill it if it does not answer within `CLOSE_SECONDS`
        (an env that stopped answering)."""
        if self._process.is_alive():
            try:
                if self._waiting and self._pipe.poll(CLOSE_SECONDS):
                    self._receive()
                if not self._waiting:
                    self._pipe.send(("close", None))
                    self._process.join(CLOSE_SECONDS)
            except (OSError, EOFError, RuntimeError):
                pass
        if self._process.is_alive():
            self._process.kill()
        self._process.join(5)
        self._pipe.close()

    def _send(self, command: str, data) -> None:
        if self._waiting:
            raise RuntimeError(f"{command} while a step or reset is under way: wait() for it first")
        try:
            self._pipe.send((command, data))
        except OSError:  # the worker is gone (killed between steps)
            self._process.join(1)
            raise RuntimeError(f"env worker exited (code {self._process.exitcode})") from None
        self._waiting = True

    def _receive(self) -> None:
        try:
            while not self._pipe.poll(0.5):
                if not self._process.is_alive():
                    raise EOFError
                if self._interrupt.is_set():
                    raise Interrupted("stopped while waiting for an env worker")
            status, detail = self._pipe.recv()
        except EOFError:
            raise RuntimeError(f"env worker exited (code {self._process.exitcode})") from None
        self._waiting = False
        if status == "error":
            raise RuntimeError(f"env worker failed:\n{detail}")


def probe(env_fn: Callable[[], gym.Env]) -> tuple[gym.Space, gym.Space, dict]:
    """One env's observation and action spaces, and the metadata of a next-step-autoreset vector env of it
    (the env is made here and closed)."""
    env = env_fn()
    try:
        return env.observation_space, env.action_space, dict(getattr(env, "metadata", {}),
                                                             autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    finally:
        env.close()


class PairedWorkerEnvs(gym.vector.VectorEnv):
    """A vector env of two :class:`WorkerEnvs` halves (next-step autoreset); ``halves`` for pipelining."""

    def __init__(self, env_fns: list[Callable[[], gym.Env]], interrupt: threading.Event | None = None):
        self.halves: list[WorkerEnvs] = []
        if len(env_fns) < 2:
            raise ValueError(f"vector mode workers needs at least 2 envs (one per worker), got {len(env_fns)}")
        self.single_observation_space, self.single_action_space, self.metadata = probe(env_fns[0])
        self.num_envs = len(env_fns)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        middle = self.num_envs // 2
        try:
            for part in (env_fns[:middle], env_fns[middle:]):
                self.halves.append(WorkerEnvs(part, self.single_observation_space, self.single_action_space,
                                              interrupt))
        except BaseException:
            self.close()
            raise

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Tree, dict]:
        """Reset every env; a seed ``s`` seeds env ``i`` with ``s + i``, as gymnasium's vector envs do."""
        offset = 0
        for half in self.halves:
            half.reset_async(None if seed is None else seed + offset)
            offset += half.num_envs
        return concatenate([r[0] for r in self._wait_all()]), {}

    def _wait_all(self) -> list[tuple[Tree, np.ndarray, np.ndarray, np.ndarray]]:
        """Every half's results; when one fails, the others are still collected before its error is raised."""
        results, failure = [], None
        for half in self.halves:
            try:
                results.append(half.wait())
            except RuntimeError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return results

    def step(self, actions: Tree) -> tuple[Tree, np.ndarray, np.ndarray, np.ndarray, dict]:
        start = 0
        for half in self.halves:
            half.step_async(tree_map(lambda a, lo=start, hi=start + half.num_envs: a[lo:hi], actions))
            start += half.num_envs
        results = self._wait_all()
        obs = concatenate([r[0] for r in results])
        return obs, *(np.concatenate([r[i] for r in results]) for i in (1, 2, 3)), {}

    def close_extras(self, **kwargs) -> None:
        for half in self.halves:
            half.close()
