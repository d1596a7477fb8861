"""One Connect stream as the server answering it sees it: who opened it, what waits to go out, how it ended.

Streams are served on the server's event loop (:func:`~actorlearner.streaming.service.serving`);
other threads (the learner's publisher, a relay's upstream reader) hand them messages and wake them
through this class, which is safe to call from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque

import grpc

from actorlearner.streaming.broadcast import PolicyBroadcast
from actorlearner.streaming.service import serialize_learner_message
from actorlearner.v1 import learner_pb2 as pb


class StreamEnded(Exception):
    """A write found the stream over: the peer went away, and what was being written is lost."""


class ServedStream:
    """Messages waiting for a stream's sender, the last policy version sent, and the status the stream
    ends with. The learner and the relay serve their streams on it; make it on the serving loop.

    ``actor_id`` is the Hello's; ``relay`` says the stream is a relay's, carrying many actors.
    ``lock`` guards the outbox and what subclasses keep beside it; ``context`` is the call's, written by :meth:`send`.
    """

    def __init__(self, actor_id: str, relay: bool, context: grpc.aio.ServicerContext):
        self.actor_id = actor_id
        self.relay = relay
        self._context = context
        self._writing = asyncio.Lock()  # one write at a time
        self.sent_version = -1
        self.lock = threading.Lock()
        self.outbox: deque[pb.LearnerMessage] = deque()
        self.closed = False
        self.error: tuple[grpc.StatusCode, str] | None = None
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._woken = asyncio.Event()

    async def send(self, message: pb.LearnerMessage | bytes) -> None:
        """Write ``message`` on the stream (on the loop); returns once gRPC has taken it (flow control holds it
        while the peer does not read). :class:`StreamEnded` if the peer went away first."""
        data = serialize_learner_message(message)
        async with self._writing:
            try:
                await self._context.write(data)
            except Exception as exc:  # gRPC fails a write only once the call is over
                raise StreamEnded(f"{self.actor_id}'s stream ended") from exc

    def push(self, message: pb.LearnerMessage) -> None:
        """Queue ``message`` for the sender (from any thread)."""
        with self.lock:
            self.outbox.append(message)
        self.wake()

    def take_outbox(self) -> list[pb.LearnerMessage]:
        with self.lock:
            messages = list(self.outbox)
            self.outbox.clear()
        return messages

    def wake(self) -> None:
        """Have the sender look again at what it may send (from any thread)."""
        if threading.get_ident() == self._loop_thread:
            self._woken.set()
        else:
            call_on_loop(self._loop, self._woken.set)

    async def woken(self) -> None:
        """Return once :meth:`wake` was called since the last return (at once if it was)."""
        await self._woken.wait()
        self._woken.clear()

    def fail(self, code: grpc.StatusCode, reason: str) -> None:
        """End the stream with a status (sent by its handler)."""
        with self.lock:
            self.error = self.error or (code, reason)
        self.close()

    def close(self) -> None:
        """The stream is over: its sender returns."""
        with self.lock:
            self.closed = True
        self.wake()


def call_on_loop(loop: asyncio.AbstractEventLoop, callback) -> None:
    """Have ``loop`` call ``callback`` soon, from any thread; nothing once the loop is closed (its streams are over)."""
    try:
        loop.call_soon_threadsafe(callback)
    except RuntimeError:
        pass


class Followers:
    """The open streams that follow a policy broadcast, woken with one hand-off to their loop per publish (not one
    per stream). Make it on the serving loop; :meth:`close` stops following."""

    def __init__(self, broadcast: PolicyBroadcast):
        self.broadcast = broadcast
        self.streams: set[ServedStream] = set()
        self._loop = asyncio.get_running_loop()
        broadcast.listen(self._publish)

    def _publish(self) -> None:
        call_on_loop(self._loop, self.wake_all)

    def wake_all(self) -> None:
        """Wake every stream (on the loop)."""
        for stream in list(self.streams):
            stream.wake()

    def close(self) -> None:
        self.broadcast.unlisten(self._publish)
