"""Environments from one kind of name, used by actors, the learner, its evaluator and the env server.

A name is one of:
  - a registered gymnasium id: ``CartPole-v1``;
  - ``package.module:function``: a callable returning a ``gymnasium.Env`` or a multi-agent env
    (:mod:`actorlearner.envs.multiagent`);
  - ``grpc://host:port``: a remote env behind env.proto's ``Environment`` service, of either kind;
  - ``ALE/Game-v5``: an Atari game with the DQN preprocessing (:mod:`actorlearner.envs.atari`);
  - ``MinAtar/Game-v1``: a MinAtar game (the optional ``minatar`` package).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import threading
import warnings
from collections.abc import Callable

import gymnasium as gym
from gymnasium.vector import async_vector_env

from actorlearner.envs.atari import is_atari, make_atari
from actorlearner.envs.multiagent import MultiAgentEnv, check_agents, is_multi_agent
from actorlearner.envs.remote import SCHEME, RemoteEnv, connect
from actorlearner.envs.workers import PairedWorkerEnvs
from actorlearner.lifeline import end_with_parent
from actorlearner.transport import SecurityConfig


def make_env(name: str, security: SecurityConfig | None = None, render_mode: str | None = None,
             frame_stack: int = 0, training: bool = False) -> gym.Env | MultiAgentEnv:
    """One environment named ``name``, a gymnasium env or a multi-agent env; ValueError with the
    reason when it cannot be made.

    ``frame_stack`` K >= 2 stacks each observation with the K - 1 before it (gymnasium's
    FrameStackObservation; at an episode's start the stack repeats the first frame): the
    observation becomes ``(K, *frame)``. Actors then send each frame once and the replay keeps
    it once (:mod:`actorlearner.frames`).

    ``security`` is the token and TLS material for a ``grpc://`` env server (whose spec says
    which kind it serves). ``render_mode`` (``"rgb_array"``, say) is passed to a registered env
    and to a factory that takes it; an env that does not list it in ``metadata["render_modes"]``
    (remote envs list none) is a ValueError, and so is any multi-agent env.

    ``training`` makes the env an actor trains on: an Atari game's then clips rewards (and may
    end episodes at lost lives); evaluation's envs give raw scores.
    """
    env = _make_env(name, security, render_mode, training)
    return stack_frames(name, env, frame_stack) if frame_stack else env


def stack_frames(name: str, env: gym.Env | MultiAgentEnv, frame_stack: int) -> gym.Env:
    """``env`` whose observations stack the last ``frame_stack`` frames; ValueError (env closed) when it cannot."""
    try:
        if frame_stack < 2:
            raise ValueError(f"frame_stack must be 0 (off) or at least 2, got {frame_stack}")
        if is_multi_agent(env) or not isinstance(env.observation_space, gym.spaces.Box):
            raise ValueError(f"cannot stack the frames of {name}: frame stacking needs a Box observation, "
                             f"it has {env.observation_space if not is_multi_agent(env) else 'several agents'}")
    except BaseException:
        env.close()
        raise
    return gym.wrappers.FrameStackObservation(env, frame_stack, padding_type="reset")


def _make_env(name: str, security: SecurityConfig | None, render_mode: str | None,
              training: bool) -> gym.Env | MultiAgentEnv:
    if is_atari(name):
        return _with_render_mode(name, make_atari(name, render_mode, training), render_mode)
    if name.startswith(SCHEME):
        if render_mode is not None:
            _check_render_mode(name, RemoteEnv.metadata, render_mode)
        return connect(name, security)
    if ":" in name:
        factory = _factory(name)
        if factory is not None:
            passed = render_mode is not None and _takes_render_mode(factory)
            env = factory(render_mode=render_mode) if passed else factory()
            if is_multi_agent(env):
                return _checked_multi_agent(name, env, render_mode)
            if not isinstance(env, gym.Env):
                raise ValueError(f"{name} returned a {type(env).__name__}, not a gymnasium.Env or a multi-agent env")
            return _with_render_mode(name, env, render_mode)
    if name.startswith(MINATAR):
        _register_minatar(name)
    try:
        with warnings.catch_warnings():  # an unlisted render mode: the ValueError below says it
            warnings.filterwarnings("ignore", message=".*not in the possible render_modes")
            env = gym.make(name) if render_mode is None else gym.make(name, render_mode=render_mode)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make environment {name!r}: {exc}") from None
    return _with_render_mode(name, env, render_mode)


MINATAR = "MinAtar/"
"""Gymnasium ids of MinAtar games (``MinAtar/Breakout-v1``), registered on first use when the
``minatar`` package is installed."""


def _register_minatar(name: str) -> None:
    """Register MinAtar's gymnasium ids (the package registers them only when asked); ValueError without it."""
    if name in gym.registry:
        return
    try:
        import minatar.gym
    except ImportError:
        raise ValueError(f"cannot make environment {name!r}: MinAtar is not installed (pip install minatar)") from None
    minatar.gym.register_envs()


VECTOR_MODES = ("sync", "async", "workers")
"""How a vector env steps: in this process, a process per env (gymnasium's), or two worker processes
each stepping half the envs (:mod:`actorlearner.envs.workers`)."""


def make_vector_env(name: str, num_envs: int, mode: str = "sync", security: SecurityConfig | None = None,
                    wrap: Callable[[gym.Env | MultiAgentEnv], gym.Env] | None = None,
                    frame_stack: int = 0, interrupt: threading.Event | None = None) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``name`` stepped together (``mode``: one of `VECTOR_MODES`), frames stacked as
    :func:`make_env` says; the processes of the async and workers modes end with this one, however it ends,
    and workers stop waiting once ``interrupt`` is set.

    ``wrap``, when given, is applied to every env made and returns the gymnasium.Env to step
    (it turns a multi-agent env into one; in async mode it must be picklable). A multi-agent
    env without ``wrap`` is a ValueError: it trains only by self-play.
    """
    if mode not in VECTOR_MODES:
        raise ValueError(f"vector mode must be one of {', '.join(VECTOR_MODES)}, got {mode!r}")
    factories = env_factories(name, num_envs, security, wrap, frame_stack)
    if mode == "workers":
        return PairedWorkerEnvs(factories, interrupt)
    if mode == "sync":
        return gym.vector.SyncVectorEnv(factories)
    return gym.vector.AsyncVectorEnv(factories, worker=functools.partial(_async_worker, os.getpid()))


def _async_worker(parent_pid: int, *args) -> None:
    """Gymnasium's async worker, in a process that ends with its parent."""
    end_with_parent(parent_pid)
    async_vector_env._async_worker(*args)


def env_factories(name: str, num_envs: int, security: SecurityConfig | None = None,
                  wrap: Callable[[gym.Env | MultiAgentEnv], gym.Env] | None = None,
                  frame_stack: int = 0) -> list[Callable[[], gym.Env]]:
    """The ``num_envs`` picklable factories `make_vector_env` steps, after making one env here: a name that
    cannot be made fails early, in this process, with the clear error."""
    _make_wrapped(name, security, wrap, frame_stack).close()
    return [functools.partial(_make_wrapped, name, security, wrap, frame_stack)] * num_envs


def _make_wrapped(name: str, security: SecurityConfig | None, wrap, frame_stack: int = 0) -> gym.Env:
    """``make_env(name)`` for training, passed through ``wrap``, frames stacked; the env is closed if that fails."""
    env = make_env(name, security, training=True)
    try:
        if wrap is not None:
            return wrap(env)
        if frame_stack:
            return stack_frames(name, env, frame_stack)
        if is_multi_agent(env):
            raise ValueError(f"{name} is a multi-agent env (agents {', '.join(map(repr, env.possible_agents))}): "
                             "a multi-agent env trains by self-play, one seat at a time (wrap it in a SeatEnv)")
    except BaseException:
        env.close()
        raise
    return env


def _checked_multi_agent(name: str, env: MultiAgentEnv, render_mode: str | None) -> MultiAgentEnv:
    """``env`` if it is a well-formed multi-agent env and no render mode was asked for; else closed, ValueError."""
    try:
        check_agents(env)
    except ValueError as exc:
        env.close()
        raise ValueError(f"cannot make environment {name!r}: {exc}") from None
    if render_mode is not None:
        env.close()
        raise ValueError(f"{name} cannot render {render_mode!r}: it is a multi-agent env, which is not rendered")
    return env


def _factory(name: str):
    """The callable a ``module:function`` name points at; None when the module has no such attribute."""
    module_name, _, attribute = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot make environment {name!r}: cannot import {module_name}: {exc}") from None
    factory = getattr(module, attribute, None)
    if factory is not None and not callable(factory):
        raise ValueError(f"cannot make environment {name!r}: {attribute} is not callable")
    return factory  # None: gymnasium's own "module:EnvId" form, handled by gym.make


def _takes_render_mode(factory) -> bool:
    """Whether ``factory`` has a ``render_mode`` parameter or takes any keyword."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins)
        return False
    return any(p.name == "render_mode" or p.kind is p.VAR_KEYWORD for p in parameters)


def _render_modes(metadata: dict) -> str:
    return ", ".join(map(repr, metadata.get("render_modes") or [])) or "none"


def _check_render_mode(name: str, metadata: dict, render_mode: str) -> None:
    """ValueError naming the env and its render modes unless ``render_mode`` is one of them."""
    if render_mode not in (metadata.get("render_modes") or []):
        raise ValueError(f"{name} cannot render {render_mode!r}: its render modes are {_render_modes(metadata)}")


def _with_render_mode(name: str, env: gym.Env, render_mode: str | None) -> gym.Env:
    """``env`` if it renders ``render_mode`` (or none was asked for); else it is closed, and a ValueError."""
    if render_mode is None:
        return env
    try:
        _check_render_mode(name, env.metadata, render_mode)
        if env.render_mode != render_mode:  # a factory that takes no render_mode, or drops it
            raise ValueError(f"{name} was made with render_mode={env.render_mode!r}, not {render_mode!r} "
                             f"(its render modes are {_render_modes(env.metadata)}): "
                             "a factory must take render_mode and pass it on")
    except ValueError:
        env.close()
        raise
    return env
