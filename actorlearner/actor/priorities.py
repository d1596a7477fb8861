"""A batch's initial replay priorities on the actor: the one place they are made."""

from __future__ import annotations

import numpy as np
import torch

from actorlearner import wire
from actorlearner.actor.batching import rows
from actorlearner.algorithms import PRIORITY, Policy
from actorlearner.frames import FrameLayout
from actorlearner.v1 import learner_pb2 as pb


def batch_priorities(batch: dict[str, np.ndarray], settings: pb.Settings, policy: Policy,
                     frame_layout: FrameLayout | None) -> list[float]:
    """Take the assembler's `PRIORITY` items out of ``batch`` and return what the batch message carries.

    [] unless the session's ``settings`` ask for actor priorities; else those the assembler gave, and
    for the rest (NaN, or all when it gave none) the policy's `initial_priorities` ([] when it gives
    none: the learner then uses its maximum). ``frame_layout``: the session's, when frames are stacked.
    """
    assembled = batch.pop(PRIORITY, None)
    if not settings.actor_priorities:
        return []
    missing = np.ones(rows(batch), bool) if assembled is None else np.isnan(assembled)
    if not missing.any():
        return assembled.tolist()
    tensors = {k: torch.from_numpy(v[missing]) for k, v in batch.items() if k != wire.FRAMES}
    if frame_layout is not None:  # the algorithm computes on the stacks
        tensors.update(frame_layout.stacked({k: tensors[k] for k in frame_layout.refs},
                                            torch.from_numpy(batch[wire.FRAMES])))
    computed = policy.initial_priorities(tensors)
    if computed is None:
        return []
    priorities = np.empty(rows(batch), np.float32) if assembled is None else assembled.copy()
    priorities[missing] = computed.numpy()
    return priorities.tolist()
