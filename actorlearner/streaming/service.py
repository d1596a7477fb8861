"""What a server of the Learner service (the learner, a relay) needs to answer Connect: the gRPC server and
its registration, parsing that turns bad bytes into a status, the cap on open streams, and the opening Hello."""

from __future__ import annotations

import contextlib
import threading
from concurrent import futures
from typing import NamedTuple

import grpc
from google.protobuf.message import DecodeError

from actorlearner import wire
from actorlearner.health import Health
from actorlearner.transport import SecurityConfig, auth_interceptors, grpc_options
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc
from actorlearner.wire.batches import split_batch_payload

LEARNER_SERVICE = pb.DESCRIPTOR.services_by_name["Learner"].full_name
CONNECT_METHOD = f"/{LEARNER_SERVICE}/Connect"


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


def parsed(requests):
    """A stream's messages; raises the WireError standing for one that did not parse."""
    for message in requests:
        if isinstance(message, wire.WireError):
            raise message
        yield message


def _add_learner_service(service: pb_grpc.LearnerServicer, server: grpc.Server, deserializer) -> None:
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
                   deserializer=parse_actor_message) -> grpc.Server:
    """A gRPC server answering ``service`` (and health checks, given ``health``), not bound or started yet;
    Connect's messages come through ``deserializer`` (:func:`parse_actor_message` or :func:`parse_keeping_payload`)."""
    workers = max_streams + 8  # each stream holds a worker; the rest answer GetStatus and refusals
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
                         options=grpc_options(max_message_bytes), maximum_concurrent_rpcs=workers,
                         interceptors=auth_interceptors(security))
    _add_learner_service(service, server, deserializer)
    if health is not None:
        health.add_to(server)
    return server


class StreamCap:
    """At most ``limit`` open Connect streams: one past it is refused (RESOURCE_EXHAUSTED), not queued."""

    def __init__(self, limit: int, server: str):
        self.limit = limit
        self._server = server  # who refuses, in the refusal: "the learner", "the relay"
        self._slots = threading.BoundedSemaphore(limit)

    @contextlib.contextmanager
    def slot(self, context: grpc.ServicerContext):
        """Hold one of the slots while the stream is served."""
        if not self._slots.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"{self._server} is at its cap of {self.limit} concurrent streams (max_streams)")
        try:
            yield
        finally:
            self._slots.release()


def read_hello(requests, context: grpc.ServicerContext, timeout: float) -> pb.Hello | None:
    """The Hello that opens a stream (``requests`` from :func:`parsed`); None if the stream ended first.

    A stream that sends none within ``timeout`` is cancelled, freeing its slot; one that opens
    with bad bytes or another message is refused with a status.
    """
    timer = threading.Timer(timeout, context.cancel)
    timer.start()
    try:
        first = next(requests, None)
    except wire.WireError as exc:
        context.abort(exc.status_code, str(exc))
    except grpc.RpcError:
        first = None  # cancelled: the Hello never came, or the client went away
    finally:
        timer.cancel()
    if first is None:
        return None
    if isinstance(first, Received):
        first = first.message
    if first.WhichOneof("kind") != "hello":
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message of a stream must be Hello")
    return first.hello
