"""Dataclass configs: one source for CLI flags, TOML files and ``ACTORLEARNER_*`` env vars.

Each field's docstring (the string literal under it) is its help text. A nested dataclass
field becomes a group of options prefixed with its name unless it is marked ``flatten``.
The algorithm named by ``--algorithm`` adds its own config dataclass as such a group
(``--dqn-lr``, ``ACTORLEARNER_DQN_LR``, TOML table ``[dqn]``), and its ``learner_defaults``
replace the learner's own defaults: see :func:`all_options` and :func:`build`. A field marked
``option: False`` is set by the program, never by the user. Precedence: command-line flag,
then environment variable, then TOML file, then the algorithm's learner default, then default.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import os
import textwrap
import tomllib
import typing
from dataclasses import dataclass, field
from typing import Any

from actorlearner.transport import SecurityConfig

ENV_PREFIX = "ACTORLEARNER_"

RUNTIME = {"runtime": True}
"""Field metadata of an option that may change while training runs (``actorlearner set``)."""


def runtime_options(cls: type) -> tuple[str, ...]:
    """The fields of config dataclass ``cls`` marked `RUNTIME`."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.metadata.get("runtime"))


@dataclass
class LeagueConfig:
    """Self-play, used when the env has several agents: the league of opponents and its ratings."""

    snapshot_every: int = 10
    """Policy versions between snapshots of the learning policy taken into the league."""
    max_snapshots: int = 20
    """Snapshots the league keeps; past it one is dropped (see drop)."""
    drop: str = "oldest"
    """Which snapshot a full league drops: oldest, or weakest (the lowest rated)."""
    sampling: str = "pfsp"
    """How actors draw opponents: uniform, or pfsp (prioritized fictitious self-play: those the learning policy beats less often, more often)."""
    pfsp_power: float = 2.0
    """PFSP weighting: an opponent beaten at rate p is drawn in proportion to (1 - p) ** pfsp_power."""
    self_play: float = 0.2
    """Share of games against the current policy itself (every game while the league is empty)."""
    scripted: str = ""
    """Comma-separated scripted players (module:function) always in the league; function(observation_space, action_space, seed) returns a callable observation -> action."""
    opponent_exploration: float = 0.05
    """Exploration the algorithm acts with for snapshot opponents and the current policy as an opponent."""
    elo_k: float = 16.0
    """Elo K-factor: the most a rating moves in one game."""
    eval_scripted: str = ""
    """Comma-separated scripted players (module:function) the evaluator plays besides those in the league; never trained against."""
    eval_games: int = 20
    """Evaluation games against each scripted player and each sampled snapshot, seats alternated."""
    eval_snapshots: int = 3
    """League snapshots sampled (newest first) for each evaluation."""

    def __post_init__(self):
        if self.snapshot_every < 1 or self.max_snapshots < 1:
            raise ValueError("league snapshot_every and max_snapshots must be >= 1")
        if self.drop not in ("oldest", "weakest"):
            raise ValueError(f"league drop must be oldest or weakest, got {self.drop!r}")
        if self.sampling not in ("uniform", "pfsp"):
            raise ValueError(f"league sampling must be uniform or pfsp, got {self.sampling!r}")
        if not 0.0 <= self.self_play <= 1.0:
            raise ValueError(f"league self_play must be in [0, 1], got {self.self_play}")
        if self.eval_games < 0 or self.eval_snapshots < 0 or self.elo_k <= 0 or self.pfsp_power < 0:
            raise ValueError("league eval_games and eval_snapshots must be >= 0, elo_k > 0, pfsp_power >= 0")

    def scripted_players(self) -> list[str]:
        """The scripted players in the league."""
        return _names(self.scripted)

    def evaluated_players(self) -> list[str]:
        """The scripted players the evaluator plays: the league's, then the evaluation-only ones."""
        league = self.scripted_players()
        return league + [name for name in _names(self.eval_scripted) if name not in league]


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


@dataclass
class LearnerConfig:
    """The learner server: replay, training, weight broadcast, checkpoints, evaluation."""

    env: str = "CartPole-v1"
    """Environment the actors must run: a gymnasium id, package.module:function, or grpc://host:port."""
    host: str = "127.0.0.1"
    """Address to listen on. Binding anything but loopback exposes the learner."""
    port: int = 50051
    """gRPC port; 0 picks a free one and prints it."""
    algorithm: str = "dqn"
    """Learning algorithm: a registered name (dqn) or package.module:Name; its options follow, prefixed with its name."""
    seed: int = 0
    """Seeds networks, sampling and evaluation."""
    device: str = "auto"
    """Torch device for the replay buffer and training; "auto" is cuda when available."""
    replay_capacity: int = 100_000
    """Transitions the prioritized replay buffer holds."""
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
    """Stop training after this many updates and keep serving; 0 trains until stopped."""
    max_policy_lag: int = field(default=0, metadata=RUNTIME)
    """Train only on transitions from at most this many versions ago; 0 disables the bound."""
    actor_batch_size: int = 64
    """Transitions per batch an actor streams."""
    max_unacked: int = 8
    """Batches an actor may have in flight without an ack."""
    codec: str = "msgpack"
    """Payload codec actors use: msgpack or msgpack+zlib."""
    actor_priorities: bool = True
    """Actors compute initial priorities (Ape-X); otherwise new items get the max priority."""
    num_actors: int = 2
    """Actors expected; the algorithm spreads its exploration over this many actor indices."""
    max_message_bytes: int = 16 * 1024 * 1024
    """Largest gRPC message accepted or sent."""
    max_streams: int = 64
    """Concurrent actor streams (Connect calls); more are refused with RESOURCE_EXHAUSTED."""
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
    eval_envs: int = 10
    """Environments the evaluation episodes are spread over."""
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


@dataclass
class ActorConfig:
    """An actor process: env loop, local policy, streaming client."""

    learner: str = "127.0.0.1:50051"
    """Learner address HOST:PORT."""
    env: str = "CartPole-v1"
    """Environment to run: a gymnasium id, package.module:function, or grpc://host:port."""
    actor_id: str = ""
    """Stable id across reconnects; default HOSTNAME-PID."""
    num_envs: int = 4
    """Environments in this actor's vector env."""
    vector_mode: str = "sync"
    """Vector env: sync (one process) or async (a subprocess per env)."""
    seed: int = 0
    """Seeds the envs and exploration."""
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
    max_streams: int = 256
    """Concurrent actor (or relay) streams; more are refused with RESOURCE_EXHAUSTED."""
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


@dataclass
class RunConfig:
    """One machine: a learner and N actor processes on loopback until solved or out of time."""

    actors: int = 2
    """Actor processes to start."""
    target_return: float = 475.0
    """Stop once the evaluated mean return reaches this."""
    max_seconds: float = 600.0
    """Stop (unsolved) after this long."""
    num_envs: int = 4
    """Environments per actor."""
    run_dir: str = ""
    """Where this run keeps its checkpoints (checkpoints/), TensorBoard logs (tb/) and learning curve (curve.png), unless --checkpoint-dir or --logdir say otherwise; `actorlearner eval --checkpoint` reads it. Default: a new directory under runs/."""
    plot: bool = True
    """Write the learning curve (episode and eval returns against env steps and wall time) as curve.png in the run directory at the end."""
    learner: LearnerConfig = field(default_factory=LearnerConfig, metadata={"flatten": True})
    """Learner settings."""


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each field of a dataclass and of the dataclasses it extends."""
    docs = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)):
                docs[node.target.id] = " ".join(str(nxt.value.value).split())
    return docs


@dataclass(frozen=True)
class Option:
    """One leaf setting: where it lives in the nested config and how it is spelled."""

    path: tuple[str, ...]
    flag: str
    env_var: str
    kind: Any
    default: Any
    help: str


def options(cls: type, prefix: str = "", path: tuple[str, ...] = ()) -> list[Option]:
    """Every leaf option of a config class, nested ones included."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.metadata.get("option") is False:
            continue
        kind = hints[f.name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(kind):
            sub = prefix if f.metadata.get("flatten") else f"{prefix}{f.name}-"
            out += options(kind, sub, path + (f.name,))
            continue
        name = f"{prefix}{f.name}".replace("_", "-")
        help_text = docs.get(f.name, "")
        if f.metadata.get("runtime"):
            help_text += " Changeable while training runs (`actorlearner set`)."
        out.append(Option(path + (f.name,), f"--{name}", ENV_PREFIX + name.replace("-", "_").upper(),
                          kind, default, help_text))
    return out


def add_arguments(parser: argparse.ArgumentParser, cls: type, algorithm: type | None = None) -> None:
    """Add ``--config`` and one flag per option of ``cls`` (defaults left to :func:`build`), and of
    ``algorithm``'s config (prefixed with its name) when ``cls`` holds a learner."""
    parser.add_argument("--config", help="TOML file with settings (flags and env vars override it)")
    defaults = algorithm_defaults(cls, algorithm)
    for opt in all_options(cls, algorithm):
        default = show_value(defaults.get(opt.path, opt.default))
        parser.add_argument(opt.flag, dest=_dest(opt), default=None, metavar=_metavar(opt.kind),
                            help=f"{opt.help} [default: {default}; env {opt.env_var}]")
        if opt.kind is bool:
            parser.add_argument(f"--no-{opt.flag[2:]}", dest=_dest(opt), action="store_const", const=False,
                                help=f"the same as {opt.flag} false")


def all_options(cls: type, algorithm: type | None = None) -> list[Option]:
    """Every option of ``cls`` and, when it holds a learner, of ``algorithm``'s config (TOML paths under its name)."""
    if algorithm is None or _learner_path(cls) is None:
        return options(cls)
    return options(cls) + options(algorithm.config_class, f"{algorithm.name}-", (algorithm.name,))


def algorithm_defaults(cls: type, algorithm: type | None) -> dict[tuple[str, ...], Any]:
    """``algorithm``'s ``learner_defaults`` keyed by their option paths in ``cls``; ValueError names an
    entry that is no learner option."""
    path = _learner_path(cls)
    wanted = dict(getattr(algorithm, "learner_defaults", None) or {}) if path is not None else {}
    learner_options = {opt.path[-1] for opt in options(LearnerConfig)}
    unknown = sorted(set(wanted) - learner_options)
    if unknown:
        raise ValueError(f"algorithm {algorithm.name}: learner_defaults names no learner option: {', '.join(unknown)}")
    prefix = (path,) if path else ()
    return {prefix + (name,): value for name, value in wanted.items()}


def build(cls: type, args: argparse.Namespace | None = None, environ: typing.Mapping[str, str] | None = None,
          algorithm: type | None = None):
    """Make a ``cls`` from flags, env vars and the TOML file named by ``--config``.

    With ``algorithm`` (when ``cls`` holds a learner), the learner's ``algorithm_config`` is
    built the same way from the algorithm's prefixed options and its TOML table.
    """
    environ = os.environ if environ is None else environ
    table: dict = {}
    if args is not None and getattr(args, "config", None):
        with open(args.config, "rb") as fh:
            table = tomllib.load(fh)
    config = _build(cls, "", args, environ, table, algorithm_defaults(cls, algorithm))
    path = _learner_path(cls)
    if algorithm is None or path is None:
        return config
    sub = table.get(algorithm.name, {})
    algorithm_config = _build(algorithm.config_class, f"{algorithm.name}-", args, environ,
                              sub if isinstance(sub, dict) else {}, {})
    if not path:
        return dataclasses.replace(config, algorithm_config=algorithm_config)
    learner = dataclasses.replace(getattr(config, path), algorithm_config=algorithm_config)
    return dataclasses.replace(config, **{path: learner})


def algorithm_name(argv: typing.Sequence[str], environ: typing.Mapping[str, str] | None = None) -> str:
    """The ``--algorithm`` a command line asks for: flag, env var, TOML ``--config``, else the default."""
    environ = os.environ if environ is None else environ
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--algorithm")
    pre.add_argument("--config")
    known, _ = pre.parse_known_args(list(argv))
    if known.algorithm:
        return known.algorithm
    if "ACTORLEARNER_ALGORITHM" in environ:
        return environ["ACTORLEARNER_ALGORITHM"]
    if known.config and os.path.exists(known.config):
        with open(known.config, "rb") as fh:
            name = tomllib.load(fh).get("algorithm")
        if isinstance(name, str):
            return name
    return LearnerConfig.algorithm


def _learner_path(cls: type) -> str | None:
    """Where ``cls`` keeps its LearnerConfig: "" when it is one, a field name, or None."""
    if cls is LearnerConfig:
        return ""
    return next((f.name for f in dataclasses.fields(cls) if typing.get_type_hints(cls)[f.name] is LearnerConfig), None)


def _build(cls: type, prefix: str, args: argparse.Namespace | None, environ: typing.Mapping[str, str], table: dict,
           defaults: dict[tuple[str, ...], Any]):
    values: dict[tuple[str, ...], Any] = dict(defaults)
    for opt in options(cls, prefix):
        raw = getattr(args, _dest(opt), None) if args is not None else None
        source = opt.flag
        if raw is None and opt.env_var in environ:
            raw, source = environ[opt.env_var], opt.env_var
        if raw is None:
            raw, source = _lookup(table, opt.path, cls), f"{args.config if args else ''}:{'.'.join(opt.path)}"
        if raw is not None:
            values[opt.path] = parse_value(raw, opt.kind, source)
    return _assemble(cls, values, ())


def _assemble(cls: type, values: dict, path: tuple[str, ...]):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _assemble(hints[f.name], values, path + (f.name,))
        elif path + (f.name,) in values:
            kwargs[f.name] = values[path + (f.name,)]
    return cls(**kwargs)


def _lookup(table: dict, path: tuple[str, ...], cls: type):
    """Find a value in a TOML table; flattened groups read from the enclosing table."""
    node: Any = table
    for i, part in enumerate(path):
        if i < len(path) - 1 and _is_flattened(cls, path[: i + 1]):
            continue
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _is_flattened(cls: type, path: tuple[str, ...]) -> bool:
    for part in path:
        f = {f.name: f for f in dataclasses.fields(cls)}[part]
        cls = typing.get_type_hints(cls)[part]
    return bool(f.metadata.get("flatten"))


def parse_value(raw: Any, kind: Any, source: str) -> Any:
    """Convert a flag, env var or TOML value to the field's type; name the source on error."""
    try:
        if typing.get_origin(kind) is tuple:
            (item, _) = typing.get_args(kind)
            parts = raw if isinstance(raw, (list, tuple)) else [p for p in str(raw).split(",") if p.strip()]
            return tuple(item(p) for p in parts)
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        return kind(raw)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{source}: {exc}") from None


def _dest(opt: Option) -> str:
    return opt.flag[2:].replace("-", "_")


def _metavar(kind: Any) -> str:
    if typing.get_origin(kind) is tuple:
        return "N,N,..."
    return {int: "N", float: "X", bool: "BOOL", str: "TEXT"}.get(kind, "VALUE")


def show_value(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return repr(value) if isinstance(value, str) else str(value)


def markdown_table(cls: type, prefix: str = "") -> str:
    """The options of ``cls`` (flags prefixed with ``prefix``) as a Markdown table, for the README."""
    rows = ["| flag | env var | default | meaning |", "|---|---|---|---|"]
    for opt in options(cls, prefix):
        rows.append(f"| `{opt.flag}` | `{opt.env_var}` | `{show_value(opt.default)}` | {opt.help} |")
    return "\n".join(rows)
