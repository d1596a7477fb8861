"""Exactly-once ingest: the highest stored seq of each actor id, resends counted and told apart from new
batches, and the seqs of actors gone longer than ``actor_ttl`` forgotten; saved and restored as one piece."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from actorlearner.config import LearnerConfig
from actorlearner.learner.registry import ActorRegistry, ActorSession

logger = logging.getLogger(__name__)

EXPIRE_EVERY_SECONDS = 1.0
"""Least time between two looks for departed actors."""


class ExactlyOnce:
    """The seq table (actor id -> highest stored seq). The replay service claims a seq as it reserves a
    batch's rows and releases it when the store fails, both under its own lock, so that the table always
    matches the buffer; :meth:`expire` drops the actors the registry has seen gone longer
    than ``actor_ttl`` with their seqs (an actor id that comes back later is new)."""

    def __init__(self, config: LearnerConfig, registry: ActorRegistry):
        self.actor_ttl, self.max_unacked, self.registry = config.actor_ttl, config.max_unacked, registry
        self._seqs: dict[str, int] = {}
        self._lock = threading.Lock()
        self._last_expiry = 0.0

    def stored(self, actor_id: str) -> int:
        """The highest seq stored from ``actor_id`` (-1 for none)."""
        return self._seqs.get(actor_id, -1)

    def duplicate(self, session: ActorSession, seq: int) -> bool:
        """Whether ``seq`` was stored already: a resend, counted on the session and the actor. More of them on
        one stream than a window suggests the actor's seqs restarted below what it sent before, so that
        nothing it sends is stored: warned once per stream (and counted in status). Not refused: a learner
        restarted with a smaller window cannot tell that from a legal resend of the actor's older, larger window."""
        stored = self.stored(session.record.actor_id)
        if seq > stored:
            return False
        session.duplicates += 1
        session.record.duplicates += 1
        if session.duplicates == self.max_unacked + 1:
            logger.warning("actor %s: %d batches on one stream had seqs not above %d, the highest stored for this "
                           "actor_id: more than a window (%d). If the actor's seqs restarted, nothing it sends is "
                           "stored: it must continue above %d or use a new actor_id", session.record.actor_id,
                           session.duplicates, stored, self.max_unacked, stored)
        return True

    def claim_seq(self, actor_id: str, seq: int) -> None:
        """Record ``seq`` as the highest stored from ``actor_id`` (the replay service checked it is above)."""
        with self._lock:
            self._seqs[actor_id] = seq

    def release_seq(self, actor_id: str, seq: int, previous: int) -> None:
        """Give back a :meth:`claim_seq` whose batch was not stored after all: ``seq`` may come again."""
        with self._lock:
            if self._seqs.get(actor_id) == seq:
                self._seqs[actor_id] = previous

    def expire(self) -> None:
        """Forget the actors gone longer than ``actor_ttl``, records and seqs (at most once a second).

        Every pod restart on Kubernetes is a new actor id: without this, both would grow forever.
        """
        now = time.time()
        if now - self._last_expiry < EXPIRE_EVERY_SECONDS:
            return
        self._last_expiry = now
        gone = self.registry.drop_departed(now - self.actor_ttl, self._forget)
        if gone:
            logger.info("forgot %d actors gone longer than %.0f s", len(gone), self.actor_ttl)

    def _forget(self, actor_ids: list[str]) -> None:
        with self._lock:
            for actor_id in actor_ids:
                self._seqs.pop(actor_id, None)

    @property
    def seq_table(self) -> dict[str, int]:
        """A copy of the table."""
        with self._lock:
            return dict(self._seqs)

    def state(self) -> dict:
        """What a checkpoint keeps (take it while the replay is quiesced, to match the buffer)."""
        return {"seq_table": self.seq_table}

    def load_state(self, state: Mapping) -> None:
        """A checkpoint's table; its actors are remembered as gone since the restore."""
        with self._lock:
            self._seqs = {str(k): int(v) for k, v in state["seq_table"].items()}
        self.registry.remember(self._seqs)
