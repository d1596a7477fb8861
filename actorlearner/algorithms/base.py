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
from torch import Tensor, nn

from actorlearner.config import RUNTIME  # noqa: F401  (algorithm configs mark fields with it)

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
    Optionally a class attribute ``learner_defaults`` maps learner options (LearnerConfig
    fields) to the values it learns best with; they replace the learner's own defaults, and
    a flag, env var or TOML value still wins over them. A recurrent algorithm also has
    ``reset_memory(envs)``: the actor and the evaluator call it with a mask [E] of the envs
    whose episodes begin, before it acts on their first observations.

    Optionally, ``export_policy()`` returns the greedy policy (what ``act(obs, 0.0)`` does) as
    an ``nn.Module`` in eval mode on the algorithm's own networks, for ``actorlearner export``
    and the learner's ONNX feed, which call it on a CPU algorithm of their own: its forward takes the
    observation leaves as positional tensors in `leaf_spaces` order (env dtypes, batch first)
    and returns the env actions [B, *shape] in the action space's dtype. A recurrent policy's
    module also has ``state_sizes`` (state name -> width): its forward takes those states
    [B, width] after the leaves and returns the new ones after the actions; they are zero at
    an episode's start.

    Config fields marked ``metadata=RUNTIME`` may change while training runs (``actorlearner
    set``): they must not shape the networks or the replay items. The learner and each actor
    then call the optional ``retune(config)`` with the new config (without it, ``config`` is
    simply replaced); it applies what the algorithm keeps elsewhere, such as an optimizer's lr.

    Data-parallel learners (``--world-size``) average the gradients before every step of each
    ``torch.optim.Optimizer`` the algorithm owns: its attributes that are one, and those the
    optional ``optimizers()`` returns (name -> optimizer); an optimizer kept anywhere else must
    be named there. `update` must step the same optimizers on every rank (decided by counters,
    not by the sample) and change state outside them only from the state itself (target copies,
    Polyak averaging), never from the sample: batch-norm statistics would part the ranks.
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


def cpu_copy(t: Tensor) -> Tensor:
    """A detached CPU copy: what state dicts hand out, never a view of live parameters."""
    return t.detach().to("cpu", copy=True)


def check_common_config(config: Any) -> None:
    """Range checks for the fields most configs share (n_step, gamma, tau, lr), where present."""
    n_step, gamma, tau, lr = (getattr(config, name, None) for name in ("n_step", "gamma", "tau", "lr"))
    if lr is not None and not 0 < lr < float("inf"):
        raise ValueError(f"lr must be > 0 and finite, got {lr}")
    if n_step is not None and n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    if gamma is not None and not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if tau is not None and not 0.0 < tau <= 1.0:
        raise ValueError(f"tau must be in (0, 1], got {tau}")


def modules_state(modules: Mapping[str, nn.Module], optimizers: Mapping[str, torch.optim.Optimizer]) -> FlatState:
    """Networks as ``<name>.<param>`` and optimizer slots as ``<name>.<index>.<slot>``, CPU copies.

    Optimizer hyperparameters are not stored: they come from the config on load.
    """
    out: FlatState = {}
    for prefix, module in modules.items():
        for name, t in module.state_dict().items():
            out[f"{prefix}.{name}"] = cpu_copy(t)
    for prefix, optimizer in optimizers.items():
        for index, slots in optimizer.state_dict()["state"].items():
            for slot, value in slots.items():
                out[f"{prefix}.{index}.{slot}"] = cpu_copy(value) if isinstance(value, Tensor) else value
    return out


def load_modules_state(state: Mapping[str, Any], modules: Mapping[str, nn.Module],
                       optimizers: Mapping[str, torch.optim.Optimizer], other_keys: tuple[str, ...] = ()) -> None:
    """Restore what `modules_state` produced; keys outside it and ``other_keys`` raise KeyError."""
    nets: dict[str, dict[str, Tensor]] = {prefix: {} for prefix in modules}
    slots: dict[str, dict[int, dict[str, Any]]] = {prefix: {} for prefix in optimizers}
    for key, value in state.items():
        prefix, _, rest = key.partition(".")
        if prefix in nets:
            nets[prefix][rest] = torch.as_tensor(value)
        elif prefix in slots:
            index, _, slot = rest.partition(".")
            slots[prefix].setdefault(int(index), {})[slot] = value
        elif key not in other_keys:
            raise KeyError(f"unexpected key in algorithm state: {key!r}")
    for prefix, module in modules.items():
        module.load_state_dict(nets[prefix])
    for prefix, optimizer in optimizers.items():
        groups = optimizer.state_dict()["param_groups"]
        optimizer.load_state_dict({"state": slots[prefix], "param_groups": groups})
