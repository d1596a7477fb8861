"""``actorlearner run``: a learner in this process and N actor processes on this machine, until solved, out of
time, or trained --max-updates and evaluated."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
import threading
import time
from typing import TYPE_CHECKING

from actorlearner.cli.common import logger, on_signals, started, warn_if_exposed
from actorlearner.cli.learner import start_learner
from actorlearner.cli.local_actors import LocalActor, stop_actors
from actorlearner.config import LearnerConfig, RunConfig, options
from actorlearner.config.learner import learner_settings
from actorlearner.curve import LearningCurve, Point, target_reached
from actorlearner.telemetry import format_progress
from actorlearner.transport import SecurityConfig

if TYPE_CHECKING:
    from actorlearner.learner.learner import Learner


def run_command(config: RunConfig) -> int:
    """Learner in this process, actors as child processes; exit 0 if solved, else 1."""
    from actorlearner.actor.actor import VECTOR_MODE_CHOICES

    if config.learner.world_size > 1:
        logger.error("run trains one learner; data-parallel ones are 'actorlearner learner --world-size N' each")
        return 2
    if config.vector_mode not in VECTOR_MODE_CHOICES:
        logger.error("--vector-mode must be one of %s, got %r", ", ".join(VECTOR_MODE_CHOICES), config.vector_mode)
        return 2
    if config.target_holds < 1:
        logger.error("--target-holds must be at least 1, got %d", config.target_holds)
        return 2
    run_dir = config.run_dir or new_run_dir(config.learner)
    warn_if_exposed(config.learner.host, config.learner.security)
    learner_config = dataclasses.replace(
        config.learner, num_actors=config.actors, world_size=1,  # WORLD_SIZE set or not
        checkpoint_dir=config.learner.checkpoint_dir or os.path.join(run_dir, "checkpoints"),
        logdir=config.learner.logdir or os.path.join(run_dir, "tb"))
    actors = [_fork_actor(config, i) for i in range(config.actors)]  # first: they build their envs meanwhile
    try:
        return _train(config, learner_config, run_dir, actors)
    finally:
        stop_actors(actors)


def _train(config: RunConfig, learner_config: LearnerConfig, run_dir: str, actors: list[LocalActor]) -> int:
    """Build the learner, send the actors its address, train until a reason to end; print the result line."""
    from actorlearner.learner.server import serve

    learner = start_learner(learner_config)
    if learner is None:
        return 2
    started()
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "settings.json"), "w") as fh:  # how this run trained, its preset included
        json.dump(learner_settings(learner_config, learner.algorithm_config), fh, indent=1, default=str)
    stop = threading.Event()
    on_signals(stop.set)
    start = time.monotonic()
    eval_return = None
    curve, evaluations = LearningCurve(), 0
    host = learner_config.host
    with serve(learner, host, learner_config.port) as port:
        learner.start()
        print(f"learner listening on {host}:{port}", flush=True)  # for `actorlearner status`, `set`, more actors
        for actor in actors:
            actor.connect(f"{local_address(host)}:{port}")
        last_print = 0.0
        evaluation, progress = learner.evaluation, learner.progress
        ended = "stopped"  # by SIGINT or SIGTERM, unless the loop finds another reason
        while not stop.wait(0.5):
            elapsed = time.monotonic() - start
            new_eval = evaluation.evaluations > evaluations
            evaluations = evaluation.evaluations
            curve.record(elapsed, progress.env_steps, progress.recent_return, evaluation.mean if new_eval else None)
            eval_return = evaluation.mean if evaluation.evaluations else None
            held = target_reached(curve.evaluations, config.target_return, config.target_holds)[1]
            reason = _reason_to_end(config, learner, actors, held is not None, elapsed)
            if reason:
                ended = reason
                break
            if elapsed - last_print >= 2.0:
                last_print = elapsed
                sps = progress.env_steps / max(elapsed, 1e-9)
                print(f"[{elapsed:6.1f}s] {format_progress({**learner.summary(), 'sps': sps})}", file=sys.stderr, flush=True)
        stop_actors(actors)
    learner.stop()  # joins an evaluation already under way; its result counts if the run was not solved yet
    elapsed = time.monotonic() - start
    evaluation, progress = learner.evaluation, learner.progress
    curve.record(elapsed, progress.env_steps, progress.recent_return,
                 evaluation.mean if evaluation.evaluations > evaluations else None)
    if ended != "solved":
        eval_return = evaluation.mean if evaluation.evaluations else None
    first_hit, held = target_reached(curve.evaluations, config.target_return, config.target_holds)
    solved = held is not None
    result = {"solved": solved, "ended": "solved" if solved else ended, "eval_return": eval_return,
              "seconds": round(elapsed, 2), "env_steps": progress.env_steps,
              "updates": progress.updates, "policy_version": progress.version, "run_dir": run_dir,
              "first_hit": _when(first_hit), "solved_at": _when(held)}
    if config.plot:
        result["curve"] = os.path.join(run_dir, "curve.png")
        curve.save_png(result["curve"], f"{learner_config.algorithm} on {learner_config.env}, seed {learner_config.seed}")
        print(f"learning curve: {result['curve']}", file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)
    return 0 if solved else 1


def _when(point: Point | None) -> dict | None:
    """An evaluation's wall seconds and env steps, for the result line."""
    return point and {"seconds": round(point[0], 2), "env_steps": point[1]}


def new_run_dir(config: LearnerConfig) -> str:
    """``runs/<env>-<algorithm>-<date-time>``, with characters a path cannot hold replaced by ``_``."""
    name = f"{config.env}-{config.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
    return os.path.join("runs", re.sub(r"[^A-Za-z0-9._-]", "_", name))


def local_address(host: str) -> str:
    """Where a process on this machine reaches a server bound to ``host``: loopback for a wildcard address."""
    return "127.0.0.1" if host.strip("[]") in ("", "0.0.0.0", "::") else host


def _fork_actor(config: RunConfig, index: int) -> LocalActor:
    argv = ["--env", config.learner.env, "--num-envs", str(config.num_envs), "--vector-mode", config.vector_mode,
            "--frame-stack", str(config.learner.frame_stack),
            "--seed", str(config.learner.seed * 1000 + index), "--actor-id", f"actor-{index}"]
    security = {opt.env_var: str(value) for opt in options(SecurityConfig)
                if (value := getattr(config.learner.security, opt.path[-1]))}  # by env var: no token in ps
    return LocalActor(argv, security, f"actor-{index}")


def _reason_to_end(config: RunConfig, learner: Learner, actors: list[LocalActor], solved: bool,
                   elapsed: float) -> str | None:
    """Why the run ends now (the result's ``ended``), or None while it goes on. "trained": training reached
    --max-updates and the last version it published has been evaluated (if it evaluates)."""
    limit, progress = learner.config.max_updates, learner.progress
    if solved:
        return "solved"
    if elapsed >= config.max_seconds:
        return "out of time"
    if limit and progress.updates >= limit and (
            learner.config.eval_every <= 0 or learner.evaluation.version >= progress.version):
        return "trained"
    if all(actor.poll() is not None for actor in actors):
        logger.error("every actor exited; stopping")
        return "actors exited"
    if learner.failed.is_set():
        return "training failed"
    return None
