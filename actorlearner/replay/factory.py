"""The one place a replay's path is chosen: :func:`make_replay`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from actorlearner.replay.buffer import PrioritizedReplay
from actorlearner.replay.compiled import CompiledReplay
from actorlearner.replay.device import DeviceReplay
from actorlearner.replay.layout import FieldSpec


def make_replay(capacity: int, fields: Mapping[str, FieldSpec], *, device: str | torch.device = "cpu",
                kernels: str = "auto", **options) -> PrioritizedReplay:
    """A :class:`PrioritizedReplay` of ``capacity`` items of ``fields`` on the path for ``device`` and ``kernels``.

    On the CPU, ``kernels="auto"`` gives a :class:`~actorlearner.replay.compiled.CompiledReplay`: add,
    sample and update as compiled kernels (one call each, GIL released). Any other device, and
    ``"torch"`` or ``"triton"``, give a :class:`~actorlearner.replay.device.DeviceReplay`, what CUDA
    runs: its Triton kernels on CUDA (``"auto"``), torch operations (``"torch"``), or its Triton kernels
    wherever they run (``"triton"``: on the CPU in triton's interpreter, for tests). ``options`` are
    :class:`PrioritizedReplay`'s keyword arguments (alpha, beta, beta_steps, eps, branching, frames, frame_capacity).
    """
    path = CompiledReplay if torch.device(device).type == "cpu" and kernels == "auto" else DeviceReplay
    return path(capacity, fields, device=device, kernels=kernels, **options)
