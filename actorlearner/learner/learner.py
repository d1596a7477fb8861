"""The learner: its parts, each holding one role, composed and wired together.

Who does what: :mod:`.registry` knows the actors and their seqs; :mod:`.ingest` stores their
batches exactly once; :mod:`.trainer` is the loop that samples, updates and publishes (one update
is ``TrainingLoop._learn``); :mod:`.publishing` sends each version out; :mod:`.evaluating` scores it;
:mod:`.state` checkpoints and resumes; :mod:`.status` reports; :mod:`.roles` holds the optional ones.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import Sequence

import torch

from actorlearner import specs, telemetry, wire
from actorlearner.algorithms import config_json, make_config, resolve
from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import LearnerConfig
from actorlearner.envs import make_env
from actorlearner.envs.multiagent import is_multi_agent, seat_spaces
from actorlearner.evaluation import EvalResult
from actorlearner.frames import algorithm_frames, batch_fields, default_frame_capacity, frame_stack_of
from actorlearner.learner import state, status
from actorlearner.learner.distributed import join_world, local_device, resolve_world
from actorlearner.learner.evaluating import Evaluation
from actorlearner.learner.ingest import Ingest
from actorlearner.learner.onnx_feed import OnnxFeed
from actorlearner.learner.parameters import Change, ParameterError, plan
from actorlearner.learner.publishing import Publishing
from actorlearner.learner.registry import ActorRegistry, ActorSession
from actorlearner.learner.roles import Roles, SelfPlay
from actorlearner.learner.spec import Refusal, check_hello, field_specs
from actorlearner.learner.trainer import TrainingLoop
from actorlearner.metrics import Metric
from actorlearner.replay import PrioritizedReplay, RateLimiter
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
        env = make_env(config.env, config.security, frame_stack=config.frame_stack)
        try:
            self.agents = list(env.possible_agents) if is_multi_agent(env) else []
            spaces = seat_spaces(env)
            frame_stack = 0 if self.agents else frame_stack_of(env, config.frame_stack)
        finally:
            env.close()
        if self.agents and self.world.size > 1:
            raise ValueError("self-play (a multi-agent env) runs on one learner: world_size must be 1")
        self.env_spec = specs.env_spec(config.env, *spaces, self.agents)
        self.observation_space, self.action_space = spaces

        # The algorithm: its trainer, and CPU policies (evaluation, a league opponent, the ONNX feed) built
        # now, not per evaluation: building a network on the evaluator's thread would reseed and advance
        # the generator the trainer samples with.
        algorithm_class = self.algorithm_class = resolve(config.algorithm)
        self.algorithm_config = make_config(algorithm_class, config.algorithm_config)
        algorithm_spec = algorithm_class(self.observation_space, self.action_space, self.algorithm_config)
        algorithm = algorithm_spec.make_trainer(device=self.device, seed=config.seed)
        self.fields = stored = algorithm_spec.transition_fields()  # what batches hold, and the replay
        self.frame_layout, frame_capacity = None, 0
        if frame_stack:  # batches hold frame indices and the frames, the replay frame keys
            self.frame_layout, by_ids = algorithm_frames(algorithm_spec)
            stored = by_ids.transition_fields()
            self.fields = batch_fields(self.frame_layout, stored)
            frame_capacity = config.replay_frames or default_frame_capacity(self.frame_layout, stored,
                                                                            config.replay_capacity)
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

        self.replay = PrioritizedReplay(config.replay_capacity, stored, alpha=config.alpha, beta=config.beta,
                                        beta_steps=config.beta_steps, device=self.device,
                                        frames=self.frame_layout, frame_capacity=frame_capacity)
        self.limiter = RateLimiter(config.min_replay_size, config.samples_per_insert, config.rate_error_buffer)
        self.replay_lock = threading.Lock()
        self.telemetry = telemetry.Telemetry(config.logdir or None)
        self.broadcast = PolicyBroadcast(config.chunk_bytes)
        self.roles = SelfPlay(config, eval_opponent, spaces, self.telemetry, self.broadcast.nudge) if self.agents \
            else Roles()
        onnx_feed = OnnxFeed(self.broadcast, algorithm_spec.make_policy(device="cpu", seed=config.seed),
                             self.observation_space, self.action_space, config.chunk_bytes) if eval_policy.can_export else None
        self.publishing = Publishing(self.broadcast, onnx_feed, self.roles)
        checkpoint_dir = config.checkpoint_dir
        if checkpoint_dir and self.world.size > 1:  # each rank its own shard (and the same networks)
            checkpoint_dir = os.path.join(checkpoint_dir, f"rank-{self.world.rank}")
        self.checkpoints = CheckpointStore(checkpoint_dir, config.keep_checkpoints) if checkpoint_dir else None
        self.telemetry.text(telemetry.HYPERPARAMETERS, status.hyperparameters_table(config, self.algorithm_config))
        self.learner_id = uuid.uuid4().hex[:12]
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.data_parallel = join_world(self.world, self.device, config.dist_timeout)

        self.registry = ActorRegistry(config.actor_ttl, config.num_actors, config.max_unacked, self.replay_lock)
        self.training = TrainingLoop(config, algorithm, self.replay, self.replay_lock, self.limiter, self.publishing,
                                     self.roles, self.telemetry, self.stopping, self.data_parallel,
                                     lambda: status.rates(self))
        self.failed = self.training.failed  # training raised: the process should drain and exit non-zero
        self.ingestion = Ingest(self.fields, config.max_message_bytes, self.replay, self.replay_lock, self.limiter,
                                self.registry, self.roles, self.telemetry, self.stopping, lambda: self.training.version)
        self.evaluation = Evaluation(config, eval_policy, self.broadcast, self.training, self.ingestion, self.roles,
                                     self.telemetry, self.checkpoints, self.run_record)
        self.data_parallel.check_same("algorithm, its options, batch_size, publish_every or max_updates", repr(
            (config.algorithm, config_json(self.algorithm_config), config.batch_size, config.publish_every,
             config.max_updates)))
        self.data_parallel.average_gradients(algorithm)
        state.restore(self)
        self.data_parallel.broadcast_state(algorithm)
        self.publish()

    # -- the parts' numbers, read (and in tests set) here ----------------------------------

    @property
    def algorithm(self):
        return self.training.algorithm

    @property
    def version(self) -> int:
        return self.training.version

    @version.setter
    def version(self, value: int) -> None:
        self.training.version = value

    @property
    def updates(self) -> int:
        return self.training.updates

    @property
    def inserted_batches(self) -> int:
        return self.ingestion.inserted_batches

    @property
    def env_steps(self) -> int:
        return self.ingestion.env_steps

    @property
    def recent_return(self) -> float:
        return self.ingestion.recent_return

    @property
    def evaluations(self) -> int:
        return self.evaluation.evaluations

    @property
    def eval_mean(self) -> float:
        return self.evaluation.mean

    @property
    def league(self):
        """The self-play league (None without one)."""
        return self.roles.league

    @property
    def onnx_feed(self) -> OnnxFeed | None:
        return self.publishing.onnx_feed

    # -- streams ---------------------------------------------------------------------------

    def check_hello(self, hello: pb.Hello) -> Refusal | None:
        """Refuse a stream this learner cannot serve (see :func:`spec.check_hello`)."""
        return check_hello(hello, self._spec, self.config.env, self.onnx_feed is not None, self.roles)

    def spec(self) -> pb.LearnerSpec:
        """What an actor must send and will receive (the ``GetSpec`` answer); runtime parameters change its algorithm_config."""
        return self._spec

    def connect(self, hello: pb.Hello, via: str = "") -> ActorSession:
        """Open a stream for an actor id (known or new), directly or through relay ``via``. Its batches
        carry priorities when the learner asks actors for them, the algorithm's policy gives them, and the
        stream takes state dicts (an ONNX model returns actions only)."""
        priorities = (self.config.actor_priorities and self.gives_priorities and not hello.relay
                      and hello.policy_format != ONNX_FORMAT)
        return self.registry.connect(hello, via, self.version, priorities)

    def disconnect(self, session: ActorSession) -> None:
        self.registry.disconnect(session)

    def welcome(self, session: ActorSession, version: int) -> pb.Welcome:
        """The settings an actor must use, and ``version``, the policy it receives next."""
        c = self.config
        settings = pb.Settings(
            batch_size=c.actor_batch_size, max_unacked=c.max_unacked, codec=int(wire.Codec.parse(c.codec)),
            actor_priorities=session.priorities, num_actors=max(c.num_actors, 1), actor_index=session.record.index,
            max_message_bytes=c.max_message_bytes, algorithm=c.algorithm,
            algorithm_config=config_json(self.algorithm_config))
        self.roles.welcome(settings)
        return pb.Welcome(learner_id=self.learner_id, policy_version=version, settings=settings,
                          batch_fields=self.batch_fields)

    def ingest(self, session: ActorSession, batch: pb.TrajectoryBatch) -> bool:
        """Store a batch unless its seq was stored; True if inserted, False if a duplicate (see :class:`Ingest`)."""
        return self.ingestion.ingest(session, batch)

    def record_episodes(self, session: ActorSession, stats: pb.EpisodeStats) -> None:
        self.ingestion.record_episodes(session, stats)

    # -- training, publishing, evaluation --------------------------------------------------

    def train_step(self) -> bool:
        """One sample -> update -> new priorities; False when the rate limiter says wait. A version it
        publishes is out when it returns."""
        updated = self.training.train_step()
        self.publishing.flush()
        return updated

    def publish(self) -> None:
        """Broadcast the current policy as ``self.version``; it is out when this returns."""
        self.training.publish()
        self.publishing.flush()

    def evaluate(self) -> EvalResult:
        """Greedy episodes with the latest published policy, decoded from the same bytes actors get."""
        return self.evaluation.evaluate()

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
            config = change.learner
            if config.samples_per_insert != self.config.samples_per_insert:
                self.limiter.retarget(config.samples_per_insert)
            if (config.alpha, config.beta) != (self.config.alpha, self.config.beta):
                with self.replay_lock:
                    self.ingestion.wait_for_open_inserts()
                    self.replay.set_exponents(config.alpha, config.beta)
            with self.training.update_lock:
                self.algorithm.retune(change.algorithm)
            self.config = self.training.config = config
            self.algorithm_config = change.algorithm
            spec = pb.LearnerSpec()
            spec.CopyFrom(self._spec)
            spec.algorithm_config = config_json(change.algorithm)
            self._spec = spec
            self.changed_parameters.update({c.name: c.value for c in change.changes})
            self.settings_version += 1
        self.publishing.nudge()
        summary = ", ".join(f"{c.name} {c.previous} -> {c.value}" for c in change.changes)
        logger.info("%s runtime parameters after %d updates: %s", "restored" if restored else "set", self.updates,
                    summary)
        self.telemetry.text(telemetry.RUNTIME_PARAMETERS, "| parameter | before | after |\n|---|---|---|\n" + "\n".join(
            f"| {c.name} | {c.previous} | {c.value} |" for c in change.changes), self.updates)
        return change.changes

    # -- state and reports -----------------------------------------------------------------

    def checkpoint(self) -> None:
        """Write every part's state as of one instant (see :func:`state.save`)."""
        state.save(self)

    def run_record(self) -> dict[str, str | int]:
        """What a checkpoint needs to rebuild its policy without this learner: env, algorithm, its options."""
        return {"env": self.config.env, "frame_stack": self.config.frame_stack, "algorithm": self.config.algorithm,
                "algorithm_config": config_json(self.algorithm_config), "seed": self.config.seed}

    def status(self) -> pb.StatusResponse:
        return status.status(self)

    def metrics(self) -> list[Metric]:
        return status.metrics(self)

    def progress(self) -> dict:
        return status.progress(self)

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
        self.limiter.close()
        for thread in self._threads:
            thread.join()
        self.publishing.stop()
        self.ingestion.seal()
        if self.checkpoints:
            self.checkpoint()
        self.data_parallel.close()
        self.telemetry.close()

    def _spawn(self, name: str, target) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)
