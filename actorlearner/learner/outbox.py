"""The learner side of one Connect stream as its sender sees it: queued messages, and how it ended."""

from __future__ import annotations

import threading
from collections import deque

import grpc

from actorlearner.v1 import learner_pb2 as pb


class Outbox:
    """Messages waiting for a stream's sender (which waits on ``cond``), and the status it ends with.

    The learner's sessions and the relay's downstream streams both build on it.
    """

    def __init__(self):
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
