"""The relay's gRPC service: the Learner service, answered for the actors behind the relay.

Its Connect streams are coroutines on the server's event loop (a reader task beside each), so the relay's
threads stay few whatever the number of actors; its upstream stream runs on a thread of its own.
"""

from __future__ import annotations

import contextlib
import logging

import grpc

from actorlearner import wire
from actorlearner.config import RelayConfig
from actorlearner.health import Health
from actorlearner.relay.relay import Relay, RelayServedStream
from actorlearner.streaming.broadcast import ONNX_FORMAT
from actorlearner.streaming.served import Followers
from actorlearner.streaming.service import messages, serving
from actorlearner.streaming.sessions import StreamSessions
from actorlearner.transport import grpc_options, open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)

SERVER_STOP_GRACE_SECONDS = 2.0
"""The server's grace on stop: the relay has ended every stream by then (UNAVAILABLE), so they end at once."""


class RelayService(StreamSessions, pb_grpc.LearnerServicer):
    """Connect streams join the relay (a reader task beside each forwards their messages upstream); GetStatus
    answers for the relay (a self-play league's part is the upstream's); GetSpec and SetParameters are the
    upstream's. Make it on the loop that serves it: the unary calls run on the server's small thread pool."""

    def __init__(self, relay: Relay):
        super().__init__(relay.config.max_streams, "the relay", relay.config.hello_timeout)
        self.relay = relay
        self._followers = Followers(relay.broadcast)  # the joined streams

    def close(self) -> None:
        """Stop following the relay's broadcast (the server is stopping)."""
        self._followers.close()

    async def open(self, hello: pb.Hello, context: grpc.aio.ServicerContext) -> RelayServedStream:
        if not hello.actor_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Hello.actor_id must not be empty")
        if hello.policy_format == ONNX_FORMAT:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a relay sends state_dict policies only: "
                                                                     "connect an ONNX actor to the learner itself")
        try:
            self.relay.check_size(pb.ActorMessage(actor_id=hello.actor_id, hello=hello))
        except wire.WireError as exc:
            await context.abort(exc.status_code, str(exc))
        stream = RelayServedStream(hello, context)
        if not self.relay.join(stream):
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"relay {self.relay.relay_id} is not connected upstream yet")
        self._followers.streams.add(stream)
        logger.info("%s %s connected", "relay" if stream.relay else "actor", stream.actor_id)
        return stream

    def leave(self, stream: RelayServedStream) -> None:
        self._followers.streams.discard(stream)
        stream.close()
        self.relay.leave(stream)
        logger.info("%s %s disconnected", "relay" if stream.relay else "actor", stream.actor_id)

    async def read(self, context: grpc.aio.ServicerContext, stream: RelayServedStream) -> None:
        """Forward the stream's messages upstream until it half-closes, sends one it may not, or ends."""
        try:
            async for message in messages(context):
                await self.relay.forward(stream, message)
        except wire.WireError as exc:
            logger.warning("%s sent bad input: %s", stream.actor_id, exc)
            stream.fail(exc.status_code, str(exc))
        except grpc.RpcError:
            stream.close()

    async def send(self, stream: RelayServedStream) -> None:
        """Write what is routed to the stream and, once it is welcomed, the relay's newest policy
        version and a self-play league's news (snapshot weights, then the menu). A Welcome for the
        stream itself names the version that follows it (the first one) or was sent last (later ones,
        settings changes). The only writer of the stream."""
        broadcast, league = self.relay.broadcast, self.relay.league
        while True:
            while not (stream.outbox or stream.closed
                       or (stream.welcomed and (broadcast.version > stream.sent_version
                                                or league.revision > stream.league_revision))):
                await stream.woken()
            for message in stream.take_outbox():
                if message.WhichOneof("kind") != "welcome" or message.actor_id:
                    await stream.send(message)
                elif stream.welcomed:
                    message.welcome.policy_version = stream.sent_version
                    await stream.send(message)
                else:
                    version, policy = broadcast.latest()
                    message.welcome.policy_version = version
                    await stream.send(message)
                    if stream.hello.policy_version != version:
                        for chunk in policy:
                            await stream.send(chunk)
                    stream.sent_version, stream.welcomed = version, True
            if stream.closed:
                return
            version, policy = broadcast.latest()
            if stream.welcomed and version > stream.sent_version:
                stream.sent_version = version
                for chunk in policy:
                    await stream.send(chunk)
            if stream.welcomed and league.revision > stream.league_revision:
                stream.league_revision, menu = league.menu(stream.league_sent)
                for message in menu:
                    await stream.send(message)

    def GetStatus(self, request, context):
        """The relay's own status; for a self-play learner, with its upstream's league (ratings, records)."""
        response = self.relay.status()
        welcome = self.relay.welcome
        if welcome is not None and welcome.settings.league.enabled:
            try:
                response.league.CopyFrom(self._upstream(lambda stub: stub.GetStatus(
                    request, timeout=context.time_remaining())).league)
            except grpc.RpcError as exc:
                logger.warning("status: the upstream's league is unavailable: %s", exc.details())
        return response

    def GetSpec(self, request, context):
        spec = self.relay.spec
        if spec is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"relay {self.relay.relay_id} is not connected upstream yet")
        return spec

    def SetParameters(self, request, context):
        """Passed on upstream, with the relay's credentials; the upstream's answer or status comes back."""
        try:
            return self._upstream(lambda stub: stub.SetParameters(request, timeout=context.time_remaining()))
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details())

    def _upstream(self, call):
        """``call(stub)`` on a channel of its own to the upstream, with the relay's credentials."""
        config = self.relay.config
        with open_channel(config.upstream, config.security, grpc_options(config.max_message_bytes)) as channel:
            return call(pb_grpc.LearnerStub(channel))


@contextlib.contextmanager
def serve(config: RelayConfig, health: Health | None = None):
    """Run a relay: its upstream stream, and its Learner service on an event loop of its own; yields the
    relay and the bound port."""
    relay = (Relay(config, health.set) if health is not None else Relay(config)).start()
    try:
        with serving("relay-grpc", lambda: RelayService(relay), f"{config.host}:{config.port}", config.max_streams,
                     config.max_message_bytes, config.security, health, SERVER_STOP_GRACE_SECONDS,
                     relay.close) as bound:
            yield relay, bound
    finally:
        relay.close()  # also when the server never started
