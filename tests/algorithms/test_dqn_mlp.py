"""DQN's closed-form update for plain MLP Q networks (action masks too): the same steps as autograd's, for the
networks it takes; every other network stays on autograd; checkpoints (also per-layer Adam slots) continue alike.
Acting on such a network runs its forward in numpy: the network's Q values, whatever weights it loads."""

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
# A board game's: two flat leaves, one of them the action mask (also a feature, as the encoder takes it)
MASKED = spaces.Dict({"board": BOX, "action_mask": spaces.MultiBinary(3)})


def trainers(config: DQNConfig, obs_space=BOX, act_space=spaces.Discrete(3, start=1)):
    """(a trainer on the closed-form update, one on autograd), same seed and weights."""
    spec = DQN(obs_space, act_space, config)
    fast = spec.make_trainer(seed=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dqn, "mlp_layers", lambda network: None)
        slow = spec.make_trainer(seed=3)
    assert fast._mlp is not None and slow._mlp is None
    return fast, slow


def sample(rng: np.random.Generator, size: int = 48, masked: bool = False) -> SimpleNamespace:
    """A batch of BOX (or MASKED) transitions; with masks, the action taken is legal and every next action
    illegal where the episode ended (a full board), as a game gives them."""
    data = {"obs": rng.normal(size=(size, 2, 3)), "next_obs": rng.normal(size=(size, 2, 3)),
            "action": rng.integers(1, 4, size), "reward": rng.normal(scale=3, size=size).astype(np.float32),
            "discount": ((rng.random(size) > 0.2) * 0.97).astype(np.float32)}
    if masked:
        for name in ("obs", "next_obs"):
            data[f"{name}/board"] = data.pop(name)
        legal = (rng.random((size, 3)) > 0.5).astype(np.int8)
        legal[np.arange(size), data["action"] - 1] = 1
        next_legal = (rng.random((size, 3)) > 0.5).astype(np.int8)
        next_legal[data["discount"] == 0] = 0
        data["obs/action_mask"], data["next_obs/action_mask"] = legal, next_legal
    return SimpleNamespace(data={k: torch.as_tensor(v) for k, v in data.items()},
                           weights=rng.random(size).astype(np.float32))


def assert_same_steps(fast, slow, steps: int, rng: np.random.Generator, masked: bool = False) -> None:
    for _ in range(steps):
        batch = sample(rng, masked=masked)
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


@pytest.mark.parametrize("dueling", [True, False])
def test_the_closed_form_update_takes_autograds_steps_with_an_action_mask(dueling):
    fast, slow = trainers(DQNConfig(hidden_sizes=(16, 8), dueling=dueling, target_update_period=3), MASKED)
    assert fast._mlp.mask_key == "action_mask"
    assert_same_steps(fast, slow, 8, np.random.default_rng(2), masked=True)


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
])
def test_every_other_network_stays_on_autograd(obs_space, act_space):
    spec = DQN(obs_space, act_space, DQNConfig(hidden_sizes=(8,)))
    trainer = spec.make_trainer()
    assert trainer._mlp is None and spec.make_policy()._numpy_q is None
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


@pytest.mark.parametrize("rows", [6, 40])  # 40 rows of the (128, 128) network: torch's forward (`MLPActing.max_rows`)
@pytest.mark.parametrize("space, hidden, dueling", [(BOX, (128, 128), True), (BOX, (), False), (MASKED, (16,), True)])
def test_acting_runs_the_networks_forward_in_numpy_and_follows_the_weights_it_loads(space, hidden, dueling, rows):
    spec = DQN(space, spaces.Discrete(3, start=1), DQNConfig(hidden_sizes=hidden, dueling=dueling))
    policy, other = spec.make_policy(seed=0), spec.make_policy(seed=1)
    assert policy._numpy_q is not None
    data = sample(np.random.default_rng(4), size=rows, masked=space is MASKED).data
    obs = {key.removeprefix("obs/"): value.numpy() for key, value in data.items() if key.startswith("obs/")} \
        if space is MASKED else data["obs"].numpy()
    seen = []
    for _ in range(2):  # before and after loading another policy's weights
        actions, q = policy.act_values(obs, 0.0)
        with torch.no_grad():
            expected = policy.online({key: torch.as_tensor(array) for key, array in policy._split(obs).items()})
        np.testing.assert_allclose(q, expected.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(actions, expected[:, 0].argmax(-1).numpy() + 1)
        seen.append(q)
        policy.load_policy_state_dict(other.policy_state_dict())
    assert not np.allclose(seen[0], seen[1])


def test_a_network_whose_products_would_be_split_over_threads_acts_through_torch():
    """Numpy's BLAS would run (2, 5000) x (5000, 5000) on several threads: such a network never acts in numpy."""
    policy = DQN(BOX, spaces.Discrete(3), DQNConfig(hidden_sizes=(5000, 5000))).make_policy()
    assert policy._numpy_q.max_rows == 0
    assert DQN(BOX, spaces.Discrete(3), DQNConfig(hidden_sizes=(128, 128))).make_policy()._numpy_q.max_rows == 16
