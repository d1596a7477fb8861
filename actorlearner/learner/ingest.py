"""Batches into the replay exactly once: decode and check against the fields and the stream's Settings,
then the replay service's insert, and the ack decision; actors' episode statistics."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.progress import Progress
from actorlearner.learner.exactly_once import ExactlyOnce
from actorlearner.learner.figures import Figure
from actorlearner.learner.registry import ActorSession
from actorlearner.learner.replay_service import ReplayService
from actorlearner.learner.roles import Roles
from actorlearner.v1 import learner_pb2 as pb


class Ingest:
    """Checks each batch (from the serving loop or any thread) and hands it to the replay service, with its
    role's record and the counts made as it commits."""

    def __init__(self, config: LearnerConfig, fields: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 replay: ReplayService, exactly_once: ExactlyOnce, roles: Roles, progress: Progress):
        self.fields = {name: (tuple(shape), wire.np_dtype(dtype)) for name, (shape, dtype) in fields.items()}
        self.max_message_bytes = config.max_message_bytes
        self.replay, self.exactly_once, self.roles, self.progress = replay, exactly_once, roles, progress
        self.inserted_batches = 0

    def ingest(self, session: ActorSession, batch: pb.TrajectoryBatch, payload: memoryview | None = None) -> bool:
        """Validate and insert a batch unless its seq was stored; True if inserted, False if a duplicate.
        ``payload``, when given, stands for ``batch.payload`` (a view of the received bytes, uncopied).

        Raises WireError for bad input, before anything is inserted. Waits on the rate
        limiter (backpressure that reaches the actor through gRPC flow control) until the
        stream ends or the learner drains (InsertAborted). The limiter counts only what was stored.
        """
        checked = self._check(session, batch, payload)
        return checked is not None and self._stored(session, batch, self.replay.insert(
            session.record.actor_id, batch.seq, *checked, batch.policy_version, session.ended,
            self._committed(session, batch)))

    async def ingest_async(self, session: ActorSession, batch: pb.TrajectoryBatch,
                           payload: memoryview | None = None) -> bool:
        """:meth:`ingest` for a stream served on an event loop: the wait on the rate limiter does not block the
        loop, and cancelling it (the stream ended) gives the batch up, unacked."""
        checked = self._check(session, batch, payload)
        return checked is not None and self._stored(session, batch, await self.replay.insert_async(
            session.record.actor_id, batch.seq, *checked, batch.policy_version, self._committed(session, batch)))

    def _check(self, session: ActorSession, batch: pb.TrajectoryBatch,
               payload: memoryview | None) -> tuple[dict, int, object] | None:
        """The batch's arrays, size and priorities, checked; None for a duplicate. WireError for bad input."""
        record = session.record
        record.last_seen = time.time()
        if self.exactly_once.duplicate(session, batch.seq):
            return None
        newest = max(self.progress.version, session.hello_version)
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
        return arrays, n, priorities

    def _committed(self, session: ActorSession, batch: pb.TrajectoryBatch) -> Callable[[], None]:
        """What runs under the replay's lock as the batch is stored: exactly once per stored batch."""
        def committed() -> None:
            self.roles.record_batch(batch)
            self.inserted_batches += 1
            session.record.transitions += batch.num_transitions
            self.progress.count_steps(batch.env_steps)

        return committed

    def _stored(self, session: ActorSession, batch: pb.TrajectoryBatch, inserted: bool) -> bool:
        if inserted:
            session.record.saw_version(batch.policy_version, self.progress.version)
            session.record.batches.add()
        return inserted

    def figures(self) -> list[Figure]:
        return [Figure(lambda: self.inserted_batches, status="inserted")]

    def record_episodes(self, session: ActorSession, stats: pb.EpisodeStats) -> None:
        """Account an actor's env steps and finished episodes."""
        session.record.last_seen = time.time()
        session.record.saw_version(stats.policy_version, self.progress.version)
        self.progress.count_episodes(stats.env_steps, ((r, n) for r, n in zip(stats.returns, stats.lengths)
                                                       if math.isfinite(r)))
