"""Host buffers for asynchronous copies between host and device: page-locked where the device is CUDA.

A copy from or to pageable memory makes the host wait; one through a pinned buffer with
``non_blocking=True`` is queued like a kernel. Buffers made here are remembered (weakly), so
that :class:`~actorlearner.audit.HostTraffic` tells asynchronous copies from blocking ones on
the CPU too, where nothing can be pinned.
"""

from __future__ import annotations

import weakref

import torch


class TensorSet:
    """Tensors by identity (a tensor's ``==`` compares values), each forgotten when it is freed."""

    def __init__(self):
        self._refs: dict[int, weakref.ref] = {}

    def add(self, tensor: torch.Tensor) -> None:
        key = id(tensor)
        if key not in self._refs:
            self._refs[key] = weakref.ref(tensor, lambda _, key=key: self._refs.pop(key, None))

    def discard(self, tensor: torch.Tensor) -> None:
        self._refs.pop(id(tensor), None)

    def __contains__(self, tensor: torch.Tensor) -> bool:
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor

    def __iter__(self):
        return iter([t for t in (ref() for ref in list(self._refs.values())) if t is not None])


PINNED = TensorSet()
"""Every buffer :func:`pinned_empty` made that is still alive."""


def pinned_empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialized host buffer for copies to and from ``device``: pinned when ``device`` is CUDA."""
    buffer = torch.empty(shape, dtype=dtype, pin_memory=device.type == "cuda")
    PINNED.add(buffer)
    return buffer


def is_pinned(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is (a view into) a buffer of :func:`pinned_empty`, or pinned by other means."""
    if tensor.is_pinned():
        return True
    storage = tensor.untyped_storage().data_ptr()
    return any(buffer.untyped_storage().data_ptr() == storage for buffer in PINNED)
