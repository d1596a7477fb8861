"""An algorithm in three parts, as Acme's builders split it: a spec, a policy and a trainer.

The spec (`AlgorithmSpec`, what the registry resolves by name) is built from the env's
spaces and the algorithm's config: it names the replay items, makes the actor-side
assembler and builds the other two parts. A `Policy` is all that acts (actors, the
evaluator, league opponents, export, the ONNX feed): the networks acting needs and
nothing else. A `Trainer` is all that learns (the learner only): `update`, its optimizers
and target networks, the weights it publishes and the state it checkpoints. The actor,
the learner, `run` and the config know no algorithm by name (see `registry`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

# Field name -> (per-item shape, dtype). A batch of a field has shape [B, *shape].
TransitionFields = dict[str, tuple[tuple[int, ...], torch.dtype]]
# Checkpointable state: flat names -> tensors or plain numbers; storable without pickle.
FlatState = dict[str, Tensor | int | float]
T = TypeVar("T")


class SampleLike(Protocol):
    """What `update` reads from a replay sample: IS weights [B] and field tensors [B, ...]."""

    weights: Tensor
    data: Mapping[str, Tensor]


PRIORITY = "@priority"
"""An assembler's items may carry their initial replay priority [B] under this key (not a field): the
actor sends it beside the batch. NaN marks one the assembler could not value (the policy's
`initial_priorities` values those)."""


class TransitionAssembler(Protocol):
    """Actor side: turns vector-env steps into replay items (n-step transitions today).

    When the policy's `act_values` returns something besides the actions, the actor passes it
    to ``push`` as ``acted`` (e.g. the Q values an Ape-X priority needs, so that no second
    forward pass is made).
    """

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


class AlgorithmSpec(ABC):
    """An off-policy algorithm for one pair of spaces and one config: what both sides agree on.

    Constructed as ``cls(observation_space, action_space, config)``; raises
    `actorlearner.networks.UnsupportedSpace` naming a space it cannot learn from. The class
    attribute ``learner_defaults`` maps learner options (LearnerConfig fields) to the values
    it learns best with; they replace the learner's own defaults, and a flag, env var or TOML
    value still wins over them.

    Config fields marked ``metadata=RUNTIME`` may change while training runs (``actorlearner
    set``): they must not shape the networks or the replay items, so the spec keeps the
    config it was built with, and the policies and trainers it made are retuned instead.
    """

    name: ClassVar[str]
    """Short name: prefix of its options (``--dqn-lr``) and its TOML table (``[dqn]``)."""
    config_class: ClassVar[type]
    """Its config dataclass: each field documented by the string under it, plain values only."""
    learner_defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: Any = None):
        self.observation_space, self.action_space = observation_space, action_space
        self.config = self.config_class() if config is None else config

    @abstractmethod
    def transition_fields(self) -> TransitionFields:
        """The replay item layout: field name -> (shape, dtype); actors send exactly these."""

    @abstractmethod
    def make_assembler(self, num_envs: int, policy: Policy) -> TransitionAssembler:
        """The assembler of replay items for a vector env of ``num_envs`` that ``policy`` acts in."""

    @abstractmethod
    def make_policy(self, *, device: str | torch.device = "cpu", seed: int = 0) -> Policy:
        """A policy with the seeded initial weights (the trainer's, for the same seed)."""

    @abstractmethod
    def make_trainer(self, *, device: str | torch.device = "cpu", seed: int = 0) -> Trainer:
        """The learner's trainer, its networks seeded as `make_policy`'s."""


class ClassPartsSpec(AlgorithmSpec):
    """A spec whose policy and trainer are the classes it names, built as ``cls(spec, device=..., seed=...)``."""

    policy_class: ClassVar[type[Policy]]
    trainer_class: ClassVar[type[Trainer]]

    def make_policy(self, *, device: str | torch.device = "cpu", seed: int = 0) -> Policy:
        return self.policy_class(self, device=device, seed=seed)

    def make_trainer(self, *, device: str | torch.device = "cpu", seed: int = 0) -> Trainer:
        return self.trainer_class(self, device=device, seed=seed)


class Policy(ABC):
    """Acts: what actors, the evaluator, league opponents, export and the ONNX feed hold.

    It owns only what acting needs (no target network, no optimizer) and loads the weights
    the trainer publishes. A recurrent policy overrides `reset_memory`; an exportable one
    overrides `export_policy`.
    """

    def __init__(self, spec: AlgorithmSpec, *, device: str | torch.device = "cpu"):
        self.spec, self.config, self.device = spec, spec.config, torch.device(device)

    @abstractmethod
    def exploration(self, actor_index: int, num_actors: int) -> float:
        """The exploration parameter actor ``actor_index`` of ``num_actors`` passes to `act`."""

    @abstractmethod
    def act(self, obs: Any, exploration: Any) -> np.ndarray:
        """Actions for a batch of observations as the vector env returns them; exploration 0 is greedy."""

    def act_values(self, obs: Any, exploration: Any) -> tuple[np.ndarray, Any]:
        """`act`'s actions, and what acting computed that the algorithm's assembler takes as ``push(...,
        acted=)``; None (the default) passes nothing."""
        return self.act(obs, exploration), None

    def initial_priorities(self, fields: Mapping[str, Tensor]) -> Tensor | None:
        """Replay priorities [B] for freshly collected items (Ape-X actor side); None (the default)
        leaves them to the learner (its maximum priority)."""
        return None

    @abstractmethod
    def policy_state_dict(self) -> dict[str, Tensor]:
        """CPU tensor copies of the acting networks: what `Trainer.policy_state_dict` publishes."""

    @abstractmethod
    def load_policy_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load what `Trainer.policy_state_dict` published."""

    def reset_memory(self, envs: np.ndarray) -> None:
        """Forget the memory of the envs a mask [E] marks, before acting on their episodes' first
        observations; nothing to forget by default (a feed-forward policy)."""

    @property
    def recurrent(self) -> bool:
        """Whether it keeps memory per env (overrides `reset_memory`): each game needs its own copy."""
        return type(self).reset_memory is not Policy.reset_memory

    def export_policy(self) -> nn.Module:
        """The greedy policy (what ``act(obs, 0.0)`` does) as an ``nn.Module`` in eval mode on the
        policy's own networks, for ``actorlearner export`` and the learner's ONNX feed.

        Its forward takes the observation leaves as positional tensors in `leaf_spaces` order
        (env dtypes, batch first) and returns the env actions [B, *shape] in the action space's
        dtype. A recurrent policy's module also has ``state_sizes`` (state name -> width): its
        forward takes those states [B, width] after the leaves and returns the new ones after
        the actions; they are zero at an episode's start. Not exportable by default.
        """
        raise NotImplementedError(f"{type(self).__name__} has no export_policy")

    @property
    def can_export(self) -> bool:
        """Whether it overrides `export_policy`."""
        return type(self).export_policy is not Policy.export_policy

    @property
    def gives_priorities(self) -> bool:
        """Whether it overrides `initial_priorities`: actors then send every batch's priorities."""
        return type(self).initial_priorities is not Policy.initial_priorities

    def retune(self, config: Any) -> None:
        """Take a config that differs only in runtime-tunable options."""
        self.config = config


class Trainer(ABC):
    """Learns: the learner's part, and only the learner's. `update` is the hot step.

    Data-parallel learners (``--world-size``) average the gradients before every step of each
    optimizer `optimizers` names. `update` must step the same optimizers on every rank
    (decided by counters, not by the sample) and change state outside them only from the
    state itself (target copies, Polyak averaging), never from the sample: batch-norm
    statistics would part the ranks.
    """

    def __init__(self, spec: AlgorithmSpec, *, device: str | torch.device = "cpu"):
        self.spec, self.config, self.device = spec, spec.config, torch.device(device)

    capturable: ClassVar[bool] = False
    """Whether the learner may capture its step in a CUDA graph: see `CapturableTrainer`."""

    @abstractmethod
    def update(self, sample: SampleLike) -> tuple[Tensor, Mapping[str, Tensor | float]]:
        """One gradient step; returns new priorities [B] and scalar metrics (0-d tensors, read by the
        learner every so many steps, or numbers)."""

    @abstractmethod
    def policy_tensors(self) -> dict[str, Tensor]:
        """What actors need to act: the policy networks' live tensors on the trainer's device (no copies),
        named as `Policy.policy_state_dict` names them. The learner copies them out when it publishes."""

    def policy_state_dict(self) -> dict[str, Tensor]:
        """CPU copies of `policy_tensors`: what policies load."""
        return {name: cpu_copy(t) for name, t in self.policy_tensors().items()}

    @abstractmethod
    def state_dict(self) -> FlatState:
        """Everything the learner must checkpoint, as a flat dict of tensors and numbers."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Tensor | int | float]) -> None:
        """Restore what `state_dict` produced."""

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """Every torch optimizer it owns, by name; by default its attributes that are one."""
        return {name: value for name, value in vars(self).items() if isinstance(value, torch.optim.Optimizer)}

    def retune(self, config: Any) -> None:
        """Take a config that differs only in runtime-tunable options (an override also applies
        what it keeps elsewhere, such as an optimizer's lr)."""
        self.config = config


class CapturableTrainer(Trainer):
    """A trainer whose step is device work only, which the learner may capture once in a CUDA graph and
    replay (on CUDA; elsewhere it runs `update` eagerly: the same code).

    `learn` is that device work: it reads the sample and runtime values from tensors only (`RuntimeTensors`,
    an optimizer's tensor lr from `make_adam`), never reads a tensor's value on the host, and takes the same
    branches whenever `phase` is the same (each phase is captured apart). `advance` is the host's part after
    every step: counters, and periodic work such as a target copy. A trainer that can't keep to this
    subclasses `Trainer` and runs eagerly.
    """

    capturable: ClassVar[bool] = True
    runtime_tensors: ClassVar[tuple[str, ...]] = ()
    """The runtime options `learn` reads, kept as device tensors in `knobs` and refilled by `retune`."""

    def __init__(self, spec: AlgorithmSpec, *, device: str | torch.device = "cpu"):
        super().__init__(spec, device=device)
        self.knobs = RuntimeTensors(self.config, self.runtime_tensors, self.device)

    def retune(self, config: Any) -> None:
        super().retune(config)
        self.knobs.follow(config)

    def update(self, sample: SampleLike) -> tuple[Tensor, Mapping[str, Tensor | float]]:
        result = self.learn(sample)
        self.advance()
        return result

    @abstractmethod
    def learn(self, sample: SampleLike) -> tuple[Tensor, dict[str, Tensor]]:
        """The device work of one step for the current `phase`: new priorities [B] and 0-d metric tensors."""

    def advance(self) -> None:
        """The host's bookkeeping after each step; nothing by default."""

    def phase(self) -> Hashable:
        """Which branches the next `learn` takes, decided from host counters; one phase by default."""
        return None

    def generators(self) -> list[torch.Generator]:
        """The torch generators `learn` draws from (a captured graph must advance them too)."""
        return [value for value in vars(self).values() if isinstance(value, torch.Generator)]


class RuntimeTensors:
    """Runtime-tunable config values as 0-d float32 tensors on a device, refilled in place by `follow`, so
    a captured step reads the new value at its next replay: ``self.knobs.priority_eps``."""

    def __init__(self, config: Any, names: Iterable[str], device: torch.device):
        self._tensors = {name: torch.tensor(float(getattr(config, name)), device=device) for name in names}

    def __getattr__(self, name: str) -> Tensor:
        try:
            return self.__dict__["_tensors"][name]
        except KeyError:
            raise AttributeError(name) from None

    def follow(self, config: Any) -> None:
        """Take the values of a retuned config."""
        for name, tensor in self._tensors.items():
            tensor.fill_(float(getattr(config, name)))


def make_adam(params: Iterable[Tensor], lr: float, device: torch.device) -> torch.optim.Adam:
    """Adam as a step without host reads: fused kernels; on CUDA capturable, its lr a device tensor."""
    cuda = device.type == "cuda"
    return torch.optim.Adam(params, lr=torch.tensor(lr, device=device) if cuda else lr, fused=True, capturable=cuda)


def clip_gradients(params: Iterable[Tensor], max_norm: Tensor) -> Tensor:
    """Scale gradients to a global norm of at most ``max_norm`` (a tensor); return the norm before.
    What ``clip_grad_norm_`` does, with the bound read on the device."""
    grads = [p.grad for p in params if p.grad is not None]
    if len(grads) == 1:  # one flat tensor (see dqn_mlp): one norm, one multiply
        norm = torch.linalg.vector_norm(grads[0])
        grads[0].mul_((max_norm / (norm + 1e-6)).clamp(max=1.0))
        return norm
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (norm + 1e-6)).clamp(max=1.0))
    return norm


def follow_lr(trainer: Trainer, lr: float) -> None:
    """Every optimizer of ``trainer`` steps with ``lr`` from now on (a tensor lr is refilled in place)."""
    for optimizer in trainer.optimizers().values():
        for group in optimizer.param_groups:
            if isinstance(group["lr"], Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr


def seeded(seed: int, build: Callable[[], T]) -> T:
    """``build()`` under ``seed`` without touching the global RNG: policy and trainer get the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def torch_dtype(dtype: np.dtype | type) -> torch.dtype:
    """The torch dtype of a numpy dtype (for `transition_fields`)."""
    return torch.from_numpy(np.empty(0, np.dtype(dtype))).dtype


def cpu_copy(t: Tensor) -> Tensor:
    """A detached CPU copy: what state dicts hand out, never a view of live parameters."""
    return t.detach().to("cpu", copy=True)


def weights(module: nn.Module) -> dict[str, Tensor]:
    """CPU copies of a network's state dict: the policy state dicts that policies hand out."""
    return {name: cpu_copy(t) for name, t in module.state_dict().items()}


def load_weights(module: nn.Module, state: Mapping[str, Any]) -> None:
    """Load what `weights` made (or the same decoded off the wire) into ``module``."""
    module.load_state_dict({name: torch.as_tensor(t) for name, t in state.items()})


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
