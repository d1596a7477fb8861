"""The trainer: the one loop that samples, updates, sets new priorities and decides when to publish and
to checkpoint; data-parallel ranks agree on each round first."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from actorlearner import telemetry
from actorlearner.config import LearnerConfig
from actorlearner.learner.distributed import DataParallel, SingleRank
from actorlearner.learner.progress import Progress
from actorlearner.learner.publishing import Publishing
from actorlearner.learner.replay_service import ReplayService
from actorlearner.learner.step import LearnerStep
from actorlearner.metrics import Metric
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)

SAMPLE_WAIT_SECONDS = 0.2
"""How long one round waits for the rate limiter's leave to sample (and, training done, between rounds)."""
METRICS_EVERY = 100
"""Updates between metric reads (the one host read of the step's device work) and telemetry writes."""


class TrainingLoop:
    """Owns the algorithm; raises the policy version and update count in ``progress``; runs on its own
    thread (:meth:`run`) until ``stopping``.

    Each update holds ``update_lock`` (a runtime parameter change waits for it); the replay's buffer is
    touched only under its lock. ``config`` is the learner's, replaced when runtime parameters change.
    """

    def __init__(self, config: LearnerConfig, algorithm: Any, replay: ReplayService, publishing: Publishing,
                 data_parallel: SingleRank, progress: Progress, stopping: threading.Event):
        self.config, self.algorithm, self.replay, self.publishing = config, algorithm, replay, publishing
        self.roles = publishing.roles  # told of each version; data-parallel, they share state at agreed rounds
        self.data_parallel, self.progress, self.stopping = data_parallel, progress, stopping
        # Data-parallel ranks agree between the sample and the update: their steps run eagerly.
        self.step = LearnerStep(algorithm, replay.buffer, config.batch_size,
                                capture=False if isinstance(data_parallel, DataParallel) else None)
        self.update_lock = threading.Lock()
        self.sample_meter = telemetry.RateMeter()
        self.failed = threading.Event()  # training raised: the process should drain and exit non-zero
        progress.gauge(lambda: {telemetry.REPLAY_SAMPLE_RATE: self.sample_meter.rate()})

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
            training = not (limit and self.progress.updates >= limit)
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
        sample (else the sample's limiter credit is given back), stop if any is stopping, checkpoint
        if any's is due, and share the roles' state (the league's results) if any's is due or all
        stop. A sample given back this way still counts towards beta's annealing.
        """
        with self.replay.credit(self.config.batch_size, SAMPLE_WAIT_SECONDS) if train else _NO_CREDIT as credit:
            if credit and self.step.capture:  # one device program: nothing to agree on between its parts
                with self.replay.locked(), self.update_lock:
                    updated = self.step(self._min_version())
                if updated:
                    credit.spend()
                    self._updated()
                return self._agree(updated, checkpoint_due)
            sample = None
            if credit:
                with self.replay.locked():
                    sample = self.step.sample(self._min_version())  # None: every item is past max_policy_lag
            ready, stop, checkpoint_due = self._agree(sample is not None, checkpoint_due)
            if not ready:
                return False, stop, checkpoint_due
            credit.spend()
        self.step.learn(sample, self.update_lock, self.replay.locked())
        self._updated()
        return True, stop, checkpoint_due

    def _agree(self, ready: bool, checkpoint_due: bool) -> tuple[bool, bool, bool]:
        """(every rank ready, any stopping, any checkpoint due); the roles' state shared on the way."""
        ready, stop, checkpoint_due, share = self.data_parallel.agree(ready, self.stopping.is_set(), checkpoint_due,
                                                                      self.roles.share_due())
        if share or (stop and self.data_parallel.world.size > 1):
            self.roles.share(self.data_parallel.gather)
        return ready, stop, checkpoint_due

    def _min_version(self) -> int | None:
        lag = self.config.max_policy_lag
        return self.progress.version - lag if lag > 0 else None

    def _updated(self) -> None:
        """Count an update; a new version every publish_every, the metrics every METRICS_EVERY."""
        c, progress = self.config, self.progress
        progress.updates += 1
        self.sample_meter.add(c.batch_size)
        if progress.updates % c.publish_every == 0:
            progress.version += 1
            self.publish()
        if progress.updates % METRICS_EVERY == 0:
            progress.write_metrics(self.step.read_metrics())

    def publish(self) -> None:
        """Hand the current policy to publishing as the current version: copied now without waiting, sent by
        the publisher thread."""
        self.publishing.publish(self.progress.version, self.algorithm.policy_tensors())

    def retune(self, config: LearnerConfig, algorithm_config: Any) -> None:
        """Take runtime parameters between two updates."""
        with self.update_lock:
            self.algorithm.retune(algorithm_config)
        self.config = config

    def report(self, response: pb.StatusResponse) -> None:
        response.sample_rate = self.sample_meter.rate()

    def metrics(self) -> list[Metric]:
        return [Metric("samples_per_second", "Transitions sampled per second.", self.sample_meter.rate())]


_NO_CREDIT = contextlib.nullcontext(False)
"""A round that does not train asks for no leave to sample."""
