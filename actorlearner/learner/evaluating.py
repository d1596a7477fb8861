"""The learner's periodic evaluation of its latest published policy, and the best policy's checkpoint."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from actorlearner import telemetry, wire
from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.evaluation import EvalResult, evaluate
from actorlearner.learner.checkpointing import Checkpointing
from actorlearner.learner.figures import Figure
from actorlearner.learner.progress import Progress
from actorlearner.learner.publishing import Publishing
from actorlearner.learner.roles import Roles

logger = logging.getLogger(__name__)


class Evaluation:
    """Greedy episodes (or the roles' own games) with ``policy``, a CPU twin that loads each version from
    the same bytes the actors get; every ``eval_every`` seconds on its own thread (:meth:`run`). A new
    best policy goes to the checkpoints' best slot."""

    def __init__(self, config: LearnerConfig, policy: Any, publishing: Publishing, roles: Roles,
                 progress: Progress, checkpoints: Checkpointing):
        self.config, self.policy, self.publishing = config, policy, publishing
        self.roles, self.progress, self.checkpoints = roles, progress, checkpoints
        self.evaluations = 0
        self.version = -1  # the policy version the latest evaluation played
        self.mean = math.nan
        self.best = math.nan  # the best mean so far

    def evaluate(self) -> EvalResult:
        """Evaluate the latest published policy; a new best one goes to the checkpoints' ``best/`` slot."""
        c, policy = self.config, self.policy
        version, payload = self.publishing.latest_state_dict()
        policy.load_policy_state_dict(wire.decode_state_dict(payload))
        seed = c.seed + 10_000 * self.evaluations
        env_steps = self.progress.env_steps
        result = self.roles.evaluate(policy, seed, env_steps)
        if result is None:
            result = evaluate(lambda obs: policy.act(obs, c.eval_exploration),
                              lambda: make_env(c.env, c.security, frame_stack=c.frame_stack), c.eval_episodes,
                              c.eval_envs, seed, policy.reset_memory, max_steps=c.eval_max_steps)
        self.evaluations += 1
        self.version, self.mean = version, result.mean
        self.progress.telemetry.scalars({telemetry.EVAL_MEAN_RETURN: result.mean,
                                         telemetry.EVAL_STD_RETURN: result.std}, env_steps)
        if math.isnan(self.best) or result.mean > self.best:
            self.best = result.mean
            self.checkpoints.save_best(policy.policy_state_dict(), result.mean, self.progress.version)
        return result

    def run(self, stopping: threading.Event) -> None:
        """Evaluate every ``eval_every`` seconds once training has begun, until ``stopping``."""
        while not stopping.wait(self.config.eval_every):
            if self.progress.updates == 0:
                continue
            try:
                result = self.evaluate()
            except (RuntimeError, ValueError, OSError) as exc:  # e.g. a remote env refused a session
                logger.warning("evaluation failed, trying again in %.0f s: %s", self.config.eval_every, exc)
                continue
            logger.info("eval after %d updates (version %d): mean %.1f std %.1f min %.0f max %.0f",
                        self.progress.updates, self.progress.version, result.mean, result.std, result.min, result.max)
            self.roles.evaluated()

    def figures(self) -> list[Figure]:
        return [
            Figure(lambda: self.evaluations, status="evaluations"),
            Figure(lambda: self.mean, "eval_mean_return", "Mean return of the last greedy evaluation (NaN before any).",
                   status="eval_mean_return"),
            Figure(lambda: self.best, status="eval_best_return"),
        ]
