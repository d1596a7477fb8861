"""The trainer: the one loop that samples, updates, sets new priorities and decides when to publish and
to checkpoint; data-parallel ranks agree on each round first."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from actorlearner import telemetry
from actorlearner.config import LearnerConfig
from actorlearner.learner.distributed import DataParallel, SingleRank
from actorlearner.learner.publishing import Publishing
from actorlearner.learner.roles import Roles
from actorlearner.learner.step import LearnerStep
from actorlearner.replay import PrioritizedReplay, RateLimiter

logger = logging.getLogger(__name__)

SAMPLE_WAIT_SECONDS = 0.2
"""How long one round waits for the rate limiter's leave to sample (and, training done, between rounds)."""
METRICS_EVERY = 100
"""Updates between metric reads (the one host read of the step's device work) and telemetry writes."""


class TrainingLoop:
    """Owns the algorithm and the policy version; runs on its own thread (:meth:`run`).

    Each update holds ``update_lock`` (a runtime parameter change waits for it); the replay is
    touched only under ``replay_lock``. ``config`` is the learner's, replaced when runtime parameters change.
    """

    def __init__(self, config: LearnerConfig, algorithm: Any, replay: PrioritizedReplay,
                 replay_lock: threading.Lock, limiter: RateLimiter, publishing: Publishing, roles: Roles,
                 telemetry_writer: telemetry.Telemetry, stopping: threading.Event,
                 data_parallel: SingleRank, rates: Callable[[], dict[str, float]]):
        self.config, self.algorithm = config, algorithm
        self.replay, self.replay_lock, self.limiter = replay, replay_lock, limiter
        self.publishing, self.roles, self.telemetry = publishing, roles, telemetry_writer
        self.stopping, self.data_parallel, self.rates = stopping, data_parallel, rates
        # Data-parallel ranks agree between the sample and the update: their steps run eagerly.
        self.step = LearnerStep(algorithm, replay, config.batch_size,
                                capture=False if isinstance(data_parallel, DataParallel) else None)
        self.update_lock = threading.Lock()
        self.version = 0
        self.updates = 0
        self.sample_meter = telemetry.RateMeter()
        self.failed = threading.Event()  # training raised: the process should drain and exit non-zero

    def run(self, checkpoint: Callable[[], None] | None) -> None:
        """Train (until max_updates) and call ``checkpoint`` on schedule, even while training waits or is done.

        An exception (a bug, CUDA out of memory) is logged once and sets :attr:`failed`, instead
        of leaving a learner that serves but no longer trains.
        """
        try:
            self._train_until_stopped(checkpoint)
        except Exception:
            logger.exception("training failed; the learner stops")
            self.failed.set()

    def _train_until_stopped(self, checkpoint: Callable[[], None] | None) -> None:
        last_checkpoint, limit = time.monotonic(), self.config.max_updates
        while True:
            due = checkpoint is not None and time.monotonic() - last_checkpoint >= self.config.checkpoint_every
            training = not (limit and self.updates >= limit)
            _, stop, due = self._round(training, due)
            if stop:
                if not self.stopping.is_set():
                    logger.info("rank %d: another rank is stopping; this one stops too", self.data_parallel.world.rank)
                    self.stopping.set()
                return
            if not training:
                self.stopping.wait(SAMPLE_WAIT_SECONDS)
            if due:
                last_checkpoint = time.monotonic()
                try:
                    checkpoint()
                except OSError as exc:  # e.g. a full disk: keep training, try again next period
                    logger.error("checkpoint failed: %s", exc)

    def train_step(self) -> bool:
        """One sample -> update -> new priorities; False when the rate limiter says wait (data-parallel:
        when any rank's does, for every rank updates or none does)."""
        return self._round(True, False)[0]

    def _round(self, train: bool, checkpoint_due: bool) -> tuple[bool, bool, bool]:
        """Sample (if ``train``) and update; returns (updated, stop, checkpoint due).

        Data-parallel, the ranks first agree in one all-reduce: update only if every rank has a
        sample (else the sample's limiter credit is refunded), stop if any is stopping, checkpoint
        if any's is due. A sample given back this way still counts towards beta's annealing.
        """
        if train and self.step.capture:  # one device program: nothing to agree on between its parts
            updated = self._whole_step()
            return self.data_parallel.agree(updated, self.stopping.is_set(), checkpoint_due)
        sample = self._sample() if train else None
        ready, stop = sample is not None, self.stopping.is_set()
        ready, stop, checkpoint_due = self.data_parallel.agree(ready, stop, checkpoint_due)
        if not ready:
            if sample is not None:
                self.limiter.refund_sample(self.config.batch_size)
            return False, stop, checkpoint_due
        self._learn(sample)
        return True, stop, checkpoint_due

    def _min_version(self) -> int | None:
        lag = self.config.max_policy_lag
        return self.version - lag if lag > 0 else None

    def _sample(self):
        """A replay sample once the rate limiter allows it; None when it says wait or nothing is recent enough."""
        c = self.config
        if not self.limiter.acquire_sample(c.batch_size, timeout=SAMPLE_WAIT_SECONDS):
            return None
        with self.replay_lock:
            sample = self.step.sample(self._min_version())
        if sample is None:  # every item is past max_policy_lag: wait for fresh ones
            self.limiter.refund_sample(c.batch_size)
        return sample

    def _whole_step(self) -> bool:
        """Sample, update and set priorities in one go (the captured step), once the rate limiter allows."""
        c = self.config
        if not self.limiter.acquire_sample(c.batch_size, timeout=SAMPLE_WAIT_SECONDS):
            return False
        with self.replay_lock, self.update_lock:
            updated = self.step(self._min_version())
        if not updated:
            self.limiter.refund_sample(c.batch_size)
            return False
        self._updated()
        return True

    def _learn(self, sample) -> None:
        """One update on ``sample`` and its new priorities."""
        self.step.learn(sample, self.update_lock, self.replay_lock)
        self._updated()

    def _updated(self) -> None:
        """Count an update; a new version every publish_every, the metrics every METRICS_EVERY."""
        c = self.config
        self.updates += 1
        self.sample_meter.add(c.batch_size)
        if self.updates % c.publish_every == 0:
            self.version += 1
            self.publish()
        if self.updates % METRICS_EVERY == 0:
            metrics = self.step.read_metrics()
            self.telemetry.scalars({**metrics, **self.rates(), **self.roles.scalars()}, self.updates)

    def publish(self) -> None:
        """Hand the current policy to publishing as :attr:`version`: copied now without waiting, sent by the
        publisher thread."""
        self.publishing.publish(self.version, self.algorithm.policy_tensors())
