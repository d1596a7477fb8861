"""Ape-X DQN: dueling double DQN on n-step returns, with |TD| replay priorities.

The target math is a handful of pure functions (`double_q_target`, `double_q_learning`,
`huber`, `dueling_combine`) in rlax's time-indexed style: `_tm1` is the step the action was
taken in, `_t` the step bootstrapped from. `discount_t` already holds gamma**k (or 0 after a
termination), so n-step returns need nothing special here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from actorlearner.algorithms.base import FlatState, SampleLike, TransitionFields


@dataclass
class DQNConfig:
    """Ape-X DQN hyperparameters; the defaults solve CartPole-v1."""

    hidden_sizes: tuple[int, ...] = (128, 128)
    """Widths of the MLP torso's hidden layers."""
    dueling: bool = True
    """Split the head into a state value and mean-centred advantages."""
    lr: float = 5e-4
    """Adam learning rate."""
    gamma: float = 0.99
    """Per-step discount; the actors fold it into each transition's `discount`."""
    n_step: int = 3
    """Rewards summed per transition before bootstrapping."""
    target_update_period: int = 250
    """Updates between target network syncs."""
    tau: float = 1.0
    """Target sync mix: target <- tau * online + (1 - tau) * target; 1.0 is a hard copy."""
    max_grad_norm: float = 10.0
    """Global gradient norm clip."""
    huber_delta: float = 1.0
    """Where the Huber loss turns from quadratic to linear."""
    priority_eps: float = 1e-6
    """Added to |TD| so that no item's priority is zero."""
    device: str = field(default="cpu", metadata={"option": False})
    """Torch device of the networks; "auto" picks cuda when there is one. Set by the learner (its
    --device) and the actor (cpu), not an option."""
    seed: int = field(default=0, metadata={"option": False})
    """Seeds the network init and the exploration RNG. Set from the learner's or actor's --seed."""

    def __post_init__(self) -> None:
        self.hidden_sizes = tuple(int(h) for h in self.hidden_sizes)
        if self.n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {self.n_step}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {self.tau}")
        if self.target_update_period < 1:
            raise ValueError(f"target_update_period must be >= 1, got {self.target_update_period}")


# ---------------------------------------------------------------- pure functions


def huber(x: Tensor, delta: float = 1.0) -> Tensor:
    """Elementwise Huber loss: x**2 / 2 inside [-delta, delta], linear outside."""
    abs_x = x.abs()
    quadratic = abs_x.clamp(max=delta)
    return 0.5 * quadratic**2 + delta * (abs_x - quadratic)


def dueling_combine(value: Tensor, advantages: Tensor) -> Tensor:
    """Q = V + A - mean(A): value [B], advantages [B, A] -> q [B, A]."""
    return value.unsqueeze(-1) + advantages - advantages.mean(dim=-1, keepdim=True)


def double_q_target(r_t: Tensor, discount_t: Tensor, q_t_online: Tensor, q_t_target: Tensor) -> Tensor:
    """Double-Q bootstrap target [B]: the online net picks a_t, the target net values it."""
    a_t = q_t_online.argmax(dim=-1, keepdim=True)
    return r_t + discount_t * q_t_target.gather(-1, a_t).squeeze(-1)


def double_q_learning(
    q_tm1: Tensor, a_tm1: Tensor, r_t: Tensor, discount_t: Tensor, q_t_online: Tensor, q_t_target: Tensor
) -> Tensor:
    """Double-Q TD error [B] = target - q_tm1[a_tm1]; the target carries no gradient."""
    target = double_q_target(r_t, discount_t, q_t_online, q_t_target).detach()
    return target - q_tm1.gather(-1, a_tm1.unsqueeze(-1)).squeeze(-1)


def apex_epsilons(num_actors: int, base: float = 0.4, alpha: float = 7.0) -> list[float]:
    """Ape-X per-actor exploration: eps_i = base ** (1 + alpha * i / (N - 1)); N == 1 gives [base]."""
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if num_actors == 1:
        return [base]
    return [base ** (1.0 + alpha * i / (num_actors - 1)) for i in range(num_actors)]


# ---------------------------------------------------------------- network


class QNetwork(nn.Module):
    """MLP from flattened observations to Q values [B, num_actions], optionally dueling."""

    def __init__(self, obs_dim: int, num_actions: int, hidden_sizes: tuple[int, ...], dueling: bool = True):
        super().__init__()
        layers: list[nn.Module] = []
        width = obs_dim
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.torso = nn.Sequential(*layers)
        self.advantage = nn.Linear(width, num_actions)
        self.value = nn.Linear(width, 1) if dueling else None

    def forward(self, obs: Tensor) -> Tensor:
        h = self.torso(obs.flatten(start_dim=1))
        if self.value is None:
            return self.advantage(h)
        return dueling_combine(self.value(h).squeeze(-1), self.advantage(h))


# ---------------------------------------------------------------- algorithm


def _resolve_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _cpu_copy(t: Tensor) -> Tensor:
    return t.detach().to("cpu", copy=True)


class DQN:
    """Ape-X DQN over a Box observation space and a Discrete action space."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space, config: DQNConfig | None = None):
        if not isinstance(observation_space, gym.spaces.Box):
            raise TypeError(f"DQN needs a Box observation space, got {observation_space}")
        if not isinstance(action_space, gym.spaces.Discrete):
            raise TypeError(f"DQN needs a Discrete action space, got {action_space}")
        self.config = config or DQNConfig()
        self.obs_shape: tuple[int, ...] = tuple(observation_space.shape)
        self.obs_dtype = np.dtype(observation_space.dtype)
        self.num_actions = int(action_space.n)
        self._action_start = int(action_space.start)
        self.device = _resolve_device(self.config.device)
        self.num_updates = 0

        obs_dim = int(np.prod(self.obs_shape, dtype=np.int64))
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
            torch.manual_seed(self.config.seed)
            self.online = QNetwork(obs_dim, self.num_actions, self.config.hidden_sizes, self.config.dueling)
        self.target = QNetwork(obs_dim, self.num_actions, self.config.hidden_sizes, self.config.dueling)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.online.to(self.device)
        self.target.to(self.device)
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=self.config.lr)
        self._rng = np.random.default_rng(self.config.seed)

    @property
    def n_step(self) -> int:
        return self.config.n_step

    @property
    def gamma(self) -> float:
        return self.config.gamma

    def transition_fields(self) -> TransitionFields:
        """Observations keep the env's dtype (uint8 frames stay 4x smaller); the network casts them."""
        obs_dtype = torch.from_numpy(np.empty(0, self.obs_dtype)).dtype
        return {
            "obs": (self.obs_shape, obs_dtype),
            "action": ((), torch.int64),
            "reward": ((), torch.float32),
            "discount": ((), torch.float32),
            "next_obs": (self.obs_shape, obs_dtype),
        }

    # ------------------------------------------------------------ actor side

    @torch.no_grad()
    def act(self, obs: np.ndarray, epsilon: np.ndarray | float) -> np.ndarray:
        """Epsilon-greedy actions [E] (int64, in the env's action range); epsilon is per row or scalar."""
        obs_t = torch.as_tensor(np.asarray(obs, dtype=np.float32), device=self.device)
        greedy = self.online(obs_t).argmax(dim=-1).cpu().numpy()
        n = greedy.shape[0]
        explore = self._rng.random(n) < np.broadcast_to(np.asarray(epsilon, dtype=np.float64), (n,))
        random_actions = self._rng.integers(self.num_actions, size=n)
        return np.where(explore, random_actions, greedy).astype(np.int64) + self._action_start

    @torch.no_grad()
    def initial_priorities(self, fields: Mapping[str, Tensor]) -> Tensor:
        """|TD| + eps [B] with the online net as both selector and evaluator (actors hold no target)."""
        obs, a_tm1, r_t, discount_t, next_obs = self._unpack(fields)
        q_t = self.online(next_obs)
        td = double_q_learning(self.online(obs), a_tm1, r_t, discount_t, q_t, q_t)
        return td.abs() + self.config.priority_eps

    # ------------------------------------------------------------ learner side

    def update(self, sample: SampleLike) -> tuple[Tensor, dict[str, float]]:
        """One Adam step on the IS-weighted Huber loss; returns (|TD| + eps [B], metrics)."""
        obs, a_tm1, r_t, discount_t, next_obs = self._unpack(sample.data)
        weights = torch.as_tensor(sample.weights, device=self.device, dtype=torch.float32)

        q_tm1 = self.online(obs)
        with torch.no_grad():
            q_t_online = self.online(next_obs)
            q_t_target = self.target(next_obs)
        td = double_q_learning(q_tm1, a_tm1, r_t, discount_t, q_t_online, q_t_target)
        loss = (weights * huber(td, self.config.huber_delta)).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.online.parameters(), self.config.max_grad_norm)
        self.optimizer.step()
        self.num_updates += 1
        if self.num_updates % self.config.target_update_period == 0:
            self._sync_target()

        td = td.detach()
        q_taken = q_tm1.detach().gather(-1, a_tm1.unsqueeze(-1)).squeeze(-1)
        # One device sync for all metrics.
        values = torch.stack([loss.detach(), td.abs().mean(), q_taken.mean(), grad_norm.detach()]).tolist()
        metrics = dict(zip(("losses/td_loss", "losses/td_abs", "losses/q_values", "losses/grad_norm"), values))
        return td.abs() + self.config.priority_eps, metrics

    def _unpack(self, fields: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        def get(name: str, dtype: torch.dtype) -> Tensor:
            return torch.as_tensor(fields[name], device=self.device).to(dtype)

        a_tm1 = get("action", torch.int64) - self._action_start
        return (
            get("obs", torch.float32),
            a_tm1,
            get("reward", torch.float32),
            get("discount", torch.float32),
            get("next_obs", torch.float32),
        )

    @torch.no_grad()
    def _sync_target(self) -> None:
        tau = self.config.tau
        if tau >= 1.0:
            self.target.load_state_dict(self.online.state_dict())
            return
        for target_param, online_param in zip(self.target.parameters(), self.online.parameters()):
            target_param.lerp_(online_param, tau)

    # ------------------------------------------------------------ state

    def policy_state_dict(self) -> dict[str, Tensor]:
        return {name: _cpu_copy(t) for name, t in self.online.state_dict().items()}

    def load_policy_state_dict(self, state: Mapping[str, Tensor]) -> None:
        self.online.load_state_dict({name: torch.as_tensor(t) for name, t in state.items()})

    def state_dict(self) -> FlatState:
        """Flat names -> CPU tensors / ints: `online.*`, `target.*`, `optimizer.<param>.<slot>`, `num_updates`.

        Optimizer hyperparameters are not stored; they come from the config on load.
        """
        out: FlatState = {}
        for prefix, net in (("online", self.online), ("target", self.target)):
            for name, t in net.state_dict().items():
                out[f"{prefix}.{name}"] = _cpu_copy(t)
        for index, slots in self.optimizer.state_dict()["state"].items():
            for slot, value in slots.items():
                out[f"optimizer.{index}.{slot}"] = _cpu_copy(value) if isinstance(value, Tensor) else value
        out["num_updates"] = self.num_updates
        return out

    def load_state_dict(self, state: Mapping[str, Tensor | int | float]) -> None:
        nets: dict[str, dict[str, Tensor]] = {"online": {}, "target": {}}
        optim_state: dict[int, dict[str, Tensor | int | float]] = {}
        for key, value in state.items():
            prefix, _, rest = key.partition(".")
            if prefix in nets:
                nets[prefix][rest] = torch.as_tensor(value)
            elif prefix == "optimizer":
                index, _, slot = rest.partition(".")
                optim_state.setdefault(int(index), {})[slot] = value
            elif key != "num_updates":
                raise KeyError(f"unexpected key in DQN state: {key!r}")
        self.online.load_state_dict(nets["online"])
        self.target.load_state_dict(nets["target"])
        param_groups = self.optimizer.state_dict()["param_groups"]
        self.optimizer.load_state_dict({"state": optim_state, "param_groups": param_groups})
        self.num_updates = int(state["num_updates"])

    def to(self, device: str | torch.device) -> DQN:
        self.device = _resolve_device(device)
        self.online.to(self.device)
        self.target.to(self.device)
        for slots in self.optimizer.state.values():
            for slot, value in slots.items():
                if isinstance(value, Tensor) and slot != "step":
                    slots[slot] = value.to(self.device)
        return self


__all__ = [
    "DQN",
    "DQNConfig",
    "QNetwork",
    "apex_epsilons",
    "double_q_learning",
    "double_q_target",
    "dueling_combine",
    "huber",
]
