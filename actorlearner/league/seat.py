"""One seat of a multi-agent env as a gymnasium env: the learning policy plays it, an opponent the others.

The seat changes every episode (round robin over the env's agents, from ``first_seat``),
and an opponent is drawn for each game. Between two of the seat's own moves the opponent
plays every other agent that is to act; the seat's transition carries every reward it got
meanwhile. When the seat leaves the episode the rest is played out, so that the game's
outcome is known when the seat's last step returns; ``on_game`` gets it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym

from actorlearner.envs.multiagent import acting, shared_spaces

MAX_EMPTY_EPISODES = 100
"""Episodes in a row that may end before the seat acts at all before reset gives up."""


class Player(Protocol):
    """An opponent: ``begin()`` at the start of each game, then ``act(observation)`` per move."""

    id: str

    def begin(self) -> None: ...

    def act(self, observation: Any) -> Any: ...


@dataclass(frozen=True)
class Game:
    """A finished game, from the learning seat's side."""

    opponent: str
    outcome: str  # win, draw or loss
    seat: str
    length: int  # env steps, every seat's


def outcome_of(seat: str, returns: dict[str, float], info: dict) -> str:
    """The seat's outcome: the env's own ``info["outcome"]`` (win, draw or loss) if it gives one,
    else its return against the best other agent's."""
    given = info.get("outcome") if isinstance(info, dict) else None
    if given in ("win", "draw", "loss"):
        return given
    best_other = max((r for agent, r in returns.items() if agent != seat), default=0.0)
    mine = returns.get(seat, 0.0)
    return "win" if mine > best_other else "draw" if mine == best_other else "loss"


class SeatEnv(gym.Env):
    """A multi-agent env seen from one seat at a time; ``draw_opponent()`` picks each game's opponent."""

    metadata = {"render_modes": []}

    def __init__(self, env: Any, draw_opponent: Callable[[], Player], on_game: Callable[[Game], None] | None = None,
                 first_seat: int = 0):
        self.env = env
        self.observation_space, self.action_space = shared_spaces(env)
        self.draw_opponent = draw_opponent
        self.on_game = on_game
        self._episodes = first_seat
        self.seat = ""
        self.opponent: Player | None = None
        self._obs: dict = {}
        self._terminations: dict = {}
        self._truncations: dict = {}
        self._seat_obs: Any = None  # the seat's newest observation
        self._seat_info: dict = {}
        self._returns: dict[str, float] = {}
        self._reward = 0.0  # the seat's rewards since its last action
        self._length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        for _ in range(MAX_EMPTY_EPISODES):
            seats = self.env.possible_agents
            self.seat = seats[self._episodes % len(seats)]
            self._episodes += 1
            self.opponent = self.draw_opponent()
            self.opponent.begin()
            self._obs, infos = self.env.reset(seed=seed, options=options)
            seed = None  # the env's own generator goes on
            self._terminations, self._truncations = {}, {}
            self._seat_obs, self._seat_info = self._obs.get(self.seat), dict(infos.get(self.seat) or {})
            self._returns, self._length = dict.fromkeys(seats, 0.0), 0
            self._opponent_moves()
            if self._seat_acts():
                return self._seat_obs, self._seat_info
            self._play_out()  # the game ended without the seat acting: not the learner's episode
        raise RuntimeError(f"{MAX_EMPTY_EPISODES} episodes in a row ended before seat {self.seat!r} acted")

    def step(self, action):
        self._reward = 0.0
        self._step({self.seat: action})
        self._opponent_moves()
        if self._seat_acts():
            return self._seat_obs, self._reward, False, False, self._seat_info
        terminated = bool(self._terminations.get(self.seat))
        observation = self._seat_obs
        self._play_out()
        return observation, self._reward, terminated, not terminated, self._seat_info

    def close(self) -> None:
        self.env.close()

    def _acting(self) -> list[str]:
        return acting(self._obs, self._terminations, self._truncations)

    def _seat_acts(self) -> bool:
        return self.seat in self._acting()

    def _opponent_moves(self) -> None:
        """The opponent moves until the seat is to act, has left, or nobody is to act."""
        while self.seat in self.env.agents and self._acting() and not self._seat_acts():
            self._step({})

    def _play_out(self) -> None:
        """Finish the game without the seat (its outcome decides the result) and report it."""
        while self.env.agents and self._acting():
            self._step({})
        if self.on_game is not None:
            self.on_game(Game(self.opponent.id, outcome_of(self.seat, self._returns, self._seat_info),
                              self.seat, self._length))

    def _step(self, actions: dict) -> None:
        """One env step with ``actions`` and the opponent's for every other agent to act."""
        for agent in self._acting():
            if agent != self.seat:
                actions[agent] = self.opponent.act(self._obs[agent])
        self._obs, rewards, self._terminations, self._truncations, infos = self.env.step(actions)
        self._length += 1
        for agent, value in rewards.items():
            self._returns[agent] = self._returns.get(agent, 0.0) + float(value)
        self._reward += float(rewards.get(self.seat, 0.0))
        if self.seat in self._obs:
            self._seat_obs = self._obs[self.seat]
        if self.seat in infos:
            self._seat_info = dict(infos[self.seat] or {})
