"""A relay's settings: its upstream, its own port and stream limits, and its reconnect backoff."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorlearner.transport import SecurityConfig


@dataclass
class RelayConfig:
    """A relay: serves actors as a learner does, over one stream to its upstream (a learner or another relay)."""

    upstream: str = "127.0.0.1:50051"
    """Address HOST:PORT of the learner, or of the next relay."""
    host: str = "127.0.0.1"
    """Address to listen on. Binding anything but loopback exposes the relay."""
    port: int = 50052
    """gRPC port; 0 picks a free one and prints it."""
    relay_id: str = ""
    """Id of the relay's stream in the learner's status; default HOSTNAME-relay-PID."""
    max_streams: int = 1024
    """Concurrent actor (or relay) streams (coroutines on one event loop, not threads); more are refused with RESOURCE_EXHAUSTED."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Largest gRPC message accepted or sent."""
    chunk_bytes: int = 4 * 1024 * 1024
    """Policy updates larger than this are split into chunks."""
    hello_timeout: float = 10.0
    """Seconds a new stream may take to send its Hello before it is cancelled and its slot freed."""
    reconnect_initial: float = 0.1
    """First delay in seconds before reconnecting upstream; doubles with jitter up to reconnect_max."""
    reconnect_max: float = 5.0
    """Longest delay in seconds before reconnecting upstream."""
    metrics_port: int = 0
    """Prometheus /metrics port, on host; 0 disables it."""
    security: SecurityConfig = field(default_factory=SecurityConfig, metadata={"flatten": True})
    """Bearer token and TLS, for the relay's own port and for its stream upstream alike."""
