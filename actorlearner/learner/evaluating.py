"""The learner's periodic evaluation of its latest published policy, and the best policy's checkpoint."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from typing import Any

from actorlearner import telemetry, wire
from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.evaluation import EvalResult, evaluate
from actorlearner.streaming.broadcast import PolicyBroadcast
from actorlearner.learner.ingest import Ingest
from actorlearner.learner.roles import Roles
from actorlearner.learner.trainer import TrainingLoop

logger = logging.getLogger(__name__)


class Evaluation:
    """Greedy episodes (or the roles' own games) with ``policy``, a CPU twin that loads each version from
    the same bytes the actors get; every ``eval_every`` seconds on its own thread (:meth:`run`)."""

    def __init__(self, config: LearnerConfig, policy: Any, broadcast: PolicyBroadcast, training: TrainingLoop,
                 ingestion: Ingest, roles: Roles, telemetry_writer: telemetry.Telemetry,
                 checkpoints: CheckpointStore | None, run_record: Callable[[], dict]):
        self.config, self.policy, self.broadcast = config, policy, broadcast
        self.training, self.ingestion, self.roles, self.telemetry = training, ingestion, roles, telemetry_writer
        self.checkpoints, self.run_record = checkpoints, run_record
        self.evaluations = 0
        self.mean = math.nan
        self.best = -math.inf

    def evaluate(self) -> EvalResult:
        """Evaluate the latest published policy; a new best one goes to the checkpoints' ``best/`` slot."""
        c, policy = self.config, self.policy
        policy.load_policy_state_dict(wire.decode_state_dict(self.broadcast.payload))
        seed = c.seed + 10_000 * self.evaluations
        result = self.roles.evaluate(policy, seed, self.ingestion.env_steps)
        if result is None:
            result = evaluate(lambda obs: policy.act(obs, c.eval_exploration),
                              lambda: make_env(c.env, c.security, frame_stack=c.frame_stack), c.eval_episodes,
                              c.eval_envs, seed, policy.reset_memory)
        self.evaluations += 1
        self.mean = result.mean
        self.telemetry.scalars({telemetry.EVAL_MEAN_RETURN: result.mean, telemetry.EVAL_STD_RETURN: result.std},
                               self.ingestion.env_steps)
        if result.mean > self.best:
            self.best = result.mean
            if self.checkpoints:
                self.checkpoints.save_best({"policy": policy.policy_state_dict(), "run": self.run_record()},
                                           result.mean, step=self.training.version)
        return result

    def run(self, stopping: threading.Event) -> None:
        """Evaluate every ``eval_every`` seconds once training has begun, until ``stopping``."""
        while not stopping.wait(self.config.eval_every):
            if self.training.updates == 0:
                continue
            try:
                result = self.evaluate()
            except (RuntimeError, ValueError, OSError) as exc:  # e.g. a remote env refused a session
                logger.warning("evaluation failed, trying again in %.0f s: %s", self.config.eval_every, exc)
                continue
            logger.info("eval after %d updates (version %d): mean %.1f std %.1f min %.0f max %.0f",
                        self.training.updates, self.training.version, result.mean, result.std, result.min, result.max)
            self.roles.evaluated()
