"""Reverb-style SampleToInsertRatio rate limiting between inserts and samples."""

from __future__ import annotations

import asyncio
import threading
import time


class RateLimiter:
    """Keeps ``samples / inserts`` near ``samples_per_insert`` once ``min_size_to_sample`` items exist.

    Counted in items: inserting a batch of n is n inserts, sampling a batch of B is B
    samples. With ``diff = inserts * samples_per_insert - samples`` (plus the shift :meth:`retarget` keeps) and
    ``offset = min_size_to_sample * samples_per_insert``, inserts wait while
    ``diff > offset + error_buffer`` and samples wait while ``diff < offset - error_buffer``
    or fewer than ``min_size_to_sample`` items were inserted. A call proceeds once a
    single unit fits, so a batch may overshoot by its size minus one and never deadlocks.

    Waits block the calling thread (:meth:`acquire_insert`, :meth:`acquire_sample`) or an
    asyncio task (:meth:`acquire_insert_async`, :meth:`acquire_sample_async`); each takes
    a timeout and returns whether it acquired. A caller that acquired and then did not
    insert or sample hands the count back (:meth:`refund_insert`, :meth:`refund_sample`),
    so the counters always equal what happened. :meth:`close` releases every waiter with
    False, so shutdown never hangs.
    """

    def __init__(self, min_size_to_sample: int = 1, samples_per_insert: float = 1.0, error_buffer: float | None = None):
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample must be >= 1, got {min_size_to_sample}")
        self.error_buffer = max(1.0, samples_per_insert) if error_buffer is None else error_buffer
        _check_ratio(samples_per_insert, self.error_buffer)
        self.min_size_to_sample = min_size_to_sample
        self.samples_per_insert = samples_per_insert
        offset = min_size_to_sample * samples_per_insert
        self.min_diff, self.max_diff = offset - self.error_buffer, offset + self.error_buffer
        self.shift = 0.0  # added to diff so that a new samples_per_insert keeps the balance (see retarget)
        self.inserts = 0
        self.samples = 0
        self.waiting = {"inserts": 0, "samples": 0}  # callers blocked right now, per side
        self.closed = False
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        # asyncio waiters per side, in arrival order: only the first is woken when its side has room, and it wakes the
        # next as it acquires (thousands of streams may wait; waking them all per sample would cost a hand-off each)
        self._async_waiters: dict[str, dict[tuple[asyncio.AbstractEventLoop, asyncio.Event], None]] = {
            "inserts": {}, "samples": {}}

    @property
    def diff(self) -> float:
        return self.inserts * self.samples_per_insert - self.samples + self.shift

    def retarget(self, samples_per_insert: float) -> None:
        """Aim at a new ratio from now on. The past is not re-counted at it: ``diff`` keeps its
        distance from the middle of the allowed band, so neither side waits longer than before."""
        _check_ratio(samples_per_insert, self.error_buffer)
        with self._lock:
            before = self.diff - self.min_size_to_sample * self.samples_per_insert
            self.samples_per_insert = samples_per_insert
            offset = self.min_size_to_sample * samples_per_insert
            self.min_diff, self.max_diff = offset - self.error_buffer, offset + self.error_buffer
            self.shift += offset + before - self.diff
            self._notify()

    def can_insert(self) -> bool:
        """Whether one more item may be inserted now."""
        return self.diff + self.samples_per_insert <= self.max_diff

    def can_sample(self) -> bool:
        """Whether one more item may be sampled now."""
        return self.inserts >= self.min_size_to_sample and self.diff - 1 >= self.min_diff

    def acquire_insert(self, n: int = 1, timeout: float | None = None) -> bool:
        """Wait until inserting is allowed, then count ``n`` inserts."""
        return self._acquire(self.can_insert, "inserts", n, timeout)

    def acquire_sample(self, n: int = 1, timeout: float | None = None) -> bool:
        """Wait until sampling is allowed, then count ``n`` samples."""
        return self._acquire(self.can_sample, "samples", n, timeout)

    async def acquire_insert_async(self, n: int = 1, timeout: float | None = None) -> bool:
        """:meth:`acquire_insert` for asyncio code: waits without blocking the loop."""
        return await self._acquire_async(self.can_insert, "inserts", n, timeout)

    async def acquire_sample_async(self, n: int = 1, timeout: float | None = None) -> bool:
        """:meth:`acquire_sample` for asyncio code: waits without blocking the loop."""
        return await self._acquire_async(self.can_sample, "samples", n, timeout)

    def refund_insert(self, n: int) -> None:
        """Uncount ``n`` acquired inserts that did not happen (a dropped batch)."""
        self._refund("inserts", n)

    def refund_sample(self, n: int) -> None:
        """Uncount ``n`` acquired samples that did not happen."""
        self._refund("samples", n)

    def close(self) -> None:
        """Release every waiter (they return False); later acquires fail at once."""
        with self._lock:
            self.closed = True
            self._notify()

    def state_dict(self) -> dict[str, int | float]:
        return {"inserts": self.inserts, "samples": self.samples, "shift": self.shift}

    def load_state_dict(self, state: dict[str, int | float]) -> None:
        with self._lock:
            self.inserts, self.samples = int(state["inserts"]), int(state["samples"])
            self.shift = float(state.get("shift", 0.0))
            self._notify()

    def _refund(self, counter: str, n: int) -> None:
        with self._lock:
            left = getattr(self, counter) - n
            if n < 0 or left < 0:
                raise ValueError(f"cannot refund {n} {counter}: only {getattr(self, counter)} counted")
            setattr(self, counter, left)
            self._notify()

    def _try(self, allowed, counter: str, n: int) -> bool | None:
        """Under the lock: True if counted, False if closed, None if it must wait."""
        if self.closed:
            return False
        if not allowed():
            return None
        setattr(self, counter, getattr(self, counter) + n)
        self._notify()
        return True

    def _acquire(self, allowed, counter: str, n: int, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while (done := self._try(allowed, counter, n)) is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self.waiting[counter] += 1
                try:
                    self._changed.wait(remaining)
                finally:
                    self.waiting[counter] -= 1
            return done

    async def _acquire_async(self, allowed, counter: str, n: int, timeout: float | None) -> bool:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        waiter = (loop, asyncio.Event())
        queue = self._async_waiters[counter]
        with self._lock:
            if (done := self._try(allowed, counter, n)) is not None:
                return done
            queue[waiter] = None
            self.waiting[counter] += 1
        try:
            while True:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(waiter[1].wait(), remaining)
                except TimeoutError:
                    return False
                with self._lock:
                    waiter[1].clear()
                    del queue[waiter]  # before trying: an acquire wakes the next waiter
                    if (done := self._try(allowed, counter, n)) is not None:
                        return done
                    queue[waiter] = None
        finally:
            with self._lock:
                self.waiting[counter] -= 1
                if queue.pop(waiter, False) is None:  # left without acquiring: a wake it had goes to the next waiter
                    self._notify()

    def _notify(self) -> None:
        """Wake every thread waiting, and the first asyncio waiter of each side that may go on now
        (every one once closed); caller holds the lock."""
        self._changed.notify_all()
        for counter, allowed in (("inserts", self.can_insert), ("samples", self.can_sample)):
            queue = self._async_waiters[counter]
            if queue and (self.closed or allowed()):
                for loop, event in list(queue) if self.closed else [next(iter(queue))]:
                    loop.call_soon_threadsafe(event.set)


def _check_ratio(samples_per_insert: float, error_buffer: float) -> None:
    if not samples_per_insert > 0:
        raise ValueError(f"samples_per_insert must be > 0, got {samples_per_insert}")
    if error_buffer < max(1.0, samples_per_insert):
        raise ValueError(f"error_buffer must be >= max(1, samples_per_insert) = {max(1.0, samples_per_insert)} "
                         f"or inserts and samples can block each other; got {error_buffer}")
