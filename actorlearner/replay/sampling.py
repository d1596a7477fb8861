"""What sampling a replay gives: a :class:`Sample`, :class:`NothingRecentEnough` when it can't, and
:class:`DeviceSampling`, the protocol of a path that can draw with device work only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class NothingRecentEnough(ValueError):
    """Every stored item is older than ``min_policy_version``: nothing can be sampled yet."""


@dataclass(frozen=True)
class Sample:
    """One sampled batch.

    Attributes:
        indices: item keys (the item's insertion number, int64). A key names one item,
            not a slot: once the slot is overwritten, updates for the old key are ignored.
        weights: importance-sampling weights, float32, at most 1.
        data: field name -> tensor of shape ``(batch, *field_shape)`` (views into one
            gathered block of rows, so not contiguous; ``.contiguous()`` if you need it).
        policy_version: version of the policy that produced each item, int64.
    """

    indices: torch.Tensor
    weights: torch.Tensor
    data: dict[str, torch.Tensor]
    policy_version: torch.Tensor


class DeviceSampling(Protocol):
    """Sampling split into a host half and device work only, as a captured CUDA graph needs it: what
    :meth:`~actorlearner.replay.buffer.PrioritizedReplay.device_sampling` gives where a replay has it
    (the device path, :class:`~actorlearner.replay.device.DeviceReplay`)."""

    device: torch.device

    def start_sample(self, batch_size: int, min_policy_version: int | None = None) -> bool:
        """The host half of a sample; True when :meth:`draw` may follow, False when only :meth:`draw_on_host` can."""

    def draw(self, batch_size: int) -> Sample:
        """A sample after :meth:`start_sample` said True: device work only (no host read)."""

    def draw_on_host(self, batch_size: int) -> Sample:
        """A sample after :meth:`start_sample` said False (uniform over eligible items; reads the device)."""

    def launch(self, graph: torch.cuda.CUDAGraph) -> None:
        """Replay a captured step that draws from this replay and writes its priorities, ordered with its
        other writers."""
