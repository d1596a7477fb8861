"""The actor's side of a Connect stream: bounded unacked window, resend on reconnect, latest policy slot.

The link keeps the newest Welcome and hands it over as it came: the actor checks its settings and
builds its network. Policy updates are decoded here, on the reader thread, and handed over together
with the Welcome they arrived under, so the actor can check them against that Welcome's network and
never load weights into a network built for another.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

import grpc
import torch

from actorlearner import wire
from actorlearner.algorithms import fixed_config_json
from actorlearner.streaming.reconnect import Reconnecting, Refused
from actorlearner.streaming.service import CONNECT_METHOD
from actorlearner.transport import SecurityConfig
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)


class LinkError(Refused):
    """The learner refused this actor for good (wrong env spec, protocol, credentials...), or
    sent settings or weights this actor cannot apply."""


def policy_key(settings: pb.Settings) -> tuple[str, str]:
    """What decides the network: the algorithm and its config but for the runtime-tunable options."""
    return settings.algorithm, fixed_config_json(settings.algorithm, settings.algorithm_config)


class ReceivedPolicy(NamedTuple):
    """A complete policy update (decoded, not yet checked against any network) and the Welcome in force
    when it arrived; ``opponent`` names a league snapshot's."""

    version: int
    state: dict[str, torch.Tensor]
    welcome: pb.Welcome
    opponent: str = ""


class LearnerLink(Reconnecting):
    """Keeps one stream to the learner alive and carries batches, stats and policy updates.

    Batches stay in the unacked window until the learner acks them; after a reconnect
    the whole window is resent in seq order (the learner drops duplicates), so nothing
    acknowledged is lost and nothing is inserted twice. :meth:`send_batch` waits while
    the window is full: that is the actor's backpressure. Messages travel as serialized
    bytes (see ``wire.encode_batch_message``), so a resend costs no re-encoding: a batch
    keeps its seq, size and codec even when a later Welcome changes the settings.

    Once welcomed, every Hello names the algorithm and batch fields of the newest Welcome:
    what this actor holds. A learner running another algorithm refuses it for good; so does
    the actor (:meth:`refuse`) for settings or weights it cannot apply. ``on_league``, if given,
    gets each LeagueUpdate and each complete league snapshot (a ReceivedPolicy naming its
    opponent) in order, on the reader thread; without it they are dropped.

    ``Hello.policy_version`` is the version the actor runs, or the newest version of a batch
    in the window if that is newer (a learner restarted from an older checkpoint accepts
    batch versions up to its Hello's). A learner sends no weights for a version the Hello
    names; when those it has in mind do not fit the network of the weights the actor holds
    (:meth:`hold`), the link reconnects once with -1 to get them.
    """

    def __init__(self, address: str, hello: pb.Hello, max_message_bytes: int,
                 reconnect_initial: float = 0.1, reconnect_max: float = 5.0, security: SecurityConfig | None = None,
                 on_league: Callable[[pb.LeagueUpdate | ReceivedPolicy], None] | None = None):
        super().__init__(address, security, max_message_bytes, reconnect_initial, reconnect_max, "learner-link")
        self.hello = hello
        self.on_league = on_league
        self.welcome: pb.Welcome | None = None  # the newest
        self.welcomed = threading.Event()
        self.connected = False  # a stream is up and welcomed
        self.error: LinkError | None = None
        self.welcomes = 0  # Welcomes received, over all streams
        self.peak_unacked = 0  # the most batches the window ever held
        self.waited = 0.0  # seconds send_batch spent waiting for room in the window
        self._unacked: OrderedDict[int, tuple[bytes, int]] = OrderedDict()  # seq -> (message, policy version)
        self._lock = threading.Condition()
        self._requests: queue.Queue | None = None
        self._policy: ReceivedPolicy | None = None  # always of the newest Welcome's network
        self._held_version = hello.policy_version
        self._held_key: tuple[str, str] | None = None  # policy_key of the Welcome whose weights the actor runs
        self._ask_for_weights = False  # the next Hello says -1: the learner withheld weights we need

    @property
    def max_unacked(self) -> int:
        return max(1, self.welcome.settings.max_unacked) if self.welcome else 1

    @property
    def unacked(self) -> int:
        with self._lock:
            return len(self._unacked)

    def send_batch(self, seq: int, message: bytes, timeout: float | None = None, policy_version: int = -1) -> bool:
        """Queue a serialized batch message (``wire.encode_batch_message``, made by ``policy_version``)
        once the window has room; False if ``timeout`` passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while len(self._unacked) >= self.max_unacked and not self._closing.is_set():
                self._raise_if_failed()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                waiting_since = time.perf_counter()
                self._lock.wait(0.2 if remaining is None else min(remaining, 0.2))
                self.waited += time.perf_counter() - waiting_since
            self._raise_if_failed()
            self._unacked[seq] = (message, policy_version)
            self.peak_unacked = max(self.peak_unacked, len(self._unacked))
            if self._requests is not None:
                self._requests.put(message)
        return True

    def send_stats(self, stats: pb.EpisodeStats) -> None:
        """Best effort: statistics are not resent after a reconnect."""
        with self._lock:
            if self._requests is not None:
                self._requests.put(pb.ActorMessage(episode_stats=stats).SerializeToString())

    def take_policy(self) -> ReceivedPolicy | None:
        """The newest complete policy received since the last call, if any (older ones are skipped).

        It fits the network of the Welcome current when it is taken: a Welcome that changes the
        network drops any policy not taken yet.
        """
        with self._lock:
            policy, self._policy = self._policy, None
            return policy

    def hold(self, policy: ReceivedPolicy) -> None:
        """The actor now runs ``policy``: its version goes into the next Hello, and its Welcome's
        network decides whether a Welcome that withholds that version's weights must be asked again."""
        with self._lock:
            self._held_version = policy.version
            self._held_key = policy_key(policy.welcome.settings)

    def refuse(self, error: LinkError) -> None:
        """The actor cannot apply what the learner sent (``error`` says what): stop for good."""
        self._refused(error)
        self.close()

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
        super().close()

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def _end_requests(self) -> None:
        if self._requests is not None:
            self._requests.put(None)
            self._requests = None

    def _stream_ended(self, reason: str) -> None:
        with self._lock:
            self._end_requests()

    def _refusal(self, exc: grpc.RpcError) -> LinkError:
        return LinkError(f"learner at {self.address} refused this actor: {exc.code().name}: {exc.details()}")

    def _serve_stream(self, channel: grpc.Channel) -> None:
        """One stream: Hello, resend the window, then read until it ends."""
        requests: queue.Queue = queue.Queue()
        hello = pb.Hello()
        hello.CopyFrom(self.hello)
        with self._lock:
            hello.policy_version = -1 if self._ask_for_weights else max(
                [self._held_version, *(version for _, version in self._unacked.values())])
            self._ask_for_weights = False
            requests.put(pb.ActorMessage(hello=hello).SerializeToString())
            for message, _ in self._unacked.values():
                requests.put(message)
            self._requests = requests
        assembler = wire.ChunkAssembler(self.max_message_bytes * 64)
        connect = channel.stream_stream(CONNECT_METHOD, request_serializer=None,  # requests are bytes already
                                        response_deserializer=pb.LearnerMessage.FromString)
        call = self._open_stream(connect, requests)
        if call is None:  # closing
            return
        try:
            self._read(call, assembler, hello.policy_version)
        finally:
            self.connected = False

    def _read(self, call, assembler: wire.ChunkAssembler, hello_version: int) -> None:
        """Handle the learner's messages until the stream ends."""
        snapshots = wire.ChunkAssembler(self.max_message_bytes * 64)  # league snapshots' weights (self-play)
        for message in call:
            kind = message.WhichOneof("kind")
            if kind == "ack":
                with self._lock:
                    self._unacked.pop(message.ack.seq, None)
                    self._lock.notify_all()
            elif kind == "policy_update":
                update = message.policy_update
                chunks = snapshots if update.opponent else assembler
                payload = chunks.add(update.version, update.chunk_index, update.chunk_count,
                                     update.total_bytes, update.payload)
                if payload is not None:
                    self._receive_policy(update.version, payload, update.opponent)
            elif kind == "league":
                if self.on_league is not None:
                    self.on_league(message.league)
            elif kind == "welcome":
                self._start_session(message.welcome)
                self.connects += not self.connected
                self.connected = True
                self.welcomes += 1
                self.welcomed.set()
                if self._weights_withheld(message.welcome, hello_version):
                    break
            elif kind == "shutdown":
                logger.info("learner is shutting down: %s", message.shutdown.reason)
                break

    def _start_session(self, welcome: pb.Welcome) -> None:
        """Make ``welcome`` the newest: its window applies at once, and a not yet taken policy is
        dropped unless the network stays (a Welcome that changes only runtime-tunable options)."""
        with self._lock:
            if self.welcome is None or policy_key(self.welcome.settings) != policy_key(welcome.settings):
                self._policy = None
            self.welcome = welcome
            self.hello.algorithm = welcome.settings.algorithm
            self.hello.ClearField("batch_fields")
            self.hello.batch_fields.extend(welcome.batch_fields)
            self._lock.notify_all()  # the window may have grown

    def _weights_withheld(self, welcome: pb.Welcome, hello_version: int) -> bool:
        """Whether the learner sends no weights (our Hello named its version) although the
        ones we run do not fit its network; if so, the next Hello asks for them with -1."""
        with self._lock:
            if (self._held_key is None or hello_version < 0 or welcome.policy_version != hello_version
                    or self._held_key == policy_key(welcome.settings)):
                return False
            self._ask_for_weights = True
        logger.info("learner %s holds version %d of another network than this actor runs and sends no weights "
                    "for it; reconnecting to ask for them", welcome.learner_id, welcome.policy_version)
        return True

    def _receive_policy(self, version: int, payload: bytes, opponent: str = "") -> None:
        """Decode a complete update and put it in the slot (or, for a league snapshot named ``opponent``,
        hand it to ``on_league``)."""
        welcome = self.welcome
        if welcome is None:
            raise wire.WireError("a policy update came before the Welcome")
        received = ReceivedPolicy(version, wire.decode_state_dict(payload, max_bytes=len(payload)), welcome, opponent)
        if opponent:
            if self.on_league is not None:
                self.on_league(received)
            return
        with self._lock:
            self._policy = received

    def _refused(self, error: LinkError) -> None:
        with self._lock:
            self.error = error
            self._end_requests()
            self._lock.notify_all()
        self.welcomed.set()  # release anyone waiting for a Welcome that will never come

