"""RemoteEnv: a gymnasium.Env whose environment runs behind env.proto's ``Environment`` service."""

from __future__ import annotations

import queue
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


class RemoteEnv(gym.Env):
    """One session on an env server at ``address`` (``host:port``, optionally ``grpc://``-prefixed).

    ``security`` names the token and TLS material to dial with.
    Spaces come from the server's spec; ``reset`` forwards its seed and options, ``step``
    its action. Errors come back as :class:`RemoteEnvError`. ``close`` ends the session.
    """

    metadata = {"render_modes": []}

    def __init__(self, address: str, timeout: float = 30.0, max_message_bytes: int = 64 * 2**20,
                 security: SecurityConfig | None = None):
        self.address = address.removeprefix(SCHEME)
        self.timeout = timeout
        self.max_bytes = max_message_bytes
        self._channel = open_channel(self.address, security, grpc_options(max_message_bytes))
        self._stub = pb_grpc.EnvironmentStub(self._channel)
        try:
            spec = self._stub.GetSpec(pb.GetSpecRequest(), timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            self._channel.close()
            raise RemoteEnvError(self.address, exc.code(), exc.details() or "GetSpec failed") from None
        self.env_id = spec.env_id
        self.max_episode_steps = spec.max_episode_steps or None
        self.observation_space = specs.space_from_proto(spec.observation_space)
        self.action_space = specs.space_from_proto(spec.action_space)
        self._steps = StepFormat(self.observation_space, self.action_space)
        self._requests: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        session = self._channel.stream_stream("/actorlearner.v1.Environment/Session")  # bytes both ways
        self._responses = session(iter(self._requests.get, None))
        self._closed = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        request = pb.EnvRequest(reset=pb.ResetRequest(seed=seed, options=dict_to_proto(options or {})))
        response = self._parse(self._exchange(request.SerializeToString()), "reset")
        return (value_from_proto(response.observation, self.observation_space, self.max_bytes),
                dict_from_proto(response.info, self.max_bytes))

    def step(self, action):
        raw = self._steps.encode_request(action)
        if raw is None:
            raw = pb.EnvRequest(step=pb.StepRequest(action=value_to_proto(action))).SerializeToString()
        raw = self._exchange(raw)
        fast = self._steps.decode_response(raw)
        if fast is not None:
            return (*fast, {})
        response = self._parse(raw, "step")
        return (value_from_proto(response.observation, self.observation_space, self.max_bytes), response.reward,
                response.terminated, response.truncated, dict_from_proto(response.info, self.max_bytes))

    def close(self) -> None:
        """End the session (the server closes its env) and the channel; safe to call twice."""
        if self._closed:
            return
        try:
            self._parse(self._exchange(pb.EnvRequest(close=pb.CloseRequest()).SerializeToString()), "close")
        except RemoteEnvError:
            pass  # the session is gone already: nothing left to close on the server
        finally:
            self._closed = True
            self._requests.put(None)
            self._responses.cancel()
            self._channel.close()

    def _exchange(self, raw: bytes) -> bytes:
        """Send one serialized request and return the serialized response."""
        if self._closed:
            raise RemoteEnvError(self.address, grpc.StatusCode.FAILED_PRECONDITION, "the env is closed")
        self._requests.put(raw)
        try:
            return next(self._responses)
        except grpc.RpcError as exc:
            raise RemoteEnvError(self.address, exc.code(), exc.details() or "session ended") from None
        except StopIteration:
            raise RemoteEnvError(self.address, grpc.StatusCode.UNAVAILABLE, "the server ended the session") from None

    def _parse(self, raw: bytes, kind: str):
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


def _status_code(number: int) -> grpc.StatusCode:
    return next((c for c in grpc.StatusCode if c.value[0] == number), grpc.StatusCode.UNKNOWN)
