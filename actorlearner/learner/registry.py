"""The actors the learner knows: their records and streams, Ape-X indices and time to live."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from actorlearner import telemetry
from actorlearner.config import LearnerConfig
from actorlearner.metrics import Metric
from actorlearner.v1 import learner_pb2 as pb

@dataclass
class ActorRecord:
    """What the learner knows of one actor id, across reconnects, until it has been gone ``actor_ttl``."""

    actor_id: str
    index: int | None = None  # Ape-X index, distinct among connected actors; kept as a preference after
    policy_version: int = -1
    sessions: int = 0  # open sessions: a reconnect may open the new one before the old one closes
    last_seen: float = field(default_factory=time.time)
    duplicates: int = 0  # batches acked as duplicates, over all streams
    transitions: int = 0  # stored from this actor
    batches: telemetry.RateMeter = field(default_factory=telemetry.RateMeter)  # stored batches; .total counts them
    via: str = ""  # the relay its newest stream comes through; empty if direct
    relay: bool = False  # a relay's own stream: it takes no Ape-X index

    @property
    def connected(self) -> bool:
        return self.sessions > 0

    def saw_version(self, version: int, newest: int) -> None:
        """The actor reported running ``version``; counted at most as the learner's ``newest`` (lag >= 0)."""
        self.policy_version = max(self.policy_version, min(version, newest))


@dataclass
class ActorSession:
    """One actor's session with the learner, from its Hello to its end: on a stream of its own or joined
    through a relay's stream."""

    record: ActorRecord
    hello_version: int  # the policy version the actor held when it opened the stream
    priorities: bool = False  # its Welcome said actor_priorities: every batch must carry them
    ended: threading.Event = field(default_factory=threading.Event)  # set when the session is over
    duplicates: int = 0  # batches acked as duplicates in this session


class ActorRegistry:
    """Actor records by id, under :attr:`lock`, until they have been gone ``actor_ttl``
    (:meth:`drop_departed`, which the exactly-once part calls with the seqs it forgets)."""

    def __init__(self, config: LearnerConfig):
        self.num_actors = config.num_actors
        self.lock = threading.Lock()
        self.actors: dict[str, ActorRecord] = {}

    def connect(self, hello: pb.Hello, via: str, version: int, priorities: bool) -> ActorSession:
        """Open a stream for an actor id (known or new), directly or through relay ``via``, while the
        learner's version is ``version``; while connected an actor (not a relay) holds a distinct Ape-X index.
        ``priorities``: whether the session's batches must carry their priorities."""
        with self.lock:
            record = self.actors.get(hello.actor_id)
            if record is None:
                record = self.actors[hello.actor_id] = ActorRecord(hello.actor_id)
            record.via, record.relay = via, hello.relay
            if record.sessions == 0 and not hello.relay:
                record.index = self._free_index(record.index)
            record.sessions += 1
            record.last_seen = time.time()
            record.policy_version = min(hello.policy_version, version)
            return ActorSession(record, hello.policy_version, priorities)

    def disconnect(self, session: ActorSession) -> None:
        session.ended.set()
        with self.lock:
            session.record.sessions -= 1
            session.record.last_seen = time.time()

    def drop_departed(self, cutoff: float, forget: Callable[[list[str]], None]) -> list[str]:
        """Drop the actors gone since before ``cutoff`` (a time) and call ``forget`` with their ids inside the
        same hold of the lock, so that none of them can reconnect in between; their ids. One that comes back
        later is new."""
        with self.lock:
            gone = [r.actor_id for r in self.actors.values() if not r.connected and r.last_seen < cutoff]
            for actor_id in gone:
                del self.actors[actor_id]
            forget(gone)
        return gone

    def _free_index(self, previous: int | None) -> int:
        """The Ape-X index for an actor (re)connecting: its previous one if free, else the least used."""
        n = max(self.num_actors, 1)
        taken = Counter(r.index for r in self.actors.values() if r.connected)
        if previous is not None and previous < n and not taken[previous]:
            return previous
        return min(range(n), key=lambda i: (taken[i], i))

    def records(self) -> list[ActorRecord]:
        """Every remembered actor, now."""
        with self.lock:
            return list(self.actors.values())

    def remember(self, actor_ids: Iterable[str]) -> None:
        """Actors of a restored checkpoint, remembered as gone since the restore."""
        self.actors = {actor_id: ActorRecord(actor_id) for actor_id in actor_ids}

    def report(self, response: pb.StatusResponse) -> None:
        """Every actor remembered, with its lag behind ``response.policy_version``."""
        version = response.policy_version
        response.actors.extend(
            pb.ActorStatus(actor_id=r.actor_id, policy_version=r.policy_version, lag=version - r.policy_version,
                           batches_per_second=r.batches.rate(), last_seen_unix=r.last_seen, connected=r.connected,
                           duplicates=r.duplicates, inserted=int(r.batches.total), transitions=r.transitions,
                           via=r.via, relay=r.relay)
            for r in self.records())

    def metrics(self, version: int) -> list[Metric]:
        """Connected and known actors, and each connected one's lag behind ``version``."""
        records = self.records()
        connected = [r for r in records if r.connected and not r.relay]  # actors behind relays count, relays not
        return [
            Metric("connected_actors", "Actors with an open stream.", len(connected)),
            Metric("known_actors", "Actor ids remembered (connected, or gone less than actor_ttl ago).", len(records)),
            Metric("actor_lag", "Learner version minus the version each connected actor runs.",
                   {r.actor_id: version - r.policy_version for r in connected}),
        ]

    def lag_max(self, version: int) -> int:
        """The largest lag of a connected actor (or relay) behind ``version``."""
        return max((version - r.policy_version for r in self.records() if r.connected), default=0)
