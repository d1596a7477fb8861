"""Counting host reads: the calls that copy a tensor's value to the Python side.

On CUDA each such read waits for the GPU to finish everything queued before it. The device
path (the replay's :class:`~actorlearner.replay.device.DeviceReplay` and the learner's step)
must do none between metric reads; :class:`HostReads` checks that on any device, the CPU
included, by watching every torch call made inside it.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

READS = frozenset({
    "item", "tolist", "__bool__", "__float__", "__int__", "__index__", "__complex__", "cpu", "numpy",
    "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "equal", "allclose",
})
"""Tensor methods and torch functions whose result lives on the host (or whose size depends on values)."""


def reads_on_host(name: str, args: tuple, kwargs: dict, device: torch.device) -> bool:
    """Whether one torch call reads tensor values on the host (``.to`` the CPU only from another device)."""
    if name in READS:
        return True
    if name == "where" and len(args) + len(kwargs) == 1:  # torch.where(cond) is nonzero
        return True
    if name == "to" and device.type != "cpu":
        return any(_is_cpu(a) for a in (*args[1:], *kwargs.values()))
    if name in ("__getitem__", "__setitem__", "index_put_", "index_put") and len(args) > 1:
        return _has_mask(args[1])
    return False


def _is_cpu(value) -> bool:
    return (isinstance(value, torch.device) and value.type == "cpu") or (isinstance(value, str) and value == "cpu")


def _has_mask(index) -> bool:
    """Whether an indexing key holds a boolean tensor (its result's size depends on values)."""
    keys = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(key, torch.Tensor) and key.dtype == torch.bool for key in keys)


class HostReads(TorchFunctionMode):
    """A mode counting host reads of tensors on ``device`` (by call name in :attr:`counts`).

    >>> with HostReads("cuda") as reads:
    ...     step()
    >>> assert not reads.counts, reads.counts
    """

    def __init__(self, device: str | torch.device):
        super().__init__()
        self.device = torch.device(device)
        self.counts: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if reads_on_host(name, args, kwargs, self.device) and self._on_device(args):
            self.counts[name] += 1
        return func(*args, **kwargs)

    def _on_device(self, args: tuple) -> bool:
        """Whether the call's tensor argument lives on the watched device."""
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        return first is not None and first.device.type == self.device.type
