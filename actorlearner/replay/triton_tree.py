"""Triton kernels for :class:`SumTree` on CUDA: a sample is one kernel after ``torch.rand``, an update one
kernel per level plus two, and none reads a value back to the host.

:class:`SumTree` calls :func:`sample_positive` and :func:`update` for a tree on CUDA when triton imports
(and its kernels are compiled, not interpreted); everywhere else it runs its torch code. They keep
that code's results: :func:`sample_positive` draws its uniforms with the same ``torch.rand`` and
returns the same indices, bit for bit, as the torch descent over the same tree (each node's mass and
running sums are added child after child, as torch's CPU ``cumsum`` does; torch's CUDA ``cumsum``
adds in another order, so there the two can part when a target lies within rounding of a boundary).
:func:`update` recomputes every touched parent from its children, never by deltas; a parent's K
children are added one after another, so sums can differ from torch's ``sum`` in the last bits.

Launches on CUDA: a sample is ``torch.rand`` and one kernel; an update of n <= ``DEDUP_MAX`` float64
values at int64 indices is one leaf kernel (which also drops all but the last write to a leaf), one
kernel per level above the leaves and one for the top's prefix sums and the root's minimum: height + 2.
Larger updates make the writes last-write-wins in torch first (a sort and a few ops). Launch counts
depend only on the tree's shape and the batch size, so both are capturable in a CUDA graph.

Triton reads ``TRITON_INTERPRET`` when ``@triton.jit`` decorates a function, its own included: set to 1
before triton is first imported, the process runs every kernel in triton's interpreter, on CPU tensors
too (the tests do that); :class:`SumTree` then keeps its torch code on CUDA.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from actorlearner.replay.scatter import last_write_wins

if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 3):  # tuple kernel arguments
    raise ImportError(f"the sum tree's kernels need triton >= 3.3, not {triton.__version__}")

DEDUP_MAX = 4096
"""Largest update whose last-write-wins runs inside the leaf kernel (quadratic in n, no sort)."""

_JUST_BELOW_ONE = tl.constexpr(1.0 - 2.0**-52)  # as in sumtree: times a positive float64, strictly below it
BLOCK = 128  # batch elements (sample) or indices (update) per program
_TOP_BLOCK = 4096  # top nodes per step of the top kernel's scan (the default max_top: one step)


@triton.jit
def descend(u, i, live, top_cumsum_ptr, top_before_ptr, levels, batch, top, capacity, K: tl.constexpr,
            HEIGHT: tl.constexpr, SEARCH_STEPS: tl.constexpr, RECIPROCAL: tl.constexpr, BLOCK: tl.constexpr):
    """The leaf of each batch element ``i`` (uniforms ``u``): stratified target, binary search over the top,
    K-ary descent."""
    total = tl.load(top_cumsum_ptr + top - 1)
    strata = tl.zeros([BLOCK], tl.float64) + batch
    if RECIPROCAL:  # torch on CUDA divides by a host scalar as a multiplication by its reciprocal
        scale = total * (1.0 / strata)
    else:
        scale = total / strata
    t = (u + i.to(tl.float64)) * scale
    t = tl.minimum(t, total * _JUST_BELOW_ONE)
    # searchsorted(top_cumsum, t, right=True) with torch's midpoints: the first node whose sum exceeds t.
    lo = tl.zeros([BLOCK], tl.int32)
    hi = tl.zeros([BLOCK], tl.int32) + top
    for _ in tl.static_range(SEARCH_STEPS):
        active = lo < hi
        mid = lo + ((hi - lo) >> 1)
        right = ~(tl.load(top_cumsum_ptr + mid, mask=live & active, other=0.0) > t)
        lo = tl.where(active & right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    node = tl.minimum(lo, top - 1).to(tl.int64)
    t = t - tl.load(top_before_ptr + node, mask=live, other=0.0)
    for d in tl.static_range(HEIGHT):
        base = levels[d] + node * K
        mass = tl.zeros([BLOCK], tl.float64)
        for c in tl.static_range(K):
            mass = mass + tl.load(base + c, mask=live, other=0.0)
        # Keep the target inside this node's mass despite rounding on the way down.
        t = tl.minimum(t, mass * _JUST_BELOW_ONE)
        # The first child whose running sum exceeds t (the last when none does): its running sum and value.
        running = tl.zeros([BLOCK], tl.float64)
        found = tl.zeros([BLOCK], tl.int1)
        child = tl.zeros([BLOCK], tl.int64)
        chosen_sum = tl.zeros([BLOCK], tl.float64)
        chosen = tl.zeros([BLOCK], tl.float64)
        for c in tl.static_range(K):
            x = tl.load(base + c, mask=live, other=0.0)
            running = running + x
            if c == K - 1:
                pick = ~found
            else:
                pick = ~found & (running > t)
            child = tl.where(pick, c, child)
            chosen_sum = tl.where(pick, running, chosen_sum)
            chosen = tl.where(pick, x, chosen)
            found = found | pick
        t = (t - chosen_sum) + chosen  # the mass left of the chosen child, subtracted as torch does
        node = node * K + child
    return tl.minimum(node, capacity - 1)


@triton.jit
def _sample_kernel(u_ptr, out_ptr, top_cumsum_ptr, top_before_ptr, levels, batch, top, capacity,
                   K: tl.constexpr, HEIGHT: tl.constexpr, SEARCH_STEPS: tl.constexpr,
                   RECIPROCAL: tl.constexpr, BLOCK: tl.constexpr):
    """One leaf index per batch element."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < batch
    u = tl.load(u_ptr + i, mask=live, other=0.0)
    leaf = descend(u, i, live, top_cumsum_ptr, top_before_ptr, levels, batch, top, capacity, K, HEIGHT,
                   SEARCH_STEPS, RECIPROCAL, BLOCK)
    tl.store(out_ptr + i, leaf, mask=live)


@triton.jit
def _leaf_kernel(idx_ptr, val_ptr, leaves_ptr, n, capacity, DEDUP: tl.constexpr, BLOCK: tl.constexpr,
                 BLOCK_J: tl.constexpr):
    """``leaves[idx] = val``; with DEDUP, a write is dropped when a later one names the same leaf."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    idx = tl.load(idx_ptr + i, mask=i < n, other=-1)
    write = (idx >= 0) & (idx < capacity)
    if DEDUP:
        later = tl.zeros([BLOCK], tl.int32)
        for start in range(tl.program_id(0) * BLOCK, n, BLOCK_J):
            j = start + tl.arange(0, BLOCK_J)
            other = tl.load(idx_ptr + j, mask=j < n, other=-1)
            same = (idx[:, None] == other[None, :]) & (j[None, :] > i[:, None])
            later = later | tl.max(same.to(tl.int32), axis=1)
        write = write & (later == 0)
    tl.store(leaves_ptr + idx, tl.load(val_ptr + i, mask=write, other=0.0), mask=write)


@triton.jit
def _parent_kernel(idx_ptr, idx_stride, n, capacity, divisor, child_sums, child_mins, parent_sums, parent_mins,
                   K: tl.constexpr, LEAVES: tl.constexpr, BLOCK: tl.constexpr):
    """Recompute the parent (one level up) of each ``(idx % capacity) // divisor`` from its K children:
    their sum, added in order, and their smallest positive leaf. Repeated parents write the same values.
    (Modulo: ``idx`` may be leaves or replay keys, ``idx_stride`` apart: a column of sampled rows.)"""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    idx = tl.load(idx_ptr + i.to(tl.int64) * idx_stride, mask=i < n, other=-1)
    ok = idx >= 0
    parent = (tl.where(ok, idx, 0) % capacity) // divisor
    base = parent * K
    total = tl.zeros([BLOCK], tl.float64)
    low = tl.zeros([BLOCK], tl.float64) + float("inf")
    for c in tl.static_range(K):
        x = tl.load(child_sums + base + c, mask=ok, other=0.0)
        total = total + x
        if LEAVES:
            low = tl.minimum(low, tl.where(x > 0, x, float("inf")))
        else:
            low = tl.minimum(low, tl.load(child_mins + base + c, mask=ok, other=float("inf")))
    tl.store(parent_sums + parent, total, mask=ok)
    tl.store(parent_mins + parent, low, mask=ok)


@triton.jit
def _top_kernel(top_ptr, top_mins_ptr, cumsum_ptr, before_ptr, min_ptr, reset_ptr, top, HAS_MINS: tl.constexpr,
                RESET: tl.constexpr, BLOCK: tl.constexpr):
    """One program: the top's prefix sums, the mass left of each top node, and the root's minimum; with
    RESET, the int64 at ``reset_ptr`` set to 0 (after everything launched before, which read it)."""
    carry = tl.zeros([1], tl.float64)
    low = tl.zeros([1], tl.float64) + float("inf")
    for start in range(0, top, BLOCK):
        o = start + tl.arange(0, BLOCK)
        m = o < top
        x = tl.load(top_ptr + o, mask=m, other=0.0)
        running = tl.cumsum(x, 0) + carry
        tl.store(cumsum_ptr + o, running, mask=m)
        tl.store(before_ptr + o, running - x, mask=m)
        last = tl.minimum(start + BLOCK, top) - 1
        carry = tl.zeros([1], tl.float64) + tl.sum(tl.where(o == last, running, 0.0), 0)
        if HAS_MINS:
            y = tl.load(top_mins_ptr + o, mask=m, other=float("inf"))
        else:
            y = tl.where(x > 0, x, float("inf"))
        low = tl.minimum(low, tl.min(y, 0))
    tl.store(min_ptr + tl.arange(0, 1), low)
    if RESET:
        tl.store(reset_ptr + tl.arange(0, 1), tl.zeros([1], tl.int64))


INTERPRETED = not (isinstance(_sample_kernel, JITFunction) and isinstance(tl.sum, JITFunction))
"""Whether these kernels or triton's own were decorated for its CPU interpreter (``TRITON_INTERPRET=1``)."""
LAUNCH = {} if INTERPRETED else {"enable_fp_fusion": False}  # no multiply-add contracted into an FMA


def sample_positive(tree, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """:meth:`SumTree.sample_positive`: the same ``torch.rand``, then one kernel."""
    uniforms = torch.rand(batch_size, dtype=torch.float64, device=tree.device, generator=generator)
    return sample_from_uniforms(tree, uniforms)


def sample_from_uniforms(tree, uniforms: torch.Tensor) -> torch.Tensor:
    """The leaves that :meth:`SumTree.sample_positive` picks for these uniforms in [0, 1), one per stratum."""
    batch = uniforms.shape[0]
    out = torch.empty(batch, dtype=torch.long, device=tree.device)
    if batch == 0:
        return out
    top = tree._top_cumsum.shape[0]
    with on_device(tree):
        _sample_kernel[grid(batch)](
            uniforms.contiguous(), out, tree._top_cumsum, tree._top_before, tuple(tree._sums[1:]), batch, top,
            tree.capacity, K=tree.branching, HEIGHT=tree.height, SEARCH_STEPS=top.bit_length(),
            RECIPROCAL=tree.device.type == "cuda", BLOCK=BLOCK, **LAUNCH)
    return out


def update(tree, indices: torch.Tensor, values: torch.Tensor) -> None:
    """:meth:`SumTree.update` for int64 ``indices`` and float64 ``values`` on the tree's device, non-empty."""
    n = indices.shape[0]
    dedup = n <= DEDUP_MAX
    if not dedup:
        indices, values = last_write_wins(indices, values)
    indices, values = indices.contiguous(), values.contiguous()
    with on_device(tree):
        _leaf_kernel[grid(n)](indices, values, tree._sums[-1], n, tree.capacity, DEDUP=dedup, BLOCK=BLOCK,
                              BLOCK_J=64, **LAUNCH)
    update_above_leaves(tree, indices)


def update_above_leaves(tree, indices: torch.Tensor, reset: torch.Tensor | None = None) -> None:
    """After leaves changed: every level above the leaves of ``indices`` (leaves, or keys taken modulo the
    capacity; 1-d, any stride), one kernel per level, then the top's kernel, which also zeroes ``reset``
    when given."""
    n, k, height = indices.shape[0], tree.branching, tree.height
    with on_device(tree):
        for d in range(height, 0, -1):  # parents at level d - 1 from their children at level d
            child_mins = tree._mins[d] if d < height else tree._sums[d]  # unread at the leaves
            _parent_kernel[grid(n)](indices, indices.stride(0), n, tree.capacity, k ** (height - d + 1),
                                    tree._sums[d], child_mins, tree._sums[d - 1], tree._mins[d - 1], K=k,
                                    LEAVES=d == height, BLOCK=BLOCK, **LAUNCH)
    refresh_top(tree, reset)


def refresh_top(tree, reset: torch.Tensor | None = None) -> None:
    """The top's prefix sums, the mass left of each top node and the root's minimum (and ``reset`` zeroed):
    one kernel."""
    top = tree._sums[0]
    block = min(_TOP_BLOCK, triton.next_power_of_2(top.shape[0]))
    with on_device(tree):
        _top_kernel[(1,)](top, tree._mins[0] if tree.height else top, tree._top_cumsum, tree._top_before,
                          tree._min, top if reset is None else reset, top.shape[0], HAS_MINS=tree.height > 0,
                          RESET=reset is not None, BLOCK=block, num_warps=8 if block >= 1024 else 4, **LAUNCH)


def grid(n: int) -> tuple[int]:
    """Programs for ``n`` elements, ``BLOCK`` each."""
    return (triton.cdiv(n, BLOCK),)


def on_device(tree):
    """Triton launches on the current CUDA device (torch's own ops switch to their tensors' device)."""
    return torch.cuda.device(tree.device) if tree.device.type == "cuda" else contextlib.nullcontext()

