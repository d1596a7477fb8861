"""Tic-tac-toe as a two-player, turn-based multi-agent env, with two scripted players.

Use it as ``--env actorlearner.envs.tictactoe:tic_tac_toe``, with ``--league-scripted
actorlearner.envs.tictactoe:random_player`` (an opponent to train against) and
``--league-eval-scripted actorlearner.envs.tictactoe:heuristic_player`` (one to be measured against).

Each player sees the board from its own side, PettingZoo-style: ``observation``, 27 floats in
three planes of 9 cells (its own marks, the opponent's marks, empty cells), and
``action_mask``, 1 for each empty cell. Actions are cells 0..8, row by row. A move on a taken
cell loses the game on the spot (the built-in Q-learners never make one: they read the mask). Rewards: +1 to the winner, -1 to the loser, 0 each on a draw.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

LINES = np.array([(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)])
PLAYERS = ("x", "o")


class TicTacToe:
    """Two agents, ``x`` (moves first) and ``o``; only the player to move is observed each step."""

    metadata = {"name": "tic_tac_toe", "render_modes": []}

    def __init__(self):
        self.possible_agents = list(PLAYERS)
        self.agents: list[str] = []
        self._observation_space = spaces.Dict({"observation": spaces.Box(0.0, 1.0, (27,), np.float32),
                                               "action_mask": spaces.MultiBinary(9)})
        self._action_space = spaces.Discrete(9)
        self.board = np.zeros(9, np.int8)  # 0 empty, 1 x, 2 o
        self.to_move = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.board[:] = 0
        self.to_move = 0
        self.agents = list(PLAYERS)
        return {"x": self._observe(0)}, {"x": {}}

    def step(self, actions):
        if not self.agents:
            raise RuntimeError("step after the game ended: reset first")
        mover = PLAYERS[self.to_move]
        if set(actions) != {mover}:
            raise ValueError(f"it is {mover}'s move: expected an action for {mover} only, got {sorted(actions)}")
        cell = int(actions[mover])
        if not 0 <= cell < 9:
            raise ValueError(f"cell {cell} is not in 0..8")
        other = PLAYERS[1 - self.to_move]
        if self.board[cell]:
            return self._end({mover: -1.0, other: 1.0}, {"illegal_move": cell, "loser": mover})
        self.board[cell] = self.to_move + 1
        if winner_of(self.board) == self.to_move + 1:
            return self._end({mover: 1.0, other: -1.0}, {"winner": mover})
        if self.board.all():
            return self._end({mover: 0.0, other: 0.0}, {"winner": "none"})
        self.to_move = 1 - self.to_move
        return {other: self._observe(self.to_move)}, {mover: 0.0, other: 0.0}, \
            {mover: False, other: False}, {mover: False, other: False}, {other: {}}

    def close(self) -> None:
        pass

    def _end(self, rewards: dict, info: dict):
        observations = {p: self._observe(i) for i, p in enumerate(PLAYERS)}
        done = {p: True for p in PLAYERS}
        self.agents = []
        return observations, rewards, done, {p: False for p in PLAYERS}, {p: dict(info) for p in PLAYERS}

    def _observe(self, player: int) -> np.ndarray:
        return observe(self.board, player + 1)


def observe(board: np.ndarray, mark: int) -> dict[str, np.ndarray]:
    """The view of ``board`` for the player whose cells hold ``mark``."""
    other = 3 - mark
    return {"observation": np.concatenate([board == mark, board == other, board == 0]).astype(np.float32),
            "action_mask": (board == 0).astype(np.int8)}


def winner_of(board: np.ndarray) -> int:
    """The mark (1 or 2) holding a full line, else 0."""
    for line in LINES:
        a, b, c = board[line]
        if a and a == b == c:
            return int(a)
    return 0


def tic_tac_toe() -> TicTacToe:
    return TicTacToe()


def _cells(observation: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mine, theirs, empty) boolean cells of a player's observation."""
    planes = np.asarray(observation["observation"]).reshape(3, 9) > 0.5
    return planes[0], planes[1], planes[2]


def random_player(observation_space, action_space, seed: int = 0):
    """A player that picks a uniformly random empty cell."""
    rng = np.random.default_rng(seed)

    def act(observation):
        return int(rng.choice(np.flatnonzero(_cells(observation)[2])))
    return act


def heuristic_player(observation_space, action_space, seed: int = 0):
    """Wins when it can, blocks the opponent's line when it must, else takes the centre, a corner, any cell."""
    rng = np.random.default_rng(seed)

    def completing(owned: np.ndarray, empty: np.ndarray) -> list[int]:
        return [int(line[empty[line]][0]) for line in LINES if owned[line].sum() == 2 and empty[line].sum() == 1]

    def act(observation):
        mine, theirs, empty = _cells(observation)
        for cells in (completing(mine, empty), completing(theirs, empty)):
            if cells:
                return int(rng.choice(cells))
        if empty[4]:
            return 4
        corners = [c for c in (0, 2, 6, 8) if empty[c]]
        return int(rng.choice(corners or np.flatnonzero(empty)))
    return act
