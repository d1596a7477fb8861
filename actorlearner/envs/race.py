"""Race to 10 as a two-player, turn-based multi-agent env, with two scripted players.

Use it as ``--env actorlearner.envs.race:race_to_10``, with ``--league-eval-scripted
actorlearner.envs.race:random_player,actorlearner.envs.race:perfect_player`` (players to be measured against).

Two players, ``first`` and ``second``, take turns adding 1 (action 0) or 2 (action 1) to a count
that starts at 0; whoever brings it to exactly 10 wins (+1, the other -1). The player to move sees
``observation``, the count one-hot over 0..10 (11 floats), and ``action_mask``, 1 for each move
that stays within 10. A move past 10 loses the game on the spot. Moving to 1, 4, 7, 10 wins: the
first mover wins under perfect play.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from actorlearner.envs.turns import TwoPlayerGame

GOAL = 10
PLAYERS = ("first", "second")


class RaceTo10(TwoPlayerGame):
    """Two agents, ``first`` (moves first) and ``second``."""

    metadata = {"name": "race_to_10", "render_modes": []}
    players = PLAYERS

    def __init__(self):
        super().__init__(spaces.Dict({"observation": spaces.Box(0.0, 1.0, (GOAL + 1,), np.float32),
                                      "action_mask": spaces.MultiBinary(2)}), spaces.Discrete(2))
        self.count = 0

    def _start(self) -> None:
        self.count = 0

    def _observe(self, player: int) -> dict[str, np.ndarray]:
        return observe(self.count)

    def _move(self, player: int, action) -> tuple[float, dict] | None:
        action = int(action)
        if action not in (0, 1):
            raise ValueError(f"action {action} is not 0 (add 1) or 1 (add 2)")
        if self.count + action + 1 > GOAL:
            return -1.0, {"illegal_move": action, "loser": PLAYERS[player]}
        self.count += action + 1
        return (1.0, {"winner": PLAYERS[player]}) if self.count == GOAL else None


def observe(count: int) -> dict[str, np.ndarray]:
    """What the player to move sees at ``count``."""
    return {"observation": np.eye(GOAL + 1, dtype=np.float32)[count],
            "action_mask": np.array([count + 1 <= GOAL, count + 2 <= GOAL], np.int8)}


def race_to_10() -> RaceTo10:
    return RaceTo10()


def random_player(observation_space, action_space, seed: int = 0):
    """A player that picks a uniformly random legal move."""
    rng = np.random.default_rng(seed)

    def act(observation):
        return int(rng.choice(np.flatnonzero(observation["action_mask"])))
    return act


def perfect_player(observation_space, action_space, seed: int = 0):
    """Moves to a count of 1 mod 3 (1, 4, 7, 10) when it can, else a random legal move."""
    rng = np.random.default_rng(seed)

    def act(observation):
        count = int(np.argmax(observation["observation"]))
        winning = [a for a in (0, 1) if count + a + 1 <= GOAL and (count + a + 1) % 3 == 1]
        return winning[0] if winning else int(rng.choice(np.flatnonzero(observation["action_mask"])))
    return act
