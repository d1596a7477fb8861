"""What Ape-X DQN and R2D2 share: discrete action branches, per-actor Ape-X epsilons (and their config
options), an online Q network to act with, and a trainer with a target copy and one Adam optimizer."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from actorlearner.algorithms.base import (
    CapturableTrainer,
    ClassPartsSpec,
    FlatState,
    Policy,
    follow_lr,
    load_modules_state,
    load_weights,
    make_adam,
    modules_state,
    seeded,
    torch_dtype,
    weights,
)
from actorlearner.config import RUNTIME
from actorlearner.networks import ActionBranches, action_branches, leaf_fields


def apex_epsilons(num_actors: int, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X per-actor exploration: eps_i = base ** (1 + alpha * i / (N - 1)); N == 1 gives [base]."""
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if num_actors == 1:
        return [base]
    return [base ** (1.0 + alpha * i / (num_actors - 1)) for i in range(num_actors)]


@dataclass
class ApeXExploration:
    """The options of `ApeXPolicy`'s per-actor epsilons. A config lists them after its own, so it extends
    this class and a dataclass of its own options, in that order: ``DQNConfig(ApeXExploration, DQNOptions)``."""

    epsilon_base: float = field(default=0.4, metadata=RUNTIME)
    """Ape-X exploration: actor i of N uses epsilon_base ** (1 + epsilon_alpha * i / (N - 1))."""
    epsilon_alpha: float = field(default=7.0, metadata=RUNTIME)
    """Ape-X exploration exponent (see epsilon_base)."""


class GreedyQPolicy(nn.Module):
    """What `export_policy` hands out: observation leaves (positional, in leaf order) -> greedy env actions."""

    def __init__(self, network: nn.Module, keys: tuple[str, ...], branches: ActionBranches):
        super().__init__()
        self.network, self.keys = network, keys
        self.action_shape, self.action_dtype = branches.shape, torch_dtype(branches.dtype)
        self.register_buffer("starts", torch.tensor(branches.starts, dtype=torch.long), persistent=False)

    def forward(self, *leaves: Tensor) -> Tensor:
        return self.actions(self.network(dict(zip(self.keys, leaves))))

    def actions(self, q: Tensor) -> Tensor:
        """Q values [B, D, N] -> the greedy env actions [B, *shape], as `ActionBranches.from_indices` makes them."""
        actions = (q.argmax(dim=-1) + self.starts).to(self.action_dtype)
        return actions.reshape(q.shape[0], *self.action_shape)


class ApeXSpec(ClassPartsSpec):
    """A Q-learning spec over any supported observation space and discrete (possibly branched) actions;
    a subclass makes its Q network (`make_network`)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Any = None):
        super().__init__(observation_space, action_space, config)
        self.branches = action_branches(action_space)
        self.observation_leaves = leaf_fields(observation_space)  # raises UnsupportedSpace naming the space

    @abstractmethod
    def make_network(self) -> nn.Module:
        """A fresh Q network (built under the seeded RNG)."""


class ApeXPolicy(Policy):
    """The online Q network, per-actor Ape-X epsilons and epsilon-greedy over all branches together.
    Its config is an `ApeXExploration`."""

    greedy_policy: ClassVar[type[GreedyQPolicy]] = GreedyQPolicy

    def __init__(self, spec: ApeXSpec, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device)
        self.branches = spec.branches
        self.online = seeded(seed, spec.make_network).to(self.device)
        self._rng = np.random.default_rng(seed)
        self._sizes = np.asarray(self.branches.sizes)

    def exploration(self, actor_index: int, num_actors: int) -> float:
        """Actor i's Ape-X epsilon."""
        num_actors = max(num_actors, 1)
        return apex_epsilons(num_actors, self.config.epsilon_base, self.config.epsilon_alpha)[actor_index % num_actors]

    def epsilon_greedy(self, greedy: np.ndarray, exploration: np.ndarray | float,
                       legal: np.ndarray | None = None) -> np.ndarray:
        """Env actions from greedy branch indices [E, D]: each row all random with probability ``exploration``
        (uniform over the actions ``legal`` [E, N] marks 1, when the observation masks actions)."""
        n = greedy.shape[0]
        if type(exploration) is not float:  # an actor's is a float: the comparison below broadcasts it
            exploration = np.broadcast_to(np.asarray(exploration, dtype=np.float64), (n,))
        explore = self._rng.random(n) < exploration
        if legal is not None:
            random_actions = (self._rng.random(legal.shape) * (legal >= 0.5)).argmax(-1)[:, None]
        else:
            random_actions = (self._rng.random(greedy.shape) * self._sizes).astype(np.int64)
        return self.branches.from_indices(np.where(explore[:, None], random_actions, greedy))

    def export_policy(self) -> nn.Module:
        """The greedy policy on the online network itself, in eval mode (see `Policy`)."""
        return self.greedy_policy(self.online, tuple(self.spec.observation_leaves), self.branches).train(False)

    def policy_state_dict(self) -> dict[str, Tensor]:
        return weights(self.online)

    def load_policy_state_dict(self, state: Mapping[str, Tensor]) -> None:
        load_weights(self.online, state)


class ApeXTrainer(CapturableTrainer):
    """An online and a target Q network (seeded as the policy's online one) and one Adam optimizer; the
    target is copied every ``target_update_period`` steps, between captured steps."""

    runtime_tensors: ClassVar[tuple[str, ...]] = ("priority_eps", "max_grad_norm")

    def __init__(self, spec: ApeXSpec, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device)
        self.branches = spec.branches
        self.online, self.target = seeded(seed, lambda: (spec.make_network(), spec.make_network()))
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.online.to(self.device)
        self.target.to(self.device)
        self.optimizer = make_adam(self.online.parameters(), self.config.lr, self.device)
        self.num_updates = 0

    def advance(self) -> None:
        """Count the step; sync the target network every ``target_update_period`` of them."""
        self.num_updates += 1
        if self.num_updates % self.config.target_update_period == 0:
            self.sync_target()

    @torch.no_grad()
    def sync_target(self) -> None:
        """The target takes the online weights (moves ``tau`` of the way when ``tau`` < 1)."""
        tau = getattr(self.config, "tau", 1.0)
        if tau >= 1.0:
            self.target.load_state_dict(self.online.state_dict())
            return
        torch._foreach_lerp_(list(self.target.parameters()), list(self.online.parameters()), tau)

    def retune(self, config: Any) -> None:
        """Take a config with other runtime-tunable options; the optimizer's lr follows it."""
        super().retune(config)
        follow_lr(self, config.lr)

    def policy_tensors(self) -> dict[str, Tensor]:
        return self.online.state_dict()

    def state_dict(self) -> FlatState:
        """Flat names -> CPU tensors / ints: `online.*`, `target.*`, `optimizer.<param>.<slot>`, `num_updates`."""
        return {**modules_state(self._modules(), {"optimizer": self.optimizer}), "num_updates": self.num_updates}

    def load_state_dict(self, state: Mapping[str, Tensor | int | float]) -> None:
        load_modules_state(state, self._modules(), {"optimizer": self.optimizer}, ("num_updates",))
        self.num_updates = int(state["num_updates"])

    def _modules(self) -> dict[str, nn.Module]:
        return {"online": self.online, "target": self.target}
