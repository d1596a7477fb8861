"""The one place a replay's path is chosen: :func:`make_replay`."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from actorlearner.frames import FrameLayout
from actorlearner.replay.buffer import KERNELS, PrioritizedReplay
from actorlearner.replay.compiled import CompiledReplay
from actorlearner.replay.device import DeviceReplay
from actorlearner.replay.layout import FieldSpec


def make_replay(
    capacity: int,
    fields: Mapping[str, FieldSpec],
    *,
    alpha: float = 0.6,
    beta: float = 0.4,
    beta_steps: int = 100_000,
    eps: float = 1e-6,
    device: str | torch.device = "cpu",
    kernels: str = "auto",
    branching: int = 16,
    frames: FrameLayout | None = None,
    frame_capacity: int = 0,
) -> PrioritizedReplay:
    """A :class:`PrioritizedReplay` of ``capacity`` items of ``fields`` on the path for ``device`` and ``kernels``.

    On the CPU, ``kernels="auto"`` gives a :class:`~actorlearner.replay.compiled.CompiledReplay`: add,
    sample and update as compiled kernels (one call each, GIL released). Any other device, and
    ``"torch"`` or ``"triton"``, give a :class:`~actorlearner.replay.device.DeviceReplay`, what CUDA
    runs: its Triton kernels on CUDA (``"auto"``), torch operations (``"torch"``), or its Triton kernels
    wherever they run (``"triton"``: on the CPU in triton's interpreter, for tests). The other arguments
    are :class:`PrioritizedReplay`'s.
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be 'auto', 'torch' or 'triton', got {kernels!r}")
    path = CompiledReplay if torch.device(device).type == "cpu" and kernels == "auto" else DeviceReplay
    return path(capacity, fields, alpha, beta, beta_steps, eps, device=device, kernels=kernels, branching=branching,
                frames=frames, frame_capacity=frame_capacity)
