"""RemoteEnv and RemoteMultiAgentEnv: environments that run behind env.proto's ``Environment`` service."""

from __future__ import annotations

import queue
from collections.abc import Mapping
from typing import Any

import grpc
import gymnasium as gym
from google.protobuf.message import DecodeError

from actorlearner import specs
from actorlearner.envs.steps import StepFormat
from actorlearner.transport import SecurityConfig, grpc_options, open_channel
from actorlearner.v1 import env_pb2 as pb
from actorlearner.v1 import env_pb2_grpc as pb_grpc
from actorlearner.values import dict_from_proto, dict_to_proto, value_from_proto, value_to_proto

SCHEME = "grpc://"


class RemoteEnvError(RuntimeError):
    """The env server refused a request or the session broke; ``code`` is the gRPC status code."""

    def __init__(self, address: str, code: grpc.StatusCode, message: str):
        super().__init__(f"env server {address}: {code.name}: {message}")
        self.code = code


class _Link:
    """One session on an env server: the channel, the server's spec and the request/response stream."""

    def __init__(self, address: str, timeout: float, max_bytes: int, security: SecurityConfig | None):
        self.address = address.removeprefix(SCHEME)
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.channel = open_channel(self.address, security, grpc_options(max_bytes))
        try:
            self.spec = pb_grpc.EnvironmentStub(self.channel).GetSpec(pb.GetSpecRequest(), timeout=timeout,
                                                                      wait_for_ready=True)
        except grpc.RpcError as exc:
            self.channel.close()
            raise RemoteEnvError(self.address, exc.code(), exc.details() or "GetSpec failed") from None
        self.closed = False

    def open(self) -> None:
        """Start the session (the server makes its env instance)."""
        self.requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        session = self.channel.stream_stream("/actorlearner.v1.Environment/Session")  # bytes both ways
        self.responses = session(iter(self.requests.get, None))

    def refuse(self, want: str, use: str) -> None:
        """Close the channel and raise ValueError: the server's env is not of the ``want`` kind."""
        self.channel.close()
        agents = ", ".join(repr(a.name) for a in self.spec.agents)
        kind = f"a multi-agent env (agents {agents})" if agents else "a single-agent env"
        raise ValueError(f"env server {self.address} serves {kind}, not {want}: use {use} "
                         "(make_env picks the right one for a grpc:// name)")

    def exchange(self, raw: bytes) -> bytes:
        """Send one serialized request and return the serialized response."""
        if self.closed:
            raise RemoteEnvError(self.address, grpc.StatusCode.FAILED_PRECONDITION, "the env is closed")
        self.requests.put(raw)
        try:
            return next(self.responses)
        except grpc.RpcError as exc:
            raise RemoteEnvError(self.address, exc.code(), exc.details() or "session ended") from None
        except StopIteration:
            raise RemoteEnvError(self.address, grpc.StatusCode.UNAVAILABLE, "the server ended the session") from None

    def call(self, request: pb.EnvRequest, kind: str):
        """The body of the response to ``request``, a ``kind`` request."""
        return self.parse(self.exchange(request.SerializeToString()), kind)

    def parse(self, raw: bytes, kind: str):
        """The body of the response to a ``kind`` request; RemoteEnvError for an error or a wrong answer."""
        try:
            response = pb.EnvResponse.FromString(raw)
        except DecodeError:
            raise RemoteEnvError(self.address, grpc.StatusCode.INTERNAL, "the server sent a malformed response") from None
        got = response.WhichOneof("kind")
        if got == "error":
            raise RemoteEnvError(self.address, _status_code(response.error.code), response.error.message)
        if got != kind:
            raise RemoteEnvError(self.address, grpc.StatusCode.INTERNAL, f"answered {got} to a {kind} request")
        return getattr(response, kind)

    def close(self) -> None:
        """End the session (the server closes its env) and the channel; safe to call twice."""
        if self.closed:
            return
        try:
            self.call(pb.EnvRequest(close=pb.CloseRequest()), "close")
        except RemoteEnvError:
            pass  # the session is gone already: nothing left to close on the server
        finally:
            self.closed = True
            self.requests.put(None)
            self.responses.cancel()
            self.responses = None  # dropped now: a call left to the interpreter's exit can deadlock it
            self.channel.close()


class RemoteEnv(gym.Env):
    """One session on an env server at ``address`` (``host:port``, optionally ``grpc://``-prefixed).

    ``security`` names the token and TLS material to dial with.
    Spaces come from the server's spec; ``reset`` forwards its seed and options, ``step``
    its action. Errors come back as :class:`RemoteEnvError`. ``close`` ends the session.
    A server of a multi-agent env is a ValueError: :class:`RemoteMultiAgentEnv` plays those.
    """

    metadata = {"render_modes": []}

    def __init__(self, address: str, timeout: float = 30.0, max_message_bytes: int = 64 * 2**20,
                 security: SecurityConfig | None = None):
        self._attach(_Link(address, timeout, max_message_bytes, security))

    def _attach(self, link: _Link) -> None:
        """Take the session of ``link``, whose spec must be a single-agent env's."""
        if link.spec.agents:
            link.refuse("a gymnasium env", "RemoteMultiAgentEnv")
        self._link, spec = link, link.spec
        self.address, self.timeout, self.max_bytes = link.address, link.timeout, link.max_bytes
        self.env_id = spec.env_id
        self.max_episode_steps = spec.max_episode_steps or None
        self.observation_space = specs.space_from_proto(spec.observation_space)
        self.action_space = specs.space_from_proto(spec.action_space)
        self._steps = StepFormat(self.observation_space, self.action_space)
        self._link.open()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        response = self._link.call(pb.EnvRequest(reset=pb.ResetRequest(seed=seed, options=dict_to_proto(options or {}))),
                                   "reset")
        return (value_from_proto(response.observation, self.observation_space, self.max_bytes),
                dict_from_proto(response.info, self.max_bytes))

    def step(self, action):
        raw = self._steps.encode_request(action)
        if raw is None:
            raw = pb.EnvRequest(step=pb.StepRequest(action=value_to_proto(action))).SerializeToString()
        raw = self._link.exchange(raw)
        fast = self._steps.decode_response(raw)
        if fast is not None:
            return (*fast, {})
        response = self._link.parse(raw, "step")
        return (value_from_proto(response.observation, self.observation_space, self.max_bytes), response.reward,
                response.terminated, response.truncated, dict_from_proto(response.info, self.max_bytes))

    def close(self) -> None:
        """End the session (the server closes its env) and the channel; safe to call twice."""
        self._link.close()


class RemoteMultiAgentEnv:
    """One session on a multi-agent env server: the :mod:`actorlearner.envs.multiagent` interface.

    Connects as :class:`RemoteEnv` does. ``possible_agents`` and each agent's spaces come
    from the server's spec; ``agents`` is the server's list of live agents after the last
    reset or step. Rewards, terminations and truncations hold every agent the server
    reported on (0.0 and False where the env gave it none); observations and infos only the
    agents that got one. A server of a single-agent env is a ValueError: :class:`RemoteEnv`
    plays those.
    """

    metadata = {"render_modes": []}

    def __init__(self, address: str, timeout: float = 30.0, max_message_bytes: int = 64 * 2**20,
                 security: SecurityConfig | None = None):
        self._attach(_Link(address, timeout, max_message_bytes, security))

    def _attach(self, link: _Link) -> None:
        """Take the session of ``link``, whose spec must be a multi-agent env's."""
        if not link.spec.agents:
            link.refuse("a multi-agent env", "RemoteEnv")
        self._link, spec = link, link.spec
        self.address, self.timeout, self.max_bytes = link.address, link.timeout, link.max_bytes
        self.env_id = spec.env_id
        self.max_episode_steps = spec.max_episode_steps or None
        self.possible_agents = [agent.name for agent in spec.agents]
        self._observation_spaces = {a.name: specs.space_from_proto(a.observation_space) for a in spec.agents}
        self._action_spaces = {a.name: specs.space_from_proto(a.action_space) for a in spec.agents}
        self.agents: list[str] = []
        self._link.open()

    def observation_space(self, agent: str) -> gym.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        response = self._link.call(pb.EnvRequest(reset=pb.ResetRequest(seed=seed, options=dict_to_proto(options or {}))),
                                   "reset")
        observations, _, _, _, infos = self._unpack(response)
        return observations, infos

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        request = pb.StepRequest(actions=[pb.AgentAction(agent=agent, action=value_to_proto(action))
                                          for agent, action in actions.items()])
        return self._unpack(self._link.call(pb.EnvRequest(step=request), "step"))

    def close(self) -> None:
        """End the session (the server closes its env) and the channel; safe to call twice."""
        self._link.close()

    def _unpack(self, response) -> tuple[dict, dict, dict, dict, dict]:
        """``(observations, rewards, terminations, truncations, infos)`` of a response's AgentSteps."""
        observations, rewards, terminations, truncations, infos = {}, {}, {}, {}, {}
        for step in response.agents:
            agent = step.agent
            if step.HasField("observation"):
                observations[agent] = value_from_proto(step.observation, self._observation_spaces.get(agent),
                                                       self.max_bytes)
            rewards[agent], terminations[agent], truncations[agent] = step.reward, step.terminated, step.truncated
            if step.HasField("info"):
                infos[agent] = dict_from_proto(step.info, self.max_bytes)
        self.agents = list(response.live_agents)
        return observations, rewards, terminations, truncations, infos


def connect(address: str, security: SecurityConfig | None = None, timeout: float = 30.0,
            max_message_bytes: int = 64 * 2**20) -> RemoteEnv | RemoteMultiAgentEnv:
    """A session on the env server at ``address``: a RemoteMultiAgentEnv when its spec lists agents,
    else a RemoteEnv (one GetSpec call either way)."""
    link = _Link(address, timeout, max_message_bytes, security)
    env = object.__new__(RemoteMultiAgentEnv if link.spec.agents else RemoteEnv)
    env._attach(link)
    return env


def _status_code(number: int) -> grpc.StatusCode:
    return next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)
