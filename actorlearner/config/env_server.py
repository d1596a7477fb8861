"""An env server's settings: the environment it serves over env.proto and its session limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorlearner.transport import SecurityConfig


@dataclass
class EnvServerConfig:
    """An env server: any environment behind env.proto's Environment service, one instance per session."""

    env: str = "CartPole-v1"
    """Environment to serve: a gymnasium id or package.module:function."""
    host: str = "127.0.0.1"
    """Address to listen on."""
    port: int = 50061
    """gRPC port; 0 picks a free one and prints it."""
    max_sessions: int = 64
    """Concurrent sessions (env instances); more are refused with RESOURCE_EXHAUSTED."""
    metrics_port: int = 0
    """Prometheus /metrics port, on host; 0 disables it."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Largest gRPC message accepted or sent."""
    security: SecurityConfig = field(default_factory=SecurityConfig, metadata={"flatten": True})
    """Bearer token and TLS."""

    def __post_init__(self):
        if self.env.startswith("grpc://"):
            raise ValueError(f"an env server serves a local environment, not {self.env}")
        if self.max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {self.max_sessions}")
