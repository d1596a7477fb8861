"""The learner's optional roles behind one set of hooks: :class:`Roles` is a learner with none, and
:class:`SelfPlay` keeps a league of past policies for a multi-agent env."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from actorlearner import wire
from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.evaluation import EvalResult
from actorlearner.league import League
from actorlearner.league.evaluation import evaluate_league
from actorlearner.league.opponents import load_scripted
from actorlearner.metrics import Metric
from actorlearner.telemetry import Telemetry
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)


class StreamFeed:
    """What a role sends on one stream besides policies and Welcomes; this one sends nothing."""

    def due(self) -> bool:
        """Whether :meth:`messages` has something to send now."""
        return False

    def messages(self) -> list[pb.LearnerMessage]:
        """What to send now (called from the stream's sender only)."""
        return []


class LeagueFeed(StreamFeed):
    """The league on one stream: each new revision, with the snapshots' weights (``onnx``: their ONNX
    models) this stream has not had."""

    def __init__(self, league: League, onnx: bool):
        self.league, self.onnx = league, onnx
        self.revision = 0  # the league's revision last sent
        self.snapshots_sent: set[str] = set()

    def due(self) -> bool:
        return self.league.revision > self.revision

    def messages(self) -> list[pb.LearnerMessage]:
        self.revision, messages = self.league.menu(self.snapshots_sent, self.onnx)
        return list(messages)


class Roles:
    """The hooks the learner calls at each step an optional role may take part in; these do nothing."""

    league: League | None = None

    def feed(self, onnx: bool) -> StreamFeed:
        """What this role sends on a new stream (see :class:`StreamFeed`); ``onnx``: it takes ONNX policies."""
        return StreamFeed()

    def listen(self, changed: Callable[[], None]) -> None:
        """Have ``changed`` called whenever what the feeds send changes (publishing wakes the streams)."""

    def check_batch(self, batch: pb.TrajectoryBatch) -> None:
        """WireError for a batch this role cannot take, before anything is stored."""
        if batch.games or batch.opponents:
            raise wire.WireError("this learner keeps no league: a batch must not carry games or opponents")

    def record_batch(self, batch: pb.TrajectoryBatch) -> None:
        """A batch was stored (under the replay lock, with it: exactly once)."""

    def published(self, version: int, payload: bytes) -> None:
        """The learner published ``version`` as ``payload``."""

    def share_due(self) -> bool:
        """Data-parallel: whether this rank has something for :meth:`share`."""
        return False

    def share(self, gather: Callable[[bytes], list[bytes]]) -> None:
        """Data-parallel: called by every rank's trainer at the same round when any rank's :meth:`share_due`;
        ``gather`` is the collective that gives every rank's bytes, in rank order."""

    def welcome(self, settings: pb.Settings) -> None:
        """Add this role's settings to those a Welcome sends."""

    def evaluate(self, policy: Any, seed: int, step: int) -> EvalResult | None:
        """This role's evaluation of ``policy`` instead of the greedy episodes, or None for those."""
        return None

    def evaluated(self) -> None:
        """Log this role's part of the evaluation just logged."""

    def scalars(self) -> dict[str, float]:
        """TensorBoard scalars, written with the trainer's."""
        return {}

    def metrics(self) -> list[Metric]:
        return []

    def report(self, response: pb.StatusResponse) -> None:
        """Add this role's part of GetStatus."""

    def state(self) -> dict | None:
        """A checkpoint part, or None for none."""
        return None

    def load_state(self, part: Mapping) -> None:
        """Restore :meth:`state`'s part."""


class SelfPlay(Roles):
    """Self-play: a league of snapshots and scripted players the actors' opponents are drawn from, and
    evaluation games against them. Its actors connect directly or through relays (which pass the league
    on), and take state dicts or ONNX models; ``shared``: one league for every data-parallel rank."""

    def __init__(self, config: LearnerConfig, opponent: Any, spaces: tuple, telemetry: Telemetry, shared: bool):
        self.config, self.opponent, self.spaces, self.telemetry = config, opponent, spaces, telemetry
        self.league = League(config.league, config.chunk_bytes, shared=shared)
        for script in config.league.evaluated_players():  # fail now, not in an actor
            load_scripted(script, *spaces, config.seed)

    def feed(self, onnx: bool) -> LeagueFeed:
        return LeagueFeed(self.league, onnx)

    def listen(self, changed: Callable[[], None]) -> None:
        self.league.on_change = changed

    def check_batch(self, batch: pb.TrajectoryBatch) -> None:
        self.league.check(batch)

    def record_batch(self, batch: pb.TrajectoryBatch) -> None:
        self.league.record(batch)

    def published(self, version: int, payload: bytes) -> None:
        self.league.published(version, payload)

    def share_due(self) -> bool:
        return self.league.share_due()

    def share(self, gather: Callable[[bytes], list[bytes]]) -> None:
        self.league.share(gather)

    def welcome(self, settings: pb.Settings) -> None:
        settings.league.CopyFrom(pb.LeagueSettings(
            enabled=True, opponent_exploration=self.config.league.opponent_exploration))

    def evaluate(self, policy: Any, seed: int, step: int) -> EvalResult:
        """Games against the scripted players and the newest snapshots; their records logged and written."""
        result = evaluate_league(self.league, policy, self.opponent, lambda: make_env(self.config.env, self.config.security),
                                 self.spaces, self.config.eval_envs, seed)
        self.telemetry.scalars({f"eval/win_or_draw_vs/{r.opponent}": (r.wins + r.draws) / (r.wins + r.draws + r.losses)
                                for r in self.league.evaluation}, step)
        return result

    def evaluated(self) -> None:
        logger.info("eval games (wins/draws/losses), rating %.0f: %s", self.league.rating, ", ".join(
            f"{r.opponent} {r.wins}/{r.draws}/{r.losses}" for r in self.league.evaluation))

    def scalars(self) -> dict[str, float]:
        return self.league.scalars()

    def metrics(self) -> list[Metric]:
        return self.league.metrics()

    def report(self, response: pb.StatusResponse) -> None:
        response.league.CopyFrom(self.league.status())

    def state(self) -> dict:
        return self.league.state()

    def load_state(self, part: Mapping) -> None:
        self.league.load_state(part)
