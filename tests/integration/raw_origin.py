"""A raw-socket origin on loopback for tests that script an upstream byte
by byte: a thread per connection reads request heads one after another
(keep-alive; request bodies are not read) and hands each to ``answer``,
which writes the reply.  Not a Twisted server, so a test can hold a reply
back on a ``threading.Event`` while the reactor runs the proxy."""

from __future__ import annotations

import socket
import threading


class RawOrigin:
    """Subclasses write ``answer(conn, head)``; returning False ends the
    connection."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def answer(self, conn: socket.socket, head: bytes) -> bool:
        raise NotImplementedError

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                try:
                    if not self.answer(conn, head):
                        return
                except OSError:
                    return

    def close(self) -> None:
        self.sock.close()
