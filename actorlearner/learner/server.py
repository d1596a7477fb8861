"""The Learner gRPC service: one session per actor stream; decode, validate, hand off, ack."""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent import futures

import grpc
from google.protobuf.message import DecodeError

from actorlearner import wire
from actorlearner.health import Health
from actorlearner.learner.broadcast import PolicyBroadcast
from actorlearner.learner.learner import ActorStream, IngestAborted, Learner, Refusal
from actorlearner.learner.onnx_feed import FORMAT as ONNX_FORMAT
from actorlearner.learner.outbox import Outbox
from actorlearner.learner.parameters import ParameterError
from actorlearner.transport import add_port, auth_interceptors, grpc_options
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 5.0
"""How long a draining learner waits, after sending Shutdown, for the actor to end the stream. gRPC's
Python client drops messages it has not read when the stream's status arrives: without the wait,
a Python actor could miss the Shutdown."""


class Session(Outbox):
    """One Connect stream: the policy broadcast it follows, acks waiting to go out, the last version
    sent, and how it ended."""

    def __init__(self, stream: ActorStream, broadcast: PolicyBroadcast):
        super().__init__()
        self.stream = stream
        self.broadcast = broadcast
        self.actor_id = stream.record.actor_id
        self.sent_version = -1
        self.settings_version = -1  # the learner's settings_version of the last Welcome sent
        self.relay = stream.record.relay
        self.children: dict[str, ActorStream] = {}  # a relay's actors, by id; under cond
        self.refused: set[str] = set()  # a relay's actors refused since they last joined; under cond
        self.league_revision = 0  # the league's revision last sent (self-play)
        self.snapshots_sent: set[str] = set()  # league snapshots whose weights went out on this stream

    def sent(self, version: int) -> None:
        """``version`` goes out next; a relay's status shows it as the version the relay holds."""
        self.sent_version = version
        if self.relay:
            self.stream.record.policy_version = version

    def close(self) -> None:
        """The stream is over: the sender returns, and a batch waiting on the rate limiter gives up."""
        super().close()
        with self.cond:
            children = list(self.children.values())
        self.stream.ended.set()
        for child in children:
            child.ended.set()


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
        onnx = first.hello.policy_format == ONNX_FORMAT
        session = Session(self.learner.connect(first.hello),
                          self.learner.onnx_feed.broadcast if onnx else self.learner.broadcast)
        context.add_callback(session.close)
        session.broadcast.listen(session.wake)
        if onnx:
            self.learner.onnx_feed.subscribe()
        if session.relay:
            logger.info("relay %s connected", session.actor_id)
        else:
            logger.info("actor %s connected (index %d)", session.actor_id, session.stream.record.index)
        threading.Thread(target=self._read, args=(request_iterator, session), daemon=True,
                         name=f"read-{session.actor_id}").start()
        try:
            version, messages = session.broadcast.latest()  # one snapshot: Welcome names what follows
            session.settings_version = self.learner.settings_version
            yield pb.LearnerMessage(welcome=self.learner.welcome(session.stream, version))
            session.sent(version)
            if first.hello.policy_version != version:  # the actor holds it already otherwise
                yield from messages
            yield from self._send(session)
        finally:
            session.broadcast.unlisten(session.wake)
            if onnx:
                self.learner.onnx_feed.unsubscribe()
            session.close()
            with session.cond:
                children, session.children = list(session.children.values()), {}
            for child in children:
                self.learner.disconnect(child)
            self.learner.disconnect(session.stream)
            logger.info("actor %s disconnected", session.actor_id)
        if session.error:
            context.abort(*session.error)

    def GetStatus(self, request, context):
        return self.learner.status()

    def GetSpec(self, request, context):
        return self.learner.spec()

    def SetParameters(self, request, context):
        try:
            changes = self.learner.set_parameters([(p.name, p.value) for p in request.parameters])
        except ParameterError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return pb.SetParametersResponse(previous=[pb.Parameter(name=c.name, value=c.previous) for c in changes],
                                        applied=[pb.Parameter(name=c.name, value=c.value) for c in changes])

    def _read(self, request_iterator, session: Session) -> None:
        """Consume the actor's messages until it half-closes, sends a bad one, or the stream ends.

        A half-close ends the actor's input only: the stream keeps carrying policy
        updates until the actor cancels it (a weights-only subscriber is legal). Whatever
        goes wrong ends this stream alone, with a status and a reason, logged once.
        """
        actor_id = session.actor_id
        try:
            for message in request_iterator:
                kind = message.WhichOneof("kind")
                if session.relay:
                    self._relayed(session, message)
                elif message.actor_id:
                    raise wire.WireError("ActorMessage.actor_id is only for a relay's stream")
                elif kind in ("batch", "episode_stats"):
                    self._handle(session, session.stream, message)
                elif kind == "hello":
                    raise wire.WireError("Hello may only be the first message of a stream", "FAILED_PRECONDITION")
                elif kind == "leave":
                    raise wire.WireError("Leave is only for a relay's stream")
                else:
                    raise wire.WireError("empty ActorMessage")
        except IngestAborted as exc:  # not the actor's doing: a draining learner sends Shutdown next
            logger.info("actor %s: a batch was not stored (%s); the actor resends it", actor_id, exc)
        except wire.WireError as exc:
            logger.warning("actor %s sent bad input: %s", actor_id, exc)
            session.fail(exc.status_code, str(exc))
        except grpc.RpcError:
            session.close()  # the stream ended under us: the actor went away
        except ValueError as exc:  # the buffer's own validation
            logger.warning("actor %s sent bad input: %s", actor_id, exc)
            session.fail(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except Exception as exc:  # a bug or a failing device (e.g. CUDA out of memory): this stream only
            logger.exception("actor %s: the learner failed on this stream's message", actor_id)
            session.fail(grpc.StatusCode.INTERNAL, f"the learner failed on this stream's message: "
                                                   f"{type(exc).__name__}: {exc}")

    def _handle(self, session: Session, stream: ActorStream, message: pb.ActorMessage) -> None:
        """Store a batch and ack it, or account episode stats, for ``stream`` (a relay's actor's: acked by actor_id)."""
        if message.WhichOneof("kind") == "batch":
            inserted = self.learner.ingest(stream, message.batch)
            session.push(pb.LearnerMessage(actor_id=message.actor_id, ack=pb.Ack(
                seq=message.batch.seq, accepted=True, reason="" if inserted else "duplicate")))
        else:
            self.learner.record_episodes(stream, message.episode_stats)

    def _relayed(self, session: Session, message: pb.ActorMessage) -> None:
        """A message on a relay's stream. One actor's bad input (or a failure on it) refuses that
        actor alone, as its own stream would end; a message for an actor that never joined, the relay's fault,
        ends the relay's stream."""
        actor_id, kind = message.actor_id, message.WhichOneof("kind")
        if kind in ("hello", "leave"):
            self._relayed_arrival(session, message)
            return
        with session.cond:
            stream = session.children.get(actor_id)
            refused = actor_id in session.refused
        if stream is None:
            if refused:
                return  # sent before the relay saw the refusal
            raise wire.WireError(f"relay {session.actor_id} sent {kind or 'an empty message'} for actor "
                                 f"{actor_id!r}, which has not joined through it")
        try:
            if kind not in ("batch", "episode_stats"):
                raise wire.WireError("empty ActorMessage")
            self._handle(session, stream, message)
        except (wire.WireError, ValueError) as exc:
            logger.warning("actor %s (through relay %s) sent bad input: %s", actor_id, session.actor_id, exc)
            code = exc.status_code.name if isinstance(exc, wire.WireError) else "INVALID_ARGUMENT"
            self._refuse(session, actor_id, Refusal(code, str(exc)))
        except IngestAborted:
            raise
        except Exception as exc:  # a bug or a failing device: this actor only
            logger.exception("actor %s (through relay %s): the learner failed on its message", actor_id,
                             session.actor_id)
            self._refuse(session, actor_id, Refusal("INTERNAL", f"the learner failed on this stream's message: "
                                                                f"{type(exc).__name__}: {exc}"))

    def _refuse(self, session: Session, actor_id: str, refusal: Refusal) -> None:
        """End a relay's actor as its own stream would end: a Refusal routed to it; what it sent before
        the relay saw it is dropped."""
        with session.cond:
            stream = session.children.pop(actor_id, None)
            session.refused.add(actor_id)
        if stream is not None:
            self.learner.disconnect(stream)
        session.push(pb.LearnerMessage(actor_id=actor_id, refusal=pb.Refusal(code=refusal.code, reason=refusal.reason)))

    def _relayed_arrival(self, session: Session, message: pb.ActorMessage) -> None:
        """On a relay's stream: an actor joins (checked as its own Hello would be: Welcome or
        Refusal, routed by actor_id) or leaves."""
        actor_id = message.actor_id
        with session.cond:
            previous = session.children.pop(actor_id, None)
            session.refused.discard(actor_id)
        if previous is not None:
            self.learner.disconnect(previous)
        if message.WhichOneof("kind") == "leave":
            return
        hello = message.hello
        refusal = self.learner.check_hello(hello) or (
            Refusal("INVALID_ARGUMENT", "a relayed Hello must name its actor_id in ActorMessage.actor_id and "
                                        "must not be a relay's") if hello.actor_id != actor_id or hello.relay else None)
        if refusal:
            self._refuse(session, actor_id, refusal)
            return
        stream = self.learner.connect(hello, via=session.actor_id)
        with session.cond:
            joined = not session.closed  # else the session's cleanup is past: it would not disconnect it
            if joined:
                session.children[actor_id] = stream
        if not joined:
            self.learner.disconnect(stream)
            return
        session.push(pb.LearnerMessage(actor_id=actor_id, welcome=self.learner.welcome(stream, session.sent_version)))
        logger.info("actor %s joined through relay %s (index %d)", actor_id, session.actor_id, stream.record.index)

    def _send(self, session: Session):
        """Yield acks as they come, the newest policy version whenever one is published, a new
        Welcome whenever the learner's settings change, and the league whenever it changes."""
        learner = self.learner
        broadcast, stopping, league = session.broadcast, learner.stopping, learner.league
        while True:
            with session.cond:
                while not (session.outbox or session.closed or stopping.is_set()
                           or broadcast.version > session.sent_version
                           or learner.settings_version > session.settings_version
                           or (league is not None and league.revision > session.league_revision)):
                    session.cond.wait(0.5)
                outbox = list(session.outbox)
                session.outbox.clear()
            yield from outbox
            if session.closed:
                return
            if stopping.is_set():
                yield pb.LearnerMessage(shutdown=pb.Shutdown(reason="learner is shutting down"))
                with session.cond:
                    session.cond.wait_for(lambda: session.closed, SHUTDOWN_GRACE_SECONDS)
                return
            if learner.settings_version > session.settings_version:
                session.settings_version = learner.settings_version
                yield pb.LearnerMessage(welcome=learner.welcome(session.stream, session.sent_version))
                with session.cond:
                    children = list(session.children.items())
                for child_id, child in children:
                    yield pb.LearnerMessage(actor_id=child_id, welcome=learner.welcome(child, session.sent_version))
            version, messages = broadcast.latest()
            if version > session.sent_version:
                session.sent(version)
                yield from messages
            if league is not None and league.revision > session.league_revision:
                session.league_revision, messages = league.menu(session.snapshots_sent)
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
        "GetSpec": grpc.unary_unary_rpc_method_handler(
            service.GetSpec, request_deserializer=pb.LearnerSpecRequest.FromString,
            response_serializer=pb.LearnerSpec.SerializeToString),
        "SetParameters": grpc.unary_unary_rpc_method_handler(
            service.SetParameters, request_deserializer=pb.SetParametersRequest.FromString,
            response_serializer=pb.SetParametersResponse.SerializeToString),
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
