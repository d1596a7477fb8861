"""Step messages as raw bytes: the hot path of a session, without protobuf objects.

For a Box observation and a Discrete or Box action of fixed dtype and shape, every step
request and response has one canonical protobuf encoding of fixed length: a constant
prefix, the raw tensor bytes and (for responses) reward and flags at fixed offsets.
:class:`StepFormat` builds those bytes directly and recognizes them exactly; any other
message (another encoding, another space, a non-empty info) returns None here and takes
the ordinary protobuf path, so the wire format is env.proto's either way.
"""

from __future__ import annotations

import struct

import numpy as np
from gymnasium import spaces

from actorlearner import wire
from actorlearner.v1 import env_pb2 as pb

_REWARD_TAG, _TERMINATED_TAG, _TRUNCATED_TAG = 0x11, 0x18, 0x20  # StepResponse fields 2, 3, 4
_REWARD_KEY = bytes([_REWARD_TAG])
_DOUBLE = struct.Struct("<d")
_FLAGS = {(t, u): bytes([_TERMINATED_TAG, t, _TRUNCATED_TAG, u]) for t in (0, 1) for u in (0, 1)}
_MARK = 0xA5
MAX_TABLE = 4096
"""Discrete action spaces up to this size keep a table of every action's request bytes."""


def tensor_layout(space: spaces.Space) -> tuple[np.dtype, tuple[int, ...], int] | None:
    """``(dtype, shape, nbytes)`` when values of ``space`` are single fixed-size tensors, else None."""
    if not isinstance(space, (spaces.Box, spaces.Discrete)):
        return None
    dtype = space.dtype
    if dtype.name == "bool" or dtype.name not in wire.DTYPES or not wire.DTYPES[dtype.name].isnative:
        return None
    shape = tuple(space.shape)
    return dtype, shape, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def _tensor(dtype: np.dtype, shape: tuple[int, ...], nbytes: int) -> pb.Tensor:
    return pb.Tensor(dtype=dtype.name, shape=shape, data=bytes([_MARK]) * nbytes)


class StepFormat:
    """Canonical step requests (an action) and responses (observation, reward, flags) of one env."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space):
        self.observation = tensor_layout(observation_space)
        self.action = tensor_layout(action_space)
        self.action_space = action_space
        self.request_prefix = self.response_prefix = None
        self.response_size = 0
        self.by_action: dict[int, bytes] = {}  # Discrete: action -> request bytes
        self.by_request: dict[bytes, np.integer] = {}  # and back
        if self.action is not None:
            request = pb.EnvRequest(step=pb.StepRequest(action=pb.Value(tensor=_tensor(*self.action))))
            self.request_prefix = _prefix(request.SerializeToString(), self.action[2], b"")
        if self.request_prefix is not None and isinstance(action_space, spaces.Discrete) and action_space.n <= MAX_TABLE:
            for value in range(int(action_space.start), int(action_space.start + action_space.n)):
                action = action_space.dtype.type(value)
                self.by_action[value] = raw = self.request_prefix + action.tobytes()
                self.by_request[raw] = action
        if self.observation is not None:
            tail = _REWARD_KEY + _DOUBLE.pack(1.5) + _FLAGS[True, True]
            response = pb.EnvResponse(step=pb.StepResponse(observation=pb.Value(tensor=_tensor(*self.observation)),
                                                           reward=1.5, terminated=True, truncated=True))
            self.response_prefix = _prefix(response.SerializeToString(), self.observation[2], tail)
            if self.response_prefix is not None:
                self.response_size = len(self.response_prefix) + self.observation[2] + len(tail)

    # ------------------------------------------------------------------ requests

    def encode_request(self, action) -> bytes | None:
        """The step request for ``action`` when it has the action space's exact dtype and shape."""
        if self.by_action and isinstance(action, (int, np.integer)) and not isinstance(action, bool) \
                and (raw := self.by_action.get(int(action))) is not None:
            return raw
        if self.request_prefix is None:
            return None
        if type(action) is int:
            action = np.asarray(action)
        if not isinstance(action, (np.ndarray, np.generic)) or action.dtype != self.action[0] \
                or action.shape != self.action[1]:
            return None
        return self.request_prefix + action.tobytes()

    def decode_request(self, raw: bytes):
        """The action of a canonical step request that lies in the action space; None otherwise."""
        if self.by_request:
            return self.by_request.get(raw)
        prefix = self.request_prefix
        if prefix is None or len(raw) != len(prefix) + self.action[2] or not raw.startswith(prefix):
            return None
        dtype, shape, _ = self.action
        values = np.frombuffer(raw, dtype, offset=len(prefix))
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            value = values[0]
            return value if space.start <= value < space.start + space.n else None
        action = values.reshape(shape).copy()
        return action if space.contains(action) else None

    # ------------------------------------------------------------------ responses

    def encode_response(self, observation, reward: float, terminated: bool, truncated: bool) -> bytes | None:
        """The step response, when the observation has the space's exact dtype and shape."""
        if self.response_prefix is None or not isinstance(observation, np.ndarray) \
                or observation.dtype != self.observation[0] or observation.shape != self.observation[1]:
            return None
        return b"".join((self.response_prefix, observation.tobytes(), _REWARD_KEY, _DOUBLE.pack(reward),
                         _FLAGS[terminated, truncated]))

    def decode_response(self, raw: bytes) -> tuple[np.ndarray, float, bool, bool] | None:
        """``(observation, reward, terminated, truncated)`` of a canonical step response; None otherwise."""
        prefix = self.response_prefix
        if prefix is None or len(raw) != self.response_size or not raw.startswith(prefix):
            return None
        dtype, shape, nbytes = self.observation
        at = len(prefix) + nbytes  # then: reward tag, 8 bytes, terminated tag and byte, truncated tag and byte
        if raw[at] != _REWARD_TAG or raw[at + 9] != _TERMINATED_TAG or raw[at + 11] != _TRUNCATED_TAG \
                or raw[at + 10] > 1 or raw[at + 12] > 1:
            return None
        observation = np.frombuffer(raw, dtype, count=nbytes // dtype.itemsize, offset=len(prefix))
        if len(shape) != 1:
            observation = observation.reshape(shape)
        return observation.copy(), _DOUBLE.unpack_from(raw, at + 1)[0], raw[at + 10] == 1, raw[at + 12] == 1


def _prefix(serialized: bytes, nbytes: int, tail: bytes) -> bytes | None:
    """What precedes the marker tensor data in ``serialized``; None if the layout is not the expected one."""
    body = bytes([_MARK]) * nbytes + tail
    return serialized[: len(serialized) - len(body)] if serialized.endswith(body) else None
