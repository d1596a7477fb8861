"""One training round: leave to sample -> the step's host half -> the ranks agree -> the update and its
new priorities. The same call runs eagerly or replays a captured step; the round chooses which once."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

from actorlearner.algorithms import Trainer
from actorlearner.learner.distributed import Ranks
from actorlearner.learner.replay_service import ReplayService
from actorlearner.learner.roles import Roles
from actorlearner.learner.step import LearnerStep

SAMPLE_WAIT_SECONDS = 0.2
"""How long one round waits for the rate limiter's leave to sample."""


@dataclass(frozen=True)
class Outcome:
    """What a round did and what the ranks agreed on."""

    updated: bool
    stop: bool  # any rank is stopping
    checkpoint_due: bool  # any rank's checkpoint is due


class TrainingRound:
    """``round(train, checkpoint_due, min_policy_version)`` is one round.

    Data-parallel, the ranks first agree in one all-reduce: update only if every rank has a sample (else
    the limiter's leave is given back), stop if any is stopping, checkpoint if any's is due, and share the
    roles' state (the league's results) if any's is due or all stop. A round runs as one captured device
    step where the ranks allow it (:attr:`~.distributed.SingleRank.captures`) and the step can. Each update holds
    :attr:`update_lock` (a runtime parameter change waits for it).
    """

    def __init__(self, trainer: Trainer, replay: ReplayService, batch_size: int, data_parallel: Ranks,
                 roles: Roles, stopping: threading.Event):
        self.replay, self.batch_size, self.data_parallel = replay, batch_size, data_parallel
        self.roles, self.stopping = roles, stopping
        self.step = LearnerStep(trainer, replay, batch_size,
                                capture=None if data_parallel.captures else False)
        self.update_lock = threading.Lock()

    def __call__(self, train: bool, checkpoint_due: bool, min_policy_version: int | None) -> Outcome:
        with self.replay.credit(self.batch_size, SAMPLE_WAIT_SECONDS) if train else _NO_CREDIT as credit:
            prepared = self.step.prepare(min_policy_version) if credit else None  # None: nothing recent enough
            ready, stop, checkpoint_due = self._agree(prepared is not None, checkpoint_due)
            if not ready:
                return Outcome(False, stop, checkpoint_due)
            credit.spend()
        with self.update_lock:
            self.step.run(prepared)
        return Outcome(True, stop, checkpoint_due)

    def _agree(self, ready: bool, checkpoint_due: bool) -> tuple[bool, bool, bool]:
        """(every rank ready, any stopping, any checkpoint due); the roles' state shared on the way."""
        ready, stop, checkpoint_due, share = self.data_parallel.agree(ready, self.stopping.is_set(), checkpoint_due,
                                                                      self.roles.share_due())
        if share or (stop and self.data_parallel.world.size > 1):
            self.roles.share(self.data_parallel.gather)
        return ready, stop, checkpoint_due


_NO_CREDIT = contextlib.nullcontext(False)
"""A round that does not train asks for no leave to sample."""
