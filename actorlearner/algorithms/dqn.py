"""Ape-X DQN: dueling double DQN on n-step returns, with |TD| replay priorities.

Observations of any supported space go through `ObservationEncoder` (a conv torso per image,
one-hots, an MLP); actions are one or more discrete branches (`Discrete`, or `MultiDiscrete`
and `MultiBinary` in the action-branching form of Tavakoli et al. 2018: one dueling head per
dimension on a shared torso, one bootstrap target averaged over the branches).

The target math is a handful of pure functions (`double_q_target`, `double_q_learning`,
`huber`) in rlax's time-indexed style: `_tm1` is the step the action was taken in, `_t` the
step bootstrapped from, Q values are ``[B, D, N]`` (D branches). `discount_t` already holds
gamma**k (or 0 after a termination), so n-step returns need nothing special here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from actorlearner.algorithms.apex import ApeXExploration, ApeXPolicy, ApeXSpec, ApeXTrainer
from actorlearner.algorithms.base import (
    PRIORITY,
    Policy,
    SampleLike,
    TransitionFields,
    check_common_config,
    clip_gradients,
    make_adam,
)
from actorlearner.algorithms.dqn_mlp import MLPActing, MLPUpdate, mlp_layers
from actorlearner.algorithms.nstep import NStepAssembler, nstep_fields
from actorlearner.config import RUNTIME
from actorlearner.networks import (
    ActionBranches,
    BranchingDuelingHead,
    ObservationEncoder,
    action_mask_key,
    field_name,
    mask_q,
)
from actorlearner.networks.leaves import leaf_splitter


@dataclass
class DQNOptions:
    """Ape-X DQN's own hyperparameters (`DQNConfig` adds the exploration's)."""

    hidden_sizes: tuple[int, ...] = (128, 128)
    """Widths of the MLP torso's hidden layers (after the per-leaf encoders and image conv torsos)."""
    dueling: bool = True
    """Split the head into a state value and mean-centred advantages."""
    channel_order: str = "auto"
    """Channel axis of image observations: hwc, chw, or auto (the smaller of the first and last dims)."""
    lr: float = field(default=5e-4, metadata=RUNTIME)
    """Adam learning rate."""
    gamma: float = 0.99
    """Per-step discount; the actors fold it into each transition's `discount`."""
    n_step: int = 3
    """Rewards summed per transition before bootstrapping."""
    target_update_period: int = field(default=250, metadata=RUNTIME)
    """Updates between target network syncs."""
    tau: float = field(default=1.0, metadata=RUNTIME)
    """Target sync mix: target <- tau * online + (1 - tau) * target; 1.0 is a hard copy."""
    max_grad_norm: float = field(default=10.0, metadata=RUNTIME)
    """Global gradient norm clip."""
    huber_delta: float = 1.0
    """Where the Huber loss turns from quadratic to linear."""
    priority_eps: float = field(default=1e-6, metadata=RUNTIME)
    """Added to |TD| so that no item's priority is zero."""


@dataclass
class DQNConfig(ApeXExploration, DQNOptions):
    """Ape-X DQN hyperparameters; the defaults solve CartPole-v1."""

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        check_common_config(self)
        if self.target_update_period < 1:
            raise ValueError(f"target_update_period must be >= 1, got {self.target_update_period}")


# ---------------------------------------------------------------- pure functions


def huber(x: Tensor, delta: float = 1.0) -> Tensor:
    """Elementwise Huber loss: x**2 / 2 inside [-delta, delta], linear outside (torch's fused kernel)."""
    return F.huber_loss(x, torch.zeros_like(x), reduction="none", delta=delta)


def double_q_target(r_t: Tensor, discount_t: Tensor, q_t_online: Tensor, q_t_target: Tensor) -> Tensor:
    """Double-Q bootstrap target [B]: per branch the online net picks a_t and the target net values
    it; the branches' values are averaged (one target for the joint action)."""
    a_t = q_t_online.argmax(dim=-1, keepdim=True)
    return r_t + discount_t * q_t_target.gather(-1, a_t).squeeze(-1).mean(dim=-1)


def double_q_learning(
    q_tm1: Tensor, a_tm1: Tensor, r_t: Tensor, discount_t: Tensor, q_t_online: Tensor, q_t_target: Tensor
) -> Tensor:
    """Double-Q TD errors [B, D] = target - q_tm1[a_tm1] per branch; the target carries no gradient.

    Q values are [B, D, N], actions a_tm1 branch indices [B, D], r_t and discount_t [B].
    """
    target = double_q_target(r_t, discount_t, q_t_online, q_t_target).detach()
    return target.unsqueeze(-1) - q_tm1.gather(-1, a_tm1.unsqueeze(-1)).squeeze(-1)


# ---------------------------------------------------------------- network


class QNetwork(nn.Module):
    """Observations (a dict of leaf tensors) -> Q values [B, D, N_max], one dueling head per action branch;
    an ``action_mask`` observation entry masks illegal actions (see `action_mask_key`)."""

    def __init__(self, observation_space: gym.Space, branches: ActionBranches, config: DQNConfig):
        super().__init__()
        self.encoder = ObservationEncoder(observation_space, config.hidden_sizes, config.channel_order)
        self.head = BranchingDuelingHead(self.encoder.output_dim, branches.sizes, config.dueling)
        self.mask_key = action_mask_key(observation_space, branches)

    def forward(self, obs: Mapping[str, Tensor]) -> Tensor:
        q = self.head(self.encoder(obs))
        return q if self.mask_key is None else mask_q(q, obs[self.mask_key])

    def function(self) -> Callable[[Mapping[str, Tensor]], Tensor]:
        """`forward` as a function of the parameters held now, for acting (see `networks.encoders.bound`)."""
        encode, head, key = self.encoder.function(), self.head.function(), self.mask_key
        return (lambda obs: head(encode(obs))) if key is None else (lambda obs: mask_q(head(encode(obs)), obs[key]))


# ---------------------------------------------------------------- algorithm


class DQNPolicy(ApeXPolicy):
    """Epsilon-greedy on the online Q network; Ape-X initial priorities from it alone."""

    def __init__(self, spec: DQN, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device, seed=seed)
        self._split = leaf_splitter(spec.observation_space)
        self._q = self.online.function()  # the online network's forward, cheaper on an actor's few rows
        # cheaper still for a plain MLP network on the CPU: the same forward in numpy
        self._numpy_q = MLPActing(self.online) if self.device.type == "cpu" and mlp_layers(self.online) else None

    def act(self, obs: Any, exploration: np.ndarray | float) -> np.ndarray:
        """Epsilon-greedy actions (all branches random together) in the env's action values."""
        return self.act_values(obs, exploration)[0]

    @torch.inference_mode()
    def act_values(self, obs: Any, exploration: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        """`act`'s actions and the Q values [E, D, N] they were chosen on (for `ApeXNStepAssembler`)."""
        arrays = self._split(obs)
        legal = arrays[self.online.mask_key] if self.online.mask_key else None
        if self._numpy_q is not None and len(next(iter(arrays.values()))) <= self._numpy_q.max_rows:
            q = self._numpy_q(arrays)
        else:
            q = self._q({key: torch.as_tensor(array, device=self.device) for key, array in arrays.items()}).cpu().numpy()
        return self.epsilon_greedy(q.argmax(axis=-1), exploration, legal), q

    @torch.no_grad()
    def initial_priorities(self, fields: Mapping[str, Tensor]) -> Tensor:
        """|TD| + eps [B] with the online net as both selector and evaluator (actors hold no target)."""
        obs, a_tm1, r_t, discount_t, next_obs = self.spec.unpack(fields, self.device)
        q_t = self.online(next_obs)
        td = double_q_learning(self.online(obs), a_tm1, r_t, discount_t, q_t, q_t)
        return td.abs().mean(dim=-1) + self.config.priority_eps


class DQNTrainer(ApeXTrainer):
    """Double DQN steps on the IS-weighted Huber loss, the target synced every `target_update_period`."""

    def __init__(self, spec: ApeXSpec, *, device: str | torch.device = "cpu", seed: int = 0):
        super().__init__(spec, device=device, seed=seed)
        # a plain MLP network (flat observations, one Discrete branch, masked or not) steps with its gradients
        # written out, Adam on its parameters as one flat tensor
        self._mlp = MLPUpdate(self.online, self.target, self.config.huber_delta) if mlp_layers(self.online) else None
        self._params = [self._mlp.flat] if self._mlp else list(self.online.parameters())
        if self._mlp:
            self.optimizer = make_adam(self._params, self.config.lr, self.device)

    def learn(self, sample: SampleLike) -> tuple[Tensor, dict[str, Tensor]]:
        """One Adam step on the IS-weighted Huber loss (mean over branches); returns (|TD| + eps [B], metrics)."""
        obs, a_tm1, r_t, discount_t, next_obs = self.spec.unpack(sample.data, self.device)
        weights = torch.as_tensor(sample.weights, device=self.device, dtype=torch.float32)
        if self._mlp is not None:
            loss, td_abs, q_taken = self._mlp(obs, a_tm1, r_t, discount_t, next_obs, weights)
        else:
            loss, td_abs, q_taken = self._autograd_loss(obs, a_tm1, r_t, discount_t, next_obs, weights)
        grad_norm = clip_gradients(self._params, self.knobs.max_grad_norm)
        self.optimizer.step()
        values = (loss.detach(), td_abs.mean(), q_taken.mean(), grad_norm.detach())
        metrics = dict(zip(("losses/td_loss", "losses/td_abs", "losses/q_values", "losses/grad_norm"), values))
        return td_abs + self.knobs.priority_eps, metrics

    def load_state_dict(self, state: Mapping[str, Tensor | int | float]) -> None:
        """As `ApeXTrainer.load_state_dict`; Adam slots saved per layer (before the flat parameter) are joined."""
        if self._mlp and "optimizer.1.step" in state:
            state = dict(state)
            layers = range(len(list(self.online.parameters())))
            for slot in ("exp_avg", "exp_avg_sq"):
                state[f"optimizer.0.{slot}"] = torch.cat([torch.as_tensor(state.pop(f"optimizer.{i}.{slot}")).reshape(-1)
                                                          for i in layers])
            for i in layers[1:]:
                del state[f"optimizer.{i}.step"]
        super().load_state_dict(state)

    def _autograd_loss(self, obs, a_tm1, r_t, discount_t, next_obs, weights) -> tuple[Tensor, Tensor, Tensor]:
        """The loss's gradients by autograd, for any Q network; returns (loss, |TD| [B], Q of the actions taken [B])."""
        q_tm1 = self.online(obs)
        with torch.no_grad():
            q_t_online = self.online(next_obs)
            q_t_target = self.target(next_obs)
        td = double_q_learning(q_tm1, a_tm1, r_t, discount_t, q_t_online, q_t_target)  # [B, D]
        loss = (weights * huber(td, self.config.huber_delta).mean(dim=-1)).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        q_taken = q_tm1.detach().gather(-1, a_tm1.unsqueeze(-1)).squeeze(-1).mean(dim=-1)
        return loss, td.detach().abs().mean(dim=-1), q_taken


class ApeXNStepAssembler(NStepAssembler):
    """DQN's n-step transitions, each with its Ape-X initial priority (under `PRIORITY`) when ``push`` gets
    the Q values acting chose on (``acted``): |TD| + eps as `DQNPolicy.initial_priorities` gives it,
    without a second forward pass.

    A transition's bootstrap value is that of the observation the policy acts on next (with
    next-step autoreset an episode's final one too), so transitions come out one push later.
    `flush` cannot value that observation: its transitions' priorities are NaN, for the policy.
    """

    _ENV, _Q_TAKEN = "@env", "@q_taken"  # what a window carries until its priority is known

    def __init__(self, spec: DQN, num_envs: int, policy: Policy):
        super().__init__(num_envs, spec.config.n_step, spec.config.gamma, spec.observation_space,
                         spec.branches.shape, np.int64)
        self.policy = policy
        branches = len(spec.branches.sizes)
        self._starts = np.tile(np.asarray(spec.branches.starts, np.int64), num_envs)
        self._rows = np.arange(num_envs * branches)
        self._q_taken = np.zeros((num_envs, spec.config.n_step, branches), np.float32)
        self._waiting: dict[str, np.ndarray] | None = None  # emitted by the last push, not yet valued
        self._acted: bool | None = None  # whether pushes come with Q values (decided by the first)

    def push(self, obs, action: np.ndarray, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
             next_obs, acted: np.ndarray | None = None) -> dict[str, np.ndarray] | None:
        """As `NStepAssembler.push`; with ``acted`` (Q values [E, D, N] of ``obs``) the transitions of the
        previous push come out, valued."""
        if self._acted is None:
            self._acted = acted is not None
        if self._acted != (acted is not None):
            raise ValueError("push gets the Q values acting chose on every time or never")
        if acted is None:
            return super().push(obs, action, reward, terminated, truncated, next_obs)
        q = acted.reshape(len(self._rows), -1)  # [E * D, N]
        indices = np.asarray(action).reshape(-1) - self._starts  # [E * D], row-major over (env, branch)
        self._q_taken[:, self._step % self.n_step] = q[self._rows, indices].reshape(self.num_envs, -1)
        values = q.max(axis=-1)
        valued = self._valued(values if len(self._rows) == self.num_envs else values.reshape(self.num_envs, -1).mean(-1))
        self._waiting = super().push(obs, action, reward, terminated, truncated, next_obs)
        return valued

    def reset(self) -> None:
        """Drop every pending window and the transitions waiting for their bootstrap value."""
        super().reset()
        self._waiting = None

    def flush(self) -> dict[str, np.ndarray] | None:
        """Everything pending, as `NStepAssembler.flush`, priorities NaN (their bootstrap is not valued)."""
        if not self._acted:
            return super().flush()
        unknown = np.full(self.num_envs, np.nan, np.float32)
        blocks = [block for block in (self._valued(unknown), self._valued(unknown, super().flush())) if block]
        return {k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]} if blocks else None

    def _valued(self, values: np.ndarray, block: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray] | None:
        """``block`` (default: the one waiting) with priorities, ``values`` [E] valuing each env's bootstrap."""
        block, self._waiting = (self._waiting, None) if block is None else (block, self._waiting)
        if block is None:
            return None
        env_idx, q_taken = block.pop(self._ENV), block.pop(self._Q_TAKEN)
        target = block["reward"] + block["discount"] * values[env_idx]
        block[PRIORITY] = np.abs(target[:, None] - q_taken).mean(axis=-1) + np.float32(self.policy.config.priority_eps)
        return block

    def _extra(self, env_idx: np.ndarray, start: np.ndarray) -> dict[str, np.ndarray]:
        return {self._ENV: env_idx, self._Q_TAKEN: self._q_taken[env_idx, start]} if self._acted else {}


class DQN(ApeXSpec):
    """Ape-X DQN over any supported observation space and discrete (possibly branched) actions."""

    name: ClassVar[str] = "dqn"
    config_class: ClassVar[type] = DQNConfig
    policy_class: ClassVar[type] = DQNPolicy
    trainer_class: ClassVar[type] = DQNTrainer

    def transition_fields(self) -> TransitionFields:
        """One field per observation leaf in its own dtype (uint8 frames stay 4x smaller), then the
        action (branch values, int64), n-step reward and discount, and the next observation."""
        return nstep_fields(self.observation_space, self.branches.shape, torch.int64)

    def make_assembler(self, num_envs: int, policy: Policy) -> ApeXNStepAssembler:
        return ApeXNStepAssembler(self, num_envs, policy)

    def make_network(self) -> QNetwork:
        return QNetwork(self.observation_space, self.branches, self.config)

    def unpack(self, fields: Mapping[str, Tensor], device: torch.device):
        """(obs leaves, branch indices [B, D], reward, discount, next-obs leaves) on ``device``."""
        def get(name: str) -> Tensor:
            return torch.as_tensor(fields[name], device=device)

        return (
            {key: get(field_name("obs", key)) for key in self.observation_leaves},
            self.branches.to_indices(get("action")),
            get("reward").float(),
            get("discount").float(),
            {key: get(field_name("next_obs", key)) for key in self.observation_leaves},
        )


__all__ = [
    "DQN",
    "DQNConfig",
    "DQNPolicy",
    "DQNTrainer",
    "QNetwork",
    "double_q_learning",
    "double_q_target",
    "huber",
]
