"""Environments from one kind of name, used by actors, the learner, its evaluator and the env server.

A name is one of:
  - a registered gymnasium id: ``CartPole-v1``;
  - ``package.module:function``: a callable returning a ``gymnasium.Env``;
  - ``grpc://host:port``: a remote env behind env.proto's ``Environment`` service.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings

import gymnasium as gym

from actorlearner.envs.remote import SCHEME, RemoteEnv
from actorlearner.transport import SecurityConfig


def make_env(name: str, security: SecurityConfig | None = None, render_mode: str | None = None) -> gym.Env:
    """One environment named ``name``; ValueError with the reason when it cannot be made.

    ``security`` is the token and TLS material for a ``grpc://`` env server. ``render_mode``
    (``"rgb_array"``, say) is passed to a registered env and to a factory that takes it; an env
    that does not list it in ``metadata["render_modes"]`` (remote envs list none) is a ValueError.
    """
    if name.startswith(SCHEME):
        if render_mode is not None:
            _check_render_mode(name, RemoteEnv.metadata, render_mode)
        return RemoteEnv(name, security=security)
    if ":" in name:
        factory = _factory(name)
        if factory is not None:
            passed = render_mode is not None and _takes_render_mode(factory)
            env = factory(render_mode=render_mode) if passed else factory()
            if not isinstance(env, gym.Env):
                raise ValueError(f"{name} returned a {type(env).__name__}, not a gymnasium.Env")
            return _with_render_mode(name, env, render_mode)
    try:
        with warnings.catch_warnings():  # an unlisted render mode: the ValueError below says it
            warnings.filterwarnings("ignore", message=".*not in the possible render_modes")
            env = gym.make(name) if render_mode is None else gym.make(name, render_mode=render_mode)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make environment {name!r}: {exc}") from None
    return _with_render_mode(name, env, render_mode)


def make_vector_env(name: str, num_envs: int, mode: str = "sync",
                    security: SecurityConfig | None = None) -> gym.vector.VectorEnv:
    """``num_envs`` copies of ``name`` stepped together (``mode``: sync or async)."""
    if mode not in ("sync", "async"):
        raise ValueError(f"vector mode must be sync or async, got {mode!r}")
    make_env(name, security).close()  # fail early, in this process, with the clear error
    factories = [functools.partial(make_env, name, security)] * num_envs
    return gym.vector.SyncVectorEnv(factories) if mode == "sync" else gym.vector.AsyncVectorEnv(factories)


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
