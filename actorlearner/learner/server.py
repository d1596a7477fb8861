"""The Learner gRPC service: one session per actor stream; decode, validate, hand off, ack."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import deque
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from actorlearner import wire
from actorlearner.health import Health
from actorlearner.learner.learner import ActorRecord, Learner
from actorlearner.transport import add_port, auth_interceptors, grpc_options
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)


class Session:
    """One Connect stream: acks waiting to go out, the last version sent, and how it ended."""

    def __init__(self, actor: ActorRecord):
        self.actor = actor
        self.cond = threading.Condition()
        self.outbox: deque[pb.LearnerMessage] = deque()
        self.sent_version = -1
        self.closed = False
        self.error: tuple[grpc.StatusCode, str] | None = None

    def push(self, message: pb.LearnerMessage) -> None:
        with self.cond:
            self.outbox.append(message)
            self.cond.notify()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify()

    def fail(self, code: grpc.StatusCode, reason: str) -> None:
        """End the stream with a status (sent by the handler thread)."""
        with self.cond:
            self.error = self.error or (code, reason)
            self.closed = True
            self.cond.notify()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify()


class LearnerService(pb_grpc.LearnerServicer):
    """Thin servicer: every decision is the :class:`Learner`'s."""

    def __init__(self, learner: Learner, max_streams: int = 64):
        self.learner = learner
        self.max_streams = max_streams
        self._streams = threading.BoundedSemaphore(max_streams)

    def Connect(self, request_iterator, context):
        """One actor session; past ``max_streams`` open streams a new one is refused, not queued."""
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the learner is at its cap of {self.max_streams} concurrent streams (max_streams)")
        try:
            yield from self._session(_parsed(request_iterator), context)
        finally:
            self._streams.release()

    def _session(self, request_iterator, context):
        timer = threading.Timer(self.learner.config.hello_timeout, context.cancel)  # no Hello: free the slot
        timer.start()
        try:
            first = next(request_iterator, None)
        except wire.WireError as exc:
            context.abort(exc.status_code, str(exc))
        except grpc.RpcError:
            first = None  # cancelled: the Hello never came, or the client went away
        finally:
            timer.cancel()
        if first is None:
            return
        if first.WhichOneof("kind") != "hello":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message of a stream must be Hello")
        refusal = self.learner.check_hello(first.hello)
        if refusal:
            context.abort(getattr(grpc.StatusCode, refusal.code), refusal.reason)
        session = Session(self.learner.connect(first.hello))
        context.add_callback(session.close)
        self.learner.broadcast.listen(session.wake)
        logger.info("actor %s connected (index %d)", session.actor.actor_id, session.actor.index)
        threading.Thread(target=self._read, args=(request_iterator, session), daemon=True,
                         name=f"read-{session.actor.actor_id}").start()
        try:
            version, messages = self.learner.broadcast.latest()  # one snapshot: Welcome names what follows
            yield pb.LearnerMessage(welcome=self.learner.welcome(session.actor, version))
            session.sent_version = version
            yield from messages
            yield from self._send(session)
        finally:
            self.learner.broadcast.unlisten(session.wake)
            session.close()
            self.learner.disconnect(session.actor)
            logger.info("actor %s disconnected", session.actor.actor_id)
        if session.error:
            context.abort(*session.error)

    def GetStatus(self, request, context):
        return self.learner.status()

    def _read(self, request_iterator, session: Session) -> None:
        """Consume the actor's messages until it half-closes or sends a bad one.

        A half-close ends the actor's input only: the stream keeps carrying policy
        updates until the actor cancels it (a weights-only subscriber is legal).
        """
        try:
            for message in request_iterator:
                kind = message.WhichOneof("kind")
                if kind == "batch":
                    inserted = self.learner.ingest(session.actor, message.batch)
                    session.push(pb.LearnerMessage(ack=pb.Ack(
                        seq=message.batch.seq, accepted=True, reason="" if inserted else "duplicate")))
                elif kind == "episode_stats":
                    self.learner.record_episodes(session.actor, message.episode_stats)
                elif kind == "hello":
                    raise wire.WireError("Hello may only be the first message of a stream", "FAILED_PRECONDITION")
                else:
                    raise wire.WireError("empty ActorMessage")
        except wire.WireError as exc:
            logger.warning("actor %s sent bad input: %s", session.actor.actor_id, exc)
            session.fail(exc.status_code, str(exc))
        except grpc.RpcError:
            session.close()  # the stream ended under us: the actor went away
        except ValueError as exc:  # the buffer's own validation
            session.fail(grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    def _send(self, session: Session):
        """Yield acks as they come and the newest policy version whenever one is published."""
        broadcast, stopping = self.learner.broadcast, self.learner.stopping
        while True:
            with session.cond:
                while not (session.outbox or session.closed or stopping.is_set()
                           or broadcast.version > session.sent_version):
                    session.cond.wait(0.5)
                outbox = list(session.outbox)
                session.outbox.clear()
            yield from outbox
            if session.closed:
                return
            if stopping.is_set():
                yield pb.LearnerMessage(shutdown=pb.Shutdown(reason="learner is shutting down"))
                return
            version, messages = broadcast.latest()
            if version > session.sent_version:
                session.sent_version = version
                yield from messages


def _parse_actor_message(data: bytes) -> pb.ActorMessage | wire.WireError:
    """Connect's request deserializer: bytes that do not parse become a WireError that the
    session answers with INVALID_ARGUMENT (gRPC's own would end the stream with a bare INTERNAL)."""
    try:
        return pb.ActorMessage.FromString(data)
    except DecodeError as exc:
        return wire.WireError(f"message does not parse as an ActorMessage: {exc}")


def _parsed(requests):
    """The actor's messages; raises the WireError standing for one that did not parse."""
    for message in requests:
        if isinstance(message, wire.WireError):
            raise message
        yield message


def add_learner_service(service: LearnerService, server: grpc.Server) -> None:
    """``add_LearnerServicer_to_server`` with Connect's deserializer swapped for :func:`_parse_actor_message`."""
    name = pb.DESCRIPTOR.services_by_name["Learner"].full_name
    handlers = {
        "Connect": grpc.stream_stream_rpc_method_handler(
            service.Connect, request_deserializer=_parse_actor_message,
            response_serializer=pb.LearnerMessage.SerializeToString),
        "GetStatus": grpc.unary_unary_rpc_method_handler(
            service.GetStatus, request_deserializer=pb.StatusRequest.FromString,
            response_serializer=pb.StatusResponse.SerializeToString),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)


@contextlib.contextmanager
def serve(learner: Learner, host: str, port: int, max_streams: int | None = None, health: Health | None = None):
    """Run the Learner service; yields the bound port (``port`` 0 picks a free one).

    ``max_streams`` (default ``learner.config.max_streams``) caps concurrent Connect streams.
    """
    max_streams = learner.config.max_streams if max_streams is None else max_streams
    if max_streams < 1:
        raise ValueError(f"max_streams must be >= 1, got {max_streams}")
    workers = max_streams + 8  # each stream holds a worker; the rest answer GetStatus and refusals
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
                         options=grpc_options(learner.config.max_message_bytes),
                         maximum_concurrent_rpcs=workers, interceptors=auth_interceptors(learner.config.security))
    add_learner_service(LearnerService(learner, max_streams), server)
    if health is not None:
        health.add_to(server)
    bound = add_port(server, f"{host}:{port}", learner.config.security)
    server.start()
    try:
        yield bound
    finally:
        learner.stopping.set()
        server.stop(grace=2.0).wait()
