"""The `Algorithm` protocol: all the learner and the actors know about an RL algorithm.

The learner calls `update`, checkpoints `state_dict` and broadcasts `policy_state_dict`;
an actor calls `act` and `initial_priorities` and loads what the learner broadcasts.
Both size their buffers from `transition_fields`. Nothing else is shared.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor

# Field name -> (per-item shape, dtype). A batch of a field has shape [B, *shape].
TransitionFields = dict[str, tuple[tuple[int, ...], torch.dtype]]
# Checkpointable state: flat names -> tensors or plain numbers; storable without pickle.
FlatState = dict[str, Tensor | int | float]


class SampleLike(Protocol):
    """What `update` reads from a replay sample: IS weights [B] and field tensors [B, ...]."""

    weights: Tensor
    data: Mapping[str, Tensor]


@runtime_checkable
class Algorithm(Protocol):
    """An off-policy algorithm, split between the actor side and the learner side."""

    @property
    def n_step(self) -> int:
        """Steps summed per transition; the actor's `NStepAssembler` uses it."""
        ...

    @property
    def gamma(self) -> float:
        """Per-step discount; the actor's `NStepAssembler` uses it."""
        ...

    def transition_fields(self) -> TransitionFields:
        """The replay item layout: field name -> (shape, dtype)."""
        ...

    def act(self, obs: np.ndarray, epsilon: np.ndarray | float) -> np.ndarray:
        """Actions for a batch of observations [E, ...] (actor side, no grad)."""
        ...

    def initial_priorities(self, fields: Mapping[str, Tensor]) -> Tensor:
        """Replay priorities [B] for freshly collected transitions (Ape-X actor side)."""
        ...

    def update(self, sample: SampleLike) -> tuple[Tensor, dict[str, float]]:
        """One gradient step; returns new priorities [B] and scalar metrics."""
        ...

    def policy_state_dict(self) -> dict[str, Tensor]:
        """What actors need to act: CPU tensor copies of the online network."""
        ...

    def load_policy_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load what `policy_state_dict` produced (actor side)."""
        ...

    def state_dict(self) -> FlatState:
        """Everything the learner must checkpoint, as a flat dict of tensors and numbers."""
        ...

    def load_state_dict(self, state: Mapping[str, Tensor | int | float]) -> None:
        """Restore what `state_dict` produced."""
        ...

    def to(self, device: str | torch.device) -> Algorithm:
        """Move every tensor (networks and optimizer state) to `device`; returns self."""
        ...


def make_algorithm(
    name: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    config: Any = None,
) -> Algorithm:
    """Build an algorithm by name; `config` is its config dataclass, a dict of fields, or None."""
    if name.lower() == "dqn":
        from actorlearner.algorithms.dqn import DQN, DQNConfig

        if config is None:
            config = DQNConfig()
        elif isinstance(config, Mapping):
            config = DQNConfig(**config)
        elif not isinstance(config, DQNConfig):
            raise TypeError(f"dqn wants a DQNConfig or a dict, got {type(config).__name__}")
        return DQN(observation_space, action_space, config)
    raise ValueError(f"unknown algorithm {name!r}; known: 'dqn'")
