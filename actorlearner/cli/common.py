"""What the commands share: signal handling, the metrics port, the exposure warning, one-line failures."""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import logging
import signal
import sys

from actorlearner.metrics import serve_metrics
from actorlearner.transport import SecurityConfig

logger = logging.getLogger("actorlearner")


def on_signals(handler) -> None:
    """Call ``handler()`` on SIGTERM and SIGINT."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: handler())


def started() -> None:
    """Call once a long-running command has built what it serves with. The objects start-up made (torch's
    import alone: some 400,000, which live as long as the process) go to the collector's permanent generation:
    a full collection then walks only what came after, not all of them (a fifth of a second each). Collection,
    off while the command started (:func:`actorlearner.cli.main`), is on again."""
    gc.freeze()
    gc.enable()


def failed(message: str, code: int = 1) -> int:
    """Say why a one-shot command failed, in one line on stderr, and return its exit code."""
    print(message, file=sys.stderr)
    return code


@contextlib.contextmanager
def metrics_port(host: str, port: int, read):
    """Serve Prometheus metrics on ``port`` for the duration of the block (nothing when 0)."""
    if not port:
        yield
        return
    server, bound = serve_metrics(host, port, read)
    logger.info("metrics on http://%s:%d/metrics", host, bound)
    try:
        yield
    finally:
        server.shutdown()


def warn_if_exposed(host: str, security: SecurityConfig) -> None:
    """Log loudly when a server listens beyond loopback with nothing keeping strangers out."""
    if not security.authenticated and not _is_loopback(host):
        logger.warning("!!! listening on %s WITHOUT AUTHENTICATION: every host that can reach it may connect; "
                       "set --auth-token-file (or ACTORLEARNER_AUTH_TOKEN) and TLS !!!", host)


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, ``localhost`` or a host name) surely binds loopback only.

    A host name other than localhost is not resolved: it may name any interface, so it counts as exposed.
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # "" and host names
        return False
