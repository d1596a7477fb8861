"""A loopback TCP forwarder whose connections a test can cut at will (a stand-in network, not a mock)."""

from __future__ import annotations

import socket
import threading


class TcpProxy:
    """Listens on 127.0.0.1 (port 0) and forwards every connection to ``target_port``."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        self.cuts = 0
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
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets |= {client, upstream}
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
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
