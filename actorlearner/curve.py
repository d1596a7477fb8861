"""A run's learning curve: returns as training goes, drawn to a PNG at the end."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


Point = tuple[float, int, float]
"""(wall seconds, env steps, return)."""


@dataclass
class LearningCurve:
    """Points of (wall seconds, env steps, return): actors' recent episode returns, and each evaluation's mean."""

    episodes: list[Point] = field(default_factory=list)
    evaluations: list[Point] = field(default_factory=list)

    def record(self, seconds: float, env_steps: int, episode_return: float, eval_return: float | None = None) -> None:
        """Note the current recent episode return (skipped while NaN) and, when given, a new evaluation."""
        if not math.isnan(episode_return):
            self.episodes.append((seconds, env_steps, episode_return))
        if eval_return is not None:
            self.evaluations.append((seconds, env_steps, eval_return))

    def save_png(self, path: str | Path, title: str) -> None:
        """Returns against env steps (left) and wall seconds (right)."""
        fig, axes = new_panels()
        for ax, x in zip(axes, (1, 0)):  # the index of env steps, then of seconds, in a point
            if self.episodes:
                ax.plot([p[x] for p in self.episodes], [p[2] for p in self.episodes], color="tab:blue",
                        linewidth=1, label="episode return (actors, recent mean)")
            if self.evaluations:
                ax.plot([p[x] for p in self.evaluations], [p[2] for p in self.evaluations], color="tab:orange",
                        marker="o", markersize=3, linewidth=1.5, label="eval return (greedy, learner)")
        save_panels(fig, axes, path, title, "return")


def target_reached(evaluations: list[Point], target: float, holds: int = 1) -> tuple[Point | None, Point | None]:
    """(the first evaluation at or above ``target``, the one that makes ``holds`` such evaluations in a row):
    the first hit and the held solve, each None until it happens. With ``holds`` 2 a lucky evaluation
    followed by a lower one does not solve; the next two in a row at the target do."""
    first = held = None
    in_a_row = 0
    for point in evaluations:
        in_a_row = in_a_row + 1 if point[2] >= target else 0
        if in_a_row and first is None:
            first = point
        if in_a_row >= holds:
            held = point
            break
    return first, held


PANELS = (("env_steps", "env steps (all actors)"), ("seconds", "wall seconds"))
"""What the two panels of a learning-curve figure plot along x, left then right: (key, axis label)."""


def new_panels():
    """A figure of two panels sharing their y axis (see :data:`PANELS`), drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)


def save_panels(fig, axes, path: str | Path, title: str, ylabel: str, *, note: str = "", dpi: int = 100,
                legend_size: int = 8) -> None:
    """Label, title and write a :func:`new_panels` figure to ``path``, then free it."""
    import matplotlib.pyplot as plt

    for ax, (_, label) in zip(axes, PANELS):
        ax.set_xlim(0, None)
        ax.set_xlabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[0].legend(fontsize=legend_size)
    fig.suptitle(title, fontsize=10)
    if note:
        fig.text(0.01, 0.01, note, fontsize=7)
    fig.tight_layout(rect=(0, 0.03 if note else 0, 1, 1))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
