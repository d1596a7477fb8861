"""SAC and TD3: actions inside any Box's bounds, the actor alone on the wire, exact state round trips,
fitting, and what sets each apart (SAC's sampled actions, TD3's delayed actor and smoothed targets)."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorlearner.algorithms import make_spec
from actorlearner.algorithms.registry import resolve
from actorlearner.networks import UnsupportedSpace

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ASYMMETRIC = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 0.5], np.float32))
ALGORITHMS = ("sac", "td3")


def make(name: str, seed: int = 0, action_space: gym.Space = ASYMMETRIC, **kw):
    """A trainer."""
    return make_spec(name, OBS, action_space, {"hidden_sizes": (32, 32), **kw}).make_trainer(seed=seed)


def make_policy(name: str, seed: int = 0, **kw):
    return make_spec(name, OBS, ASYMMETRIC, {"hidden_sizes": (32, 32), **kw}).make_policy(seed=seed)


def batch(size: int = 32, seed: int = 0) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    low, high = torch.as_tensor(ASYMMETRIC.low), torch.as_tensor(ASYMMETRIC.high)
    data = {"obs": torch.rand(size, 3, generator=g) * 2 - 1,
            "action": low + torch.rand(size, 2, generator=g) * (high - low),
            "reward": torch.randn(size, generator=g), "discount": torch.full((size,), 0.9),
            "next_obs": torch.rand(size, 3, generator=g) * 2 - 1}
    return SimpleNamespace(weights=torch.ones(size), data=data)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_actions_lie_inside_asymmetric_per_dimension_bounds(name):
    algo = make_policy(name)
    obs = np.random.default_rng(0).uniform(-1, 1, (4000, 3)).astype(np.float32)
    explored, evaluated = algo.act(obs, algo.exploration(0, 2)), algo.act(obs, 0.0)
    for actions in (explored, evaluated):
        assert actions.dtype == np.float32 and actions.shape == (4000, 2)
        assert all(ASYMMETRIC.contains(a) for a in actions)
    np.testing.assert_array_equal(algo.act(obs[:5], 0.0), algo.act(obs[:5], 0.0))  # evaluation is deterministic
    # Another batch size may take another matmul blocking: the same actions up to float rounding.
    np.testing.assert_allclose(algo.act(obs[:5], 0.0), evaluated[:5], rtol=0, atol=1e-6)
    assert not np.array_equal(explored, evaluated)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_saturated_policy_acts_exactly_on_the_bounds_never_past_them(name):
    algo = make_policy(name)
    obs = np.random.default_rng(1).uniform(-1, 1, (500, 3)).astype(np.float32)
    for sign, edge in ((1.0, ASYMMETRIC.high), (-1.0, ASYMMETRIC.low)):
        with torch.no_grad():
            algo.actor.head.weight.zero_()
            algo.actor.head.bias.fill_(sign * 1e6)  # pre-squash values far past tanh's range
        explored, evaluated = algo.act(obs, algo.exploration(0, 2)), algo.act(obs, 0.0)
        assert all(ASYMMETRIC.contains(a) for a in np.concatenate([explored, evaluated]))
        np.testing.assert_allclose(evaluated, np.broadcast_to(edge, evaluated.shape), rtol=0, atol=1e-6)
        assert np.abs(explored - edge).max(0).tolist() <= (0.6 * (ASYMMETRIC.high - ASYMMETRIC.low)).tolist()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_random_steps_spread_over_the_bounds_then_the_policy_acts(name):
    algo = make_policy(name, random_steps=3)
    with torch.no_grad():
        algo.actor.head.bias.fill_(1e6)  # the policy alone would sit on the upper bounds
    obs = np.zeros((2000, 3), np.float32)
    assert np.array_equal(algo.act(obs[:4], 0.0), np.broadcast_to(ASYMMETRIC.high, (4, 2)))  # evaluation: never random
    for _ in range(3):
        actions = algo.act(obs, algo.exploration(0, 2))
        assert all(ASYMMETRIC.contains(a) for a in actions)
        assert (actions.min(0) < [-0.8, 0.05]).all() and (actions.max(0) > [2.8, 0.45]).all()
    following = algo.act(obs, algo.exploration(0, 2))  # near the upper bounds now (TD3 adds its noise)
    assert (following.mean(0) > ASYMMETRIC.high - 0.1 * (ASYMMETRIC.high - ASYMMETRIC.low)).all()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_fields_and_the_policy_on_the_wire_are_the_actors_only(name):
    spec = make_spec(name, OBS, ASYMMETRIC, {"hidden_sizes": [16]})
    algo, policy = spec.make_trainer(), spec.make_policy()
    assert spec.transition_fields()["action"] == ((2,), torch.float32)
    assert algo.policy_state_dict() and all(key.startswith(("encoder.", "head.")) for key in algo.policy_state_dict())
    assert policy.initial_priorities({"reward": torch.zeros(3)}) is None  # the learner's max priority
    cls = resolve(name)
    with pytest.raises(UnsupportedSpace, match="action space Discrete"):
        cls(OBS, gym.spaces.Discrete(3))
    with pytest.raises(UnsupportedSpace, match="finite action bounds"):
        cls(OBS, gym.spaces.Box(-np.inf, np.inf, (2,), np.float32))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_dict_observation_with_an_image_drives_continuous_actions(name):
    space = gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (12, 12, 3), np.uint8),
                             "state": gym.spaces.Box(-1, 1, (4,), np.float32)})
    spec = make_spec(name, space, ASYMMETRIC, {"hidden_sizes": (16,)})
    algo = spec.make_policy()
    obs = {"camera": np.random.default_rng(0).integers(0, 256, (5, 12, 12, 3), np.uint8),
           "state": np.zeros((5, 4), np.float32)}
    assert all(ASYMMETRIC.contains(a) for a in algo.act(obs, algo.exploration(0, 1)))
    assert {"obs/camera", "obs/state", "next_obs/camera"} <= set(spec.transition_fields())


@pytest.mark.parametrize("name", ALGORITHMS)
def test_updates_fit_the_critics_to_a_fixed_batch(name):
    algo = make(name, lr=3e-3)
    sample = batch()
    first, _ = algo.update(sample)
    for _ in range(300):
        last, metrics = algo.update(sample)
    assert last.mean() < first.mean() / 3 and np.isfinite(list(metrics.values())).all()


@pytest.mark.parametrize("name", ALGORITHMS)
def test_state_round_trip_continues_bit_exactly(name):
    algo, sample = make(name), batch()
    for _ in range(3):
        algo.update(sample)
    resumed = make(name, seed=5)
    resumed.load_state_dict(algo.state_dict())
    for _ in range(2):  # TD3: one update without and one with its delayed actor step
        a, _ = algo.update(sample)
        b, _ = resumed.update(sample)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for key, value in algo.state_dict().items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, resumed.state_dict()[key]), key
    with pytest.raises(KeyError, match="unexpected key"):
        resumed.load_state_dict({**algo.state_dict(), "stray.weight": torch.zeros(1)})


def test_td3_moves_its_actor_and_targets_only_every_policy_delay_updates():
    algo, sample = make("td3", policy_delay=3), batch()

    def snapshot():
        return [{k: v.clone() for k, v in net.state_dict().items()}
                for net in (algo.actor, algo.target_actor, algo.target_critics)]

    def changed(before, after):
        return [any(not torch.equal(b[k], a[k]) for k in b) for b, a in zip(before, after)]

    for step in range(1, 7):
        before = snapshot()
        critic_before = {k: v.clone() for k, v in algo.critics.state_dict().items()}
        algo.update(sample)
        assert any(not torch.equal(critic_before[k], v) for k, v in algo.critics.state_dict().items())
        assert changed(before, snapshot()) == [step % 3 == 0] * 3, step


def test_td3_target_smoothing_noise_is_clipped():
    """With noise_clip 0 any policy_noise leaves the target action as the target actor's own."""
    sample = batch()
    quiet, loud = make("td3", policy_noise=0.0), make("td3", policy_noise=5.0, noise_clip=0.0)
    for _ in range(4):
        a, _ = quiet.update(sample)
        b, _ = loud.update(sample)
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    noisy = make("td3", policy_noise=5.0, noise_clip=0.5)
    c, _ = noisy.update(sample)
    assert not torch.equal(c, make("td3", policy_noise=0.0).update(sample)[0])


def test_sac_samples_while_exploring_and_acts_with_the_mean_when_evaluated():
    algo = make_policy("sac")
    obs = np.zeros((2000, 3), np.float32)
    sampled = algo.act(obs, algo.exploration(0, 2))
    assert sampled.std(0).min() > 0.05 and np.ptp(algo.act(obs, 0.0), axis=0).max() == 0.0
