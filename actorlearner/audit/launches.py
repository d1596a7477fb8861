"""Counting the launches of device work on any device, the CPU included: each torch op that runs a kernel
or a copy (views and bare allocations run none), and each Triton kernel.

This is how a device operation's launch budget is checked without a GPU: the same code runs on
the CPU (Triton's kernels in its interpreter, ``TRITON_INTERPRET=1``) and makes the same calls.
"""

from __future__ import annotations

import sys
from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode

NO_KERNEL = frozenset({"empty", "empty_strided", "lift_fresh", "set_", "resize_"})
"""Aten ops that only allocate or wrap memory (views are told by ``func.is_view``)."""


class DeviceLaunches(TorchDispatchMode):
    """A mode counting launches by name: aten ops (``aten.<name>``) and Triton kernels (``triton.<name>``).

    Torch ops are counted as dispatched (after autograd, composite ops broken up): on CUDA each is one
    kernel or copy, a ``_foreach_`` op one or a few. Triton's own host-side torch calls (its
    interpreter's) are not counted.

    >>> with DeviceLaunches() as launches:
    ...     replay.sample(256)
    >>> launches.total()
    """

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()
        self._inside_triton = False
        self._patched: list[tuple[type, object]] = []

    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self._inside_triton and not func.is_view and name not in NO_KERNEL:
            self.counts[f"aten.{name}"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for kernel_class in _triton_kernel_classes():
            self._patched.append((kernel_class, kernel_class.run))
            kernel_class.run = self._counting(kernel_class.run)
        return super().__enter__()

    def __exit__(self, *exc):
        for kernel_class, run in self._patched:
            kernel_class.run = run
        self._patched.clear()
        return super().__exit__(*exc)

    def _counting(self, run):
        def counted_run(kernel, *args, warmup=False, **kwargs):
            if warmup or self._inside_triton:
                return run(kernel, *args, warmup=warmup, **kwargs)
            self.counts[f"triton.{getattr(kernel, '__name__', type(kernel).__name__)}"] += 1
            self._inside_triton = True
            try:
                return run(kernel, *args, warmup=warmup, **kwargs)
            finally:
                self._inside_triton = False
        return counted_run


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
