"""What a run reports: TensorBoard scalars, event rates and a one-line progress display.

Tags follow CleanRL's namespaces (``charts/``, ``losses/``, ...) so users can guess them;
the constants below are the ones the learner writes.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

EPISODIC_RETURN = "charts/episodic_return"
EPISODIC_LENGTH = "charts/episodic_length"
SPS = "charts/SPS"
"""Env steps per second, summed over actors."""
TD_LOSS = "losses/td_loss"
REPLAY_SIZE = "replay/size"
REPLAY_INSERT_RATE = "replay/insert_rate"
"""Transitions inserted per second."""
REPLAY_SAMPLE_RATE = "replay/sample_rate"
"""Transitions sampled per second."""
POLICY_VERSION = "policy/version"
POLICY_LAG_MAX = "policy/lag_max"
"""Largest learner-minus-actor policy version over connected actors."""
HYPERPARAMETERS = "hyperparameters"
RUNTIME_PARAMETERS = "runtime_parameters"
"""Text: the learner's and the algorithm's settings, a markdown table written once at the start."""
EVAL_MEAN_RETURN = "eval/mean_return"
EVAL_STD_RETURN = "eval/std_return"


class Telemetry:
    """Scalars to TensorBoard under ``logdir``, or nowhere when ``logdir`` is None; thread-safe."""

    def __init__(self, logdir: str | None, *, flush_secs: int = 10) -> None:
        self.logdir = logdir
        self._lock = threading.Lock()
        self._writer: Any = None
        if logdir:
            from torch.utils.tensorboard import SummaryWriter  # Imported only when used.

            self._writer = SummaryWriter(log_dir=logdir, flush_secs=flush_secs)

    @property
    def enabled(self) -> bool:
        """Whether scalars go anywhere."""
        return self._writer is not None

    def scalar(self, tag: str, value: float, step: int) -> None:
        """Record ``value`` (anything ``float()`` accepts, e.g. a 0-d tensor) for ``tag`` at ``step``."""
        if self._writer is None:
            return
        with self._lock:
            self._writer.add_scalar(tag, float(value), int(step))

    def scalars(self, values: Mapping[str, float], step: int) -> None:
        """Record every ``tag: value`` of ``values`` at ``step`` (each as its own scalar)."""
        if self._writer is None:
            return
        with self._lock:
            for tag, value in values.items():
                self._writer.add_scalar(tag, float(value), int(step))

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Record ``text`` (markdown) for ``tag`` at ``step``."""
        if self._writer is None:
            return
        with self._lock:
            self._writer.add_text(tag, text, int(step))

    def flush(self) -> None:
        """Write pending events to disk now."""
        if self._writer is not None:
            with self._lock:
                self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; later calls are ignored."""
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RateMeter:
    """Events per second over the last ``window`` seconds; thread-safe.

    Until a whole window has passed since creation the rate is over the time elapsed,
    so it is right from the start instead of ramping up.
    """

    def __init__(self, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._events: deque[tuple[float, float]] = deque()
        self._in_window = 0.0
        self._start = clock()
        self.total = 0.0
        """All events ever added."""

    def add(self, count: float = 1.0) -> None:
        """Record ``count`` events now."""
        with self._lock:
            now = self._clock()
            self._events.append((now, count))
            self._in_window += count
            self.total += count
            self._expire(now)

    def rate(self) -> float:
        """Events per second over the window (or the time since creation, if shorter)."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            elapsed = min(self.window, now - self._start)
            return self._in_window / elapsed if elapsed > 0 else 0.0

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window:
            self._in_window -= self._events.popleft()[1]
        if not self._events:
            self._in_window = 0.0  # No float drift once empty.


def human(value: float) -> str:
    """A compact number: 950, 12.3k, 1.5M, 2G."""
    if not math.isfinite(value):
        return "-"
    magnitude = abs(value)
    for threshold, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= threshold:
            return f"{value / threshold:.3g}{suffix}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3g}"


_KNOWN = ("env_steps", "sps", "return", "version", "lag_max", "buffer_size", "buffer_capacity", "updates")


def format_progress(stats: Mapping[str, Any]) -> str:
    """One line for humans, e.g. ``steps 1.2M | 4.5k sps | return 198.3 | v 57 (lag 3) | buffer 450k/1M (45%)``.

    Known keys: env_steps, sps, return, version, lag_max, buffer_size, buffer_capacity,
    updates. Missing or None ones are left out; other keys are appended as ``key value``.
    """
    def get(key: str) -> float | None:
        value = stats.get(key)
        return None if value is None else float(value)

    fields: list[str] = []
    if (steps := get("env_steps")) is not None:
        fields.append(f"steps {human(steps)}")
    if (sps := get("sps")) is not None:
        fields.append(f"{human(sps)} sps")
    if (ret := get("return")) is not None:
        fields.append(f"return {ret:.1f}" if math.isfinite(ret) else "return -")
    if (version := get("version")) is not None:
        lag = get("lag_max")
        fields.append(f"v {version:.0f}" + (f" (lag {lag:.0f})" if lag is not None else ""))
    if (size := get("buffer_size")) is not None:
        capacity = get("buffer_capacity")
        if capacity:
            fields.append(f"buffer {human(size)}/{human(capacity)} ({100 * size / capacity:.0f}%)")
        else:
            fields.append(f"buffer {human(size)}")
    if (updates := get("updates")) is not None:
        fields.append(f"updates {human(updates)}")
    for key, value in stats.items():
        if key not in _KNOWN and value is not None:
            text = human(float(value)) if isinstance(value, (int, float)) else str(value)
            fields.append(f"{key} {text}")
    return " | ".join(fields)
