"""The learner's league: snapshots of past policies, scripted players, their records and Elo ratings.

Members are drawn by actors in proportion to the weights of the newest :meth:`League.menu`.
Every change that actors should see (a snapshot taken or dropped, weights recomputed after
new games) raises :attr:`League.revision`; each stream sends the menu again when it is behind.
Results come in batches and are counted with them, exactly once (see learner.proto, Self-play).

Data-parallel ranks keep one league for the world: each rank's league is ``shared``. Its batches'
results wait in :attr:`League.pending`, and versions published wait to become snapshots, until the
ranks' trainers meet in :meth:`League.share`: there every rank applies every rank's results, in rank
order, and takes the snapshots every rank has published, so that the ratings stay identical.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import msgpack
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
SHARE_SECONDS = 0.5
"""Data-parallel: how long results may wait before the ranks' trainers share them (at their next round)."""

Results = list
"""One stored batch's part of the league, in plain values (shared between ranks and checkpointed):
``[opponents its transitions faced, its transitions, [[opponent, outcome code], ...] of its games]``."""


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
    onnx: list[pb.LearnerMessage] = field(default_factory=list)  # its ONNX model as chunked PolicyUpdates, once made

    @property
    def snapshot(self) -> bool:
        return self.version >= 0


class League:
    """Snapshots every ``snapshot_every`` versions (at most ``max_snapshots``), scripted players, ratings.

    Thread-safe: ingest threads record games, the trainer takes snapshots, streams read menus.
    :attr:`on_change` is called (outside the lock) whenever :attr:`revision` rises. ``shared``: one of
    several data-parallel ranks' leagues (see the module's docstring).
    """

    def __init__(self, config: LeagueConfig, chunk_bytes: int, shared: bool = False):
        self.config = config
        self.chunk_bytes = chunk_bytes
        self.on_change: Callable[[], None] = lambda: None
        self.shared = shared
        self.pending: list[Results] = []  # shared: this rank's results not shared yet, oldest first
        self._pending_since = 0.0  # when the oldest of them came
        self._published: dict[int, bytes] = {}  # shared: versions due to become snapshots once every rank has them
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
            if self.shared:
                self._published[version] = payload
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
        """Count a stored batch's games (rated against opponents still in the league) and its transitions;
        shared, keep them for the next :meth:`share`."""
        results = [sorted(set(batch.opponents)), batch.num_transitions, [[g.opponent, g.outcome] for g in batch.games]]
        with self._lock:
            if self.shared:
                if not self.pending:
                    self._pending_since = time.monotonic()
                self.pending.append(results)
                return
            self._apply(results)
            due = batch.games and time.monotonic() - self._reweighed >= REWEIGH_SECONDS
            if due:
                self._bump()
        if due:
            self.on_change()

    def _apply(self, results: Results) -> None:
        """Under the lock: count one batch's results."""
        opponents, transitions, games = results
        for opponent in opponents:
            if (member := self.members.get(opponent)) is not None:
                member.transitions += transitions
        for opponent, code in games:
            outcome = OUTCOMES[code]
            self.games += 1
            member = self.members.get(opponent)
            if member is None:
                self.unrated_games += 1
                continue
            member.record.add(outcome)
            if member.id != SELF:  # the current policy against itself moves no rating
                self.rating, member.rating = elo_update(self.rating, member.rating, SCORES[outcome], self.config.elo_k)

    # -- one league for data-parallel ranks -----------------------------------------------

    def share_due(self) -> bool:
        """Shared: whether this rank has results waiting for SHARE_SECONDS or versions due as snapshots."""
        with self._lock:
            return self.shared and bool(self._published or (
                self.pending and time.monotonic() - self._pending_since >= SHARE_SECONDS))

    def share(self, gather: Callable[[bytes], list[bytes]]) -> None:
        """Every rank's trainer calls this at the same round: ``gather`` (a collective) gives each rank's
        message in rank order. Each rank then applies every rank's pending results, in rank order, and takes
        as snapshots the versions every rank has published, oldest first, all at the same instant."""
        with self._lock:
            mine = list(self.pending)
            newest = max(self._published, default=0)
        everyone = [msgpack.unpackb(message) for message in gather(msgpack.packb([newest, mine]))]
        common = min(newest for newest, _ in everyone)
        with self._lock:
            del self.pending[:len(mine)]
            self._pending_since = time.monotonic()
            self._admit(common)
            for _, results in everyone:
                for batch_results in results:
                    self._apply(batch_results)
            self._bump()
        self.on_change()

    def _admit(self, newest: int) -> None:
        """Under the lock: the published versions up to ``newest`` become snapshots, oldest first."""
        for version in sorted(v for v in self._published if v <= newest):
            self._add_snapshot(version, self._published.pop(version), self.rating)

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

    def menu(self, sent: set[str], onnx: bool = False) -> tuple[int, list[pb.LearnerMessage]]:
        """``(revision, messages)`` bringing a stream that holds the snapshot weights ``sent`` up to date:
        weights of snapshots it lacks, then the LeagueUpdate; ``sent`` is updated in place. ``onnx``: the
        snapshots as ONNX models, and only those whose model is made (:meth:`exported`)."""
        with self._lock:
            members = [m for m in self.members.values() if not (onnx and m.snapshot and not m.onnx)]
            messages = unsent_weights({m.id: m.onnx if onnx else m.messages for m in members if m.snapshot}, sent)
            update = pb.LeagueUpdate(opponents=[self._opponent(m) for m in members])
            return self.revision, [*messages, pb.LearnerMessage(league=update)]

    def unexported(self) -> list[tuple[str, bytes]]:
        """``(id, state dict payload)`` of the snapshots without an ONNX model, oldest first: made in that order,
        they reach ONNX streams in version order, as state dicts reach the others."""
        with self._lock:
            return [(m.id, m.payload) for m in sorted(self.members.values(), key=lambda m: m.version)
                    if m.snapshot and not m.onnx]

    def exported(self, member_id: str, model: bytes) -> None:
        """Snapshot ``member_id``'s ONNX model is made (nothing if it left the league meanwhile)."""
        with self._lock:
            member = self.members.get(member_id)
            if member is None:
                return
            member.onnx = policy_update_messages(member.version, model, self.chunk_bytes, opponent=member_id)
            self.revision += 1
        self.on_change()

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
        """A checkpoint part: plain members and ratings, each snapshot's weights as tensors, and (shared) the
        results not shared yet. Shared, the versions published first become snapshots: every rank checkpoints
        at the same update, once it has published every version, so every rank takes the same ones."""
        with self._lock:
            self._admit(max(self._published, default=0))
            members = [{"id": m.id, "version": m.version, "script": m.script, "rating": m.rating,
                        "wins": m.record.wins, "draws": m.record.draws, "losses": m.record.losses,
                        "transitions": m.transitions} for m in self.members.values()]
            part: dict = {"members": members, "rating": self.rating, "games": self.games,
                          "unrated_games": self.unrated_games, "pending": list(self.pending)}
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
            self.pending = list(part.get("pending", ()))
            self._pending_since = time.monotonic()
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
