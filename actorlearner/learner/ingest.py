"""Batches into the replay exactly once: decode and check against the fields and the stream's Settings,
then the replay service's insert, and the ack decision; actors' episode statistics."""

from __future__ import annotations

import math
import time

import torch

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.learner.progress import Progress
from actorlearner.learner.registry import ActorRegistry, ActorSession
from actorlearner.learner.replay_service import ReplayService
from actorlearner.learner.roles import Roles
from actorlearner.v1 import learner_pb2 as pb


class Ingest:
    """Checks each batch (from many gRPC threads at once) and hands it to the replay service, with its
    role's record and the counts made as it commits."""

    def __init__(self, config: LearnerConfig, fields: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 replay: ReplayService, registry: ActorRegistry, roles: Roles, progress: Progress):
        self.fields = {name: (tuple(shape), wire.np_dtype(dtype)) for name, (shape, dtype) in fields.items()}
        self.max_message_bytes = config.max_message_bytes
        self.replay, self.registry, self.roles, self.progress = replay, registry, roles, progress
        self.inserted_batches = 0

    def ingest(self, session: ActorSession, batch: pb.TrajectoryBatch, payload: memoryview | None = None) -> bool:
        """Validate and insert a batch unless its seq was stored; True if inserted, False if a duplicate.
        ``payload``, when given, stands for ``batch.payload`` (a view of the received bytes, uncopied).

        Raises WireError for bad input, before anything is inserted. Waits on the rate
        limiter (backpressure that reaches the actor through gRPC flow control) until the
        stream ends or the learner drains (InsertAborted). The limiter counts only what was stored.
        """
        record = session.record
        record.last_seen = time.time()
        if self.registry.duplicate(session, batch.seq, self.replay.stored_seq(record.actor_id)):
            return False
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

        def committed() -> None:  # under the replay's lock: exactly once per stored batch
            self.roles.record_batch(batch)
            self.inserted_batches += 1
            record.transitions += n
            self.progress.count_steps(batch.env_steps)

        if not self.replay.insert(record.actor_id, batch.seq, arrays, n, priorities, batch.policy_version,
                                  session.ended, committed):
            return False
        record.saw_version(batch.policy_version, self.progress.version)
        record.batches.add()
        return True

    def report(self, response: pb.StatusResponse) -> None:
        response.inserted = self.inserted_batches

    def record_episodes(self, session: ActorSession, stats: pb.EpisodeStats) -> None:
        """Account an actor's env steps and finished episodes."""
        session.record.last_seen = time.time()
        session.record.saw_version(stats.policy_version, self.progress.version)
        self.progress.count_episodes(stats.env_steps, ((r, n) for r, n in zip(stats.returns, stats.lengths)
                                                       if math.isfinite(r)))
