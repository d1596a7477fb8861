"""Environments by name (gymnasium id, module:function, grpc://), the env server and RemoteEnv."""

from actorlearner.envs.factory import make_env, make_vector_env
from actorlearner.envs.remote import RemoteEnv, RemoteEnvError

__all__ = ["RemoteEnv", "RemoteEnvError", "make_env", "make_vector_env"]
