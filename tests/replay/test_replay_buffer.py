"""PrioritizedReplay: storage, proportional sampling, IS weights, staleness, validation, state."""


import numpy as np
import pytest
import torch

from actorlearner.replay import make_replay
from replay_stats import chi_square_passes

FIELDS = {
    "obs": ((4,), torch.float32),
    "action": ((), torch.int64),
    "reward": ((), torch.float32),
    "frame": ((2, 3), torch.uint8),
    "done": ((), torch.bool),
}


def batch(start: int, n: int) -> dict[str, torch.Tensor]:
    """Items whose every field encodes its insertion number, to check what comes back."""
    ids = torch.arange(start, start + n)
    return {
        "obs": ids[:, None].float().repeat(1, 4),
        "action": ids,
        "reward": ids.float() / 2,
        "frame": (ids % 256).to(torch.uint8)[:, None, None].repeat(1, 2, 3),
        "done": ids % 2 == 0,
    }


def assert_consistent(sample) -> None:
    ids = sample.indices.cpu()
    data = {k: v.cpu() for k, v in sample.data.items()}
    assert torch.equal(data["action"], ids)
    assert torch.equal(data["obs"], ids[:, None].float().repeat(1, 4))
    assert torch.equal(data["reward"], ids.float() / 2)
    assert torch.equal(data["frame"], (ids % 256).to(torch.uint8)[:, None, None].repeat(1, 2, 3))
    assert torch.equal(data["done"], ids % 2 == 0)


def test_add_returns_keys_and_stores_fields(replay_path):
    buf = make_replay(100, FIELDS, **replay_path)
    keys = buf.add(batch(0, 30))
    assert keys.cpu().tolist() == list(range(30)) and len(buf) == 30 and buf.inserted == 30
    sample = buf.sample(16)
    assert sample.weights.dtype == torch.float32 and sample.weights.shape == (16,)
    assert all(v.device.type == torch.device(replay_path["device"]).type for v in sample.data.values())
    assert_consistent(sample)


def test_numpy_input_is_accepted(replay_path):
    buf = make_replay(10, FIELDS, **replay_path)
    buf.add({k: v.numpy() for k, v in batch(0, 5).items()}, priorities=np.ones(5))
    assert_consistent(buf.sample(5))


def test_wraparound_keeps_newest_and_batches_larger_than_capacity(replay_path):
    buf = make_replay(10, FIELDS, **replay_path)
    buf.add(batch(0, 7))
    buf.add(batch(7, 8))  # wraps: items 5..14 remain
    assert len(buf) == 10
    seen = set(torch.cat([buf.sample(10).indices for _ in range(30)]).cpu().tolist())
    assert seen <= set(range(5, 15)) and len(seen) == 10
    buf.add(batch(15, 25))  # larger than capacity: the newest 10 (30..39) remain
    assert buf.inserted == 40
    sample = buf.sample(10)
    assert set(sample.indices.cpu().tolist()) <= set(range(30, 40))
    assert_consistent(sample)


def test_sampling_frequencies_follow_priority_to_the_alpha(replay_path):
    alpha = 0.6
    buf = make_replay(50, FIELDS, alpha=alpha, eps=0.0, **replay_path)
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.01, 5.0, size=50)
    buf.add(batch(0, 50), priorities=priorities)
    counts = np.zeros(50)
    # Triton's interpreter pays per call: fewer draws there (its draws equal the torch path's, bit for bit:
    # tests/replay/test_triton_tree.py), still enough for the chi-square to see a wrong law (alpha 1 or 0 by far;
    # 0.5 or 0.7 take the torch path's 100,000 samples).
    for _ in range(200 if replay_path["kernels"] == "triton" and replay_path["device"] == "cpu" else 2000):
        counts += np.bincount(buf.sample(50).indices.cpu().numpy(), minlength=50)
    expected = priorities**alpha / (priorities**alpha).sum()
    ok, statistic, critical = chi_square_passes(counts, expected)
    assert ok, f"chi-square {statistic:.1f} >= {critical:.1f}"


def test_importance_weights_closed_form(replay_path):
    alpha, beta = 0.5, 0.4
    buf = make_replay(4, FIELDS, alpha=alpha, beta=beta, eps=0.0, **replay_path)
    p = np.array([1.0, 4.0, 9.0, 16.0])
    buf.add(batch(0, 4), priorities=p)
    sample = buf.sample(4)  # stratified over 4 equal strata: p**alpha = 1, 2, 3, 4 (sum 10)
    probs = p**alpha / (p**alpha).sum()
    w = (4 * probs) ** -beta
    expected = w / w.max()
    got = sample.weights.cpu().numpy()
    keys = sample.indices.cpu().numpy()
    np.testing.assert_allclose(got, expected[keys], rtol=1e-6)
    assert got.max() <= 1.0


def test_beta_anneals_to_one(replay_path):
    buf = make_replay(10, FIELDS, beta=0.4, beta_steps=4, **replay_path)
    buf.add(batch(0, 10), priorities=np.arange(1, 11))
    betas = []
    for _ in range(6):
        betas.append(buf.beta)
        buf.sample(2)
    assert betas == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0, 1.0])


def test_new_items_get_max_priority_seen(replay_path):
    buf = make_replay(10, FIELDS, alpha=1.0, eps=0.0, **replay_path)
    buf.add(batch(0, 2), priorities=[3.0, 0.5])
    buf.add(batch(2, 1))
    leaves = buf._tree.leaves.cpu()
    assert leaves[2].item() == pytest.approx(3.0)


def test_update_priorities_with_repeated_keys_last_wins(replay_path):
    buf = make_replay(10, FIELDS, alpha=1.0, eps=0.0, **replay_path)
    buf.add(batch(0, 10), priorities=np.ones(10))
    buf.update_priorities(torch.tensor([2, 2, 7, 2]), torch.tensor([5.0, 6.0, 0.0, 8.0]))
    leaves = buf._tree.leaves.cpu()
    assert leaves[2].item() == 8.0 and leaves[7].item() == 0.0
    assert float(buf._tree.total()) == pytest.approx(8 + 8.0)
    drawn = torch.cat([buf.sample(10).indices for _ in range(20)]).cpu()
    assert 7 not in drawn.tolist()  # priority zero with eps = 0: never sampled


def test_stale_update_after_overwrite_is_ignored(replay_path):
    buf = make_replay(4, FIELDS, alpha=1.0, eps=0.0, **replay_path)
    buf.add(batch(0, 4), priorities=np.ones(4))
    sample = buf.sample(4)
    buf.add(batch(4, 2), priorities=[2.0, 2.0])  # overwrites slots 0 and 1 (keys 0, 1)
    buf.update_priorities(sample.indices, torch.full((4,), 100.0))
    leaves = buf._tree.leaves.cpu().tolist()
    assert leaves == [2.0, 2.0, 100.0, 100.0]


def test_a_stale_key_and_the_live_key_of_one_slot_in_one_update_the_live_one_wins(replay_path):
    buf = make_replay(4, FIELDS, alpha=1.0, eps=0.0, **replay_path)
    buf.add(batch(0, 6), priorities=np.ones(6))  # keys 4 and 5 live in the slots of keys 0 and 1
    buf.update_priorities(torch.tensor([4, 0, 1, 5, 1]), torch.tensor([7.0, 50.0, 60.0, 9.0, 70.0]))
    assert buf._tree.leaves.cpu().tolist() == [7.0, 9.0, 1.0, 1.0]


def test_all_zero_priorities_fall_back_to_uniform(replay_path):
    buf = make_replay(20, FIELDS, eps=0.0, **replay_path)
    buf.add(batch(0, 8), priorities=np.zeros(8))
    drawn = torch.cat([buf.sample(8).indices for _ in range(50)]).cpu()
    assert set(drawn.tolist()) == set(range(8))
    assert torch.all(buf.sample(8).weights == 1.0)


def test_min_policy_version_excludes_older_items(replay_path):
    buf = make_replay(100, FIELDS, **replay_path)
    buf.add(batch(0, 30), policy_version=torch.arange(30) // 10)  # versions 0, 1, 2
    sample = buf.sample(30, min_policy_version=1)
    assert sample.policy_version.min().item() >= 1
    assert sample.indices.min().item() >= 10
    # Evicted items stay out, also after updates and for later adds of old versions.
    buf.update_priorities(torch.arange(30), torch.full((30,), 50.0))
    buf.add(batch(30, 5), policy_version=0)
    drawn = torch.cat([buf.sample(35).indices for _ in range(20)]).cpu()
    assert drawn.min().item() >= 10 and not set(drawn.tolist()) & set(range(30, 35))
    with pytest.raises(ValueError, match="no stored item"):
        buf.sample(4, min_policy_version=99)


def test_state_dict_round_trip(replay_path):
    buf = make_replay(16, FIELDS, device="cpu")
    buf.add(batch(0, 20), priorities=np.linspace(0.1, 2, 20), policy_version=3)
    buf.sample(4)
    state = buf.state_dict()
    assert all(isinstance(v, (torch.Tensor, int, float)) for v in state.values())
    other = make_replay(16, FIELDS, **replay_path)
    other.load_state_dict(state)
    assert len(other) == 16 and other.inserted == 20 and other.beta == buf.beta
    assert torch.equal(other._tree.leaves.cpu(), buf._tree.leaves)
    sample = other.sample(16)
    assert_consistent(sample)
    assert torch.all(sample.policy_version == 3)
    back = make_replay(16, FIELDS, device="cpu")
    back.load_state_dict(other.state_dict())
    assert torch.equal(back._tree.leaves, buf._tree.leaves)


def test_a_restored_buffer_continues_bit_for_bit(replay_path):
    """Saved mid-run with the RNG state, a new buffer of the same path samples, weighs, updates and evicts
    exactly as the first one goes on to do (the host's index of versions rebuilt from the state)."""
    buf = make_replay(48, FIELDS, **replay_path)
    for version in range(4):
        buf.add(batch(version * 20, 20), priorities=np.linspace(0.1, 2, 20), policy_version=version)
    first = buf.sample(8)
    buf.update_priorities(first.indices, torch.linspace(0.5, 3, 8, device=buf.device))
    cuda = buf.device.type == "cuda"  # draws come from the CUDA generator there
    state, rng = buf.state_dict(), torch.cuda.get_rng_state() if cuda else torch.get_rng_state()

    def go_on(replay) -> list:
        out = []
        for step in range(4):
            sample = replay.sample(8, min_policy_version=2 if step >= 2 else None)
            replay.update_priorities(sample.indices, sample.weights.double() + step)
            out.append((sample.indices.cpu(), sample.weights.cpu(), replay._tree.leaves.cpu().clone()))
        replay.add(batch(100, 5), policy_version=4)
        return out + [(replay._tree.leaves.cpu().clone(),)]

    want = go_on(buf)
    restored = make_replay(48, FIELDS, **replay_path)
    restored.load_state_dict(state)
    (torch.cuda.set_rng_state if cuda else torch.set_rng_state)(rng)
    for a, b in zip(go_on(restored), want, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    restored.check_errors()


def test_state_dict_mismatch_is_rejected():
    buf = make_replay(8, FIELDS)
    buf.add(batch(0, 3))
    with pytest.raises(ValueError, match="capacity"):
        make_replay(9, FIELDS).load_state_dict(buf.state_dict())
    with pytest.raises(ValueError, match="field"):
        make_replay(8, {"obs": ((4,), torch.float32)}).load_state_dict(buf.state_dict())


@pytest.mark.parametrize("make_bad,message", [
    (lambda b: {k: v for k, v in b.items() if k != "obs"}, "missing \\['obs'\\]"),
    (lambda b: {**b, "extra": b["reward"]}, "unknown \\['extra'\\]"),
    (lambda b: {**b, "obs": b["obs"].double()}, "'obs' has dtype torch.float64, expected torch.float32"),
    (lambda b: {**b, "obs": b["obs"][:, :3]}, "'obs' has shape \\(4, 3\\)"),
    (lambda b: {**b, "action": b["action"][:2]}, "'action' has 2 items"),
    (lambda b: {**b, "reward": [1.0, 2.0]}, "must be a tensor or ndarray"),
    (lambda b: list(b.values()), "must be a mapping"),
])
def test_bad_batches_raise_and_change_nothing(replay_path, make_bad, message):
    buf = make_replay(10, FIELDS, **replay_path)
    buf.add(batch(0, 3))
    with pytest.raises(ValueError, match=message):
        buf.add(make_bad(batch(3, 4)))
    assert len(buf) == 3 and buf.inserted == 3
    assert_consistent(buf.sample(3))


@pytest.mark.parametrize("priorities,message", [
    ([1.0, float("nan"), 1.0, 1.0], "NaN"),
    ([1.0, float("inf"), 1.0, 1.0], "infinite"),
    ([1.0, -0.5, 1.0, 1.0], "negative"),
    ([1.0, 1.0], "got 2 priorities for 4 items"),
])
def test_bad_priorities_raise_and_change_nothing(replay_path, priorities, message):
    buf = make_replay(10, FIELDS, **replay_path)
    buf.add(batch(0, 4), priorities=np.ones(4))
    before = buf._tree.leaves.clone()
    with pytest.raises(ValueError, match=message):
        buf.add(batch(4, 4), priorities=priorities)
    with pytest.raises(ValueError, match=message):
        buf.update_priorities(torch.arange(4), priorities)  # host values: refused at once on every path
    with pytest.raises(ValueError, match=message):
        # Device tensors: the device path checks them on the device and tells at its next read.
        buf.update_priorities(torch.arange(4), torch.tensor(priorities))
        buf.check_errors()
    assert len(buf) == 4 and torch.equal(buf._tree.leaves, before)
    buf.check_errors()  # told once


def test_bad_indices_and_batch_sizes(replay_path):
    buf = make_replay(10, FIELDS, **replay_path)
    buf.add(batch(0, 4))
    before = buf._tree.leaves.clone()
    for keys in ([0, 4], [-1]):
        with pytest.raises(ValueError, match="out of range"):
            buf.update_priorities(keys, np.full(len(keys), 5.0))
        with pytest.raises(ValueError, match="out of range"):
            buf.update_priorities(torch.tensor(keys), torch.full((len(keys),), 5.0))
            buf.check_errors()
    assert torch.equal(buf._tree.leaves, before)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="positive int"):
            buf.sample(bad)
    with pytest.raises(ValueError, match="larger than the 4 items stored"):
        buf.sample(5)
    with pytest.raises(ValueError, match="policy_version"):
        buf.add(batch(4, 3), policy_version=torch.tensor([1, 2]))


def test_invalid_construction():
    with pytest.raises(ValueError):
        make_replay(10, {})
    with pytest.raises(ValueError, match="beta"):
        make_replay(10, FIELDS, beta=1.5)
