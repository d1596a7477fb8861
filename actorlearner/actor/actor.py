"""The actor process: a vector env, a local policy copy, n-step transitions streamed to the learner."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import numpy as np
import torch

from actorlearner import specs, wire
from actorlearner.actor.link import LearnerLink
from actorlearner.actor.nstep import NStepAssembler
from actorlearner.algorithms import make_algorithm
from actorlearner.algorithms.dqn import DQNConfig, apex_epsilons
from actorlearner.config import ActorConfig
from actorlearner.envs import make_vector_env
from actorlearner.metrics import Metric
from actorlearner.telemetry import RateMeter
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)


class Actor:
    """Steps envs with epsilon-greedy actions of the newest policy it has and streams batches.

    The learner's Welcome fixes the settings (n-step, gamma, batch size, window, codec,
    this actor's Ape-X epsilon); policy updates are applied between env steps and every
    batch carries the version that produced it.
    """

    def __init__(self, config: ActorConfig):
        self.config = config
        torch.set_num_threads(config.torch_threads)
        self.actor_id = config.actor_id or f"{socket.gethostname()}-{os.getpid()}"
        self.envs = make_vector_env(config.env, config.num_envs, config.vector_mode, config.security)
        obs_space, act_space = self.envs.single_observation_space, self.envs.single_action_space
        self.obs_space, self.act_space = obs_space, act_space
        hello = pb.Hello(actor_id=self.actor_id, protocol_version=wire.PROTOCOL_VERSION, algorithm="dqn",
                         env_spec=specs.env_spec(config.env, obs_space, act_space), policy_version=-1)
        self.link = LearnerLink(config.learner, hello, config.max_message_bytes,
                                config.reconnect_initial, config.reconnect_max, config.security)
        self.algorithm = None
        self.policy_version = -1
        self.env_steps = 0
        self.steps_meter = RateMeter()
        self.last_return = float("nan")
        self.batches_sent = 0
        self.stop_event = threading.Event()

    def run(self, max_env_steps: int = 0) -> None:
        """Act until :meth:`stop` (or ``max_env_steps`` real env steps), then flush unacked batches."""
        self.link.start()
        try:
            self._wait_for_policy()
            self._loop(max_env_steps)
        finally:
            self.link.flush(timeout=5.0)
            self.link.close()
            self.envs.close()
            logger.info("unacked window peak %d of %d batches", self.link.peak_unacked, self.link.max_unacked)

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
            Metric("episode_return", "Return of the last finished episode (NaN before any).", self.last_return),
        ]

    def _wait_for_policy(self) -> None:
        """Block until the learner has welcomed us and sent a policy."""
        while not self.stop_event.is_set():
            if self.link.error:
                raise self.link.error
            if self.link.welcomed.wait(0.1) and self._apply_policy():
                return

    def _apply_policy(self) -> bool:
        """Load the newest policy the link holds; build the network on first use."""
        latest = self.link.take_policy()
        if latest is None:
            return False
        version, state = latest
        if self.algorithm is None:
            config = DQNConfig(**{**json.loads(self.link.welcome.settings.algorithm_config or "{}"),
                                  "device": "cpu", "seed": self.config.seed})
            self.algorithm = make_algorithm("dqn", self.obs_space, self.act_space, config)
        self.algorithm.load_policy_state_dict(state)
        self.policy_version = version
        self.link.set_held_version(version)
        return True

    def _loop(self, max_env_steps: int) -> None:
        settings = self.link.welcome.settings
        epsilon = apex_epsilons(max(settings.num_actors, 1), settings.epsilon_base,
                                settings.epsilon_alpha)[settings.actor_index % max(settings.num_actors, 1)]
        num_envs = self.config.num_envs
        assembler = NStepAssembler(num_envs, settings.n_step, settings.gamma, self.obs_space.shape,
                                   obs_dtype=self.obs_space.dtype)
        codec = wire.Codec.parse(settings.codec)
        pending: list[dict[str, np.ndarray]] = []
        pending_count, batch_version, seq = 0, self.policy_version, self._first_seq()
        returns, lengths = np.zeros(num_envs), np.zeros(num_envs, np.int64)
        was_done = np.zeros(num_envs, bool)
        done_returns, done_lengths, steps_since_stats = [], [], 0
        last_stats = time.monotonic()
        obs, _ = self.envs.reset(seed=self.config.seed)
        while not self.stop_event.is_set() and not (max_env_steps and self.env_steps >= max_env_steps):
            if self.link.error:
                raise self.link.error
            self._apply_policy()
            actions = self.algorithm.act(obs, epsilon)
            next_obs, rewards, terminated, truncated, _ = self.envs.step(actions)
            real = ~was_done  # with next-step autoreset, a step after an episode end is a reset
            self.env_steps += int(real.sum())
            self.steps_meter.add(int(real.sum()))
            steps_since_stats += int(real.sum())
            returns += np.where(real, rewards, 0.0)
            lengths += real
            done = (terminated | truncated) & real
            for i in np.flatnonzero(done):
                done_returns.append(float(returns[i]))
                done_lengths.append(int(lengths[i]))
                self.last_return = done_returns[-1]
            returns[done], lengths[done] = 0.0, 0
            was_done = done
            transitions = assembler.push(obs, actions, rewards, terminated, truncated, next_obs)
            obs = next_obs
            if transitions is not None and len(transitions["reward"]):
                if not pending:
                    batch_version = self.policy_version
                pending.append(transitions)
                pending_count += len(transitions["reward"])
            while pending_count >= settings.batch_size:
                batch, pending, pending_count = _cut(pending, settings.batch_size)
                self._send(batch, seq, batch_version, codec, settings.actor_priorities)
                seq += 1
                batch_version = self.policy_version
            if time.monotonic() - last_stats >= self.config.stats_every:
                self.link.send_stats(pb.EpisodeStats(returns=done_returns, lengths=done_lengths,
                                                     env_steps=steps_since_stats, policy_version=self.policy_version))
                done_returns, done_lengths, steps_since_stats = [], [], 0
                last_stats = time.monotonic()
        if steps_since_stats or done_returns:
            self.link.send_stats(pb.EpisodeStats(returns=done_returns, lengths=done_lengths,
                                                 env_steps=steps_since_stats, policy_version=self.policy_version))

    def _first_seq(self) -> int:
        """Seqs must rise across restarts of this actor id: start from the wall clock in microseconds."""
        return time.time_ns() // 1000

    def _send(self, batch: dict[str, np.ndarray], seq: int, version: int, codec: wire.Codec,
              with_priorities: bool) -> None:
        priorities = []
        if with_priorities:
            tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
            priorities = self.algorithm.initial_priorities(tensors).tolist()
        message = wire.encode_batch_message(seq, version, len(batch["reward"]), wire.encode_batch(batch, codec),
                                            codec, priorities)
        while not self.link.send_batch(seq, message, timeout=0.5):
            if self.stop_event.is_set():
                return
        self.batches_sent += 1


def _cut(pending: list[dict[str, np.ndarray]], size: int):
    """Split the first ``size`` transitions off a list of transition blocks."""
    merged = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
    head = {k: v[:size] for k, v in merged.items()}
    rest = {k: v[size:] for k, v in merged.items()}
    count = len(rest["reward"])
    return head, ([rest] if count else []), count
