"""The learner's settings: replay, training, weight broadcast, checkpoints, evaluation, data-parallel ranks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from actorlearner.config.league import LeagueConfig
from actorlearner.config.options import RUNTIME
from actorlearner.transport import SecurityConfig


@dataclass
class LearnerConfig:
    """The learner server: replay, training, weight broadcast, checkpoints, evaluation."""

    env: str = "CartPole-v1"
    """Environment the actors must run: a gymnasium id, package.module:function, or grpc://host:port."""
    frame_stack: int = 0
    """Stack each observation with the frames before it (K >= 2; 0: off); each frame then travels and is stored once. Actors must stack the same."""
    host: str = "127.0.0.1"
    """Address to listen on. Binding anything but loopback exposes the learner."""
    port: int = 50051
    """gRPC port; 0 picks a free one and prints it."""
    algorithm: str = "dqn"
    """Learning algorithm: a registered name (dqn) or package.module:Name; its options follow, prefixed with its name."""
    preset: str = "auto"
    """Per-task tuned settings for options left unset (by flag, env var or TOML): auto takes the env id's own preset where the algorithm has one, none takes none, an env id takes that env's preset. The run's first lines show what a preset set."""
    preset_applied: dict = field(default_factory=dict, metadata={"option": False})
    """The settings the preset gave (option name -> value): what no flag, env var or TOML value replaced."""
    seed: int = 0
    """Seeds networks, sampling and evaluation."""
    device: str = "auto"
    """Torch device for the replay buffer and training; "auto" is cuda when available."""
    replay_capacity: int = 100_000
    """Transitions the prioritized replay buffer holds."""
    replay_frames: int = 0
    """With frame_stack: frames the replay keeps, each once; 0 keeps 1.25 per step its items hold. Too few drops the oldest items early."""
    batch_size: int = 128
    """Transitions per training update."""
    alpha: float = field(default=0.6, metadata=RUNTIME)
    """Priority exponent: 0 samples uniformly, 1 fully proportionally."""
    beta: float = field(default=0.4, metadata=RUNTIME)
    """Initial importance-sampling exponent, annealed to 1 over beta_steps updates."""
    beta_steps: int = 50_000
    """Updates over which beta anneals to 1."""
    min_replay_size: int = 2_000
    """Transitions stored before training starts."""
    samples_per_insert: float = field(default=8.0, metadata=RUNTIME)
    """Target ratio of sampled to inserted transitions; inserts wait (backpressure) above it."""
    rate_error_buffer: float = 50_000.0
    """Slack around samples_per_insert, in sampled transitions, before either side waits."""
    publish_every: int = field(default=20, metadata=RUNTIME)
    """Training updates between published policy versions."""
    max_updates: int = 0
    """Stop training after this many updates; 0 trains until stopped. A learner keeps serving; `run` ends once it has evaluated the last version (at once with --eval-every 0)."""
    max_policy_lag: int = field(default=0, metadata=RUNTIME)
    """Train only on transitions from at most this many versions ago; 0 disables the bound."""
    actor_batch_size: int = 256
    """Transitions per batch an actor streams."""
    max_unacked: int = 8
    """Batches an actor may have in flight without an ack."""
    codec: str = "msgpack"
    """Payload codec actors use: msgpack or msgpack+zlib."""
    actor_priorities: bool = True
    """Actors compute initial priorities (Ape-X); otherwise new items get the max priority."""
    num_actors: int = 2
    """Actors expected (per data-parallel rank); the algorithm spreads its exploration over this many actor indices (times the ranks)."""
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest gRPC message accepted or sent."""
    max_streams: int = 1024
    """Concurrent actor streams (Connect calls; coroutines on one event loop, not threads); more are refused with RESOURCE_EXHAUSTED."""
    hello_timeout: float = 10.0
    """Seconds a new stream may take to send its Hello before it is cancelled and its slot freed."""
    actor_ttl: float = 3600.0
    """Seconds a disconnected actor id (and its duplicate filter) is remembered; one back later is new. Keep it well above the actors' reconnect backoff."""
    chunk_bytes: int = 4 * 1024 * 1024
    """Policy updates larger than this are split into chunks."""
    checkpoint_dir: str = ""
    """Directory for checkpoints; empty disables them."""
    checkpoint_every: float = 60.0
    """Seconds between periodic checkpoints."""
    checkpoint_replay: bool = True
    """Include the replay buffer in checkpoints."""
    keep_checkpoints: int = 3
    """Checkpoints kept on disk."""
    eval_every: float = 10.0
    """Seconds between greedy evaluations on the learner; 0 disables them."""
    eval_episodes: int = 20
    """Episodes per evaluation."""
    eval_exploration: float = 0.0
    """The algorithm's exploration in evaluations (DQN's epsilon); 0 is greedy. A little (0.001, as Atari's DQN baselines use) ends games a greedy policy would stall, such as Breakout waiting for FIRE."""
    eval_envs: int = 10
    """Environments the evaluation episodes are spread over."""
    eval_max_steps: int = 27_000
    """Steps after which an evaluation episode is cut, its return so far counted (a greedy policy may never end one, as in MinAtar Seaquest); 27,000 is Atari's 108,000 frames; 0: no cut."""
    logdir: str = ""
    """TensorBoard log directory; empty disables logging."""
    torch_threads: int = 1
    """Torch intra-op threads (keep small: actors share the cores)."""
    metrics_port: int = 0
    """Prometheus /metrics port, on host; 0 disables it."""
    world_size: int = 0
    """Data-parallel learners training one model in lockstep, each with its own actors, replay shard and checkpoint_dir/rank-R; 0 takes WORLD_SIZE, else 1."""
    rank: int = -1
    """This learner's rank in [0, world_size); -1 takes RANK, else the -N suffix of HOSTNAME (a StatefulSet pod)."""
    dist_address: str = ""
    """HOST:PORT where rank 0 holds the data-parallel rendezvous; empty takes MASTER_ADDR:MASTER_PORT."""
    dist_timeout: float = 600.0
    """Seconds a data-parallel rank waits for the others (to join, in each lockstep round) before it fails."""
    league: LeagueConfig = field(default_factory=LeagueConfig)
    """Self-play settings (multi-agent envs)."""
    algorithm_config: Any = field(default=None, metadata={"option": False})
    """The algorithm's config dataclass, built from its options; None means its defaults."""
    security: SecurityConfig = field(default_factory=SecurityConfig, metadata={"flatten": True})
    """Bearer token and TLS."""


def learner_settings(config: LearnerConfig, algorithm_config: Any) -> dict[str, Any]:
    """The learner's settings and its algorithm's (as ``<algorithm>.<name>``), security left out: what a run
    records of how it trained."""
    settings = {name: value for name, value in dataclasses.asdict(config).items()
                if name not in ("security", "algorithm_config")}
    settings.update({f"{config.algorithm}.{name}": value for name, value in dataclasses.asdict(algorithm_config).items()})
    return settings
