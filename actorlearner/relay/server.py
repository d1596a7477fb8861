"""The relay's gRPC service: the Learner service, answered for the actors behind the relay."""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent import futures

import grpc

from actorlearner import wire
from actorlearner.config import RelayConfig
from actorlearner.health import Health
from actorlearner.learner.onnx_feed import FORMAT as ONNX_FORMAT
from actorlearner.learner.server import add_learner_service
from actorlearner.relay.relay import Downstream, Relay
from actorlearner.transport import add_port, auth_interceptors, grpc_options, open_channel
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)


class RelayService(pb_grpc.LearnerServicer):
    """Connect streams join the relay; GetStatus answers for the relay; GetSpec and SetParameters are the upstream's."""

    def __init__(self, relay: Relay):
        self.relay = relay
        self.max_streams = relay.config.max_streams
        self._streams = threading.BoundedSemaphore(self.max_streams)

    def Connect(self, request_iterator, context):
        if not self._streams.acquire(blocking=False):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the relay is at its cap of {self.max_streams} concurrent streams (max_streams)")
        try:
            yield from self._session(request_iterator, context)
        finally:
            self._streams.release()

    def _session(self, request_iterator, context):
        timer = threading.Timer(self.relay.config.hello_timeout, context.cancel)
        timer.start()
        try:
            first = next(request_iterator, None)
        except grpc.RpcError:
            first = None
        finally:
            timer.cancel()
        if first is None:
            return
        if isinstance(first, wire.WireError):
            context.abort(first.status_code, str(first))
        if first.WhichOneof("kind") != "hello":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "the first message of a stream must be Hello")
        hello = first.hello
        if not hello.actor_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Hello.actor_id must not be empty")
        if hello.policy_format == ONNX_FORMAT:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "a relay sends state_dict policies only: "
                                                               "connect an ONNX actor to the learner itself")
        try:
            self.relay.check_size(pb.ActorMessage(actor_id=hello.actor_id, hello=hello))
        except wire.WireError as exc:
            context.abort(exc.status_code, str(exc))
        session = Downstream(hello)
        context.add_callback(session.close)
        if not self.relay.join(session):
            context.abort(grpc.StatusCode.UNAVAILABLE, f"relay {self.relay.relay_id} is not connected upstream yet")
        logger.info("%s %s connected", "relay" if session.relay else "actor", session.actor_id)
        threading.Thread(target=self._read, args=(request_iterator, session), daemon=True,
                         name=f"relay-read-{session.actor_id}").start()
        try:
            yield from self._send(session)
        finally:
            session.close()
            self.relay.leave(session)
            logger.info("%s %s disconnected", "relay" if session.relay else "actor", session.actor_id)
        if session.error:
            context.abort(*session.error)

    def _read(self, request_iterator, session: Downstream) -> None:
        """Forward the stream's messages upstream until it ends or sends one it may not."""
        try:
            for message in request_iterator:
                if isinstance(message, wire.WireError):
                    raise message
                self.relay.forward(session, message)
        except wire.WireError as exc:
            logger.warning("%s sent bad input: %s", session.actor_id, exc)
            session.fail(exc.status_code, str(exc))
        except grpc.RpcError:
            session.close()

    def _send(self, session: Downstream):
        """Yield what is routed to the stream and, once it is welcomed, the relay's newest policy
        version. A Welcome for the stream itself names the version that follows it (the first one)
        or was sent last (later ones, settings changes)."""
        broadcast = self.relay.broadcast
        while True:
            with session.cond:
                while not (session.outbox or session.closed
                           or (session.welcomed and broadcast.version > session.sent_version)):
                    session.cond.wait(0.5)
                outbox = list(session.outbox)
                session.outbox.clear()
            for message in outbox:
                if message.WhichOneof("kind") != "welcome" or message.actor_id:
                    yield message
                elif session.welcomed:
                    message.welcome.policy_version = session.sent_version
                    yield message
                else:
                    version, policy = broadcast.latest()
                    message.welcome.policy_version = version
                    yield message
                    if session.hello.policy_version != version:
                        yield from policy
                    session.sent_version, session.welcomed = version, True
            if session.closed:
                return
            version, policy = broadcast.latest()
            if session.welcomed and version > session.sent_version:
                session.sent_version = version
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
    workers = config.max_streams + 8  # each stream holds a worker; the rest answer GetStatus and refusals
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc"),
                         options=grpc_options(config.max_message_bytes), maximum_concurrent_rpcs=workers,
                         interceptors=auth_interceptors(config.security))
    add_learner_service(RelayService(relay), server)
    if health is not None:
        health.add_to(server)
    try:
        bound = add_port(server, f"{config.host}:{config.port}", config.security)
        server.start()
        yield relay, bound
    finally:
        relay.close()
        server.stop(grace=2.0).wait()
