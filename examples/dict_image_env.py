"""Fruit catcher: a gymnasium env with a Dict observation, an RGB camera and a state vector.

The module a user writes to train on their own environment; actorlearner imports it by
name, ``dict_image_env:make`` with ``PYTHONPATH=examples``:

    PYTHONPATH=examples actorlearner run --env dict_image_env:make --target-return 0.9

A fruit falls one row per step down an 8 x 8 field, straight down from a random column; a
basket moves along the bottom row. A green fruit must be caught, a red one dodged. The
camera sees the fruit but not the basket; the state vector says where the basket is. So
the policy needs both: the colour and column from the image, the basket from the vector.

- observation: ``Dict(camera=Box(0, 255, (8, 8, 3), uint8), state=Box(0, 1, (2,), float32))``;
  the camera is height x width x RGB, black but for the fruit; the state is the basket's
  column and the fall's progress, both scaled to [0, 1].
- action: ``Discrete(3)``: move the basket left, stay, move right (clipped at the walls).
- reward: when the fruit reaches the bottom (after 7 steps, then the episode terminates),
  +1 for a caught green or a dodged red fruit, -1 otherwise; 0 on the steps before.

The basket can always get under the fruit in time, so the best return is 1.0; random play
scores about 0.0. ``python examples/dict_image_env.py`` checks the env and prints both.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

GREEN, RED = (0, 255, 0), (255, 0, 0)


class FruitCatcherEnv(gym.Env):
    """Catch green fruit, dodge red fruit; see the module docstring."""

    metadata = {"render_modes": []}

    def __init__(self, size: int = 8):
        self.size = size
        self.observation_space = spaces.Dict({
            "camera": spaces.Box(0, 255, (size, size, 3), np.uint8),
            "state": spaces.Box(0.0, 1.0, (2,), np.float32),
        })
        self.action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)  # seeds self.np_random: reset(seed=s) is deterministic
        self.fruit_x = int(self.np_random.integers(self.size))
        self.fruit_y = 0
        self.good = bool(self.np_random.integers(2))  # green (catch) or red (dodge)
        self.basket_x = int(self.np_random.integers(self.size))
        return self._obs(), {}

    def step(self, action):
        self.basket_x = int(np.clip(self.basket_x + int(action) - 1, 0, self.size - 1))
        self.fruit_y += 1
        terminated = self.fruit_y == self.size - 1
        reward = 0.0
        if terminated:
            caught = self.basket_x == self.fruit_x
            reward = 1.0 if caught == self.good else -1.0
        return self._obs(), reward, terminated, False, {}

    def _obs(self):
        camera = np.zeros((self.size, self.size, 3), np.uint8)
        camera[self.fruit_y, self.fruit_x] = GREEN if self.good else RED
        state = np.array([self.basket_x, self.fruit_y], np.float32) / (self.size - 1)
        return {"camera": camera, "state": state}


def make() -> gym.Env:
    """The factory actorlearner calls for ``--env dict_image_env:make``."""
    return FruitCatcherEnv()


if __name__ == "__main__":
    from gymnasium.utils.env_checker import check_env

    env = make()
    check_env(env, skip_render_check=True)

    def mean_return(policy, episodes: int = 1000) -> float:
        total = 0.0
        for episode in range(episodes):
            env.reset(seed=episode)
            done = False
            while not done:
                _, reward, done, _, _ = env.step(policy(env))
                total += reward
        return total / episodes

    def best(env: FruitCatcherEnv) -> int:
        """Reads the env's hidden state: the reference return, not a policy to learn."""
        if env.good:
            return int(np.sign(env.fruit_x - env.basket_x)) + 1
        return 1 if env.basket_x != env.fruit_x else (0 if env.basket_x > 0 else 2)

    rng = np.random.default_rng(0)
    print(f"random {mean_return(lambda env: int(rng.integers(3))):.3f}, best {mean_return(best):.3f}")
