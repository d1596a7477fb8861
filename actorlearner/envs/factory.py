"""Environments from one kind of name, used by actors, the learner, its evaluator and the env server.

A name is one of:
  - a registered gymnasium id: ``CartPole-v1``;
  - ``package.module:function``: a callable returning a ``gymnasium.Env``;
  - ``grpc://host:port``: a remote env behind env.proto's ``Environment`` service.
"""

from __future__ import annotations

import functools
import importlib

import gymnasium as gym

from actorlearner.envs.remote import SCHEME, RemoteEnv
from actorlearner.transport import SecurityConfig


def make_env(name: str, security: SecurityConfig | None = None) -> gym.Env:
    """One environment named ``name``; ValueError with the reason when it cannot be made.

    ``security`` is the token and TLS material for a ``grpc://`` env server.
    """
    if name.startswith(SCHEME):
        return RemoteEnv(name, security=security)
    if ":" in name:
        factory = _factory(name)
        if factory is not None:
            env = factory()
            if not isinstance(env, gym.Env):
                raise ValueError(f"{name} returned a {type(env).__name__}, not a gymnasium.Env")
            return env
    try:
        return gym.make(name)
    except gym.error.Error as exc:
        raise ValueError(f"cannot make environment {name!r}: {exc}") from None


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
