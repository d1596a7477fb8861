"""DQN's closed-form update for plain MLP Q networks: the same steps as autograd's, for the networks it
takes; every other network stays on autograd; checkpoints (also per-layer Adam slots) continue alike."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from gymnasium import spaces

import actorlearner.algorithms.dqn as dqn
from actorlearner.algorithms.dqn import DQN, DQNConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BOX = spaces.Box(-2.0, 2.0, (2, 3), np.float64)  # flattened and cast by the network, as FlatEncoder does


def trainers(config: DQNConfig, obs_space=BOX, act_space=spaces.Discrete(3, start=1)):
    """(a trainer on the closed-form update, one on autograd), same seed and weights."""
    spec = DQN(obs_space, act_space, config)
    fast = spec.make_trainer(seed=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dqn, "mlp_layers", lambda network: None)
        slow = spec.make_trainer(seed=3)
    assert fast._mlp is not None and slow._mlp is None
    return fast, slow


def sample(rng: np.random.Generator, size: int = 48) -> SimpleNamespace:
    data = {"obs": rng.normal(size=(size, 2, 3)), "next_obs": rng.normal(size=(size, 2, 3)),
            "action": rng.integers(1, 4, size), "reward": rng.normal(scale=3, size=size).astype(np.float32),
            "discount": ((rng.random(size) > 0.2) * 0.97).astype(np.float32)}
    return SimpleNamespace(data={k: torch.as_tensor(v) for k, v in data.items()},
                           weights=rng.random(size).astype(np.float32))


def assert_same_steps(fast, slow, steps: int, rng: np.random.Generator) -> None:
    for _ in range(steps):
        batch = sample(rng)
        (fast_priorities, fast_metrics), (slow_priorities, slow_metrics) = fast.update(batch), slow.update(batch)
        torch.testing.assert_close(fast_priorities, slow_priorities, rtol=1e-4, atol=1e-5)
        for name, value in slow_metrics.items():
            torch.testing.assert_close(fast_metrics[name], value, rtol=1e-4, atol=1e-5)
    for (name, mine), theirs in zip(fast.online.state_dict().items(), slow.online.state_dict().values()):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5, msg=name)
    for mine, theirs in zip(fast.target.state_dict().values(), slow.target.state_dict().values()):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hidden, dueling", [((128, 128), True), ((16,), False), ((), True), ((8, 6, 4), True)])
def test_the_closed_form_update_takes_autograds_steps(hidden, dueling):
    fast, slow = trainers(DQNConfig(hidden_sizes=hidden, dueling=dueling, target_update_period=3, max_grad_norm=0.5))
    assert_same_steps(fast, slow, 8, np.random.default_rng(0))  # the target synced twice, gradients clipped


def test_the_parameters_live_in_one_flat_tensor_that_adam_steps():
    fast, _ = trainers(DQNConfig(hidden_sizes=(8,)))
    flat = fast._mlp.flat
    assert fast.optimizer.param_groups[0]["params"] == [flat]
    assert flat.numel() == sum(p.numel() for p in fast.online.parameters())
    assert all(p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in fast.online.parameters())
    fast.online.load_state_dict({k: torch.zeros_like(v) for k, v in fast.online.state_dict().items()})
    assert not flat.detach().any()  # loading weights writes into the flat tensor


@pytest.mark.parametrize("obs_space, act_space", [
    (spaces.Box(0, 255, (36, 36, 3), np.uint8), spaces.Discrete(4)),  # an image: conv torso
    (spaces.Dict({"a": spaces.Box(-1, 1, (2,)), "b": spaces.Discrete(3)}), spaces.Discrete(2)),  # two leaves
    (spaces.Box(-1, 1, (4,)), spaces.MultiDiscrete([2, 3])),  # two branches
    (spaces.Dict({"obs": spaces.Box(-1, 1, (4,)), "action_mask": spaces.MultiBinary(3)}), spaces.Discrete(3)),
])
def test_every_other_network_stays_on_autograd(obs_space, act_space):
    trainer = DQN(obs_space, act_space, DQNConfig(hidden_sizes=(8,))).make_trainer()
    assert trainer._mlp is None
    assert len(trainer.optimizer.param_groups[0]["params"]) == len(list(trainer.online.parameters()))


def test_a_checkpoint_continues_alike_and_per_layer_adam_slots_are_joined():
    config = DQNConfig(hidden_sizes=(16, 8), target_update_period=4)
    fast, slow = trainers(config)
    rng = np.random.default_rng(1)
    assert_same_steps(fast, slow, 5, rng)
    resumed, legacy = trainers(config)
    resumed.load_state_dict(fast.state_dict())  # one flat slot per kind
    legacy_state = slow.state_dict()
    assert "optimizer.1.exp_avg" in legacy_state and "optimizer.1.exp_avg" not in fast.state_dict()
    joined, _ = trainers(config)
    joined.load_state_dict(legacy_state)  # what an autograd trainer wrote: a slot per layer
    state = rng.bit_generator.state
    assert_same_steps(resumed, slow, 5, rng)
    rng.bit_generator.state = state
    assert_same_steps(joined, fast, 5, rng)
