"""Multi-agent test environments, named as ``multiagent_envs:FUNCTION``.

:class:`Expedition` exercises every per-agent field env.proto carries; :class:`Duel` is the
Python twin of examples/node-env/duel.js, for comparing the Node server with.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces

from actorlearner.envs.tictactoe import TicTacToe, random_player


class Expedition:
    """Three agents with their own spaces; the scout leaves early, the others are truncated.

    - ``scout``: observes a Dict (``position`` Box(-4, 4, (2,), float32), ``fuel``
      Discrete(7)), acts with MultiDiscrete([3, 3], start=[-1, -1]). Each move burns one
      fuel; it terminates on reaching its goal (+1) or running dry (-0.1 a step before),
      always before the time limit.
    - ``relay``: observes Box(0, 1, (3,), float64), acts with Discrete(3); every step.
    - ``base``: observes Box(-1, 1, (2, 2), float32), acts with Discrete(2, start=1); it is
      observed, and so acts, on even steps only, but is rewarded every step.

    Every step rewards each agent in the episode; infos hold text, arrays and a nested dict.
    Episodes are truncated after ``max_episode_steps`` steps.
    """

    metadata = {"name": "expedition", "render_modes": []}
    max_episode_steps = 8

    def __init__(self, fail_on_diagonal: bool = False):
        self.possible_agents = ["scout", "relay", "base"]
        self.agents: list[str] = []
        self.fail_on_diagonal = fail_on_diagonal
        self._observation_spaces = {
            "scout": spaces.Dict({"position": spaces.Box(-4.0, 4.0, (2,), np.float32), "fuel": spaces.Discrete(7)}),
            "relay": spaces.Box(0.0, 1.0, (3,), np.float64),
            "base": spaces.Box(-1.0, 1.0, (2, 2), np.float32),
        }
        self._action_spaces = {
            "scout": spaces.MultiDiscrete([3, 3], start=[-1, -1]),
            "relay": spaces.Discrete(3),
            "base": spaces.Discrete(2, start=1),
        }
        self.rng = np.random.default_rng()
        self.acting: list[str] = []

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        self.position = self.rng.integers(-2, 3, 2).astype(np.float32)
        self.goal = self.rng.integers(-3, 4, 2).astype(np.float32)
        self.fuel = int(self.rng.integers(3, 7))
        self.signal = self.rng.uniform(0, 1, 3)
        self.level = np.float32((options or {}).get("level", 0.0))
        observations = {agent: self._observe(agent) for agent in self.agents}
        infos = {"scout": {"goal": self.goal.copy(), "note": "setting out"}, "relay": {}, "base": {"shift": "day"}}
        self.acting = list(observations)
        return observations, infos

    def step(self, actions):
        if sorted(actions) != sorted(self.acting):
            raise ValueError(f"actions for {sorted(actions)}, expected {sorted(self.acting)}")
        self.t += 1
        live = list(self.agents)
        rewards = {agent: 0.0 for agent in live}
        terminations = {agent: False for agent in live}
        truncations = {agent: False for agent in live}
        infos = {}
        if "scout" in actions:
            move = np.asarray(actions["scout"])
            if self.fail_on_diagonal and np.all(move == 1):
                raise RuntimeError("the scout cannot move diagonally")
            self.position = np.clip(self.position + move, -4, 4).astype(np.float32)
            self.fuel -= 1
            arrived = bool(np.abs(self.position - self.goal).sum() < 0.5)
            terminations["scout"] = arrived or self.fuel == 0
            rewards["scout"] = 1.0 if arrived else -0.1
            infos["scout"] = {"note": "arrived" if arrived else "out of fuel" if self.fuel == 0 else "walking",
                              "distance": np.abs(self.position - self.goal).astype(np.float32)}
        relay_action = int(actions["relay"])
        self.signal = np.roll(self.signal, relay_action) * 0.9
        rewards["relay"] = 0.25 * relay_action
        infos["relay"] = {"signal": self.signal.copy(), "stats": {"step": self.t, "label": f"relay-{relay_action}"}}
        rewards["base"] = 0.05 * relay_action + (0.5 * (int(actions["base"]) - 1) if "base" in actions else 0.0)
        if self.t >= self.max_episode_steps:
            for agent in live:
                truncations[agent] = not terminations[agent]
        observed = [a for a in live if a != "base" or self.t % 2 == 0 or truncations["base"]]
        observations = {agent: self._observe(agent) for agent in observed}
        if "base" in observations:
            infos["base"] = {"level": np.array([self.level, -self.level]), "shift": "night" if self.t % 4 else "day"}
        self.agents = [a for a in live if not (terminations[a] or truncations[a])]
        self.acting = [a for a in observations if a in self.agents]
        return observations, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass

    def _observe(self, agent: str):
        if agent == "scout":
            return {"position": self.position.copy(), "fuel": np.int64(self.fuel)}
        if agent == "relay":
            return self.signal.copy()
        return np.array([[self.t / 10, -self.t / 10], [self.level, 0.0]], np.float32).clip(-1, 1)


def expedition() -> Expedition:
    return Expedition()


def failing_expedition() -> Expedition:
    """An Expedition whose scout raises on a diagonal move (1, 1): a bug in user code."""
    return Expedition(fail_on_diagonal=True)


class NoAgents:
    """Looks multi-agent (agent-keyed space methods) but names no agents."""

    possible_agents: list[str] = []
    agents: list[str] = []

    def observation_space(self, agent):
        return spaces.Discrete(2)

    def action_space(self, agent):
        return spaces.Discrete(2)

    def close(self) -> None:
        pass


def no_agents() -> NoAgents:
    return NoAgents()


# ---------------------------------------------------------------------------------
# The Python twin of examples/node-env/duel.js.
# ---------------------------------------------------------------------------------

MASK64 = (1 << 64) - 1


class SplitMix64:
    """duel.js's random stream, bit for bit."""

    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return self.next() % n


class Duel:
    """Two runners, ``red`` and ``blue``, race to their own beacons on a 7 x 7 grid (duel.js).

    Simultaneous moves, Discrete(4) each (0 west, 1 east, 2 south, 3 north). Observation,
    Box(0, 1, (6,), float32): own x, y, own beacon x, y, the rival's x, y, scaled by 1/6.
    -0.02 a step; reaching the beacon terminates the runner with +1 if nobody arrived
    before, +0.5 otherwise, while the rival runs on. Truncated after 30 steps.
    """

    SIZE, MAX_STEPS = 7, 30
    MOVES = ((-1, 0), (1, 0), (0, -1), (0, 1))
    max_episode_steps = MAX_STEPS

    def __init__(self):
        self.possible_agents = ["red", "blue"]
        self.agents: list[str] = []
        self.space = spaces.Box(0.0, 1.0, (6,), np.float32)
        self.rng = SplitMix64(0)

    def observation_space(self, agent: str) -> spaces.Space:
        return self.space

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(4)

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self.rng = SplitMix64(seed)
        cells: list[int] = []
        while len(cells) < 4:  # red, red's beacon, blue, blue's beacon: distinct cells
            cell = self.rng.below(self.SIZE * self.SIZE)
            if cell not in cells:
                cells.append(cell)
        self.position = {"red": divmod(cells[0], self.SIZE)[::-1], "blue": divmod(cells[2], self.SIZE)[::-1]}
        self.beacon = {"red": divmod(cells[1], self.SIZE)[::-1], "blue": divmod(cells[3], self.SIZE)[::-1]}
        self.steps, self.finished = 0, 0
        self.agents = list(self.possible_agents)
        return ({agent: self._observe(agent) for agent in self.agents},
                {agent: {"distance": np.int64(self._distance(agent))} for agent in self.agents})

    def step(self, actions):
        self.steps += 1
        live = list(self.agents)
        for agent in live:
            dx, dy = self.MOVES[int(actions[agent])]
            x, y = self.position[agent]
            self.position[agent] = (min(self.SIZE - 1, max(0, x + dx)), min(self.SIZE - 1, max(0, y + dy)))
        arrived = [agent for agent in live if self.position[agent] == self.beacon[agent]]
        rewards = {agent: (1.0 if self.finished == 0 else 0.5) if agent in arrived else -0.02 for agent in live}
        infos = {}
        for agent in live:
            infos[agent] = {"distance": np.int64(self._distance(agent))}
            if agent in arrived:
                infos[agent]["result"] = "first" if self.finished == 0 else "second"
        self.finished += len(arrived)
        terminations = {agent: agent in arrived for agent in live}
        truncations = {agent: agent not in arrived and self.steps >= self.MAX_STEPS for agent in live}
        observations = {agent: self._observe(agent) for agent in live}
        self.agents = [agent for agent in live if not (terminations[agent] or truncations[agent])]
        return observations, rewards, terminations, truncations, infos

    def close(self) -> None:
        pass

    def _distance(self, agent: str) -> int:
        (x, y), (bx, by) = self.position[agent], self.beacon[agent]
        return abs(bx - x) + abs(by - y)

    def _observe(self, agent: str) -> np.ndarray:
        rival = "blue" if agent == "red" else "red"
        values = [*self.position[agent], *self.beacon[agent], *self.position[rival]]
        return np.array([v / (self.SIZE - 1) for v in values], np.float32)


# ---------------------------------------------------------------------------------
# A wrap for make_vector_env: one seat of tic-tac-toe as a gymnasium env.
# ---------------------------------------------------------------------------------


def x_against_random(env: TicTacToe):
    """``env`` played as ``x`` against a seeded random ``o``."""
    import gymnasium as gym

    class XAgainstRandom(gym.Env):
        observation_space = env.observation_space("x")
        action_space = env.action_space("x")

        def __init__(self):
            self.opponent = random_player(self.observation_space, self.action_space, seed=0)

        def reset(self, *, seed=None, options=None):
            observations, infos = env.reset(seed=seed, options=options)
            return observations["x"], infos["x"]

        def step(self, action):
            observations, rewards, terminations, truncations, infos = env.step({"x": action})
            if "o" in observations and env.agents:
                observations, rewards, terminations, truncations, infos = env.step(
                    {"o": self.opponent(observations["o"])})
            return observations["x"], rewards["x"], terminations["x"], truncations["x"], infos.get("x", {})

        def close(self):
            env.close()

    return XAgainstRandom()


# The package's own tic-tac-toe and its scripted players, by name.
TICTACTOE = "actorlearner.envs.tictactoe:tic_tac_toe"
RANDOM = "actorlearner.envs.tictactoe:random_player"
HEURISTIC = "actorlearner.envs.tictactoe:heuristic_player"
