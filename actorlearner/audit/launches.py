"""Counting the launches of device work on any device, the CPU included: each torch op that runs a kernel
or a copy (views, allocations and ops that only call others run none), and each Triton kernel.

This is how a device operation's launch budget is checked without a GPU: the same code runs on
the CPU (Triton's kernels in its interpreter, ``TRITON_INTERPRET=1``) and makes the same calls.
"""

from __future__ import annotations

import functools
import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile, record_function

NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh",
                       "detach_", "set_", "resize_", "as_strided_", "_unsafe_view", "alias"})
"""Aten ops that only allocate or wrap memory (views are told by their schema)."""
_TRITON = "triton."


class DeviceLaunches:
    """A context counting launches by name: aten ops (``aten.<name>``) and Triton kernels (``triton.<name>``).

    It reads the torch profiler's op tree: an op counts when it runs a kernel of its own, i.e. it is
    no view, allocation or composite of other ops, and none of the ops it calls does (``clone`` is
    its ``copy_``). On CUDA each such op is one kernel or copy, a ``_foreach_`` op one or a few. The
    tree is the CPU's: where a CPU kernel calls others (type promotion by copies, say) those count,
    where CUDA runs one kernel. Triton's own host-side torch calls (its interpreter's) are not counted.

    >>> with DeviceLaunches() as launches:
    ...     replay.sample(256)
    >>> launches.total()
    """

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self._profile: profile | None = None
        self._patched: list[tuple[type, object]] = []

    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> DeviceLaunches:
        for kernel_class in _triton_kernel_classes():
            self._patched.append((kernel_class, kernel_class.run))
            kernel_class.run = _named_range(kernel_class.run)
        self._profile = profile(activities=[ProfilerActivity.CPU])
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        for kernel_class, run in self._patched:
            kernel_class.run = run
        self._patched.clear()
        for event in self._profile.events():
            if event.name.startswith(_TRITON) and not _inside_triton(event.cpu_parent):
                self.counts[event.name] += 1
            elif _runs_a_kernel(event.name) and not _inside_triton(event.cpu_parent) and not any(
                    _runs_a_kernel(child.name) for child in _descendants(event)):
                self.counts["aten." + event.name.removeprefix("aten::")] += 1


@functools.cache
def _runs_a_kernel(name: str) -> bool:
    """Whether the aten op ``aten::<op>`` has a kernel of its own (no view, allocation or composite)."""
    op = name.removeprefix("aten::")
    packet = getattr(torch.ops.aten, op, None) if name.startswith("aten::") and op not in NO_KERNEL else None
    if packet is None:
        return False
    for overload in (getattr(packet, name) for name in packet.overloads()):  # the first the dispatcher knows
        try:
            composite = torch._C._dispatch_has_kernel_for_dispatch_key(overload.name(), "CompositeImplicitAutograd")
        except RuntimeError:
            continue
        return not overload.is_view and not composite
    return False


def _descendants(event):
    for child in event.cpu_children:
        yield child
        yield from _descendants(child)


def _inside_triton(event) -> bool:
    while event is not None:
        if event.name.startswith(_TRITON):
            return True
        event = event.cpu_parent
    return False


def _named_range(run):
    """A kernel class's ``run`` that marks each launch in the profile as ``triton.<kernel name>``."""
    def named_run(kernel, *args, warmup=False, **kwargs):
        if warmup:
            return run(kernel, *args, warmup=warmup, **kwargs)
        with record_function(_TRITON + getattr(kernel, "__name__", type(kernel).__name__)):
            return run(kernel, *args, warmup=warmup, **kwargs)
    return named_run


def _triton_kernel_classes() -> list[type]:
    """Triton's kernel classes, compiled and interpreted, if triton was imported (never imported here:
    its first import decides whether kernels are interpreted)."""
    if "triton" not in sys.modules:
        return []
    from triton.runtime.jit import JITFunction
    classes: list[type] = [JITFunction]
    interpreter = sys.modules.get("triton.runtime.interpreter")
    if interpreter is not None:
        classes.append(interpreter.InterpretedFunction)
    return classes
