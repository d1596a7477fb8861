"""The device replay's draw and priority update as Triton kernels: a draw is ``torch.rand`` and one kernel,
an update is two kernels, one per tree level above the leaves, and the top's; none reads a value back.

:func:`draw` descends the tree as :func:`~actorlearner.replay.triton_tree.sample_from_uniforms` does (the
same leaves, bit for bit), and in the same kernel computes each draw's IS weight and gathers its row.
:func:`update_priorities` checks the call in one kernel (NaN, infinite, negative, unknown keys: counted
into the replay's error counts and into a per-call count), then in another writes the leaves: nothing
when the call was refused; else ``(p + eps) ** alpha`` (0 for an evicted version) where the slot still
holds the key, the last write of a key winning, and the running maximum priority raised. The top's
kernel zeroes the per-call count for the next call. Launch counts depend only on the tree's shape
(up to :data:`~actorlearner.replay.triton_tree.DEDUP_MAX` priorities), so both are capturable.

Powers: compiled, libdevice's ``pow``, which torch's CUDA ``pow`` calls too; in triton's interpreter
(no libdevice) ``exp(y * log(x))``, a few float64 ulps apart (exact for the exponents 0 and 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from actorlearner.replay.scatter import last_write_wins
from actorlearner.replay.triton_tree import (
    BLOCK,
    DEDUP_MAX,
    INTERPRETED,
    LAUNCH,
    descend,
    grid,
    on_device,
    update_above_leaves,
)

WORD_BLOCK = 32
"""Row words (int64) a draw's program copies per step of its gather loop."""


@triton.jit
def _pow(x, y, EXACT: tl.constexpr):
    """``x ** y`` for x >= 0: libdevice's, or (interpreted) ``exp(y * log(x))``, exact for y in {0, 1}."""
    if EXACT:
        return libdevice.pow(x, y)
    positive = x > 0
    out = tl.exp(y * tl.log(tl.where(positive, x, 1.0)))
    out = tl.where(positive, out, tl.where(y > 0, 0.0, float("inf")))
    return tl.where(y == 0, 1.0, tl.where(y == 1, x, out))


@triton.jit
def _draw_kernel(u_ptr, slots_ptr, weights_ptr, out_ptr, words_ptr, leaves_ptr, min_ptr, beta_ptr,
                 top_cumsum_ptr, top_before_ptr, levels, batch, top, capacity, row_words, K: tl.constexpr,
                 HEIGHT: tl.constexpr, SEARCH_STEPS: tl.constexpr, RECIPROCAL: tl.constexpr, EXACT: tl.constexpr,
                 BLOCK: tl.constexpr, WORD_BLOCK: tl.constexpr):
    """Each batch element's slot, IS weight ``(leaf / min leaf) ** -beta`` (float32) and row."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < batch
    u = tl.load(u_ptr + i, mask=live, other=0.0)
    slot = descend(u, i, live, top_cumsum_ptr, top_before_ptr, levels, batch, top, capacity, K, HEIGHT,
                   SEARCH_STEPS, RECIPROCAL, BLOCK)
    tl.store(slots_ptr + i, slot, mask=live)
    ratio = tl.load(leaves_ptr + slot, mask=live, other=1.0) / tl.load(min_ptr)
    beta = tl.load(beta_ptr) + tl.zeros([BLOCK], tl.float64)
    tl.store(weights_ptr + i, _pow(ratio, -beta, EXACT).to(tl.float32), mask=live)
    source, target = slot * row_words, i.to(tl.int64) * row_words
    for start in range(0, row_words, WORD_BLOCK):
        w = start + tl.arange(0, WORD_BLOCK)
        copy = live[:, None] & (w[None, :] < row_words)
        words = tl.load(words_ptr + source[:, None] + w[None, :], mask=copy, other=0)
        tl.store(out_ptr + target[:, None] + w[None, :], words, mask=copy)


@triton.jit
def _check_kernel(keys_ptr, keys_stride, p_ptr, n, inserted_ptr, errors_ptr, refused_ptr, BLOCK: tl.constexpr):
    """Count the call's NaN, infinite and negative priorities and unknown keys (outside [0, inserted))."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    key = tl.load(keys_ptr + i.to(tl.int64) * keys_stride, mask=live, other=0)
    p = tl.load(p_ptr + i, mask=live, other=0.0).to(tl.float64)
    nan = tl.sum((live & (p != p)).to(tl.int64), 0)
    infinite = tl.sum((live & (tl.abs(p) == float("inf"))).to(tl.int64), 0)
    negative = tl.sum((live & (p < 0)).to(tl.int64), 0)
    unknown = tl.sum((live & ((key < 0) | (key >= tl.load(inserted_ptr)))).to(tl.int64), 0)
    tl.atomic_add(errors_ptr + 0, nan)
    tl.atomic_add(errors_ptr + 1, infinite)
    tl.atomic_add(errors_ptr + 2, negative)
    tl.atomic_add(errors_ptr + 3, unknown)
    tl.atomic_add(refused_ptr, nan + infinite + negative + unknown)


@triton.jit
def _priority_kernel(keys_ptr, keys_stride, p_ptr, n, capacity, words_ptr, row_words, key_word, version_word, min_version_ptr,
                     alpha_ptr, eps, refused_ptr, max_bits_ptr, leaves_ptr, EXACT: tl.constexpr,
                     DEDUP: tl.constexpr, BLOCK: tl.constexpr, BLOCK_J: tl.constexpr):
    """Unless the call was refused: each live key's leaf (the slot still holds it; with DEDUP, no later write
    of the key) set from its priority and its slot's version, and the maximum priority raised (an atomic
    max on the float64's bits, which order non-negative floats)."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    accepted = (tl.load(refused_ptr) + tl.zeros([BLOCK], tl.int64)) == 0
    key = tl.load(keys_ptr + i.to(tl.int64) * keys_stride, mask=live, other=-1)
    p = tl.load(p_ptr + i, mask=live, other=0.0).to(tl.float64)
    ok = live & accepted & (key >= 0)
    slot = tl.where(ok, key % capacity, 0)
    row = slot * row_words
    write = ok & (tl.load(words_ptr + row + key_word, mask=ok, other=-1) == key)
    if DEDUP:
        later = tl.zeros([BLOCK], tl.int32)
        for start in range(tl.program_id(0) * BLOCK, n, BLOCK_J):
            j = start + tl.arange(0, BLOCK_J)
            other = tl.load(keys_ptr + j.to(tl.int64) * keys_stride, mask=j < n, other=-1)
            same = (key[:, None] == other[None, :]) & (j[None, :] > i[:, None])
            later = later | tl.max(same.to(tl.int32), axis=1)
        write = write & (later == 0)
    version = tl.load(words_ptr + row + version_word, mask=write, other=0)
    alpha = tl.load(alpha_ptr) + tl.zeros([BLOCK], tl.float64)
    value = tl.where(version >= tl.load(min_version_ptr), _pow(p + eps, alpha, EXACT), 0.0)
    tl.store(leaves_ptr + slot, value, mask=write)
    highest = tl.max(tl.where(live & accepted, p, 0.0), 0)
    tl.atomic_max(max_bits_ptr, highest.to(tl.int64, bitcast=True))


def draw(tree, words: torch.Tensor, beta: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, ...]:
    """``batch_size`` slots drawn from ``tree`` (positive total), their float32 IS weights at exponent ``beta``
    (a 0-d float64 device tensor) and their rows of ``words`` (int64 ``[capacity, row_words]``)."""
    uniforms = torch.rand(batch_size, dtype=torch.float64, device=tree.device)
    slots = torch.empty(batch_size, dtype=torch.long, device=tree.device)
    weights = torch.empty(batch_size, dtype=torch.float32, device=tree.device)
    rows = torch.empty((batch_size, words.shape[1]), dtype=torch.int64, device=tree.device)
    top = tree._top_cumsum.shape[0]
    with on_device(tree):
        _draw_kernel[grid(batch_size)](
            uniforms, slots, weights, rows, words, tree._sums[-1], tree._min, beta, tree._top_cumsum,
            tree._top_before, tuple(tree._sums[1:]), batch_size, top, tree.capacity, words.shape[1],
            K=tree.branching, HEIGHT=tree.height, SEARCH_STEPS=top.bit_length(), RECIPROCAL=tree.device.type == "cuda",
            EXACT=not INTERPRETED, BLOCK=BLOCK, WORD_BLOCK=WORD_BLOCK, **LAUNCH)
    return slots, weights, rows


def update_priorities(tree, keys: torch.Tensor, priorities: torch.Tensor, *, words: torch.Tensor, key_word: int,
                      version_word: int, inserted: torch.Tensor, min_version: torch.Tensor, alpha: torch.Tensor,
                      eps: float, errors: torch.Tensor, refused: torch.Tensor, max_priority: torch.Tensor) -> None:
    """Set the priorities (float32 or float64) of item ``keys`` (int64, non-empty, any stride: a column of
    sampled rows is read in place), all on the tree's device, as the module says. Each item's key and version sit in ``words`` (its rows) at ``key_word`` and
    ``version_word``; ``inserted``, ``min_version``, ``alpha`` and ``max_priority`` are the replay's 0-d
    device tensors, ``errors`` its four error counts, ``refused`` an int64 count that starts at 0."""
    n = keys.shape[0]
    priorities = priorities.contiguous()
    with on_device(tree):
        _check_kernel[grid(n)](keys, keys.stride(0), priorities, n, inserted, errors, refused, BLOCK=BLOCK, **LAUNCH)
        dedup = n <= DEDUP_MAX
        if not dedup:
            keys, priorities = last_write_wins(keys, priorities)
        _priority_kernel[grid(n)](keys, keys.stride(0), priorities, n, tree.capacity, words, words.shape[1], key_word, version_word,
                                  min_version, alpha, eps, refused, max_priority.view(torch.int64), tree._sums[-1],
                                  EXACT=not INTERPRETED, DEDUP=dedup, BLOCK=BLOCK, BLOCK_J=64, **LAUNCH)
    update_above_leaves(tree, keys, reset=refused)
