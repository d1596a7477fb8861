"""Small custom environments for the tests, named as ``custom_envs:FUNCTION``."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from actorlearner.frames import STACKED_FRAMES


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


class GoalImageEnv(gym.Env):
    """Walk to a goal seen only in an image: a learnable Dict observation with MultiDiscrete actions.

    A ``size`` x ``size`` grid. Each episode (seeded by ``reset(seed)``) puts the goal and the
    agent on two different random cells. Observation, a ``Dict`` in this order:

    - ``image``: Box(0, 255, (size, size, 1), uint8), 0 everywhere but the goal cell (255) and
      the agent cell (128), indexed ``[y, x, 0]``; the only place the goal is shown;
    - ``position``: Box(0, 1, (2,), float32), the agent's (x, y) divided by ``size - 1``;
    - ``noise_discrete``: Discrete(5, start=-2), ``noise_bits``: MultiBinary(3) and
      ``noise_tuple``: Tuple((Discrete(2), Box(-1, 1, (2,), float32))): drawn afresh from
      ``np_random`` every step, carrying no information.

    Action: MultiDiscrete([3, 3], start=[-1, -1]), a move (dx, dy) clipped at the walls, so
    diagonals count as one step. Reward: +1 on reaching the goal (the episode terminates),
    ``-step_cost`` on every other step; truncated after ``max_steps`` steps.

    With the defaults (5 x 5, 12 steps, step cost 0.01), ``goal_image_baselines(1000, seed=0)``
    measures :data:`GOAL_IMAGE_RANDOM_RETURN` for a uniformly random policy and
    :data:`GOAL_IMAGE_OPTIMAL_RETURN` for the shortest path read off the image: 0.186 and 0.987.
    A plain DQN (16 3x3 conv filters on the image, an MLP over that, the position and the noise,
    the 9 joint actions) reached 0.8 of optimal in 6,000 to 6,500 env steps on seeds 0-2.
    """

    metadata = {"render_modes": []}
    AGENT, GOAL = 128, 255

    def __init__(self, size: int = 5, max_steps: int = 12, step_cost: float = 0.01):
        if size < 2:
            raise ValueError(f"size must be at least 2, got {size}")
        self.size, self.max_steps, self.step_cost = size, max_steps, step_cost
        self.observation_space = spaces.Dict([
            ("image", spaces.Box(0, 255, (size, size, 1), np.uint8)),
            ("position", spaces.Box(0.0, 1.0, (2,), np.float32)),
            ("noise_discrete", spaces.Discrete(5, start=-2)),
            ("noise_bits", spaces.MultiBinary(3)),
            ("noise_tuple", spaces.Tuple((spaces.Discrete(2), spaces.Box(-1.0, 1.0, (2,), np.float32)))),
        ])
        self.action_space = spaces.MultiDiscrete([3, 3], start=[-1, -1])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        cells = self.np_random.choice(self.size * self.size, size=2, replace=False)
        self.goal = np.array(divmod(int(cells[0]), self.size)[::-1], np.int64)  # (x, y)
        self.agent = np.array(divmod(int(cells[1]), self.size)[::-1], np.int64)
        self.steps = 0
        return self._obs(), {"distance": self._distance()}

    def step(self, action):
        move = np.asarray(action, np.int64)
        if move.shape != (2,) or np.any(np.abs(move) > 1):
            raise ValueError(f"action must be two moves in -1..1, got {action!r}")
        self.agent = np.clip(self.agent + move, 0, self.size - 1)
        self.steps += 1
        terminated = bool(np.array_equal(self.agent, self.goal))
        truncated = not terminated and self.steps >= self.max_steps
        reward = 1.0 if terminated else -self.step_cost
        return self._obs(), reward, terminated, truncated, {"distance": self._distance()}

    def _distance(self) -> int:
        """Moves on the shortest path: diagonals allowed, so the larger coordinate difference."""
        return int(np.abs(self.goal - self.agent).max())

    def _obs(self):
        image = np.zeros((self.size, self.size, 1), np.uint8)
        image[self.goal[1], self.goal[0], 0] = self.GOAL
        image[self.agent[1], self.agent[0], 0] = self.AGENT
        rng = self.np_random
        return {
            "image": image,
            "position": (self.agent / (self.size - 1)).astype(np.float32),
            "noise_discrete": np.int64(rng.integers(-2, 3)),
            "noise_bits": rng.integers(0, 2, 3).astype(np.int8),
            "noise_tuple": (np.int64(rng.integers(0, 2)), rng.uniform(-1, 1, 2).astype(np.float32)),
        }


def goal_image_shortest_path(obs) -> np.ndarray:
    """The optimal action, read from the observation alone: one step toward the 255 cell."""
    image = obs["image"][..., 0]
    goal_y, goal_x = np.argwhere(image == GoalImageEnv.GOAL)[0]
    agent_y, agent_x = np.argwhere(image == GoalImageEnv.AGENT)[0]
    return np.sign([goal_x - agent_x, goal_y - agent_y]).astype(np.int64)


def goal_image_baselines(episodes: int = 1000, seed: int = 0, **kwargs) -> tuple[float, float]:
    """Mean return of a uniformly random policy and of the shortest path, over the same seeded episodes."""
    def mean_return(policy) -> float:
        env = GoalImageEnv(**kwargs)
        env.action_space.seed(seed)
        total = 0.0
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            done = False
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policy(obs, env))
                total += reward
                done = terminated or truncated
        return total / episodes

    random_return = mean_return(lambda obs, env: env.action_space.sample())
    optimal_return = mean_return(lambda obs, env: goal_image_shortest_path(obs))
    return random_return, optimal_return


GOAL_IMAGE_RANDOM_RETURN = 0.186
"""Uniformly random policy's mean return: ``goal_image_baselines(1000, seed=0)[0]`` with the defaults, measured."""
GOAL_IMAGE_OPTIMAL_RETURN = 0.987
"""Shortest-path policy's mean return: ``goal_image_baselines(1000, seed=0)[1]`` with the defaults, measured."""


class ReachEnv(gym.Env):
    """Point at a target: continuous actions with asymmetric, per-dimension bounds.

    Each step shows a target drawn uniformly inside the action box (low = [-1, 0], high = [3,
    0.5]) and pays minus the squared distance of the action to it, per dimension in units of
    that dimension's range; 10 steps an episode. Pointing at the middle scores -1.67, uniform
    random actions -3.33, the target itself 0. An action outside the bounds (or not finite)
    raises: any that an actor sent would end the run.
    """

    metadata = {"render_modes": []}
    low, high = np.array([-1.0, 0.0], np.float32), np.array([3.0, 0.5], np.float32)

    def __init__(self, max_steps: int = 10):
        self.max_steps = max_steps
        self.observation_space = spaces.Box(self.low, self.high, dtype=np.float32)
        self.action_space = spaces.Box(self.low, self.high, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._new_target(), {}

    def step(self, action):
        action = np.asarray(action)
        if action.shape != (2,) or not np.isfinite(action).all() or not self.action_space.contains(
                action.astype(np.float32)) or (action < self.low).any() or (action > self.high).any():
            raise ValueError(f"action {action!r} outside the bounds {self.low} .. {self.high}")
        reward = -float((((action - self.target) / (self.high - self.low)) ** 2).sum())
        self.steps += 1
        return self._new_target(), reward, False, self.steps >= self.max_steps, {}

    def _new_target(self) -> np.ndarray:
        self.target = self.np_random.uniform(self.low, self.high).astype(np.float32)
        return self.target.copy()


def reach() -> gym.Env:
    return ReachEnv()


class MemoryCueEnv(gym.Env):
    """Remember a cue: it is shown at the first step only; after a delay of ``min_delay`` to
    ``max_delay`` blank steps a go signal asks for it, and naming it pays +1, anything else -1.

    Observations are [cue is 0, cue is 1, go]; actions Discrete(2), ignored before the go
    signal. A policy without memory scores 0 on average; one that remembers scores 1.
    """

    metadata = {"render_modes": []}

    def __init__(self, min_delay: int = 8, max_delay: int = 10):
        self.min_delay, self.max_delay = min_delay, max_delay
        self.observation_space = spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.cue = int(self.np_random.integers(2))
        self.delay = int(self.np_random.integers(self.min_delay, self.max_delay + 1))
        self.steps = 0
        obs = np.zeros(3, np.float32)
        obs[self.cue] = 1.0
        return obs, {}

    def step(self, action):
        if self.steps == self.delay:  # the go step: the answer counts
            return np.zeros(3, np.float32), (1.0 if int(action) == self.cue else -1.0), True, False, {}
        self.steps += 1
        return np.array([0.0, 0.0, float(self.steps == self.delay)], np.float32), 0.0, False, False, {}


def memory_cue() -> gym.Env:
    return MemoryCueEnv()


def goal_image(**kwargs) -> gym.Env:
    return GoalImageEnv(**kwargs)


def dict_walk() -> gym.Env:
    return DictWalkEnv()


def frozen_lake() -> gym.Env:
    """FrozenLake-v1 without slipping: a Discrete(16) observation, solved with return 1.0."""
    return gym.make("FrozenLake-v1", is_slippery=False)


class TextObservationEnv(gym.Env):
    """An env whose observation is text: no algorithm here learns from it, and the learner says so."""

    observation_space = spaces.Text(8)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        return "step", 0.0, True, False, {}


def text_observation() -> gym.Env:
    return TextObservationEnv()


def dict_action() -> gym.Env:
    """DictWalkEnv with its actions wrapped in a Dict: a space DQN cannot act in."""
    env = DictWalkEnv()
    env.action_space = spaces.Dict({"move": env.action_space})
    return env


def failing() -> gym.Env:
    return FailingEnv()


def not_an_env():
    return object()


class MovingDotEnv(gym.Env):
    """Say which way a dot moves: it starts anywhere on a 4x20 image and moves one pixel a step, left or
    right (drawn per episode), wrapping around the edges, for 6 steps; each step, naming the direction
    pays +1.

    One frame shows where the dot is, and every place is as likely whichever way it moves: without
    frames stacked every policy scores 3 on average. With two frames stacked only the first step
    (whose stack repeats the first frame) is a guess: the best policy scores 5.5.
    """

    metadata = {"render_modes": []}
    LENGTH, WIDTH = 6, 20

    def __init__(self):
        self.observation_space = spaces.Box(0, 255, (4, self.WIDTH), np.uint8)
        self.action_space = spaces.Discrete(2)  # 0: left, 1: right

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(self.WIDTH))
        self.direction = int(self.np_random.integers(2))
        self.steps = 0
        return self._frame(), {}

    def step(self, action):
        reward = float(int(action) == self.direction)
        self.position = (self.position + (1 if self.direction else -1)) % self.WIDTH
        self.steps += 1
        return self._frame(), reward, self.steps == self.LENGTH, False, {}

    def _frame(self) -> np.ndarray:
        frame = np.zeros((4, self.WIDTH), np.uint8)
        frame[:, self.position] = 255
        return frame


def moving_dot() -> gym.Env:
    return MovingDotEnv()


# Frame stacking (tests/replay/test_frame_stack.py): frames that name their env, episode and step.
COUNTING_ENVS = 3
STACKED = 4


class CountingFrames(gym.Env):
    """Frames that say which env, episode and step they are ([env, episode, step] in a 3x4 image); episodes
    of 1 to 12 steps, ending by termination or truncation."""

    observation_space = gym.spaces.Box(0, 255, (3, 4), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, index: int):
        self.index, self.episode = index, -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode += 1
        self.steps, self.length = 0, int(self.np_random.integers(1, 13))
        return self._frame(), {}

    def step(self, action):
        self.steps += 1
        end = self.steps == self.length
        truncated = end and self.episode % 2 == 1
        return self._frame(), float(self.steps), end and not truncated, truncated, {}

    def _frame(self) -> np.ndarray:
        frame = np.zeros((3, 4), np.uint8)
        frame[:, 0], frame[:, 1], frame[:, 2] = self.index, self.episode % 256, self.steps
        return frame


_made = iter(range(1 << 30))


def counting_frames() -> gym.Env:
    """The next of COUNTING_ENVS CountingFrames envs, numbered in turn."""
    return CountingFrames(next(_made) % COUNTING_ENVS)


def self_stacking_frames() -> gym.Env:
    """Counting frames stacked by the env itself, which says so in its metadata."""
    env = gym.wrappers.FrameStackObservation(counting_frames(), STACKED)
    env.metadata = {**env.metadata, STACKED_FRAMES: STACKED}
    return env


def short_cartpole() -> gym.Env:
    """CartPole cut at 15 steps: episodes end truncated as well as terminated."""
    return gym.make("CartPole-v1", max_episode_steps=15)


PACE_SECONDS = 0.002


class PacedCartPole(gym.Wrapper):
    """CartPole that takes `PACE_SECONDS` per step, as a slow simulator would: an actor of a few of them
    streams steadily while using a small part of a core, so a test that only needs a live actor's
    stream beside it leaves the cores to the rest of the suite."""

    def step(self, action):
        time.sleep(PACE_SECONDS)
        return self.env.step(action)


def paced_cartpole() -> gym.Env:
    return PacedCartPole(gym.make("CartPole-v1"))


# Observations at the sizes users run (tests/actor/test_loop_sizes.py, test_process_tree.py).
class SizedObservation(gym.Env):
    """Random uint8 observations (two, in turn) of ``length`` bytes (a vector) or ``shape``; ``actions`` discrete actions;
    episodes of 50 steps. With ``hang_after`` steps, the next step never returns (an env that stops answering;
    it creates the file $HANG_MARKER names, if any, as it hangs)."""

    def __init__(self, length: int = 0, shape: tuple[int, ...] = (), actions: int = 2, hang_after: int = 0):
        self.observation_space = spaces.Box(0, 255, shape or (length,), np.uint8)
        self.action_space = spaces.Discrete(actions)
        self.hang_after, self.taken = hang_after, 0
        self.frames = np.random.default_rng(0).integers(0, 256, (2, *self.observation_space.shape), np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.frames[0], {}

    def step(self, action):
        self.steps += 1
        self.taken += 1
        if self.hang_after and self.taken > self.hang_after:
            import os
            import time
            if os.environ.get("HANG_MARKER"):  # says so, for the test waiting for the hang
                open(os.environ["HANG_MARKER"], "a").close()
            while True:
                time.sleep(3600)
        return self.frames[self.steps % 2], 1.0, False, self.steps >= 50, {}


def atari_frames() -> gym.Env:
    """One 84x84 grey frame per step, as Atari games are preprocessed (stack them with ``--frame-stack 4``)."""
    return SizedObservation(shape=(84, 84, 1), actions=6)


def hanging_frames() -> gym.Env:
    """Atari-sized frames from an env whose 5th step never returns."""
    return SizedObservation(shape=(84, 84, 1), actions=6, hang_after=4)
