"""The training loop: rounds (:mod:`.round`) one after another on the trainer thread; between them it counts
updates, hands each new version to publishing, reads the metrics and checkpoints on schedule."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from actorlearner import telemetry
from actorlearner.algorithms import Trainer
from actorlearner.config import LearnerConfig
from actorlearner.learner.distributed import Ranks
from actorlearner.learner.progress import Progress
from actorlearner.learner.publishing import Publishing
from actorlearner.learner.replay_service import ReplayService
from actorlearner.learner.round import SAMPLE_WAIT_SECONDS, Outcome, TrainingRound
from actorlearner.learner.figures import Figure

logger = logging.getLogger(__name__)

METRICS_EVERY = 100
"""Updates between metric reads (the one host read of the step's device work) and telemetry writes."""


class TrainingLoop:
    """Runs the rounds of ``trainer`` on its own thread (:meth:`run`) until ``stopping``; raises the policy
    version and update count in ``progress``. ``config`` is the learner's, replaced when runtime
    parameters change.
    """

    def __init__(self, config: LearnerConfig, trainer: Trainer, replay: ReplayService, publishing: Publishing,
                 data_parallel: Ranks, progress: Progress, stopping: threading.Event):
        self.config, self.trainer, self.publishing = config, trainer, publishing
        self.data_parallel, self.progress, self.stopping = data_parallel, progress, stopping
        self.round = TrainingRound(trainer, replay, config.batch_size, data_parallel, publishing.roles, stopping)
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
            training = not (limit and self.progress.updates >= limit)
            outcome = self._round(training, due)
            if outcome.stop:
                if not self.stopping.is_set():
                    logger.info("rank %d: another rank is stopping; this one stops too", self.data_parallel.world.rank)
                    self.stopping.set()
                return
            if not training:
                self.stopping.wait(SAMPLE_WAIT_SECONDS)
            if outcome.checkpoint_due:
                last_checkpoint = time.monotonic()
                try:
                    checkpoint()
                except OSError as exc:  # e.g. a full disk: keep training, try again next period
                    logger.error("checkpoint failed: %s", exc)

    def train_step(self) -> bool:
        """One round that trains; False when the rate limiter says wait (data-parallel: when any rank's does,
        for every rank updates or none does)."""
        return self._round(True, False).updated

    def _round(self, train: bool, checkpoint_due: bool) -> Outcome:
        outcome = self.round(train, checkpoint_due, self._min_version())
        if outcome.updated:
            self._updated()
        return outcome

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
            progress.write_metrics(self.round.step.read_metrics())

    def publish(self) -> None:
        """Hand the current policy to publishing as the current version: copied now without waiting, sent by
        the publisher thread."""
        self.publishing.publish(self.progress.version, self.trainer.policy_tensors())

    def retune(self, config: LearnerConfig, algorithm_config: Any) -> None:
        """Take runtime parameters between two updates."""
        with self.round.update_lock:
            self.trainer.retune(algorithm_config)
        self.config = config

    def figures(self) -> list[Figure]:
        return [Figure(self.sample_meter.rate, "samples_per_second", "Transitions sampled per second.",
                       status="sample_rate", tag=telemetry.REPLAY_SAMPLE_RATE)]

