"""One Connect stream as the server answering it sees it: who opened it, what waits to go out, how it ended."""

from __future__ import annotations

import threading
from collections import deque

import grpc

from actorlearner.v1 import learner_pb2 as pb


class ServedStream:
    """Messages waiting for a stream's sender (which waits on ``cond``), the last policy version
    sent, and the status the stream ends with. The learner and the relay serve their streams on it.

    ``actor_id`` is the Hello's; ``relay`` says the stream is a relay's, carrying many actors.
    """

    def __init__(self, actor_id: str, relay: bool):
        self.actor_id = actor_id
        self.relay = relay
        self.sent_version = -1
        self.cond = threading.Condition()
        self.outbox: deque[pb.LearnerMessage] = deque()
        self.closed = False
        self.error: tuple[grpc.StatusCode, str] | None = None

    def push(self, message: pb.LearnerMessage) -> None:
        with self.cond:
            self.outbox.append(message)
            self.cond.notify_all()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def fail(self, code: grpc.StatusCode, reason: str) -> None:
        """End the stream with a status (sent by the handler thread)."""
        with self.cond:
            self.error = self.error or (code, reason)
        self.close()

    def close(self) -> None:
        """The stream is over: its sender returns."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
