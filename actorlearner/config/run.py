"""``actorlearner run``'s settings: how many actors, when to stop, where the run's files go."""

from __future__ import annotations

from dataclasses import dataclass, field

from actorlearner.config.learner import LearnerConfig


@dataclass
class RunConfig:
    """One machine: a learner (serving on --host/--port, address printed) and N actor processes until solved, out of time, or trained --max-updates and evaluated."""

    actors: int = 2
    """Actor processes to start."""
    target_return: float = 475.0
    """Stop once the evaluated mean return reaches this (--target-holds evaluations in a row)."""
    target_holds: int = 1
    """Evaluations in a row at or above --target-return that solve the run; 2 or more ignore a single lucky one."""
    max_seconds: float = 600.0
    """Stop (unsolved) after this long."""
    num_envs: int = 4
    """Environments per actor."""
    vector_mode: str = "auto"
    """Each actor's --vector-mode: auto (ahead for a policy without memory and no self-play, else sync), sync, async, workers or ahead."""
    run_dir: str = ""
    """Where this run keeps its settings (settings.json, the preset included), checkpoints (checkpoints/), TensorBoard logs (tb/) and learning curve (curve.png), unless --checkpoint-dir or --logdir say otherwise; `actorlearner eval --checkpoint` reads it. Default: a new directory under runs/."""
    plot: bool = True
    """Write the learning curve (episode and eval returns against env steps and wall time) as curve.png in the run directory at the end."""
    learner: LearnerConfig = field(default_factory=LearnerConfig, metadata={"flatten": True})
    """Learner settings."""
