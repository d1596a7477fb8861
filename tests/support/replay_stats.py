"""Statistics helpers for the replay tests."""

import math

import numpy as np


def chi_square_passes(counts: np.ndarray, expected_p: np.ndarray, z: float = 3.719) -> tuple[bool, float, float]:
    """Pearson chi-square goodness of fit at the 1e-4 level (Wilson-Hilferty critical value)."""
    keep = expected_p > 0
    n = counts.sum()
    expected = expected_p[keep] * n
    statistic = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return statistic < critical, statistic, critical
