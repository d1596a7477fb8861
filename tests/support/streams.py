"""A raw Connect stream for tests: send the messages we choose, see every answer and how the stream ended."""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING

import grpc
import numpy as np

from actorlearner import specs, wire
from actorlearner.envs import make_env
from actorlearner.transport import grpc_options
from actorlearner.v1 import learner_pb2 as pb

if TYPE_CHECKING:  # annotations only: a raw actor process (raw_actor.py) starts without torch
    from actorlearner.learner.learner import Learner

CONNECT = f"/{pb.DESCRIPTOR.services_by_name['Learner'].full_name}/Connect"

_env = make_env("CartPole-v1")
CARTPOLE_SPEC = specs.env_spec("CartPole-v1", _env.observation_space, _env.action_space)
_env.close()


def hello(actor_id: str, policy_version: int = -1) -> pb.ActorMessage:
    """A CartPole DQN actor's Hello."""
    return pb.ActorMessage(hello=pb.Hello(actor_id=actor_id, protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn",
                                          env_spec=CARTPOLE_SPEC, policy_version=policy_version))


def batch(seq: int, n: int = 16, policy_version: int = 0, tag: float = 0.0, priorities: bool = True) -> pb.ActorMessage:
    """A well-formed batch of ``n`` CartPole transitions that say who sent them: obs = (seq, row, tag, 0)
    (no real CartPole state has pole angle ``tag`` when it is large); with priorities (1 each) unless told not."""
    obs = np.zeros((n, 4), np.float32)
    obs[:, 0], obs[:, 1], obs[:, 2] = seq, np.arange(n), tag
    fields = {"obs": obs, "action": np.zeros(n, np.int64), "reward": np.ones(n, np.float32),
              "discount": np.full(n, 0.99, np.float32), "next_obs": obs.copy()}
    return pb.ActorMessage.FromString(wire.encode_batch_message(seq, policy_version, n, wire.encode_batch(fields),
                                                                wire.Codec.MSGPACK, priorities=[1.0] * n * priorities))


class RawStream:
    """One Connect stream on its own channel; the learner's messages queue up in :attr:`received`."""

    def __init__(self, address: str, *messages: pb.ActorMessage):
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self.received: queue.Queue[pb.LearnerMessage] = queue.Queue()
        self.ended = threading.Event()
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self._channel = grpc.insecure_channel(address, options=grpc_options(64 << 20))
        connect = self._channel.stream_stream(CONNECT, request_serializer=None,
                                              response_deserializer=pb.LearnerMessage.FromString)
        for message in messages:
            self.send(message)
        self._call = connect(iter(self._requests.get, None))
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, message: pb.ActorMessage) -> int:
        """Queue ``message``; returns its size on the wire in bytes."""
        data = message.SerializeToString()
        self._requests.put(data)
        return len(data)

    def next(self, kind: str | None = None, timeout: float | None = 30) -> pb.LearnerMessage:
        """The next message (of ``kind``, skipping others); AssertionError if the stream ends first."""
        while True:
            try:
                message = self.received.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {kind or 'message'} within {timeout}s (ended: {self.code})") from None
            if message is None:
                raise AssertionError(f"the stream ended with {self.code} {self.details!r} before a {kind or 'message'}")
            if kind is None or message.WhichOneof("kind") == kind:
                return message

    def messages(self) -> list[pb.LearnerMessage]:
        """Everything received so far, consumed."""
        out = []
        while not self.received.empty():
            if (message := self.received.get()) is not None:
                out.append(message)
        return out

    def wait_end(self, timeout: float = 30) -> tuple[grpc.StatusCode, str]:
        """How the learner ended the stream (OK for a clean end)."""
        assert self.ended.wait(timeout), f"the stream was still open after {timeout}s"
        return self.code, self.details

    def cancel(self) -> None:
        """Go away as a killed actor would: the stream ends without a half-close."""
        self._call.cancel()

    def half_close(self) -> None:
        """Send nothing more; the learner's messages still come."""
        self._requests.put(None)

    def close(self) -> None:
        self._requests.put(None)
        self._call.cancel()
        self._channel.close()

    def _read(self) -> None:
        try:
            for message in self._call:
                self.received.put(message)
            self.code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            self.code, self.details = exc.code(), exc.details() or ""
        finally:
            self.received.put(None)
            self.ended.set()


BATCH = 16
"""Items (transitions or sequences) per batch of :func:`batch_for`."""


def make_hello(learner: Learner, actor_id: str) -> pb.Hello:
    """The Hello of an actor of ``learner``'s env and algorithm, holding no policy."""
    return pb.Hello(actor_id=actor_id, protocol_version=wire.PROTOCOL_VERSION, algorithm=learner.config.algorithm,
                    env_spec=learner.env_spec, batch_fields=learner.batch_fields, policy_version=-1)


def batch_for(learner: Learner, seq: int) -> bytes:
    """A batch whose items carry (seq, i) in their first observation values, so the buffer shows what
    arrived how often."""
    fields = {name: np.zeros((BATCH, *shape), wire.np_dtype(dtype)) for name, (shape, dtype) in learner.fields.items()}
    marks = fields["obs"].reshape(BATCH, -1)
    marks[:, 0], marks[:, 1] = seq, np.arange(BATCH)
    return wire.encode_batch_message(seq, 0, BATCH, wire.encode_batch(fields), wire.Codec.MSGPACK,
                                     priorities=[1.0] * BATCH)


def fill_limiter(learner: Learner) -> None:
    """Insert until the rate limiter holds further inserts (nothing samples: the learner is not started)."""
    stream = learner.connect(hello("filler").hello)
    seq = 0
    while learner.replay.limiter.can_insert():
        seq += 1
        assert learner.ingest(stream, batch(seq, n=256).batch)
    learner.disconnect(stream)
