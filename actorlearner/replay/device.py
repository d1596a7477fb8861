"""The replay's device path: what CUDA runs, as Triton kernels or batched torch operations, with no host read.

Sampling and priority updates are a fixed sequence of device operations that never read a value
back to the host, so on CUDA nothing waits for the GPU and a fixed-size :meth:`DeviceReplay.draw`
with :meth:`~DeviceReplay.update_priorities` can be captured in a CUDA graph. With the Triton
kernels (:mod:`~actorlearner.replay.triton_replay`) that is three launches for a draw and
height + 3 for an update. Inserts never wait either: rows, versions and priorities reach the
device through pinned staging (:mod:`~actorlearner.replay.staging`). What the host must know (is
anything eligible to sample?) it keeps itself from what it inserted; what only the device knows
(was a priority NaN?) is counted there and raised by :meth:`DeviceReplay.check_errors`.
"""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import torch

from actorlearner.replay.buffer import PrioritizedReplay, Reservation, Sample
from actorlearner.replay.layout import KEY, VERSION, ring_parts
from actorlearner.replay.staging import RowStaging
from actorlearner.replay.scatter import last_write_wins
from actorlearner.replay.sumtree import SumTree

# The buffer only reads its inputs, so read-only arrays (views of a received payload) are fine.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", module=re.escape(__name__))

_NO_VERSION = int(np.iinfo(np.int64).min)  # the device's "nothing evicted"
_ERRORS = ("NaN", "infinite", "negative", "out of range")  # what update_priorities counts on the device


class DeviceReplay(PrioritizedReplay):
    """:class:`PrioritizedReplay` as device operations over a :class:`SumTree`: its Triton kernels on CUDA
    (``kernels="auto"``, where triton compiles them) or on the CPU in triton's interpreter
    (``kernels="triton"``), torch operations otherwise. It is its own
    :class:`~actorlearner.replay.sampling.DeviceSampling` (:meth:`device_sampling` gives itself).

    Runtime values the device operations read (alpha, beta, the eviction version, the largest
    priority, the keys issued) are device tensors, refilled in place by the base class's hooks
    (:meth:`_set_alpha`, :meth:`_issue_keys`, ...) when they change, never baked into a captured graph.
    The largest priority lives on the device only (update_priorities raises it there).
    """

    compiled = False

    def __init__(self, capacity: int, *args, device: str | torch.device = "cpu", kernels: str = "auto", **kwargs):
        self._use_triton = {"auto": None, "torch": False, "triton": True}.get(kernels)  # the tree's, made in super
        super().__init__(capacity, *args, device=device, kernels=kernels, **kwargs)
        self._alpha_t = self._device_scalar(self.alpha, torch.float64)
        self._inserted_t = self._device_scalar(self._inserted, torch.long)  # the keys a priority update may name
        self._max_priority_t = self._device_scalar(self._max_priority, torch.float64)
        del self._max_priority  # on the device only from here: _read_max_priority reads it
        self._min_version_t = self._device_scalar(_NO_VERSION, torch.long)
        self._errors = torch.zeros(len(_ERRORS), dtype=torch.long, device=self.device)
        self._refused = torch.zeros((), dtype=torch.long, device=self.device)  # this call's errors (kernels)
        self._beta_t = torch.zeros((), dtype=torch.float64, device=self.device)
        self._staged_priorities = torch.zeros(capacity, dtype=torch.float64, device=self.device)
        self._staging = RowStaging(self._rows, self._layout, self._staged_priorities)
        self._words = self._rows.view(torch.int64)
        self._key_word, self._version_word = (self._layout[name][0] // 8 for name in (KEY, VERSION))
        self._kernels = None
        if self._tree._triton is not None:
            from actorlearner.replay import triton_replay
            self._kernels = triton_replay

    def device_sampling(self) -> DeviceReplay:
        return self

    # -- runtime values: the base class's hooks, each refilling the device copy in place -----------

    def _device_scalar(self, value, dtype: torch.dtype) -> torch.Tensor:
        """A 0-d device tensor, refilled in place from then on (a captured graph keeps reading it)."""
        return torch.full((), value, dtype=dtype, device=self.device)

    def _set_alpha(self, alpha: float) -> None:
        super()._set_alpha(alpha)
        self._alpha_t.fill_(alpha)

    def _issue_keys(self, n: int) -> None:
        super()._issue_keys(n)
        self._inserted_t.fill_(self._inserted)

    def _raise_max_priority(self, priority: float) -> None:
        self._max_priority_t.clamp_(min=priority)

    def _read_max_priority(self) -> float:
        return float(self._max_priority_t)

    def _set_min_version(self, version: int | None) -> None:
        super()._set_min_version(version)
        self._min_version_t.fill_(_NO_VERSION if version is None else version)

    def _restore_counters(self, inserted: int, max_priority: float) -> None:
        self._inserted = inserted
        self._inserted_t.fill_(inserted)
        self._max_priority_t.fill_(max_priority)

    # -- sampling: a host half, then device operations only ------------------------------------

    def start_sample(self, batch_size: int, min_policy_version: int | None = None) -> bool:
        """The host half of :meth:`sample` (checks, eviction, beta's annealing); True when :meth:`draw`
        may follow, False when only :meth:`draw_on_host` can (nothing eligible, or zero priorities)."""
        return self._set_beta(self._begin_sample(batch_size, min_policy_version))

    def draw(self, batch_size: int) -> Sample:
        """Stratified draws, their IS weights and rows after :meth:`start_sample` said True: device work only."""
        with torch.no_grad():  # not inference mode: what it returns goes into the trainer's autograd
            if self._kernels is not None:
                _, weights, words = self._kernels.draw(self._tree, self._words, self._beta_t, batch_size)
            else:
                slots = self._tree.sample_positive(batch_size)
                leaf = self._tree.leaves.index_select(0, slots)
                weights = leaf.div_(self._tree.min_positive()).pow_(-self._beta_t).float()
                words = self._words.index_select(0, slots)
            return self._sample_of_rows(words.view(torch.uint8), weights)

    def draw_on_host(self, batch_size: int) -> Sample:
        """What :meth:`draw` can't: uniform over eligible items when their priorities are all zero
        (raising :class:`NothingRecentEnough` when none is eligible); reads the device."""
        return super()._draw(batch_size, self._host_beta)

    def launch(self, graph: torch.cuda.CUDAGraph) -> None:
        """Replay a captured step drawing from this replay (one launch)."""
        graph.replay()

    def _draw(self, batch_size: int, beta: float) -> Sample:
        return self.draw(batch_size) if self._set_beta(beta) else self.draw_on_host(batch_size)

    def _set_beta(self, beta: float) -> bool:
        """Take this sample's beta (on the device too); whether :meth:`draw` may follow."""
        self._beta_t.fill_(beta)
        self._host_beta = beta
        return self._versions_index.eligible > 0 and self.eps ** self.alpha > 0  # then every eligible leaf is positive

    def _sample_by_priority(self, batch_size: int, beta: float) -> Sample:
        return self.draw(batch_size)

    def _zero_evicted(self, slots: np.ndarray) -> None:
        with torch.inference_mode():
            slots = self._staging.pool.upload(slots)
            leaves = self._tree.leaves.index_select(0, slots)
            self._tree.update(slots, torch.where(self._versions.index_select(0, slots) < self._min_version_t,
                                                 0.0, leaves))

    # -- priority updates: checked on the device ------------------------------------------------

    @torch.inference_mode()
    def update_priorities(self, indices, priorities) -> None:
        """As :meth:`PrioritizedReplay.update_priorities`; values given as device tensors are checked on
        the device: a call with any NaN, infinite or negative priority or unknown key changes nothing,
        and :meth:`check_errors` raises the error. Host values (numpy, lists) raise at once."""
        if not isinstance(priorities, torch.Tensor):
            self._check_host_priorities(np.asarray(priorities, dtype=np.float64).reshape(-1))
        if not isinstance(indices, torch.Tensor):
            self._check_host_keys(np.asarray(indices, dtype=np.int64).reshape(-1))
        keys = self._as_input(indices, torch.long).reshape(-1)
        given = priorities.dtype if isinstance(priorities, torch.Tensor) else None  # the kernels read either float
        p = self._as_input(priorities, given if given in (torch.float32, torch.float64) else torch.float64).reshape(-1)
        if p.shape[0] != keys.shape[0]:
            raise ValueError(f"got {p.shape[0]} priorities for {keys.shape[0]} items")
        if keys.numel() == 0:
            return
        if self._kernels is not None:
            self._kernels.update_priorities(
                self._tree, keys, p, words=self._words, key_word=self._key_word, version_word=self._version_word,
                inserted=self._inserted_t, min_version=self._min_version_t, alpha=self._alpha_t, eps=self.eps,
                errors=self._errors, refused=self._refused, max_priority=self._max_priority_t)
            return
        p = p.to(torch.float64)
        known = (keys >= 0) & (keys < self._inserted_t)
        counts = torch.stack([p.isnan().sum(), p.isinf().sum(), (p < 0).sum(), (~known).sum()])
        self._errors += counts
        accepted = counts.sum() == 0
        p = torch.where(accepted, p, 0.0)
        torch.maximum(self._max_priority_t, p.max(), out=self._max_priority_t)
        # One write per key, the last; sorted by key, so a slot's live key (its newest) comes after the
        # stale ones of items overwritten since they were sampled, and the tree keeps that order.
        keys, p = last_write_wins(keys, p)
        slots = keys.remainder(self.capacity)
        live = (self._keys.index_select(0, slots) == keys) & accepted
        values = torch.where(live, self._leaf_values(p, self._versions.index_select(0, slots)),
                             self._tree.leaves.index_select(0, slots))
        self._tree.update(slots, values)

    def check_errors(self) -> None:
        counts = self._errors.tolist()
        if not any(counts):
            return
        self._errors.zero_()
        nan, inf, negative, unknown = counts
        if unknown:
            raise ValueError(f"indices out of range [0, {self._inserted}): {unknown} keys in refused updates")
        kind = "NaN" if nan else "infinite" if inf else "negative"
        raise ValueError(f"priorities must be finite and >= 0; got {kind} values")

    def _check_host_priorities(self, p: np.ndarray) -> None:
        if p.size and not (np.all(p >= 0) and np.all(p < math.inf)):  # NaN fails both comparisons
            kind = "NaN" if np.isnan(p).any() else "infinite" if np.isinf(p).any() else "negative"
            raise ValueError(f"priorities must be finite and >= 0; got {kind} values")

    def _check_host_keys(self, keys: np.ndarray) -> None:
        bad = keys[(keys < 0) | (keys >= self._inserted)]
        if bad.size:
            raise ValueError(f"indices out of range [0, {self._inserted}): {bad[:5].tolist()}")

    def _check_priorities(self, priorities, n: int) -> np.ndarray:
        """An insert's priorities, checked on the host (read back if given on the device: inserts may wait);
        they reach the device with the insert's rows, and the running maximum with the commit."""
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().cpu()
        p = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if p.shape[0] != n:
            raise ValueError(f"got {p.shape[0]} priorities for {n} items")
        self._check_host_priorities(p)
        return p

    # -- inserts --------------------------------------------------------------------------------

    def _copy_in(self, reservation: Reservation) -> None:
        if reservation.n:
            with torch.inference_mode():
                self._staging.write(reservation.columns, reservation.versions, reservation.priorities,
                                    reservation.start)

    def _make_tree(self, branching: int) -> SumTree:
        return SumTree(self.capacity, branching, self.device, triton=self._use_triton)

    def _as_input(self, value, dtype: torch.dtype) -> torch.Tensor:
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value)
        return torch.as_tensor(value, device=self.device).to(dtype)

    def _as_versions(self, value) -> np.ndarray:
        """Versions stay on the host, as numpy: the staging copies them in with the rows."""
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
        return np.asarray(value, dtype=np.int64)

    def _input_column(self, value, dtype: torch.dtype):
        """Columns stay where they are until :meth:`write` copies them (no lock, no device work)."""
        return torch.from_numpy(value) if isinstance(value, np.ndarray) else value

    def _highest_priority(self, priorities) -> float:
        raise NotImplementedError("the device path checks priorities in _check_priorities")

    def _hide(self, start: int, n: int) -> None:
        with torch.inference_mode():
            for at, stop, _ in ring_parts(start, n, self.capacity):
                self._keys[at:stop].fill_(-1)
                self._tree.update_range(at, torch.zeros(stop - at, dtype=torch.float64, device=self.device))

    def _store(self, reservation: Reservation, keys: torch.Tensor) -> None:
        """Keys from the commit; versions and priorities from the staged copy (device work only)."""
        with torch.inference_mode():
            for at, stop, offset in ring_parts(reservation.start, reservation.n, self.capacity):
                self._keys[at:stop].copy_(keys[offset:offset + stop - at])
                if reservation.priorities is None:
                    priorities = self._max_priority_t.expand(stop - at)
                else:
                    priorities = self._staged_priorities[at:stop]
                    torch.maximum(self._max_priority_t, priorities.max(), out=self._max_priority_t)
                self._tree.update_range(at, self._leaf_values(priorities, self._versions[at:stop]))

    def _leaf_values(self, priorities: torch.Tensor, versions: torch.Tensor) -> torch.Tensor:
        leaf = (priorities + self.eps).pow_(self._alpha_t)
        return torch.where(versions >= self._min_version_t, leaf, 0.0)  # evicted versions stay at zero
