"""R2D2 against reference computations: stored state, burn-in, masks, value rescaling, sequence priorities."""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import numpy as np
import torch
from test_sequence_math import reference_targets

from actorlearner.algorithms import make_spec
from actorlearner.algorithms.sequence_math import inverse_value_rescale, value_rescale

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = gym.spaces.Discrete(3)
LENGTH, BURN_IN, N_STEP = 6, 2, 3


def make_r2d2(**kw):
    config = {"sequence_length": LENGTH, "overlap": 3, "burn_in": BURN_IN, "n_step": N_STEP, "core_size": 8,
              "hidden_sizes": (8,), "target_update_period": 1000, **kw}
    return make_spec("r2d2", OBS, ACTIONS, config)


def make(seed: int = 0, **kw):
    return make_r2d2(**kw).make_trainer(seed=seed)


def sample(algo, seed: int = 0) -> SimpleNamespace:
    """Four sequences: full mid-episode, one starting its episode, one terminated at step 3, one truncated."""
    g = torch.Generator().manual_seed(seed)
    batch = 4
    mask = torch.ones(batch, LENGTH, dtype=torch.bool)
    mask[2, 4:] = False
    mask[3, 5:] = False
    discount = torch.full((batch, LENGTH), 0.99) * mask
    discount[2, 3] = 0.0
    data = {"obs": torch.rand(batch, LENGTH + 1, 3, generator=g) * 2 - 1,
            "action": torch.randint(0, 3, (batch, LENGTH), generator=g) * mask,
            "reward": torch.randn(batch, LENGTH, generator=g) * mask, "discount": discount, "mask": mask,
            "first": torch.tensor([False, True, False, False]),
            "state/h": torch.randn(batch, 8, generator=g), "state/c": torch.randn(batch, 8, generator=g)}
    return SimpleNamespace(weights=torch.tensor([1.0, 0.5, 0.8, 1.0]), data=data)


def reference_priorities(algo, s) -> torch.Tensor:
    """One sequence at a time, step by step from its stored state, in float64 Python arithmetic."""
    out = []
    for b in range(len(s.data["mask"])):
        state = {name: s.data[f"state/{name}"][b:b + 1] for name in ("h", "c")}
        obs = {"": s.data["obs"][b:b + 1]}  # the one leaf of a Box observation
        with torch.no_grad():
            q_online, _ = algo.online(obs, state)
            q_target, _ = algo.target(obs, state)
        q_online, q_target = q_online[0, :, 0].double(), q_target[0, :, 0].double()  # [T + 1, N], one branch
        values = [float(q_target[t, q_online[t].argmax()]) for t in range(LENGTH + 1)]
        mask = s.data["mask"][b].tolist()
        raw = reference_targets(s.data["reward"][b].double().tolist(), s.data["discount"][b].double().tolist(),
                                mask, inverse_value_rescale(torch.tensor(values, dtype=torch.float64)).tolist(),
                                N_STEP)
        first = bool(s.data["first"][b])
        tds = [abs(float(value_rescale(torch.tensor(raw[t], dtype=torch.float64)))
                   - float(q_online[t, s.data["action"][b, t]]))
               for t in range(LENGTH) if mask[t] and (t >= BURN_IN or first)]
        out.append(0.9 * max(tds) + 0.1 * sum(tds) / len(tds))
    return torch.tensor(out)


def test_sequence_priorities_match_a_step_by_step_reference():
    algo = make()
    s = sample(algo)
    want = reference_priorities(algo, s)
    got, metrics = algo.update(s)
    torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-5)
    assert np.isfinite(list(metrics.values())).all()


def test_burn_in_passes_no_gradient_except_where_the_stored_state_is_exact():
    algo = make()
    s = sample(algo)
    s.data["obs"].requires_grad_(True)
    algo.update(s)
    grad = s.data["obs"].grad.abs().sum(dim=-1)  # [B, T + 1]
    assert (grad[[0, 2, 3], :BURN_IN] == 0).all()  # mid-episode sequences: the burn-in only warms the state
    assert (grad[1, :BURN_IN] > 0).all()  # a sequence starting its episode learns from its first steps
    assert (grad[:, BURN_IN:LENGTH - 1].sum(dim=1) > 0).all()


def test_the_stored_state_is_the_one_each_sequence_was_acted_from():
    algo = make_r2d2().make_policy()
    assembler = algo.spec.make_assembler(2, algo)
    rng = np.random.default_rng(0)
    obs = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
    states, items = [], []
    for step in range(LENGTH + 2):
        states.append({k: v.copy() for k, v in algo.memory.current(2).items()})
        actions = algo.act(obs, 0.5)
        next_obs = rng.uniform(-1, 1, (2, 3)).astype(np.float32)
        done = np.array([step == 1, False])  # env 0's first episode ends after 2 steps
        out = assembler.push(obs, actions, np.zeros(2, np.float32), done, np.zeros(2, bool), next_obs)
        if out is not None:
            items.append(out)
        algo.reset_memory(np.array([step == 2, False]))  # the autoreset step of env 0, as the actor does
        obs = next_obs
    env1_full = next(item for item in items if item["mask"].all())
    np.testing.assert_array_equal(env1_full["state/h"][0], states[0]["h"][1])  # env 1's sequence from step 0
    assert not states[0]["h"].any() and states[3]["h"][0].sum() == 0  # env 0 began its second episode from zeros


def test_state_round_trip_continues_bit_exactly():
    algo = make()
    s = sample(algo)
    for _ in range(2):
        algo.update(s)
    resumed = make(seed=9)
    resumed.load_state_dict(algo.state_dict())
    a, _ = algo.update(s)
    b, _ = resumed.update(s)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert set(resumed.policy_state_dict()) == {k for k in algo.policy_state_dict()}


def test_dict_observations_with_an_image_and_branched_actions_run_end_to_end():
    """Sequences of a Dict observation (uint8 camera through the conv torso, a vector) with MultiDiscrete actions."""
    space = gym.spaces.Dict({"camera": gym.spaces.Box(0, 255, (12, 12, 3), np.uint8),
                             "state": gym.spaces.Box(-1, 1, (2,), np.float32)})
    actions = gym.spaces.MultiDiscrete([3, 2])
    spec = make_spec("r2d2", space, actions, {"sequence_length": 4, "overlap": 2, "burn_in": 1, "core_size": 8,
                                              "hidden_sizes": (8,)})
    algo, trainer = spec.make_policy(), spec.make_trainer()
    assert spec.transition_fields()["obs/camera"] == ((5, 12, 12, 3), torch.uint8)
    assembler, rng, items = spec.make_assembler(2, algo), np.random.default_rng(0), []
    obs = {"camera": rng.integers(0, 256, (2, 12, 12, 3), np.uint8), "state": np.zeros((2, 2), np.float32)}
    for _ in range(9):
        act = algo.act(obs, 0.5)
        assert all(actions.contains(a) for a in act)
        next_obs = {"camera": rng.integers(0, 256, (2, 12, 12, 3), np.uint8), "state": rng.uniform(-1, 1, (2, 2))
                    .astype(np.float32)}
        out = assembler.push(obs, act, np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), next_obs)
        items += [out] if out is not None else []
        obs = next_obs
    data = {k: torch.as_tensor(np.concatenate([item[k] for item in items])) for k in items[0]}
    priorities, metrics = trainer.update(SimpleNamespace(weights=torch.ones(len(data["mask"])), data=data))
    assert priorities.shape == (len(data["mask"]),) and torch.isfinite(priorities).all()
    assert np.isfinite(list(metrics.values())).all()


def test_a_gru_core_keeps_one_state_and_learns_on_sequences():
    algo = make(core="gru")
    assert {name for name in algo.spec.transition_fields() if name.startswith("state/")} == {"state/h"}
    s = sample(algo)
    del s.data["state/c"]
    first, _ = algo.update(s)
    for _ in range(200):
        last, _ = algo.update(s)
    assert last.mean() < first.mean() / 2
    policy = algo.spec.make_policy()
    policy.load_policy_state_dict(algo.policy_state_dict())
    assert policy.act(np.zeros((3, 3), np.float32), 0.0).shape == (3,)
