"""R2D2's sequence math against plain-Python reference computations."""

from __future__ import annotations

import math

import pytest
import torch

from actorlearner.algorithms.sequence_math import (
    inverse_value_rescale,
    n_step_targets,
    sequence_priorities,
    value_rescale,
)


def h(x: float, eps: float = 1e-3) -> float:
    return math.copysign(math.sqrt(abs(x) + 1) - 1, x) + eps * x


def reference_targets(reward, discount, mask, values, n_step):
    """Step by step: sum rewards while inside the sequence and unmasked, then bootstrap (no rescaling)."""
    steps = len(reward)
    out = []
    for t in range(steps):
        if not mask[t]:
            out.append(0.0)
            continue
        total, scale, k = 0.0, 1.0, 0
        while k < n_step and t + k < steps and mask[t + k]:
            total += scale * reward[t + k]
            scale *= discount[t + k]
            k += 1
        out.append(total + scale * values[t + k])
    return out


def test_value_rescaling_matches_its_formula_and_inverts():
    x = torch.tensor([-1e4, -37.5, -1.0, -1e-3, 0.0, 2e-3, 0.5, 3.0, 250.0, 1e5], dtype=torch.float64)
    torch.testing.assert_close(value_rescale(x), torch.tensor([h(v) for v in x.tolist()], dtype=torch.float64))
    torch.testing.assert_close(inverse_value_rescale(value_rescale(x)), x, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(value_rescale(inverse_value_rescale(x)), x, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_n_step_targets_match_the_reference_with_terminations_and_padding(n_step):
    g = torch.Generator().manual_seed(n_step)
    batch, steps, gamma = 6, 9, 0.97
    reward = torch.randn(batch, steps, generator=g, dtype=torch.float64)
    discount = torch.full((batch, steps), gamma, dtype=torch.float64)
    mask = torch.ones(batch, steps, dtype=torch.bool)
    discount[1, 4] = 0.0                 # sequence 1 terminates at step 4, padded after
    mask[1, 5:] = False
    mask[2, 7:] = False                  # sequence 2 is truncated after step 6: bootstraps from index 7
    mask[3, :] = False                   # all padding
    values = torch.randn(batch, steps + 1, generator=g, dtype=torch.float64) * 5
    got = n_step_targets(reward, discount, mask, values, n_step, rescale=False)
    want = torch.tensor([reference_targets(reward[b].tolist(), discount[b].tolist(), mask[b].tolist(),
                                           values[b].tolist(), n_step) for b in range(batch)], dtype=torch.float64)
    torch.testing.assert_close(got, want)
    # rescaled: h(G) with G bootstrapped from h^-1 of the (rescaled) values
    rescaled = n_step_targets(reward, discount, mask, value_rescale(values), n_step)
    torch.testing.assert_close(rescaled, value_rescale(want) * mask)
    assert got[1, 4] == reward[1, 4] and (got[3] == 0).all()  # the terminal step: its reward alone


def test_sequence_priorities_mix_max_and_mean_over_unmasked_steps():
    td = torch.tensor([[1.0, -3.0, 2.0, 100.0], [0.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    got = sequence_priorities(td, mask, eta=0.9)
    want = [0.9 * 3.0 + 0.1 * (1 + 3 + 2) / 3, 0.9 * 0.5 + 0.1 * 0.5]
    torch.testing.assert_close(got, torch.tensor(want))
