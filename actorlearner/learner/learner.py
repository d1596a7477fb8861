"""The learner: its parts, each holding one role and its own state, composed and wired together.

Who does what: :mod:`.replay_service` owns the replay, its rate limiter and lock; :mod:`.exactly_once` the
seq table that keeps inserts exactly once; :mod:`.registry` knows the actors; :mod:`.ingest` checks their
batches; :mod:`.training` is the loop of training rounds (:mod:`.round`: sample, agree, update); :mod:`.publishing`
sends each version out; :mod:`.evaluating` scores it; :mod:`.progress` counts and logs; :mod:`.checkpointing`
finds and writes checkpoints; :mod:`.roles` holds the optional ones. Each part saves, restores and
reports itself: the Learner asks each in turn.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import torch

from actorlearner import specs, telemetry, wire
from actorlearner.algorithms import config_json, make_config, resolve
from actorlearner.checkpoint.rng import load_rng_state, rng_state
from actorlearner.config import LearnerConfig
from actorlearner.config.learner import learner_settings
from actorlearner.envs import make_env
from actorlearner.envs.multiagent import is_multi_agent, seat_spaces
from actorlearner.frames import algorithm_frames, batch_fields, frame_stack_of
from actorlearner.learner import figures
from actorlearner.learner.checkpointing import Checkpointing
from actorlearner.learner.distributed import join_world, local_device, resolve_world
from actorlearner.learner.evaluating import Evaluation
from actorlearner.learner.exactly_once import ExactlyOnce
from actorlearner.learner.ingest import Ingest
from actorlearner.learner.onnx_feed import OnnxFeed
from actorlearner.learner.parameters import Change, ParameterError, current_values, plan
from actorlearner.learner.progress import Progress
from actorlearner.learner.publishing import Publishing
from actorlearner.learner.registry import ActorRegistry, ActorSession
from actorlearner.learner.replay_service import ReplayService
from actorlearner.learner.roles import Roles, SelfPlay, StreamFeed
from actorlearner.learner.spec import Refusal, check_hello, field_specs
from actorlearner.learner.training import TrainingLoop
from actorlearner.metrics import Metric
from actorlearner.streaming.broadcast import ONNX_FORMAT, PolicyBroadcast
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)


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
    """The parts of a learner, built and wired once; the streams' entry points; the state of every part
    as of one instant (:meth:`checkpoint`) and its reports (:meth:`status`, :meth:`metrics`).

    gRPC threads call :meth:`ingest`; the trainer thread samples and updates. Start with :meth:`start`,
    stop with :meth:`stop` (final checkpoint included).
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
        env = make_env(config.env, config.security, frame_stack=config.frame_stack)
        try:
            self.agents = list(env.possible_agents) if is_multi_agent(env) else []
            spaces = seat_spaces(env)
            frame_stack = 0 if self.agents else frame_stack_of(env, config.frame_stack)
        finally:
            env.close()
        self.env_spec = specs.env_spec(config.env, *spaces, self.agents)
        self.observation_space, self.action_space = spaces

        # The algorithm: its trainer, and CPU policies (evaluation, a league opponent, the ONNX feed) built
        # now, not per evaluation: building a network on the evaluator's thread would reseed and advance
        # the generator the trainer samples with.
        algorithm_class = self.algorithm_class = resolve(config.algorithm)
        self.algorithm_config = make_config(algorithm_class, config.algorithm_config)
        algorithm_spec = algorithm_class(self.observation_space, self.action_space, self.algorithm_config)
        self.trainer = algorithm_spec.make_trainer(device=self.device, seed=config.seed)
        self.fields = stored = algorithm_spec.transition_fields()  # what batches hold, and the replay
        self.frame_layout = None
        if frame_stack:  # batches hold frame indices and the frames, the replay frame keys
            self.frame_layout, by_ids = algorithm_frames(algorithm_spec)
            stored = by_ids.transition_fields()
            self.fields = batch_fields(self.frame_layout, stored)
        self.batch_fields = field_specs(self.fields)
        eval_policy = algorithm_spec.make_policy(device="cpu", seed=config.seed)
        eval_opponent = algorithm_spec.make_policy(device="cpu", seed=config.seed + 1) if self.agents else None
        policy = {name: (tuple(t.shape), t.dtype) for name, t in eval_policy.policy_state_dict().items()}
        self.gives_priorities = eval_policy.gives_priorities
        self._spec = pb.LearnerSpec(protocol_version=wire.PROTOCOL_VERSION, env_spec=self.env_spec,
                                    algorithm=config.algorithm, algorithm_config=config_json(self.algorithm_config),
                                    batch_fields=self.batch_fields, policy=field_specs(policy))
        self.settings_version = 0  # raised by each set_parameters: streams send a new Welcome
        self.changed_parameters: dict[str, str] = {}  # set while running (or restored): name -> value
        self._tune_lock = threading.Lock()  # one set_parameters at a time
        self.learner_id = uuid.uuid4().hex[:12]
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []

        # The parts.
        self.progress = Progress(config.logdir)
        self.registry = ActorRegistry(config)
        self.exactly_once = ExactlyOnce(config, self.registry)
        self.replay = ReplayService(config, stored, self.frame_layout, self.device, self.exactly_once, self.stopping)
        self.broadcast = PolicyBroadcast(config.chunk_bytes)
        self.roles = SelfPlay(config, eval_opponent, spaces, self.progress.telemetry,
                              shared=self.world.size > 1) if self.agents else Roles()
        self.onnx_feed = OnnxFeed(self.broadcast, algorithm_spec.make_policy(device="cpu", seed=config.seed),
                                  self.observation_space, self.action_space, config.chunk_bytes, self.roles.league) \
            if eval_policy.can_export else None
        self.publishing = Publishing(self.broadcast, self.onnx_feed, self.roles)
        self.data_parallel = join_world(self.world, self.device, config.dist_timeout)
        self.checkpoints = Checkpointing(config, self.data_parallel, self.run_record)
        self.training = TrainingLoop(config, self.trainer, self.replay, self.publishing, self.data_parallel,
                                     self.progress, self.stopping)
        self.failed = self.training.failed  # training raised: the process should drain and exit non-zero
        self.ingestion = Ingest(config, self.fields, self.replay, self.exactly_once, self.roles, self.progress)
        self.evaluation = Evaluation(config, eval_policy, self.publishing, self.roles, self.progress, self.checkpoints)
        self.figures = [*self.progress.figures(), *self.replay.figures(), *self.ingestion.figures(),
                        *self.training.figures(), *self.evaluation.figures()]  # each declared once by its part
        self.progress.gauge(lambda: figures.scalars(self.figures))
        self.progress.gauge(lambda: {telemetry.POLICY_LAG_MAX: self.registry.lag_max(self.progress.version)})
        self.progress.gauge(self.roles.scalars)
        self.progress.telemetry.text(telemetry.HYPERPARAMETERS, _hyperparameters_table(config, self.algorithm_config))

        self.data_parallel.check_same("env spec, algorithm, its options, batch_size, publish_every, max_updates or "
                                      "league settings", repr(
            (self.env_spec.SerializeToString(deterministic=True), config.algorithm, config_json(self.algorithm_config),
             config.batch_size, config.publish_every, config.max_updates, config.league)))
        self.data_parallel.average_gradients(self.trainer)
        self._restore()
        self.data_parallel.broadcast_state(self.trainer)
        self.training.publish()
        self.publishing.flush()

    @property
    def version(self) -> int:
        """The newest policy version."""
        return self.progress.version

    @property
    def updates(self) -> int:
        return self.progress.updates

    @property
    def env_steps(self) -> int:
        return self.progress.env_steps

    # -- streams ---------------------------------------------------------------------------

    def check_hello(self, hello: pb.Hello) -> Refusal | None:
        """Refuse a stream this learner cannot serve (see :func:`spec.check_hello`)."""
        return check_hello(hello, self._spec, self.config.env, self.publishing.takes_onnx)

    def spec(self) -> pb.LearnerSpec:
        """What an actor must send and will receive (the ``GetSpec`` answer); runtime parameters change its algorithm_config."""
        return self._spec

    def connect(self, hello: pb.Hello, via: str = "") -> ActorSession:
        """Open a stream for an actor id (known or new), directly or through relay ``via``. Its batches
        carry priorities when the learner asks actors for them, the algorithm's policy gives them, and the
        stream takes state dicts (an ONNX model returns actions only)."""
        priorities = (self.config.actor_priorities and self.gives_priorities and not hello.relay
                      and hello.policy_format != ONNX_FORMAT)
        self.exactly_once.expire()
        return self.registry.connect(hello, via, self.progress.version, priorities)

    def disconnect(self, session: ActorSession) -> None:
        self.registry.disconnect(session)

    def feed(self, onnx: bool) -> StreamFeed:
        """What the roles send on a new stream besides policies and Welcomes; ``onnx``: it takes ONNX models."""
        return self.roles.feed(onnx)

    def welcome(self, session: ActorSession, version: int) -> pb.Welcome:
        """The settings an actor must use, and ``version``, the policy it receives next."""
        c, world, index = self.config, self.world, session.record.index  # None: a relay, which takes no index
        settings = pb.Settings(
            batch_size=c.actor_batch_size, max_unacked=c.max_unacked, codec=int(wire.Codec.parse(c.codec)),
            actor_priorities=session.priorities, num_actors=max(c.num_actors, 1) * world.size,
            actor_index=None if index is None else index * world.size + world.rank,  # the ranks' actors interleaved
            max_message_bytes=c.max_message_bytes, algorithm=c.algorithm,
            algorithm_config=config_json(self.algorithm_config))
        self.roles.welcome(settings)
        return pb.Welcome(learner_id=self.learner_id, policy_version=version, settings=settings,
                          batch_fields=self.batch_fields)

    def ingest(self, session: ActorSession, batch: pb.TrajectoryBatch, payload: memoryview | None = None) -> bool:
        """Store a batch unless its seq was stored; True if inserted, False if a duplicate (see :class:`Ingest`)."""
        return self.ingestion.ingest(session, batch, payload)

    async def ingest_async(self, session: ActorSession, batch: pb.TrajectoryBatch,
                           payload: memoryview | None = None) -> bool:
        """:meth:`ingest` for a stream served on an event loop (the rate limiter's wait does not block it)."""
        return await self.ingestion.ingest_async(session, batch, payload)

    def record_episodes(self, session: ActorSession, stats: pb.EpisodeStats) -> None:
        self.ingestion.record_episodes(session, stats)

    # -- runtime parameters ----------------------------------------------------------------

    def set_parameters(self, request: Sequence[tuple[str, str]], restored: bool = False) -> list[Change]:
        """Change runtime parameters ((name, value text) pairs) all together, or none: ParameterError says why.

        The replay, rate limiter, trainer and algorithm take the new values at once; actors get
        them in a new Welcome on their streams. Logged, written to TensorBoard, kept in checkpoints.
        """
        with self._tune_lock:
            change = plan(self.config, self.algorithm_class, self.algorithm_config, request)
            if self.world.size > 1 and not restored:
                shared = [c.name for c in change.changes
                          if c.name == "publish-every" or c.name.startswith(f"{self.algorithm_class.name}-")]
                if shared:  # set on one rank only, the parameters or versions would part
                    raise ParameterError(f"{', '.join(shared)} must stay the same on every data-parallel rank: "
                                         "not changeable while they train")
            self.replay.retune(change.learner)
            self.training.retune(change.learner, change.algorithm)
            self.config, self.algorithm_config = change.learner, change.algorithm
            spec = pb.LearnerSpec()
            spec.CopyFrom(self._spec)
            spec.algorithm_config = config_json(change.algorithm)
            self._spec = spec
            self.changed_parameters.update({c.name: c.value for c in change.changes})
            self.settings_version += 1
        self.publishing.nudge()
        summary = ", ".join(f"{c.name} {c.previous} -> {c.value}" for c in change.changes)
        updates = self.progress.updates
        logger.info("%s runtime parameters after %d updates: %s", "restored" if restored else "set", updates, summary)
        self.progress.telemetry.text(telemetry.RUNTIME_PARAMETERS, "| parameter | before | after |\n|---|---|---|\n" +
                                     "\n".join(f"| {c.name} | {c.previous} | {c.value} |" for c in change.changes),
                                     updates)
        return change.changes

    # -- state -----------------------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write every part's state as of one instant: model, optimizer, buffer (if configured), counts,
        seq table, league and RNGs, atomically.

        Call it from the trainer thread (or once it has stopped): the algorithm must not change meanwhile.
        Ingest goes on: the replay is quiesced for the parts' states, then held only for a moment per
        chunk of replay rows written.
        """
        self.publishing.flush()  # the roles' state holds every version published so far
        with self.replay.quiesced():
            step = self.progress.updates
            learner_state = {**self.progress.state(), **self.replay.state(), **self.exactly_once.state(),
                             "parameters": dict(self.changed_parameters), "world_size": self.world.size}
            snapshot = self.replay.snapshot()
            league = self.roles.state()
        try:
            parts = {"algorithm": self.trainer.state_dict(), "learner": learner_state,
                     "rng": rng_state(self.device)}
            if snapshot is not None:
                parts["replay"] = snapshot.state()
            if league is not None:
                parts["league"] = league
            self.checkpoints.save(step, parts)
        finally:
            if snapshot is not None:
                snapshot.close()

    def _restore(self) -> None:
        """Resume from the newest usable checkpoint, if there is one; runtime parameters first, so that the
        optimizer state and replay priorities load into the tuned parts."""
        found = self.checkpoints.latest()
        if found is None:
            return
        step, parts = found
        state = parts["learner"]
        if state.get("parameters"):
            try:
                self.set_parameters([(str(k), str(v)) for k, v in state["parameters"].items()], restored=True)
            except ParameterError as exc:
                logger.warning("checkpoint %d: runtime parameters %s not restored: %s", step, state["parameters"], exc)
        self.trainer.load_state_dict(parts["algorithm"])
        self.replay.load_state(state, parts.get("replay"))
        self.exactly_once.load_state(state)
        self.progress.load_state(state)
        if "league" in parts:
            self.roles.load_state(parts["league"])
        if "rng" in parts:
            load_rng_state(parts["rng"], self.device)
        logger.info("restored checkpoint %d: version %d, %d items in replay", step, self.version, len(self.replay))

    def run_record(self) -> dict[str, str | int]:
        """What a checkpoint needs to rebuild its policy without this learner: env, algorithm, its options."""
        return {"env": self.config.env, "frame_stack": self.config.frame_stack, "algorithm": self.config.algorithm,
                "algorithm_config": config_json(self.algorithm_config), "seed": self.config.seed}

    # -- reports ---------------------------------------------------------------------------

    def status(self) -> pb.StatusResponse:
        """A snapshot for GetStatus: every part's report, and every actor seen within ``actor_ttl``."""
        self.exactly_once.expire()
        parameters = current_values(self.config, self.algorithm_class.name, self.algorithm_config)
        response = pb.StatusResponse(learner_id=self.learner_id, parameters=_parameters(parameters),
                                     changed_parameters=_parameters(self.changed_parameters))
        figures.status(self.figures, response)
        self.roles.report(response)
        self.registry.report(response)  # the actors' lags behind the version reported
        return response

    def metrics(self) -> list[Metric]:
        """What the learner exposes to Prometheus, read at each scrape."""
        return [*figures.metrics(self.figures), *self.registry.metrics(self.progress.version), *self.roles.metrics()]

    def summary(self) -> dict[str, Any]:
        """Numbers for the one-line progress display."""
        evaluation = self.evaluation
        return {**figures.line(self.figures), "lag_max": self.registry.lag_max(self.progress.version),
                "eval": evaluation.mean if evaluation.evaluations else None}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the trainer and, if configured, the periodic evaluator."""
        self._spawn("trainer", lambda: self.training.run(self.checkpoint if self.checkpoints else None))
        if self.config.eval_every > 0:
            self._spawn("evaluator", lambda: self.evaluation.run(self.stopping))

    def stop(self) -> None:
        """Stop training and evaluation, refuse further batches, then write a final checkpoint.

        Every batch acked before this returns is in that checkpoint.
        """
        self.stopping.set()
        self.replay.close()
        for thread in self._threads:
            thread.join()
        self.publishing.stop()
        self.replay.seal()
        if self.checkpoints:
            self.checkpoint()
        self.data_parallel.close()
        self.progress.close()

    def _spawn(self, name: str, target) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)


def _parameters(values: dict[str, str]) -> list[pb.Parameter]:
    return [pb.Parameter(name=name, value=value) for name, value in values.items()]


def _hyperparameters_table(config: LearnerConfig, algorithm_config: Any) -> str:
    """The learner's settings and the algorithm's, as a markdown table (security settings left out)."""
    rows = "\n".join(f"| {name} | {value} |" for name, value in learner_settings(config, algorithm_config).items())
    return f"| setting | value |\n|---|---|\n{rows}"
