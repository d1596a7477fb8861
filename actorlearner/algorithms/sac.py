"""Soft actor-critic for continuous (Box) actions, on n-step returns, with |TD| replay priorities.

The actor is a squashed Gaussian: ``a = low + (tanh(u) + 1) / 2 * (high - low)`` with
``u ~ N(mu(s), sigma(s))``, so every action lies inside the env's own bounds, per dimension.
Twin critics with Polyak-averaged targets read the action rescaled to [-1, 1]; the entropy
temperature is tuned toward ``-action_dim``. Actors receive the actor network only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from actorlearner.algorithms.base import FlatState, SampleLike, TransitionFields
from actorlearner.algorithms.nstep import NStepAssembler, nstep_fields
from actorlearner.networks import (
    ObservationEncoder,
    UnsupportedSpace,
    field_name,
    leaf_arrays,
    leaf_fields,
)

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class SACConfig:
    """SAC hyperparameters; the defaults learn Pendulum-v1."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    """Widths of the MLP hidden layers of the actor and of each critic."""
    channel_order: str = "auto"
    """Channel axis of image observations: hwc, chw, or auto."""
    lr: float = 1e-3
    """Adam learning rate of the actor, the critics and the temperature."""
    gamma: float = 0.99
    """Per-step discount; the actors fold it into each transition's `discount`."""
    n_step: int = 1
    """Rewards summed per transition before bootstrapping."""
    tau: float = 0.005
    """Polyak step of the target critics after every update."""
    initial_temperature: float = 1.0
    """Entropy temperature at the start; tuned toward an entropy of -action_dim."""
    priority_eps: float = 1e-6
    """Added to |TD| so that no item's priority is zero."""

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        if self.n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {self.n_step}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.initial_temperature <= 0:
            raise ValueError(f"initial_temperature must be > 0, got {self.initial_temperature}")


def _mlp(width: int, hidden_sizes: tuple[int, ...], out: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for size in hidden_sizes:
        layers += [nn.Linear(width, size), nn.ReLU()]
        width = size
    return nn.Sequential(*layers, nn.Linear(width, out))


class Actor(nn.Module):
    """Observations -> the mean and log-std of the pre-squash Gaussian, [B, A] each."""

    def __init__(self, observation_space: gym.Space, action_dim: int, config: SACConfig):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, config.hidden_sizes, config.channel_order)
        self.head = nn.Linear(self.encoder.output_dim, 2 * action_dim)

    def forward(self, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        mean, log_std = self.head(self.encoder(obs)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)


class Critic(nn.Module):
    """(observations, action in [-1, 1]) -> Q [B]."""

    def __init__(self, observation_space: gym.Space, action_dim: int, config: SACConfig):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, (), config.channel_order)
        self.mlp = _mlp(self.encoder.output_dim + action_dim, config.hidden_sizes, 1)

    def forward(self, obs: Mapping[str, Tensor], action: Tensor) -> Tensor:
        return self.mlp(torch.cat([self.encoder(obs), action], dim=-1)).squeeze(-1)


class SAC:
    """Soft actor-critic over any supported observation space and a Box action space."""

    name: ClassVar[str] = "sac"
    config_class: ClassVar[type] = SACConfig

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: SACConfig | None = None, *,
                 device: str | torch.device = "cpu", seed: int = 0):
        if not isinstance(action_space, gym.spaces.Box) or action_space.dtype.kind != "f":
            raise UnsupportedSpace("action", action_space, reason="SAC needs a float Box action space")
        if not (np.isfinite(action_space.low).all() and np.isfinite(action_space.high).all()):
            raise UnsupportedSpace("action", action_space, reason="SAC needs finite action bounds")
        self.config = config or SACConfig()
        self.observation_space, self.action_space = observation_space, action_space
        self._obs_leaves = leaf_fields(observation_space)  # raises UnsupportedSpace naming the space
        self.action_shape = tuple(action_space.shape)
        action_dim = int(np.prod(self.action_shape))
        self.device = torch.device(device)
        self.low = torch.as_tensor(action_space.low.reshape(-1), dtype=torch.float32, device=self.device)
        self.high = torch.as_tensor(action_space.high.reshape(-1), dtype=torch.float32, device=self.device)
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(seed)
            self.actor = Actor(observation_space, action_dim, self.config)
            self.critics = nn.ModuleList(Critic(observation_space, action_dim, self.config) for _ in range(2))
            self.targets = nn.ModuleList(Critic(observation_space, action_dim, self.config) for _ in range(2))
        self.targets.load_state_dict(self.critics.state_dict())
        self.targets.requires_grad_(False)
        for net in (self.actor, self.critics, self.targets):
            net.to(self.device)
        self.log_alpha = torch.tensor(math.log(self.config.initial_temperature), device=self.device, requires_grad=True)
        self.target_entropy = -float(action_dim)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=self.config.lr)
        self.critic_optimizer = torch.optim.Adam(self.critics.parameters(), lr=self.config.lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=self.config.lr)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.num_updates = 0

    def transition_fields(self) -> TransitionFields:
        return nstep_fields(self.observation_space, self.action_shape, torch.float32)

    # ------------------------------------------------------------ actor side

    def make_assembler(self, num_envs: int) -> NStepAssembler:
        return NStepAssembler(num_envs, self.config.n_step, self.config.gamma, self.observation_space,
                              self.action_shape, np.float32)

    def exploration(self, actor_index: int, num_actors: int) -> float:
        """Every actor samples from the policy (1); 0 acts with the mean, as the evaluator does."""
        return 1.0

    @torch.no_grad()
    def act(self, obs: Any, exploration: float) -> np.ndarray:
        """Actions inside the env's bounds: sampled when ``exploration`` > 0, else the squashed mean."""
        mean, log_std = self.actor(self._leaves(leaf_arrays(self.observation_space, obs)))
        u = mean + log_std.exp() * torch.randn(mean.shape, generator=self.generator, device=self.device) \
            if exploration > 0 else mean
        actions = self._to_env(torch.tanh(u)).cpu().numpy()
        return actions.reshape(len(actions), *self.action_shape).astype(self.action_space.dtype)

    def initial_priorities(self, fields: Mapping[str, Tensor]) -> None:
        """None: actors hold no critics, so new items go in at the learner's maximum priority."""
        return None

    # ------------------------------------------------------------ learner side

    def update(self, sample: SampleLike) -> tuple[Tensor, dict[str, float]]:
        """One step of the critics, the actor and the temperature; returns (|TD| + eps [B], metrics)."""
        data = {name: torch.as_tensor(value, device=self.device) for name, value in sample.data.items()}
        obs = {key: data[field_name("obs", key)] for key in self._obs_leaves}
        next_obs = {key: data[field_name("next_obs", key)] for key in self._obs_leaves}
        action = self._to_unit(data["action"].reshape(len(data["reward"]), -1).float())
        weights = torch.as_tensor(sample.weights, device=self.device, dtype=torch.float32)
        alpha = self.log_alpha.exp().detach()

        with torch.no_grad():
            next_action, next_logp = self._sample(next_obs)
            next_q = torch.min(*(target(next_obs, next_action) for target in self.targets))
            target = data["reward"].float() + data["discount"].float() * (next_q - alpha * next_logp)
        q1, q2 = (critic(obs, action) for critic in self.critics)
        td1, td2 = target - q1, target - q2
        critic_loss = (weights * (td1.pow(2) + td2.pow(2))).mean()
        self.critic_optimizer.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_optimizer.step()

        new_action, logp = self._sample(obs)
        self.critics.requires_grad_(False)
        q_new = torch.min(*(critic(obs, new_action) for critic in self.critics))
        self.critics.requires_grad_(True)
        actor_loss = (alpha * logp - q_new).mean()
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()

        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_optimizer.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_optimizer.step()

        with torch.no_grad():
            for target_param, param in zip(self.targets.parameters(), self.critics.parameters()):
                target_param.lerp_(param, self.config.tau)
        self.num_updates += 1
        td_abs = ((td1.abs() + td2.abs()) / 2).detach()
        values = torch.stack([critic_loss.detach(), actor_loss.detach(), alpha, td_abs.mean(), q1.detach().mean(),
                              -logp.detach().mean()]).tolist()
        names = ("losses/critic_loss", "losses/actor_loss", "losses/temperature", "losses/td_abs",
                 "losses/q_values", "losses/entropy")
        return td_abs + self.config.priority_eps, dict(zip(names, values))

    def _sample(self, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """A reparameterized squashed sample in [-1, 1] and its log-probability [B]."""
        mean, log_std = self.actor(obs)
        std = log_std.exp()
        u = mean + std * torch.randn(mean.shape, generator=self.generator, device=self.device)
        squashed = torch.tanh(u)
        gaussian = -0.5 * (((u - mean) / std) ** 2 + 2 * log_std + math.log(2 * math.pi))
        # log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), numerically stable.
        correction = 2 * (math.log(2) - u - nn.functional.softplus(-2 * u))
        return squashed, (gaussian - correction).sum(-1)

    def _to_env(self, unit: Tensor) -> Tensor:
        return self.low + (unit + 1) * 0.5 * (self.high - self.low)

    def _to_unit(self, action: Tensor) -> Tensor:
        return ((action - self.low) / (self.high - self.low) * 2 - 1).clamp(-1, 1)

    def _leaves(self, arrays: Mapping[str, np.ndarray]) -> dict[str, Tensor]:
        return {key: torch.as_tensor(array, device=self.device) for key, array in arrays.items()}

    # ------------------------------------------------------------ state

    def policy_state_dict(self) -> dict[str, Tensor]:
        return {name: t.detach().to("cpu", copy=True) for name, t in self.actor.state_dict().items()}

    def load_policy_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.actor.load_state_dict({name: torch.as_tensor(t) for name, t in state.items()})

    def _parts(self) -> dict[str, Any]:
        return {"actor": self.actor, "critics": self.critics, "targets": self.targets}

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor_optimizer": self.actor_optimizer, "critic_optimizer": self.critic_optimizer,
                "alpha_optimizer": self.alpha_optimizer}

    def state_dict(self) -> FlatState:
        """Flat names -> CPU tensors / ints: networks, optimizer slots, the temperature, the counter."""
        out: FlatState = {}
        for prefix, net in self._parts().items():
            for name, t in net.state_dict().items():
                out[f"{prefix}.{name}"] = t.detach().to("cpu", copy=True)
        for prefix, optimizer in self._optimizers().items():
            for index, slots in optimizer.state_dict()["state"].items():
                for slot, value in slots.items():
                    out[f"{prefix}.{index}.{slot}"] = (value.detach().to("cpu", copy=True)
                                                       if isinstance(value, Tensor) else value)
        out["log_alpha"] = self.log_alpha.detach().to("cpu", copy=True)
        out["generator"] = self.generator.get_state()
        out["num_updates"] = self.num_updates
        return out

    def load_state_dict(self, state: Mapping[str, Tensor | int | float]) -> None:
        nets: dict[str, dict[str, Tensor]] = {prefix: {} for prefix in self._parts()}
        optimizer_states: dict[str, dict[int, dict[str, Any]]] = {prefix: {} for prefix in self._optimizers()}
        for key, value in state.items():
            prefix, _, rest = key.partition(".")
            if prefix in nets:
                nets[prefix][rest] = torch.as_tensor(value)
            elif prefix in optimizer_states:
                index, _, slot = rest.partition(".")
                optimizer_states[prefix].setdefault(int(index), {})[slot] = value
            elif key not in ("log_alpha", "generator", "num_updates"):
                raise KeyError(f"unexpected key in SAC state: {key!r}")
        for prefix, net in self._parts().items():
            net.load_state_dict(nets[prefix])
        for prefix, optimizer in self._optimizers().items():
            groups = optimizer.state_dict()["param_groups"]
            optimizer.load_state_dict({"state": optimizer_states[prefix], "param_groups": groups})
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(state["log_alpha"]))
        self.generator.set_state(torch.as_tensor(state["generator"]))
        self.num_updates = int(state["num_updates"])
