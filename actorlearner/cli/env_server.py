"""``actorlearner env-server``: serve an environment over env.proto, one instance per session."""

from __future__ import annotations

import threading

from actorlearner.cli.common import logger, metrics_port, on_signals, warn_if_exposed
from actorlearner.config import EnvServerConfig
from actorlearner.health import Health


def env_server_command(config: EnvServerConfig) -> int:
    """Serve ``config.env`` until SIGTERM/SIGINT (reported NOT_SERVING while closing); exit 0."""
    from actorlearner.envs import make_env
    from actorlearner.envs.server import serve

    warn_if_exposed(config.host, config.security)
    stop = threading.Event()
    on_signals(stop.set)
    health = Health()
    with serve(lambda: make_env(config.env), config.env, config.host, config.port, config.max_sessions,
               config.max_message_bytes, config.security, health) as (service, port), \
            metrics_port(config.host, config.metrics_port, service.metrics):
        health.set(True)
        print(f"env server listening on {config.host}:{port}", flush=True)
        # Timed: a signal the kernel hands to a gRPC thread does not wake a bare wait of the main thread, which
        # alone runs Python's handler (on its next bytecode); the server then never stopped.
        while not stop.wait(1.0):
            pass
        health.set(False)
        logger.info("stopping: closing sessions")
    return 0
