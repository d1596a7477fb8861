"""Environments by name (gymnasium id, module:function, grpc://, ALE/ Atari games), the env server and the remote envs."""

from actorlearner.envs.factory import make_env, make_vector_env
from actorlearner.envs.remote import RemoteEnv, RemoteEnvError, RemoteMultiAgentEnv

__all__ = ["RemoteEnv", "RemoteEnvError", "RemoteMultiAgentEnv", "make_env", "make_vector_env"]
