"""What a server of the Learner service (the learner, a relay) needs to answer Connect: the gRPC server on an
event loop of its own, parsing that turns bad bytes into a status, the cap on open streams, and the opening Hello.

Connect streams are coroutines on one loop (grpc.aio), so the server's threads stay few whatever the number
of streams; the unary calls (GetStatus, GetSpec, SetParameters, health checks) are plain functions that run on
a small pool of :data:`UNARY_WORKERS` threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent import futures
from typing import NamedTuple, TypeVar

import grpc
from google.protobuf.message import DecodeError

from actorlearner import wire
from actorlearner.health import Health
from actorlearner.transport import SecurityConfig, add_port, async_auth_interceptors, grpc_options
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from actorlearner.wire.batches import split_batch_payload

LEARNER_SERVICE = pb.DESCRIPTOR.services_by_name["Learner"].full_name
CONNECT_METHOD = f"/{LEARNER_SERVICE}/Connect"

UNARY_WORKERS = 8
"""Threads that answer the unary calls and health checks; Connect streams need none."""

T = TypeVar("T")


def parse_actor_message(data: bytes) -> pb.ActorMessage | wire.WireError:
    """Connect's request deserializer: bytes that do not parse become a WireError that the
    server answers with INVALID_ARGUMENT (gRPC's own would end the stream with a bare INTERNAL)."""
    try:
        return pb.ActorMessage.FromString(data)
    except DecodeError as exc:
        return wire.WireError(f"message does not parse as an ActorMessage: {exc}")


class Received(NamedTuple):
    """An ActorMessage whose batch payload, when large, was kept out of the parse: ``payload`` is a
    view of the received bytes and ``message.batch.payload`` is empty; else ``payload`` is None."""

    message: pb.ActorMessage
    payload: memoryview | None


def parse_keeping_payload(data: bytes) -> Received | wire.WireError:
    """The learner's Connect deserializer: :func:`parse_actor_message` without copying a batch's
    payload (:func:`~actorlearner.wire.batches.split_batch_payload`)."""
    head, payload = split_batch_payload(data)
    message = parse_actor_message(head)
    return message if isinstance(message, wire.WireError) else Received(message, payload)


def serialize_learner_message(message: pb.LearnerMessage | bytes) -> bytes:
    """Connect's response serializer: bytes pass as they are (a policy version, serialized once for every stream)."""
    return message if isinstance(message, bytes) else message.SerializeToString()


async def messages(context: grpc.aio.ServicerContext) -> AsyncIterator:
    """A stream's messages until the peer half-closes; raises the WireError standing for one that did not parse."""
    while (message := await context.read()) is not grpc.aio.EOF:
        if isinstance(message, wire.WireError):
            raise message
        yield message


def _add_learner_service(service: pb_grpc.LearnerServicer, server: grpc.aio.Server, deserializer) -> None:
    """``add_LearnerServicer_to_server`` with Connect's deserializer swapped for ``deserializer``."""
    handlers = {
        "Connect": grpc.stream_stream_rpc_method_handler(
            service.Connect, request_deserializer=deserializer, response_serializer=serialize_learner_message),
        "GetStatus": grpc.unary_unary_rpc_method_handler(
            service.GetStatus, request_deserializer=pb.StatusRequest.FromString,
            response_serializer=pb.StatusResponse.SerializeToString),
        "GetSpec": grpc.unary_unary_rpc_method_handler(
            service.GetSpec, request_deserializer=pb.LearnerSpecRequest.FromString,
            response_serializer=pb.LearnerSpec.SerializeToString),
        "SetParameters": grpc.unary_unary_rpc_method_handler(
            service.SetParameters, request_deserializer=pb.SetParametersRequest.FromString,
            response_serializer=pb.SetParametersResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(LEARNER_SERVICE, handlers),))
    server.add_registered_method_handlers(LEARNER_SERVICE, handlers)


def learner_server(service: pb_grpc.LearnerServicer, max_streams: int, max_message_bytes: int,
                   security: SecurityConfig | None, health: Health | None,
                   deserializer=parse_actor_message) -> grpc.aio.Server:
    """A grpc.aio server answering ``service`` (and health checks, given ``health``), not bound or started yet;
    make it on the loop that will serve it. Connect's messages come through ``deserializer``
    (:func:`parse_actor_message` or :func:`parse_keeping_payload`)."""
    server = grpc.aio.server(
        migration_thread_pool=futures.ThreadPoolExecutor(max_workers=UNARY_WORKERS, thread_name_prefix="grpc-unary"),
        options=grpc_options(max_message_bytes), maximum_concurrent_rpcs=max_streams + UNARY_WORKERS * 2,
        interceptors=async_auth_interceptors(security))
    _add_learner_service(service, server, deserializer)
    if health is not None:
        health.add_to(server)
    return server


class LoopThread:
    """An asyncio event loop on a thread of its own, for synchronous code to run coroutines on (:meth:`run`)."""

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` on the loop and return its result (or raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        """Stop the loop, cancelling what still runs on it, and end its thread."""
        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_the_rest())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@contextlib.contextmanager
def serving(thread_name: str, make_service: Callable[[], pb_grpc.LearnerServicer], address: str, max_streams: int,
            max_message_bytes: int, security: SecurityConfig | None, health: Health | None, grace: float,
            stopping: Callable[[], None], deserializer=parse_actor_message):
    """Serve the Learner service ``make_service()`` makes (on the loop) at ``address``, on a :class:`LoopThread`
    of its own; yields the bound port. On exit ``stopping()`` runs, the server stops within ``grace`` seconds,
    then the service closes."""
    async def start() -> tuple[pb_grpc.LearnerServicer, grpc.aio.Server, int]:
        service = make_service()
        server = learner_server(service, max_streams, max_message_bytes, security, health, deserializer)
        try:
            bound = add_port(server, address, security)
        except BaseException:
            service.close()
            raise
        await server.start()
        return service, server, bound

    loop = LoopThread(thread_name)
    try:
        service, server, bound = loop.run(start())
    except BaseException:
        loop.close()
        raise
    try:
        yield bound
    finally:
        stopping()
        loop.run(server.stop(grace))
        service.close()
        loop.close()


class StreamCap:
    """At most ``limit`` open Connect streams: one past it is refused (RESOURCE_EXHAUSTED), not queued.
    Used on the serving loop only."""

    def __init__(self, limit: int, server: str):
        self.limit = limit
        self.open = 0
        self._server = server  # who refuses, in the refusal: "the learner", "the relay"

    @contextlib.asynccontextmanager
    async def slot(self, context: grpc.aio.ServicerContext):
        """Hold one of the slots while the stream is served."""
        if self.open >= self.limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"{self._server} is at its cap of {self.limit} concurrent streams (max_streams)")
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1


async def read_hello(context: grpc.aio.ServicerContext, timeout: float) -> pb.Hello | None:
    """The Hello that opens a stream; None if the peer half-closed first.

    A stream that sends none within ``timeout`` is ended (CANCELLED), freeing its slot; one that opens
    with bad bytes or another message is refused with a status.
    """
    try:
        first = await asyncio.wait_for(context.read(), timeout)
    except TimeoutError:
        await context.abort(grpc.StatusCode.CANCELLED, f"no Hello within the hello timeout ({timeout:g} s)")
    if first is grpc.aio.EOF:
        return None
    if isinstance(first, wire.WireError):
        await context.abort(first.status_code, str(first))
    if isinstance(first, Received):
        first = first.message
    if first.WhichOneof("kind") != "hello":
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message of a stream must be Hello")
    return first.hello
