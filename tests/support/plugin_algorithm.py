"""A user's own algorithm, outside the package: tabular Q-learning, named ``plugin_algorithm:TabularQ``.

It shares nothing with DQN: its own replay fields ("state", "next_state", "done"), its
own one-step assembler, its own exploration and state dicts, a policy and a trainer that each
keep a table. The learner, the actors and ``run`` resolve it by name and train it like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

from actorlearner.algorithms import AlgorithmSpec, Policy, Trainer
from actorlearner.networks import UnsupportedSpace


@dataclass
class TabularQConfig:
    """Tabular Q-learning: one value per (state, action)."""

    lr: float = 0.5
    """Step size of each table update."""
    gamma: float = 0.9
    """Discount per step."""
    epsilon: float = 0.3
    """Every actor's chance of a random action."""


class OneStepAssembler:
    """(state, action, reward, done, next_state) per real env step of a NEXT_STEP-autoreset vector env."""

    def __init__(self, num_envs: int):
        self.autoreset = np.zeros(num_envs, bool)

    def push(self, obs, action, reward, terminated, truncated, next_obs) -> dict[str, np.ndarray] | None:
        live = ~self.autoreset
        self.autoreset = live & (np.asarray(terminated) | np.asarray(truncated))
        if not live.any():
            return None
        return {"state": np.asarray(obs, np.int64)[live], "action": np.asarray(action, np.int64)[live],
                "reward": np.asarray(reward, np.float32)[live], "done": np.asarray(terminated, np.float32)[live],
                "next_state": np.asarray(next_obs, np.int64)[live]}

    def flush(self) -> None:
        return None  # nothing is ever pending

    def inherit(self, previous: OneStepAssembler) -> None:
        self.autoreset = previous.autoreset.copy()


def q_table(observation_space: gym.Space, action_space: gym.Space, device: str | torch.device) -> Tensor:
    """A zero table [states, actions] on ``device``."""
    return torch.zeros(int(observation_space.n), int(action_space.n), device=device)


class TabularQ(AlgorithmSpec):
    """Q-learning on a table, for a Discrete observation and a Discrete action space."""

    name: ClassVar[str] = "tabq"
    config_class: ClassVar[type] = TabularQConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: TabularQConfig | None = None):
        for role, space in (("observation", observation_space), ("action", action_space)):
            if not isinstance(space, gym.spaces.Discrete):
                raise UnsupportedSpace(role, space, reason="tabular Q-learning needs Discrete")
        super().__init__(observation_space, action_space, config)
        self.starts = (int(observation_space.start), int(action_space.start))

    def transition_fields(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"state": ((), torch.int64), "action": ((), torch.int64), "reward": ((), torch.float32),
                "done": ((), torch.float32), "next_state": ((), torch.int64)}

    def make_assembler(self, num_envs: int, policy: Policy) -> OneStepAssembler:
        return OneStepAssembler(num_envs)

    def make_policy(self, *, device: str | torch.device = "cpu", seed: int = 0) -> TabularQPolicy:
        return TabularQPolicy(self, device=device, seed=seed)

    def make_trainer(self, *, device: str | torch.device = "cpu", seed: int = 0) -> TabularQTrainer:
        return TabularQTrainer(self, device=device)

    def td(self, table: Tensor, data: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """(state indices, action indices, TD errors) of a batch of items under ``table``."""
        device = table.device
        s = torch.as_tensor(data["state"], device=device) - self.starts[0]
        a = torch.as_tensor(data["action"], device=device) - self.starts[1]
        s_next = torch.as_tensor(data["next_state"], device=device) - self.starts[0]
        not_done = 1.0 - torch.as_tensor(data["done"], device=device)
        target = torch.as_tensor(data["reward"], device=device) + self.config.gamma * not_done * table[s_next].max(1).values
        return s, a, target - table[s, a]


class TabularQPolicy(Policy):
    """Epsilon-greedy on the table; initial priorities from its TD errors. Not exportable."""

    def __init__(self, spec: TabularQ, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device)
        self.table = q_table(spec.observation_space, spec.action_space, device)
        self._rng = np.random.default_rng(seed)

    def exploration(self, actor_index: int, num_actors: int) -> float:
        return self.config.epsilon

    def act(self, obs, exploration: float) -> np.ndarray:
        states = torch.as_tensor(np.asarray(obs, np.int64) - self.spec.starts[0], device=self.table.device)
        greedy = self.table[states].argmax(dim=1).cpu().numpy()
        explore = self._rng.random(len(greedy)) < exploration
        actions = np.where(explore, self._rng.integers(self.table.shape[1], size=len(greedy)), greedy)
        return actions + self.spec.starts[1]

    def initial_priorities(self, fields: Mapping[str, Tensor]) -> Tensor:
        return self.spec.td(self.table, fields)[2].abs() + 1e-3

    def policy_state_dict(self) -> dict[str, Tensor]:
        return {"table": self.table.detach().cpu().clone()}

    def load_policy_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.table.copy_(torch.as_tensor(state["table"]))


class TabularQTrainer(Trainer):
    """Moves each visited cell by lr times its mean TD error; no torch optimizer."""

    def __init__(self, spec: TabularQ, *, device: str | torch.device = "cpu"):
        super().__init__(spec, device=device)
        self.table = q_table(spec.observation_space, spec.action_space, device)
        self.updates = 0

    def update(self, sample) -> tuple[Tensor, dict[str, float]]:
        s, a, td = self.spec.td(self.table, sample.data)
        cells = s * self.table.shape[1] + a  # each visited cell moves by lr times its mean TD error
        sums = torch.zeros(self.table.numel(), device=td.device).index_add_(0, cells, td)
        counts = torch.zeros(self.table.numel(), device=td.device).index_add_(0, cells, torch.ones_like(td))
        self.table += self.config.lr * (sums / counts.clamp(min=1)).view_as(self.table)
        self.updates += 1
        return td.abs() + 1e-3, {"losses/td_abs": float(td.abs().mean())}

    def policy_tensors(self) -> dict[str, Tensor]:
        return {"table": self.table}

    def state_dict(self) -> dict[str, Tensor | int]:
        return {"table": self.table.detach().cpu().clone(), "updates": self.updates}

    def load_state_dict(self, state: Mapping[str, Tensor | int]) -> None:
        self.table.copy_(torch.as_tensor(state["table"]))
        self.updates = int(state["updates"])
