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

from actorlearner.envs.turns import TwoPlayerGame

LINES = np.array([(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)])
PLAYERS = ("x", "o")


class TicTacToe(TwoPlayerGame):
    """Two agents, ``x`` (moves first) and ``o``."""

    metadata = {"name": "tic_tac_toe", "render_modes": []}
    players = PLAYERS

    def __init__(self):
        super().__init__(spaces.Dict({"observation": spaces.Box(0.0, 1.0, (27,), np.float32),
                                      "action_mask": spaces.MultiBinary(9)}), spaces.Discrete(9))
        self.board = np.zeros(9, np.int8)  # 0 empty, 1 x, 2 o

    def _start(self) -> None:
        self.board[:] = 0

    def _observe(self, player: int) -> dict[str, np.ndarray]:
        return observe(self.board, player + 1)

    def _move(self, player: int, action) -> tuple[float, dict] | None:
        cell = int(action)
        if not 0 <= cell < 9:
            raise ValueError(f"cell {cell} is not in 0..8")
        if self.board[cell]:
            return -1.0, {"illegal_move": cell, "loser": PLAYERS[player]}
        self.board[cell] = player + 1
        if winner_of(self.board) == player + 1:
            return 1.0, {"winner": PLAYERS[player]}
        if self.board.all():
            return 0.0, {"winner": "none"}
        return None


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
