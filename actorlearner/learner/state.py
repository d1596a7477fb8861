"""The learner's state on disk: one checkpoint of every part as of one instant, and the resume from the
newest usable one (data-parallel: the newest every rank has)."""

from __future__ import annotations

import logging
import shutil
from typing import TYPE_CHECKING

from actorlearner.checkpoint.parts import CheckpointError
from actorlearner.checkpoint.rng import load_rng_state, rng_state
from actorlearner.learner.parameters import ParameterError

if TYPE_CHECKING:
    from actorlearner.learner.learner import Learner

logger = logging.getLogger(__name__)


def save(learner: Learner) -> None:
    """Write model, optimizer, buffer (if configured), version, seq table and RNGs atomically.

    Call it from the trainer thread (or once it has stopped): the algorithm must not change meanwhile.
    Ingest goes on: the replay lock is held to snapshot the seq table, limiter, counters and
    replay as of one instant, then only for a moment per chunk of replay rows written.
    """
    learner.publishing.flush()  # the roles' state holds every version published so far
    replay = learner.replay
    with learner.replay_lock:
        learner.ingestion.wait_for_open_inserts()
        step = learner.updates
        # The limiter's inserts are the replay's plus those of batches admitted but not stored yet
        # (and dropped if the learner stops first): the replay's own count is this instant's.
        learner_state = {"version": learner.version, "updates": learner.updates, "env_steps": learner.env_steps,
                         "seq_table": dict(learner.registry.seq_table), "inserts": replay.inserted - replay.abandoned,
                         "samples": learner.limiter.samples, "shift": learner.limiter.shift,
                         "parameters": dict(learner.changed_parameters), "world_size": learner.world.size}
        snapshot = replay.snapshot(learner.replay_lock) if learner.config.checkpoint_replay else None
        roles_state = learner.roles.state()
    try:
        parts = {"algorithm": learner.algorithm.state_dict(), "learner": learner_state,
                 "rng": rng_state(learner.device), "run": learner.run_record()}
        if snapshot is not None:
            parts["replay"] = snapshot.state()
        if roles_state is not None:
            parts["league"] = roles_state
        learner.checkpoints.save(step, parts)
    finally:
        if snapshot is not None:
            snapshot.close()


def restore(learner: Learner) -> None:
    """Resume from the newest usable checkpoint, if there is one; runtime parameters first, so that the
    optimizer state and replay priorities load into the tuned parts."""
    found = learner.checkpoints.load_latest() if learner.checkpoints else None
    found = _common_checkpoint(learner, found)
    if found is None:
        return
    step, parts = found
    state = parts["learner"]
    written_by = int(state.get("world_size", 1))
    if written_by != learner.world.size:
        raise ValueError(f"checkpoint {step} in {learner.checkpoints.directory} was written by {written_by} "
                         f"data-parallel learners; resume it with that world_size, not {learner.world.size}")
    if state.get("parameters"):
        try:
            learner.set_parameters([(str(k), str(v)) for k, v in state["parameters"].items()], restored=True)
        except ParameterError as exc:
            logger.warning("checkpoint %d: runtime parameters %s not restored: %s", step, state["parameters"], exc)
    learner.algorithm.load_state_dict(parts["algorithm"])
    if "replay" in parts:  # without it the buffer starts empty, and so does the limiter's count
        learner.replay.load_state_dict(parts["replay"])
        learner.limiter.load_state_dict(state)
    learner.training.version, learner.training.updates = int(state["version"]), int(state["updates"])
    learner.ingestion.env_steps = int(state["env_steps"])
    learner.registry.restore({str(k): int(v) for k, v in state["seq_table"].items()})
    if "league" in parts:
        learner.roles.load_state(parts["league"])
    if "rng" in parts:
        load_rng_state(parts["rng"], learner.device)
    logger.info("restored checkpoint %d: version %d, %d items in replay", step, learner.version, len(learner.replay))


def _common_checkpoint(learner: Learner, found: tuple[int, dict] | None) -> tuple[int, dict] | None:
    """The checkpoint every rank resumes from: the newest step all of them have (a crash may have cut
    a save short on some). ValueError when some ranks have checkpoints and others none."""
    step = found[0] if found else -1
    low, high = learner.data_parallel.extremes(step)
    if low == high:
        return found
    if low < 0:
        raise ValueError(f"some ranks have checkpoints (up to step {high}) and some none: a data-parallel "
                         "learner resumes only with every rank's checkpoint_dir/rank-R")
    rank, store = learner.world.rank, learner.checkpoints
    logger.warning("rank %d: resuming from checkpoint %d, the newest every rank has, not %d; newer ones "
                   "moved aside to ckpt-N.ahead", rank, low, step)
    try:
        found = store.load(store.directory / f"ckpt-{low:012d}")
    except (CheckpointError, OSError) as exc:
        raise ValueError(f"rank {rank}: checkpoint {low}, the newest every rank has, is unusable "
                         f"here: {exc}") from None
    for newer, path in store.checkpoints():
        if newer > low:  # never to be resumed by this world: out of the way of later resumes and pruning
            aside = path.with_name(path.name + ".ahead")
            shutil.rmtree(aside, ignore_errors=True)
            path.rename(aside)
    return found
