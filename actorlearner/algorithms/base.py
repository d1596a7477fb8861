"""The `Algorithm` protocol: all the learner and the actors know about an RL algorithm.

An algorithm is a builder in the Acme sense. From the env's spaces and its config
dataclass it makes its networks, names its replay fields, assembles transitions on the
actor (`make_assembler`), acts, updates, and gives the state dicts that are broadcast and
checkpointed. The learner calls `update`, checkpoints `state_dict` and broadcasts
`policy_state_dict`; an actor calls `act`, `initial_priorities` and `make_assembler`, and
loads what the learner broadcasts. Nothing else is shared: the actor, the learner, `run`
and the config know no algorithm by name (see `registry`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol, runtime_checkable

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


class TransitionAssembler(Protocol):
    """Actor side: turns vector-env steps into replay items (n-step transitions today)."""

    def push(self, obs: Any, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray,
             truncated: np.ndarray, next_obs: Any) -> dict[str, np.ndarray] | None:
        """Record one vector step (values as the vector env returns them); returns finished items."""
        ...

    def flush(self) -> dict[str, np.ndarray] | None:
        """Emit everything pending as if the episodes were cut now."""
        ...

    def inherit(self, previous: Any) -> None:
        """Continue the episodes a flushed assembler of an earlier session was assembling."""
        ...


@runtime_checkable
class Algorithm(Protocol):
    """An off-policy algorithm, split between the actor side and the learner side.

    Constructed as ``cls(observation_space, action_space, config, device=..., seed=...)``;
    raises `actorlearner.networks.UnsupportedSpace` naming a space it cannot learn from.
    """

    name: ClassVar[str]
    """Short name: prefix of its options (``--dqn-lr``) and its TOML table (``[dqn]``)."""
    config_class: ClassVar[type]
    """Its config dataclass: each field documented by the string under it, plain values only."""

    def transition_fields(self) -> TransitionFields:
        """The replay item layout: field name -> (shape, dtype); actors send exactly these."""
        ...

    def make_assembler(self, num_envs: int) -> TransitionAssembler:
        """The actor-side assembler of replay items for a vector env of ``num_envs``."""
        ...

    def exploration(self, actor_index: int, num_actors: int) -> float:
        """The exploration parameter actor ``actor_index`` of ``num_actors`` passes to `act`."""
        ...

    def act(self, obs: Any, exploration: float) -> np.ndarray:
        """Actions for a batch of observations as the vector env returns them; exploration 0 is greedy."""
        ...

    def initial_priorities(self, fields: Mapping[str, Tensor]) -> Tensor | None:
        """Replay priorities [B] for freshly collected items (Ape-X actor side); None leaves them to
        the learner (its maximum priority)."""
        ...

    def update(self, sample: SampleLike) -> tuple[Tensor, dict[str, float]]:
        """One gradient step; returns new priorities [B] and scalar metrics."""
        ...

    def policy_state_dict(self) -> dict[str, Tensor]:
        """What actors need to act: CPU tensor copies of the policy network."""
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


def torch_dtype(dtype: np.dtype | type) -> torch.dtype:
    """The torch dtype of a numpy dtype (for `transition_fields`)."""
    return torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype
