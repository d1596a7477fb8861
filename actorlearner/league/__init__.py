"""Self-play: a league of past policies and scripted players, their ratings, and seats of multi-agent envs."""

from actorlearner.league.league import SELF, League
from actorlearner.league.opponents import OpponentPool
from actorlearner.league.seat import Game, SeatEnv

__all__ = ["SELF", "Game", "League", "OpponentPool", "SeatEnv"]
