"""R2D2's learning rule on replayed sequences, as pure functions over ``[B, T]`` tensors.

Time runs along dim 1. A sequence of ``T`` steps has rewards ``r[t]``, per-step discounts
``d[t]`` (gamma, or 0 where the episode terminated at step t), a ``mask[t]`` (False on
the padding after an episode's end) and ``T + 1`` Q estimates, the last for the state
after step ``T - 1``. Targets use the invertible value rescaling of Pohlen et al. 2018,
as R2D2 (Kapturowski et al. 2019) does.
"""

from __future__ import annotations

import torch
from torch import Tensor

RESCALE_EPS = 1e-3


def value_rescale(x: Tensor, eps: float = RESCALE_EPS) -> Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1) - 1) + eps * x


def inverse_value_rescale(x: Tensor, eps: float = RESCALE_EPS) -> Tensor:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    root = (torch.sqrt(1 + 4 * eps * (x.abs() + 1 + eps)) - 1) / (2 * eps)
    return torch.sign(x) * (root.square() - 1)


def n_step_targets(reward: Tensor, discount: Tensor, mask: Tensor, bootstrap: Tensor, n_step: int,
                   rescale: bool = True) -> Tensor:
    """Targets [B, T] for every step of every sequence; 0 on masked steps.

    Step t sums m = up to ``n_step`` rewards, stopping at the sequence's end or its first
    masked step: ``G = r[t] + d[t] r[t+1] + ... + d[t]...d[t+m-1] v[t+m]``, where ``v`` is
    ``bootstrap`` [B, T + 1] (Q values in rescaled units when ``rescale``, so ``v = h^-1``
    of them and the target is ``h(G)``). A termination's zero discount cuts the bootstrap;
    a truncated episode bootstraps from its final observation, at index ``t + m``.
    """
    steps = reward.shape[1]
    time = torch.arange(steps, device=reward.device)
    mask = mask.to(reward.dtype)
    values = inverse_value_rescale(bootstrap) if rescale else bootstrap
    total, scale, summed = torch.zeros_like(reward), torch.ones_like(reward), torch.zeros_like(reward)
    active = mask
    for k in range(n_step):
        index = time + k
        in_sequence = (index < steps).to(reward.dtype)
        index = index.clamp(max=steps - 1)
        active = active * in_sequence * mask[:, index]
        total = total + active * scale * reward[:, index]
        scale = torch.where(active.bool(), scale * discount[:, index], scale)
        summed = summed + active
    bootstrap_at = (time + summed.long()).clamp(max=steps)
    total = (total + scale * values.gather(1, bootstrap_at)) * mask
    return value_rescale(total) * mask if rescale else total


def sequence_priorities(td: Tensor, mask: Tensor, eta: float = 0.9) -> Tensor:
    """Per-sequence priority [B]: eta * max|TD| + (1 - eta) * mean|TD| over the unmasked steps."""
    mask = mask.to(td.dtype)
    abs_td = td.abs() * mask
    count = mask.sum(dim=1).clamp(min=1)
    return eta * abs_td.max(dim=1).values + (1 - eta) * abs_td.sum(dim=1) / count
