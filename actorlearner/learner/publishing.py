"""Publishing: each new policy version goes out once as a state dict to every stream, and to the
ONNX feed and the optional roles that follow it."""

from __future__ import annotations

from actorlearner.streaming.broadcast import PolicyBroadcast
from actorlearner.learner.onnx_feed import OnnxFeed
from actorlearner.learner.roles import Roles


class Publishing:
    """The state-dict broadcast, the ONNX feed (None for an algorithm without ``export_policy``), and
    the roles told of each version."""

    def __init__(self, broadcast: PolicyBroadcast, onnx_feed: OnnxFeed | None, roles: Roles):
        self.broadcast, self.onnx_feed, self.roles = broadcast, onnx_feed, roles

    def publish(self, version: int, policy_state: dict) -> None:
        """Serialize ``policy_state`` once as ``version`` for every stream."""
        self.broadcast.publish(version, policy_state)
        self.roles.published(version, self.broadcast.payload)

    def nudge(self) -> None:
        """Wake every stream's sender (e.g. to send new settings)."""
        self.broadcast.nudge()
        if self.onnx_feed is not None:
            self.onnx_feed.broadcast.nudge()

    def stop(self) -> None:
        if self.onnx_feed is not None:
            self.onnx_feed.stop()
