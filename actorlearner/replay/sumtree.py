"""Wide (K-ary) sum trees: :class:`SumTree` in torch tensors on any device, :class:`CpuSumTree`
in compiled CPU kernels. Both keep float64 sums and the minimum positive leaf.

:class:`SumTree`, the device path:
The leaves sit ``height`` K-ary levels below a flat top level of at most ``max_top``
nodes. Sampling finds the top node with one binary search over the top's prefix sums,
then descends one vectorized step per level; with K = 16 and a million leaves that is
one search and two steps, a handful of torch calls for the whole batch on any device,
never a Python loop over items.

Sums are float64 and every update recomputes each touched parent from its children (no
running deltas), so the total never drifts from the sum of the leaves. A parallel tree of
minima gives the smallest positive leaf (for exact importance weights) the same way. No
method but :meth:`SumTree.sample`'s zero check reads a value back to the host: on CUDA
nothing waits for the GPU, and a fixed-size :meth:`SumTree.sample_positive` or update is
the same device operations every time (capturable in a CUDA graph). On CUDA, when triton
imports, :meth:`SumTree.sample_positive` and :meth:`SumTree.update` run as a few Triton kernels
instead (:mod:`actorlearner.replay.triton_tree`), with the same results.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from actorlearner.replay import kernels
from actorlearner.replay.scatter import last_write_wins

# Multiplying a positive float64 by this gives a value strictly below it.
_JUST_BELOW_ONE = 1.0 - 2.0**-52


class SumTree:
    """Non-negative priorities of ``capacity`` leaves, sampled in proportion to their value.

    A zero leaf is never sampled; when every leaf is zero, :meth:`sample` is uniform. Values
    must be finite and non-negative: validating them is the caller's job. Every method but
    :meth:`sample`'s zero-total check works without reading a value back to the host, so on
    CUDA nothing waits for the GPU, and :meth:`sample_positive` can be captured in a CUDA graph.
    """

    def __init__(self, capacity: int, branching: int = 16, device: str | torch.device = "cpu",
                 max_top: int = 4096, triton: bool | None = None):
        if capacity < 1 or branching < 2 or max_top < 1:
            raise ValueError(f"need capacity >= 1, branching >= 2, max_top >= 1; got "
                             f"{capacity}, {branching}, {max_top}")
        self.capacity = capacity
        self.branching = branching
        self.device = torch.device(device)
        self.height = 0
        while math.ceil(capacity / branching**self.height) > max_top:
            self.height += 1
        top = math.ceil(capacity / branching**self.height)
        kw = dict(dtype=torch.float64, device=self.device)
        # Level 0 is the top, level ``height`` the leaves (zero-padded past ``capacity``).
        self._sums = [torch.zeros(top * branching**d, **kw) for d in range(self.height + 1)]
        # The smallest positive leaf below each node (inf for none), for levels 0 .. height - 1.
        self._mins = [torch.full((top * branching**d,), math.inf, **kw) for d in range(self.height)]
        self._top_cumsum = torch.zeros(top, **kw)
        self._top_before = torch.zeros(top, **kw)  # mass left of each top node
        self._min = torch.full((), math.inf, **kw)
        self._triton = _triton_kernels(self.device, triton)  # None: the torch code below

    @property
    def leaves(self) -> torch.Tensor:
        """Leaf values (a view: read it, write through :meth:`update`)."""
        return self._sums[-1][: self.capacity]

    def total(self) -> torch.Tensor:
        """Sum of all leaves, a 0-d float64 tensor."""
        return self._top_cumsum[-1]

    def min_positive(self) -> torch.Tensor:
        """Smallest positive leaf (``inf`` when none), a 0-d float64 tensor."""
        return self._min

    @torch.inference_mode()
    def update(self, indices: torch.Tensor, values: torch.Tensor) -> None:
        """Set ``leaves[indices] = values``. With repeated indices the last write wins."""
        indices = indices.to(self.device, torch.long).reshape(-1)
        values = values.to(self.device, torch.float64).reshape(-1)
        if indices.numel() == 0:
            return
        if self._triton is not None:
            return self._triton.update(self, indices, values)
        indices, values = last_write_wins(indices, values)
        self._sums[-1].index_copy_(0, indices, values)  # repeated indices now write the same value
        k = self.branching
        for d in range(self.height, 0, -1):
            indices = indices.div(k, rounding_mode="floor")
            # Repeated parents compute the same value, so their writes agree.
            self._sums[d - 1].index_copy_(0, indices, self._sums[d].view(-1, k).index_select(0, indices).sum(1))
            self._mins[d - 1].index_copy_(0, indices, self._child_mins(d, indices))
        self._refresh_top()

    @torch.inference_mode()
    def update_range(self, start: int, values: torch.Tensor) -> None:
        """Set ``leaves[start:start + len(values)] = values``: the cheap path for inserts."""
        values = values.to(self.device, torch.float64).reshape(-1)
        lo, hi = start, start + values.shape[0]
        if not 0 <= lo <= hi <= self.capacity:
            raise ValueError(f"range [{lo}, {hi}) is outside [0, {self.capacity})")
        self._sums[-1][lo:hi] = values
        k = self.branching
        for d in range(self.height, 0, -1):
            lo, hi = lo // k, -(-hi // k)
            self._sums[d - 1][lo:hi] = self._sums[d].view(-1, k)[lo:hi].sum(1)
            self._mins[d - 1][lo:hi] = self._child_mins(d, slice(lo, hi))
        self._refresh_top()

    @torch.inference_mode()
    def sample(self, batch_size: int, num_items: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``batch_size`` leaf indices, one from each equal stratum of the total mass.

        When the total is zero, draws uniformly from the first ``num_items`` leaves (default:
        all of them). Telling the two apart reads the total on the host: where the caller
        knows it is positive, :meth:`sample_positive` reads nothing.
        """
        if not float(self.total()) > 0:
            num_items = self.capacity if num_items is None else num_items
            rand = torch.rand(batch_size, dtype=torch.float64, device=self.device, generator=generator)
            return rand.mul_(num_items).long().clamp_(max=num_items - 1)
        return self.sample_positive(batch_size, generator)

    @torch.inference_mode()
    def sample_positive(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """:meth:`sample` for a positive total, in a fixed sequence of device operations (no host read).

        With a zero total it still returns leaf indices inside the tree, just not meaningful ones.
        """
        if self._triton is not None:
            return self._triton.sample_positive(self, batch_size, generator)
        total = self.total()
        target = torch.rand(batch_size, dtype=torch.float64, device=self.device, generator=generator)
        target.add_(torch.arange(batch_size, dtype=torch.float64, device=self.device)).mul_(total / batch_size)
        target = torch.minimum(target, total * _JUST_BELOW_ONE)
        # target < total, so the first top node whose running sum exceeds it has mass.
        top = self._top_cumsum.shape[0]
        node = torch.searchsorted(self._top_cumsum, target, right=True).clamp_(max=top - 1)
        target -= self._top_before.index_select(0, node)
        k = self.branching
        for level in self._sums[1:]:
            children = level.view(-1, k).index_select(0, node)
            cumsum = children.cumsum(1)
            # Keep the target inside this node's mass despite rounding on the way down.
            target = torch.minimum(target, cumsum[:, -1] * _JUST_BELOW_ONE).unsqueeze_(1)
            child = torch.searchsorted(cumsum, target, right=True).clamp_(max=k - 1)
            # Mass left of the chosen child: its running sum minus its own value.
            target = target.sub_(cumsum.gather(1, child)).add_(children.gather(1, child)).squeeze_(1)
            node = node.mul_(k).add_(child.squeeze_(1))
        return node.clamp_(max=self.capacity - 1)

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        """Leaves and shape; inner nodes are rebuilt on load."""
        return {"capacity": self.capacity, "branching": self.branching, "leaves": self.leaves.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore leaves saved by :meth:`state_dict` (from any device) and rebuild the tree."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"capacity mismatch: saved {state['capacity']}, tree has {self.capacity}")
        leaves = torch.as_tensor(state["leaves"], dtype=torch.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(f"leaves must have shape ({self.capacity},), got {tuple(leaves.shape)}")
        self.update_range(0, leaves)

    def _child_mins(self, depth: int, parents: torch.Tensor | slice) -> torch.Tensor:
        """The smallest positive leaf below each of ``parents`` (nodes of level ``depth - 1``), from level ``depth``."""
        k = self.branching
        if depth == self.height:
            children = self._sums[depth].view(-1, k)[parents]
            return torch.where(children > 0, children, math.inf).amin(1)
        return self._mins[depth].view(-1, k)[parents].amin(1)

    def _refresh_top(self) -> None:
        top = self._sums[0]
        torch.cumsum(top, 0, out=self._top_cumsum)
        torch.sub(self._top_cumsum, top, out=self._top_before)
        if self.height:
            torch.amin(self._mins[0], 0, out=self._min)
        else:
            torch.amin(torch.where(top > 0, top, math.inf), 0, out=self._min)


class CpuSumTree:
    """:class:`SumTree`'s API on the CPU, each operation one compiled kernel call (see :mod:`kernels`).

    A zero leaf is never sampled; when every leaf is zero, sampling is uniform. Values must
    be finite and non-negative: validating them is the caller's job.
    """

    def __init__(self, capacity: int, branching: int = 16):
        if capacity < 1 or branching < 2:
            raise ValueError(f"need capacity >= 1, branching >= 2; got {capacity}, {branching}")
        self.capacity, self.branching = capacity, branching
        self.device = torch.device("cpu")
        nodes = [capacity]  # per level, leaves first; a root above the leaves even when capacity is 1
        while len(nodes) == 1 or nodes[-1] > 1:
            nodes.append(-(-nodes[-1] // branching))
        sizes = [1] + [count * branching for count in reversed(nodes[1:])]  # root first, padded to whole groups
        self.offsets = np.cumsum([0] + sizes[:-1]).astype(np.int64)
        leaf_base = int(self.offsets[-1])
        self.tree = np.zeros((sum(sizes), 2), dtype=np.float64)  # node values, running sums within groups
        self.mins = np.full(leaf_base, np.inf)
        self.leaves = torch.from_numpy(self.tree[leaf_base:leaf_base + capacity, 0])
        """Leaf values (a view: read it, write through :meth:`update`)."""

    def total(self) -> float:
        """Sum of all leaves."""
        return float(self.tree[0, 0])

    def min_positive(self) -> float:
        """Smallest positive leaf (``inf`` when none)."""
        return float(self.mins[0])

    def update(self, indices, values) -> None:
        """Set ``leaves[indices] = values``. With repeated indices the last write wins."""
        indices, values = _numpy(indices, np.int64), _numpy(values, np.float64)
        kernels.tree_set(self.tree, self.mins, self.offsets, self.branching, indices, values)

    def update_range(self, start: int, values) -> None:
        """Set ``leaves[start:start + len(values)] = values``: the cheap path for inserts."""
        values = _numpy(values, np.float64)
        if not 0 <= start <= start + len(values) <= self.capacity:
            raise ValueError(f"range [{start}, {start + len(values)}) is outside [0, {self.capacity})")
        if len(values):
            kernels.tree_set_range(self.tree, self.mins, self.offsets, self.branching, start, values)

    def sample(self, batch_size: int, num_items: int | None = None,
               generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``batch_size`` leaf indices, one from each equal stratum of the total mass.

        When the total is zero, draws uniformly from the first ``num_items`` leaves
        (default: all of them).
        """
        rand = torch.rand(batch_size, dtype=torch.float64, generator=generator)
        if not self.tree[0, 0] > 0:
            num_items = self.capacity if num_items is None else num_items
            return rand.mul_(num_items).long().clamp_(max=num_items - 1)
        out = np.empty(batch_size, dtype=np.int64)
        kernels.tree_sample(self.tree, self.offsets, self.branching, rand.numpy(), out)
        return torch.from_numpy(out)

    def state_dict(self) -> dict[str, torch.Tensor | int]:
        """Leaves and shape; inner nodes are rebuilt on load."""
        return {"capacity": self.capacity, "branching": self.branching, "leaves": self.leaves.clone()}

    def load_state_dict(self, state: dict) -> None:
        """Restore leaves saved by :meth:`state_dict` (from any device) and rebuild the tree."""
        if int(state["capacity"]) != self.capacity:
            raise ValueError(f"capacity mismatch: saved {state['capacity']}, tree has {self.capacity}")
        leaves = torch.as_tensor(state["leaves"], dtype=torch.float64).cpu()
        if leaves.shape != (self.capacity,):
            raise ValueError(f"leaves must have shape ({self.capacity},), got {tuple(leaves.shape)}")
        self.update_range(0, leaves)


def _triton_kernels(device: torch.device, use: bool | None = None):
    """The Triton kernels' module for a tree on ``device``, or None for the torch code. ``use=None``: on CUDA
    when triton imports and compiles its kernels (interpreted, they read tensors on the host). True: the
    kernels, compiled on CUDA or interpreted on the CPU (``TRITON_INTERPRET=1``, as tests run them); raises
    ImportError or ValueError where they can't run. False: the torch code."""
    if use is False or (use is None and device.type != "cuda"):
        return None
    try:
        from actorlearner.replay import triton_tree
    except ImportError:
        if use:
            raise
        return None
    if use and triton_tree.INTERPRETED != (device.type == "cpu"):
        raise ValueError(f"triton's kernels on {device.type} need TRITON_INTERPRET={int(device.type == 'cpu')} "
                         f"before triton's first import")
    return triton_tree if use or not triton_tree.INTERPRETED else None


def _numpy(values, dtype) -> np.ndarray:
    """A 1-d numpy array of ``dtype`` over ``values`` (a tensor, array or sequence), copying only if needed."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    return np.ascontiguousarray(values, dtype=dtype).reshape(-1)
