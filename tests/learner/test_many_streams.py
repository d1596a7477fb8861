"""1,000 concurrent Connect streams on one learner process: all welcomed and acked, with a bounded thread count
and bounded resident memory, and all gone once their actors go (streams are coroutines on one loop, not threads)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

from many_streams import BATCHES, TRANSITIONS
from procs import CHILD_ENV, NOT_TRAINING, rss_kib, start_learner, status, status_if, stop, wait_until

STREAMS = 1000
BASELINE_STREAMS = 10
CHANNELS = 8  # 125 streams on each of the client's TCP connections
MANY_STREAMS = str(Path(__file__).parents[1] / "support" / "many_streams.py")

MAX_THREADS = 32
"""The issue's bound on the learner's OS threads (gRPC's C threads counted) with 1,000 streams open."""

THREAD_MARGIN = 4
"""Threads the learner may have beyond its 10-stream count: gRPC's thread pool may add one under load."""

MAX_RSS_GROWTH_KIB = 160 * 1024
"""Resident memory 990 more streams may add. Measured on a 2-core machine: 35 MiB for 990 streams, about 36 KiB a
stream all told (gRPC's call, the coroutine and its reader task, the actor's session, its batches), with the learner at
~515 MiB RSS before: the bound is over four times that."""

OPEN_SECONDS = 300
"""Longest the client may take to open, welcome and ack its streams (under 2 s on an idle 2-core machine)."""


def threads(pid: int) -> int:
    """The OS threads of process ``pid`` (Python's and gRPC's C threads alike)."""
    return len(os.listdir(f"/proc/{pid}/task"))


class Client:
    """The many_streams.py process: commands on its stdin, one answer line each read back within a timeout."""

    def __init__(self, port: int):
        self.proc = subprocess.Popen([sys.executable, MANY_STREAMS, f"127.0.0.1:{port}", "many", str(CHANNELS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=CHILD_ENV)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put("")  # the process is gone

    def command(self, text: str, until: str, timeout: float) -> list[str]:
        """Send ``text``; its answer lines, up to ``until`` (excluded)."""
        self.proc.stdin.write(f"{text}\n")
        self.proc.stdin.flush()
        lines = []
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no answer to {text!r} within {timeout}s; so far {lines}") from None
            if line == until:
                return lines
            assert line, f"the client exited (code {self.proc.poll()}) answering {text!r}: {lines}"
            lines.append(line)

    def open(self, count: int, total: int) -> None:
        """Open ``count`` more streams; every one welcomed and its batches acked, none ended."""
        answer = self.command(f"open {count}", "done", OPEN_SECONDS)
        assert answer == [f"open {total} welcomed {total} acked {BATCHES * total} errors 0"], answer

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class PeakThreads:
    """The most threads process ``pid`` had, sampled every 20 ms while in the ``with`` block."""

    def __init__(self, pid: int):
        self.pid, self.peak = pid, threads(pid)
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self.peak = max(self.peak, threads(self.pid))

    def __enter__(self) -> PeakThreads:
        self._sampler.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._sampler.join()


def connected(port: int) -> int:
    """How many actors the learner's status shows connected."""
    return sum(actor.connected for actor in status(port).actors)


def test_a_thousand_streams_hold_with_bounded_threads_and_memory():
    learner, port = start_learner("--env", "CartPole-v1", *NOT_TRAINING, "--dqn-hidden-sizes", "32,32",
                                  "--max-streams", str(STREAMS + 24), "--hello-timeout", "120")
    client = None
    try:
        client = Client(port)
        client.open(BASELINE_STREAMS, BASELINE_STREAMS)
        wait_until(lambda: status_if(port, lambda s: s.inserted == BATCHES * BASELINE_STREAMS), 30, "the baseline's batches")
        base_threads, base_rss = threads(learner.pid), rss_kib(learner.pid)

        with PeakThreads(learner.pid) as peak:
            client.open(STREAMS - BASELINE_STREAMS, STREAMS)
            now = wait_until(lambda: status_if(port, lambda s: s.inserted == BATCHES * STREAMS), 60, "every batch stored")
            many_threads, many_rss = threads(learner.pid), rss_kib(learner.pid)
        on = [actor for actor in now.actors if actor.connected]
        assert len(on) == STREAMS and {a.actor_id for a in on} == {f"many-{i}" for i in range(STREAMS)}
        assert all(a.inserted == BATCHES for a in on), sorted({a.inserted for a in on})
        assert now.buffer_size == BATCHES * STREAMS * TRANSITIONS
        summary = (f"threads {base_threads} with {BASELINE_STREAMS} streams, {many_threads} with {STREAMS} "
                   f"(peak {peak.peak}); RSS {base_rss} KiB -> {many_rss} KiB")
        print(summary)  # shown with -s or -rP
        assert peak.peak <= MAX_THREADS and many_threads <= base_threads + THREAD_MARGIN, summary
        assert many_rss - base_rss < MAX_RSS_GROWTH_KIB, summary

        assert client.command("close", "closed", 60) == []
        wait_until(lambda: connected(port) == 0, 60, "every stream's actor disconnected")
        wait_until(lambda: threads(learner.pid) <= base_threads + THREAD_MARGIN, 30,
                   f"the learner's threads back to at most {base_threads} + {THREAD_MARGIN}")
        client.proc.stdin.close()
        assert client.proc.wait(30) == 0
        assert learner.poll() is None, "the learner exited"
    finally:
        if client is not None:
            client.kill()
        codes = stop(learner)
    assert codes == [0], "the learner did not exit cleanly"
