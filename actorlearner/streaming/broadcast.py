"""Policy fan-out: each version is serialized once, chunked, and pulled latest-wins by every stream as the
same message bytes (Connect's response serializer passes bytes through)."""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from actorlearner import wire
from actorlearner.v1 import learner_pb2 as pb

ONNX_FORMAT = "onnx"
"""``Hello.policy_format`` of an actor that runs the policy as ONNX: its stream follows the ONNX broadcast."""


def policy_update_messages(version: int, payload: bytes, chunk_bytes: int, opponent: str = "") -> list[pb.LearnerMessage]:
    """A serialized policy as its chunked PolicyUpdate messages (``opponent``: a league snapshot's id)."""
    chunks = wire.split_chunks(payload, chunk_bytes)
    return [pb.LearnerMessage(policy_update=pb.PolicyUpdate(
        version=version, chunk_index=i, chunk_count=len(chunks), total_bytes=len(payload), payload=chunk,
        opponent=opponent)) for i, chunk in enumerate(chunks)]


class PolicyBroadcast:
    """Holds the newest policy version as ready-to-send messages.

    Streams never queue versions: a stream that is busy sending version v and finds v+3
    published next sends v+3 only, so a slow actor skips versions instead of falling behind.
    """

    def __init__(self, chunk_bytes: int):
        self.chunk_bytes = chunk_bytes
        self.version = -1
        self.serializations = 0  # how many times a state dict was encoded: one per version
        self.payload = b""
        self._messages: list[bytes] = []  # serialized LearnerMessages
        self._lock = threading.Lock()
        self._listeners: set = set()

    def publish(self, version: int, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Serialize ``state_dict`` once as ``version`` and wake every listener."""
        self.publish_payload(version, wire.encode_state_dict(state_dict))

    def publish_payload(self, version: int, payload: bytes) -> None:
        """Chunk an already serialized policy (a state dict, or an ONNX model) as ``version`` and wake every listener."""
        messages = [m.SerializeToString() for m in policy_update_messages(version, payload, self.chunk_bytes)]
        with self._lock:
            self.version, self.payload, self._messages = version, payload, messages
            self.serializations += 1
        self.nudge()

    def nudge(self) -> None:
        """Wake every listener without a new version (the learner's settings changed)."""
        with self._lock:
            listeners = list(self._listeners)
        for wake in listeners:
            wake()

    def snapshot(self) -> tuple[int, bytes]:
        """The newest version and its whole payload."""
        with self._lock:
            return self.version, self.payload

    def latest(self) -> tuple[int, list[bytes]]:
        """The newest version and its serialized LearnerMessages (shared)."""
        with self._lock:
            return self.version, self._messages

    def listen(self, wake) -> None:
        """Call ``wake()`` on every publish until :meth:`unlisten`."""
        with self._lock:
            self._listeners.add(wake)

    def unlisten(self, wake) -> None:
        with self._lock:
            self._listeners.discard(wake)
