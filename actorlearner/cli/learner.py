"""``actorlearner learner``: serve actors (replay, training, weight broadcast) until stopped."""

from __future__ import annotations

import threading
import time

from actorlearner.cli.common import logger, metrics_port, on_signals, started, warn_if_exposed
from actorlearner.config import LearnerConfig, presets
from actorlearner.health import Health
from actorlearner.telemetry import format_progress

PROGRESS_SECONDS = 5.0
"""Seconds between the progress lines a learner logs."""


def learner_command(config: LearnerConfig) -> int:
    """Serve until SIGTERM/SIGINT (exit 0) or a training failure (exit 1); then report NOT_SERVING,
    stop accepting, checkpoint."""
    from actorlearner.learner.server import serve

    warn_if_exposed(config.host, config.security)
    learner = start_learner(config)  # restores the newest good checkpoint, buffer included
    if learner is None:
        return 2
    started()
    stop = threading.Event()
    on_signals(stop.set)
    health = Health()
    with serve(learner, config.host, config.port, health=health) as port, \
            metrics_port(config.host, config.metrics_port, learner.metrics):
        learner.start()
        health.set(True)
        print(f"learner listening on {config.host}:{port}", flush=True)
        last_progress = time.monotonic()
        # Polled often: a training failure or another rank's stop ends the learner at once, not at the next log line.
        while not (stop.wait(0.5) or learner.failed.is_set() or learner.stopping.is_set()):
            if time.monotonic() - last_progress >= PROGRESS_SECONDS:
                last_progress = time.monotonic()
                logger.info("%s", format_progress(learner.summary()))
        health.set(False)  # draining: probes see NOT_SERVING while the final checkpoint is written
        logger.info("stopping: actors told to go, final checkpoint")
        learner.stop()
    return 1 if learner.failed.is_set() else 0


def start_learner(config: LearnerConfig):
    """The learner, or None after one ERROR line saying why it cannot be built (an env space the
    algorithm cannot learn from, an unknown algorithm, bad settings); no traceback."""
    from actorlearner.learner.learner import Learner

    if config.preset_applied:
        logger.info("preset %s for %s: %s (a flag, env var or TOML value overrides any; --preset none drops them)",
                    config.preset if config.preset != presets.AUTO else config.env, config.algorithm,
                    presets.describe(config.preset_applied))
    try:
        return Learner(config)
    except ValueError as exc:
        logger.error("cannot start the learner: %s", exc)
        return None
