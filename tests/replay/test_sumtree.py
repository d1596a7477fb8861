"""SumTree: proportional stratified sampling, batched updates, exact sums, zero handling."""

import math

import numpy as np
import pytest
import torch

from actorlearner.replay import SumTree
from replay_reference import stratified_draws
from replay_stats import chi_square_passes


@pytest.mark.parametrize("capacity,branching,max_top", [(1, 2, 1), (7, 2, 1), (1000, 16, 8), (5000, 4, 4096), (300, 64, 2)])
def test_total_and_leaves_after_updates(make_tree, capacity, branching, max_top):
    tree = make_tree(capacity, branching, max_top=max_top)
    gen = torch.Generator().manual_seed(0)
    values = torch.rand(capacity, generator=gen, dtype=torch.float64)
    tree.update(torch.arange(capacity), values)
    assert torch.allclose(tree.leaves.cpu(), values)
    assert math.isclose(float(tree.total()), float(values.sum()), rel_tol=1e-12)
    assert tree.min_positive() == pytest.approx(float(values.min()))


def test_sampling_frequencies_match_priorities(make_tree):
    capacity = 200
    tree = make_tree(capacity, branching=4, max_top=8)
    rng = np.random.default_rng(0)
    priorities = rng.gamma(0.5, size=capacity)
    priorities[rng.choice(capacity, 20, replace=False)] = 0.0
    tree.update(torch.arange(capacity), torch.from_numpy(priorities))
    gen = torch.Generator(device=tree.device).manual_seed(1)
    draws = torch.cat([tree.sample(1000, generator=gen) for _ in range(400)]).cpu().numpy()
    counts = np.bincount(draws, minlength=capacity)
    assert counts[priorities == 0].sum() == 0, "a zero-priority leaf was sampled"
    ok, statistic, critical = chi_square_passes(counts, priorities / priorities.sum())
    assert ok, f"chi-square {statistic:.1f} >= {critical:.1f}"


def test_sampling_is_stratified(make_tree):
    tree = make_tree(4, branching=2)
    tree.update(torch.arange(4), torch.ones(4, dtype=torch.float64))
    # One draw per quarter of the mass: every leaf exactly once, in order.
    assert tree.sample(4).tolist() == [0, 1, 2, 3]


def test_zero_leaves_never_sampled_even_at_rounding_edges(make_tree):
    tree = make_tree(64, branching=4, max_top=4)
    values = torch.zeros(64, dtype=torch.float64)
    values[[0, 17, 63]] = torch.tensor([1e-300, 1.0, 1e300], dtype=torch.float64)
    tree.update(torch.arange(64), values)
    draws = torch.cat([tree.sample(512) for _ in range(20)]).cpu()
    assert set(draws.tolist()) <= {0, 17, 63}


def test_all_zero_falls_back_to_uniform_over_stored(make_tree):
    tree = make_tree(100)
    draws = torch.cat([tree.sample(500, num_items=10) for _ in range(20)]).cpu()
    assert draws.min() >= 0 and draws.max() <= 9
    assert len(set(draws.tolist())) == 10


def test_repeated_indices_last_write_wins(make_tree):
    tree = make_tree(10, branching=2)
    tree.update(torch.tensor([3, 5, 3, 3, 5]), torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5], dtype=torch.float64))
    assert tree.leaves[3].item() == 4.0 and tree.leaves[5].item() == 0.5
    assert float(tree.total()) == 4.5
    tree.update(torch.tensor([5, 3, 5]), torch.tensor([7.0, 0.0, 1.0], dtype=torch.float64))
    assert tree.leaves[3].item() == 0.0 and tree.leaves[5].item() == 1.0 and float(tree.total()) == 1.0


def test_update_range_matches_scattered_update(make_tree):
    a, b = make_tree(1000, 8, max_top=16), make_tree(1000, 8, max_top=16)
    values = torch.rand(300, dtype=torch.float64)
    a.update(torch.arange(650, 950), values)
    b.update_range(650, values)
    assert torch.equal(a.leaves, b.leaves) and float(a.total()) == float(b.total())
    assert a.min_positive() == b.min_positive()
    with pytest.raises(ValueError, match="outside"):
        b.update_range(900, values)


def test_min_positive_tracks_raises_and_zeroes(make_tree):
    tree = make_tree(8, branching=2)
    tree.update(torch.arange(8), torch.arange(1, 9, dtype=torch.float64))
    assert tree.min_positive() == 1.0
    tree.update(torch.tensor([0]), torch.tensor([5.0], dtype=torch.float64))  # raise the minimum
    assert tree.min_positive() == 2.0
    tree.update(torch.tensor([1]), torch.tensor([0.0], dtype=torch.float64))  # zero it
    assert tree.min_positive() == 3.0
    tree.update(torch.tensor([7]), torch.tensor([0.25], dtype=torch.float64))  # a new minimum
    assert tree.min_positive() == 0.25
    tree.update(torch.arange(8), torch.zeros(8, dtype=torch.float64))
    assert tree.min_positive() == math.inf


def test_million_random_updates_do_not_drift(make_tree):
    capacity = 100_000
    tree = make_tree(capacity)
    gen = torch.Generator().manual_seed(0)
    tree.update_range(0, torch.rand(capacity, generator=gen, dtype=torch.float64))
    for _ in range(100):  # 1e6 updates in batches of 10k, values spanning 12 orders of magnitude
        idx = torch.randint(capacity, (10_000,), generator=gen)
        val = torch.rand(10_000, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (10_000,), generator=gen)
        tree.update(idx, val)
    leaf_sum = math.fsum(tree.leaves.cpu().tolist())
    assert abs(float(tree.total()) - leaf_sum) <= 1e-9 * leaf_sum


def test_state_dict_round_trip_across_devices(make_tree):
    tree = SumTree(500, device="cpu")
    tree.update(torch.arange(500), torch.rand(500, dtype=torch.float64))
    other = make_tree(500)
    other.load_state_dict(tree.state_dict())
    assert torch.equal(other.leaves.cpu(), tree.leaves)
    assert float(other.total()) == pytest.approx(float(tree.total()), rel=1e-12)
    assert other.min_positive() == tree.min_positive()
    with pytest.raises(ValueError, match="capacity"):
        SumTree(10).load_state_dict(tree.state_dict())


def test_invalid_construction():
    for args in [(0,), (10, 1), (10, 2, "cpu", 0)]:
        with pytest.raises(ValueError):
            SumTree(*args)


def test_every_path_draws_what_the_reference_draws(make_tree):
    """Random scattered and ranged writes (zeros included), then the same uniforms: the same leaves."""
    capacity = 5000
    tree = make_tree(capacity, branching=16, max_top=64)
    rng = np.random.default_rng(7)
    leaves = np.zeros(capacity)
    for step in range(30):
        if step % 3 == 0:
            start = int(rng.integers(0, capacity - 300))
            values = rng.gamma(0.5, size=300) * (rng.random(300) > 0.2)
            tree.update_range(start, torch.from_numpy(values))
            leaves[start:start + 300] = values
        else:
            slots = rng.integers(0, capacity, size=400)
            values = rng.gamma(0.5, size=400) * (rng.random(400) > 0.2)
            tree.update(torch.from_numpy(slots), torch.from_numpy(values))
            last = {int(s): v for s, v in zip(slots, values)}
            leaves[list(last)] = list(last.values())
        np.testing.assert_array_equal(tree.leaves.cpu().numpy(), leaves)
        assert tree.min_positive() == leaves[leaves > 0].min()
        assert float(tree.total()) == pytest.approx(math.fsum(leaves), rel=1e-12)
        uniforms = torch.rand(256, dtype=torch.float64, device=tree.device,
                              generator=torch.Generator(device=tree.device).manual_seed(step))
        drawn = tree.sample(256, generator=torch.Generator(device=tree.device).manual_seed(step))
        np.testing.assert_array_equal(drawn.cpu().numpy(), stratified_draws(leaves, uniforms.cpu().numpy()))
