"""Soft actor-critic for continuous (Box) actions, on n-step returns, with |TD| replay priorities.

The actor is a squashed Gaussian, ``u ~ N(mu(s), sigma(s))``, ``a = tanh(u)`` in the unit box,
rescaled exactly to the env's bounds (`UnitBox`). Twin critics with
Polyak-averaged targets; the entropy temperature is tuned toward ``-action_dim``. Actors
sample; evaluation acts with the squashed mean.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from actorlearner.algorithms.base import SampleLike, make_adam
from actorlearner.algorithms.continuous import (
    Batch,
    ContinuousConfig,
    ContinuousPolicy,
    ContinuousSpec,
    ContinuousTrainer,
)
from actorlearner.networks import ObservationEncoder

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@dataclass
class SACConfig(ContinuousConfig):
    """SAC hyperparameters; the defaults learn Pendulum-v1."""

    initial_temperature: float = 1.0
    """Entropy temperature at the start; tuned toward an entropy of -action_dim."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.initial_temperature <= 0:
            raise ValueError(f"initial_temperature must be > 0, got {self.initial_temperature}")


class Actor(nn.Module):
    """Observations -> the mean and log-std of the pre-squash Gaussian, [B, A] each."""

    def __init__(self, observation_space: gym.Space, action_dim: int, config: SACConfig):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, config.hidden_sizes, config.channel_order)
        self.head = nn.Linear(self.encoder.output_dim, 2 * action_dim)

    def forward(self, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        mean, log_std = self.head(self.encoder(obs)).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)


class Temperature(nn.Module):
    """The entropy temperature, kept as its log so that it stays positive."""

    def __init__(self, initial: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(initial)))

    def forward(self) -> Tensor:
        return self.log_alpha.exp()


class SACPolicy(ContinuousPolicy):
    """Samples the squashed Gaussian; acts with its squashed mean at exploration 0."""

    def exploration(self, actor_index: int, num_actors: int) -> float:
        """Every actor samples from the policy (1); 0 acts with the mean, as the evaluator does."""
        return 1.0

    def unit_action(self, obs: Mapping[str, Tensor], exploration: float) -> Tensor:
        """A squashed policy sample, or the squashed mean when ``exploration`` is 0."""
        mean, log_std = self.actor(obs)
        return torch.tanh(mean + log_std.exp() * self.noise(mean.shape) if exploration > 0 else mean)


class SACTrainer(ContinuousTrainer):
    """Critic, actor and temperature steps; the entropy temperature is tuned toward ``-action_dim``."""

    def __init__(self, spec: SAC, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device, seed=seed)
        self.temperature = Temperature(self.config.initial_temperature).to(self.device)
        self.target_entropy = -float(spec.action_dim)
        self.temperature_optimizer = make_adam(self.temperature.parameters(), self.config.lr, self.device)

    def learn(self, sample: SampleLike) -> tuple[Tensor, dict[str, Tensor]]:
        """One step of the critics, the actor and the temperature; returns (|TD| + eps [B], metrics)."""
        batch = Batch(self, sample)
        alpha = self.temperature().detach()
        with torch.no_grad():
            next_action, next_logp = self._sample(batch.next_obs)
            next_q = self.min_q(self.target_critics, batch.next_obs, next_action)
            target = batch.reward + batch.discount * (next_q - alpha * next_logp)
        td_abs, critic_loss, q_mean = self.critic_step(batch, target)

        new_action, logp = self._sample(batch.obs)
        self.critics.requires_grad_(False)
        actor_loss = (alpha * logp - self.min_q(self.critics, batch.obs, new_action)).mean()
        self.critics.requires_grad_(True)
        self.actor_optimizer.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_optimizer.step()

        temperature_loss = -(self.temperature.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.temperature_optimizer.zero_grad(set_to_none=True)
        temperature_loss.backward()
        self.temperature_optimizer.step()

        self.polyak(self.target_critics, self.critics)
        values = (critic_loss, actor_loss.detach(), alpha, td_abs.mean(), q_mean, -logp.detach().mean())
        names = ("losses/critic_loss", "losses/actor_loss", "losses/temperature", "losses/td_abs",
                 "losses/q_values", "losses/entropy")
        return td_abs + self.knobs.priority_eps, dict(zip(names, values))

    def _sample(self, obs: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        """A reparameterized squashed sample in [-1, 1] and its log-probability [B]."""
        mean, log_std = self.actor(obs)
        std = log_std.exp()
        u = mean + std * self.noise(mean.shape)
        gaussian = -0.5 * (((u - mean) / std) ** 2 + 2 * log_std + math.log(2 * math.pi))
        # log|d tanh(u)/du| = 2 (log 2 - u - softplus(-2u)), numerically stable.
        correction = 2 * (math.log(2) - u - nn.functional.softplus(-2 * u))
        return torch.tanh(u), (gaussian - correction).sum(-1)

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), "temperature": self.temperature}

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super().optimizers(), "temperature_optimizer": self.temperature_optimizer}


class SAC(ContinuousSpec):
    """Soft actor-critic over any supported observation space and a Box action space."""

    name: ClassVar[str] = "sac"
    config_class: ClassVar[type] = SACConfig
    policy_class: ClassVar[type] = SACPolicy
    trainer_class: ClassVar[type] = SACTrainer

    def make_actor(self) -> Actor:
        return Actor(self.observation_space, self.action_dim, self.config)
