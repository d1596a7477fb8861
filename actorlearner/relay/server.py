"""The relay's gRPC service: the Learner service, answered for the actors behind the relay."""

from __future__ import annotations

import contextlib
import logging
import threading

import grpc

from actorlearner import wire
from actorlearner.config import RelayConfig
from actorlearner.health import Health
from actorlearner.relay.relay import Relay, RelayServedStream
from actorlearner.streaming.broadcast import ONNX_FORMAT
from actorlearner.streaming.service import StreamCap, learner_server, parsed, read_hello
from actorlearner.transport import add_port, grpc_options, open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)


class RelayService(pb_grpc.LearnerServicer):
    """Connect streams join the relay; GetStatus answers for the relay; GetSpec and SetParameters are the upstream's."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self._cap = StreamCap(relay.config.max_streams, "the relay")

    def Connect(self, request_iterator, context):
        with self._cap.slot(context):
            yield from self._serve(parsed(request_iterator), context)

    def _serve(self, request_iterator, context):
        hello = read_hello(request_iterator, context, self.relay.config.hello_timeout)
        if hello is None:
            return
        if not hello.actor_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Hello.actor_id must not be empty")
        if hello.policy_format == ONNX_FORMAT:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a relay sends state_dict policies only: "
                                                               "connect an ONNX actor to the learner itself")
        try:
            self.relay.check_size(pb.ActorMessage(actor_id=hello.actor_id, hello=hello))
        except wire.WireError as exc:
            context.abort(exc.status_code, str(exc))
        stream = RelayServedStream(hello)
        context.add_callback(stream.close)
        if not self.relay.join(stream):
            context.abort(grpc.StatusCode.UNAVAILABLE, f"relay {self.relay.relay_id} is not connected upstream yet")
        logger.info("%s %s connected", "relay" if stream.relay else "actor", stream.actor_id)
        threading.Thread(target=self._read, args=(request_iterator, stream), daemon=True,
                         name=f"relay-read-{stream.actor_id}").start()
        try:
            yield from self._send(stream)
        finally:
            stream.close()
            self.relay.leave(stream)
            logger.info("%s %s disconnected", "relay" if stream.relay else "actor", stream.actor_id)
        if stream.error:
            context.abort(*stream.error)

    def _read(self, request_iterator, stream: RelayServedStream) -> None:
        """Forward the stream's messages upstream until it ends or sends one it may not."""
        try:
            for message in request_iterator:
                self.relay.forward(stream, message)
        except wire.WireError as exc:
            logger.warning("%s sent bad input: %s", stream.actor_id, exc)
            stream.fail(exc.status_code, str(exc))
        except grpc.RpcError:
            stream.close()

    def _send(self, stream: RelayServedStream):
        """Yield what is routed to the stream and, once it is welcomed, the relay's newest policy
        version. A Welcome for the stream itself names the version that follows it (the first one)
        or was sent last (later ones, settings changes)."""
        broadcast = self.relay.broadcast
        while True:
            with stream.cond:
                while not (stream.outbox or stream.closed
                           or (stream.welcomed and broadcast.version > stream.sent_version)):
                    stream.cond.wait(0.5)
                outbox = list(stream.outbox)
                stream.outbox.clear()
            for message in outbox:
                if message.WhichOneof("kind") != "welcome" or message.actor_id:
                    yield message
                elif stream.welcomed:
                    message.welcome.policy_version = stream.sent_version
                    yield message
                else:
                    version, policy = broadcast.latest()
                    message.welcome.policy_version = version
                    yield message
                    if stream.hello.policy_version != version:
                        yield from policy
                    stream.sent_version, stream.welcomed = version, True
            if stream.closed:
                return
            version, policy = broadcast.latest()
            if stream.welcomed and version > stream.sent_version:
                stream.sent_version = version
                yield from policy

    def GetStatus(self, request, context):
        return self.relay.status()

    def GetSpec(self, request, context):
        spec = self.relay.spec
        if spec is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"relay {self.relay.relay_id} is not connected upstream yet")
        return spec

    def SetParameters(self, request, context):
        """Passed on upstream, with the relay's credentials; the upstream's answer or status comes back."""
        config = self.relay.config
        with open_channel(config.upstream, config.security, grpc_options(config.max_message_bytes)) as channel:
            try:
                return pb_grpc.LearnerStub(channel).SetParameters(request, timeout=context.time_remaining())
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details())


@contextlib.contextmanager
def serve(config: RelayConfig, health: Health | None = None):
    """Run a relay: its upstream stream and its Learner service; yields the relay and the bound port."""
    relay = Relay(config).start()
    server = learner_server(RelayService(relay), config.max_streams, config.max_message_bytes, config.security, health)
    try:
        bound = add_port(server, f"{config.host}:{config.port}", config.security)
        server.start()
        yield relay, bound
    finally:
        relay.close()
        server.stop(grace=2.0).wait()
