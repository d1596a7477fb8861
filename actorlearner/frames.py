"""Frame stacking stored once: which replay fields refer to frames, and how a batch carries its frames.

With ``--frame-stack K`` an observation is the env's last K frames, ``(K, *frame)``, so consecutive
observations share K - 1 frames. Instead of stacks, an actor sends each frame once: a batch's
:data:`~actorlearner.wire.FRAMES` field holds every frame its items refer to, once, and each stacked
observation field holds, in place of the stack, the indices of its K frames in that field
(``(..., K)`` int64, oldest first). The replay keeps frames once, in a ring of their own, and
rebuilds the stacks when it samples (:class:`~actorlearner.replay.frame_ring.FrameRing`).

Which fields those are comes from the algorithm itself: its transition fields over a space of
*frame ids*, ``Box(int64, (K,))``, name the ids of the frames wherever its transition fields over
the stacked space name stacks. So every algorithm's assembler (n-step windows, R2D2's sequences,
SAC's transitions) runs unchanged on ids, and overlapping items share their frames.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from actorlearner.wire import FRAMES

if TYPE_CHECKING:  # torch is imported where a layout is made: an env module may use STACKED_FRAMES without it
    import torch

FieldSpecs = dict[str, tuple[tuple[int, ...], "torch.dtype"]]


@dataclass(frozen=True)
class FrameLayout:
    """How a frame-stacked algorithm's items refer to frames."""

    stack: int
    """K, the frames in one observation."""
    frame_shape: tuple[int, ...]
    frame_dtype: torch.dtype
    refs: tuple[str, ...]
    """The fields that hold frame indices ``(..., K)`` where the algorithm's items hold stacks."""

    def stacked(self, refs: Mapping[str, np.ndarray | torch.Tensor], frames: np.ndarray | torch.Tensor) -> dict:
        """The stacks the indices in ``refs`` stand for: ``frames[refs[name]]`` for each name."""
        return {name: frames[index] for name, index in refs.items()}


STACKED_FRAMES = "stacked_frames"
"""The ``metadata`` key by which an env that stacks its own frames says how many: its observation is
``(K, *frame)``, the newest frame last, each step shifting one new frame in."""


def frame_stack_of(env: Any, frame_stack: int) -> int:
    """The frames an env's observations stack: ``frame_stack`` (``--frame-stack``, which wraps the env),
    or what an env that stacks its own declares in ``metadata``; ValueError when both say so."""
    declared = int(env.metadata.get(STACKED_FRAMES, 0) or 0)
    if declared and frame_stack:
        raise ValueError(f"the env stacks its own {declared} frames (metadata[{STACKED_FRAMES!r}]): "
                         f"--frame-stack {frame_stack} would stack the stacks")
    return frame_stack or declared


def frame_id_space(stacked: gym.Space) -> gym.spaces.Box:
    """The space of a stack's frame ids, ``(K,)`` int64, for a stacked observation space ``(K, *frame)``."""
    if not isinstance(stacked, gym.spaces.Box) or len(stacked.shape) < 2:
        raise ValueError(f"a frame-stacked observation is a Box (K, *frame), got {stacked}")
    return gym.spaces.Box(0, np.iinfo(np.int64).max, (stacked.shape[0],), np.int64)


def frame_layout(stacked_fields: FieldSpecs, id_fields: FieldSpecs, stacked: gym.spaces.Box) -> FrameLayout:
    """The layout of an algorithm whose transition fields are ``stacked_fields`` over the stacked
    observation space ``stacked`` and ``id_fields`` over :func:`frame_id_space`; ValueError when the
    two differ in anything but stacks turned into ids."""
    import torch

    stack, frame_shape = stacked.shape[0], tuple(stacked.shape[1:])
    frame_dtype = torch.from_numpy(np.empty(0, stacked.dtype)).dtype
    if FRAMES in stacked_fields or stacked_fields.keys() != id_fields.keys():
        raise ValueError(f"the algorithm's fields over frame ids differ from its fields over frames "
                         f"({sorted(id_fields)} against {sorted(stacked_fields)}), or one is named {FRAMES!r}")
    refs = []
    for name, (shape, dtype) in stacked_fields.items():
        id_shape, id_dtype = id_fields[name]
        if (id_shape, id_dtype) == (shape, dtype):
            continue
        prefix = id_shape[:-1]
        if id_dtype != torch.int64 or id_shape[-1:] != (stack,) or (shape, dtype) != ((*prefix, stack, *frame_shape),
                                                                                       frame_dtype):
            raise ValueError(f"field {name!r} is {shape} {dtype} over frames but {id_shape} {id_dtype} over frame "
                             "ids: an algorithm's fields must hold observations as they are to stack frames")
        refs.append(name)
    if not refs:
        raise ValueError("no field of the algorithm holds an observation: nothing to store as frames")
    return FrameLayout(stack, frame_shape, frame_dtype, tuple(refs))


def batch_fields(layout: FrameLayout, id_fields: FieldSpecs) -> FieldSpecs:
    """What a frame-stacked batch holds: the fields over frame ids, and the frames."""
    return {**id_fields, FRAMES: (layout.frame_shape, layout.frame_dtype)}


def algorithm_frames(spec: Any) -> tuple[FrameLayout, Any]:
    """The frame layout of an algorithm spec over a stacked observation space, and the same algorithm
    over frame ids (whose assembler makes an actor's items and whose fields the replay stores)."""
    ids = type(spec)(frame_id_space(spec.observation_space), spec.action_space, spec.config)
    return frame_layout(spec.transition_fields(), ids.transition_fields(), spec.observation_space), ids


def default_frame_capacity(layout: FrameLayout, id_fields: FieldSpecs, capacity: int) -> int:
    """Frames to keep for ``capacity`` items: 1.25 per step an item holds (an n-step transition one, an R2D2
    sequence its length), room for the frames a batch carries beyond one per step."""
    steps = max(math.prod(id_fields[name][0][:-1]) for name in layout.refs)
    return math.ceil(1.25 * capacity * steps)
