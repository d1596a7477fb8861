"""The relay's state: its one upstream stream, the routes from actor ids to downstream streams, its policy copy.

Upstream, the relay is one ``Connect`` stream whose Hello sets ``relay``; every actor that
connects to the relay joins on it (its Hello forwarded with ``ActorMessage.actor_id``), and
its batches and stats go up tagged the same way. What comes down with an ``actor_id`` (the
actor's Welcome, Acks, a Refusal) is routed to the downstream stream the actor joined on;
what comes without one is the relay's own: its Welcome, policy versions, which it keeps as one
serialized copy that all its streams send, and a self-play learner's league (`RelayLeague`): each
snapshot's weights come up once and go down once per stream, before the menu that names them.
When the upstream stream ends, every downstream stream ends with UNAVAILABLE: the actors reconnect
and resend their windows, so nothing acked is lost and the learner's duplicate filter keeps
anything from being stored twice.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from actorlearner import wire
from actorlearner.config import RelayConfig
from actorlearner.metrics import Metric
from actorlearner.relay.league import RelayLeague
from actorlearner.streaming.broadcast import PolicyBroadcast
from actorlearner.streaming.reconnect import Reconnecting, Refused
from actorlearner.streaming.served import ServedStream, call_on_loop
from actorlearner.telemetry import RateMeter
from actorlearner.v1 import learner_pb2 as pb
from actorlearner.v1 import learner_pb2_grpc as pb_grpc

logger = logging.getLogger(__name__)


class RelayError(Refused):
    """The upstream refused this relay for good (credentials, protocol...)."""


class RelayServedStream(ServedStream):
    """One stream into the relay: an actor's, or a downstream relay's (the actors it carries are routed to it).
    Make it on the serving loop."""

    def __init__(self, hello: pb.Hello, context: grpc.aio.ServicerContext):
        super().__init__(hello.actor_id, hello.relay, context)
        self.hello = hello
        self.welcomed = False  # a Welcome went out: policy versions follow it
        self.league_revision = 0  # the relay league's revision last sent (self-play)
        self.league_sent: set[str] = set()  # snapshots whose weights went out on this stream
        self.in_flight = 0  # batches forwarded upstream and not acked yet; under lock
        self._room = asyncio.Event()  # an ack made room in the window the reader waits on
        self._awaiting_room = False  # under lock

    async def enter_window(self, limit: int) -> None:
        """Count one more batch in flight, once fewer than ``limit`` are (the stream's reader, on the loop)."""
        while True:
            with self.lock:
                if self.in_flight < limit:
                    self.in_flight += 1
                    return
                self._awaiting_room = True
                self._room.clear()
            await self._room.wait()

    def acked(self, ack: pb.LearnerMessage) -> None:
        """Queue ``ack`` for the sender, its batch out of the window (from any thread): one hand-off to the
        loop wakes the sender and, if it waits for room, the reader."""
        with self.lock:
            self.outbox.append(ack)
            self.in_flight = max(0, self.in_flight - 1)
            room, self._awaiting_room = self._awaiting_room, False
        if room:
            call_on_loop(self._loop, self._make_room)
        else:
            self.wake()

    def _make_room(self) -> None:
        self._room.set()
        self.wake()


@dataclass
class Route:
    """An actor behind the relay: the stream it joined on and what its status shows."""

    stream: RelayServedStream
    via: str  # the downstream relay it comes through; empty if it is connected here itself
    policy_version: int
    last_seen: float = field(default_factory=time.time)
    duplicates: int = 0
    transitions: int = 0
    batches: RateMeter = field(default_factory=RateMeter)  # batches the learner stored
    sizes: dict[int, int] = field(default_factory=dict)  # seq -> transitions, until acked


class Relay(Reconnecting):
    """Keeps the upstream stream alive and routes between it and the downstream streams.

    Start with :meth:`start`, stop with :meth:`close`. ``failed`` is set (``error`` says why)
    when the upstream refuses the relay for good.
    """

    def __init__(self, config: RelayConfig, on_up: Callable[[bool], None] = lambda up: None):
        super().__init__(config.upstream, config.security, config.max_message_bytes, config.reconnect_initial,
                         config.reconnect_max, "relay-upstream")
        self.config = config
        self.relay_id = config.relay_id or f"{socket.gethostname()}-relay-{os.getpid()}"
        self.broadcast = PolicyBroadcast(config.chunk_bytes)
        self.league = RelayLeague(self.broadcast.nudge)  # a self-play learner's league, passed on
        self.lock = threading.Lock()  # routes, streams and the upstream's state
        self.routes: dict[str, Route] = {}
        self.streams: set[RelayServedStream] = set()
        self.up = False  # welcomed upstream and holding its policy: actors may join
        self.welcome: pb.Welcome | None = None  # the upstream's Welcome to this relay
        self.spec: pb.LearnerSpec | None = None
        self.error: RelayError | None = None
        self.failed = threading.Event()
        self.acked = 0  # batches the learner acked to the relay's actors, duplicates included
        self._requests: queue.Queue | None = None
        self._awaited_version: int | None = None  # welcomed; up once this version is held
        self._on_up = on_up  # told each time ``up`` changes (the relay's health), as it changes

    def close(self) -> None:
        super().close()
        self._down("the relay is shutting down")

    @property
    def max_unacked(self) -> int:
        return max(1, self.welcome.settings.max_unacked) if self.welcome else 1

    # -- downstream ------------------------------------------------------------------------

    def join(self, stream: RelayServedStream) -> bool:
        """Register a new downstream stream (an actor joins upstream); False while the upstream is down.
        The caller wakes it on every publish of ``broadcast``."""
        with self.lock:
            if not self.up:
                return False
            self.streams.add(stream)
            if stream.relay:
                welcome = pb.Welcome()
                welcome.CopyFrom(self.welcome)
                stream.push(pb.LearnerMessage(welcome=welcome))
            else:
                self._join(stream, stream.actor_id, stream.hello)
        return True

    def leave(self, stream: RelayServedStream) -> None:
        """A downstream stream ended: its actors leave upstream."""
        with self.lock:
            self.streams.discard(stream)
            for actor_id, route in list(self.routes.items()):
                if route.stream is stream:
                    self._leave(actor_id)

    async def forward(self, stream: RelayServedStream, message: pb.ActorMessage) -> None:
        """Pass a downstream message up (WireError for one its stream may not send); the stream's reader, on the loop.

        Waits while the stream has as many batches in flight as its actors' windows allow:
        gRPC flow control then holds the actor, as a busy learner would. A message larger than the
        learner accepts ends this stream alone (RESOURCE_EXHAUSTED), as it would end the actor's own.
        """
        kind = message.WhichOneof("kind")
        if not stream.relay:
            if message.actor_id:
                raise wire.WireError("ActorMessage.actor_id is only for a relay's stream")
            if kind == "hello":
                raise wire.WireError("Hello may only be the first message of a stream", "FAILED_PRECONDITION")
            if kind == "leave":
                raise wire.WireError("Leave is only for a relay's stream")
            message.actor_id = stream.actor_id
        self.check_size(message)
        if stream.relay and kind in ("hello", "leave"):
            with self.lock:
                route = self.routes.get(message.actor_id)
                if kind == "hello" and stream in self.streams:
                    self._join(stream, message.actor_id, message.hello)
                elif kind == "leave" and route is not None and route.stream is stream:
                    self._leave(message.actor_id)
            return
        if kind not in ("batch", "episode_stats"):
            raise wire.WireError("empty ActorMessage")
        if kind == "batch":
            await stream.enter_window(self.max_unacked * (self.config.max_streams if stream.relay else 1))
        with self.lock:
            route = self.routes.get(message.actor_id)
            dropped = route is None or route.stream is not stream or self._requests is None
            if not dropped:
                route.last_seen = time.time()
                if kind == "batch":
                    route.sizes[message.batch.seq] = message.batch.num_transitions
                    version = message.batch.policy_version
                else:
                    version = message.episode_stats.policy_version
                route.policy_version = max(route.policy_version, min(version, self.broadcast.version))
                self._requests.put(message)
        if dropped and kind == "batch":  # the actor left or moved, or the upstream is down: it resends
            with stream.lock:
                stream.in_flight -= 1

    def check_size(self, message: pb.ActorMessage) -> None:
        """WireError (RESOURCE_EXHAUSTED) for a message the learner would refuse as too large: it
        would end the relay's stream, for every actor on it."""
        size, limit = message.ByteSize(), self.welcome.settings.max_message_bytes if self.welcome else 0
        if limit and size > limit:
            raise wire.WireError(f"a {size}-byte message is over the learner's max_message_bytes ({limit})",
                                 "RESOURCE_EXHAUSTED")

    def _join(self, stream: RelayServedStream, actor_id: str, hello: pb.Hello) -> None:
        """Under lock: route ``actor_id`` to ``stream`` and forward its Hello (a direct actor's
        earlier stream here, if any, is ended: its acks now go to the new one)."""
        previous = self.routes.get(actor_id)
        if previous is not None and previous.stream is not stream and not previous.stream.relay:
            previous.stream.fail(grpc.StatusCode.UNAVAILABLE, f"actor {actor_id} connected to this relay again")
        self.routes[actor_id] = Route(stream, stream.actor_id if stream.relay else "", hello.policy_version)
        self._requests.put(pb.ActorMessage(actor_id=actor_id, hello=hello))

    def _leave(self, actor_id: str) -> None:
        """Under lock: forget ``actor_id`` and tell the upstream."""
        del self.routes[actor_id]
        if self._requests is not None:
            self._requests.put(pb.ActorMessage(actor_id=actor_id, leave=pb.Leave()))

    def _route_down(self, message: pb.LearnerMessage) -> None:
        """A message for one actor: to the stream it joined on (dropped if it has left)."""
        kind = message.WhichOneof("kind")
        with self.lock:
            route = self.routes.get(message.actor_id)
            if route is None:
                return
            if kind == "refusal":  # the learner drops what the actor sent before it: forward no more
                del self.routes[message.actor_id]
            elif kind == "ack":
                self.acked += 1
                n = route.sizes.pop(message.ack.seq, 0)
                if message.ack.reason == "duplicate":
                    route.duplicates += 1
                else:
                    route.batches.add()
                    route.transitions += n
        stream = route.stream
        if not stream.relay:
            if kind == "refusal":
                code = getattr(grpc.StatusCode, message.refusal.code, grpc.StatusCode.UNKNOWN)
                stream.fail(code, message.refusal.reason)
                return
            message.ClearField("actor_id")
        if kind == "ack":
            stream.acked(message)
        else:
            stream.push(message)

    # -- upstream --------------------------------------------------------------------------

    def _stream_ended(self, reason: str) -> None:
        self._down(reason)

    def _refusal(self, exc: grpc.RpcError) -> RelayError:
        return RelayError(f"upstream {self.address} refused relay {self.relay_id}: {exc.code().name}: {exc.details()}")

    def _refused(self, error: RelayError) -> None:
        self.error = error
        self.failed.set()
        self._down(str(error))

    def _serve_stream(self, channel: grpc.Channel) -> None:
        """One upstream stream, until it ends."""
        stub = pb_grpc.LearnerStub(channel)
        spec = stub.GetSpec(pb.LearnerSpecRequest(), timeout=10)
        requests: queue.Queue = queue.Queue()
        requests.put(pb.ActorMessage(hello=pb.Hello(
            actor_id=self.relay_id, relay=True, protocol_version=wire.PROTOCOL_VERSION, env_spec=spec.env_spec,
            policy_version=-1)))
        assembler = wire.ChunkAssembler(self.config.max_message_bytes * 64)
        call = self._open_stream(stub.Connect, requests)
        if call is None:  # closing
            return
        welcomed = False
        for message in call:
            kind = message.WhichOneof("kind")
            if message.actor_id:
                self._route_down(message)
            elif kind == "welcome":
                self.connects += not welcomed
                welcomed = True
                with self.lock:
                    self.spec, self.welcome, self._requests = spec, message.welcome, requests
                    if not self.up:
                        self._awaited_version = message.welcome.policy_version
            elif kind == "policy_update" and message.policy_update.opponent:
                self.league.add_chunk(message)  # a league snapshot's weights
            elif kind == "policy_update":
                update = message.policy_update
                payload = assembler.add(update.version, update.chunk_index, update.chunk_count,
                                        update.total_bytes, update.payload)
                if payload is not None:
                    self._publish(update.version, payload)
            elif kind == "league":
                self.league.update(message)
            elif kind == "shutdown":
                logger.info("upstream is shutting down: %s", message.shutdown.reason)
                break

    def _publish(self, version: int, payload: bytes) -> None:
        """Keep ``version`` as the relay's copy; the relay is up once it holds its Welcome's version."""
        self.broadcast.publish_payload(version, payload)
        with self.lock:
            if not self.up and self._awaited_version is not None and version >= self._awaited_version:
                self.up, self._awaited_version = True, None
                self._on_up(True)
                logger.info("relay %s connected upstream to %s (learner %s)", self.relay_id, self.config.upstream,
                            self.welcome.learner_id)

    def _down(self, reason: str) -> None:
        """The upstream stream is gone: end every downstream stream (their actors resend elsewhere or later)."""
        with self.lock:
            was_up, self.up, self._awaited_version = self.up, False, None
            if was_up:
                self._on_up(False)
            if self._requests is not None:
                self._requests.put(None)
                self._requests = None
            streams, self.streams = list(self.streams), set()
            self.routes.clear()
        self.league.clear()
        if was_up:
            logger.warning("relay %s lost its upstream %s (%s); ending %d streams", self.relay_id,
                           self.config.upstream, reason, len(streams))
        for stream in streams:
            stream.fail(grpc.StatusCode.UNAVAILABLE, f"relay {self.relay_id} lost its upstream: {reason}")

    # -- status ----------------------------------------------------------------------------

    def status(self) -> pb.StatusResponse:
        """The relay's actors (and the relays below it), and the newest version it holds."""
        version = self.broadcast.version
        with self.lock:
            routes = list(self.routes.items())
            relays = [s for s in self.streams if s.relay]
            learner_id = self.welcome.learner_id if self.welcome else ""
        actors = [pb.ActorStatus(actor_id=actor_id, policy_version=r.policy_version,
                                 lag=max(0, version - r.policy_version), batches_per_second=r.batches.rate(),
                                 last_seen_unix=r.last_seen, connected=True, duplicates=r.duplicates,
                                 inserted=int(r.batches.total), transitions=r.transitions, via=r.via)
                  for actor_id, r in routes]
        actors += [pb.ActorStatus(actor_id=s.actor_id, policy_version=s.sent_version,
                                  lag=max(0, version - s.sent_version), connected=True, relay=True) for s in relays]
        return pb.StatusResponse(policy_version=version, learner_id=learner_id, actors=actors)

    def metrics(self) -> list[Metric]:
        """What the relay exposes to Prometheus, read at each scrape."""
        version = self.broadcast.version
        with self.lock:
            lags = {actor_id: max(0, version - r.policy_version) for actor_id, r in self.routes.items()}
        return [
            Metric("relay_upstream_connected", "1 while the stream to the upstream is up and welcomed.", int(self.up)),
            Metric("relay_upstream_connects_total", "Upstream streams welcomed.", self.connects, counter=True),
            Metric("policy_version", "Newest policy version the relay holds.", version),
            Metric("connected_actors", "Actors behind the relay (directly or through relays below it).", len(lags)),
            Metric("relay_acks_total", "Acks passed on to the relay's actors, duplicates included.", self.acked,
                   counter=True),
            Metric("actor_lag", "Relay version minus the version each actor reported running.", lags),
        ]

