"""The actor's side of the league: the newest menu, snapshot weights, and players built from them."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from actorlearner.algorithms import Policy
from actorlearner.league.league import SELF
from actorlearner.league.seat import Player
from actorlearner.v1 import learner_pb2 as pb


def load_scripted(name: str, observation_space: gym.Space, action_space: gym.Space, seed: int):
    """The act callable of scripted player ``module:function`` (its factory called with the seat's spaces)."""
    module_name, _, attribute = name.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot load scripted player {name!r}: {exc}") from None
    act = factory(observation_space, action_space, seed)
    if not callable(act):
        raise ValueError(f"scripted player {name!r} returned a {type(act).__name__}, not a callable observation -> action")
    return act


class ScriptedPlayer:
    """A scripted player's act callable as a player."""

    def __init__(self, name: str, act: Callable[[Any], Any]):
        self.id, self._act = name, act

    def begin(self) -> None:
        pass

    def act(self, observation):
        return self._act(observation)


class PolicyPlayer:
    """An algorithm's policy as a player: one observation at a time, with ``exploration``."""

    def __init__(self, player_id: str, policy: Policy, observation_space: gym.Space, exploration: float):
        self.id, self.policy, self.exploration = player_id, policy, exploration
        self._space = observation_space

    def begin(self) -> None:
        self.policy.reset_memory(np.ones(1, bool))

    def act(self, observation):
        return self.policy.act(one_row(self._space, observation), self.exploration)[0]


def one_row(space: gym.Space, observation: Any) -> Any:
    """One observation of ``space`` as a vector env of one batches it (each leaf ``[1, ...]`` in its space's
    dtype), in a tenth of the time of gymnasium's general ``concatenate``."""
    if isinstance(space, gym.spaces.Dict):
        return {key: one_row(leaf, observation[key]) for key, leaf in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(one_row(leaf, value) for leaf, value in zip(space.spaces, observation))
    return np.asarray(observation, dtype=space.dtype)[None]


class OpponentPool:
    """Draws each game's opponent from the newest LeagueUpdate.

    ``build`` makes a fresh policy (the learning policy's kind) for snapshots and for the
    current policy as an opponent; players are kept per env slot when the policy is
    recurrent (each game its own memory), else shared. Used by the env loop's thread only.
    """

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, seed: int):
        self.observation_space, self.action_space = observation_space, action_space
        self.rng = np.random.default_rng(seed)
        self.seed = seed
        self.build: Callable[[], Policy] | None = None
        self.exploration = 0.0
        self.menu: list[pb.Opponent] = []
        self.snapshots: dict[str, dict[str, torch.Tensor]] = {}
        self.current: tuple[int, Policy | None] = (-1, None)  # (version, the actor's own policy)
        self._players: dict[tuple[str, int], Any] = {}
        self._self_versions: dict[int, int] = {}  # slot -> version loaded into its "self" player

    def reset(self, build: Callable[[], Policy], exploration: float) -> None:
        """A new network (a Welcome with another algorithm or config): every built player goes."""
        self.build, self.exploration = build, exploration
        self._players.clear()
        self._self_versions.clear()
        self.snapshots.clear()

    def update(self, menu: pb.LeagueUpdate | None, snapshots: Mapping[str, dict[str, torch.Tensor]]) -> None:
        self.snapshots.update(snapshots)
        if menu is not None:
            self.menu = list(menu.opponents)
            live = {o.id for o in self.menu}
            self.snapshots = {k: v for k, v in self.snapshots.items() if k in live}
            self._players = {key: p for key, p in self._players.items() if key[0] in live or key[0] == SELF}

    def draw(self, slot: int) -> Player:
        """An opponent for a new game in env ``slot``: by the menu's weights among those playable here."""
        choices = [o for o in self.menu if o.weight > 0 and (o.script or o.id == SELF or o.id in self.snapshots)]
        if choices:
            weights = np.array([o.weight for o in choices])
            chosen = choices[int(self.rng.choice(len(choices), p=weights / weights.sum()))]
        else:
            chosen = pb.Opponent(id=SELF, version=-1)
        return self._player(chosen, slot)

    def _player(self, opponent: pb.Opponent, slot: int) -> Player:
        recurrent = self.current[1] is not None and self.current[1].recurrent
        key = (opponent.id, slot if recurrent else -1)
        player = self._players.get(key)
        if player is None:
            if opponent.script:
                player = ScriptedPlayer(opponent.id, load_scripted(opponent.script, self.observation_space,
                                                                   self.action_space, self.seed + slot))
            else:
                policy = self.build()
                if opponent.id != SELF:
                    policy.load_policy_state_dict(self.snapshots[opponent.id])
                player = PolicyPlayer(opponent.id, policy, self.observation_space, self.exploration)
            self._players[key] = player
        if opponent.id == SELF:
            version, policy = self.current
            if self._self_versions.get(key[1]) != version and policy is not None:
                player.policy.load_policy_state_dict(policy.policy_state_dict())
                self._self_versions[key[1]] = version
        return player
