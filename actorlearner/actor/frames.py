"""A frame-stacked actor's side of :mod:`actorlearner.frames`: each frame gets an id once, the
algorithm assembles items of ids, and each batch (one env's items) carries the frames they refer to.

Ids are actor-local: env ``e``'s ``f``-th frame (from 1) is ``f * num_envs + e``, so an id names its
env and an env's ids rise. Ids below ``num_envs`` are padding (an assembler fills the steps after an
episode's end in a sequence with zeros): they stand for a frame of zeros, as padded stacks hold.

A batch holds the items of one env only, so that its frames overlap: a batch of ``b`` n-step
transitions carries ``b + n + K - 1`` frames, not ``2 K b``.
"""

from __future__ import annotations

import math

import numpy as np

from actorlearner.actor.batching import Block, PendingTransitions, rows
from actorlearner.frames import FrameLayout
from actorlearner.wire import FRAMES


class FrameIds:
    """Gives each new frame of a vector env's stacked observations an id and keeps it until no item
    to come can refer to it; an env's frames are kept while the batches it has pending refer to them
    and for ``horizon`` frames before its newest (an assembler's windows and sequences, not yet
    emitted, reach back less far)."""

    def __init__(self, num_envs: int, stack: int):
        self.num_envs, self.stack = num_envs, stack
        self.horizon = 512
        self._frames: list[dict[int, np.ndarray]] = [{} for _ in range(num_envs)]  # id -> frame, oldest first
        self._count = np.zeros(num_envs, np.int64)  # frames each env has had
        self._stacks = np.zeros((num_envs, stack), np.int64)
        self.floor = [math.inf] * num_envs  # the oldest id each env's pending batches refer to

    def observe(self, obs: np.ndarray, resets: np.ndarray) -> np.ndarray:
        """The frame ids ``(num_envs, K)`` of stacked observations ``obs``: a reset env's whole stack
        is new (frames equal to the one before share its id: a repeated first frame is kept once),
        any other env's newest frame is."""
        for e in range(self.num_envs):
            if resets[e]:
                for k in range(self.stack):
                    same = k > 0 and np.array_equal(obs[e, k], obs[e, k - 1])
                    self._stacks[e, k] = self._stacks[e, k - 1] if same else self._add(e, obs[e, k])
            else:
                self._stacks[e, :-1] = self._stacks[e, 1:]
                self._stacks[e, -1] = self._add(e, obs[e, -1])
        return self._stacks.copy()

    def frames(self, env: int, ids: np.ndarray) -> np.ndarray:
        """The frames of ``ids`` (env ``env``'s, or padding), stacked; RuntimeError for one already dropped."""
        kept, zeros = self._frames[env], None
        if len(ids) and ids[0] < self.num_envs:
            zeros = np.zeros_like(kept[next(iter(kept))])
        try:
            return np.stack([zeros if i < self.num_envs else kept[i] for i in ids.tolist()])
        except KeyError as exc:
            raise RuntimeError(f"frame {exc.args[0]} of env {env} was dropped: an item refers to a frame more than "
                               f"{self.horizon} frames older than its env's newest") from None

    def _add(self, env: int, frame: np.ndarray) -> int:
        self._count[env] += 1
        frame_id = int(self._count[env]) * self.num_envs + env
        kept = self._frames[env]
        kept[frame_id] = np.array(frame)
        oldest = min(self.floor[env], frame_id - self.horizon * self.num_envs)
        while kept and next(iter(kept)) < oldest:
            del kept[next(iter(kept))]
        return frame_id


class FramePending:
    """Pending items of ids, one queue per env; a batch is one env's items with their frames, each once."""

    def __init__(self, ids: FrameIds, layout: FrameLayout):
        self.ids, self.layout = ids, layout
        self._queues = [PendingTransitions() for _ in range(ids.num_envs)]

    def add(self, block: Block | None, version: int) -> None:
        """Queue a block of items (of any envs) under each item's env."""
        if block is None or not rows(block):
            return
        envs = block[self.layout.refs[0]].reshape(rows(block), -1).max(axis=1) % self.ids.num_envs
        for env in np.unique(envs).tolist():
            mine, first = envs == env, self._queues[env].first is None
            self._queues[env].add({name: column[mine] for name, column in block.items()}, version)
            if first:  # the floor is the oldest pending block's: it changes only when that block does
                self._update_floor(env)

    def ready(self, size: int, everything: bool = False) -> bool:
        return any(q.ready(size, everything) for q in self._queues)

    def take(self, size: int) -> tuple[Block, int]:
        """The fullest env's next batch of at most ``size`` items, with its frames."""
        env = max(range(len(self._queues)), key=lambda e: self._queues[e].count)
        batch, version = self._queues[env].take(size)
        refs = [batch[name] for name in self.layout.refs]
        unique, inverse = np.unique(np.concatenate([r.ravel() for r in refs]), return_inverse=True)
        batch = dict(batch)
        start = 0
        for name, ref in zip(self.layout.refs, refs):
            batch[name] = inverse[start:start + ref.size].reshape(ref.shape).astype(np.int64)
            start += ref.size
        batch[FRAMES] = self.ids.frames(env, unique)
        self._update_floor(env)
        return batch, version

    def _update_floor(self, env: int) -> None:
        oldest = self._queues[env].first
        floor = math.inf
        for name in self.layout.refs if oldest is not None else ():
            ids = oldest[name][oldest[name] >= self.ids.num_envs]  # padding refers to no kept frame
            floor = min(floor, int(ids.min())) if ids.size else floor
        self.ids.floor[env] = floor
