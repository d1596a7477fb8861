"""``actorlearner status`` and ``set``'s settings: which learner to ask, and how long to wait for it."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorlearner.transport import SecurityConfig


@dataclass
class StatusConfig:
    """Print a learner's status: counters, parameters, each actor's version and lag, the league."""

    learner: str = "127.0.0.1:50051"
    """Learner address HOST:PORT."""
    json: bool = False
    """Print one JSON object instead of a table."""
    timeout: float = 5.0
    """Seconds to wait for an answer."""
    security: SecurityConfig = field(default_factory=SecurityConfig, metadata={"flatten": True})
    """Bearer token and TLS."""


@dataclass
class SetConfig:
    """Change runtime parameters of a running learner (and its actors)."""

    learner: str = "127.0.0.1:50051"
    """Learner address HOST:PORT."""
    timeout: float = 5.0
    """Seconds to wait for an answer."""
    parameters: tuple[str, ...] = field(default=(), metadata={"option": False})
    """NAME=VALUE pairs, NAME an option flagged 'Changeable while training runs', without dashes."""
    security: SecurityConfig = field(default_factory=SecurityConfig, metadata={"flatten": True})
    """Bearer token and TLS."""

    def __post_init__(self):
        for assignment in self.parameters:
            name, equals, _ = assignment.partition("=")
            if not equals or not name.strip():
                raise ValueError(f"{assignment!r} is not NAME=VALUE")

    def assignments(self) -> list[tuple[str, str]]:
        """The (name, value) pairs to set, stripped."""
        return [(name.strip(), value.strip()) for name, _, value in (a.partition("=") for a in self.parameters)]
