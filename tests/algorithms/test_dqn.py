"""Ape-X DQN: pure target/loss functions on hand-made tensors, branching actions, every space, state
round trips, learning smoke tests."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector.utils import batch_space
from torch import nn

from actorlearner.algorithms import AlgorithmError, AlgorithmSpec, make_spec
from actorlearner.algorithms.apex import apex_epsilons
from actorlearner.algorithms.dqn import (
    DQN,
    DQNConfig,
    DQNPolicy,
    DQNTrainer,
    double_q_learning,
    double_q_target,
    huber,
)
from actorlearner.networks import UnsupportedSpace, field_name, leaf_arrays
from actorlearner.networks.encoders import FlatEncoder, ImageEncoder, OneHotEncoder

OBS_SPACE = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
ACT_SPACE = spaces.Discrete(3)
NEG_INF = float("-inf")


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make(seed: int = 0, device: str = "cpu", **kw) -> DQNTrainer:
    return DQN(OBS_SPACE, ACT_SPACE, DQNConfig(hidden_sizes=(32, 32), **kw)).make_trainer(device=device, seed=seed)


def make_policy(seed: int = 0, **kw) -> DQNPolicy:
    return DQN(OBS_SPACE, ACT_SPACE, DQNConfig(hidden_sizes=(32, 32), **kw)).make_policy(seed=seed)


def q_values(algo: DQNPolicy | DQNTrainer, obs: torch.Tensor, net: str = "online") -> torch.Tensor:
    """Q values [B, N] of the single Discrete branch for a plain Box observation (leaf key "")."""
    with torch.no_grad():
        q = getattr(algo, net)({"": obs.to(algo.device)})
    assert q.shape == (len(obs), 1, ACT_SPACE.n)
    return q[:, 0]


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


def random_sample(spec: DQN, obs_space: gym.Space, act_space: gym.Space, size: int, seed: int = 0,
                  discount: float = 0.0) -> SimpleNamespace:
    """A replay sample with the algorithm's fields, drawn from the spaces as a vector env batches them."""
    batched_obs, batched_act = batch_space(obs_space, size), batch_space(act_space, size)
    batched_obs.seed(seed)
    batched_act.seed(seed + 1)
    data = {}
    for prefix in ("obs", "next_obs"):
        for key, array in leaf_arrays(obs_space, batched_obs.sample()).items():
            data[field_name(prefix, key)] = torch.as_tensor(array)
    data["action"] = torch.as_tensor(np.asarray(batched_act.sample()), dtype=torch.int64)
    data["reward"] = torch.randn(size, generator=torch.Generator().manual_seed(seed))
    data["discount"] = torch.full((size,), discount)
    assert set(data) == set(spec.transition_fields())
    for name, (shape, dtype) in spec.transition_fields().items():
        assert data[name].shape == (size, *shape) and data[name].dtype == dtype, name
    return SimpleNamespace(weights=torch.ones(size), data=data)


# ---------------------------------------------------------------- pure functions


def test_huber_is_quadratic_inside_delta_and_linear_outside():
    x = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 2.0])
    torch.testing.assert_close(huber(x, 1.0), torch.tensor([2.5, 0.5, 0.125, 0.0, 0.125, 1.5]))
    torch.testing.assert_close(huber(torch.tensor([1.0, 3.0]), 2.0), torch.tensor([0.5, 4.0]))
    x = torch.tensor([-5.0, 0.25, 5.0], requires_grad=True)
    huber(x, 1.0).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([-1.0, 0.25, 1.0]))


def test_double_q_target_selects_with_online_and_evaluates_with_target():
    r_t = torch.tensor([1.0, 1.0, 2.0])
    discount_t = torch.tensor([0.5, 0.0, 0.25])  # row 1 terminated: no bootstrap
    q_t_online = torch.tensor([[1.0, 3.0], [2.0, 0.0], [0.0, 1.0]])[:, None]  # [B, 1, N]: picks 1, 0, 1
    q_t_target = torch.tensor([[20.0, 10.0], [30.0, 40.0], [8.0, 4.0]])[:, None]  # its own argmax would differ
    target = double_q_target(r_t, discount_t, q_t_online, q_t_target)
    assert target.shape == (3,)
    torch.testing.assert_close(target, torch.tensor([1 + 5.0, 1.0, 2 + 1.0]))


def test_double_q_target_averages_branches_and_never_picks_padding():
    """D=2 branches of sizes 3 and 2: branch 1's third entry is -inf padding in every network."""
    r_t = torch.tensor([1.0, 0.0, 2.0])
    discount_t = torch.tensor([0.5, 0.25, 0.0])  # row 2 terminated
    q_t_online = torch.tensor([
        [[1.0, 3.0, 2.0], [5.0, 4.0, NEG_INF]],    # picks 1 and 0
        [[0.0, 0.0, 9.0], [-1.0, 2.0, NEG_INF]],   # picks 2 and 1
        [[-5.0, -6.0, -7.0], [-9.0, -8.0, NEG_INF]],  # all negative: -inf padding still loses; picks 0 and 1
    ])
    q_t_target = torch.tensor([
        [[10.0, 20.0, 30.0], [6.0, 8.0, NEG_INF]],  # target's own argmax (2, 1) would give (30, 8)
        [[1.0, 2.0, 3.0], [4.0, 5.0, NEG_INF]],
        [[100.0, 0.0, 0.0], [0.0, 100.0, NEG_INF]],
    ])
    target = double_q_target(r_t, discount_t, q_t_online, q_t_target)
    assert target.shape == (3,) and torch.isfinite(target).all()
    torch.testing.assert_close(target, torch.tensor([
        1 + 0.5 * (20.0 + 6.0) / 2,
        0 + 0.25 * (3.0 + 5.0) / 2,
        2.0,
    ]))


def test_double_q_learning_td_error_and_gradient_only_through_q_tm1():
    q_tm1 = torch.tensor([[1.0, 2.0], [3.0, 4.0]])[:, None].requires_grad_()
    a_tm1 = torch.tensor([[1], [0]])
    q_t = torch.tensor([[0.0, 2.0], [5.0, 1.0]])[:, None].requires_grad_()
    td = double_q_learning(q_tm1, a_tm1, torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0]), q_t, q_t)
    torch.testing.assert_close(td, torch.tensor([[1 + 0.5 * 2 - 2.0], [0.0 - 3.0]]))
    td.sum().backward()
    torch.testing.assert_close(q_tm1.grad, torch.tensor([[[0.0, -1.0]], [[-1.0, 0.0]]]))
    assert q_t.grad is None


def test_double_q_learning_per_branch_td_errors_with_padding():
    """TD errors [B, D]: one shared target per row minus each branch's Q of its own action."""
    q_tm1 = torch.tensor([
        [[1.0, 2.0, 3.0], [4.0, 5.0, NEG_INF]],
        [[0.5, 0.0, 0.0], [-1.0, 7.0, NEG_INF]],
    ], requires_grad=True)
    a_tm1 = torch.tensor([[2, 1], [0, 0]])
    q_t_online = torch.tensor([[[1.0, 3.0, 2.0], [5.0, 4.0, NEG_INF]], [[0.0, 0.0, 9.0], [-1.0, 2.0, NEG_INF]]],
                              requires_grad=True)
    q_t_target = torch.tensor([[[10.0, 20.0, 30.0], [6.0, 8.0, NEG_INF]], [[1.0, 2.0, 3.0], [4.0, 5.0, NEG_INF]]],
                              requires_grad=True)
    r_t, discount_t = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.25])
    td = double_q_learning(q_tm1, a_tm1, r_t, discount_t, q_t_online, q_t_target)
    assert td.shape == (2, 2)
    target = torch.tensor([1 + 0.5 * 13.0, 0.25 * 4.0])  # as in the double_q_target test above
    torch.testing.assert_close(td, target[:, None] - torch.tensor([[3.0, 5.0], [0.5, -1.0]]))
    td.sum().backward()
    expected_grad = torch.zeros(2, 2, 3)
    expected_grad[0, 0, 2] = expected_grad[0, 1, 1] = expected_grad[1, 0, 0] = expected_grad[1, 1, 0] = -1.0
    torch.testing.assert_close(q_tm1.grad, expected_grad)  # only the taken entries, padding untouched
    assert q_t_online.grad is None and q_t_target.grad is None


def test_apex_epsilons():
    assert apex_epsilons(1) == [0.4]
    eps = apex_epsilons(3, base=0.4, alpha=7.0)
    np.testing.assert_allclose(eps, [0.4, 0.4**4.5, 0.4**8])
    assert eps == sorted(eps, reverse=True)
    with pytest.raises(ValueError):
        apex_epsilons(0)


def test_exploration_is_the_configured_apex_epsilon_of_each_actor():
    algo = DQN(OBS_SPACE, ACT_SPACE, DQNConfig(hidden_sizes=(8,), epsilon_base=0.5, epsilon_alpha=2.0)).make_policy()
    assert [algo.exploration(i, 3) for i in range(3)] == apex_epsilons(3, base=0.5, alpha=2.0)
    assert algo.exploration(0, 1) == 0.5
    assert algo.exploration(4, 3) == algo.exploration(1, 3)  # indices past num_actors wrap around
    assert algo.exploration(0, 0) == 0.5  # no actors expected yet: treated as one
    assert make_policy().exploration(0, 2) == 0.4  # defaults: Ape-X's base 0.4


# ---------------------------------------------------------------- the algorithm


def test_make_algorithm_and_protocol():
    algo = make_spec("dqn", OBS_SPACE, ACT_SPACE, {"hidden_sizes": [16], "lr": 1e-3})
    assert isinstance(algo, AlgorithmSpec) and isinstance(algo, DQN)
    assert algo.config.hidden_sizes == (16,) and (algo.config.n_step, algo.config.gamma) == (3, 0.99)
    assert algo.make_trainer().optimizer.param_groups[0]["lr"] == 1e-3
    assert algo.transition_fields() == {
        "obs": ((4,), torch.float32),
        "action": ((), torch.int64),
        "reward": ((), torch.float32),
        "discount": ((), torch.float32),
        "next_obs": ((4,), torch.float32),
    }
    with pytest.raises(AlgorithmError, match="ppo"):
        make_spec("ppo", OBS_SPACE, ACT_SPACE)
    with pytest.raises(UnsupportedSpace, match="Box"):
        make_spec("dqn", OBS_SPACE, spaces.Box(-1, 1, (2,)))
    with pytest.raises(ValueError, match="n_step"):
        DQNConfig(n_step=0)
    with pytest.raises(AlgorithmError, match="n_step"):
        make_spec("dqn", OBS_SPACE, ACT_SPACE, {"n_step": 0})


def test_seed_fixes_the_initial_weights():
    a = make_spec("dqn", OBS_SPACE, ACT_SPACE).make_trainer(seed=7)
    b = make_spec("dqn", OBS_SPACE, ACT_SPACE).make_policy(seed=7)
    c = make_spec("dqn", OBS_SPACE, ACT_SPACE).make_trainer(seed=8)
    pa, pb, pc = (algo.policy_state_dict() for algo in (a, b, c))
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert not all(torch.equal(pa[k], pc[k]) for k in pa)
    assert all(torch.equal(a.target.state_dict()[k], a.online.state_dict()[k]) for k in pa)


def test_building_an_algorithm_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    spec = make_spec("dqn", OBS_SPACE, ACT_SPACE)
    spec.make_trainer(seed=7)
    spec.make_policy(seed=7)
    assert torch.equal(torch.rand(3), expected_draw)


def test_act_is_greedy_at_epsilon_zero_and_uniform_at_one():
    algo = make_policy()
    obs = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    greedy = q_values(algo, torch.from_numpy(obs)).argmax(-1).numpy()
    actions = algo.act(obs, 0.0)
    assert actions.dtype == np.int64 and actions.shape == (64,)
    np.testing.assert_array_equal(actions, greedy)
    random_actions = algo.act(np.repeat(obs[:1], 3000, axis=0), np.ones(3000))
    assert set(np.bincount(random_actions, minlength=3) // 800) == {1}  # roughly 1000 each
    per_row = algo.act(obs[:2], np.array([0.0, 1.0]))
    assert per_row[0] == greedy[0]


def test_discrete_start_offset_is_respected():
    spec = DQN(OBS_SPACE, spaces.Discrete(3, start=5), DQNConfig(hidden_sizes=(8,)))
    algo, trainer = spec.make_policy(), spec.make_trainer()
    actions = algo.act(np.zeros((100, 4), np.float32), 1.0)
    assert actions.min() >= 5 and actions.max() <= 7
    assert set(actions.tolist()) == {5, 6, 7}
    obs = np.random.default_rng(0).uniform(-1, 1, (16, 4)).astype(np.float32)
    np.testing.assert_array_equal(algo.act(obs, 0.0), q_values(algo, torch.from_numpy(obs)).argmax(-1).numpy() + 5)
    sample = batch(8)
    sample.data["action"] = sample.data["action"] + 5
    before = algo.initial_priorities(sample.data)
    with torch.no_grad():
        q_t = q_values(algo, sample.data["next_obs"])[:, None]
        td = double_q_learning(q_values(algo, sample.data["obs"])[:, None], sample.data["action"][:, None] - 5,
                               sample.data["reward"], sample.data["discount"], q_t, q_t)
    torch.testing.assert_close(before, td.abs()[:, 0] + algo.config.priority_eps)  # stored 5..7 mean indices 0..2
    priorities, _ = trainer.update(sample)
    assert priorities.shape == (8,) and torch.isfinite(priorities).all()


def test_initial_priorities_are_abs_td_with_online_net_plus_eps():
    algo = make_policy(priority_eps=1e-3)
    data = batch(8).data
    with torch.no_grad():
        q_t = q_values(algo, data["next_obs"])[:, None]
        td = double_q_learning(q_values(algo, data["obs"])[:, None], data["action"][:, None], data["reward"],
                               data["discount"], q_t, q_t)
    torch.testing.assert_close(algo.initial_priorities(data), td.abs().mean(-1) + 1e-3)


def test_update_returns_priorities_and_named_metrics():
    algo = make()
    priorities, metrics = algo.update(batch(16))
    assert priorities.shape == (16,) and priorities.dtype == torch.float32 and not priorities.requires_grad
    assert torch.all(priorities > 0)
    assert set(metrics) == {"losses/td_loss", "losses/td_abs", "losses/q_values", "losses/grad_norm"}
    assert all(isinstance(v, torch.Tensor) and v.shape == () for v in metrics.values())  # read by the learner every N steps
    assert algo.num_updates == 1


def test_dueling_config_reaches_the_head():
    """Dueling: every branch's Q values average to the shared state value; without it there is no value."""
    algo = make(dueling=True)
    obs = batch(8).data["obs"]
    with torch.no_grad():
        features = algo.online.encoder({"": obs})
        value = algo.online.head.value(features)
        q = algo.online({"": obs})
    torch.testing.assert_close(q.mean(-1), value.expand(8, 1))
    assert make(dueling=False).online.head.value is None


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
    torch.testing.assert_close(q_values(fresh, obs), q_values(algo, obs), rtol=0, atol=0)
    torch.testing.assert_close(q_values(fresh, obs, "target"), q_values(algo, obs, "target"), rtol=0, atol=0)
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
    name = "online.encoder.mlp.0.weight"
    weights = state[name].clone()
    algo.update(batch())
    assert not torch.equal(algo.online.state_dict()[name.removeprefix("online.")], weights)
    assert torch.equal(state[name], weights)


def test_policy_state_dict_round_trip_to_an_actor_copy():
    learner = make(seed=0)
    for i in range(3):
        learner.update(batch(seed=i))
    policy = learner.policy_state_dict()
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in policy.values())
    assert all(not k.startswith("target") for k in policy)
    actor = make_policy(seed=5)
    actor.load_policy_state_dict({k: v.numpy() for k, v in policy.items()})  # as decoded off the wire
    obs = np.random.default_rng(1).uniform(-1, 1, (32, 4)).astype(np.float32)
    np.testing.assert_array_equal(actor.act(obs, 0.0), q_values(learner, torch.from_numpy(obs)).argmax(-1).numpy())


def test_learning_smoke_td_errors_go_to_zero_on_a_fixed_batch():
    """Terminal transitions (discount 0) have target r exactly, so a few hundred updates fit them."""
    algo = make(lr=3e-3, target_update_period=50)
    sample = batch(32, seed=3, discount=0.0)
    _, first = algo.update(sample)
    for _ in range(400):
        priorities, metrics = algo.update(sample)
    assert metrics["losses/td_loss"] < 0.01 * first["losses/td_loss"]
    assert priorities.max().item() < 0.05
    q = q_values(algo, sample.data["obs"]).gather(1, sample.data["action"][:, None]).squeeze(1)
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
    torch.testing.assert_close(q_values(algo, obs[:1]), torch.full((1, 3), 2.0), atol=0.05, rtol=0)
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
    fresh = make(seed=3, device="cuda")
    fresh.load_state_dict(state)  # CPU tensors restored onto the device
    p_a, _ = algo.update(cpu_sample)
    p_b, _ = fresh.update(cpu_sample)
    torch.testing.assert_close(p_a, p_b)


def test_transition_fields_keep_the_observation_dtype():
    frames = spaces.Box(0, 255, shape=(4, 4), dtype=np.uint8)
    algo = DQN(frames, ACT_SPACE, DQNConfig(hidden_sizes=(8,)))
    fields = algo.transition_fields()
    assert fields["obs"] == ((4, 4), torch.uint8) and fields["next_obs"] == ((4, 4), torch.uint8)
    actions = algo.make_policy().act(np.zeros((3, 4, 4), np.uint8), 0.0)
    assert actions.shape == (3,)


# ---------------------------------------------------------------- images


def test_image_observations_use_the_conv_torso_and_stay_uint8():
    frames = spaces.Box(0, 255, shape=(10, 10, 4), dtype=np.uint8)
    spec = DQN(frames, ACT_SPACE, DQNConfig(hidden_sizes=(16,)))
    algo, policy = spec.make_trainer(), spec.make_policy()
    (encoder,) = algo.online.encoder.leaf_encoders
    assert isinstance(encoder, ImageEncoder) and encoder.channels_last
    convs = [m for m in encoder.torso if isinstance(m, nn.Conv2d)]
    assert len(convs) == 1 and convs[0].in_channels == 4  # the small (MinAtar) torso below 36x36
    fields = spec.transition_fields()
    assert fields["obs"] == ((10, 10, 4), torch.uint8) and fields["next_obs"] == ((10, 10, 4), torch.uint8)
    obs = np.random.default_rng(0).integers(0, 256, (5, 10, 10, 4), dtype=np.uint8)
    actions = policy.act(obs, 0.0)
    assert actions.shape == (5,) and all(ACT_SPACE.contains(a) for a in actions)
    sample = random_sample(spec, frames, ACT_SPACE, 8)
    priorities, metrics = algo.update(sample)
    assert priorities.shape == (8,) and torch.isfinite(metrics["losses/td_loss"])
    assert convs[0].weight.grad is not None and convs[0].weight.grad.abs().sum() > 0  # the torso learns


# ---------------------------------------------------------------- branching actions


def test_multidiscrete_actions_with_start_stay_within_the_space():
    action_space = spaces.MultiDiscrete([3, 2], start=[-1, 0])
    spec = DQN(OBS_SPACE, action_space, DQNConfig(hidden_sizes=(16,)))
    algo = spec.make_policy()
    assert spec.transition_fields()["action"] == ((2,), torch.int64)
    obs = np.random.default_rng(0).uniform(-1, 1, (600, 4)).astype(np.float32)
    for epsilon in (0.0, 1.0):
        actions = algo.act(obs, epsilon)
        assert actions.shape == (600, 2) and actions.dtype == action_space.dtype
        assert all(action_space.contains(row) for row in actions), actions[:5]
    random_actions = algo.act(obs, 1.0)
    assert {tuple(row) for row in random_actions.tolist()} == {(a, b) for a in (-1, 0, 1) for b in (0, 1)}
    with torch.no_grad():
        q = algo.online({"": torch.from_numpy(obs)})
    assert q.shape == (600, 2, 3) and torch.isinf(q[:, 1, 2]).all()  # branch 1 has 2 actions: one padded slot
    np.testing.assert_array_equal(algo.act(obs, 0.0), q.argmax(-1).numpy() + np.array([-1, 0]))


DICT_OBS = spaces.Dict({
    "image": spaces.Box(0, 255, (8, 8, 1), np.uint8),
    "position": spaces.Discrete(5, start=1),
    "flags": spaces.MultiBinary(3),
})
BRANCHED = spaces.MultiDiscrete([3, 2], start=[-1, 0])


def test_dict_observation_fields_and_encoders():
    spec = DQN(DICT_OBS, BRANCHED, DQNConfig(hidden_sizes=(16,)))
    algo = spec.make_policy()
    assert spec.transition_fields() == {
        "obs/image": ((8, 8, 1), torch.uint8),
        "obs/position": ((), torch.int64),
        "obs/flags": ((3,), torch.int8),
        "action": ((2,), torch.int64),
        "reward": ((), torch.float32),
        "discount": ((), torch.float32),
        "next_obs/image": ((8, 8, 1), torch.uint8),
        "next_obs/position": ((), torch.int64),
        "next_obs/flags": ((3,), torch.int8),
    }
    assert list(DICT_OBS.spaces) == ["flags", "image", "position"]  # gymnasium sorts a plain dict's keys
    kinds = [type(e) for e in algo.online.encoder.leaf_encoders]
    assert kinds == [FlatEncoder, ImageEncoder, OneHotEncoder]  # leaves in the space's own order


def test_learning_smoke_branched_actions_and_dict_observations():
    """Terminal transitions: every branch's Q of its taken action is fitted to the reward."""
    spec = DQN(DICT_OBS, BRANCHED, DQNConfig(hidden_sizes=(32,), lr=3e-3, target_update_period=50))
    algo = spec.make_trainer(seed=1)
    sample = random_sample(spec, DICT_OBS, BRANCHED, 16, seed=3, discount=0.0)
    assert sample.data["action"][:, 0].min() == -1  # stored action values, not branch indices
    _, first = algo.update(sample)
    for _ in range(150):
        priorities, metrics = algo.update(sample)
    assert metrics["losses/td_loss"] < 0.01 * first["losses/td_loss"]
    assert priorities.max().item() < 0.05
    obs = {key.removeprefix("obs/"): value for key, value in sample.data.items() if key.startswith("obs/")}
    with torch.no_grad():
        q = algo.online(obs)
    indices = sample.data["action"] - torch.tensor([-1, 0])
    q_taken = q.gather(-1, indices[..., None]).squeeze(-1)  # [B, 2]
    torch.testing.assert_close(q_taken, sample.data["reward"][:, None].expand(16, 2), atol=0.05, rtol=0)


# ---------------------------------------------------------------- every space


OBSERVATION_SPACES = {
    "box vector": spaces.Box(-1, 1, (5,), np.float32),
    "box image": spaces.Box(0, 255, (3, 12, 12), np.uint8),
    "box int scalar": spaces.Box(-3, 3, (), np.int32),
    "discrete with start": spaces.Discrete(4, start=-2),
    "multidiscrete 2d": spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[0, -1], [1, 0]]),
    "multibinary": spaces.MultiBinary([2, 3]),
    "nested dict/tuple": spaces.Dict({
        "pair": spaces.Tuple([spaces.Discrete(3), spaces.Box(0, 1, (2,), np.float32)]),
        "deep": spaces.Dict({"bits": spaces.MultiBinary(4), "frame": spaces.Box(0, 255, (6, 6), np.uint8)}),
    }),
}


@pytest.mark.parametrize("space", OBSERVATION_SPACES.values(), ids=OBSERVATION_SPACES.keys())
def test_every_supported_observation_space_builds_acts_and_updates(space):
    spec = DQN(space, ACT_SPACE, DQNConfig(hidden_sizes=(8,)))
    batched = batch_space(space, 4)
    batched.seed(0)
    actions = spec.make_policy().act(batched.sample(), 0.5)
    assert actions.shape == (4,) and all(ACT_SPACE.contains(a) for a in actions)
    priorities, metrics = spec.make_trainer().update(random_sample(spec, space, ACT_SPACE, 6))
    assert priorities.shape == (6,) and torch.isfinite(priorities).all() and torch.isfinite(metrics["losses/td_loss"])


UNSUPPORTED_OBSERVATIONS = {
    "Text": spaces.Text(5),
    "Sequence": spaces.Sequence(spaces.Discrete(2)),
    "Graph": spaces.Graph(spaces.Box(0, 1, (2,)), None),
    "OneOf": spaces.OneOf([spaces.Discrete(2), spaces.Discrete(3)]),
}


@pytest.mark.parametrize("name, space", [*UNSUPPORTED_OBSERVATIONS.items(),
                                         ("Text", spaces.Dict({"ok": spaces.Discrete(2), "bad": spaces.Text(3)}))],
                         ids=[*UNSUPPORTED_OBSERVATIONS, "Text in a Dict"])
def test_unsupported_observation_spaces_raise_naming_them(name, space):
    with pytest.raises(UnsupportedSpace, match=rf"observation space .*{name}") as info:
        DQN(space, ACT_SPACE, DQNConfig(hidden_sizes=(8,)))
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


ACTION_SPACES = {
    "discrete": spaces.Discrete(4, start=2),
    "multidiscrete": spaces.MultiDiscrete([[2, 3], [4, 1]]),
    "multibinary": spaces.MultiBinary(3),
}


@pytest.mark.parametrize("space", ACTION_SPACES.values(), ids=ACTION_SPACES.keys())
def test_discrete_action_spaces_build_and_act_within_the_space(space):
    spec = DQN(OBS_SPACE, space, DQNConfig(hidden_sizes=(8,)))
    assert spec.transition_fields()["action"] == (space.shape, torch.int64)
    obs = np.random.default_rng(0).uniform(-1, 1, (50, 4)).astype(np.float32)
    for epsilon in (0.0, 1.0):
        actions = spec.make_policy().act(obs, epsilon)
        assert actions.shape == (50, *space.shape)
        assert all(space.contains(a) for a in actions)
    priorities, _ = spec.make_trainer().update(random_sample(spec, OBS_SPACE, space, 6))
    assert priorities.shape == (6,) and torch.isfinite(priorities).all()


@pytest.mark.parametrize("name, space", [
    ("Box", spaces.Box(-1, 1, (2,), np.float32)),
    ("Dict", spaces.Dict({"a": spaces.Discrete(2)})),
    ("Tuple", spaces.Tuple([spaces.Discrete(2), spaces.Discrete(3)])),
], ids=["Box", "Dict", "Tuple"])
def test_unsupported_action_spaces_raise_naming_them(name, space):
    with pytest.raises(UnsupportedSpace, match=rf"action space {name}"):
        DQN(OBS_SPACE, space, DQNConfig(hidden_sizes=(8,)))
