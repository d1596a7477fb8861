"""The actor's side of a Connect stream: bounded unacked window, resend on reconnect, latest policy slot."""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import OrderedDict

import grpc
import torch

from actorlearner import wire
from actorlearner.transport import SecurityConfig, grpc_options, open_channel
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)

# Statuses that mean "this actor can never be served": retrying would not help.
FATAL_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
               grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
               grpc.StatusCode.UNIMPLEMENTED}


CONNECT_METHOD = f"/{pb.DESCRIPTOR.services_by_name['Learner'].full_name}/Connect"


class LinkError(RuntimeError):
    """The learner refused this actor for good (wrong env spec, protocol, credentials...)."""


class LearnerLink:
    """Keeps one stream to the learner alive and carries batches, stats and policy updates.

    Batches stay in the unacked window until the learner acks them; after a reconnect
    the whole window is resent in seq order (the learner drops duplicates), so nothing
    acknowledged is lost and nothing is inserted twice. :meth:`send_batch` waits while
    the window is full: that is the actor's backpressure. Messages travel as serialized
    bytes (see ``wire.encode_batch_message``), so a resend costs no re-encoding.
    """

    def __init__(self, address: str, hello: pb.Hello, max_message_bytes: int,
                 reconnect_initial: float = 0.1, reconnect_max: float = 5.0, security: SecurityConfig | None = None):
        self.address = address
        self.security = security
        self.hello = hello
        self.max_message_bytes = max_message_bytes
        self.reconnect_initial, self.reconnect_max = reconnect_initial, reconnect_max
        self.welcome: pb.Welcome | None = None
        self.welcomed = threading.Event()
        self.connected = False  # a stream is up and welcomed
        self.error: LinkError | None = None
        self.reconnects = 0
        self.peak_unacked = 0  # the most batches the window ever held
        self._unacked: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Condition()
        self._requests: queue.Queue | None = None
        self._policy: tuple[int, dict[str, torch.Tensor]] | None = None
        self._held_version = hello.policy_version
        self._closing = threading.Event()
        self._call = None
        self._thread = threading.Thread(target=self._run, name="learner-link", daemon=True)

    def start(self) -> LearnerLink:
        self._thread.start()
        return self

    @property
    def max_unacked(self) -> int:
        return max(1, self.welcome.settings.max_unacked) if self.welcome else 1

    @property
    def unacked(self) -> int:
        with self._lock:
            return len(self._unacked)

    def send_batch(self, seq: int, message: bytes, timeout: float | None = None) -> bool:
        """Queue a serialized batch message (``wire.encode_batch_message``) once the window has
        room; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while len(self._unacked) >= self.max_unacked and not self._closing.is_set():
                self._raise_if_failed()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._lock.wait(0.2 if remaining is None else min(remaining, 0.2))
            self._raise_if_failed()
            self._unacked[seq] = message
            self.peak_unacked = max(self.peak_unacked, len(self._unacked))
            if self._requests is not None:
                self._requests.put(message)
        return True

    def send_stats(self, stats: pb.EpisodeStats) -> None:
        """Best effort: statistics are not resent after a reconnect."""
        with self._lock:
            if self._requests is not None:
                self._requests.put(pb.ActorMessage(episode_stats=stats).SerializeToString())

    def take_policy(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """The newest complete policy received since the last call, if any (older ones are skipped)."""
        with self._lock:
            policy, self._policy = self._policy, None
            return policy

    def set_held_version(self, version: int) -> None:
        """The version the actor now runs: reported in the next Hello."""
        self._held_version = version

    def flush(self, timeout: float) -> bool:
        """Wait until every sent batch is acked; False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._unacked and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(min(remaining, 0.2))
            return not self._unacked

    def close(self) -> None:
        """End the stream and stop reconnecting."""
        self._closing.set()
        with self._lock:
            self._end_requests()
            self._lock.notify_all()
        if self._call is not None:
            self._call.cancel()
        self._thread.join(timeout=5)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _end_requests(self) -> None:
        if self._requests is not None:
            self._requests.put(None)
            self._requests = None

    def _run(self) -> None:
        """Connect, serve the stream until it breaks, back off with jitter, repeat."""
        delay = self.reconnect_initial
        # A channel of our own per attempt, with no subchannel shared with earlier channels:
        # otherwise a new channel can inherit gRPC's own (growing) reconnect backoff.
        options = grpc_options(self.max_message_bytes) + [("grpc.use_local_subchannel_pool", 1)]
        while not self._closing.is_set():
            with open_channel(self.address, self.security, options) as channel:
                try:
                    if self._serve_stream(channel):
                        delay = self.reconnect_initial  # the stream worked: start backoff afresh
                except grpc.RpcError as exc:
                    if exc.code() in FATAL_CODES:
                        self._fail(LinkError(f"learner at {self.address} refused this actor: "
                                             f"{exc.code().name}: {exc.details()}"))
                        return
                    if not self._closing.is_set():
                        logger.info("stream to %s broke (%s); reconnecting in %.2fs",
                                    self.address, exc.code().name, delay)
                except wire.WireError as exc:
                    logger.warning("bad policy update from learner: %s; reconnecting", exc)
            with self._lock:
                self._end_requests()
            if self._closing.wait(delay * random.uniform(0.5, 1.5)):
                return
            delay = min(delay * 2, self.reconnect_max)
            self.reconnects += 1

    def _serve_stream(self, channel: grpc.Channel) -> bool:
        """One stream: Hello, resend the window, then read until it ends; True if it was welcomed."""
        requests: queue.Queue = queue.Queue()
        hello = pb.Hello()
        hello.CopyFrom(self.hello)
        hello.policy_version = self._held_version
        requests.put(pb.ActorMessage(hello=hello).SerializeToString())
        with self._lock:
            for message in self._unacked.values():
                requests.put(message)
            self._requests = requests
        assembler = wire.ChunkAssembler(self.max_message_bytes * 64)
        connect = channel.stream_stream(CONNECT_METHOD, request_serializer=None,  # requests are bytes already
                                        response_deserializer=pb.LearnerMessage.FromString)
        self._call = connect(_drain(requests))
        try:
            return self._read(self._call, assembler)
        finally:
            self.connected = False
            self._call.cancel()

    def _read(self, call, assembler: wire.ChunkAssembler) -> bool:
        """Handle the learner's messages until the stream ends; True if it was welcomed."""
        welcomed = False
        for message in call:
            kind = message.WhichOneof("kind")
            if kind == "ack":
                with self._lock:
                    self._unacked.pop(message.ack.seq, None)
                    self._lock.notify_all()
            elif kind == "policy_update":
                update = message.policy_update
                payload = assembler.add(update.version, update.chunk_index, update.chunk_count,
                                        update.total_bytes, update.payload)
                if payload is not None:
                    state = wire.decode_state_dict(payload, max_bytes=len(payload))
                    with self._lock:
                        self._policy = (update.version, state)
            elif kind == "welcome":
                self.welcome, welcomed = message.welcome, True
                self.connected = True
                self.welcomed.set()
            elif kind == "shutdown":
                logger.info("learner is shutting down: %s", message.shutdown.reason)
                break
        return welcomed

    def _fail(self, error: LinkError) -> None:
        with self._lock:
            self.error = error
            self._lock.notify_all()
        self.welcomed.set()  # release anyone waiting for a Welcome that will never come


def _drain(requests: queue.Queue):
    """The request side of a stream: messages until a None arrives."""
    while (message := requests.get()) is not None:
        yield message
