"""What a benchmarked step runs, counted per step: torch ops, launches, host reads and (CUDA) syncs.

- Torch ops: the profiler's ``aten::`` events (`profile.events()`), nested ones included.
- CUDA: every launch the host makes, read from the profiler's raw runtime and driver events (kernels,
  Triton's through the driver's ``cuLaunchKernel*``, copies, memsets, graph launches:
  :data:`CUDA_LAUNCHES`), and what ran on the device (kernels; memcpys and memsets); syncs are
  ``torch.cuda.set_sync_debug_mode("warn")``'s warnings.
- CPU: launches as `DeviceLaunches` counts them (each torch op that runs a kernel or a copy, and
  each Triton kernel, interpreted or not; numba's compiled kernels are neither).
- Host reads: `HostReads`, by call.
"""

from __future__ import annotations

import warnings
from collections import Counter

import torch

from actorlearner.audit import DeviceLaunches, HostReads

CUDA_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpy", "cudaMemset",
                 "cuMemcpy", "cuMemset")
"""Name prefixes of the runtime and driver calls that launch device work (``cudaLaunchKernelExC``,
``cuLaunchKernelEx``, ``cudaMemcpyAsync``, ``cuMemsetD32Async``... included)."""
ON_DEVICE = {"kernel": "cuda_kernels", "gpu_memcpy": "cuda_copies", "gpu_memset": "cuda_copies"}
"""The profiler's device-side activities, by the key they are counted under."""


def counts(fn, calls: int, device: torch.device, sync, prime=None) -> Counter:
    """What ``calls`` calls of ``fn`` run: torch ops, launches, on CUDA what ran on the device and the
    syncs, and host reads by call (``read:<name>``). Each counting pass calls ``prime()`` first, uncounted
    (a step before a metrics read, which has nothing to read otherwise)."""
    from torch.profiler import ProfilerActivity, profile

    cuda, out = device.type == "cuda", Counter({"launches": 0})
    prime = prime or (lambda: None)
    prime()
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(calls):
            fn()
        sync()
    out["torch_ops"] = sum(e.name.startswith("aten::") for e in prof.events())  # as RESULTS.md counted them
    for e in prof.profiler.kineto_results.events() if cuda else ():  # every event, by kind of activity
        name, activity = e.name(), e.activity_type()
        out["launches"] += activity in ("cuda_runtime", "cuda_driver") and name.startswith(CUDA_LAUNCHES)
        if activity in ON_DEVICE:
            out[ON_DEVICE[activity]] += 1
    if not cuda:
        prime()
        with DeviceLaunches() as launches:
            for _ in range(calls):
                fn()
        out["launches"] = launches.total()
    prime()
    with HostReads(device) as reads:
        for _ in range(calls):
            fn()
    out.update({f"read:{k}": v for k, v in reads.counts.items()})
    if cuda:
        prime()
        sync()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(calls):
                    fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        out["syncs"] = sum("synchroniz" in str(w.message) for w in caught)
    return out


def per_step(fn, steps: int, device, sync, read=None, read_every: int = 1) -> dict:
    """:func:`counts` per step of ``fn``, plus a ``read_every``-th of one ``read()`` call's (after a step)."""
    total = Counter({k: v / steps for k, v in counts(fn, steps, device, sync).items()})
    if read is not None:
        total.update({k: v / read_every for k, v in counts(read, 1, device, sync, prime=fn).items()})
    out = {k: v for k, v in total.items() if not k.startswith("read:")}
    out["host_read_calls"] = {k[5:]: v for k, v in sorted(total.items()) if k.startswith("read:")}
    out["host_reads"] = sum(out["host_read_calls"].values())
    out["steps_counted"] = steps
    return out


def step_counts(s: dict, cuda: bool) -> str:
    """One contender's per-step counts for a table (on CPU, .cpu()/.numpy() of CPU tensors are views)."""
    views = 0 if cuda else sum(v for k, v in s["host_read_calls"].items() if k in ("cpu", "numpy"))
    reads = f"{s['host_reads'] - views:.2f} + {views:.0f} views" if views else f"{s['host_reads']:.2f}"
    if cuda:
        return (f"{s.get('cuda_kernels', 0):.0f}, {s.get('cuda_copies', 0):.1f}, {s['launches']:.1f}, "
                f"{s['syncs']:.2f}, {reads}")
    return f"{s['torch_ops']:.0f}, {s['launches']:.0f}, {reads}"


COUNT_COLUMNS = {True: "kernels, copies, launches, syncs, host reads", False: "torch ops, launches, host reads"}
"""What :func:`step_counts` lists, on CUDA and on the CPU."""
