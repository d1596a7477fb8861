"""The Learner gRPC service: one served stream per Connect; decode, validate, hand off, ack."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

import grpc

from actorlearner import wire
from actorlearner.health import Health
from actorlearner.learner.learner import Learner
from actorlearner.learner.parameters import ParameterError
from actorlearner.learner.registry import ActorSession
from actorlearner.learner.replay_service import InsertAborted
from actorlearner.learner.relayed import RelayedActors
from actorlearner.learner.roles import StreamFeed
from actorlearner.streaming.broadcast import ONNX_FORMAT, PolicyBroadcast
from actorlearner.streaming.served import Followers, ServedStream, StreamEnded
from actorlearner.streaming.service import messages, parse_keeping_payload, serving
from actorlearner.streaming.sessions import StreamSessions
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
    for a relay's stream, with the actors joined through it), the policy broadcast it follows, the roles'
    ``feed``, and what the learner sent on it."""

    def __init__(self, session: ActorSession, onnx: bool, broadcast: PolicyBroadcast,
                 context: grpc.aio.ServicerContext, feed: StreamFeed, learner: Learner):
        super().__init__(session.record.actor_id, session.record.relay, context)
        self.session = session
        self.onnx, self.broadcast = onnx, broadcast  # it takes ONNX models, else state dicts
        self.settings_version = -1  # the learner's settings_version of the last Welcome sent
        self.relayed = RelayedActors(learner, self.actor_id, self.push) if self.relay else None
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
        self.session.ended.set()
        if self.relayed is not None:
            self.relayed.close()


class LearnerService(StreamSessions, pb_grpc.LearnerServicer):
    """Thin servicer: every decision is the :class:`Learner`'s. Make it on the loop that serves it: Connect
    streams are coroutines there (the sender writes the Welcome, policy versions, settings and Shutdown; a
    reader task beside it ingests the actor's messages and writes each ack itself), the unary calls run on
    the server's small thread pool."""

    def __init__(self, learner: Learner, max_streams: int = 64):
        super().__init__(max_streams, "the learner", learner.config.hello_timeout)
        self.learner = learner
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

    async def open(self, hello: pb.Hello, context: grpc.aio.ServicerContext) -> LearnerServedStream:
        refusal = self.learner.check_hello(hello)
        if refusal:
            await context.abort(getattr(grpc.StatusCode, refusal.code), refusal.reason)
        onnx = hello.policy_format == ONNX_FORMAT
        stream = LearnerServedStream(self.learner.connect(hello), onnx, self.learner.publishing.broadcast_for(onnx),
                                     context, self.learner.feed(onnx), self.learner)
        self._followers[stream.broadcast].streams.add(stream)
        return stream

    def attached(self, stream: LearnerServedStream):
        """An ONNX stream keeps the feed exporting while it is open."""
        return self.learner.publishing.subscription(stream.onnx)

    async def welcome(self, stream: LearnerServedStream) -> None:
        """The Welcome and, unless the actor holds it already, the policy version it names."""
        if stream.relay:
            logger.info("relay %s connected", stream.actor_id)
        else:
            logger.info("actor %s connected (index %d)", stream.actor_id, stream.session.record.index)
        version, messages = stream.broadcast.latest()  # one snapshot: Welcome names what follows
        stream.settings_version = self.learner.settings_version
        await stream.send(pb.LearnerMessage(welcome=self.learner.welcome(stream.session, version)))
        stream.sent(version)
        if stream.session.hello_version != version:
            for message in messages:
                await stream.send(message)

    def leave(self, stream: LearnerServedStream) -> None:
        self._followers[stream.broadcast].streams.discard(stream)
        stream.close()
        self.learner.disconnect(stream.session)
        logger.info("actor %s disconnected", stream.actor_id)

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

    async def read(self, context: grpc.aio.ServicerContext, stream: LearnerServedStream) -> None:
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
                    await stream.relayed.receive(message, payload, functools.partial(self._handle, stream),
                                                 stream.sent_version)
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

    async def send(self, stream: LearnerServedStream) -> None:
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
                for message in stream.relayed.welcomes(stream.sent_version) if stream.relayed else ():
                    await stream.send(message)
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
