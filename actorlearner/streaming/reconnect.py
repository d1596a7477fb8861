"""The client side of a Connect stream that must stay up: connect, serve the stream until it breaks,
back off with jitter, repeat, until closed or refused for good. The actor's link and the relay's
upstream both run it."""

from __future__ import annotations

import logging
import queue
import random
import threading
from typing import Self

import grpc

from actorlearner import wire
from actorlearner.transport import SecurityConfig, grpc_options, open_channel

# Statuses that mean "this client can never be served": retrying would not help.
FATAL_CODES = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
               grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
               grpc.StatusCode.UNIMPLEMENTED}


class Refused(RuntimeError):
    """The server refused this client for good: reconnecting stops."""


def reconnect_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Channel options for a client that reconnects on its own: a channel per attempt, with no
    subchannel shared with earlier channels, or a new one inherits gRPC's own (growing) backoff."""
    return grpc_options(max_message_bytes) + [("grpc.use_local_subchannel_pool", 1)]


class Backoff:
    """Reconnect delays: ``initial`` seconds, doubling up to ``maximum``, each jittered by +-50%."""

    def __init__(self, initial: float, maximum: float):
        self.initial, self.maximum = initial, maximum
        self.delay = initial

    def reset(self) -> None:
        """A stream worked: the next break starts from ``initial`` again."""
        self.delay = self.initial

    def wait(self, closing: threading.Event) -> bool:
        """Sleep the next delay; True (at once) if ``closing`` is set meanwhile."""
        if closing.wait(self.delay * random.uniform(0.5, 1.5)):
            return True
        self.delay = min(self.delay * 2, self.maximum)
        return False


def drain(requests: queue.Queue):
    """The request side of a stream: messages until a None arrives."""
    while (message := requests.get()) is not None:
        yield message


class Reconnecting:
    """Keeps one Connect stream to ``address`` up on a thread of its own.

    A subclass serves one stream in :meth:`_serve_stream`, opening it with :meth:`_open_stream`
    (and counting ``connects`` once the stream is welcomed), hears of each stream's end in
    :meth:`_stream_ended`, and of a refusal for good in :meth:`_refused`. A welcomed stream
    resets the backoff, however it ended. The loop logs as the subclass's module.

    Every stream this opens is ended here: its request queue gets its closing None and its call
    is cancelled and dropped, when it breaks and on :meth:`close`, which never races a stream
    being opened. gRPC's request thread then ends, and no call outlives the stream: a call left
    to the interpreter's exit can deadlock it (its ``__del__`` takes a lock that a frozen gRPC
    thread may hold).
    """

    def __init__(self, address: str, security: SecurityConfig | None, max_message_bytes: int,
                 reconnect_initial: float, reconnect_max: float, thread_name: str):
        self.address = address
        self.security = security
        self.max_message_bytes = max_message_bytes
        self.reconnect_initial, self.reconnect_max = reconnect_initial, reconnect_max
        self.connects = 0  # streams welcomed
        self.reconnects = 0  # streams opened after the first
        self._closing = threading.Event()
        self._stream_lock = threading.Lock()
        self._stream: tuple[queue.Queue, grpc.Call] | None = None  # the open stream's requests and call
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        """End the stream and stop reconnecting."""
        self._closing.set()
        self._end_stream()
        self._thread.join(timeout=5)

    def _open_stream(self, method: grpc.StreamStreamMultiCallable, requests: queue.Queue):
        """Start ``method`` sending what ``requests`` holds (until a None); None once closing."""
        with self._stream_lock:
            if self._closing.is_set():
                return None
            self._stream = requests, method(drain(requests))
            return self._stream[1]

    def _end_stream(self) -> None:
        """End the open stream, if any: its requests, then its call."""
        with self._stream_lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            requests, call = stream
            requests.put(None)
            call.cancel()

    def _serve_stream(self, channel: grpc.Channel) -> None:
        """Open one stream on ``channel`` and serve it until it ends."""
        raise NotImplementedError

    def _stream_ended(self, reason: str) -> None:
        """A stream is over (``reason``: why), and the next is ``_closing`` or a backoff away."""

    def _refusal(self, exc: grpc.RpcError) -> Refused:
        """The error a fatal status stands for."""
        raise NotImplementedError

    def _refused(self, error: Refused) -> None:
        """The server refused this client for good: no stream follows."""
        raise NotImplementedError

    def _run(self) -> None:
        logger = logging.getLogger(type(self).__module__)
        backoff = Backoff(self.reconnect_initial, self.reconnect_max)
        options = reconnect_options(self.max_message_bytes)
        while not self._closing.is_set():
            connects, reason, broke = self.connects, "the stream ended", False
            with open_channel(self.address, self.security, options) as channel:
                try:
                    self._serve_stream(channel)
                except grpc.RpcError as exc:
                    exc.__traceback__ = None  # a broken call is its own error: its frames would keep it alive
                    if exc.code() in FATAL_CODES:
                        self._refused(self._refusal(exc))
                        return
                    reason, broke = exc.code().name, True
                except Refused as exc:
                    self._refused(exc)
                    return
                except wire.WireError as exc:
                    reason = f"bad policy update: {exc}"
                    logger.warning("bad policy update from %s: %s; reconnecting", self.address, exc)
                finally:
                    self._end_stream()
            if self.connects > connects:  # the stream worked, however it ended: start backoff afresh
                backoff.reset()
            if broke and not self._closing.is_set():
                logger.info("stream to %s broke (%s); reconnecting in %.2fs", self.address, reason, backoff.delay)
            self._stream_ended(reason)
            if backoff.wait(self._closing):
                return
            self.reconnects += 1
