"""TD3 (Fujimoto et al. 2018) for continuous (Box) actions, on n-step returns, with |TD| priorities.

A deterministic actor ``a = tanh(mu(s))`` in the unit box, rescaled exactly to the env's
bounds (`UnitBox`); actors add Gaussian exploration noise, evaluation acts
without it. Twin critics bootstrap from the smaller target estimate at a target action
smoothed with clipped noise; the actor and the target networks move every
``policy_delay`` critic updates.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import gymnasium as gym
import torch
from torch import Tensor, nn

from actorlearner.algorithms.base import SampleLike
from actorlearner.algorithms.continuous import (
    Batch,
    ContinuousConfig,
    ContinuousPolicy,
    ContinuousSpec,
    ContinuousTrainer,
)
from actorlearner.config import RUNTIME
from actorlearner.networks import ObservationEncoder


@dataclass
class TD3Config(ContinuousConfig):
    """TD3 hyperparameters; the defaults learn Pendulum-v1. Noise scales are fractions of the
    half-range of each action dimension (the unit box)."""

    exploration_noise: float = field(default=0.1, metadata=RUNTIME)
    """Std of the Gaussian noise actors add to the policy's action."""
    policy_noise: float = field(default=0.2, metadata=RUNTIME)
    """Std of the target smoothing noise."""
    noise_clip: float = field(default=0.5, metadata=RUNTIME)
    """Target smoothing noise is clipped to [-noise_clip, noise_clip]."""
    policy_delay: int = field(default=2, metadata=RUNTIME)
    """Critic updates per actor (and target) update."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("exploration_noise", "policy_noise", "noise_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.policy_delay < 1:
            raise ValueError(f"policy_delay must be >= 1, got {self.policy_delay}")


class Actor(nn.Module):
    """Observations -> a deterministic action in [-1, 1]^A."""

    def __init__(self, observation_space: gym.Space, action_dim: int, config: TD3Config):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, config.hidden_sizes, config.channel_order)
        self.head = nn.Linear(self.encoder.output_dim, action_dim)

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        return torch.tanh(self.head(self.encoder(obs)))


class TD3Policy(ContinuousPolicy):
    """The deterministic actor plus Gaussian exploration noise; none at exploration 0."""

    def exploration(self, actor_index: int, num_actors: int) -> float:
        """Every actor adds `exploration_noise`; 0 acts deterministically, as the evaluator does."""
        return self.config.exploration_noise

    def unit_action(self, obs: Mapping[str, Tensor], exploration: float) -> Tensor:
        """The policy's action plus N(0, exploration) noise, kept inside the unit box."""
        action = self.actor(obs)
        if exploration > 0:
            action = (action + exploration * self.noise(action.shape)).clamp(-1, 1)
        return action


class TD3Trainer(ContinuousTrainer):
    """Critic steps every update; actor steps and the Polyak moves every `policy_delay` updates (a phase
    of its own when captured)."""

    runtime_tensors: ClassVar[tuple[str, ...]] = ("priority_eps", "tau", "policy_noise", "noise_clip")

    def __init__(self, spec: TD3, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device, seed=seed)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self._last_actor_loss = torch.zeros((), device=self.device)  # a metric between actor steps

    def phase(self) -> bool:
        """Whether this step also steps the actor and moves the targets."""
        return (self.num_updates + 1) % self.config.policy_delay == 0

    def learn(self, sample: SampleLike) -> tuple[Tensor, dict[str, Tensor]]:
        """One critic step, and every `policy_delay` updates an actor step and the Polyak moves;
        returns (|TD| + eps [B], metrics)."""
        batch = Batch(self, sample)
        knobs = self.knobs
        with torch.no_grad():
            next_action = self.target_actor(batch.next_obs)
            smoothing = torch.minimum(torch.maximum(knobs.policy_noise * self.noise(next_action.shape),
                                                    -knobs.noise_clip), knobs.noise_clip)
            next_action = (next_action + smoothing).clamp(-1, 1)
            target = batch.reward + batch.discount * self.min_q(self.target_critics, batch.next_obs, next_action)
        td_abs, critic_loss, q_mean = self.critic_step(batch, target)

        if self.phase():
            self.critics[0].requires_grad_(False)
            actor_loss = -self.critics[0](batch.obs, self.actor(batch.obs)).mean()
            self.critics[0].requires_grad_(True)
            self.actor_optimizer.zero_grad(set_to_none=True)
            actor_loss.backward()
            self.actor_optimizer.step()
            self.polyak(self.target_critics, self.critics)
            self.polyak(self.target_actor, self.actor)
            self._last_actor_loss.copy_(actor_loss.detach())
        values = (critic_loss, self._last_actor_loss.clone(), td_abs.mean(), q_mean)
        names = ("losses/critic_loss", "losses/actor_loss", "losses/td_abs", "losses/q_values")
        return td_abs + knobs.priority_eps, dict(zip(names, values))

    def modules(self) -> dict[str, nn.Module]:
        return {**super().modules(), "target_actor": self.target_actor}


class TD3(ContinuousSpec):
    """TD3 over any supported observation space and a Box action space."""

    name: ClassVar[str] = "td3"
    config_class: ClassVar[type] = TD3Config
    policy_class: ClassVar[type] = TD3Policy
    trainer_class: ClassVar[type] = TD3Trainer

    def make_actor(self) -> Actor:
        return Actor(self.observation_space, self.action_dim, self.config)
