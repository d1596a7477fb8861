"""The policy as ONNX for actors that ask for it (``Hello.policy_format = "onnx"``).

An actor in C#, C++ or Node then runs the policy with onnxruntime instead of rebuilding the
network. The feed works only while such a stream is open: on a thread of its own it
exports the first version it needs (seconds), and each later one by replacing the
weights of that graph (milliseconds) or, when the exporter folded some weights into
constants, by exporting again. Versions published meanwhile are skipped, latest wins. A
self-play league's snapshots are made into ONNX models the same way, after the current version,
each once (the league sends them to ONNX streams as it sends state dicts to the others).
"""

from __future__ import annotations

import logging
import threading

import gymnasium as gym

from actorlearner import wire
from actorlearner.algorithms import Policy
from actorlearner.export import onnx_program, weights_replaceable
from actorlearner.league import League
from actorlearner.streaming.broadcast import PolicyBroadcast

logger = logging.getLogger(__name__)


class OnnxFeed:
    """Follows ``source`` (the state-dict broadcast) into its own broadcast of ONNX models.

    ``policy`` is a CPU policy for this feed alone (one that `can_export`): each version is loaded into it.
    ``league`` (self-play, else None) gets the ONNX models of its snapshots.
    """

    def __init__(self, source: PolicyBroadcast, policy: Policy, observation_space: gym.Space,
                 action_space: gym.Space, chunk_bytes: int, league: League | None = None):
        self.source = source
        self.league = league
        self.broadcast = PolicyBroadcast(chunk_bytes)
        self.exports = 0  # whole exports done
        self._policy = policy
        self._spaces = observation_space, action_space
        self._program = None
        self._replaceable = False
        self._streams = 0
        self._stopped = False
        self._failed = -1  # the newest version whose export failed
        self._failed_snapshots: set[str] = set()  # snapshots whose export failed: not tried again
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        source.listen(self._wake)

    def subscribe(self) -> None:
        """An ONNX stream opened: the feed follows the source until the last one closes."""
        with self._changed:
            self._streams += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="onnx-feed", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def wait_current(self, timeout: float) -> None:
        """Wait, up to ``timeout`` s, until the model of the source's version now is out (or its export
        failed), so that a new stream's Welcome names a version whose model follows it at once."""
        target = self.source.version
        with self._changed:
            self._changed.wait_for(lambda: self._stopped or max(self.broadcast.version, self._failed) >= target,
                                   timeout)

    def unsubscribe(self) -> None:
        with self._changed:
            self._streams -= 1

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self.source.unlisten(self._wake)
        if self._thread is not None:
            self._thread.join()

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _snapshots(self) -> list[tuple[str, bytes]]:
        """The league's snapshots still to export, oldest first."""
        if self.league is None:
            return []
        return [(member, payload) for member, payload in self.league.unexported() if member not in self._failed_snapshots]

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopped or (self._streams > 0 and (
                    self.source.version > self.broadcast.version or self._snapshots())))
                if self._stopped:
                    return
            if self.source.version <= self.broadcast.version:
                self._export_snapshots()
                continue
            version, payload = self.source.snapshot()
            try:
                self.broadcast.publish_payload(version, self._model(payload))
            except Exception:  # an exporter failure must not stop the learner; the streams get no new version
                logger.exception("exporting policy version %d as ONNX failed; ONNX actors keep the previous one",
                                 version)
                with self._changed:
                    self._failed = version
                    self._changed.notify_all()
                    self._changed.wait_for(lambda: self._stopped or self.source.version > version)
                continue
            self._wake()

    def _export_snapshots(self) -> None:
        """Each league snapshot without a model, oldest first, until a new version is published."""
        for member, payload in self._snapshots():
            if self._stopped or self.source.version > self.broadcast.version:
                return
            try:
                self.league.exported(member, self._model(payload))
            except Exception:  # as for a version: logged, the learner goes on; ONNX actors do not draw it
                logger.exception("exporting league snapshot %s as ONNX failed; ONNX actors will not play it", member)
                self._failed_snapshots.add(member)

    def _model(self, payload: bytes) -> bytes:
        """The ONNX model of a serialized state dict."""
        self._policy.load_policy_state_dict(wire.decode_state_dict(payload))
        module = self._policy.export_policy()
        if self._program is None or not self._replaceable:
            self._program = onnx_program(module, *self._spaces)
            self._replaceable = weights_replaceable(self._program, module)
            self.exports += 1
        else:
            self._program.apply_weights(module.state_dict())
        return self._program.model_proto.SerializeToString()
