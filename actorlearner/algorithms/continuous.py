"""What SAC and TD3 share: exact Box rescaling, twin critics with Polyak targets, n-step items, state.

Actions live in the unit box [-1, 1]^A inside the networks and are rescaled per dimension to
the env's own bounds, ``a = low + (u + 1) / 2 * (high - low)``, so asymmetric and per-dimension
bounds are exact and nothing an actor sends can leave them. Critics read the unit action.
Policies hold the actor network only; new items go in at the learner's maximum priority.
"""

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
    SampleLike,
    TransitionFields,
    check_common_config,
    follow_lr,
    load_modules_state,
    load_weights,
    make_adam,
    modules_state,
    seeded,
    torch_dtype,
    weights,
)
from actorlearner.algorithms.nstep import NStepAssembler, nstep_fields
from actorlearner.checkpoint.generator import generator_keys, generator_state, load_generator_state
from actorlearner.config import RUNTIME
from actorlearner.networks import (
    ObservationEncoder,
    UnsupportedSpace,
    field_name,
    leaf_arrays,
    leaf_fields,
)

LEARNER_DEFAULTS: Mapping[str, Any] = {"batch_size": 256, "samples_per_insert": 128.0, "min_replay_size": 1_000}
"""Learner options SAC and TD3 learn Pendulum-v1 with: half an update of 256 per env step."""


@dataclass
class ContinuousConfig:
    """Hyperparameters SAC and TD3 share; each extends it with its own."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    """Widths of the MLP hidden layers of the actor and of each critic."""
    channel_order: str = "auto"
    """Channel axis of image observations: hwc, chw, or auto."""
    lr: float = field(default=1e-3, metadata=RUNTIME)
    """Adam learning rate of every network and, in SAC, of the temperature."""
    gamma: float = 0.99
    """Per-step discount; the actors fold it into each transition's `discount`."""
    n_step: int = 1
    """Rewards summed per transition before bootstrapping."""
    tau: float = field(default=0.005, metadata=RUNTIME)
    """Polyak step of the target networks each time they move."""
    random_steps: int = 0
    """Vector-env steps each actor takes with uniform random actions before following the policy."""
    priority_eps: float = field(default=1e-6, metadata=RUNTIME)
    """Added to |TD| so that no item's priority is zero."""

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        check_common_config(self)
        if self.random_steps < 0:
            raise ValueError(f"random_steps must be >= 0, got {self.random_steps}")


def mlp(width: int, hidden_sizes: tuple[int, ...], out: int) -> nn.Sequential:
    """Linear-ReLU layers of ``hidden_sizes`` then a linear layer to ``out``."""
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return nn.Sequential(*layers, nn.Linear(width, out))


class Critic(nn.Module):
    """(observations, action in [-1, 1]) -> Q [B]."""

    def __init__(self, observation_space: gym.Space, action_dim: int, hidden_sizes: tuple[int, ...],
                 channel_order: str):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, (), channel_order)
        self.mlp = mlp(self.encoder.output_dim + action_dim, hidden_sizes, 1)

    def forward(self, obs: Mapping[str, Tensor], action: Tensor) -> Tensor:
        return self.mlp(torch.cat([self.encoder(obs), action], dim=-1)).squeeze(-1)


class UnitBox:
    """Exact rescaling between the unit box [-1, 1]^A and a Box space's bounds, on one device."""

    def __init__(self, space: gym.spaces.Box, device: torch.device):
        self.low = torch.as_tensor(space.low.reshape(-1), dtype=torch.float32, device=device)
        self.high = torch.as_tensor(space.high.reshape(-1), dtype=torch.float32, device=device)

    def to_env(self, unit: Tensor) -> Tensor:
        """Unit-box actions rescaled to the bounds; the clamp absorbs float rounding at the edges."""
        return (self.low + (unit + 1) * 0.5 * (self.high - self.low)).clamp(self.low, self.high)

    def to_unit(self, action: Tensor) -> Tensor:
        return ((action - self.low) / (self.high - self.low) * 2 - 1).clamp(-1, 1)


class Batch:
    """A replay sample on the device: observation leaves, unit actions [B, A], rewards, discounts, IS weights."""

    def __init__(self, trainer: ContinuousTrainer, sample: SampleLike):
        data = {name: torch.as_tensor(value, device=trainer.device) for name, value in sample.data.items()}
        leaves = trainer.spec.observation_leaves
        self.obs = {key: data[field_name("obs", key)] for key in leaves}
        self.next_obs = {key: data[field_name("next_obs", key)] for key in leaves}
        self.reward = data["reward"].float()
        self.discount = data["discount"].float()
        self.action = trainer.box.to_unit(data["action"].reshape(len(self.reward), -1).float())
        self.weights = torch.as_tensor(sample.weights, device=trainer.device, dtype=torch.float32)


class GreedyBoxPolicy(nn.Module):
    """What `export_policy` hands out: observation leaves (positional, in leaf order) -> the env actions
    `act` takes at exploration 0, computed by the policy's own `unit_action` and `to_env`."""

    def __init__(self, policy: ContinuousPolicy):
        super().__init__()
        self.policy = policy
        self.actor = policy.actor  # a submodule: the module's state dict is the actor's weights
        self.keys = tuple(policy.spec.observation_leaves)
        self.action_shape, self.action_dtype = policy.spec.action_shape, torch_dtype(policy.spec.action_space.dtype)

    def forward(self, *leaves: Tensor) -> Tensor:
        actions = self.policy.box.to_env(self.policy.unit_action(dict(zip(self.keys, leaves)), 0.0))
        return actions.reshape(actions.shape[0], *self.action_shape).to(self.action_dtype)


class ContinuousSpec(ClassPartsSpec):
    """Spec of the Box-action actor-critics; a subclass makes its actor. Its config class extends
    `ContinuousConfig`."""

    learner_defaults: ClassVar[Mapping[str, Any]] = LEARNER_DEFAULTS

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Any = None):
        label = self.name.upper()
        if not isinstance(action_space, gym.spaces.Box) or action_space.dtype.kind != "f":
            raise UnsupportedSpace("action", action_space, reason=f"{label} needs a float Box action space")
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise UnsupportedSpace("action", action_space, reason=f"{label} needs finite action bounds")
        super().__init__(observation_space, action_space, config)
        self.observation_leaves = leaf_fields(observation_space)  # raises UnsupportedSpace naming the space
        self.action_shape = tuple(action_space.shape)
        self.action_dim = int(np.prod(self.action_shape))

    @abstractmethod
    def make_actor(self) -> nn.Module:
        """The policy network, built under the seeded RNG; it is all that actors receive."""

    def make_critic(self) -> Critic:
        return Critic(self.observation_space, self.action_dim, self.config.hidden_sizes, self.config.channel_order)

    def transition_fields(self) -> TransitionFields:
        return nstep_fields(self.observation_space, self.action_shape, torch.float32)

    def make_assembler(self, num_envs: int, policy: Policy) -> NStepAssembler:
        return NStepAssembler(num_envs, self.config.n_step, self.config.gamma, self.observation_space,
                              self.action_shape, np.float32)


class SeededNoise:
    """A torch generator of its own, seeded: exploration and target noise never touch the global RNG."""

    def __init__(self, device: torch.device, seed: int):
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def noise(self, shape: tuple[int, ...]) -> Tensor:
        """Standard normal noise from the seeded generator."""
        return torch.randn(shape, generator=self.generator, device=self.generator.device)


class ContinuousPolicy(SeededNoise, Policy):
    """The actor network; a subclass writes `unit_action` and `exploration`."""

    def __init__(self, spec: ContinuousSpec, *, device: str | torch.device = "cpu", seed: int = 0):
        Policy.__init__(self, spec, device=device)
        self.actor = seeded(seed, spec.make_actor).to(self.device)
        self.box = UnitBox(spec.action_space, self.device)
        SeededNoise.__init__(self, self.device, seed)
        self._random_left = self.config.random_steps

    @abstractmethod
    def unit_action(self, obs: Mapping[str, Tensor], exploration: float) -> Tensor:
        """Actions in [-1, 1]^A [B, A]: exploring when ``exploration`` > 0, the evaluation action at 0."""

    @torch.no_grad()
    def act(self, obs: Any, exploration: float) -> np.ndarray:
        """Actions inside the env's bounds [E, *shape]; uniform over them for the first ``random_steps``
        exploring calls, then `unit_action`'s."""
        spec = self.spec
        leaves = {key: torch.as_tensor(array, device=self.device)
                  for key, array in leaf_arrays(spec.observation_space, obs).items()}
        if exploration > 0 and self._random_left > 0:
            self._random_left -= 1
            batch = len(next(iter(leaves.values())))
            unit = torch.rand((batch, spec.action_dim), generator=self.generator, device=self.device) * 2 - 1
        else:
            unit = self.unit_action(leaves, exploration)
        actions = self.box.to_env(unit).cpu().numpy()
        return actions.reshape(len(actions), *spec.action_shape).astype(spec.action_space.dtype)

    def export_policy(self) -> nn.Module:
        """The evaluation policy (exploration 0) on the actor itself, in eval mode (see `Policy`)."""
        return GreedyBoxPolicy(self).train(False)

    def policy_state_dict(self) -> dict[str, Tensor]:
        return weights(self.actor)

    def load_policy_state_dict(self, state: Mapping[str, Tensor]) -> None:
        load_weights(self.actor, state)


class ContinuousTrainer(SeededNoise, CapturableTrainer):
    """The actor, twin critics and their Polyak targets, an Adam optimizer each; a subclass writes `learn`."""

    runtime_tensors: ClassVar[tuple[str, ...]] = ("priority_eps", "tau")

    def __init__(self, spec: ContinuousSpec, *, device: str | torch.device = "cpu", seed: int = 0):
        CapturableTrainer.__init__(self, spec, device=device)
        self.actor, self.critics, self.target_critics = seeded(seed, lambda: (
            spec.make_actor(), nn.ModuleList(spec.make_critic() for _ in range(2)),
            nn.ModuleList(spec.make_critic() for _ in range(2))))
        self.target_critics.load_state_dict(self.critics.state_dict())
        self.target_critics.requires_grad_(False)
        for net in (self.actor, self.critics, self.target_critics):
            net.to(self.device)
        self.box = UnitBox(spec.action_space, self.device)
        self.actor_optimizer = make_adam(self.actor.parameters(), self.config.lr, self.device)
        self.critic_optimizer = make_adam(self.critics.parameters(), self.config.lr, self.device)
        SeededNoise.__init__(self, self.device, seed)
        self.num_updates = 0

    def advance(self) -> None:
        self.num_updates += 1

    def critic_step(self, batch: Batch, target: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """One IS-weighted step of both critics toward ``target`` [B]; returns (|TD| mean of the twins, loss, Q1)."""
        q1, q2 = (critic(batch.obs, batch.action) for critic in self.critics)
        td1, td2 = target - q1, target - q2
        loss = (batch.weights * (td1.pow(2) + td2.pow(2))).mean()
        self.critic_optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.critic_optimizer.step()
        return ((td1.abs() + td2.abs()) / 2).detach(), loss.detach(), q1.detach().mean()

    def min_q(self, critics: nn.ModuleList, obs: Mapping[str, Tensor], action: Tensor) -> Tensor:
        """The smaller of the twin estimates [B]."""
        return torch.min(*(critic(obs, action) for critic in critics))

    @torch.no_grad()
    def polyak(self, targets: nn.Module, online: nn.Module) -> None:
        """targets <- tau * online + (1 - tau) * targets."""
        for target_param, param in zip(targets.parameters(), online.parameters()):
            target_param.lerp_(param, self.knobs.tau)

    def retune(self, config: Any) -> None:
        """Take a config with other runtime-tunable options; every optimizer's lr follows it."""
        super().retune(config)
        follow_lr(self, config.lr)

    def policy_tensors(self) -> dict[str, Tensor]:
        return self.actor.state_dict()

    def modules(self) -> dict[str, nn.Module]:
        """Every network checkpointed, by state prefix."""
        return {"actor": self.actor, "critics": self.critics, "target_critics": self.target_critics}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every optimizer checkpointed, by state prefix."""
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer}

    def state_dict(self) -> FlatState:
        """Flat names -> CPU tensors / ints: networks, optimizer slots, the generator, the counter."""
        return {**modules_state(self.modules(), self.optimizers()), **generator_state(self.generator, "generator"),
                "num_updates": self.num_updates}

    def load_state_dict(self, state: Mapping[str, Tensor | int | float]) -> None:
        load_modules_state(state, self.modules(), self.optimizers(), (*generator_keys("generator"), "num_updates"))
        load_generator_state(self.generator, state, "generator")
        self.num_updates = int(state["num_updates"])
