"""What the learner reports of itself: GetStatus, Prometheus metrics, the progress line, TensorBoard rates
and its settings table."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from actorlearner import telemetry
from actorlearner.config import LearnerConfig
from actorlearner.learner.parameters import current_values
from actorlearner.metrics import Metric
from actorlearner.v1 import learner_pb2 as pb

if TYPE_CHECKING:
    from actorlearner.learner.learner import Learner


def _parameters(values: dict[str, str]) -> list[pb.Parameter]:
    return [pb.Parameter(name=name, value=value) for name, value in values.items()]


def status(learner: Learner) -> pb.StatusResponse:
    """A snapshot for GetStatus: the learner and every actor seen within ``actor_ttl``."""
    learner.registry.forget_departed()
    version, evaluation = learner.version, learner.evaluation
    actors = [pb.ActorStatus(actor_id=r.actor_id, policy_version=r.policy_version, lag=version - r.policy_version,
                             batches_per_second=r.batches.rate(), last_seen_unix=r.last_seen, connected=r.connected,
                             duplicates=r.duplicates, inserted=int(r.batches.total), transitions=r.transitions,
                             via=r.via, relay=r.relay)
              for r in learner.registry.records()]
    return pb.StatusResponse(
        policy_version=version, updates=learner.updates, buffer_size=len(learner.replay),
        inserted=learner.inserted_batches, insert_rate=learner.ingestion.insert_meter.rate(),
        sample_rate=learner.training.sample_meter.rate(), actors=actors, env_steps=learner.env_steps,
        evaluations=evaluation.evaluations, eval_mean_return=evaluation.mean if evaluation.evaluations else 0.0,
        eval_best_return=evaluation.best if evaluation.evaluations else 0.0, learner_id=learner.learner_id,
        parameters=_parameters(current_values(learner.config, learner.algorithm_class.name, learner.algorithm_config)),
        changed_parameters=_parameters(learner.changed_parameters),
        league=learner.roles.status())


def metrics(learner: Learner) -> list[Metric]:
    """What the learner exposes to Prometheus, read at each scrape."""
    records = learner.registry.records()
    version = learner.version
    connected = [r for r in records if r.connected and not r.relay]  # actors behind relays count, relays not
    return [
        Metric("policy_version", "Newest published policy version.", version),
        Metric("updates_total", "Training updates.", learner.updates, counter=True),
        Metric("buffer_size", "Transitions in the replay buffer.", len(learner.replay)),
        Metric("inserts_per_second", "Transitions inserted per second.", learner.ingestion.insert_meter.rate()),
        Metric("samples_per_second", "Transitions sampled per second.", learner.training.sample_meter.rate()),
        Metric("env_steps_total", "Env steps reported by actors.", learner.env_steps, counter=True),
        Metric("episode_return", "Mean return of recent actor episodes (NaN before any).", learner.recent_return),
        Metric("eval_mean_return", "Mean return of the last greedy evaluation (NaN before any).", learner.eval_mean),
        Metric("connected_actors", "Actors with an open stream.", len(connected)),
        Metric("known_actors", "Actor ids remembered (connected, or gone less than actor_ttl ago).", len(records)),
        Metric("inserts_waiting", "Batches waiting for the rate limiter's room (backpressure on actors).",
               learner.limiter.waiting["inserts"]),
        Metric("actor_lag", "Learner version minus the version each connected actor runs.",
               {r.actor_id: version - r.policy_version for r in connected}),
        *learner.roles.metrics(),
    ]


def progress(learner: Learner) -> dict[str, Any]:
    """Numbers for the one-line progress display."""
    version = learner.version
    lags = [version - r.policy_version for r in learner.registry.records() if r.connected]
    return {"env_steps": learner.env_steps, "return": learner.recent_return, "version": version,
            "lag_max": max(lags, default=0), "buffer_size": len(learner.replay),
            "buffer_capacity": learner.replay.capacity, "updates": learner.updates,
            "eval": learner.eval_mean if learner.evaluations else None}


def rates(learner: Learner) -> dict[str, float]:
    """The replay's and the policy's numbers the trainer writes to TensorBoard with its own."""
    return {telemetry.REPLAY_SIZE: len(learner.replay), telemetry.REPLAY_INSERT_RATE: learner.ingestion.insert_meter.rate(),
            telemetry.REPLAY_SAMPLE_RATE: learner.training.sample_meter.rate(), telemetry.POLICY_VERSION: learner.version,
            telemetry.POLICY_LAG_MAX: progress(learner)["lag_max"]}


def hyperparameters_table(config: LearnerConfig, algorithm_config: Any) -> str:
    """The learner's settings and the algorithm's, as a markdown table (security settings left out)."""
    settings = {name: value for name, value in dataclasses.asdict(config).items()
                if name not in ("security", "algorithm_config")}
    settings.update({f"{config.algorithm}.{name}": value
                     for name, value in dataclasses.asdict(algorithm_config).items()})
    rows = "\n".join(f"| {name} | {value} |" for name, value in settings.items())
    return f"| setting | value |\n|---|---|\n{rows}"
