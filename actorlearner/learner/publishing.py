"""Publishing: each new policy version goes out once as a state dict to every stream, and to the
ONNX feed and the optional roles that follow it, without making the training thread wait.

The training thread only queues asynchronous copies of the live weights into pinned host buffers
(and, on CUDA, an event after them); a publisher thread waits for the copies, serializes each
version once, tells the roles and frees the buffers. Versions go out in order and none is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Mapping

import torch
from torch import Tensor

from actorlearner import wire
from actorlearner.learner.onnx_feed import OnnxFeed
from actorlearner.learner.roles import Roles
from actorlearner.pinned import pinned_empty
from actorlearner.streaming.broadcast import PolicyBroadcast

logger = logging.getLogger(__name__)

DEPTH = 4
"""Buffer sets at most: `Publishing.publish` waits only while this many versions are queued or being serialized."""
ONNX_WELCOME_WAIT_SECONDS = 120.0
"""Longest an ONNX stream's Welcome waits for the model of the current version (its first export takes seconds)."""
IDLE_SECONDS = 10.0
"""How long the publisher thread waits for a version before it ends (the next `Publishing.publish` starts another)."""


class Publishing:
    """The state-dict broadcast, the ONNX feed (None for an algorithm without ``export_policy``), the
    roles told of each version, and the publisher thread that feeds them.

    A failure of the publisher thread is logged at once, counted in :attr:`failures`, and raised
    (as RuntimeError) by the next `publish` or `flush`; later versions still go out.
    """

    def __init__(self, broadcast: PolicyBroadcast, onnx_feed: OnnxFeed | None, roles: Roles, depth: int = DEPTH):
        self.broadcast, self.onnx_feed, self.roles, self.depth = broadcast, onnx_feed, roles, depth
        roles.listen(self.nudge)  # the roles' news (a league's) goes out on every stream
        self.failures = 0
        self._changed = threading.Condition()
        self._queue: deque[tuple[int, dict[str, Tensor], torch.cuda.Event | None]] = deque()  # the head is in hand
        self._free: list[dict[str, Tensor]] = []
        self._made = 0  # buffer sets made: free, queued or in hand
        self._failure: tuple[int, Exception] | None = None  # the first not raised yet
        self._stopping = False
        self._thread: threading.Thread | None = None

    def publish(self, version: int, tensors: Mapping[str, Tensor]) -> None:
        """Queue ``tensors`` (a trainer's live `policy_tensors`, on any device) to go out as ``version``.

        Returns once their copies are queued on the device: nothing here waits for the device, and
        the caller may change the tensors right after (later device work runs after the copies).
        """
        self._raise_failure()
        buffers = self._buffers(tensors)
        with torch.no_grad():
            if tensors:
                torch._foreach_copy_([buffers[name] for name in tensors], list(tensors.values()), non_blocking=True)
        copied = _copied(tensors)
        with self._changed:
            self._queue.append((version, buffers, copied))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    # -- what streams and the evaluator follow -----------------------------------------------------

    @property
    def takes_onnx(self) -> bool:
        """Whether streams may ask for ONNX models (the algorithm exports its policy)."""
        return self.onnx_feed is not None

    def broadcasts(self) -> list[PolicyBroadcast]:
        """Every broadcast a stream may follow: state dicts, then ONNX models where there is a feed."""
        return [self.broadcast] + ([self.onnx_feed.broadcast] if self.onnx_feed is not None else [])

    def broadcast_for(self, onnx: bool) -> PolicyBroadcast:
        """The broadcast a stream follows: ONNX models if it asked for them, else state dicts."""
        return self.onnx_feed.broadcast if onnx else self.broadcast

    @contextlib.asynccontextmanager
    async def subscription(self, onnx: bool) -> AsyncIterator[None]:
        """While a stream is open: an ONNX stream keeps the feed exporting, and first waits (up to
        ``ONNX_WELCOME_WAIT_SECONDS``) for the model of the current version, so that its Welcome names a
        version whose model follows at once. Nothing for a state-dict stream."""
        if not onnx:
            yield
            return
        self.onnx_feed.subscribe()
        try:
            await asyncio.to_thread(self.onnx_feed.wait_current, ONNX_WELCOME_WAIT_SECONDS)
            yield
        finally:
            self.onnx_feed.unsubscribe()

    def latest_state_dict(self) -> tuple[int, bytes]:
        """The newest published version and its serialized state dict."""
        return self.broadcast.snapshot()

    def flush(self) -> None:
        """Wait until every version handed to `publish` is out; raise a failure not raised yet."""
        with self._changed:
            self._changed.wait_for(lambda: not self._queue)
        self._raise_failure()

    def nudge(self) -> None:
        """Wake every stream's sender (e.g. to send new settings)."""
        self.broadcast.nudge()
        if self.onnx_feed is not None:
            self.onnx_feed.broadcast.nudge()

    def stop(self) -> None:
        """Publish what is queued, then stop the publisher thread and the ONNX feed. A failure not raised yet
        stays logged only: nobody is left to raise it to."""
        with self._changed:
            self._stopping = True
            thread, self._thread = self._thread, None
            self._changed.notify_all()
        if thread is not None:
            thread.join()
        with self._changed:
            self._stopping, self._failure = False, None
        if self.onnx_feed is not None:
            self.onnx_feed.stop()

    def _buffers(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """A free buffer set for ``tensors`` (made anew when none fits); waits while all are in flight."""
        with self._changed:
            self._changed.wait_for(lambda: self._free or self._made < self.depth)
            buffers = self._free.pop() if self._free else None
            if buffers is None:
                self._made += 1
        if buffers is None or not _fits(buffers, tensors):
            buffers = {name: pinned_empty(tuple(t.shape), t.dtype, t.device) for name, t in tensors.items()}
        return buffers

    def _run(self) -> None:
        """The publisher thread: each queued version in turn, until stopped or idle with nothing queued."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._queue or self._stopping, IDLE_SECONDS)
                if not self._queue:
                    if self._thread is threading.current_thread():
                        self._thread = None
                    return
                version, buffers, copied = self._queue[0]
            failure = None
            try:
                if copied is not None:
                    copied.synchronize()
                payload = wire.encode_state_dict(buffers)
                self.broadcast.publish_payload(version, payload)
                self.roles.published(version, payload)
            except Exception as exc:
                logger.exception("publishing policy version %d failed", version)
                failure = version, exc
            with self._changed:
                self._queue.popleft()
                self._free.append(buffers)
                if failure is not None:
                    self.failures += 1
                    self._failure = self._failure or failure
                self._changed.notify_all()

    def _raise_failure(self) -> None:
        with self._changed:
            failure, self._failure = self._failure, None
        if failure is not None:
            version, exc = failure
            raise RuntimeError(f"publishing policy version {version} failed: {exc!r}") from exc


def _fits(buffers: Mapping[str, Tensor], tensors: Mapping[str, Tensor]) -> bool:
    """Whether ``buffers`` has a buffer of the same shape and dtype for each of ``tensors``, in their order."""
    return list(buffers) == list(tensors) and all(
        buffers[name].shape == t.shape and buffers[name].dtype == t.dtype for name, t in tensors.items())


def _copied(tensors: Mapping[str, Tensor]) -> torch.cuda.Event | None:
    """An event recorded after the copies queued on a CUDA device's current stream; None off CUDA, where
    they are done already."""
    device = next((t.device for t in tensors.values() if t.device.type == "cuda"), None)
    if device is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
