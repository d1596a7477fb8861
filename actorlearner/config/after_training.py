"""``actorlearner eval`` and ``export``'s settings: which checkpoint, on which env, and what to write."""

from __future__ import annotations

from dataclasses import dataclass

from actorlearner.config.options import comma_separated


def _require_checkpoint(checkpoint: str) -> None:
    if not checkpoint:
        raise ValueError("a checkpoint is required: --checkpoint (a run directory, a checkpoint directory or one "
                         "checkpoint)")


@dataclass
class EvalConfig:
    """Play a checkpoint's policy greedily and report its returns (a self-play policy: its games)."""

    checkpoint: str = ""
    """A run directory, a checkpoint directory (its newest usable one) or one checkpoint."""
    env: str = ""
    """Env to play; empty: the one it was trained on."""
    episodes: int = 20
    """Greedy episodes to play (a self-play policy: games against each opponent)."""
    envs: int = 4
    """Envs the episodes are spread over."""
    max_steps: int = 27_000
    """Steps after which an episode is cut, its return so far counted (a greedy policy may never end one); 0: no cut."""
    seed: int = 0
    """Env i is reset with seed + i."""
    json: bool = False
    """Print one JSON object instead of lines."""
    video: str = ""
    """Directory to record the first video_episodes episodes (env 0's, then env 1's, ...) in as MP4s, named env-I-episode-J.mp4; the env must render rgb_array frames. Empty records none."""
    video_episodes: int = 3
    """Episodes --video records."""
    opponents: str = ""
    """A self-play (multi-agent) policy: comma-separated scripted players (module:function) to play --episodes games against each, seats alternated."""

    def __post_init__(self):
        _require_checkpoint(self.checkpoint)
        if self.episodes < 1 or self.envs < 1 or self.video_episodes < 1:
            raise ValueError(f"need --episodes, --envs and --video-episodes >= 1, got {self.episodes}, {self.envs} "
                             f"and {self.video_episodes}")

    def opponent_names(self) -> list[str]:
        """The scripted players named by ``opponents``."""
        return comma_separated(self.opponents)


@dataclass
class ExportConfig:
    """Write a checkpoint's greedy policy as an ONNX file and FILE.json."""

    checkpoint: str = ""
    """A run directory, a checkpoint directory (its newest usable one) or one checkpoint."""
    out: str = ""
    """The ONNX file to write; its sidecar is FILE.json."""
    env: str = ""
    """Env whose spaces it takes; empty: the one it was trained on."""
    json: bool = False
    """Print one JSON object instead of lines."""

    def __post_init__(self):
        _require_checkpoint(self.checkpoint)
        if not self.out:
            raise ValueError("an output file is required: --out FILE.onnx")
