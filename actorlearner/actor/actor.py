"""The actor process: a vector env, a local policy copy, the algorithm's replay items streamed to the learner."""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from actorlearner import specs, wire
from actorlearner.actor.ahead import AHEAD_MODE, Ahead, LoopProcess
from actorlearner.actor.batching import PendingTransitions, rows
from actorlearner.actor.episodes import EpisodeTally
from actorlearner.actor.frames import FrameIds, FramePending
from actorlearner.actor.link import LearnerLink, LinkError, ReceivedPolicy, policy_key
from actorlearner.actor.priorities import batch_priorities
from actorlearner.actor.profile import StepProfile
from actorlearner.actor.roles import SettingsError, make_roles
from actorlearner.actor.stepping import Lockstep, stepper
from actorlearner.algorithms import AlgorithmSpec, Policy, TransitionAssembler, make_spec
from actorlearner.config import ActorConfig
from actorlearner.envs import make_vector_env
from actorlearner.envs.factory import VECTOR_MODES, env_factories
from actorlearner.envs.workers import Interrupted
from actorlearner.frames import FrameLayout, algorithm_frames, batch_fields, frame_stack_of
from actorlearner.metrics import Metric
from actorlearner.telemetry import RateMeter
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)

AUTO_MODE = "auto"
"""The default ``--vector-mode``: ahead for a policy without memory and no self-play, sync otherwise."""
VECTOR_MODE_CHOICES = (AUTO_MODE, *VECTOR_MODES, AHEAD_MODE)
FLUSH_SECONDS = 5.0
"""How long a stopping actor waits for the learner to ack what it sent."""


@dataclass(frozen=True, eq=False)
class AppliedWelcome:
    """One Welcome as the actor applies it: the learner's settings, a fresh policy of the algorithm they
    name, and ``policy_spec``, what every PolicyUpdate of the session must match."""

    welcome: pb.Welcome
    policy: Policy
    policy_spec: wire.Spec

    @property
    def settings(self) -> pb.Settings:
        return self.welcome.settings

    @property
    def learner_id(self) -> str:
        return self.welcome.learner_id


class Actor:
    """Steps envs with the newest policy it has and streams batches of the learner's algorithm.

    The algorithm comes from the Welcome (its name and config), as does every other setting:
    batch size, window, codec, this actor's exploration. The env loop's thread checks each Welcome
    and builds its network; settings it cannot apply, or weights that do not fit the network
    their Welcome describes, refuse the learner for good (`LinkError`). Policy updates are applied
    between env steps and every batch carries the version that produced it. Optional roles
    (self-play) take part through hooks (`actorlearner.actor.roles`). When a Welcome comes
    from another learner (a restart) or changes what shapes batches (the algorithm's config,
    such as n-step and gamma, batch size, codec, priorities), the previous session is closed
    out first:

    - batches that already hold a seq (the unacked window) are resent as they are, same
      seq, size and codec: nothing acked is lost, nothing is inserted twice;
    - what the algorithm's assembler holds is flushed (DQN's n-step windows as truncated
      transitions, whose ``discount`` = old gamma**k keeps them valid targets whatever the
      new settings), and with the partly filled batch they go out as the old session's last batches (old size,
      the last one smaller, old codec, old policy version) with fresh seqs, into the window.
      Flushing rather than dropping keeps every env step in exactly one transition, and no
      batch mixes two sessions' transitions or versions;
    - a changed algorithm or ``algorithm_config`` replaces the network, and the loop acts again only
      once weights of the new session arrived; an unchanged one keeps network and weights. A
      Welcome that changes only runtime-tunable options (``actorlearner set``, on the live stream)
      keeps network, weights and the assembler's episodes: the policy is retuned in place;
    - with ``--vector-mode auto`` (the default) a new network also picks how the envs step: ahead
      (`actorlearner.actor.ahead`) for a policy without memory, sync for one with memory or for a
      role that needs it (self-play). A switch replaces the envs, and their episodes start anew.
    """

    def __init__(self, config: ActorConfig):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        self.actor_id = config.actor_id or f"{socket.gethostname()}-{os.getpid()}"
        if config.vector_mode not in VECTOR_MODE_CHOICES:
            raise ValueError(f"vector mode must be one of {', '.join(VECTOR_MODE_CHOICES)}, got {config.vector_mode!r}")
        self.roles = make_roles(config)
        self.stop_event = threading.Event()
        if self.roles.sync_only and config.vector_mode not in ("sync", AUTO_MODE):
            raise ValueError(self.roles.sync_only)
        # auto starts ahead (sync where a role needs it); a Welcome's policy may switch it
        self.vector_mode = config.vector_mode
        if self.vector_mode == AUTO_MODE:
            self.vector_mode = "sync" if self.roles.sync_only else AHEAD_MODE
        self.envs = self._vector_env(self.vector_mode)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.obs_space, self.act_space = obs_space, act_space
        hello = pb.Hello(actor_id=self.actor_id, protocol_version=wire.PROTOCOL_VERSION,
                         env_spec=specs.env_spec(config.env, obs_space, act_space, list(self.roles.agents)),
                         policy_version=-1)
        self._league_inbox: queue.SimpleQueue = queue.SimpleQueue()  # the link's league messages, for the roles
        self.link = LearnerLink(config.learner, hello, config.max_message_bytes, config.reconnect_initial,
                                config.reconnect_max, config.security, on_league=self._league_inbox.put)
        # What the env loop runs; only its thread changes these.
        self.session: AppliedWelcome | None = None  # the Welcome whose settings are in force
        self.policy: Policy | None = None  # the algorithm's acting part, of the session's network
        self.policy_version = -1  # -1 while the network has no weights
        self.assembler: TransitionAssembler | None = None
        self.exploration = 1.0
        # Frame stacking: each frame gets an id once; items are assembled of ids and carry their frames.
        frame_stack = 0 if self.roles.agents else frame_stack_of(self.envs, config.frame_stack)
        self.frame_ids = FrameIds(config.num_envs, frame_stack) if frame_stack else None
        self.frame_layout: FrameLayout | None = None  # of the session's algorithm
        self.pending: PendingTransitions | FramePending = PendingTransitions()  # transitions not yet in a batch
        self._seq = self._first_seq()
        self.env_steps = 0
        self.steps_meter = RateMeter()
        self.profile = StepProfile()
        self.stepper = self._stepper()
        self.episodes = EpisodeTally(config.num_envs)
        self._last_stats = time.monotonic()  # when the last EpisodeStats went out
        self._steps_reported = 0  # env steps a batch or an EpisodeStats carried
        self.batches_sent = 0

    def _vector_env(self, mode: str) -> gym.vector.VectorEnv | LoopProcess:
        """The envs stepped in vector mode ``mode`` (not auto)."""
        config = self.config
        if mode == AHEAD_MODE:  # never for a role that is sync_only
            return LoopProcess(env_factories(config.env, config.num_envs, config.security,
                                             frame_stack=config.frame_stack), config.torch_threads, self.stop_event)
        return make_vector_env(config.env, config.num_envs, mode, config.security,
                               wrap=self.roles.wrapper(), frame_stack=config.frame_stack, interrupt=self.stop_event)

    def _stepper(self) -> Lockstep | Ahead:
        return Ahead(self.envs, self.profile, self.config.seed) if isinstance(self.envs, LoopProcess) \
            else stepper(self.envs, self.profile)

    def _switch_vector_mode(self, policy: Policy) -> bool:
        """With vector mode auto, replace the envs if ``policy`` needs another mode than they run (ahead
        without memory, sync with it); whether they were replaced (their episodes dropped)."""
        mode = "sync" if self.roles.sync_only or policy.recurrent else AHEAD_MODE
        if self.config.vector_mode != AUTO_MODE or mode == self.vector_mode:
            return False
        self.envs.close()
        self.vector_mode, self.envs = mode, self._vector_env(mode)
        self.stepper = self._stepper()
        return True

    def run(self, max_env_steps: int = 0) -> None:
        """Act until :meth:`stop` (or ``max_env_steps`` real env steps), then flush unacked batches."""
        self.link.start()
        try:
            self._loop(max_env_steps)
        except Interrupted:  # stopped while an env process did not answer
            pass
        finally:
            self.link.flush(timeout=FLUSH_SECONDS)
            self.link.close()
            self.envs.close()
            logger.info("unacked window peak %d of %d batches; env loop: %s", self.link.peak_unacked,
                        self.link.max_unacked, self.profile.summary())
            if self.config.profile_file:
                self.profile.write(self.config.profile_file)

    def stop(self) -> None:
        self.stop_event.set()

    def metrics(self) -> list[Metric]:
        """What the actor exposes to Prometheus."""
        return [
            Metric("env_steps_total", "Env steps taken.", self.env_steps, counter=True),
            Metric("env_steps_per_second", "Env steps per second.", self.steps_meter.rate()),
            Metric("batches_sent_total", "Trajectory batches sent.", self.batches_sent, counter=True),
            Metric("unacked_batches", "Batches sent and not yet acknowledged.", self.link.unacked),
            Metric("policy_version", "Policy version this actor runs.", self.policy_version),
            Metric("connected", "1 while the stream to the learner is up.", float(self.link.connected)),
            Metric("episode_return", "Return of the last finished episode (NaN before any).", self.episodes.last_return),
            Metric("actor_loop_seconds_total", "Seconds of the env loop by section.", dict(self.profile.seconds),
                   counter=True, label="section"),
        ]

    def _session_of(self, welcome: pb.Welcome) -> AppliedWelcome:
        """``welcome`` as this actor applies it; LinkError (the learner refused for good) for settings it cannot."""
        try:
            policy = self._build_policy(welcome)
        except SettingsError as exc:
            raise self._refuse(f"learner {welcome.learner_id} at {self.link.address} sent settings "
                               f"this actor cannot apply: {exc}") from None
        return AppliedWelcome(welcome, policy, wire.state_dict_spec(policy.policy_state_dict()))

    def _build_policy(self, welcome: pb.Welcome) -> Policy:
        """Check a Welcome's settings and build a policy of the algorithm they name.

        Raises SettingsError naming what this actor cannot apply.
        """
        settings = welcome.settings
        try:
            if settings.batch_size < 1:
                raise ValueError(f"batch_size must be >= 1, got {settings.batch_size}")
            wire.Codec.parse(settings.codec)
            hyperparameters = json.loads(settings.algorithm_config or "{}")
            if not isinstance(hyperparameters, dict):
                raise TypeError("algorithm_config must be a JSON object")
            spec = make_spec(settings.algorithm, self.obs_space, self.act_space, hyperparameters)
            policy = spec.make_policy(device="cpu", seed=self.config.seed)
            if self.config.vector_mode == AHEAD_MODE and policy.recurrent:
                raise ValueError(f"vector mode {AHEAD_MODE} needs a policy without memory ({settings.algorithm} "
                                 "keeps recurrent state): use sync or workers")
            layout, assembling = self._assembly(spec)
            fields = assembling.transition_fields()
            fields = fields if layout is None else batch_fields(layout, fields)
        except (ValueError, TypeError, RuntimeError) as exc:  # what bad values make configs and torch raise
            raise SettingsError(f"{type(exc).__name__}: {exc}") from None
        self.roles.check_welcome(settings)
        built = {name: (tuple(shape), wire.np_dtype(dtype).name) for name, (shape, dtype) in fields.items()}
        expected = {f.name: (tuple(f.shape), f.dtype) for f in welcome.batch_fields}
        if built != expected:
            raise SettingsError(f"the learner expects batch fields {expected}, but {settings.algorithm} on this actor "
                                f"makes {built}: run the same algorithm code on both")
        return policy

    def _assembly(self, spec: AlgorithmSpec) -> tuple[FrameLayout | None, AlgorithmSpec]:
        """The frame layout (None without frame stacking) and the spec whose assembler makes this actor's items:
        ``spec`` itself, or with frames stacked the same algorithm over frame ids."""
        return (None, spec) if self.frame_ids is None else algorithm_frames(spec)

    def _follow_learner(self) -> bool:
        """Apply the newest Welcome, weights and league messages the link holds; False while the network
        has no weights.

        Weights come with the Welcome they arrived under, whose session is applied before they
        are checked against its network and loaded: the loop never acts with a network of one
        Welcome and weights of another.
        """
        received = self.link.take_policy()
        welcome = received.welcome if received is not None else self.link.welcome
        changed = welcome is not None and (self.session is None or welcome is not self.session.welcome)
        if changed:
            self._apply_session(self._session_of(welcome))
        if received is not None:
            self.policy.load_policy_state_dict(self._checked(received))
            self.policy_version = received.version
            self.link.hold(received)
        while not self._league_inbox.empty():
            message = self._league_inbox.get()
            if isinstance(message, pb.LeagueUpdate):
                self.roles.league_update(message)
            elif policy_key(message.welcome.settings) == policy_key(self.session.settings):  # else an older network's
                self.roles.snapshot(message.opponent, self._checked(message))
        if changed or received is not None:
            self.roles.policy_changed(self.policy_version, self.policy)
        return self.policy_version >= 0

    def _checked(self, received: ReceivedPolicy) -> dict[str, torch.Tensor]:
        """``received``'s weights; LinkError (the learner refused for good) if they do not fit the session's network."""
        try:
            wire.check_state_dict(received.state, self.session.policy_spec)
        except wire.WireError as exc:
            raise self._refuse(f"learner {received.welcome.learner_id} at {self.link.address} sent policy version "
                               f"{received.version} that does not fit the network its Welcome describes: {exc}") from None
        return received.state

    def _refuse(self, reason: str) -> LinkError:
        """Stop the link for good for ``reason``; the error to raise."""
        error = LinkError(reason)
        self.link.refuse(error)
        return error

    def _apply_session(self, session: AppliedWelcome) -> None:
        """Close out the previous session if needed, then rebuild what depends on the settings."""
        settings, previous = session.settings, self.session
        if previous is not None and _reshapes_batches(previous, session):
            self._collect(self.assembler.flush())
            self._send_batches(previous.settings, everything=True)
        new_network = previous is None or policy_key(settings) != policy_key(previous.settings)
        switched = new_network and self._switch_vector_mode(session.policy)
        restarted = new_network and (switched or self.stepper.in_flight)  # actions of the old network under way
        if restarted:  # their steps are dropped with the episodes under way: the envs start anew
            self.stepper.restart()
            self.episodes = EpisodeTally(self.config.num_envs)
        if new_network:
            self.policy, self.policy_version = session.policy, -1
            self.roles.new_network(session.policy.spec, settings)
        elif settings.algorithm_config != previous.settings.algorithm_config:
            self.policy.retune(session.policy.config)
        if previous is None or _reshapes_batches(previous, session):
            self.frame_layout, assembling = self._assembly(self.policy.spec)
            if self.frame_layout is not None:  # everything pending went out above
                self.pending = FramePending(self.frame_ids, self.frame_layout)
            assembler = assembling.make_assembler(self.config.num_envs, self.policy)
            if previous is not None and not restarted:
                assembler.inherit(self.assembler)
            self.assembler = assembler
        num_actors = max(settings.num_actors, 1)
        self.exploration = self.policy.exploration(settings.actor_index % num_actors, num_actors)
        self.session = session
        changed = ["all"] if previous is None else [
            *(["learner"] if session.learner_id != previous.learner_id else []),
            *(f.name for f in pb.Settings.DESCRIPTOR.fields
              if getattr(settings, f.name) != getattr(previous.settings, f.name))]
        logger.info("applied settings from learner %s: batch_size=%d max_unacked=%d codec=%s actor_priorities=%s "
                    "exploration=%.6g (actor %d of %d); changed: %s; %s network %s; vector mode %s%s",
                    session.learner_id, settings.batch_size, settings.max_unacked,
                    wire.Codec.parse(settings.codec).label, settings.actor_priorities, self.exploration,
                    settings.actor_index % num_actors, num_actors, ", ".join(changed) or "nothing",
                    settings.algorithm, f"built from {settings.algorithm_config}" if new_network else "kept",
                    self.vector_mode, " (auto)" if self.config.vector_mode == AUTO_MODE else "")

    def _loop(self, max_env_steps: int) -> None:
        num_envs = self.config.num_envs
        profile = self.profile
        while not self.stop_event.is_set() and not (max_env_steps and self.env_steps >= max_env_steps):
            if self.link.error:
                raise self.link.error
            if not self._follow_learner():
                profile.mark("weights")
                self.stop_event.wait(0.05)  # a new network waits for its first weights
                profile.mark("wait_weights")
                continue
            profile.mark("weights")
            if self.stepper.obs is None:  # reset once there are weights: a self-play env draws its first opponents then
                ids = self._frame_ids(self.stepper.reset(self.config.seed), np.ones(num_envs, bool))
                profile.mark("env")
            step = self.stepper.step(self.policy, self.exploration, self.policy_version)
            steps, resets = self.episodes.step(step.rewards, step.terminated, step.truncated)
            self.env_steps += steps
            profile.env_steps = self.env_steps
            self.steps_meter.add(steps)
            next_ids = self._frame_ids(step.next_obs, resets)
            pushed = (ids, step.actions, step.rewards, step.terminated, step.truncated, next_ids)
            self._collect(self.assembler.push(*pushed) if step.acted is None
                          else self.assembler.push(*pushed, acted=step.acted), step.version)
            if steps < num_envs:
                self.policy.reset_memory(resets)  # autoreset envs begin episodes: a recurrent policy forgets
            ids = next_ids
            profile.mark("assemble")
            self._send_batches(self.session.settings)
            if time.monotonic() - self._last_stats >= self.config.stats_every:
                self._send_stats()
            profile.mark("send")
        if self.episodes.steps or self.episodes.finished_returns:
            self._send_stats()

    def _send_stats(self) -> None:
        """Report the episodes finished since the last report, and the env steps no batch carried yet."""
        returns, lengths, _ = self.episodes.take()
        steps, self._steps_reported = self.env_steps - self._steps_reported, self.env_steps
        self._last_stats = time.monotonic()
        self.link.send_stats(pb.EpisodeStats(returns=returns, lengths=lengths, env_steps=steps,
                                             policy_version=self.policy_version))

    def _first_seq(self) -> int:
        """Seqs must rise across restarts of this actor id: start from the wall clock in microseconds."""
        return time.time_ns() // 1000

    def _frame_ids(self, obs, resets: np.ndarray):
        """What the assembler takes for observations ``obs``: themselves, or with frames stacked their frames' ids
        (``resets``: the envs whose observation begins an episode)."""
        return obs if self.frame_ids is None else self.frame_ids.observe(obs, resets)

    def _collect(self, transitions: dict[str, np.ndarray] | None, version: int | None = None) -> None:
        """Add transitions to those waiting for a batch, made by ``version`` (default: the one this actor runs)."""
        self.pending.add(transitions, self.policy_version if version is None else version)

    def _send_batches(self, settings: pb.Settings, everything: bool = False) -> None:
        """Send every full batch of ``settings`` (with ``everything``, a last smaller one too), each with
        the next seq."""
        codec = wire.Codec.parse(settings.codec)
        while self.pending.ready(settings.batch_size, everything):
            batch, version = self.pending.take(settings.batch_size)  # version: the oldest that made any of it
            self.profile.mark("assemble")
            priorities = batch_priorities(batch, settings, self.policy, self.frame_layout)
            self.profile.mark("priorities")
            self._send(batch, priorities, self._seq, version, codec)
            self._seq += 1

    def _send(self, batch: dict[str, np.ndarray], priorities: list[float], seq: int, version: int,
              codec: wire.Codec) -> None:
        games, opponents = self.roles.batch_extras()
        steps, self._steps_reported = self.env_steps - self._steps_reported, self.env_steps
        message = wire.encode_batch_message(seq, version, rows(batch), wire.encode_batch(batch, codec),
                                            codec, priorities, games, opponents, env_steps=steps)
        self.profile.mark("encode")
        waited = self.link.waited
        try:
            while not self.link.send_batch(seq, message, timeout=0.5, policy_version=version):
                if self.stop_event.is_set():
                    return
            self.batches_sent += 1
        finally:
            self.profile.mark("send")
            self.profile.move(self.link.waited - waited, "send", "wait_acks")


def _reshapes_batches(previous: AppliedWelcome, session: AppliedWelcome) -> bool:
    """Whether data collected under ``previous`` must go out before ``session`` applies: another
    learner (its versions may mean something else) or settings that shape transitions and batches."""
    shaping = ("batch_size", "codec", "actor_priorities")
    return (session.learner_id != previous.learner_id or policy_key(session.settings) != policy_key(previous.settings)
            or any(getattr(session.settings, name) != getattr(previous.settings, name) for name in shaping))
