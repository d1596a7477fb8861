"""The life of one Connect stream, the same on every server of the Learner service (the learner, a relay):
a slot under the cap -> the Hello -> the stream opened (checked, joined) -> its Welcome -> a reader task
beside the sender until the stream ends -> teardown, then the stream's error status if it has one."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator

import grpc

from actorlearner.streaming.served import ServedStream, StreamEnded
from actorlearner.streaming.service import StreamCap, read_hello
from actorlearner.v1 import learner_pb2 as pb


class StreamSessions(ABC):
    """``Connect`` as a template: a server fills in :meth:`open`, :meth:`read`, :meth:`send` and :meth:`leave`,
    and where it has them :meth:`attached` (what the stream holds while open) and :meth:`welcome`.

    The reader starts only after the Welcome, so that nothing it writes (acks) overtakes it; the sender is
    the Connect coroutine itself. A stream that ends because the peer went away ends without a status."""

    def __init__(self, max_streams: int, who: str, hello_timeout: float):
        self._cap = StreamCap(max_streams, who)
        self._hello_timeout = hello_timeout

    async def Connect(self, request_iterator, context: grpc.aio.ServicerContext) -> None:  # noqa: N802 (gRPC's name)
        """One peer's stream; past ``max_streams`` open streams a new one is refused, not queued."""
        async with self._cap.slot(context):
            await self._serve(context)

    async def _serve(self, context: grpc.aio.ServicerContext) -> None:
        hello = await read_hello(context, self._hello_timeout)
        if hello is None:
            return
        stream = await self.open(hello, context)
        try:
            async with self.attached(stream):
                await self.welcome(stream)
                reader = asyncio.get_running_loop().create_task(self.read(context, stream),
                                                                name=f"read-{stream.actor_id}")
                try:
                    await self.send(stream)
                finally:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
        except StreamEnded:
            return  # the peer went away: nobody reads a status
        finally:
            self.leave(stream)
        if stream.error:
            await context.abort(*stream.error)

    @abstractmethod
    async def open(self, hello: pb.Hello, context: grpc.aio.ServicerContext) -> ServedStream:
        """The stream for this Hello, joined to what it follows; aborts the call to refuse it."""

    @contextlib.asynccontextmanager
    async def attached(self, stream: ServedStream) -> AsyncIterator[None]:
        """What the stream holds from its Welcome to its end (nothing by default)."""
        yield

    async def welcome(self, stream: ServedStream) -> None:
        """Send the stream's Welcome (by default the sender sends it from the outbox)."""

    @abstractmethod
    async def read(self, context: grpc.aio.ServicerContext, stream: ServedStream) -> None:
        """Consume the peer's messages until it half-closes, sends a bad one, or the stream ends."""

    @abstractmethod
    async def send(self, stream: ServedStream) -> None:
        """Write to the stream until it closes: the only writer after the Welcome."""

    @abstractmethod
    def leave(self, stream: ServedStream) -> None:
        """Teardown: the stream closes and leaves what it joined."""
