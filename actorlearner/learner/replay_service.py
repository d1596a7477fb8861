"""The learner's replay service: the buffer and all that guards it (rate limiter, lock), offering inserts
kept exactly once by the seq table (:mod:`.exactly_once`), sampling credit, priority updates and checkpoint
snapshots."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping

import torch

from actorlearner import telemetry
from actorlearner.config import LearnerConfig
from actorlearner.frames import FrameLayout, default_frame_capacity
from actorlearner.learner.exactly_once import ExactlyOnce
from actorlearner.learner.figures import Figure
from actorlearner.replay import DeviceSampling, PrioritizedReplay, RateLimiter, ReplaySnapshot, Sample, make_replay

COPY_UNLOCKED_BYTES = 1 << 18
"""Batches of at least this many bytes are copied into the replay outside its lock, so that several
streams copy at once; smaller ones in the same hold as the reserve and commit (one lock round, not two)."""

LIMITER_POLL_SECONDS = 0.25
"""How often a batch waiting on the rate limiter checks whether its stream or the learner ended."""


class InsertAborted(Exception):
    """A batch given up before it was stored, through no fault of the actor: its stream ended or
    the learner is draining. It was not acked, so the actor resends it."""


class Credit:
    """Rate-limiter leave to sample ``n`` items, taken on entry; given back on exit unless :meth:`spend` was
    called. False when the limiter said wait."""

    def __init__(self, limiter: RateLimiter, n: int, timeout: float):
        self._limiter, self._n = limiter, n
        self._granted = limiter.acquire_sample(n, timeout=timeout)

    def __bool__(self) -> bool:
        return self._granted

    def spend(self) -> None:
        """The sample was trained on: the leave is used up."""
        self._granted = False

    def __enter__(self) -> Credit:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._granted:
            self._granted = False
            self._limiter.refund_sample(self._n)


class ReplayService:
    """The replay buffer (its path chosen by `make_replay`), the rate limiter and the lock every buffer call
    runs under, which also keeps the seq table (``exactly_once``) in step with the buffer's contents.

    Inserts from any thread, or the serving loop (:meth:`insert_async`): each reserves its rows under the lock, copies them without it (when
    large) and commits under it again. :meth:`quiesced` waits for open inserts, for a state of the
    learner as of one instant; :meth:`seal` refuses every later insert, so that none is acked after the
    final checkpoint. ``stopping`` (the learner's) gives up inserts waiting on the limiter.
    """

    def __init__(self, config: LearnerConfig, fields: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
                 frames: FrameLayout | None, device: torch.device, exactly_once: ExactlyOnce,
                 stopping: threading.Event):
        frame_capacity = (config.replay_frames or default_frame_capacity(frames, fields, config.replay_capacity)
                          if frames is not None else 0)
        self.buffer: PrioritizedReplay = make_replay(
            config.replay_capacity, fields, alpha=config.alpha, beta=config.beta, beta_steps=config.beta_steps,
            device=device, frames=frames, frame_capacity=frame_capacity)
        self._sampling: DeviceSampling | None = self.buffer.device_sampling()
        self.limiter = RateLimiter(config.min_replay_size, config.samples_per_insert, config.rate_error_buffer)
        self.checkpointed = config.checkpoint_replay  # whether checkpoints hold the buffer
        self.stopping, self.exactly_once = stopping, exactly_once
        self.insert_meter = telemetry.RateMeter()
        self._lock = threading.Lock()
        self.inserts_changed = threading.Condition(self._lock)  # an insert committed, or the gate opened
        self.gate_closed = False  # a checkpoint waits for open inserts: no new ones start meanwhile
        self._sealed = False  # set before the final checkpoint: later inserts are refused, not acked

    def __len__(self) -> int:
        return len(self.buffer)

    # -- inserts -------------------------------------------------------------------------------

    def insert(self, actor_id: str, seq: int, arrays: Mapping, n: int, priorities, policy_version: int,
               ended: threading.Event, committed: Callable[[], None]) -> bool:
        """Store a checked batch of ``n`` items unless ``seq`` was stored from ``actor_id`` meanwhile: True if
        stored.

        Waits for the rate limiter's room (backpressure) until ``ended`` (its stream) or the learner
        stops: :class:`InsertAborted`. ``committed`` runs under the lock as the batch becomes
        sampleable: exactly once per stored batch. On any failure nothing of the batch stays stored,
        its credit is given back and the seq table is as before.
        """
        self._acquire_insert(n, ended)
        return self._store(actor_id, seq, arrays, n, priorities, policy_version, committed)

    async def insert_async(self, actor_id: str, seq: int, arrays: Mapping, n: int, priorities, policy_version: int,
                           committed: Callable[[], None]) -> bool:
        """:meth:`insert` for a stream served on an event loop: the wait for the rate limiter's room does not
        block the loop, and cancelling it (the stream ended) gives the batch up. The store itself does not wait
        on anything but the lock."""
        if not await self.limiter.acquire_insert_async(n):
            raise InsertAborted("the learner is shutting down")
        return self._store(actor_id, seq, arrays, n, priorities, policy_version, committed)

    def _store(self, actor_id: str, seq: int, arrays: Mapping, n: int, priorities, policy_version: int,
               committed: Callable[[], None]) -> bool:
        """The insert once the limiter counted it: reserve, write, commit (or give everything back)."""
        reservation, inserted, previous = None, False, -1
        try:
            with self._lock:
                while self.gate_closed:
                    self.inserts_changed.wait()
                if self._sealed:
                    raise InsertAborted("the learner is shutting down")
                previous = self.exactly_once.stored(actor_id)
                if seq > previous:  # not stored meanwhile by another stream: claim it
                    reservation = self.buffer.reserve(arrays, priorities, policy_version=policy_version)
                    self.exactly_once.claim_seq(actor_id, seq)
                    if sum(a.nbytes for a in arrays.values()) < COPY_UNLOCKED_BYTES:
                        self.buffer.write(reservation)
                        inserted = self._commit(reservation, committed)
            if reservation is not None and not inserted:
                self.buffer.write(reservation)  # no lock: other streams copy their batches meanwhile
                with self._lock:
                    inserted = self._commit(reservation, committed)
        finally:
            if not inserted:
                self.limiter.refund_insert(n)
                if reservation is not None:  # the write failed: nothing of the batch is stored, it may come again
                    with self._lock:
                        self.buffer.abort(reservation)
                        self.exactly_once.release_seq(actor_id, seq, previous)
                        self.inserts_changed.notify_all()
        if inserted:
            self.insert_meter.add(n)
        return inserted

    def _commit(self, reservation, committed: Callable[[], None]) -> bool:
        self.buffer.commit(reservation)
        committed()
        self.inserts_changed.notify_all()
        return True

    def _acquire_insert(self, n: int, ended: threading.Event) -> None:
        while not self.limiter.acquire_insert(n, timeout=LIMITER_POLL_SECONDS):
            if self.stopping.is_set():
                raise InsertAborted("the learner is shutting down")
            if ended.is_set():
                raise InsertAborted("the stream ended")
        if ended.is_set():
            self.limiter.refund_insert(n)
            raise InsertAborted("the stream ended")

    def seal(self) -> None:
        """Refuse every insert from now on (its batch stays unacked, and is resent to the next learner)."""
        with self._lock:
            self._sealed = True

    def close(self) -> None:
        """Release every caller waiting on the rate limiter; the learner is stopping."""
        self.limiter.close()

    # -- sampling ------------------------------------------------------------------------------

    def credit(self, n: int, timeout: float) -> Credit:
        """Leave to sample ``n`` items once the rate limiter gives it (within ``timeout``): use it in a ``with``."""
        return Credit(self.limiter, n, timeout)

    def sample(self, n: int, min_policy_version: int | None = None) -> Sample:
        """``n`` items drawn by priority (:class:`NothingRecentEnough` when every item is older than
        ``min_policy_version``)."""
        with self._lock:
            return self.buffer.sample(n, min_policy_version=min_policy_version)

    def update_priorities(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """New priorities for sampled items (an item overwritten since is left alone)."""
        with self._lock:
            self.buffer.update_priorities(indices, priorities)

    def device_sampling(self) -> DeviceSampling | None:
        """This service, whose :class:`DeviceSampling` calls run the buffer's under the lock, or None where the
        buffer has none (inserts go on between the calls, as between an eager sample and its priority update)."""
        return self if self._sampling is not None else None

    def start_sample(self, batch_size: int, min_policy_version: int | None = None) -> bool:
        with self._lock:
            return self._sampling.start_sample(batch_size, min_policy_version)

    def draw(self, batch_size: int) -> Sample:
        with self._lock:
            return self._sampling.draw(batch_size)

    def draw_on_host(self, batch_size: int) -> Sample:
        with self._lock:
            return self._sampling.draw_on_host(batch_size)

    def launch(self, graph: torch.cuda.CUDAGraph) -> None:
        with self._lock:
            self._sampling.launch(graph)

    def check_errors(self) -> None:
        """Raise what the buffer refused since the last check (device-side checks are read here)."""
        with self._lock:
            self.buffer.check_errors()

    @property
    def device(self) -> torch.device:
        return self.buffer.device

    # -- the state as of one instant, and changes to it ----------------------------------------

    @contextlib.contextmanager
    def quiesced(self) -> Iterator[None]:
        """Hold the lock with no insert open (new ones wait): every part's state as of one instant."""
        with self._lock:
            self.gate_closed = True
            try:
                self.inserts_changed.wait_for(lambda: self.buffer.pending == 0)
            finally:
                self.gate_closed = False
                self.inserts_changed.notify_all()
            yield

    def state(self) -> dict:
        """Within :meth:`quiesced` (where the exactly-once part's state matches the buffer): the limiter's counts. The limiter's inserts are the
        buffer's own, not those of batches admitted but not stored yet (dropped if the learner stops first)."""
        return {"inserts": self.buffer.inserted - self.buffer.abandoned,
                "samples": self.limiter.samples, "shift": self.limiter.shift}

    def snapshot(self) -> ReplaySnapshot | None:
        """Within :meth:`quiesced`: the buffer as of now, read out later in chunks while inserts go on (None
        when checkpoints leave the buffer out). Close it when done."""
        return self.buffer.snapshot(self._lock) if self.checkpointed else None

    def load_state(self, state: Mapping, buffer: Mapping | None) -> None:
        """A checkpoint's buffer with the limiter's counts (without it both start empty)."""
        if buffer is not None:
            self.buffer.load_state_dict(buffer)
            self.limiter.load_state_dict(state)

    def retune(self, config: LearnerConfig) -> None:
        """Take runtime parameters: the limiter's ratio, the buffer's exponents."""
        if config.samples_per_insert != self.limiter.samples_per_insert:
            self.limiter.retarget(config.samples_per_insert)
        if (config.alpha, config.beta) != (self.buffer.alpha, self.buffer.beta0):
            with self.quiesced():
                self.buffer.set_exponents(config.alpha, config.beta)

    def figures(self) -> list[Figure]:
        return [
            Figure(lambda: len(self.buffer), "buffer_size", "Transitions in the replay buffer.",
                   status="buffer_size", line="buffer_size", tag=telemetry.REPLAY_SIZE),
            Figure(self.insert_meter.rate, "inserts_per_second", "Transitions inserted per second.",
                   status="insert_rate", tag=telemetry.REPLAY_INSERT_RATE),
            Figure(lambda: self.limiter.waiting["inserts"], "inserts_waiting",
                   "Batches waiting for the rate limiter's room (backpressure on actors)."),
            Figure(lambda: self.buffer.capacity, line="buffer_capacity"),
        ]

