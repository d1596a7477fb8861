"""Elo ratings and win/draw/loss records: the league's arithmetic, with no state of its own."""

from __future__ import annotations

from dataclasses import dataclass

INITIAL_RATING = 1000.0
SCORES = {"win": 1.0, "draw": 0.5, "loss": 0.0}
_FIELDS = {"win": "wins", "draw": "draws", "loss": "losses"}


def expected_score(rating: float, opponent: float) -> float:
    """Elo's expected score of a player rated ``rating`` against one rated ``opponent``."""
    return 1.0 / (1.0 + 10.0 ** ((opponent - rating) / 400.0))


def elo_update(rating: float, opponent: float, score: float, k: float) -> tuple[float, float]:
    """Both ratings after one game in which the first player scored ``score`` (1, 0.5 or 0)."""
    delta = k * (score - expected_score(rating, opponent))
    return rating + delta, opponent - delta


@dataclass
class Record:
    """The learning policy's games against one opponent."""

    wins: int = 0
    draws: int = 0
    losses: int = 0

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def add(self, outcome: str) -> None:
        """Count one game: ``outcome`` is win, draw or loss (the learning policy's)."""
        name = _FIELDS[outcome]
        setattr(self, name, getattr(self, name) + 1)

    def win_rate(self, prior_games: float = 1.0) -> float:
        """Wins plus half the draws per game, pulled towards 1/2 by ``prior_games`` imaginary games."""
        return (self.wins + 0.5 * self.draws + 0.5 * prior_games) / (self.games + prior_games)


def pfsp_weight(win_rate: float, power: float, floor: float = 0.01) -> float:
    """Prioritized fictitious self-play ("hard" weighting): opponents the learner beats less
    often are drawn more often, ``(1 - win_rate) ** power``; ``floor`` keeps every one in play."""
    return max((1.0 - win_rate) ** power, floor)
