"""The learner's state and work: ingest batches exactly once, train, publish, evaluate, checkpoint."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import shutil
import threading
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from actorlearner import specs, telemetry, wire
from actorlearner.algorithms import config_json, make_config, resolve, retune
from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.envs.multiagent import is_multi_agent, seat_spaces
from actorlearner.learner.checkpoint import CheckpointError, CheckpointStore, load_rng_state, rng_state
from actorlearner.learner.distributed import DataParallel, local_device, resolve_world
from actorlearner.learner.evaluator import EvalResult, evaluate
from actorlearner.learner.onnx_feed import OnnxFeed
from actorlearner.learner.parameters import Change, ParameterError, current_values, plan
from actorlearner.league import League
from actorlearner.league.evaluation import evaluate_league
from actorlearner.league.opponents import load_scripted
from actorlearner.metrics import Metric
from actorlearner.replay import NothingRecentEnough, PrioritizedReplay, RateLimiter
from actorlearner.streaming.broadcast import ONNX_FORMAT, PolicyBroadcast
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)


LIMITER_POLL_SECONDS = 0.25
"""How often a batch waiting on the rate limiter checks whether its stream or the learner ended."""


@dataclass
class ActorRecord:
    """What the learner knows of one actor id, across reconnects, until it has been gone ``actor_ttl``."""

    actor_id: str
    index: int | None = None  # Ape-X index, distinct among connected actors; kept as a preference after
    policy_version: int = -1
    streams: int = 0  # open streams: a reconnect may open the new one before the old one closes
    last_seen: float = field(default_factory=time.time)
    duplicates: int = 0  # batches acked as duplicates, over all streams
    transitions: int = 0  # stored from this actor
    batches: telemetry.RateMeter = field(default_factory=telemetry.RateMeter)  # stored batches; .total counts them
    via: str = ""  # the relay its newest stream comes through; empty if direct
    relay: bool = False  # a relay's own stream: it takes no Ape-X index

    @property
    def connected(self) -> bool:
        return self.streams > 0


@dataclass
class ActorStream:
    """One Connect stream of an actor, as ingest sees it."""

    record: ActorRecord
    hello_version: int  # the policy version the actor held when it opened the stream
    ended: threading.Event = field(default_factory=threading.Event)  # set when the stream is gone
    duplicates: int = 0  # batches acked as duplicates on this stream


class IngestAborted(Exception):
    """A batch given up before it was stored, through no fault of the actor: its stream ended or
    the learner is draining. It was not acked, so the actor resends it."""


@dataclass(frozen=True)
class Refusal:
    """Why a stream is refused: a gRPC status code name and a reason."""

    code: str
    reason: str


def field_specs(fields: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> list[pb.FieldSpec]:
    """Replay or policy fields as FieldSpecs, in their order."""
    return [pb.FieldSpec(name=name, dtype=wire.np_dtype(dtype).name, shape=list(shape))
            for name, (shape, dtype) in fields.items()]


def _describe_fields(fields) -> str:
    """FieldSpecs for a message: name:dtype[shape], comma-separated."""
    return ", ".join(f"{f.name}:{f.dtype}{list(f.shape)}" for f in fields)


def _parameters(values: dict[str, str]) -> list[pb.Parameter]:
    return [pb.Parameter(name=name, value=value) for name, value in values.items()]


def resolve_device(name: str) -> torch.device:
    """``auto`` is cuda when there is one; asking for cuda without one falls back to cpu with a warning."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        logger.warning("device %s requested but CUDA is not available; using cpu", name)
        return torch.device("cpu")
    return device


class Learner:
    """Replay, rate limiter, algorithm and policy broadcast behind one lock discipline.

    gRPC threads call :meth:`ingest`; the trainer thread samples and updates; the replay
    buffer is only touched under ``replay_lock``. Start with :meth:`start`, stop with
    :meth:`stop` (final checkpoint included).
    """

    def __init__(self, config: LearnerConfig):
        if config.min_replay_size < config.batch_size:
            raise ValueError(f"min_replay_size ({config.min_replay_size}) must be >= batch_size ({config.batch_size})")
        self.config = config
        torch.set_num_threads(config.torch_threads)
        torch.manual_seed(config.seed)  # replay sampling draws from the global generator
        self.world = resolve_world(config.world_size, config.rank, config.dist_address)
        self.device = resolve_device(config.device)
        if self.world.size > 1:
            self.device = local_device(self.device)
        env = make_env(config.env, config.security)
        try:
            self.agents = list(env.possible_agents) if is_multi_agent(env) else []
            spaces = seat_spaces(env)
        finally:
            env.close()
        if self.agents and self.world.size > 1:
            raise ValueError("self-play (a multi-agent env) runs on one learner: world_size must be 1")
        self.env_spec = specs.env_spec(config.env, *spaces, self.agents)
        self.observation_space, self.action_space = spaces
        algorithm_class = self.algorithm_class = resolve(config.algorithm)
        self.algorithm_config = make_config(algorithm_class, config.algorithm_config)
        self.algorithm = algorithm_class(self.observation_space, self.action_space, self.algorithm_config,
                                         device=self.device, seed=config.seed)
        self.fields = self.algorithm.transition_fields()
        self.batch_fields = field_specs(self.fields)
        # Built now, not per evaluation: building a network on the evaluator's thread would
        # reseed and advance the generator the trainer samples with.
        self._eval_policy = self._cpu_algorithm(config.seed)
        self._eval_opponent = self._cpu_algorithm(config.seed + 1) if self.agents else None
        policy = {name: (tuple(t.shape), t.dtype) for name, t in self._eval_policy.policy_state_dict().items()}
        self._spec = pb.LearnerSpec(protocol_version=wire.PROTOCOL_VERSION, env_spec=self.env_spec,
                                    algorithm=config.algorithm, algorithm_config=config_json(self.algorithm_config),
                                    batch_fields=self.batch_fields, policy=field_specs(policy))
        self.settings_version = 0  # raised by each set_parameters: streams send a new Welcome
        self.changed_parameters: dict[str, str] = {}  # set while running (or restored): name -> value
        self._tune_lock = threading.Lock()  # one set_parameters at a time
        self._update_lock = threading.Lock()  # held by each algorithm update: retune waits for it
        self.replay = PrioritizedReplay(config.replay_capacity, self.fields, alpha=config.alpha, beta=config.beta,
                                        beta_steps=config.beta_steps, device=self.device)
        self.limiter = RateLimiter(config.min_replay_size, config.samples_per_insert, config.rate_error_buffer)
        self.replay_lock = threading.Lock()
        # Signalled under replay_lock when an insert commits or the snapshot gate opens.
        self._inserts_changed = threading.Condition(self.replay_lock)
        self._gate_closed = False  # a checkpoint waits for open inserts: no new ones start meanwhile
        self.broadcast = PolicyBroadcast(config.chunk_bytes)
        self.league = League(config.league, config.chunk_bytes, self.broadcast.nudge) if self.agents else None
        for script in config.league.evaluated_players() if self.agents else ():  # fail now, not in an actor
            load_scripted(script, self.observation_space, self.action_space, config.seed)
        self.onnx_feed = OnnxFeed(self.broadcast, self._cpu_algorithm(config.seed), self.observation_space,
                                  self.action_space, config.chunk_bytes) if hasattr(self.algorithm, "export_policy") else None
        checkpoint_dir = config.checkpoint_dir
        if checkpoint_dir and self.world.size > 1:  # each rank its own shard (and the same networks)
            checkpoint_dir = os.path.join(checkpoint_dir, f"rank-{self.world.rank}")
        self.checkpoints = CheckpointStore(checkpoint_dir, config.keep_checkpoints) if checkpoint_dir else None
        self.telemetry = telemetry.Telemetry(config.logdir or None)
        self.telemetry.text(telemetry.HYPERPARAMETERS, self.hyperparameters_table())
        self.learner_id = uuid.uuid4().hex[:12]

        self.version = 0
        self.updates = 0
        self.inserted_batches = 0
        self.env_steps = 0
        self.recent_return = math.nan
        self.evaluations = 0
        self.eval_mean = math.nan
        self.eval_best = -math.inf
        self.insert_meter = telemetry.RateMeter()
        self.sample_meter = telemetry.RateMeter()
        self.stopping = threading.Event()
        self.failed = threading.Event()  # training raised: the process should drain and exit non-zero
        self._sealed = False  # set before the final checkpoint: later batches are refused, not acked
        self._seq_table: dict[str, int] = {}  # highest stored seq per actor id; under replay_lock
        self._actors: dict[str, ActorRecord] = {}
        self._actors_lock = threading.Lock()  # taken after replay_lock when both are needed
        self._stats_lock = threading.Lock()  # env_steps and recent_return, reported by every stream
        self._last_forget = 0.0
        self._threads: list[threading.Thread] = []
        self._last_checkpoint = time.monotonic()
        self.data_parallel = DataParallel(self.world, self.device, config.dist_timeout) if self.world.size > 1 else None
        if self.data_parallel is not None:
            self.data_parallel.check_same("algorithm, its options, batch_size, publish_every or max_updates", repr(
                (config.algorithm, config_json(self.algorithm_config), config.batch_size, config.publish_every,
                 config.max_updates)))
            self.data_parallel.average_gradients(self.algorithm)
        self._restore()
        if self.data_parallel is not None:
            self.data_parallel.broadcast_state(self.algorithm)
        self.publish()

    def _cpu_algorithm(self, seed: int):
        """Another instance of the algorithm on the CPU (evaluation, league opponents, the ONNX feed)."""
        return self.algorithm_class(self.observation_space, self.action_space, self.algorithm_config, device="cpu",
                                    seed=seed)

    # -- streams ---------------------------------------------------------------------------

    def check_hello(self, hello: pb.Hello) -> Refusal | None:
        """Refuse a stream whose protocol or env spec differs from ours, or whose actor holds a
        policy or batches of another algorithm or batch layout."""
        if not hello.actor_id:
            return Refusal("INVALID_ARGUMENT", "Hello.actor_id must not be empty")
        if hello.protocol_version != wire.PROTOCOL_VERSION:
            return Refusal("FAILED_PRECONDITION", f"protocol version {hello.protocol_version} is not supported; "
                                                  f"this learner speaks {wire.PROTOCOL_VERSION}")
        mismatch = specs.spec_mismatch(self.env_spec, hello.env_spec)
        if mismatch:
            return Refusal("FAILED_PRECONDITION", f"env spec differs from the learner's ({self.config.env}): {mismatch}")
        if hello.algorithm and hello.algorithm != self.config.algorithm:
            return Refusal("FAILED_PRECONDITION", f"the actor holds a policy and batches of algorithm "
                                                  f"{hello.algorithm!r}; this learner runs {self.config.algorithm!r}: "
                                                  "restart the actor to follow it")
        if hello.policy_format not in ("", "state_dict", ONNX_FORMAT):
            return Refusal("INVALID_ARGUMENT", f"policy_format {hello.policy_format!r} is not one of state_dict, "
                                               f"{ONNX_FORMAT}")
        if hello.policy_format == ONNX_FORMAT and self.onnx_feed is None:
            return Refusal("FAILED_PRECONDITION", f"algorithm {self.config.algorithm!r} has no export_policy: "
                                                  "this learner cannot send its policy as ONNX")
        if self.league is not None and (hello.relay or hello.policy_format == ONNX_FORMAT):
            return Refusal("FAILED_PRECONDITION", "this learner keeps a self-play league: its actors connect "
                                                  "directly (no relays) and take state_dict policies (no onnx)")
        if hello.batch_fields and list(hello.batch_fields) != self.batch_fields:
            return Refusal("FAILED_PRECONDITION", f"the actor holds batches with fields "
                                                  f"{_describe_fields(hello.batch_fields)}; this learner expects "
                                                  f"{_describe_fields(self.batch_fields)}: restart the actor")
        return None

    def spec(self) -> pb.LearnerSpec:
        """What an actor must send and will receive (the ``GetSpec`` answer); runtime parameters change its algorithm_config."""
        return self._spec

    def connect(self, hello: pb.Hello, via: str = "") -> ActorStream:
        """Open a stream for an actor id (known or new), directly or through relay ``via``; while
        connected an actor (not a relay) holds a distinct Ape-X index."""
        self.forget_departed()
        with self._actors_lock:
            record = self._actors.get(hello.actor_id)
            if record is None:
                record = self._actors[hello.actor_id] = ActorRecord(hello.actor_id)
            record.via, record.relay = via, hello.relay
            if record.streams == 0 and not hello.relay:
                record.index = self._free_index(record.index)
            record.streams += 1
            record.last_seen = time.time()
            record.policy_version = min(hello.policy_version, self.version)
            return ActorStream(record, hello.policy_version)

    def disconnect(self, stream: ActorStream) -> None:
        stream.ended.set()
        with self._actors_lock:
            stream.record.streams -= 1
            stream.record.last_seen = time.time()

    def forget_departed(self, min_interval: float = 1.0) -> None:
        """Drop actors gone longer than ``actor_ttl``, with their duplicate filters (at most every ``min_interval`` s).

        Every pod restart on Kubernetes is a new actor id: without this, records grow forever.
        An actor that comes back later is treated as new.
        """
        now = time.time()
        if now - self._last_forget < min_interval:
            return
        self._last_forget = now
        cutoff = now - self.config.actor_ttl
        with self.replay_lock, self._actors_lock:
            gone = [r.actor_id for r in self._actors.values() if not r.connected and r.last_seen < cutoff]
            for actor_id in gone:
                del self._actors[actor_id]
                self._seq_table.pop(actor_id, None)
        if gone:
            logger.info("forgot %d actors gone longer than %.0f s", len(gone), self.config.actor_ttl)

    def _free_index(self, previous: int | None) -> int:
        """The Ape-X index for an actor (re)connecting: its previous one if free, else the least used."""
        n = max(self.config.num_actors, 1)
        taken = Counter(r.index for r in self._actors.values() if r.connected)
        if previous is not None and previous < n and not taken[previous]:
            return previous
        return min(range(n), key=lambda i: (taken[i], i))

    def welcome(self, stream: ActorStream, version: int) -> pb.Welcome:
        """The settings an actor must use, and ``version``, the policy it receives next."""
        c = self.config
        settings = pb.Settings(
            batch_size=c.actor_batch_size, max_unacked=c.max_unacked, codec=int(wire.Codec.parse(c.codec)),
            actor_priorities=c.actor_priorities, num_actors=max(c.num_actors, 1), actor_index=stream.record.index,
            max_message_bytes=c.max_message_bytes, algorithm=c.algorithm,
            algorithm_config=config_json(self.algorithm_config))
        if self.league is not None:
            settings.league.CopyFrom(pb.LeagueSettings(
                enabled=True, opponent_exploration=c.league.opponent_exploration))
        return pb.Welcome(learner_id=self.learner_id, policy_version=version, settings=settings,
                          batch_fields=self.batch_fields)

    def ingest(self, stream: ActorStream, batch: pb.TrajectoryBatch) -> bool:
        """Validate and insert a batch unless its seq was stored; True if inserted, False if a duplicate.

        Raises WireError for bad input, before anything is inserted. Waits on the rate
        limiter (backpressure that reaches the actor through gRPC flow control) until the
        stream ends or the learner drains (IngestAborted). The limiter counts only what was stored.
        """
        record = stream.record
        record.last_seen = time.time()
        if self._duplicate(stream, batch.seq):
            return False
        newest = max(self.version, stream.hello_version)
        if not 0 <= batch.policy_version <= newest:
            raise wire.WireError(f"policy_version must be in [0, {newest}] (the newest version this learner or "
                                 f"the actor's Hello knows), got {batch.policy_version}")
        n = batch.num_transitions
        if self.league is not None:
            self.league.check(batch)
        elif batch.games or batch.opponents:
            raise wire.WireError("this learner keeps no league: a batch must not carry games or opponents")
        arrays = wire.decode_batch(batch.payload, batch.codec, self.fields, n, self.config.max_message_bytes)
        priorities = wire.decode_priorities(batch.priorities, n)
        self._acquire_insert(stream, n)
        reservation, inserted = None, False
        try:
            with self.replay_lock:
                self._inserts_changed.wait_for(lambda: not self._gate_closed)
                if self._sealed:
                    raise IngestAborted("the learner is shutting down")
                previous = self._seq_table.get(record.actor_id, -1)
                if batch.seq > previous:  # not stored meanwhile by another stream: claim it
                    reservation = self.replay.reserve(arrays, priorities, policy_version=batch.policy_version)
                    self._seq_table[record.actor_id] = batch.seq
            if reservation is not None:
                self.replay.write(reservation)  # no lock: other streams copy their batches meanwhile
                with self.replay_lock:
                    self.replay.commit(reservation)
                    if self.league is not None:  # with the batch, under the same lock: exactly once
                        self.league.record(batch)
                    self.inserted_batches += 1
                    record.transitions += n
                    inserted = True
                    self._inserts_changed.notify_all()
        finally:
            if not inserted:
                self.limiter.refund_insert(n)
                if reservation is not None:  # the write failed: nothing of the batch is stored, it may come again
                    with self.replay_lock:
                        self.replay.abort(reservation)
                        if self._seq_table.get(record.actor_id) == batch.seq:
                            self._seq_table[record.actor_id] = previous
                        self._inserts_changed.notify_all()
        if not inserted:
            return False
        self._saw_version(record, batch.policy_version)
        record.batches.add()
        self.insert_meter.add(n)
        return True

    def _duplicate(self, stream: ActorStream, seq: int) -> bool:
        """Whether ``seq`` was stored already (a resend). More of them on one stream than a window
        suggests the actor's seqs restarted below what it sent before, so that nothing it sends is
        stored: warned once per stream (and counted in status). Not refused: a learner restarted
        with a smaller window cannot tell that from a legal resend of the actor's older, larger window."""
        stored = self._seq_table.get(stream.record.actor_id, -1)
        if seq > stored:
            return False
        stream.duplicates += 1
        stream.record.duplicates += 1
        if stream.duplicates == self.config.max_unacked + 1:
            logger.warning("actor %s: %d batches on one stream had seqs not above %d, the highest stored for this "
                           "actor_id: more than a window (%d). If the actor's seqs restarted, nothing it sends is "
                           "stored: it must continue above %d or use a new actor_id", stream.record.actor_id,
                           stream.duplicates, stored, self.config.max_unacked, stored)
        return True

    def _acquire_insert(self, stream: ActorStream, n: int) -> None:
        """Wait for the rate limiter's room for ``n`` items; IngestAborted once the stream or the learner ends."""
        while not self.limiter.acquire_insert(n, timeout=LIMITER_POLL_SECONDS):
            if self.stopping.is_set():
                raise IngestAborted("the learner is shutting down")
            if stream.ended.is_set():
                raise IngestAborted("the stream ended")
        if stream.ended.is_set():
            self.limiter.refund_insert(n)
            raise IngestAborted("the stream ended")

    def _saw_version(self, record: ActorRecord, version: int) -> None:
        """An actor reported running ``version``; counted at most as the learner's own (lag >= 0)."""
        record.policy_version = max(record.policy_version, min(version, self.version))

    def record_episodes(self, stream: ActorStream, stats: pb.EpisodeStats) -> None:
        """Account an actor's env steps and finished episodes."""
        stream.record.last_seen = time.time()
        self._saw_version(stream.record, stats.policy_version)
        finished = [(r, n) for r, n in zip(stats.returns, stats.lengths) if math.isfinite(r)]
        with self._stats_lock:
            self.env_steps += stats.env_steps
            step = self.env_steps
            for ret, _ in finished:
                self.recent_return = ret if math.isnan(self.recent_return) else 0.9 * self.recent_return + 0.1 * ret
        for ret, length in finished:
            self.telemetry.scalars({telemetry.EPISODIC_RETURN: ret, telemetry.EPISODIC_LENGTH: length}, step)

    # -- training --------------------------------------------------------------------------

    def train_step(self) -> bool:
        """One sample -> update -> new priorities; False when the rate limiter says wait (data-parallel:
        when any rank's does, for every rank updates or none does)."""
        return self._train_round(True, False)[0]

    def _train_round(self, train: bool, checkpoint_due: bool) -> tuple[bool, bool, bool]:
        """Sample (if ``train``) and update; returns (updated, stop, checkpoint due).

        Data-parallel, the ranks first agree in one all-reduce: update only if every rank has a
        sample (else the sample's limiter credit is refunded), stop if any is stopping, checkpoint
        if any's is due. A sample given back this way still counts towards beta's annealing.
        """
        c = self.config
        sample = self._sample() if train else None
        ready, stop = sample is not None, self.stopping.is_set()
        if self.data_parallel is not None:
            ready, stop, checkpoint_due = self.data_parallel.agree(ready, stop, checkpoint_due)
        if not ready:
            if sample is not None:
                self.limiter.refund_sample(c.batch_size)
            return False, stop, checkpoint_due
        self._learn(sample)
        return True, stop, checkpoint_due

    def _sample(self):
        """A replay sample once the rate limiter allows it; None when it says wait or nothing is recent enough."""
        c = self.config
        if not self.limiter.acquire_sample(c.batch_size, timeout=0.2):
            return None
        min_version = self.version - c.max_policy_lag if c.max_policy_lag > 0 else None
        with self.replay_lock:
            try:
                return self.replay.sample(c.batch_size, min_policy_version=min_version)
            except NothingRecentEnough:  # every item is past max_policy_lag: wait for fresh ones
                self.limiter.refund_sample(c.batch_size)
                return None

    def _learn(self, sample) -> None:
        """One update on ``sample``, its new priorities, and a new version every publish_every updates."""
        c = self.config
        with self._update_lock:
            priorities, metrics = self.algorithm.update(sample)
        with self.replay_lock:
            self.replay.update_priorities(sample.indices, priorities)
        self.updates += 1
        self.sample_meter.add(c.batch_size)
        if self.updates % c.publish_every == 0:
            self.version += 1
            self.publish()
        if self.updates % 100 == 0:
            league = self.league.scalars() if self.league is not None else {}
            self.telemetry.scalars({**metrics, **self._rates(), **league}, self.updates)

    def publish(self) -> None:
        """Broadcast the current policy as ``self.version``."""
        self.broadcast.publish(self.version, self.algorithm.policy_state_dict())
        if self.league is not None:
            self.league.published(self.version, self.broadcast.payload)

    def evaluate(self) -> EvalResult:
        """Greedy episodes with the latest published policy, decoded from the same bytes actors get."""
        policy = self._eval_policy
        policy.load_policy_state_dict(wire.decode_state_dict(self.broadcast.payload))
        if self.league is not None:
            result = evaluate_league(self.league, policy, self._eval_opponent,
                                     lambda: make_env(self.config.env, self.config.security),
                                     (self.observation_space, self.action_space), self.config.eval_envs,
                                     self.config.seed + 10_000 * self.evaluations)
            self.telemetry.scalars({f"eval/win_or_draw_vs/{r.opponent}": (r.wins + r.draws) / (r.wins + r.draws + r.losses)
                                    for r in self.league.evaluation}, self.env_steps)
        else:
            result = evaluate(lambda obs: policy.act(obs, 0.0), lambda: make_env(self.config.env, self.config.security),
                              self.config.eval_episodes, self.config.eval_envs,
                              self.config.seed + 10_000 * self.evaluations, getattr(policy, "reset_memory", None))
        self.evaluations += 1
        self.eval_mean = result.mean
        self.telemetry.scalars({telemetry.EVAL_MEAN_RETURN: result.mean, telemetry.EVAL_STD_RETURN: result.std}, self.env_steps)
        if result.mean > self.eval_best:
            self.eval_best = result.mean
            if self.checkpoints:
                self.checkpoints.save_best({"policy": policy.policy_state_dict(), "run": self.run_record()}, result.mean,
                                           step=self.version)
        return result

    # -- state -----------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write model, optimizer, buffer (if configured), version, seq table and RNGs atomically.

        Call it from the trainer thread (or once it has stopped): the algorithm must not change meanwhile.
        Ingest goes on: the replay lock is held to snapshot the seq table, limiter, counters and
        replay as of one instant, then only for a moment per chunk of replay rows written.
        """
        with self.replay_lock:
            self._wait_for_open_inserts()
            step = self.updates
            # The limiter's inserts are the replay's plus those of batches admitted but not stored yet
            # (and dropped if the learner stops first): the replay's own count is this instant's.
            learner_state = {"version": self.version, "updates": self.updates, "env_steps": self.env_steps,
                             "seq_table": dict(self._seq_table), "inserts": self.replay.inserted - self.replay.abandoned,
                             "samples": self.limiter.samples, "shift": self.limiter.shift,
                             "parameters": dict(self.changed_parameters), "world_size": self.world.size}
            replay = self.replay.snapshot(self.replay_lock) if self.config.checkpoint_replay else None
            league = self.league.state() if self.league is not None else None
        try:
            parts = {"algorithm": self.algorithm.state_dict(), "learner": learner_state, "rng": rng_state(self.device),
                     "run": self.run_record()}
            if replay is not None:
                parts["replay"] = replay.state()
            if league is not None:
                parts["league"] = league
            self.checkpoints.save(step, parts)
        finally:
            if replay is not None:
                replay.close()

    def _wait_for_open_inserts(self) -> None:
        """Under replay_lock: let open inserts finish while starting no new ones, for an instant with none open."""
        self._gate_closed = True
        try:
            self._inserts_changed.wait_for(lambda: self.replay.pending == 0)
        finally:
            self._gate_closed = False
            self._inserts_changed.notify_all()

    def set_parameters(self, request: Sequence[tuple[str, str]], restored: bool = False) -> list[Change]:
        """Change runtime parameters ((name, value text) pairs) all together, or none: ParameterError says why.

        The replay, rate limiter, trainer and algorithm take the new values at once; actors get
        them in a new Welcome on their streams. Logged, written to TensorBoard, kept in checkpoints.
        """
        with self._tune_lock:
            change = plan(self.config, self.algorithm_class, self.algorithm_config, request)
            if self.data_parallel is not None and not restored:
                shared = [c.name for c in change.changes
                          if c.name == "publish-every" or c.name.startswith(f"{self.algorithm_class.name}-")]
                if shared:  # set on one rank only, the parameters or versions would part
                    raise ParameterError(f"{', '.join(shared)} must stay the same on every data-parallel rank: "
                                         "not changeable while they train")
            config = change.learner
            if config.samples_per_insert != self.config.samples_per_insert:
                self.limiter.retarget(config.samples_per_insert)
            if (config.alpha, config.beta) != (self.config.alpha, self.config.beta):
                with self.replay_lock:
                    self._wait_for_open_inserts()
                    self.replay.set_exponents(config.alpha, config.beta)
            with self._update_lock:
                retune(self.algorithm, change.algorithm)
            self.config, self.algorithm_config = config, change.algorithm
            spec = pb.LearnerSpec()
            spec.CopyFrom(self._spec)
            spec.algorithm_config = config_json(change.algorithm)
            self._spec = spec
            self.changed_parameters.update({c.name: c.value for c in change.changes})
            self.settings_version += 1
        self.broadcast.nudge()
        if self.onnx_feed is not None:
            self.onnx_feed.broadcast.nudge()
        summary = ", ".join(f"{c.name} {c.previous} -> {c.value}" for c in change.changes)
        logger.info("%s runtime parameters after %d updates: %s", "restored" if restored else "set", self.updates,
                    summary)
        self.telemetry.text(telemetry.RUNTIME_PARAMETERS, "| parameter | before | after |\n|---|---|---|\n" + "\n".join(
            f"| {c.name} | {c.previous} | {c.value} |" for c in change.changes), self.updates)
        return change.changes

    def hyperparameters_table(self) -> str:
        """The learner's settings and the algorithm's, as a markdown table (security settings left out)."""
        settings = {name: value for name, value in dataclasses.asdict(self.config).items()
                    if name not in ("security", "algorithm_config")}
        settings.update({f"{self.config.algorithm}.{name}": value
                         for name, value in dataclasses.asdict(self.algorithm_config).items()})
        rows = "\n".join(f"| {name} | {value} |" for name, value in settings.items())
        return f"| setting | value |\n|---|---|\n{rows}"

    def run_record(self) -> dict[str, str | int]:
        """What a checkpoint needs to rebuild its policy without this learner: env, algorithm, its options."""
        return {"env": self.config.env, "algorithm": self.config.algorithm,
                "algorithm_config": config_json(self.algorithm_config), "seed": self.config.seed}

    def _restore(self) -> None:
        found = self.checkpoints.load_latest() if self.checkpoints else None
        if self.data_parallel is not None:
            found = self._common_checkpoint(found)
        if found is None:
            return
        step, parts = found
        state = parts["learner"]
        written_by = int(state.get("world_size", 1))
        if written_by != self.world.size:
            raise ValueError(f"checkpoint {step} in {self.checkpoints.directory} was written by {written_by} "
                             f"data-parallel learners; resume it with that world_size, not {self.world.size}")
        if state.get("parameters"):  # first: the optimizer state and replay priorities load into the tuned parts
            try:
                self.set_parameters([(str(k), str(v)) for k, v in state["parameters"].items()], restored=True)
            except ParameterError as exc:
                logger.warning("checkpoint %d: runtime parameters %s not restored: %s", step, state["parameters"], exc)
        self.algorithm.load_state_dict(parts["algorithm"])
        if "replay" in parts:  # without it the buffer starts empty, and so does the limiter's count
            self.replay.load_state_dict(parts["replay"])
            self.limiter.load_state_dict(state)
        self.version, self.updates, self.env_steps = int(state["version"]), int(state["updates"]), int(state["env_steps"])
        self._seq_table = {str(k): int(v) for k, v in state["seq_table"].items()}
        self._actors = {actor_id: ActorRecord(actor_id) for actor_id in self._seq_table}  # gone since the restore
        if "league" in parts and self.league is not None:
            self.league.load_state(parts["league"])
        if "rng" in parts:
            load_rng_state(parts["rng"], self.device)
        logger.info("restored checkpoint %d: version %d, %d items in replay", step, self.version, len(self.replay))

    def _common_checkpoint(self, found: tuple[int, dict] | None) -> tuple[int, dict] | None:
        """The checkpoint every rank resumes from: the newest step all of them have (a crash may have cut
        a save short on some). ValueError when some ranks have checkpoints and others none."""
        step = found[0] if found else -1
        low, high = self.data_parallel.extremes(step)
        if low == high:
            return found
        if low < 0:
            raise ValueError(f"some ranks have checkpoints (up to step {high}) and some none: a data-parallel "
                             "learner resumes only with every rank's checkpoint_dir/rank-R")
        logger.warning("rank %d: resuming from checkpoint %d, the newest every rank has, not %d; newer ones "
                       "moved aside to ckpt-N.ahead", self.world.rank, low, step)
        try:
            found = self.checkpoints.load(self.checkpoints.directory / f"ckpt-{low:012d}")
        except (CheckpointError, OSError) as exc:
            raise ValueError(f"rank {self.world.rank}: checkpoint {low}, the newest every rank has, is unusable "
                             f"here: {exc}") from None
        for newer, path in self.checkpoints.checkpoints():
            if newer > low:  # never to be resumed by this world: out of the way of later resumes and pruning
                aside = path.with_name(path.name + ".ahead")
                shutil.rmtree(aside, ignore_errors=True)
                path.rename(aside)
        return found

    def status(self) -> pb.StatusResponse:
        """A snapshot for GetStatus: the learner and every actor seen within ``actor_ttl``."""
        self.forget_departed()
        with self._actors_lock:
            records = list(self._actors.values())
        actors = [pb.ActorStatus(actor_id=r.actor_id, policy_version=r.policy_version, lag=self.version - r.policy_version,
                                 batches_per_second=r.batches.rate(), last_seen_unix=r.last_seen, connected=r.connected,
                                 duplicates=r.duplicates, inserted=int(r.batches.total), transitions=r.transitions,
                                 via=r.via, relay=r.relay)
                  for r in records]
        return pb.StatusResponse(
            policy_version=self.version, updates=self.updates, buffer_size=len(self.replay),
            inserted=self.inserted_batches, insert_rate=self.insert_meter.rate(), sample_rate=self.sample_meter.rate(),
            actors=actors, env_steps=self.env_steps, evaluations=self.evaluations,
            eval_mean_return=self.eval_mean if self.evaluations else 0.0,
            eval_best_return=self.eval_best if self.evaluations else 0.0, learner_id=self.learner_id,
            parameters=_parameters(current_values(self.config, self.algorithm_class.name, self.algorithm_config)),
            changed_parameters=_parameters(self.changed_parameters),
            league=self.league.status() if self.league is not None else None)

    def metrics(self) -> list[Metric]:
        """What the learner exposes to Prometheus, read at each scrape."""
        with self._actors_lock:
            records = list(self._actors.values())
        connected = [r for r in records if r.connected and not r.relay]  # actors behind relays count, relays not
        return [
            Metric("policy_version", "Newest published policy version.", self.version),
            Metric("updates_total", "Training updates.", self.updates, counter=True),
            Metric("buffer_size", "Transitions in the replay buffer.", len(self.replay)),
            Metric("inserts_per_second", "Transitions inserted per second.", self.insert_meter.rate()),
            Metric("samples_per_second", "Transitions sampled per second.", self.sample_meter.rate()),
            Metric("env_steps_total", "Env steps reported by actors.", self.env_steps, counter=True),
            Metric("episode_return", "Mean return of recent actor episodes (NaN before any).", self.recent_return),
            Metric("eval_mean_return", "Mean return of the last greedy evaluation (NaN before any).", self.eval_mean),
            Metric("connected_actors", "Actors with an open stream.", len(connected)),
            Metric("known_actors", "Actor ids remembered (connected, or gone less than actor_ttl ago).", len(records)),
            Metric("inserts_waiting", "Batches waiting for the rate limiter's room (backpressure on actors).",
                   self.limiter.waiting["inserts"]),
            Metric("actor_lag", "Learner version minus the version each connected actor runs.",
                   {r.actor_id: self.version - r.policy_version for r in connected}),
            *(self.league.metrics() if self.league is not None else []),
        ]

    def progress(self) -> dict:
        """Numbers for the one-line progress display."""
        with self._actors_lock:
            lags = [self.version - r.policy_version for r in self._actors.values() if r.connected]
        return {"env_steps": self.env_steps, "return": self.recent_return, "version": self.version,
                "lag_max": max(lags, default=0), "buffer_size": len(self.replay),
                "buffer_capacity": self.replay.capacity, "updates": self.updates,
                "eval": self.eval_mean if self.evaluations else None}

    def _rates(self) -> dict[str, float]:
        return {telemetry.REPLAY_SIZE: len(self.replay), telemetry.REPLAY_INSERT_RATE: self.insert_meter.rate(),
                telemetry.REPLAY_SAMPLE_RATE: self.sample_meter.rate(), telemetry.POLICY_VERSION: self.version,
                telemetry.POLICY_LAG_MAX: self.progress()["lag_max"]}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the trainer and, if configured, the periodic evaluator."""
        self._spawn("trainer", self._train_loop)
        if self.config.eval_every > 0:
            self._spawn("evaluator", self._eval_loop)

    def stop(self) -> None:
        """Stop training and evaluation, refuse further batches, then write a final checkpoint.

        Every batch acked before this returns is in that checkpoint.
        """
        self.stopping.set()
        self.limiter.close()
        for thread in self._threads:
            thread.join()
        if self.onnx_feed is not None:
            self.onnx_feed.stop()
        with self.replay_lock:
            self._sealed = True
        if self.checkpoints:
            self.checkpoint()
        self.telemetry.close()

    def _spawn(self, name: str, target) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _train_loop(self) -> None:
        """Train (until max_updates) and checkpoint on schedule, even while training waits or is done.

        An exception (a bug, CUDA out of memory) is logged once and sets :attr:`failed`, instead
        of leaving a learner that serves but no longer trains.
        """
        try:
            self._train_until_stopped()
        except Exception:
            logger.exception("training failed; the learner stops")
            self.failed.set()

    def _train_until_stopped(self) -> None:
        limit = self.config.max_updates
        while True:
            due = bool(self.checkpoints) and time.monotonic() - self._last_checkpoint >= self.config.checkpoint_every
            training = not (limit and self.updates >= limit)
            _, stop, due = self._train_round(training, due)
            if stop:
                if not self.stopping.is_set():
                    logger.info("rank %d: another rank is stopping; this one stops too", self.world.rank)
                    self.stopping.set()
                return
            if not training:
                self.stopping.wait(0.2)
            if due:
                self._last_checkpoint = time.monotonic()
                try:
                    self.checkpoint()
                except OSError as exc:  # e.g. a full disk: keep training, try again next period
                    logger.error("checkpoint failed: %s", exc)

    def _eval_loop(self) -> None:
        while not self.stopping.wait(self.config.eval_every):
            if self.updates == 0:
                continue
            try:
                result = self.evaluate()
            except (RuntimeError, ValueError, OSError) as exc:  # e.g. a remote env refused a session
                logger.warning("evaluation failed, trying again in %.0f s: %s", self.config.eval_every, exc)
                continue
            logger.info("eval after %d updates (version %d): mean %.1f std %.1f min %.0f max %.0f",
                        self.updates, self.version, result.mean, result.std, result.min, result.max)
            if self.league is not None:
                logger.info("eval games (wins/draws/losses), rating %.0f: %s", self.league.rating, ", ".join(
                    f"{r.opponent} {r.wins}/{r.draws}/{r.losses}" for r in self.league.evaluation))
