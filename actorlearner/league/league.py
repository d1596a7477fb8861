"""The learner's league: snapshots of past policies, scripted players, their records and Elo ratings.

Members are drawn by actors in proportion to the weights of the newest :meth:`League.menu`.
Every change that actors should see (a snapshot taken or dropped, weights recomputed after
new games) raises :attr:`League.revision`; each stream sends the menu again when it is behind.
Results come in batches and are counted with them, exactly once (see learner.proto, Self-play).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from actorlearner import wire
from actorlearner.config import LeagueConfig
from actorlearner.league.ratings import INITIAL_RATING, SCORES, Record, elo_update, pfsp_weight
from actorlearner.metrics import Metric
from actorlearner.streaming.broadcast import policy_update_messages
from actorlearner.v1 import learner_pb2 as pb

T = TypeVar("T")

SELF = "self"
"""The id of the current policy as an opponent."""
OUTCOMES = {pb.OUTCOME_WIN: "win", pb.OUTCOME_DRAW: "draw", pb.OUTCOME_LOSS: "loss"}
OUTCOME_CODES = {name: code for code, name in OUTCOMES.items()}
REWEIGH_SECONDS = 2.0
"""Least time between menus sent only because new games moved the PFSP weights."""
MAX_ID_CHARS = 256
MAX_GAMES_PER_BATCH = 65536
"""More games than this in one batch is malformed (an R2D2 sequence row can span many short games)."""
MAX_OPPONENTS_PER_BATCH = 1024


def snapshot_id(version: int) -> str:
    return f"v{version}"


@dataclass
class Member:
    """One opponent: the current policy, a snapshot of a past version, or a scripted player."""

    id: str
    version: int = -1
    script: str = ""
    rating: float = INITIAL_RATING
    record: Record = field(default_factory=Record)
    transitions: int = 0
    payload: bytes = b""  # a snapshot's serialized state dict
    messages: list[pb.LearnerMessage] = field(default_factory=list)  # its weights as chunked PolicyUpdates

    @property
    def snapshot(self) -> bool:
        return self.version >= 0


class League:
    """Snapshots every ``snapshot_every`` versions (at most ``max_snapshots``), scripted players, ratings.

    Thread-safe: ingest threads record games, the trainer takes snapshots, streams read menus.
    ``on_change`` is called (outside the lock) whenever :attr:`revision` rises.
    """

    def __init__(self, config: LeagueConfig, chunk_bytes: int, on_change: Callable[[], None] = lambda: None):
        self.config = config
        self.chunk_bytes = chunk_bytes
        self.on_change = on_change
        self.rating = INITIAL_RATING
        self.games = 0
        self.unrated_games = 0
        self.revision = 1
        self.members: dict[str, Member] = {SELF: Member(SELF)}
        for script in config.scripted_players():
            self.members[script] = Member(script, script=script)
        self._lock = threading.Lock()
        self._reweighed = time.monotonic()
        self._weights: dict[str, float] = {}
        self._reweigh()
        self.evaluation: list[pb.EvalRecord] = []  # the latest evaluation's results

    # -- snapshots ------------------------------------------------------------------------

    def published(self, version: int, payload: bytes) -> bool:
        """A new policy version went out; every ``snapshot_every`` versions it joins the league. True if it did."""
        if version <= 0 or version % self.config.snapshot_every:
            return False
        with self._lock:
            if snapshot_id(version) in self.members:  # published again after a resume
                return False
            self._add_snapshot(version, payload, self.rating)
            self._bump()
        self.on_change()
        return True

    def _add_snapshot(self, version: int, payload: bytes, rating: float, record: Record | None = None,
                      transitions: int = 0) -> None:
        member_id = snapshot_id(version)
        messages = policy_update_messages(version, payload, self.chunk_bytes, opponent=member_id)
        self.members[member_id] = Member(member_id, version=version, rating=rating, record=record or Record(),
                                         transitions=transitions, payload=payload, messages=messages)
        snapshots = [m for m in self.members.values() if m.snapshot]
        while len(snapshots) > self.config.max_snapshots:
            goner = min(snapshots, key=(lambda m: m.version) if self.config.drop == "oldest"
                        else (lambda m: (m.rating, m.version)))
            del self.members[goner.id]
            snapshots.remove(goner)

    @property
    def snapshots(self) -> int:
        with self._lock:
            return sum(m.snapshot for m in self.members.values())

    # -- results --------------------------------------------------------------------------

    def check(self, batch: pb.TrajectoryBatch) -> None:
        """WireError for a batch's games or opponents that are malformed (before anything is stored)."""
        if len(batch.games) > MAX_GAMES_PER_BATCH or len(batch.opponents) > MAX_OPPONENTS_PER_BATCH:
            raise wire.WireError(f"a batch holds at most {MAX_GAMES_PER_BATCH} games and {MAX_OPPONENTS_PER_BATCH} "
                                 f"opponents, not {len(batch.games)} and {len(batch.opponents)}")
        for game in batch.games:
            if game.outcome not in OUTCOMES:
                raise wire.WireError(f"game against {game.opponent!r:.80} has no valid outcome ({game.outcome})")
            if game.length < 1:
                raise wire.WireError(f"game against {game.opponent!r:.80} has length {game.length}; games last >= 1 step")
        for name in [*(g.opponent for g in batch.games), *(g.seat for g in batch.games), *batch.opponents]:
            if not name or len(name) > MAX_ID_CHARS:
                raise wire.WireError(f"opponent and seat names must have 1 to {MAX_ID_CHARS} characters, "
                                     f"got {name!r:.80}")

    def record(self, batch: pb.TrajectoryBatch) -> None:
        """Count a stored batch's games (rated against opponents still in the league) and its transitions."""
        with self._lock:
            for opponent in set(batch.opponents):
                if (member := self.members.get(opponent)) is not None:
                    member.transitions += batch.num_transitions
            for game in batch.games:
                outcome = OUTCOMES[game.outcome]
                self.games += 1
                member = self.members.get(game.opponent)
                if member is None:
                    self.unrated_games += 1
                    continue
                member.record.add(outcome)
                if member.id != SELF:  # the current policy against itself moves no rating
                    self.rating, member.rating = elo_update(self.rating, member.rating, SCORES[outcome],
                                                            self.config.elo_k)
            due = batch.games and time.monotonic() - self._reweighed >= REWEIGH_SECONDS
            if due:
                self._bump()
        if due:
            self.on_change()

    # -- menus ----------------------------------------------------------------------------

    def _bump(self) -> None:
        """Under the lock: recompute the draw weights and raise the revision."""
        self._reweigh()
        self.revision += 1

    def _reweigh(self) -> None:
        others = [m for m in self.members.values() if m.id != SELF]
        if not others:
            self._weights = {SELF: 1.0}
            self._reweighed = time.monotonic()
            return
        if self.config.sampling == "uniform":
            raw = {m.id: 1.0 for m in others}
        else:
            raw = {m.id: pfsp_weight(m.record.win_rate(), self.config.pfsp_power) for m in others}
        total = sum(raw.values())
        share = 1.0 - self.config.self_play
        self._weights = {SELF: self.config.self_play, **{key: share * value / total for key, value in raw.items()}}
        self._reweighed = time.monotonic()

    def menu(self, sent: set[str]) -> tuple[int, list[pb.LearnerMessage]]:
        """``(revision, messages)`` bringing a stream that holds the snapshot weights ``sent`` up to date:
        weights of snapshots it lacks, then the LeagueUpdate; ``sent`` is updated in place."""
        with self._lock:
            messages = unsent_weights({m.id: m.messages for m in self.members.values() if m.snapshot}, sent)
            update = pb.LeagueUpdate(opponents=[self._opponent(m) for m in self.members.values()])
            return self.revision, [*messages, pb.LearnerMessage(league=update)]

    def _opponent(self, member: Member) -> pb.Opponent:
        return pb.Opponent(id=member.id, version=member.version, script=member.script,
                           weight=self._weights.get(member.id, 0.0), rating=member.rating)

    def sample_snapshots(self, count: int) -> list[tuple[str, bytes]]:
        """The ``count`` newest snapshots as ``(id, payload)``, for evaluation."""
        with self._lock:
            snapshots = sorted((m for m in self.members.values() if m.snapshot), key=lambda m: -m.version)
            return [(m.id, m.payload) for m in snapshots[:count]]

    # -- status, metrics, checkpoints -----------------------------------------------------

    def status(self) -> pb.LeagueStatus:
        with self._lock:
            opponents = [pb.OpponentStatus(opponent=self._opponent(m), wins=m.record.wins, draws=m.record.draws,
                                           losses=m.record.losses, transitions=m.transitions)
                         for m in self.members.values()]
            return pb.LeagueStatus(rating=self.rating, games=self.games, unrated_games=self.unrated_games,
                                   snapshots=sum(m.snapshot for m in self.members.values()),
                                   max_snapshots=self.config.max_snapshots, opponents=opponents,
                                   evaluation=self.evaluation)

    def metrics(self) -> list[Metric]:
        with self._lock:
            members = list(self.members.values())
            rating, games = self.rating, self.games
        return [
            Metric("league_rating", "Elo rating of the current policy.", rating),
            Metric("league_games_total", "Self-play games counted.", games, counter=True),
            Metric("league_snapshots", "Snapshots of past policies in the league.", sum(m.snapshot for m in members)),
            Metric("league_opponent_rating", "Elo rating of each league opponent.", {m.id: m.rating for m in members},
                   label="opponent"),
            Metric("league_win_rate", "The current policy's wins plus half its draws per game, by opponent.",
                   {m.id: (m.record.wins + 0.5 * m.record.draws) / m.record.games if m.record.games else math.nan
                    for m in members}, label="opponent"),
        ]

    def scalars(self) -> dict[str, float]:
        """TensorBoard scalars: the current rating, league size and each scripted player's win rate."""
        with self._lock:
            values = {"league/rating": self.rating, "league/snapshots": sum(m.snapshot for m in self.members.values()),
                      "league/games": self.games}
            for m in self.members.values():
                if m.script and m.record.games:
                    values[f"league/win_or_draw_vs/{m.id}"] = (m.record.wins + m.record.draws) / m.record.games
            return values

    def state(self) -> dict:
        """A checkpoint part: plain members and ratings, each snapshot's weights as tensors."""
        with self._lock:
            members = [{"id": m.id, "version": m.version, "script": m.script, "rating": m.rating,
                        "wins": m.record.wins, "draws": m.record.draws, "losses": m.record.losses,
                        "transitions": m.transitions} for m in self.members.values()]
            part: dict = {"members": members, "rating": self.rating, "games": self.games,
                          "unrated_games": self.unrated_games}
            for m in self.members.values():
                if m.snapshot:
                    for name, tensor in wire.decode_state_dict(m.payload).items():
                        part[f"weights/{m.id}/{name}"] = tensor
            return part

    def load_state(self, part: Mapping) -> None:
        """Restore :meth:`state`; scripted players no longer configured are dropped, new ones join."""
        with self._lock:
            self.rating, self.games = float(part["rating"]), int(part["games"])
            self.unrated_games = int(part["unrated_games"])
            scripted = set(self.config.scripted_players())
            for saved in part["members"]:
                record = Record(int(saved["wins"]), int(saved["draws"]), int(saved["losses"]))
                if int(saved["version"]) >= 0:
                    prefix = f"weights/{saved['id']}/"
                    weights = {key[len(prefix):]: torch.as_tensor(value) for key, value in part.items()
                               if key.startswith(prefix)}
                    self._add_snapshot(int(saved["version"]), wire.encode_state_dict(weights), float(saved["rating"]),
                                       record, int(saved["transitions"]))
                elif saved["id"] == SELF or saved["script"] in scripted:
                    member = self.members[saved["id"]]
                    member.rating, member.record = float(saved["rating"]), record
                    member.transitions = int(saved["transitions"])
            self._bump()
        self.on_change()


def unsent_weights(snapshots: Mapping[str, Sequence[T]], sent: set[str]) -> list[T]:
    """The chunks of every snapshot (id -> its weights' PolicyUpdates) a stream that holds ``sent`` lacks, in
    order; ``sent`` takes them and forgets snapshots no longer held. What a learner's and a relay's streams send
    before the menu."""
    messages: list[T] = []
    for snapshot, chunks in snapshots.items():
        if snapshot not in sent:
            messages.extend(chunks)
            sent.add(snapshot)
    sent.intersection_update(snapshots)
    return messages
