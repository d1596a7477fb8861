"""SAC: actions inside any Box's bounds, the actor alone on the wire, exact state round trips, learning."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorlearner.algorithms import make_algorithm
from actorlearner.algorithms.sac import SAC, SACConfig
from actorlearner.networks import UnsupportedSpace

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ASYMMETRIC = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 0.5], np.float32))


def make(seed: int = 0, action_space: gym.Space = ASYMMETRIC, **kw) -> SAC:
    return SAC(OBS, action_space, SACConfig(hidden_sizes=(32, 32), **kw), seed=seed)


def batch(size: int = 32, seed: int = 0) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    low, high = torch.as_tensor(ASYMMETRIC.low), torch.as_tensor(ASYMMETRIC.high)
    data = {"obs": torch.rand(size, 3, generator=g) * 2 - 1,
            "action": low + torch.rand(size, 2, generator=g) * (high - low),
            "reward": torch.randn(size, generator=g), "discount": torch.full((size,), 0.9),
            "next_obs": torch.rand(size, 3, generator=g) * 2 - 1}
    return SimpleNamespace(weights=torch.ones(size), data=data)


def test_actions_lie_inside_asymmetric_per_dimension_bounds_and_cover_them():
    algo = make()
    obs = np.random.default_rng(0).uniform(-1, 1, (4000, 3)).astype(np.float32)
    sampled, greedy = algo.act(obs, 1.0), algo.act(obs, 0.0)
    for actions in (sampled, greedy):
        assert actions.dtype == np.float32 and actions.shape == (4000, 2)
        assert all(ASYMMETRIC.contains(a) for a in actions)
    assert (sampled.min(0) < [-0.5, 0.1]).all() and (sampled.max(0) > [2.5, 0.4]).all()  # spread over each range
    np.testing.assert_array_equal(algo.act(obs[:5], 0.0), greedy[:5])  # the mean action is deterministic


def test_fields_and_the_policy_on_the_wire_are_the_actors_only():
    algo = make_algorithm("sac", OBS, ASYMMETRIC, {"hidden_sizes": [16]})
    assert algo.transition_fields()["action"] == ((2,), torch.float32)
    assert algo.policy_state_dict() and all(name.startswith(("encoder.", "head.")) for name in algo.policy_state_dict())
    assert algo.initial_priorities({"reward": torch.zeros(3)}) is None  # the learner's max priority
    with pytest.raises(UnsupportedSpace, match="action space Discrete"):
        SAC(OBS, gym.spaces.Discrete(3))
    with pytest.raises(UnsupportedSpace, match="finite action bounds"):
        SAC(OBS, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))


def test_updates_fit_the_critics_to_a_fixed_batch():
    algo = make(lr=3e-3)
    sample = batch()
    first, _ = algo.update(sample)
    for _ in range(300):
        last, metrics = algo.update(sample)
    assert last.mean() < first.mean() / 3 and np.isfinite(list(metrics.values())).all()


def test_state_round_trip_continues_bit_exactly():
    algo, sample = make(), batch()
    for _ in range(3):
        algo.update(sample)
    resumed = make(seed=5)
    resumed.load_state_dict(algo.state_dict())
    a, _ = algo.update(sample)
    b, _ = resumed.update(sample)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    for name, value in algo.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed.state_dict()[name]), name
