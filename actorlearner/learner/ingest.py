"""Batches into the replay exactly once: decode and check, wait for the rate limiter, reserve, write,
commit (or abort), and the ack decision; actors' episode statistics."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

import torch

from actorlearner import telemetry, wire
from actorlearner.learner.registry import ActorRegistry, ActorSession
from actorlearner.learner.roles import Roles
from actorlearner.replay import PrioritizedReplay, RateLimiter
from actorlearner.v1 import learner_pb2 as pb

COPY_UNLOCKED_BYTES = 1 << 18
"""Batches of at least this many bytes are copied into the replay outside its lock, so that several
streams copy at once; smaller ones in the same hold as the reserve and commit (one lock round, not two)."""

LIMITER_POLL_SECONDS = 0.25
"""How often a batch waiting on the rate limiter checks whether its stream or the learner ended."""


class IngestAborted(Exception):
    """A batch given up before it was stored, through no fault of the actor: its stream ended or
    the learner is draining. It was not acked, so the actor resends it."""


class Ingest:
    """Stores batches from many gRPC threads at once: each reserves its rows under ``replay_lock``,
    copies them without it (when large), and commits under it again.

    A snapshot closes the insert gate (:meth:`wait_for_open_inserts`) to see the replay with no
    insert open; :meth:`seal` refuses every later batch, so that none is acked after the final checkpoint.
    """

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], torch.dtype]], max_message_bytes: int,
                 replay: PrioritizedReplay, replay_lock: threading.Lock, limiter: RateLimiter,
                 registry: ActorRegistry, roles: Roles, telemetry_writer: telemetry.Telemetry,
                 stopping: threading.Event, current_version: Callable[[], int]):
        self.fields = {name: (tuple(shape), wire.np_dtype(dtype)) for name, (shape, dtype) in fields.items()}
        self.max_message_bytes = max_message_bytes
        self.replay, self.replay_lock, self.limiter = replay, replay_lock, limiter
        self.registry, self.roles, self.telemetry = registry, roles, telemetry_writer
        self.stopping, self.current_version = stopping, current_version
        # Signalled under replay_lock when an insert commits or the snapshot gate opens.
        self.inserts_changed = threading.Condition(replay_lock)
        self.gate_closed = False  # a checkpoint waits for open inserts: no new ones start meanwhile
        self.sealed = False  # set before the final checkpoint: later batches are refused, not acked
        self.inserted_batches = 0
        self.insert_meter = telemetry.RateMeter()
        self.env_steps = 0
        self.recent_return = math.nan
        self._stats_lock = threading.Lock()  # env_steps and recent_return, reported by every stream

    def ingest(self, session: ActorSession, batch: pb.TrajectoryBatch, payload: memoryview | None = None) -> bool:
        """Validate and insert a batch unless its seq was stored; True if inserted, False if a duplicate.
        ``payload``, when given, stands for ``batch.payload`` (a view of the received bytes, uncopied).

        Raises WireError for bad input, before anything is inserted. Waits on the rate
        limiter (backpressure that reaches the actor through gRPC flow control) until the
        stream ends or the learner drains (IngestAborted). The limiter counts only what was stored.
        """
        record = session.record
        record.last_seen = time.time()
        seq_table = self.registry.seq_table
        if self.registry.duplicate(session, batch.seq):
            return False
        newest = max(self.current_version(), session.hello_version)
        if not 0 <= batch.policy_version <= newest:
            raise wire.WireError(f"policy_version must be in [0, {newest}] (the newest version this learner or "
                                 f"the actor's Hello knows), got {batch.policy_version}")
        n = batch.num_transitions
        self.roles.check_batch(batch)
        arrays = wire.decode_batch(batch.payload if payload is None else payload, batch.codec, self.fields, n,
                                   self.max_message_bytes)
        priorities = wire.decode_priorities(batch.priorities, n)
        if priorities is None and session.priorities:
            raise wire.WireError("this stream's Settings.actor_priorities is true: every batch must carry "
                                 "one priority per transition")
        self._acquire_insert(session, n)
        reservation, inserted = None, False
        try:
            with self.replay_lock:
                while self.gate_closed:
                    self.inserts_changed.wait()
                if self.sealed:
                    raise IngestAborted("the learner is shutting down")
                previous = seq_table.get(record.actor_id, -1)
                if batch.seq > previous:  # not stored meanwhile by another stream: claim it
                    reservation = self.replay.reserve(arrays, priorities, policy_version=batch.policy_version)
                    seq_table[record.actor_id] = batch.seq
                    if sum(a.nbytes for a in arrays.values()) < COPY_UNLOCKED_BYTES:
                        self.replay.write(reservation)
                        inserted = self._commit(reservation, batch, record, n)
            if reservation is not None and not inserted:
                self.replay.write(reservation)  # no lock: other streams copy their batches meanwhile
                with self.replay_lock:
                    inserted = self._commit(reservation, batch, record, n)
        finally:
            if not inserted:
                self.limiter.refund_insert(n)
                if reservation is not None:  # the write failed: nothing of the batch is stored, it may come again
                    with self.replay_lock:
                        self.replay.abort(reservation)
                        if seq_table.get(record.actor_id) == batch.seq:
                            seq_table[record.actor_id] = previous
                        self.inserts_changed.notify_all()
        if not inserted:
            return False
        record.saw_version(batch.policy_version, self.current_version())
        record.batches.add()
        self.insert_meter.add(n)
        return True

    def _commit(self, reservation, batch: pb.TrajectoryBatch, record, n: int) -> bool:
        """Under replay_lock: make a written batch sampleable and count it, with its role's record: exactly once."""
        self.replay.commit(reservation)
        self.roles.record_batch(batch)
        self.inserted_batches += 1
        record.transitions += n
        self.inserts_changed.notify_all()
        return True

    def _acquire_insert(self, session: ActorSession, n: int) -> None:
        """Wait for the rate limiter's room for ``n`` items; IngestAborted once the stream or the learner ends."""
        while not self.limiter.acquire_insert(n, timeout=LIMITER_POLL_SECONDS):
            if self.stopping.is_set():
                raise IngestAborted("the learner is shutting down")
            if session.ended.is_set():
                raise IngestAborted("the stream ended")
        if session.ended.is_set():
            self.limiter.refund_insert(n)
            raise IngestAborted("the stream ended")

    def wait_for_open_inserts(self) -> None:
        """Under replay_lock: let open inserts finish while starting no new ones, for an instant with none open."""
        self.gate_closed = True
        try:
            self.inserts_changed.wait_for(lambda: self.replay.pending == 0)
        finally:
            self.gate_closed = False
            self.inserts_changed.notify_all()

    def seal(self) -> None:
        """Refuse every batch from now on (they stay unacked, and are resent to the next learner)."""
        with self.replay_lock:
            self.sealed = True

    def record_episodes(self, session: ActorSession, stats: pb.EpisodeStats) -> None:
        """Account an actor's env steps and finished episodes."""
        session.record.last_seen = time.time()
        session.record.saw_version(stats.policy_version, self.current_version())
        finished = [(r, n) for r, n in zip(stats.returns, stats.lengths) if math.isfinite(r)]
        with self._stats_lock:
            self.env_steps += stats.env_steps
            step = self.env_steps
            for ret, _ in finished:
                self.recent_return = ret if math.isnan(self.recent_return) else 0.9 * self.recent_return + 0.1 * ret
        for ret, length in finished:
            self.telemetry.scalars({telemetry.EPISODIC_RETURN: ret, telemetry.EPISODIC_LENGTH: length}, step)
