"""Where an actor's time goes: wall seconds per part of its env loop, charged as the loop passes each mark."""

from __future__ import annotations

import json
import time
from pathlib import Path

SECTIONS = {
    "act": "the policy's forward pass and exploration (vector mode ahead: telling the loop process what changed)",
    "env": "stepping the vector env (vector mode ahead: waiting for the loop process's steps)",
    "assemble": "episode bookkeeping, frame ids, the algorithm's assembler and cutting batches",
    "priorities": "Ape-X initial priorities",
    "encode": "encoding batches for the wire",
    "send": "handing batches to the stream",
    "wait_acks": "waiting for the learner's acks (the unacked window is full: backpressure)",
    "weights": "taking the learner's settings and weights and loading them",
    "wait_weights": "waiting for the first weights of a network",
}


class StepProfile:
    """Seconds per section of the env loop (:data:`SECTIONS`) and the env steps they bought.

    The loop calls :meth:`mark` after each part: the time since the previous mark goes to that
    part. A mark costs one clock read, so the profile is always on.
    """

    def __init__(self, clock=time.perf_counter):
        self.seconds = dict.fromkeys(SECTIONS, 0.0)
        self.env_steps = 0
        self._clock = clock
        self._last = clock()

    def mark(self, section: str) -> None:
        """Charge the time since the previous mark to ``section``."""
        now = self._clock()
        self.seconds[section] += now - self._last
        self._last = now

    def move(self, seconds: float, source: str, target: str) -> None:
        """Re-charge ``seconds`` already counted in ``source`` to ``target`` (a wait inside a call)."""
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def per_step(self) -> dict[str, float]:
        """Microseconds per env step of each section, and their total."""
        steps = max(self.env_steps, 1)
        micros = {name: 1e6 * seconds / steps for name, seconds in self.seconds.items()}
        return {**micros, "total": sum(micros.values())}

    def summary(self) -> str:
        """One line: microseconds per env step, by section."""
        return ", ".join(f"{name} {micros:.1f}" for name, micros in self.per_step().items()) + " us per env step"

    def write(self, path: str | Path) -> None:
        """Save seconds, env steps and microseconds per step as JSON."""
        Path(path).write_text(json.dumps({"env_steps": self.env_steps, "seconds": self.seconds,
                                          "us_per_step": self.per_step()}, indent=1))
