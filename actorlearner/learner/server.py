"""The Learner gRPC service: one served stream per Connect; decode, validate, hand off, ack."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from actorlearner import wire
from actorlearner.health import Health
from actorlearner.learner.learner import Learner
from actorlearner.learner.parameters import ParameterError
from actorlearner.learner.registry import ActorSession
from actorlearner.learner.replay_service import InsertAborted
from actorlearner.learner.roles import StreamFeed
from actorlearner.learner.spec import Refusal
from actorlearner.streaming.broadcast import ONNX_FORMAT, PolicyBroadcast
from actorlearner.streaming.served import Followers, ServedStream, StreamEnded
from actorlearner.streaming.service import StreamCap, messages, parse_keeping_payload, read_hello, serving
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 5.0
"""How long a draining learner waits, after sending Shutdown, for the actor to half-close or cancel the
stream before it ends it with OK. gRPC's Python client drops messages it has not read when the stream's
status arrives: without the wait, a Python actor could miss the Shutdown."""

SERVER_STOP_GRACE_SECONDS = SHUTDOWN_GRACE_SECONDS + 3.0
"""The server's grace on stop: past the Shutdown wait, so that every stream ends with OK, not cancelled."""

STOPPING_POLL_SECONDS = 0.25
"""How often the service looks whether the learner is stopping (then every stream sends Shutdown)."""


class LearnerServedStream(ServedStream):
    """One Connect stream into the learner: the actor's ``session`` with the learner (a relay's own,
    for a relay's stream), the policy broadcast it follows, the roles' ``feed``, and what the learner sent on it."""

    def __init__(self, session: ActorSession, broadcast: PolicyBroadcast, context: grpc.aio.ServicerContext,
                 feed: StreamFeed):
        super().__init__(session.record.actor_id, session.record.relay, context)
        self.session = session
        self.broadcast = broadcast
        self.settings_version = -1  # the learner's settings_version of the last Welcome sent
        self.children: dict[str, ActorSession] = {}  # a relay's actors, by id; under lock
        self.refused: set[str] = set()  # a relay's actors refused since they last joined; under lock
        self.feed = feed
        self.input_ended = False  # the actor half-closed: it sends nothing more
    def sent(self, version: int) -> None:
        """``version`` goes out next; a relay's status shows it as the version the relay holds."""
        self.sent_version = version
        if self.relay:
            self.session.record.policy_version = version

    def close(self) -> None:
        """The stream is over: the sender returns, and the actors' sessions end."""
        super().close()
        with self.lock:
            children = list(self.children.values())
        self.session.ended.set()
        for child in children:
            child.ended.set()


class LearnerService(pb_grpc.LearnerServicer):
    """Thin servicer: every decision is the :class:`Learner`'s. Make it on the loop that serves it: Connect
    streams are coroutines there, the unary calls run on the server's small thread pool."""

    def __init__(self, learner: Learner, max_streams: int = 64):
        self.learner = learner
        self._cap = StreamCap(max_streams, "the learner")
        self._followers = {broadcast: Followers(broadcast)  # the open streams
                           for broadcast in learner.publishing.broadcasts()}
        self._watcher = asyncio.get_running_loop().create_task(self._wake_all_when_stopping())

    def close(self) -> None:
        """Stop following the learner's broadcasts (the server is stopping)."""
        for followers in self._followers.values():
            followers.close()
        self._watcher.cancel()

    async def _wake_all_when_stopping(self) -> None:
        """Once the learner stops, every stream's sender sends Shutdown."""
        while not self.learner.stopping.is_set():
            await asyncio.sleep(STOPPING_POLL_SECONDS)
        for followers in self._followers.values():
            followers.wake_all()

    async def Connect(self, request_iterator, context):
        """One actor's (or relay's) stream; past ``max_streams`` open streams a new one is refused, not queued.

        The stream's sender is this coroutine: it writes the Welcome, policy versions, settings and
        Shutdown; a reader task beside it ingests the actor's messages and writes each ack itself.
        """
        async with self._cap.slot(context):
            await self._serve(context)

    async def _serve(self, context: grpc.aio.ServicerContext) -> None:
        hello = await read_hello(context, self.learner.config.hello_timeout)
        if hello is None:
            return
        refusal = self.learner.check_hello(hello)
        if refusal:
            await context.abort(getattr(grpc.StatusCode, refusal.code), refusal.reason)
        onnx = hello.policy_format == ONNX_FORMAT
        publishing = self.learner.publishing
        stream = LearnerServedStream(self.learner.connect(hello), publishing.broadcast_for(onnx), context,
                                      self.learner.feed(onnx))
        followers = self._followers[stream.broadcast].streams
        followers.add(stream)
        try:
            async with publishing.subscription(onnx):
                await self._welcome_and_send(context, hello, stream)
        except StreamEnded:
            return  # the actor went away: nobody reads a status
        finally:
            followers.discard(stream)
            stream.close()
            with stream.lock:
                children, stream.children = list(stream.children.values()), {}
            for child in children:
                self.learner.disconnect(child)
            self.learner.disconnect(stream.session)
            logger.info("actor %s disconnected", stream.actor_id)
        if stream.error:
            await context.abort(*stream.error)

    async def _welcome_and_send(self, context: grpc.aio.ServicerContext, hello: pb.Hello,
                                stream: LearnerServedStream) -> None:
        """The Welcome and the policy it names, then the reader beside this sender until the stream ends."""
        reader = None
        try:
            if stream.relay:
                logger.info("relay %s connected", stream.actor_id)
            else:
                logger.info("actor %s connected (index %d)", stream.actor_id, stream.session.record.index)
            version, messages = stream.broadcast.latest()  # one snapshot: Welcome names what follows
            stream.settings_version = self.learner.settings_version
            await stream.send(pb.LearnerMessage(welcome=self.learner.welcome(stream.session, version)))
            stream.sent(version)
            if hello.policy_version != version:  # the actor holds it already otherwise
                for message in messages:
                    await stream.send(message)
            # Read only now: the reader's acks go out at once, and must not overtake the Welcome.
            reader = asyncio.get_running_loop().create_task(self._read(context, stream), name=f"read-{stream.actor_id}")
            await self._send(stream)
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)

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

    async def _read(self, context: grpc.aio.ServicerContext, stream: LearnerServedStream) -> None:
        """Consume the actor's messages until it half-closes, sends a bad one, or the stream ends.

        A half-close ends the actor's input only: the stream keeps carrying policy
        updates until the actor cancels it (a weights-only subscriber is legal). Whatever
        goes wrong ends this stream alone, with a status and a reason, logged once.
        """
        actor_id = stream.actor_id
        try:
            async for message, payload in messages(context):
                kind = message.WhichOneof("kind")
                if stream.relay:
                    await self._relayed(stream, message, payload)
                elif message.actor_id:
                    raise wire.WireError("ActorMessage.actor_id is only for a relay's stream")
                elif kind in ("batch", "episode_stats"):
                    await self._handle(stream, stream.session, message, payload)
                elif kind == "hello":
                    raise wire.WireError("Hello may only be the first message of a stream", "FAILED_PRECONDITION")
                elif kind == "leave":
                    raise wire.WireError("Leave is only for a relay's stream")
                else:
                    raise wire.WireError("empty ActorMessage")
            stream.input_ended = True
            stream.wake()
        except InsertAborted as exc:  # not the actor's doing: a draining learner sends Shutdown next
            logger.info("actor %s: a batch was not stored (%s); the actor resends it", actor_id, exc)
        except wire.WireError as exc:
            logger.warning("actor %s sent bad input: %s", actor_id, exc)
            stream.fail(exc.status_code, str(exc))
        except ValueError as exc:  # the buffer's own validation
            logger.warning("actor %s sent bad input: %s", actor_id, exc)
            stream.fail(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except StreamEnded:
            stream.close()  # the actor went away
        except Exception as exc:  # a bug or a failing device (e.g. CUDA out of memory): this stream only
            logger.exception("actor %s: the learner failed on this stream's message", actor_id)
            stream.fail(grpc.StatusCode.INTERNAL, f"the learner failed on this stream's message: "
                                                   f"{type(exc).__name__}: {exc}")

    async def _handle(self, stream: LearnerServedStream, session: ActorSession, message: pb.ActorMessage,
                      payload: memoryview | None) -> None:
        """Store a batch (its payload kept out of ``message`` when given) and ack it, or account episode
        stats, for ``session`` (a relay's actor's: acked by actor_id)."""
        if message.WhichOneof("kind") == "batch":
            inserted = await self.learner.ingest_async(session, message.batch, payload)
            ack = pb.LearnerMessage(actor_id=message.actor_id, ack=pb.Ack(
                seq=message.batch.seq, accepted=True, reason="" if inserted else "duplicate"))
            if stream.relay:  # behind the Welcomes and Refusals the relay's actors wait for in its outbox
                stream.push(ack)
            else:
                await stream.send(ack)
        else:
            self.learner.record_episodes(session, message.episode_stats)

    async def _relayed(self, stream: LearnerServedStream, message: pb.ActorMessage, payload: memoryview | None) -> None:
        """A message on a relay's stream. One actor's bad input (or a failure on it) refuses that
        actor alone, as its own stream would end; a message for an actor that never joined, the relay's fault,
        ends the relay's stream."""
        actor_id, kind = message.actor_id, message.WhichOneof("kind")
        if kind in ("hello", "leave"):
            self._relayed_arrival(stream, message)
            return
        with stream.lock:
            session = stream.children.get(actor_id)
            refused = actor_id in stream.refused
        if session is None:
            if refused:
                return  # sent before the relay saw the refusal
            raise wire.WireError(f"relay {stream.actor_id} sent {kind or 'an empty message'} for actor "
                                 f"{actor_id!r}, which has not joined through it")
        try:
            if kind not in ("batch", "episode_stats"):
                raise wire.WireError("empty ActorMessage")
            await self._handle(stream, session, message, payload)
        except (wire.WireError, ValueError) as exc:
            logger.warning("actor %s (through relay %s) sent bad input: %s", actor_id, stream.actor_id, exc)
            code = exc.status_code.name if isinstance(exc, wire.WireError) else "INVALID_ARGUMENT"
            self._refuse(stream, actor_id, Refusal(code, str(exc)))
        except InsertAborted:
            raise
        except Exception as exc:  # a bug or a failing device: this actor only
            logger.exception("actor %s (through relay %s): the learner failed on its message", actor_id,
                             stream.actor_id)
            self._refuse(stream, actor_id, Refusal("INTERNAL", f"the learner failed on this stream's message: "
                                                                f"{type(exc).__name__}: {exc}"))

    def _refuse(self, stream: LearnerServedStream, actor_id: str, refusal: Refusal) -> None:
        """End a relay's actor as its own stream would end: a Refusal routed to it; what it sent before
        the relay saw it is dropped."""
        with stream.lock:
            session = stream.children.pop(actor_id, None)
            stream.refused.add(actor_id)
        if session is not None:
            self.learner.disconnect(session)
        stream.push(pb.LearnerMessage(actor_id=actor_id, refusal=pb.Refusal(code=refusal.code, reason=refusal.reason)))

    def _relayed_arrival(self, stream: LearnerServedStream, message: pb.ActorMessage) -> None:
        """On a relay's stream: an actor joins (checked as its own Hello would be: Welcome or
        Refusal, routed by actor_id) or leaves."""
        actor_id = message.actor_id
        with stream.lock:
            previous = stream.children.pop(actor_id, None)
            stream.refused.discard(actor_id)
        if previous is not None:
            self.learner.disconnect(previous)
        if message.WhichOneof("kind") == "leave":
            return
        hello = message.hello
        refusal = self.learner.check_hello(hello) or (
            Refusal("INVALID_ARGUMENT", "a relayed Hello must name its actor_id in ActorMessage.actor_id and "
                                        "must not be a relay's") if hello.actor_id != actor_id or hello.relay else None)
        if refusal:
            self._refuse(stream, actor_id, refusal)
            return
        session = self.learner.connect(hello, via=stream.actor_id)
        with stream.lock:
            joined = not stream.closed  # else the stream's cleanup is past: it would not disconnect it
            if joined:
                stream.children[actor_id] = session
        if not joined:
            self.learner.disconnect(session)
            return
        stream.push(pb.LearnerMessage(actor_id=actor_id, welcome=self.learner.welcome(session, stream.sent_version)))
        logger.info("actor %s joined through relay %s (index %d)", actor_id, stream.actor_id, session.record.index)

    async def _send(self, stream: LearnerServedStream) -> None:
        """Send what waits in the outbox as it comes (a relay's actors' Welcomes, Refusals and acks), the newest
        policy version whenever one is published, a new Welcome whenever the learner's settings change, and
        what the roles' feed has whenever it has some."""
        learner = self.learner
        broadcast, stopping, feed = stream.broadcast, learner.stopping, stream.feed
        while True:
            while not (stream.outbox or stream.closed or stopping.is_set()
                       or broadcast.version > stream.sent_version
                       or learner.settings_version > stream.settings_version
                       or feed.due()):
                await stream.woken()
            for message in stream.take_outbox():
                await stream.send(message)
            if stream.closed:
                return
            if stopping.is_set():
                await stream.send(pb.LearnerMessage(shutdown=pb.Shutdown(reason="learner is shutting down")))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SHUTDOWN_GRACE_SECONDS):
                        while not (stream.closed or stream.input_ended):
                            await stream.woken()
                return
            if learner.settings_version > stream.settings_version:
                stream.settings_version = learner.settings_version
                await stream.send(pb.LearnerMessage(welcome=learner.welcome(stream.session, stream.sent_version)))
                with stream.lock:
                    children = list(stream.children.items())
                for child_id, child in children:
                    await stream.send(pb.LearnerMessage(actor_id=child_id,
                                                        welcome=learner.welcome(child, stream.sent_version)))
            version, messages = broadcast.latest()
            if version > stream.sent_version:
                stream.sent(version)
                for message in messages:
                    await stream.send(message)
            if feed.due():
                for message in feed.messages():
                    await stream.send(message)


@contextlib.contextmanager
def serve(learner: Learner, host: str, port: int, max_streams: int | None = None, health: Health | None = None):
    """Run the Learner service on an event loop of its own; yields the bound port (``port`` 0 picks a free one).

    ``max_streams`` (default ``learner.config.max_streams``) caps concurrent Connect streams.
    """
    max_streams = learner.config.max_streams if max_streams is None else max_streams
    if max_streams < 1:
        raise ValueError(f"max_streams must be >= 1, got {max_streams}")

    with serving("learner-grpc", lambda: LearnerService(learner, max_streams), f"{host}:{port}", max_streams,
                 learner.config.max_message_bytes, learner.config.security, health, SERVER_STOP_GRACE_SECONDS,
                 learner.stopping.set, parse_keeping_payload) as bound:
        yield bound
