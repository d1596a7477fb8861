"""A loopback TCP forwarder whose connections a test can cut, stall or refuse at will (a stand-in network, not a mock)."""

from __future__ import annotations

import socket
import threading
import time

UP, DOWN = "up", "down"  # client -> target, target -> client


class TcpProxy:
    """Listens on 127.0.0.1 (port 0) and forwards every connection to ``target_port``.

    Besides cutting connections it can partition the network: :meth:`stall` stops moving
    bytes (optionally after a budget) without closing anything, as a dead link would;
    :meth:`refuse` closes new connections at once, as a host that is down would.
    """

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._flow = threading.Condition(self._lock)
        self._budget: dict[str, int | None] = {UP: None, DOWN: None}  # bytes still allowed through; None: no limit
        self._refusing = False
        self._closed = False
        self.cuts = 0
        self.accept_times: list[float] = []  # time.monotonic() of each connection accepted, refused ones included
        self.forwarded = {UP: 0, DOWN: 0}  # bytes passed on, per direction
        threading.Thread(target=self._accept, daemon=True).start()

    def live(self) -> bool:
        """Whether any connection is open right now."""
        with self._lock:
            return bool(self._sockets)

    def cut(self) -> None:
        """Drop every live connection, as a broken network would."""
        with self._lock:
            sockets, self._sockets = self._sockets, set()
            self.cuts += 1
            self._flow.notify_all()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def stall(self, up_after: int | None = 0, down_after: int | None = 0) -> None:
        """Stop forwarding once ``up_after`` / ``down_after`` more bytes went through (None: keep
        forwarding that way); connections stay open and new ones are held the same way."""
        with self._lock:
            self._budget = {UP: up_after, DOWN: down_after}

    def refuse(self) -> None:
        """Close every new connection as soon as it is accepted."""
        with self._lock:
            self._refusing = True

    def resume(self) -> None:
        """Forward everything again (held bytes first) and accept connections normally."""
        with self._lock:
            self._budget = {UP: None, DOWN: None}
            self._refusing = False
            self._flow.notify_all()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.resume()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accept_times.append(time.monotonic())
                refusing = self._refusing
            if refusing:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:  # the target is down (being restarted): as a refused connection to it would
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, upstream}
            for src, dst, direction in ((client, upstream, UP), (upstream, client, DOWN)):
                threading.Thread(target=self._pump, args=(src, dst, direction), daemon=True).start()

    def _allowance(self, direction: str, wanted: int, sock: socket.socket) -> int:
        """Wait until some of ``wanted`` bytes may pass (0 once ``sock`` was cut), and count them."""
        with self._flow:
            while self._budget[direction] == 0 and sock in self._sockets:
                self._flow.wait(0.1)
            if sock not in self._sockets:
                return 0
            budget = self._budget[direction]
            n = wanted if budget is None else min(wanted, budget)
            if budget is not None:
                self._budget[direction] = budget - n
            self.forwarded[direction] += n
            return n

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while data := src.recv(65536):
                view = memoryview(data)
                while view:
                    n = self._allowance(direction, len(view), src)
                    if not n:
                        return
                    dst.sendall(view[:n])
                    view = view[n:]
        except OSError:
            pass
        finally:
            # shutdown (not just close) wakes the other pump blocked in recv, so both peers see the end.
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
