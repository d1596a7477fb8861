"""A run's learning curve: returns as training goes, drawn to a PNG at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LearningCurve:
    """Points of (wall seconds, env steps, return): actors' recent episode returns, and each evaluation's mean."""

    episodes: list[tuple[float, int, float]] = field(default_factory=list)
    evaluations: list[tuple[float, int, float]] = field(default_factory=list)

    def record(self, seconds: float, env_steps: int, episode_return: float, eval_return: float | None = None) -> None:
        """Note the current recent episode return (skipped while NaN) and, when given, a new evaluation."""
        if not math.isnan(episode_return):
            self.episodes.append((seconds, env_steps, episode_return))
        if eval_return is not None:
            self.evaluations.append((seconds, env_steps, eval_return))

    def save_png(self, path: str | Path, title: str) -> None:
        """Returns against env steps (left) and wall seconds (right)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
        for ax, x, label in zip(axes, (1, 0), ("env steps (all actors)", "wall seconds")):
            if self.episodes:
                ax.plot([p[x] for p in self.episodes], [p[2] for p in self.episodes], color="tab:blue",
                        linewidth=1, label="episode return (actors, recent mean)")
            if self.evaluations:
                ax.plot([p[x] for p in self.evaluations], [p[2] for p in self.evaluations], color="tab:orange",
                        marker="o", markersize=3, linewidth=1.5, label="eval return (greedy, learner)")
            ax.set_xlim(0, None)
            ax.set_xlabel(label)
            ax.grid(True, alpha=0.3)
        axes[0].set_ylabel("return")
        axes[0].legend(fontsize=8)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
