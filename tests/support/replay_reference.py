"""The reference every replay kernel path is checked against: plain numpy, obviously right, slow."""

import numpy as np


def stratified_draws(leaves: np.ndarray, uniforms: np.ndarray) -> np.ndarray:
    """Leaf drawn from each equal stratum of the total mass: stratum ``i`` at ``(i + uniforms[i]) / n``
    of the total, by inverse CDF over the leaves' running sum."""
    cumulative = np.cumsum(leaves)
    n = len(uniforms)
    targets = (np.arange(n) + uniforms) * (cumulative[-1] / n)
    return np.searchsorted(cumulative, targets, side="right")


def importance_weights(leaves: np.ndarray, slots: np.ndarray, beta: float) -> np.ndarray:
    """``(P(i) / min P) ** -beta``: the IS weight normalized by the largest possible one."""
    return (leaves[slots] / leaves[leaves > 0].min()) ** -beta
