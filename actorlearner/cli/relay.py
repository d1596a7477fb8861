"""``actorlearner relay``: serve actors as a learner does, over one stream to the learner."""

from __future__ import annotations

import threading

from actorlearner.cli.common import logger, metrics_port, on_signals, warn_if_exposed
from actorlearner.config import RelayConfig
from actorlearner.health import Health


def relay_command(config: RelayConfig) -> int:
    """Relay actors to ``config.upstream`` until SIGTERM/SIGINT (exit 0), or exit 2 if the upstream
    refuses the relay for good. Health is SERVING while the upstream stream is up."""
    from actorlearner.relay.server import serve

    warn_if_exposed(config.host, config.security)
    stop = threading.Event()
    on_signals(stop.set)
    health = Health()
    with serve(config, health) as (relay, port), metrics_port(config.host, config.metrics_port, relay.metrics):
        print(f"relay listening on {config.host}:{port}", flush=True)
        while not stop.wait(1.0) and not relay.failed.is_set():
            pass  # health follows the upstream as it goes up and down (the relay tells it)
        health.set(False)
    if relay.error is not None:
        logger.error("%s", relay.error)
        return 2
    return 0
