"""Episode returns and lengths of a vector env in next-step autoreset mode, counted as the env loop steps."""

from __future__ import annotations

import numpy as np


class EpisodeTally:
    """Per-env returns and lengths, and the episodes finished since the last :meth:`take`.

    With next-step autoreset, the step after an env's episode ended only resets it: that step
    counts for nothing. A step where no episode ended before costs a handful of array operations.
    """

    def __init__(self, num_envs: int):
        self.num_envs = num_envs
        self.returns, self.lengths = np.zeros(num_envs), np.zeros(num_envs, np.int64)
        self._ended = np.zeros(num_envs, bool)  # envs whose episode ended at the last step
        self._any_ended = False
        self._none = np.zeros(num_envs, bool)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []
        self.steps = 0  # real env steps since the last take
        self.last_return = float("nan")

    def step(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> tuple[int, np.ndarray]:
        """Count one vector step: (its real env steps, the envs whose step was a reset)."""
        if self._any_ended:
            resets = self._ended
            real = ~resets
            self.returns += np.where(real, rewards, 0.0)
            self.lengths += real
            ended = (terminated | truncated) & real
            count = self.num_envs - int(resets.sum())
        else:
            resets = self._none
            self.returns += rewards
            self.lengths += 1
            ended = terminated | truncated
            count = self.num_envs
        self.steps += count
        self._ended, self._any_ended = ended, bool(ended.any())
        if self._any_ended:
            for i in np.flatnonzero(ended).tolist():
                self.finished_returns.append(float(self.returns[i]))
                self.finished_lengths.append(int(self.lengths[i]))
            self.last_return = self.finished_returns[-1]
            self.returns[ended], self.lengths[ended] = 0.0, 0
        return count, resets

    def take(self) -> tuple[list[float], list[int], int]:
        """The episodes finished (returns, lengths) and the real env steps since the last take."""
        taken = self.finished_returns, self.finished_lengths, self.steps
        self.finished_returns, self.finished_lengths, self.steps = [], [], 0
        return taken
