"""Two-player, turn-based games as multi-agent envs: the turns, the checks and the endings they share."""

from __future__ import annotations

from typing import Any

from gymnasium import spaces


class TwoPlayerGame:
    """Two agents, ``players[0]`` moving first; only the player to move is observed each step.

    A game sets ``players`` and ``metadata`` and implements :meth:`_start` (a new game's state),
    :meth:`_observe` (a player's view) and :meth:`_move` (play one move, and say whether it ended
    the game). Rewards come at the end only: the mover's, and its negation to the other player.
    """

    players: tuple[str, str]

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space):
        self.possible_agents = list(self.players)
        self.agents: list[str] = []
        self._observation_space, self._action_space = observation_space, action_space
        self.to_move = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def reset(self, seed: int | None = None, options: dict | None = None):
        self._start()
        self.to_move = 0
        self.agents = list(self.players)
        first = self.players[0]
        return {first: self._observe(0)}, {first: {}}

    def step(self, actions):
        if not self.agents:
            raise RuntimeError("step after the game ended: reset first")
        mover, other = self.players[self.to_move], self.players[1 - self.to_move]
        if set(actions) != {mover}:
            raise ValueError(f"it is {mover}'s move: expected an action for {mover} only, got {sorted(actions)}")
        ended = self._move(self.to_move, actions[mover])
        if ended is not None:
            reward, info = ended
            self.agents = []
            return ({p: self._observe(i) for i, p in enumerate(self.players)}, {mover: reward, other: -reward or 0.0},
                    {p: True for p in self.players}, {p: False for p in self.players},
                    {p: dict(info) for p in self.players})
        self.to_move = 1 - self.to_move
        return {other: self._observe(self.to_move)}, {mover: 0.0, other: 0.0}, \
            {mover: False, other: False}, {mover: False, other: False}, {other: {}}

    def close(self) -> None:
        pass

    def _start(self) -> None:
        """Set up a new game."""
        raise NotImplementedError

    def _observe(self, player: int) -> Any:
        """What player ``player`` (0 or 1) sees."""
        raise NotImplementedError

    def _move(self, player: int, action: Any) -> tuple[float, dict] | None:
        """Play ``action`` for ``player``: ``(the mover's reward, info)`` when it ends the game, else None.
        ValueError for an action outside the action space."""
        raise NotImplementedError
