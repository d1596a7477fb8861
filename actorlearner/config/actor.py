"""An actor process's settings: its envs, its learner link and its health and metrics ports."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorlearner.transport import SecurityConfig


@dataclass
class ActorConfig:
    """An actor process: env loop, local policy, streaming client."""

    learner: str = "127.0.0.1:50051"
    """Learner address HOST:PORT."""
    env: str = "CartPole-v1"
    """Environment to run: a gymnasium id, package.module:function, or grpc://host:port."""
    frame_stack: int = 0
    """Stack each observation with the frames before it (K >= 2; 0: off); each frame then travels and is stored once. The learner must stack the same."""
    actor_id: str = ""
    """Stable id across reconnects; default HOSTNAME-PID."""
    num_envs: int = 4
    """Environments in this actor's vector env."""
    vector_mode: str = "auto"
    """Vector env: auto (ahead for a policy without memory and no self-play, else sync; chosen once the learner names the algorithm, and logged), sync (one process), async (a subprocess per env), workers (two worker processes, each stepping half the envs while the policy acts on the other half) or ahead (one process acts and steps, a few steps ahead, while this one assembles and streams; no self-play, no recurrent policy)."""
    seed: int = 0
    """Seeds the envs and exploration."""
    profile_file: str = ""
    """Write where the env loop's time went (JSON: microseconds per env step by section) to this file on exit."""
    stats_every: float = 1.0
    """Seconds between episode statistics reports."""
    reconnect_initial: float = 0.1
    """First reconnect delay in seconds; doubles with jitter up to reconnect_max."""
    reconnect_max: float = 5.0
    """Longest reconnect delay in seconds."""
    max_message_bytes: int = 64 * 1024 * 1024
    """Largest gRPC message accepted."""
    torch_threads: int = 1
    """Torch intra-op threads."""
    listen_host: str = "127.0.0.1"
    """Address the health and metrics ports listen on (0.0.0.0 in a pod, for probes and scrapes)."""
    health_port: int = 0
    """gRPC health port (grpc.health.v1; service "connected" while streaming); 0 disables it."""
    metrics_port: int = 0
    """Prometheus /metrics port, on listen_host; 0 disables it."""
    security: SecurityConfig = field(default_factory=SecurityConfig, metadata={"flatten": True})
    """Bearer token and TLS."""
