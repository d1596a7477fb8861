"""The learner's checkpoints on disk: the store (when configured), the best policy's slot, and which
checkpoint to resume (data-parallel: the newest every rank has, each rank its own shard)."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping

from actorlearner.checkpoint.parts import CheckpointError
from actorlearner.checkpoint.store import CheckpointStore
from actorlearner.config import LearnerConfig
from actorlearner.learner.distributed import Ranks

logger = logging.getLogger(__name__)


class Checkpointing:
    """Where checkpoints go: ``checkpoint_dir`` (``rank-R`` below it for a data-parallel rank), or nowhere
    when it is empty. ``run_record`` is what a checkpoint needs to rebuild its policy without the learner."""

    def __init__(self, config: LearnerConfig, data_parallel: Ranks, run_record: Callable[[], dict]):
        directory, world = config.checkpoint_dir, data_parallel.world
        if directory and world.size > 1:  # each rank its own shard (and the same networks)
            directory = os.path.join(directory, f"rank-{world.rank}")
        self.store = CheckpointStore(directory, config.keep_checkpoints) if directory else None
        self.data_parallel, self.run_record = data_parallel, run_record

    def __bool__(self) -> bool:
        return self.store is not None

    def save(self, step: int, parts: Mapping[str, dict]) -> None:
        """Write ``parts`` (and the run record) as checkpoint ``step``, atomically."""
        self.store.save(step, {**parts, "run": self.run_record()})

    def save_best(self, policy_state: dict, score: float, version: int) -> None:
        """``policy_state`` (version ``version``) into the best slot (nothing without a store)."""
        if self.store is not None:
            self.store.save_best({"policy": policy_state, "run": self.run_record()}, score, step=version)

    def latest(self) -> tuple[int, dict] | None:
        """The checkpoint to resume: the newest usable one; data-parallel, the newest every rank has (a
        crash may have cut a save short on some). ValueError when some ranks have checkpoints and others
        none, or when it was written by another number of ranks."""
        found = self.store.load_latest() if self.store is not None else None
        step = found[0] if found else -1
        low, high = self.data_parallel.extremes(step)
        if low != high:
            found = self._newest_common(low, step, high)
        if found is not None:
            step, parts = found
            written_by, size = int(parts["learner"].get("world_size", 1)), self.data_parallel.world.size
            if written_by != size:
                raise ValueError(f"checkpoint {step} in {self.store.directory} was written by {written_by} "
                                 f"data-parallel learners; resume it with that world_size, not {size}")
        return found

    def _newest_common(self, low: int, step: int, high: int) -> tuple[int, dict]:
        """Checkpoint ``low``, the newest every rank has; newer ones moved aside to ``ckpt-N.ahead``."""
        if low < 0:
            raise ValueError(f"some ranks have checkpoints (up to step {high}) and some none: a data-parallel "
                             "learner resumes only with every rank's checkpoint_dir/rank-R")
        rank, store = self.data_parallel.world.rank, self.store
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
