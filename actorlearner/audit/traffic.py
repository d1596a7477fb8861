"""Counting host traffic on any device, the CPU included: tensors made from host values, and copies
between host and device memory, each blocking or asynchronous.

On CUDA a tensor made from Python or numpy values, or a copy from pageable host memory, makes the
host wait, and CUDA-graph capture refuses it (a captured step would run eagerly from then on); a
copy through a pinned buffer with ``non_blocking=True`` is queued like a kernel. On the CPU every
tensor lives on the host, so :class:`HostTraffic` tracks which ones stand for device memory: those
the objects it watches hold (:func:`~actorlearner.audit.state.held_tensors`), and whatever torch
computes from them or makes with an explicit ``device``. Any other tensor is host memory.

The code names the host as the string ``"cpu"`` and a device by the ``torch.device`` it keeps, so on
the CPU too ``x.to("cpu")`` is a copy to the host and ``x.to(self.device)`` a copy to the device.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

from actorlearner.audit.reads import reads_on_host
from actorlearner.audit.state import held_tensors
from actorlearner.pinned import TensorSet, is_pinned

FROM_VALUES = frozenset({"tensor", "as_tensor", "asarray", "scalar_tensor"})
"""Torch functions that make a tensor from the values given first (a copy from the host when those are
no tensor). ``torch.from_numpy`` and ``torch.frombuffer`` bypass torch function modes: their tensors
are host memory like any tensor the watched objects do not hold."""
FACTORIES = frozenset({"zeros", "ones", "empty", "full", "arange", "range", "linspace", "logspace", "eye", "rand",
                       "randn", "randint", "randperm", "empty_strided", "normal", "tril_indices", "triu_indices"})
"""Torch functions that allocate: in device memory when given a ``device``, else in host memory."""
KINDS = ("made", "host_alloc", "h2d", "h2d_async", "d2h", "d2h_async", "read", "host_operand")
"""What :attr:`HostTraffic.counts` counts: tensors made from host values; host memory allocated; copies
host -> device and device -> host, blocking or asynchronous; reads of a device tensor's values on the
host (:class:`~actorlearner.audit.HostReads`' calls, told apart from reads of host tensors); host
tensors taken as operands by device work (on CUDA a 0-d one is read on the host, at capture time once
for all replays; others fail)."""
BLOCKING = ("made", "h2d", "d2h", "read")
"""The kinds that make the host wait on CUDA (``made`` when given a device, as in a captured step)."""


class HostTraffic(TorchFunctionMode):
    """A mode counting host traffic (:data:`KINDS`) of device code, the tensors that ``watched`` hold
    (and their gradients) standing for device memory.

    >>> with HostTraffic(trainer, replay) as traffic:
    ...     step()
    >>> assert not traffic.counts, traffic.counts
    """

    def __init__(self, *watched: object):
        super().__init__()
        self.watched = watched
        self.counts: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        """The same by ``"<kind> <torch call>"``: where to look."""
        self._call = ""
        self._device, self._host = TensorSet(), TensorSet()
        self._rescan()

    def blocking(self) -> int:
        """How many of the counted calls make the host wait on CUDA."""
        return sum(self.counts[kind] for kind in BLOCKING)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = self._call = getattr(func, "__name__", "")
        on_device = self._classify(name, args, kwargs)
        if on_device is not None:
            for tensor in _tensors(out):
                (self._device if on_device else self._host).add(tensor)
                (self._host if on_device else self._device).discard(tensor)
        return out

    def _classify(self, name: str, args: tuple, kwargs: dict) -> bool | None:
        """Count what the call does; whether its results are device memory (None: leave them as they are)."""
        target = kwargs.get("device")
        if name in FROM_VALUES or name == "new_tensor":
            data = args[1] if name == "new_tensor" else (args[0] if args else kwargs.get("data"))
            source_on_device = self._on_device(args[0]) if name == "new_tensor" else False
            if isinstance(data, torch.Tensor):
                if target is None or self._on_device(data):
                    return self._on_device(data)
                self._copy(into_device=True, non_blocking=False)
                return True
            self._count("made")
            return target is not None or source_on_device
        if name in FACTORIES or name.endswith("_like") or name.startswith("new_"):
            inherited = name.endswith("_like") or name.startswith("new_")
            on_device = target is not None or (inherited and self._on_device(args[0]))
            if not on_device:
                self._count("host_alloc")
            return on_device
        if name in ("to", "cuda", "cpu"):
            return self._move(name, args, kwargs)
        if reads_on_host(name, args, kwargs, torch.device("cpu")) and any(self._on_device(t) for t in _tensors(args[:1])):
            self._count("read")
        if name in ("copy_", "_foreach_copy_"):
            pairs = zip(args[0], args[1]) if name == "_foreach_copy_" else [(args[0], args[1])]
            for dst, src in pairs:
                if self._on_device(dst) != self._on_device(src):
                    self._copy(into_device=self._on_device(dst), non_blocking=kwargs.get("non_blocking", False),
                               host=dst if self._on_device(src) else src)
            return None
        inputs = list(_tensors((args, kwargs)))
        if not inputs:
            return None
        kinds = {self._on_device(t) for t in inputs}
        if kinds == {True, False}:
            self._count("host_operand")
        return True in kinds

    def _move(self, name: str, args: tuple, kwargs: dict) -> bool | None:
        """``.to`` / ``.cuda`` / ``.cpu``: a copy when it names the other side; whether the result is on the device."""
        source = args[0]
        if name == "cpu":
            to_device = False
        elif name == "cuda":
            to_device = True
        else:
            target = kwargs.get("device", next((a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))),
                                               None))
            if target is None:  # a dtype only
                return self._on_device(source)
            to_device = self._on_device(target) if isinstance(target, torch.Tensor) else not _names_host(target)
        if to_device != self._on_device(source):
            non_blocking = kwargs.get("non_blocking", any(a is True for a in args[1:]))
            self._copy(into_device=to_device, non_blocking=non_blocking, host=source if to_device else None)
        return to_device

    def _copy(self, *, into_device: bool, non_blocking: bool, host: torch.Tensor | None = None) -> None:
        """Count one copy; asynchronous only with ``non_blocking`` through a pinned ``host`` buffer."""
        kind = "h2d" if into_device else "d2h"
        asynchronous = non_blocking and host is not None and is_pinned(host)
        self._count(kind + ("_async" if asynchronous else ""))

    def _count(self, kind: str) -> None:
        self.counts[kind] += 1
        self.calls[f"{kind} {self._call}"] += 1

    def _on_device(self, tensor: torch.Tensor) -> bool:
        if tensor in self._device:
            return True
        if tensor in self._host:
            return False
        self._rescan()  # new state since (a backward pass's gradients, lazily made optimizer state)
        if tensor in self._device:
            return True
        self._host.add(tensor)
        return False

    def _rescan(self) -> None:
        for _, tensor in held_tensors(*self.watched, grads=True):
            if tensor not in self._host:
                self._device.add(tensor)


def _names_host(target: str | torch.device) -> bool:
    """Whether a ``.to`` target names the host: the string "cpu" (see the module's convention)."""
    return isinstance(target, str) and target.split(":")[0] == "cpu"


def _tensors(value, depth: int = 3) -> Iterator[torch.Tensor]:
    """The tensors in a call's arguments or result (tuples, lists and dicts a few levels down)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif depth and isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item, depth - 1)
    elif depth and isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item, depth - 1)
