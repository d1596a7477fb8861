"""``actorlearner actor``: run environments and stream their transitions to a learner."""

from __future__ import annotations

import logging
import os
import threading

from actorlearner.cli.common import logger, metrics_port, on_signals, started
from actorlearner.config import ActorConfig
from actorlearner.health import CONNECTED, Health
from actorlearner.lifeline import end_with_parent_from_env


def actor_command(config: ActorConfig) -> int:
    """Act until SIGTERM/SIGINT; then flush unacked batches and exit 0 (1 if it cannot stop within
    its flush and `STOP_MARGIN`: its children end with it).

    Exit 2, with one ERROR line and no traceback, if the actor cannot be built (an env that cannot
    be made, a vector mode that does not exist), or the learner refused this actor or sent settings
    or weights it cannot apply (``LinkError``).
    """
    from actorlearner.actor.actor import FLUSH_SECONDS, Actor
    from actorlearner.actor.link import LinkError

    end_with_parent_from_env()  # run's actors end with run, however it ends
    try:
        actor = Actor(config)
    except ValueError as exc:
        logger.error("cannot start the actor: %s", exc)
        return 2
    started()

    def stop() -> None:
        actor.stop()
        grace = FLUSH_SECONDS + STOP_MARGIN
        deadline = threading.Timer(grace, _give_up, args=(grace,))
        deadline.daemon = True
        deadline.start()

    on_signals(stop)
    health = Health()
    if config.health_port:
        health.listen(config.listen_host, config.health_port)
        health.set(True)
        threading.Thread(target=_report_connection, args=(actor, health), daemon=True, name="health").start()
    try:
        with metrics_port(config.listen_host, config.metrics_port, actor.metrics):
            actor.run()
    except LinkError as exc:
        logger.error("%s", exc)
        return 2
    finally:
        health.close()
    logger.info("actor %s stopped after %d env steps, %d batches", actor.actor_id, actor.env_steps, actor.batches_sent)
    return 0


STOP_MARGIN = 10.0
"""Seconds a stopping actor has, past its flush, to close its envs and exit before it exits at once."""


def _give_up(grace: float) -> None:
    """Exit now: a stopping actor outlived its grace (a child that stopped answering, say); its children end
    with it (`actorlearner.lifeline`)."""
    logger.error("the actor did not stop within %.0f s of being asked; exiting now", grace)
    logging.shutdown()
    os._exit(1)


def _report_connection(actor, health: Health) -> None:
    """Keep the actor's "connected" health service in step with its learner stream."""
    while not actor.stop_event.wait(0.5):
        health.set(actor.link.connected, CONNECTED)
