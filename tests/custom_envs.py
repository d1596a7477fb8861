"""Small custom environments for the env-server tests, named as ``custom_envs:FUNCTION``."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class DictWalkEnv(gym.Env):
    """A 2-D walk toward a goal: Dict observations (Box, Discrete, MultiBinary), MultiDiscrete actions."""

    metadata = {"render_modes": []}

    def __init__(self, max_steps: int = 30):
        self.max_steps = max_steps
        self.observation_space = spaces.Dict([
            ("position", spaces.Box(-5.0, 5.0, (2,), np.float32)),
            ("steps_left", spaces.Discrete(max_steps + 1)),
            ("walls", spaces.MultiBinary(4)),
        ])
        self.action_space = spaces.MultiDiscrete([3, 3], start=[-1, -1])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        start = (options or {}).get("start")
        self.position = (np.asarray(start, np.float32) if start is not None
                         else self.np_random.uniform(-4, 4, 2).astype(np.float32))
        self.goal = self.np_random.integers(-4, 5, 2).astype(np.float32)
        self.steps = 0
        return self._obs(), {"goal": self.goal.copy()}

    def step(self, action):
        self.position = np.clip(self.position + np.asarray(action, np.float32), -5, 5)
        self.steps += 1
        distance = float(np.abs(self.position - self.goal).sum())
        terminated = distance < 0.5
        truncated = self.steps >= self.max_steps
        info = {"distance": distance, "note": "reached" if terminated else "walking"}
        return self._obs(), (1.0 if terminated else -0.01), terminated, truncated, info

    def _obs(self):
        walls = np.array([self.position[0] <= -5, self.position[0] >= 5,
                          self.position[1] <= -5, self.position[1] >= 5], np.int8)
        return {"position": self.position.copy(), "steps_left": np.int64(self.max_steps - self.steps), "walls": walls}


class FailingEnv(DictWalkEnv):
    """Raises from ``step`` when asked to move diagonally up-right: a bug in user code."""

    def step(self, action):
        if tuple(np.asarray(action)) == (1, 1):
            raise RuntimeError("diagonal moves are broken")
        return super().step(action)


def dict_walk() -> gym.Env:
    return DictWalkEnv()


def failing() -> gym.Env:
    return FailingEnv()


def not_an_env():
    return object()
