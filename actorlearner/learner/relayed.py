"""The relay protocol on the learner's side: the actors behind a relay's stream join (their Hello checked as
their own stream's would be) and leave through it, each message goes to its actor's session, and one actor's
bad input refuses that actor alone."""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable

from actorlearner import wire
from actorlearner.learner.learner import Learner
from actorlearner.learner.registry import ActorSession
from actorlearner.learner.replay_service import InsertAborted
from actorlearner.learner.spec import Refusal
from actorlearner.v1 import learner_pb2 as pb

logger = logging.getLogger(__name__)

Handle = Callable[[ActorSession, pb.ActorMessage, "memoryview | None"], Awaitable[None]]
"""Stores a batch for a session and acks it, or accounts its episode stats."""


class RelayedActors:
    """The actors joined through one relay's stream (``relay_id``). Welcomes, Refusals and acks for them go
    to ``push``, the stream's outbox, in order."""

    def __init__(self, learner: Learner, relay_id: str, push: Callable[[pb.LearnerMessage], None]):
        self.learner, self.relay_id, self.push = learner, relay_id, push
        self._lock = threading.Lock()
        self._sessions: dict[str, ActorSession] = {}
        self._refused: set[str] = set()  # refused since they last joined: what they sent meanwhile is dropped
        self._closed = False

    async def receive(self, message: pb.ActorMessage, payload: memoryview | None, handle: Handle,
                      version: int) -> None:
        """A message on the relay's stream (``version``: the policy the stream holds, which a Welcome names). A
        message for an actor that never joined (the relay's fault) raises WireError, which ends the relay's stream."""
        actor_id, kind = message.actor_id, message.WhichOneof("kind")
        if kind in ("hello", "leave"):
            self._arrival(message, version)
            return
        with self._lock:
            session = self._sessions.get(actor_id)
            refused = actor_id in self._refused
        if session is None:
            if refused:
                return  # sent before the relay saw the refusal
            raise wire.WireError(f"relay {self.relay_id} sent {kind or 'an empty message'} for actor "
                                 f"{actor_id!r}, which has not joined through it")
        try:
            if kind not in ("batch", "episode_stats"):
                raise wire.WireError("empty ActorMessage")
            await handle(session, message, payload)
        except (wire.WireError, ValueError) as exc:
            logger.warning("actor %s (through relay %s) sent bad input: %s", actor_id, self.relay_id, exc)
            code = exc.status_code.name if isinstance(exc, wire.WireError) else "INVALID_ARGUMENT"
            self._refuse(actor_id, Refusal(code, str(exc)))
        except InsertAborted:
            raise
        except Exception as exc:  # a bug or a failing device: this actor only
            logger.exception("actor %s (through relay %s): the learner failed on its message", actor_id, self.relay_id)
            self._refuse(actor_id, Refusal("INTERNAL", f"the learner failed on this stream's message: "
                                                       f"{type(exc).__name__}: {exc}"))

    def welcomes(self, version: int) -> list[pb.LearnerMessage]:
        """A new Welcome for each joined actor (the learner's settings changed), naming ``version``."""
        with self._lock:
            sessions = list(self._sessions.items())
        return [pb.LearnerMessage(actor_id=actor_id, welcome=self.learner.welcome(session, version))
                for actor_id, session in sessions]

    def close(self) -> None:
        """The relay's stream is over: every actor joined through it leaves."""
        with self._lock:
            self._closed = True
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            self.learner.disconnect(session)

    def _refuse(self, actor_id: str, refusal: Refusal) -> None:
        """End a relay's actor as its own stream would end: a Refusal routed to it; what it sent before
        the relay saw it is dropped."""
        with self._lock:
            session = self._sessions.pop(actor_id, None)
            self._refused.add(actor_id)
        if session is not None:
            self.learner.disconnect(session)
        self.push(pb.LearnerMessage(actor_id=actor_id, refusal=pb.Refusal(code=refusal.code, reason=refusal.reason)))

    def _arrival(self, message: pb.ActorMessage, version: int) -> None:
        """An actor joins (Welcome or Refusal, routed by actor_id) or leaves."""
        actor_id = message.actor_id
        with self._lock:
            previous = self._sessions.pop(actor_id, None)
            self._refused.discard(actor_id)
        if previous is not None:
            self.learner.disconnect(previous)
        if message.WhichOneof("kind") == "leave":
            return
        hello = message.hello
        refusal = self.learner.check_hello(hello) or (
            Refusal("INVALID_ARGUMENT", "a relayed Hello must name its actor_id in ActorMessage.actor_id and "
                                        "must not be a relay's") if hello.actor_id != actor_id or hello.relay else None)
        if refusal:
            self._refuse(actor_id, refusal)
            return
        session = self.learner.connect(hello, via=self.relay_id)
        with self._lock:
            joined = not self._closed  # else the stream's teardown is past: it would not disconnect it
            if joined:
                self._sessions[actor_id] = session
        if not joined:
            self.learner.disconnect(session)
            return
        self.push(pb.LearnerMessage(actor_id=actor_id, welcome=self.learner.welcome(session, version)))
        logger.info("actor %s joined through relay %s (index %d)", actor_id, self.relay_id, session.record.index)
