"""Compiled CPU kernels of the replay's hot paths (numba: compiled on first use, cached on disk).

Each kernel does a whole batch in one call and releases the GIL while it runs, so other
threads (another stream's ingest, the trainer) go on meanwhile.

The sum tree they work on is K-ary, stored level by level (``offsets[d]`` is where level
``d`` starts; level 0 is the root, the last level the leaves, each level below the root
zero-padded to whole groups of K) in ``tree``, float64 of shape (nodes, 2): column 0 holds
each node's value, column 1 the running sum within its group of K siblings (what a descent
compares against), side by side so that the cache lines a descent reads are the ones an
update writes. ``mins`` holds the minimum positive value under each inner node (``inf``
where none), so the smallest priority, needed for importance weights, is the root's.
Parents are recomputed from their children, never adjusted by deltas: sums cannot drift.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Multiplying a positive float64 by this gives a value strictly below it.
JUST_BELOW_ONE = 1.0 - 2.0**-52

# Error codes the checking kernels return (0: fine); the caller turns them into messages.
NAN, INFINITE, NEGATIVE = 1, 2, 3
_jit = dict(nogil=True, cache=True)


@njit(**_jit)
def check_priorities(priorities):
    """``(code, max)``: 0 and the largest value if every value is finite and >= 0."""
    high = 0.0
    for p in priorities:
        if p != p:
            return NAN, high
        if p < 0:
            return NEGATIVE, high
        if p == np.inf:
            return INFINITE, high
        high = max(high, p)
    return 0, high


@njit(**_jit)
def _refresh_parents(tree, mins, offsets, branching, nodes, count):
    """Recompute every ancestor of ``nodes[:count]`` (leaf positions, ascending) level by level.

    ``nodes`` is scratch: it is overwritten with parent positions on the way up.
    """
    leaves = len(offsets) - 1
    for level in range(leaves, 0, -1):
        child_base, parent_base = offsets[level], offsets[level - 1]
        kept, previous = 0, -1
        for i in range(count):
            parent = nodes[i] // branching
            if parent == previous:
                continue
            previous = parent
            first = child_base + parent * branching
            running, low = 0.0, np.inf
            for c in range(first, first + branching):
                value = tree[c, 0]
                running += value
                tree[c, 1] = running
                low = min(low, (value if value > 0 else np.inf) if level == leaves else mins[c])
            tree[parent_base + parent, 0] = running
            mins[parent_base + parent] = low
            nodes[kept] = parent
            kept += 1
        count = kept


@njit(**_jit)
def _stable_order(keys):
    """Positions of ``keys`` in ascending order, equal keys in their original order (a bottom-up
    merge sort: plain loops compile in a fraction of the time numpy's stable argsort takes)."""
    n = len(keys)
    order, spare = np.arange(n), np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for low in range(0, n, 2 * width):
            middle, high = min(low + width, n), min(low + 2 * width, n)
            i, j = low, middle
            for k in range(low, high):
                if i < middle and (j >= high or keys[order[i]] <= keys[order[j]]):
                    spare[k] = order[i]
                    i += 1
                else:
                    spare[k] = order[j]
                    j += 1
        order, spare = spare, order
        width *= 2
    return order


@njit(**_jit)
def tree_set(tree, mins, offsets, branching, slots, values):
    """``leaves[slots] = values``; with repeated slots the last write wins. Inputs are not changed."""
    n = len(slots)
    if n == 0:
        return
    order = np.arange(n)
    for i in range(1, n):
        if slots[i] < slots[i - 1]:
            order = _stable_order(slots)
            break
    nodes = np.empty(n, dtype=np.int64)
    leaf_base, count = offsets[len(offsets) - 1], 0
    for j in range(n):
        i = order[j]
        if j + 1 < n and slots[order[j + 1]] == slots[i]:
            continue  # a later write to the same slot follows
        tree[leaf_base + slots[i], 0] = values[i]
        nodes[count] = slots[i]
        count += 1
    _refresh_parents(tree, mins, offsets, branching, nodes, count)


@njit(**_jit)
def tree_set_range(tree, mins, offsets, branching, start, values):
    """``leaves[start:start + len(values)] = values``."""
    n = len(values)
    leaf_base = offsets[len(offsets) - 1]
    for i in range(n):
        tree[leaf_base + start + i, 0] = values[i]
    # One leaf per group of K is enough to name every parent.
    nodes = np.arange(start // branching, (start + n - 1) // branching + 1) * branching
    _refresh_parents(tree, mins, offsets, branching, nodes, len(nodes))


@njit(**_jit)
def tree_sample(tree, offsets, branching, uniforms, out):
    """One leaf per equal stratum of the total mass: ``out[i]`` from stratum ``i``, drawn at ``uniforms[i]``.

    The root's total must be positive. The batch descends together, one level at a time;
    each step counts the children whose running sum is at most the target, comparisons
    that do not depend on each other, so many draws' memory loads are in flight at once.
    A leaf of zero mass is never chosen (its running sum equals its left neighbour's),
    even at rounding edges.
    """
    n = len(uniforms)
    total = tree[0, 0]
    step, ceiling = total / n, total * JUST_BELOW_ONE
    targets = np.empty(n)
    for i in range(n):
        targets[i] = min((i + uniforms[i]) * step, ceiling)
        out[i] = 0
    for level in range(1, len(offsets)):
        base = offsets[level]
        for i in range(n):
            first, target = base + out[i] * branching, targets[i]
            passed = 0
            for c in range(first, first + branching):
                passed += tree[c, 1] <= target
            if passed == branching:  # rounding carried the target past the end: the last child with mass
                passed -= 1
                while passed > 0 and tree[first + passed, 0] == 0:
                    passed -= 1
                target = tree[first + branching - 1, 1]
            below = tree[first + passed - 1, 1] if passed > 0 else 0.0
            targets[i] = min(target - below, tree[first + passed, 0] * JUST_BELOW_ONE)
            out[i] = out[i] * branching + passed


@njit(**_jit)
def importance_weights(tree, mins, offsets, slots, beta, out):
    """``out = (leaf[slots] / smallest positive leaf) ** -beta`` (at most 1)."""
    leaf_base, low, exponent = offsets[len(offsets) - 1], mins[0], np.float32(-beta)
    for i in range(len(slots)):  # float32 power (the output's precision) costs a third of float64's
        out[i] = np.float32(tree[leaf_base + slots[i], 0] / low) ** exponent


@njit(**_jit)
def gather_rows(rows, slots, out):
    """``out[i] = rows[slots[i]]`` for rows of 8-byte words."""
    width = rows.shape[1]
    for i in range(len(slots)):
        source = rows[slots[i]]
        target = out[i]
        for w in range(width):
            target[w] = source[w]


@njit(**_jit)
def write_rows(rows, offsets, columns, start):
    """Write new items' fields into rows ``start, start + 1, ...`` (wrapping at the end), a row at a time.

    ``columns[f]`` is field ``f`` as (items x words), to go at word ``offsets[f]`` of a row;
    ``rows`` and the columns are views in one word type (the widest that every field fits).
    Narrow fields, copied word by word; :func:`write_wide_rows` is the same for wide ones.
    """
    capacity = rows.shape[0]
    for i in range(columns[0].shape[0]):
        slot = (start + i) % capacity
        for f in range(len(columns)):
            for w in range(columns[f].shape[1]):
                rows[slot, offsets[f] + w] = columns[f][i, w]


@njit(**_jit)
def write_wide_rows(rows, offsets, columns, start):
    """:func:`write_rows` with block copies, faster once a field spans more than a few cache lines (images)."""
    capacity = rows.shape[0]
    for i in range(columns[0].shape[0]):
        slot = (start + i) % capacity
        for f in range(len(columns)):
            rows[slot, offsets[f]:offsets[f] + columns[f].shape[1]] = columns[f][i]


@njit(**_jit, inline="always")
def leaf_value(priority, version, min_version, eps, alpha):
    """The tree's value for an item: ``(priority + eps) ** alpha``, zero once its version is evicted."""
    return 0.0 if version < min_version else (priority + eps) ** alpha


@njit(**_jit)
def sample_rows(tree, mins, offsets, branching, uniforms, beta, rows, out_slots, out_weights, out_rows):
    """A prioritized sample in one call: :func:`tree_sample`, :func:`importance_weights`, :func:`gather_rows`."""
    tree_sample(tree, offsets, branching, uniforms, out_slots)
    importance_weights(tree, mins, offsets, out_slots, beta, out_weights)
    gather_rows(rows, out_slots, out_rows)


@njit(**_jit)
def hide_slots(tree, mins, offsets, branching, capacity, start, n, keys):
    """Empty ``n`` slots from ``start`` on (wrapping at ``capacity``): no key, priority zero."""
    for i in range(n):
        keys[(start + i) % capacity] = -1
    first = min(n, capacity - start)
    tree_set_range(tree, mins, offsets, branching, start, np.zeros(first))
    if first < n:
        tree_set_range(tree, mins, offsets, branching, 0, np.zeros(n - first))


@njit(**_jit)
def insert_items(tree, mins, offsets, branching, capacity, start, n, priorities, versions, min_version, eps, alpha,
                 keys, first_key, stored_versions):
    """Bookkeeping of ``n`` new items from slot ``start`` on (wrapping at ``capacity``): their keys,
    versions and leaf values. ``priorities`` and ``versions`` hold one value per item, or one for all."""
    values = np.empty(n)
    if len(priorities) == 1 and len(versions) == 1:  # the usual insert: one leaf value for all
        values[:] = leaf_value(priorities[0], versions[0], min_version, eps, alpha)
    else:
        for i in range(n):
            values[i] = leaf_value(priorities[0 if len(priorities) == 1 else i],
                                   versions[0 if len(versions) == 1 else i], min_version, eps, alpha)
    for i in range(n):
        slot = (start + i) % capacity
        keys[slot] = first_key + i
        stored_versions[slot] = versions[0 if len(versions) == 1 else i]
    first = min(n, capacity - start)
    tree_set_range(tree, mins, offsets, branching, start, values[:first])
    if first < n:
        tree_set_range(tree, mins, offsets, branching, 0, values[first:])


@njit(**_jit)
def update_priorities(tree, mins, offsets, branching, keys, priorities, inserted, stored_keys, stored_versions,
                      min_version, eps, alpha):
    """Checked priority update by item key; ``(error code, position of a bad key or -1, max priority)``.

    Nothing is written unless every priority is finite and >= 0 and every key was issued
    (in ``[0, inserted)``). A key whose slot was overwritten since it was sampled is skipped.
    """
    code, high = check_priorities(priorities)
    if code != 0:
        return code, -1, high
    n, capacity = len(keys), len(stored_keys)
    for i in range(n):
        if keys[i] < 0 or keys[i] >= inserted:
            return 0, i, high
    slots, values = np.empty(n, dtype=np.int64), np.empty(n)
    count = 0
    for i in range(n):
        slot = keys[i] % capacity
        if stored_keys[slot] == keys[i]:
            slots[count] = slot
            values[count] = leaf_value(priorities[i], stored_versions[slot], min_version, eps, alpha)
            count += 1
    tree_set(tree, mins, offsets, branching, slots[:count], values[:count])
    return 0, -1, high
