"""Where training stands: the policy version, updates, env steps and recent episodes' return, and the
TensorBoard writer that logs at those steps. Parts read these counts instead of reaching for each other."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping

from actorlearner import telemetry
from actorlearner.learner.figures import Figure


class Progress:
    """The learner's counts and its TensorBoard writer.

    The trainer raises :attr:`version` and :attr:`updates` (one writer); streams add env steps (with the
    batches that carry them, :meth:`count_steps`) and finished episodes (:meth:`count_episodes`), many writers. Parts add gauges (:meth:`gauge`): values written with
    each batch of the trainer's metrics (:meth:`write_metrics`), at the update count.
    """

    def __init__(self, logdir: str | None):
        self.telemetry = telemetry.Telemetry(logdir or None)
        self.version = 0
        self.updates = 0
        self.env_steps = 0
        self.recent_return = math.nan  # exponential average of finished episodes' returns
        self._lock = threading.Lock()  # env_steps and recent_return, reported by every stream
        self._gauges: list[Callable[[], Mapping[str, float]]] = []

    def gauge(self, read: Callable[[], Mapping[str, float]]) -> None:
        """Write ``read()``'s scalars with the trainer's metrics from now on."""
        self._gauges.append(read)

    def write_metrics(self, metrics: Mapping[str, float]) -> None:
        """The trainer's metric means and every gauge's scalars, at the current update count."""
        values = dict(metrics)
        for read in self._gauges:
            values.update(read())
        self.telemetry.scalars(values, self.updates)

    def count_steps(self, env_steps: int) -> None:
        """Env steps a stored batch reported."""
        with self._lock:
            self.env_steps += env_steps

    def count_episodes(self, env_steps: int, finished: Iterable[tuple[float, int]]) -> None:
        """An actor's ``env_steps`` and its ``finished`` episodes' (return, length), written at the env steps."""
        finished = list(finished)
        with self._lock:
            self.env_steps += env_steps
            step = self.env_steps
            for ret, _ in finished:
                self.recent_return = ret if math.isnan(self.recent_return) else 0.9 * self.recent_return + 0.1 * ret
        for ret, length in finished:
            self.telemetry.scalars({telemetry.EPISODIC_RETURN: ret, telemetry.EPISODIC_LENGTH: length}, step)

    def state(self) -> dict[str, int]:
        return {"version": self.version, "updates": self.updates, "env_steps": self.env_steps}

    def load_state(self, state: Mapping) -> None:
        self.version, self.updates = int(state["version"]), int(state["updates"])
        self.env_steps = int(state["env_steps"])

    def figures(self) -> list[Figure]:
        return [
            Figure(lambda: self.version, "policy_version", "Newest published policy version.",
                   status="policy_version", line="version", tag=telemetry.POLICY_VERSION),
            Figure(lambda: self.updates, "updates_total", "Training updates.", counter=True,
                   status="updates", line="updates"),
            Figure(lambda: self.env_steps, "env_steps_total", "Env steps reported by actors.", counter=True,
                   status="env_steps", line="env_steps"),
            Figure(lambda: self.recent_return, "episode_return", "Mean return of recent actor episodes (NaN before any).",
                   line="return"),
        ]

    def close(self) -> None:
        self.telemetry.close()
