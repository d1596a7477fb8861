"""The actor's optional roles behind one set of hooks, as the learner's (`actorlearner.learner.roles`):
:class:`Roles` is an actor with none, :class:`SelfPlay` plays one seat of a multi-agent env against
opponents drawn from the learner's league. The env loop's thread calls every hook."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import gymnasium as gym
import torch

from actorlearner.algorithms import AlgorithmSpec, Policy
from actorlearner.config import ActorConfig
from actorlearner.envs import make_env
from actorlearner.envs.multiagent import is_multi_agent, shared_spaces
from actorlearner.league import Game, OpponentPool, SeatEnv
from actorlearner.league.league import OUTCOME_CODES
from actorlearner.v1 import learner_pb2 as pb


class SettingsError(ValueError):
    """A Welcome's settings that this actor cannot apply."""


class Roles:
    """The hooks the actor calls where an optional role may take part; these do nothing."""

    agents: tuple[str, ...] = ()
    """A multi-agent env's agents (the Hello's env spec names them); none for a gymnasium env."""
    sync_only: str | None = None
    """Why the envs must step in sync, in the actor's process (the error for another vector mode); None: any
    mode may."""

    def wrapper(self) -> Callable[[gym.Env], gym.Env] | None:
        """What each env made is passed through (`make_vector_env`'s ``wrap``), or None."""
        return None

    def check_welcome(self, settings: pb.Settings) -> None:
        """SettingsError for a Welcome's role settings (``settings.league``) this actor cannot serve."""
        if settings.HasField("league"):
            raise SettingsError("the learner keeps league but this actor's env has one agent")

    def new_network(self, spec: AlgorithmSpec, settings: pb.Settings) -> None:
        """A Welcome's ``settings`` replaced the network: it is now of ``spec``."""

    def policy_changed(self, version: int, policy: Policy) -> None:
        """The loop acts with ``policy`` at weights ``version`` (-1: none yet) from now on."""

    def league_update(self, update: pb.LeagueUpdate) -> None:
        """The learner's newest league."""

    def snapshot(self, opponent: str, state: dict[str, torch.Tensor]) -> None:
        """Weights of the league's snapshot ``opponent``, decoded for the network in force."""

    def batch_extras(self) -> tuple[list[pb.GameResult], list[str]]:
        """What the next batch carries beside its transitions: games ended and opponents met since the last."""
        return [], []


def make_roles(config: ActorConfig) -> Roles:
    """The roles ``config.env`` needs: self-play for a multi-agent env, none otherwise."""
    env = make_env(config.env, config.security)
    try:
        if not is_multi_agent(env):
            return Roles()
        return SelfPlay(tuple(env.possible_agents), OpponentPool(*shared_spaces(env), config.seed), config.seed)
    finally:
        env.close()


class SelfPlay(Roles):
    """Each env is one learning seat (rotating) of a multi-agent env; every game's opponent is drawn from the
    league the learner sends (`OpponentPool`), and each batch reports the games ended and opponents met."""

    sync_only = "self-play needs vector_mode sync or auto: the opponents play in the actor's process"

    def __init__(self, agents: tuple[str, ...], pool: OpponentPool, seed: int):
        self.agents, self.pool, self.seed = agents, pool, seed
        self._seats: list[SeatEnv] = []
        self._slots = itertools.count()
        self._games: list[Game] = []  # ended since the last batch
        self._opponents: set[str] = set()  # of the games under way at the last batch or drawn since

    def wrapper(self) -> Callable[[gym.Env], SeatEnv]:
        return self._seat

    def _seat(self, env) -> SeatEnv:
        slot = next(self._slots)

        def draw():
            player = self.pool.draw(slot)
            self._opponents.add(player.id)
            return player
        seat = SeatEnv(env, draw, self._games.append, first_seat=slot)
        self._seats.append(seat)
        return seat

    def check_welcome(self, settings: pb.Settings) -> None:
        if not settings.HasField("league"):
            raise SettingsError("the learner keeps no league but this actor's env has several agents")

    def new_network(self, spec: AlgorithmSpec, settings: pb.Settings) -> None:
        self.pool.reset(lambda: spec.make_policy(device="cpu", seed=self.seed), settings.league.opponent_exploration)

    def policy_changed(self, version: int, policy: Policy) -> None:
        self.pool.current = (version, policy)

    def league_update(self, update: pb.LeagueUpdate) -> None:
        self.pool.update(update, {})

    def snapshot(self, opponent: str, state: dict[str, torch.Tensor]) -> None:
        self.pool.update(None, {opponent: state})

    def batch_extras(self) -> tuple[list[pb.GameResult], list[str]]:
        games = [pb.GameResult(opponent=g.opponent, outcome=OUTCOME_CODES[g.outcome], seat=g.seat, length=g.length)
                 for g in self._games]
        opponents = sorted(self._opponents)
        self._games.clear()
        self._opponents = {seat.opponent.id for seat in self._seats if seat.opponent is not None}
        return games, opponents
