"""The self-play league as a relay passes it on: the upstream's newest LeagueUpdate and the snapshot weights
it names, each received once on the relay's own stream and sent once on every stream below that follows it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from actorlearner.league.league import unsent_weights
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)


class RelayLeague:
    """What the relay holds of its upstream's league. ``on_change`` is called whenever :attr:`revision` rises."""

    def __init__(self, on_change: Callable[[], None]):
        self.on_change = on_change
        self._lock = threading.Lock()
        self.revision = 0
        self._update: bytes | None = None  # the newest LeagueUpdate, serialized
        self._snapshots: dict[str, list[bytes]] = {}  # opponent id -> its weights' PolicyUpdate chunks, serialized
        self._partial: tuple[str, int, list[bytes]] | None = None  # (opponent, version, chunks so far); upstream only

    def add_chunk(self, message: pb.LearnerMessage) -> None:
        """One chunk of a snapshot's weights (a PolicyUpdate naming its ``opponent``), from the upstream stream
        (its only caller). A snapshot is kept once its last chunk comes; chunks out of order start it again."""
        update = message.policy_update
        if update.chunk_index == 0:
            self._partial = (update.opponent, update.version, [])
        partial = self._partial
        if partial is None or partial[:2] != (update.opponent, update.version) or len(partial[2]) != update.chunk_index:
            logger.warning("snapshot %s: chunk %d of %d out of order, dropped", update.opponent, update.chunk_index,
                           update.chunk_count)
            self._partial = None
            return
        partial[2].append(message.SerializeToString())
        if len(partial[2]) == update.chunk_count:
            with self._lock:
                self._snapshots[update.opponent] = partial[2]
            self._partial = None

    def update(self, message: pb.LearnerMessage) -> None:
        """The upstream's new LeagueUpdate: it replaces the menu, and snapshots it no longer names are dropped."""
        named = {opponent.id for opponent in message.league.opponents}
        with self._lock:
            for opponent in set(self._snapshots) - named:
                del self._snapshots[opponent]
            self._update = message.SerializeToString()
            self.revision += 1
        self.on_change()

    def clear(self) -> None:
        """The upstream stream ended: a new one sends the league again from the start."""
        with self._lock:
            self._update, self._snapshots, self._partial = None, {}, None

    def menu(self, sent: set[str]) -> tuple[int, list[bytes]]:
        """``(revision, messages)`` bringing a stream that holds the snapshot weights ``sent`` up to date: the
        weights of snapshots it lacks, then the LeagueUpdate (none before the upstream sent one); ``sent`` is
        updated in place."""
        with self._lock:
            if self._update is None:
                return self.revision, []
            return self.revision, [*unsent_weights(self._snapshots, sent), self._update]
