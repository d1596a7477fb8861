"""Multi-agent environments: PettingZoo's Parallel API, duck-typed, with turn-based games allowed.

An env with several agents has ``possible_agents`` (every agent name), ``agents`` (those
still in the episode), ``observation_space(agent)`` and ``action_space(agent)``, and:

- ``reset(seed=None, options=None) -> (observations, infos)``;
- ``step(actions) -> (observations, rewards, terminations, truncations, infos)``,
  every one a dict keyed by agent name.

Who acts: the agents that got an observation and are neither terminated nor truncated.
``step`` takes an action from exactly those. A simultaneous-move env (any PettingZoo
``ParallelEnv``) observes every live agent every step, so all of them act; a turn-based game
observes only the agent to move. An agent that terminates or is truncated has left: it gets
no more actions (it may still get rewards). The episode ends when ``agents`` is empty.

PettingZoo itself is not needed: any object of this shape is a multi-agent env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym


@runtime_checkable
class MultiAgentEnv(Protocol):
    """What actorlearner calls on an env with several agents (PettingZoo's ParallelEnv)."""

    possible_agents: list[str]
    agents: list[str]

    def observation_space(self, agent: str) -> gym.Space: ...

    def action_space(self, agent: str) -> gym.Space: ...

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]: ...

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]: ...

    def close(self) -> None: ...


def is_multi_agent(env: Any) -> bool:
    """Whether ``env`` has several agents (the shape above) rather than being a gymnasium.Env."""
    return not isinstance(env, gym.Env) and hasattr(env, "possible_agents") \
        and callable(getattr(env, "observation_space", None)) and callable(getattr(env, "action_space", None))


def acting(observations: Mapping[str, Any], terminations: Mapping[str, bool] | None = None,
           truncations: Mapping[str, bool] | None = None) -> list[str]:
    """The agents that act next: observed, and neither terminated nor truncated."""
    terminations, truncations = terminations or {}, truncations or {}
    return [agent for agent in observations if not (terminations.get(agent) or truncations.get(agent))]


def check_agents(env: Any) -> None:
    """ValueError naming what is wrong when ``env`` does not look like a multi-agent env."""
    agents = list(getattr(env, "possible_agents", None) or [])
    if not agents:
        raise ValueError(f"{type(env).__name__} has no possible_agents")
    if len(set(agents)) != len(agents) or not all(isinstance(a, str) and a for a in agents):
        raise ValueError(f"possible_agents must be distinct non-empty strings, got {agents!r}")
    for agent in agents:
        for role in ("observation_space", "action_space"):
            if not isinstance(getattr(env, role)(agent), gym.Space):
                raise ValueError(f"{type(env).__name__}.{role}({agent!r}) is not a gymnasium space")


def shared_spaces(env: Any, seats: list[str] | None = None) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces every seat in ``seats`` (default: every agent) shares.

    One policy plays whichever seat it is given, and its past versions play the others, so
    the seats it takes must look alike; ValueError naming the first seat that differs.
    """
    check_agents(env)
    seats = list(seats or env.possible_agents)
    unknown = [s for s in seats if s not in env.possible_agents]
    if unknown:
        raise ValueError(f"unknown seats {unknown}: the env's agents are {env.possible_agents}")
    first = seats[0]
    obs_space, act_space = env.observation_space(first), env.action_space(first)
    for seat in seats[1:]:
        if env.observation_space(seat) != obs_space or env.action_space(seat) != act_space:
            raise ValueError(f"seat {seat!r} has other spaces than {first!r} ({env.observation_space(seat)}, "
                             f"{env.action_space(seat)} vs {obs_space}, {act_space}): self-play needs seats "
                             "that look alike: one policy plays every seat")
    return obs_space, act_space


def seat_spaces(env: Any) -> tuple[gym.Space, gym.Space]:
    """The spaces a policy for ``env`` sees: a gymnasium env's own, or every seat's of a multi-agent env."""
    return shared_spaces(env) if is_multi_agent(env) else (env.observation_space, env.action_space)
