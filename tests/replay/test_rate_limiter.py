"""RateLimiter: Reverb's SampleToInsertRatio semantics, blocking, timeouts, threads and asyncio."""

import asyncio
import threading
import time

import pytest

from actorlearner.replay import RateLimiter
from procs import wait_until


def test_sampling_waits_for_min_size():
    limiter = RateLimiter(min_size_to_sample=3, samples_per_insert=1.0, error_buffer=5)
    assert not limiter.acquire_sample(timeout=0.01)
    assert limiter.acquire_insert(2, timeout=0)
    assert not limiter.can_sample()
    assert limiter.acquire_insert(1, timeout=0)
    assert limiter.acquire_sample(1, timeout=0)


def test_ratio_bounds_inserts_and_samples():
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=2.0, error_buffer=4.0)
    # offset = 2, diff in [-2, 6]: inserts allowed while diff + 2 <= 6.
    inserted = 0
    while limiter.acquire_insert(1, timeout=0):
        inserted += 1
    assert inserted == 3 and limiter.diff == 6
    sampled = 0
    while limiter.acquire_sample(1, timeout=0):
        sampled += 1
    assert sampled == 8 and limiter.diff == -2  # samples stop once diff - 1 < -2
    assert limiter.acquire_insert(1, timeout=0)


def test_a_large_batch_overshoots_instead_of_deadlocking():
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=2)
    assert limiter.acquire_insert(100, timeout=0)  # room for one: the whole batch goes in
    assert not limiter.acquire_insert(1, timeout=0)
    assert limiter.acquire_sample(256, timeout=0)
    assert limiter.acquire_insert(1, timeout=0)


def test_blocked_insert_is_released_by_a_sample_in_another_thread():
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=1)
    assert limiter.acquire_insert(2, timeout=0)
    result = {}
    thread = threading.Thread(target=lambda: result.update(ok=limiter.acquire_insert(1, timeout=60)), daemon=True)
    thread.start()
    wait_until(lambda: limiter.waiting["inserts"] == 1, 30, "the insert to wait on the limiter")
    assert not result and limiter.inserts == 2, "insert should block while the ratio is exceeded"
    assert limiter.acquire_sample(2, timeout=0)
    thread.join(30)
    assert result == {"ok": True} and limiter.inserts == 3


def test_timeouts_return_false_after_the_timeout():
    limiter = RateLimiter(min_size_to_sample=5)
    start = time.monotonic()
    assert not limiter.acquire_sample(1, timeout=0.2)
    assert time.monotonic() - start >= 0.19
    assert limiter.samples == 0


def test_close_releases_waiters():
    limiter = RateLimiter(min_size_to_sample=5)
    results = []
    thread = threading.Thread(target=lambda: results.append(limiter.acquire_sample(1)), daemon=True)  # no timeout
    thread.start()
    wait_until(lambda: limiter.waiting["samples"] == 1, 30, "the sample to wait on the limiter")
    limiter.close()
    thread.join(30)
    assert results == [False] and not limiter.acquire_insert(1, timeout=0)


def test_asyncio_waiter_does_not_block_the_loop():
    limiter = RateLimiter(min_size_to_sample=2)

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        tick_task = asyncio.create_task(ticker())
        sample = asyncio.create_task(limiter.acquire_sample_async(1, timeout=60))
        # Both tasks have started (tasks run in creation order); the ticker keeps ticking while the sample waits.
        await asyncio.wait_for(_until(lambda: ticks >= 5), 30)
        assert not sample.done()
        # An insert from another thread wakes the asyncio waiter.
        threading.Thread(target=limiter.acquire_insert, args=(2,)).start()
        assert await asyncio.wait_for(sample, 30)
        assert limiter.samples == 1
        tick_task.cancel()

    asyncio.run(main())


def test_asyncio_timeout_and_close():
    limiter = RateLimiter(min_size_to_sample=3)

    async def main():
        start = asyncio.get_running_loop().time()
        assert not await limiter.acquire_sample_async(1, timeout=0.2)
        assert asyncio.get_running_loop().time() - start >= 0.19
        waiter = asyncio.create_task(limiter.acquire_sample_async(1))  # no timeout: only close ends it
        await asyncio.sleep(0)  # the waiter runs up to its wait
        assert not waiter.done()
        limiter.close()
        assert await asyncio.wait_for(waiter, 30) is False

    asyncio.run(main())


async def _until(predicate) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


def test_state_round_trip():
    limiter = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=10)
    limiter.acquire_insert(5)
    limiter.acquire_sample(3)
    other = RateLimiter(min_size_to_sample=1, samples_per_insert=1.0, error_buffer=10)
    other.load_state_dict(limiter.state_dict())
    assert (other.inserts, other.samples, other.diff) == (5, 3, 2)


@pytest.mark.parametrize("kwargs", [
    {"min_size_to_sample": 0},
    {"samples_per_insert": 0},
    {"samples_per_insert": 4.0, "error_buffer": 2.0},
])
def test_invalid_settings(kwargs):
    with pytest.raises(ValueError):
        RateLimiter(**kwargs)
