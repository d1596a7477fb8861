"""R2D2 (Kapturowski et al. 2019): a recurrent dueling double DQN on replayed sequences.

Actors act through encoder -> LSTM (or GRU) -> dueling head, keep each env's recurrent state
across steps (zeroed when an episode starts), and stream fixed-length overlapping sequences
(`SequenceAssembler`) with the state each began from. The learner unrolls both networks
from that stored state; a burn-in prefix only warms the state (no loss, no gradient) unless
the sequence starts its episode, where the stored state is exact. Targets are n-step double
Q within the sequence under the invertible value rescaling; a sequence's priority is
``eta * max|TD| + (1 - eta) * mean|TD|`` (`sequence_math`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from actorlearner.algorithms.apex import ApeXExploration, ApeXPolicy, ApeXSpec, ApeXTrainer, GreedyQPolicy
from actorlearner.algorithms.base import Policy, SampleLike, TransitionFields, check_common_config, clip_gradients
from actorlearner.algorithms.sequence import SequenceAssembler, sequence_fields
from actorlearner.algorithms.sequence_math import n_step_targets, sequence_priorities
from actorlearner.config import RUNTIME
from actorlearner.networks import (
    ActionBranches,
    BranchingDuelingHead,
    ObservationEncoder,
    action_mask_key,
    field_name,
    leaf_arrays,
    mask_q,
)


@dataclass
class R2D2Options:
    """R2D2's own hyperparameters (`R2D2Config` adds the exploration's)."""

    hidden_sizes: tuple[int, ...] = (128,)
    """Widths of the MLP torso before the recurrent core (after the per-leaf encoders)."""
    core: str = "lstm"
    """Recurrent core: lstm or gru."""
    core_size: int = 128
    """Width of the recurrent state."""
    dueling: bool = True
    """Split the head into a state value and mean-centred advantages."""
    channel_order: str = "auto"
    """Channel axis of image observations: hwc, chw, or auto."""
    lr: float = field(default=1e-3, metadata=RUNTIME)
    """Adam learning rate."""
    gamma: float = 0.99
    """Per-step discount."""
    n_step: int = 5
    """Rewards summed (within the sequence) before bootstrapping."""
    sequence_length: int = 40
    """Steps per replayed sequence."""
    overlap: int = 20
    """Steps consecutive sequences of an episode share."""
    burn_in: int = 10
    """Leading steps of a sequence that only warm the recurrent state (none for a sequence that starts its episode)."""
    target_update_period: int = field(default=400, metadata=RUNTIME)
    """Updates between target network copies."""
    priority_eta: float = field(default=0.9, metadata=RUNTIME)
    """Sequence priority: eta * max|TD| + (1 - eta) * mean|TD|."""
    max_grad_norm: float = field(default=40.0, metadata=RUNTIME)
    """Global gradient norm clip."""
    priority_eps: float = field(default=1e-6, metadata=RUNTIME)
    """Added to priorities so that no sequence's is zero."""


@dataclass
class R2D2Config(ApeXExploration, R2D2Options):
    """R2D2 hyperparameters; the defaults solve the tests' memory task and CartPole without velocities."""

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        check_common_config(self)
        if self.core not in ("lstm", "gru"):
            raise ValueError(f"core must be lstm or gru, got {self.core!r}")
        if self.sequence_length < 2 or not 0 <= self.overlap < self.sequence_length:
            raise ValueError(f"need sequence_length >= 2 and 0 <= overlap < sequence_length, got "
                             f"{self.sequence_length} and {self.overlap}")
        if not 0 <= self.burn_in < self.sequence_length:
            raise ValueError(f"burn_in must be in [0, sequence_length), got {self.burn_in}")
        if self.target_update_period < 1 or self.core_size < 1:
            raise ValueError("target_update_period and core_size must be >= 1")
        if not 0.0 <= self.priority_eta <= 1.0:
            raise ValueError(f"priority_eta must be in [0, 1], got {self.priority_eta}")


def core_state_names(core: str) -> tuple[str, ...]:
    """The recurrent state's parts: an LSTM's hidden and cell states, a GRU's hidden state."""
    return ("h", "c") if core == "lstm" else ("h",)


class RecurrentQNetwork(nn.Module):
    """Observation sequences [B, T, ...] and a start state -> Q values [B, T, D, N] and the end state."""

    def __init__(self, observation_space: gym.Space, branches: ActionBranches, config: R2D2Config):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, config.hidden_sizes, config.channel_order)
        core = nn.LSTM if config.core == "lstm" else nn.GRU
        self.core = core(self.encoder.output_dim, config.core_size, batch_first=True)
        self.head = BranchingDuelingHead(config.core_size, branches.sizes, config.dueling)
        self.state_names = core_state_names(config.core)
        self.mask_key = action_mask_key(observation_space, branches)

    def forward(self, obs: Mapping[str, Tensor], state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        batch, steps = next(iter(obs.values())).shape[:2]
        features = self.encoder({key: value.flatten(0, 1) for key, value in obs.items()})
        out, new = self.core(features.view(batch, steps, -1), self._pack(state))
        q = self.head(out.flatten(0, 1))
        q = q.view(batch, steps, *q.shape[1:])
        return q if self.mask_key is None else mask_q(q, obs[self.mask_key]), self._unpack(new)

    def _pack(self, state: dict[str, Tensor]):
        parts = tuple(state[name].unsqueeze(0).contiguous() for name in self.state_names)  # [1, B, H]: one layer
        return parts if len(parts) == 2 else parts[0]

    def _unpack(self, packed) -> dict[str, Tensor]:
        parts = packed if isinstance(packed, tuple) else (packed,)
        return {name: part.squeeze(0) for name, part in zip(self.state_names, parts)}


class GreedyRecurrentQPolicy(GreedyQPolicy):
    """`GreedyQPolicy` of a `RecurrentQNetwork`, one step: observation leaves, then the states [B, size]
    named in ``state_sizes`` -> (greedy env actions, the new states)."""

    def __init__(self, network: RecurrentQNetwork, keys: tuple[str, ...], branches: ActionBranches):
        super().__init__(network, keys, branches)
        self.state_sizes = {name: network.core.hidden_size for name in network.state_names}

    def forward(self, *inputs: Tensor) -> tuple[Tensor, ...]:
        leaves, states = inputs[:len(self.keys)], inputs[len(self.keys):]
        obs = {key: leaf.unsqueeze(1) for key, leaf in zip(self.keys, leaves)}
        q, new = self.network(obs, dict(zip(self.state_sizes, states)))
        return (self.actions(q[:, 0]), *(new[name] for name in self.state_sizes))


class R2D2Memory:
    """Each env's recurrent state on an actor (or the evaluator): what `act` updates and the assembler reads."""

    def __init__(self, names: tuple[str, ...], size: int):
        self.names, self.size = names, size
        self.state: dict[str, np.ndarray] = {}
        self._before: dict[str, np.ndarray] = {}

    def current(self, num_envs: int) -> dict[str, np.ndarray]:
        """The states [E, H] to act from, zero for envs never seen (or after a change in their number)."""
        if not self.state or len(self.state[self.names[0]]) != num_envs:
            self.state = {name: np.zeros((num_envs, self.size), np.float32) for name in self.names}
        return self.state

    def advance(self, new: dict[str, np.ndarray]) -> None:
        self._before, self.state = self.state, new

    def acted_from(self) -> dict[str, np.ndarray]:
        return self._before

    def reset(self, envs: np.ndarray) -> None:
        for value in self.state.values():
            value[np.asarray(envs, bool)] = 0.0


class R2D2Policy(ApeXPolicy):
    """One recurrent step per env from its remembered state (`R2D2Memory`); epsilon-greedy over all branches."""

    greedy_policy: ClassVar[type[GreedyQPolicy]] = GreedyRecurrentQPolicy

    def __init__(self, spec: R2D2, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device, seed=seed)
        self.memory = R2D2Memory(self.online.state_names, self.config.core_size)

    @torch.no_grad()
    def act(self, obs: Any, exploration: float) -> np.ndarray:
        """One recurrent step per env from its remembered state; epsilon-greedy over all branches together."""
        leaves = {key: torch.as_tensor(array, device=self.device).unsqueeze(1)
                  for key, array in leaf_arrays(self.spec.observation_space, obs).items()}
        num_envs = next(iter(leaves.values())).shape[0]
        state = {name: torch.as_tensor(value, device=self.device)
                 for name, value in self.memory.current(num_envs).items()}
        q, new_state = self.online(leaves, state)
        self.memory.advance({name: value.cpu().numpy() for name, value in new_state.items()})
        legal = leaves[self.online.mask_key][:, 0].cpu().numpy() if self.online.mask_key else None
        return self.epsilon_greedy(q[:, 0].argmax(dim=-1).cpu().numpy(), exploration, legal)

    def reset_memory(self, envs: np.ndarray) -> None:
        """Forget the recurrent state of the envs where ``envs`` [E] is True (their episodes begin)."""
        self.memory.reset(envs)


class R2D2Trainer(ApeXTrainer):
    """Unrolls the online and target networks over replayed sequences from their stored states."""

    runtime_tensors: ClassVar[tuple[str, ...]] = ("priority_eps", "max_grad_norm", "priority_eta")

    def learn(self, sample: SampleLike) -> tuple[Tensor, dict[str, Tensor]]:
        """One Adam step on the IS-weighted squared TD of the unmasked, post-burn-in steps; returns
        (sequence priorities [B], metrics)."""
        config = self.config
        data = {name: torch.as_tensor(value, device=self.device) for name, value in sample.data.items()}
        obs = {key: data[field_name("obs", key)] for key in self.spec.observation_leaves}
        state = {name: data[f"state/{name}"].float() for name in self.online.state_names}
        action = data["action"]
        actions = self.branches.to_indices(action.flatten(0, 1)).view(action.shape[0], action.shape[1], -1)
        mask, first = data["mask"].bool(), data["first"].bool()
        weights = torch.as_tensor(sample.weights, device=self.device, dtype=torch.float32)
        burn = config.burn_in
        steps = config.sequence_length

        with torch.no_grad():
            q_target, _ = self.target(obs, state)  # [B, T + 1, D, N]
        head, middle = self.online({k: v[:, :burn] for k, v in obs.items()}, state) if burn else (None, state)
        # The burn-in warms the state without a gradient, except where the stored state is exact.
        middle = {name: torch.where(first[:, None], value, value.detach()) for name, value in middle.items()}
        tail, _ = self.online({k: v[:, burn:] for k, v in obs.items()}, middle)
        q_online = torch.cat([head, tail], dim=1) if head is not None else tail

        with torch.no_grad():
            best = q_online.detach().argmax(dim=-1, keepdim=True)
            bootstrap = q_target.gather(-1, best).squeeze(-1).mean(dim=-1)  # [B, T + 1]
            targets = n_step_targets(data["reward"].float(), data["discount"].float(), mask, bootstrap,
                                     config.n_step)
        q_taken = q_online[:, :steps].gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [B, T, D]
        td = targets.unsqueeze(-1) - q_taken
        time = torch.arange(steps, device=self.device)
        loss_mask = mask & ((time >= burn)[None, :] | first[:, None])
        per_step = 0.5 * td.pow(2).mean(dim=-1) * loss_mask
        per_sequence = per_step.sum(dim=1) / loss_mask.sum(dim=1).clamp(min=1)
        loss = (weights * per_sequence).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_gradients(self.online.parameters(), self.knobs.max_grad_norm)
        self.optimizer.step()

        td_abs = td.detach().abs().mean(dim=-1)
        priorities = sequence_priorities(td_abs, loss_mask, self.knobs.priority_eta) + self.knobs.priority_eps
        values = (loss.detach(), (td_abs * loss_mask).sum() / loss_mask.sum().clamp(min=1), grad_norm.detach())
        return priorities, dict(zip(("losses/td_loss", "losses/td_abs", "losses/grad_norm"), values))


class R2D2(ApeXSpec):
    """R2D2 over any supported observation space and discrete (possibly branched) actions."""

    name: ClassVar[str] = "r2d2"
    config_class: ClassVar[type] = R2D2Config
    policy_class: ClassVar[type] = R2D2Policy
    trainer_class: ClassVar[type] = R2D2Trainer
    learner_defaults: ClassVar[Mapping[str, Any]] = {
        "batch_size": 32, "min_replay_size": 200, "samples_per_insert": 2.0, "replay_capacity": 10_000,
        "actor_batch_size": 4, "rate_error_buffer": 2_000.0,
    }

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: R2D2Config | None = None):
        super().__init__(observation_space, action_space, config)
        self.state_shapes = {name: (self.config.core_size,) for name in core_state_names(self.config.core)}

    def transition_fields(self) -> TransitionFields:
        return sequence_fields(self.observation_space, self.config.sequence_length, self.branches.shape,
                               torch.int64, self.state_shapes)

    def make_assembler(self, num_envs: int, policy: Policy) -> SequenceAssembler:
        """Sequences of ``policy``'s steps, each with the recurrent state it began from (``policy.memory``)."""
        return SequenceAssembler(num_envs, self.config.sequence_length, self.config.overlap, self.config.gamma,
                                 self.observation_space, self.branches.shape, np.int64, policy.memory,
                                 self.state_shapes)

    def make_network(self) -> RecurrentQNetwork:
        return RecurrentQNetwork(self.observation_space, self.branches, self.config)
