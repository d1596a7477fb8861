"""Self-play settings: the league of opponents, how actors draw them, and how they are rated."""

from __future__ import annotations

from dataclasses import dataclass

from actorlearner.config.options import comma_separated


@dataclass
class LeagueConfig:
    """Self-play, used when the env has several agents: the league of opponents and its ratings."""

    snapshot_every: int = 10
    """Policy versions between snapshots of the learning policy taken into the league."""
    max_snapshots: int = 20
    """Snapshots the league keeps; past it one is dropped (see drop)."""
    drop: str = "oldest"
    """Which snapshot a full league drops: oldest, or weakest (the lowest rated)."""
    sampling: str = "pfsp"
    """How actors draw opponents: uniform, or pfsp (prioritized fictitious self-play: those the learning policy beats less often, more often)."""
    pfsp_power: float = 2.0
    """PFSP weighting: an opponent beaten at rate p is drawn in proportion to (1 - p) ** pfsp_power."""
    self_play: float = 0.2
    """Share of games against the current policy itself (every game while the league is empty)."""
    scripted: str = ""
    """Comma-separated scripted players (module:function) always in the league; function(observation_space, action_space, seed) returns a callable observation -> action."""
    opponent_exploration: float = 0.05
    """Exploration the algorithm acts with for snapshot opponents and the current policy as an opponent."""
    elo_k: float = 16.0
    """Elo K-factor: the most a rating moves in one game."""
    eval_scripted: str = ""
    """Comma-separated scripted players (module:function) the evaluator plays besides those in the league; never trained against."""
    eval_games: int = 20
    """Evaluation games against each scripted player and each sampled snapshot, seats alternated."""
    eval_snapshots: int = 3
    """League snapshots sampled (newest first) for each evaluation."""

    def __post_init__(self):
        if self.snapshot_every < 1 or self.max_snapshots < 1:
            raise ValueError("league snapshot_every and max_snapshots must be >= 1")
        if self.drop not in ("oldest", "weakest"):
            raise ValueError(f"league drop must be oldest or weakest, got {self.drop!r}")
        if self.sampling not in ("uniform", "pfsp"):
            raise ValueError(f"league sampling must be uniform or pfsp, got {self.sampling!r}")
        if not 0.0 <= self.self_play <= 1.0:
            raise ValueError(f"league self_play must be in [0, 1], got {self.self_play}")
        if self.eval_games < 0 or self.eval_snapshots < 0 or self.elo_k <= 0 or self.pfsp_power < 0:
            raise ValueError("league eval_games and eval_snapshots must be >= 0, elo_k > 0, pfsp_power >= 0")

    def scripted_players(self) -> list[str]:
        """The scripted players in the league."""
        return comma_separated(self.scripted)

    def evaluated_players(self) -> list[str]:
        """The scripted players the evaluator plays: the league's, then the evaluation-only ones."""
        league = self.scripted_players()
        return league + [name for name in comma_separated(self.eval_scripted) if name not in league]
