"""Ape-X DQN: pure target/loss functions on hand-made tensors, state round trips, a learning smoke test."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch

from actorlearner.algorithms import Algorithm, make_algorithm
from actorlearner.algorithms.dqn import (
    DQN,
    DQNConfig,
    apex_epsilons,
    double_q_learning,
    double_q_target,
    dueling_combine,
    huber,
)

OBS_SPACE = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
ACT_SPACE = gym.spaces.Discrete(3)


def make(seed: int = 0, **kw) -> DQN:
    return DQN(OBS_SPACE, ACT_SPACE, DQNConfig(hidden_sizes=(32, 32), seed=seed, **kw))


def batch(size: int = 16, seed: int = 0, discount: float = 0.9) -> SimpleNamespace:
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.rand(size, 4, generator=g) * 2 - 1,
        "action": torch.randint(0, 3, (size,), generator=g),
        "reward": torch.randn(size, generator=g),
        "discount": torch.full((size,), discount),
        "next_obs": torch.rand(size, 4, generator=g) * 2 - 1,
    }
    return SimpleNamespace(weights=torch.ones(size), data=data)


# ---------------------------------------------------------------- pure functions


def test_huber_is_quadratic_inside_delta_and_linear_outside():
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 2.0])
    torch.testing.assert_close(huber(x, 1.0), torch.tensor([2.5, 0.5, 0.125, 0.0, 0.125, 1.5]))
    torch.testing.assert_close(huber(torch.tensor([1.0, 3.0]), 2.0), torch.tensor([0.5, 4.0]))
    x = torch.tensor([-5.0, 0.25, 5.0], requires_grad=True)
    huber(x, 1.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([-1.0, 0.25, 1.0]))


def test_dueling_combine_centres_advantages_on_the_value():
    value = torch.tensor([1.0, -2.0])
    advantages = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]])
    q = dueling_combine(value, advantages)
    torch.testing.assert_close(q, torch.tensor([[0.0, 1.0, 2.0], [-3.0, -3.0, 0.0]]))
    torch.testing.assert_close(q.mean(-1), value)


def test_double_q_target_selects_with_online_and_evaluates_with_target():
    r_t = torch.tensor([1.0, 1.0, 2.0])
    discount_t = torch.tensor([0.5, 0.0, 0.25])  # row 1 terminated: no bootstrap
    q_t_online = torch.tensor([[1.0, 3.0], [2.0, 0.0], [0.0, 1.0]])  # picks 1, 0, 1
    q_t_target = torch.tensor([[20.0, 10.0], [30.0, 40.0], [8.0, 4.0]])  # its own argmax would differ
    torch.testing.assert_close(
        double_q_target(r_t, discount_t, q_t_online, q_t_target), torch.tensor([1 + 5.0, 1.0, 2 + 1.0])
    )


def test_double_q_learning_td_error_and_gradient_only_through_q_tm1():
    q_tm1 = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    a_tm1 = torch.tensor([1, 0])
    q_t = torch.tensor([[0.0, 2.0], [5.0, 1.0]], requires_grad=True)
    td = double_q_learning(q_tm1, a_tm1, torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0]), q_t, q_t)
    torch.testing.assert_close(td, torch.tensor([1 + 0.5 * 2 - 2.0, 0.0 - 3.0]))
    td.sum().backward()
    torch.testing.assert_close(q_tm1.grad, torch.tensor([[0.0, -1.0], [-1.0, 0.0]]))
    assert q_t.grad is None


def test_apex_epsilons():
    assert apex_epsilons(1) == [0.4]
    eps = apex_epsilons(3, base=0.4, alpha=7.0)
    np.testing.assert_allclose(eps, [0.4, 0.4**4.5, 0.4**8])
    assert eps == sorted(eps, reverse=True)
    with pytest.raises(ValueError):
        apex_epsilons(0)


# ---------------------------------------------------------------- the algorithm


def test_make_algorithm_and_protocol():
    algo = make_algorithm("dqn", OBS_SPACE, ACT_SPACE, {"hidden_sizes": [16], "lr": 1e-3})
    assert isinstance(algo, Algorithm) and isinstance(algo, DQN)
    assert algo.config.hidden_sizes == (16,) and (algo.n_step, algo.gamma) == (3, 0.99)
    assert algo.transition_fields() == {
        "obs": ((4,), torch.float32),
        "action": ((), torch.int64),
        "reward": ((), torch.float32),
        "discount": ((), torch.float32),
        "next_obs": ((4,), torch.float32),
    }
    with pytest.raises(ValueError):
        make_algorithm("ppo", OBS_SPACE, ACT_SPACE)
    with pytest.raises(TypeError):
        make_algorithm("dqn", OBS_SPACE, gym.spaces.Box(-1, 1, (2,)))
    with pytest.raises(ValueError):
        DQNConfig(n_step=0)


def test_act_is_greedy_at_epsilon_zero_and_uniform_at_one():
    algo = make()
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    greedy = algo.online(torch.from_numpy(obs)).argmax(-1).numpy()
    actions = algo.act(obs, 0.0)
    assert actions.dtype == np.int64 and actions.shape == (64,)
    np.testing.assert_array_equal(actions, greedy)
    random_actions = algo.act(np.repeat(obs[:1], 3000, axis=0), np.ones(3000))
    assert set(np.bincount(random_actions, minlength=3) // 800) == {1}  # roughly 1000 each
    per_row = algo.act(obs[:2], np.array([0.0, 1.0]))
    assert per_row[0] == greedy[0]


def test_discrete_start_offset_is_respected():
    algo = DQN(OBS_SPACE, gym.spaces.Discrete(3, start=5), DQNConfig(hidden_sizes=(8,)))
    actions = algo.act(np.zeros((100, 4), np.float32), 1.0)
    assert actions.min() >= 5 and actions.max() <= 7
    sample = batch(8)
    sample.data["action"] = sample.data["action"] + 5
    priorities, _ = algo.update(sample)
    assert priorities.shape == (8,)


def test_initial_priorities_are_abs_td_with_online_net_plus_eps():
    algo = make(priority_eps=1e-3)
    data = batch(8).data
    with torch.no_grad():
        q_t = algo.online(data["next_obs"])
        td = double_q_learning(algo.online(data["obs"]), data["action"], data["reward"], data["discount"], q_t, q_t)
    torch.testing.assert_close(algo.initial_priorities(data), td.abs() + 1e-3)


def test_update_returns_priorities_and_named_metrics():
    algo = make()
    priorities, metrics = algo.update(batch(16))
    assert priorities.shape == (16,) and priorities.dtype == torch.float32 and not priorities.requires_grad
    assert torch.all(priorities > 0)
    assert set(metrics) == {"losses/td_loss", "losses/td_abs", "losses/q_values", "losses/grad_norm"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert algo.num_updates == 1


def test_target_network_hard_sync_every_period():
    algo = make(target_update_period=3)
    sample = batch()

    def same() -> bool:
        return all(torch.equal(a, b) for a, b in zip(algo.online.parameters(), algo.target.parameters()))

    assert same()
    algo.update(sample)
    algo.update(sample)
    assert not same()
    algo.update(sample)
    assert same()


def test_target_network_polyak_sync():
    algo = make(target_update_period=1, tau=0.25)
    before = [p.detach().clone() for p in algo.target.parameters()]
    algo.update(batch())
    for old, online, target in zip(before, algo.online.parameters(), algo.target.parameters()):
        torch.testing.assert_close(target, old + 0.25 * (online.detach() - old))


def test_state_dict_round_trip_restores_networks_optimizer_and_counter():
    algo = make(seed=0, target_update_period=2)
    for i in range(5):
        algo.update(batch(seed=i))
    state = algo.state_dict()
    assert all(isinstance(v, (torch.Tensor, int, float)) for v in state.values())
    assert all(v.device.type == "cpu" for v in state.values() if isinstance(v, torch.Tensor))
    assert state["num_updates"] == 5 and any(k.startswith("optimizer.") for k in state)

    fresh = make(seed=1)
    fresh.load_state_dict(state)
    assert fresh.num_updates == 5
    obs = batch(seed=9).data["obs"]
    with torch.no_grad():
        torch.testing.assert_close(fresh.online(obs), algo.online(obs), rtol=0, atol=0)
        torch.testing.assert_close(fresh.target(obs), algo.target(obs), rtol=0, atol=0)
    # Same optimizer state -> the next update is identical.
    p_a, m_a = algo.update(batch(seed=7))
    p_b, m_b = fresh.update(batch(seed=7))
    torch.testing.assert_close(p_a, p_b, rtol=0, atol=0)
    assert m_a == m_b
    with pytest.raises(KeyError):
        fresh.load_state_dict({**state, "bogus": 1})


def test_state_dict_is_a_snapshot():
    algo = make()
    state = algo.state_dict()
    weights = state["online.torso.0.weight"].clone()
    algo.update(batch())
    assert torch.equal(state["online.torso.0.weight"], weights)


def test_policy_state_dict_round_trip_to_an_actor_copy():
    learner = make(seed=0)
    for i in range(3):
        learner.update(batch(seed=i))
    policy = learner.policy_state_dict()
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in policy.values())
    assert all(not k.startswith("target") for k in policy)
    actor = make(seed=5)
    actor.load_policy_state_dict({k: v.numpy() for k, v in policy.items()})  # as decoded off the wire
    obs = np.random.default_rng(1).uniform(-1, 1, (32, 4)).astype(np.float32)
    np.testing.assert_array_equal(actor.act(obs, 0.0), learner.act(obs, 0.0))


def test_learning_smoke_td_errors_go_to_zero_on_a_fixed_batch():
    """Terminal transitions (discount 0) have target r exactly, so a few hundred updates fit them."""
    algo = make(lr=3e-3, target_update_period=50)
    sample = batch(32, seed=3, discount=0.0)
    _, first = algo.update(sample)
    for _ in range(400):
        priorities, metrics = algo.update(sample)
    assert metrics["losses/td_loss"] < 0.01 * first["losses/td_loss"]
    assert priorities.max().item() < 0.05
    with torch.no_grad():
        q = algo.online(sample.data["obs"]).gather(1, sample.data["action"][:, None]).squeeze(1)
    torch.testing.assert_close(q, sample.data["reward"], atol=0.05, rtol=0)


def test_learning_smoke_with_bootstrap_converges_to_fixed_point():
    """A self-loop: next_obs == obs, r = 1, discount 0.5 -> Q* = r / (1 - 0.5) = 2 for the best action."""
    algo = make(lr=3e-3, target_update_period=20)
    obs = torch.zeros(3, 4)
    sample = SimpleNamespace(
        weights=torch.ones(3),
        data={"obs": obs, "action": torch.arange(3), "reward": torch.ones(3),
              "discount": torch.full((3,), 0.5), "next_obs": obs},
    )
    for _ in range(600):
        priorities, _ = algo.update(sample)
    with torch.no_grad():
        torch.testing.assert_close(algo.online(obs[:1]), torch.full((1, 3), 2.0), atol=0.05, rtol=0)
    assert priorities.max().item() < 0.05


def test_is_weights_scale_the_gradient():
    sample = batch(8)
    zero = SimpleNamespace(weights=torch.zeros(8), data=sample.data)
    algo = make()
    before = [p.detach().clone() for p in algo.online.parameters()]
    _, metrics = algo.update(zero)
    assert metrics["losses/td_loss"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, algo.online.parameters()))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_update_and_state_round_trip():
    algo = make(device="cuda")
    cpu_sample = batch(16)
    priorities, _ = algo.update(cpu_sample)  # CPU batch is moved to the device
    assert priorities.device.type == "cuda"
    state = algo.state_dict()
    fresh = make(seed=3)
    fresh.load_state_dict(state)
    fresh.to("cuda")
    p_a, _ = algo.update(cpu_sample)
    p_b, _ = fresh.update(cpu_sample)
    torch.testing.assert_close(p_a, p_b)
    algo.to("cpu").update(cpu_sample)


def test_transition_fields_keep_the_observation_dtype():
    frames = gym.spaces.Box(0, 255, shape=(4, 4), dtype=np.uint8)
    algo = DQN(frames, ACT_SPACE, DQNConfig(hidden_sizes=(8,)))
    fields = algo.transition_fields()
    assert fields["obs"] == ((4, 4), torch.uint8) and fields["next_obs"] == ((4, 4), torch.uint8)
    actions = algo.act(np.zeros((3, 4, 4), np.uint8), 0.0)
    assert actions.shape == (3,)
