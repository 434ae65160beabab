"""The least a Twisted proxy can do per request with Prexy's transducer.

Not Prexy and not a proxy anyone should run: one upstream connection per
client connection, one request at a time, no header handling, no errors,
no streaming (the whole body must come in the upstream's first reads), no
log.  It answers a GET by sending the target upstream, rewriting the
length-delimited body with a rules file in one ``finish()``, and writing
one chunked response, sending as Prexy does (at once, not on the
reactor's next turn).  Its time per request is a floor for Prexy's own
architecture (Twisted reactor, Python, the same transducer): what Prexy
spends above it goes to the features a production proxy needs, and to how
they are written.

    python bench/floor_proxy.py PORT RULES_FILE [UPSTREAM_HOST:PORT]

Measured with it, see bench/README.md ("What the architecture costs").
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from twisted.internet import protocol, reactor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's prexy

from prexy.substitution.rules import load_rules  # noqa: E402
from prexy.substitution.transducer import Transducer  # noqa: E402

_reactor: Any = reactor


def send_now(transport: Any, data: bytes) -> None:
    """Send ``data`` at once when the transport has nothing queued, else
    write it.  Reads tcp.Connection's private buffers: fine for a floor
    measurement, which is why Prexy itself no longer does it (it writes,
    and the bytes leave on the reactor's next turn)."""
    if transport.dataBuffer or transport._tempDataBuffer or transport.disconnecting or not transport.connected:
        transport.write(data)
        return
    try:
        sent = transport.socket.send(data)
    except OSError:
        sent = 0
    if sent < len(data):
        transport.write(data[sent:])


class _Upstream(protocol.Protocol):
    def __init__(self, ruleset: Any) -> None:
        self.ruleset = ruleset
        self.buffer = b""
        self.client: _Client | None = None

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        at = head.find(b"\r\ncontent-length:")
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : stop if stop > 0 else None])
        if len(self.buffer) - end - 4 < length:
            return
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = b""
        out = Transducer(self.ruleset).finish(body)
        client, self.client = self.client, None
        assert client is not None
        send_now(
            client.transport,
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(out), out)
        )


class _Client(protocol.Protocol):
    def __init__(self, ruleset: Any, upstream: tuple[str, int]) -> None:
        self.ruleset = ruleset
        self.upstream_address = upstream
        self.upstream: _Upstream | None = None
        self.waiting = b""

    def connectionMade(self) -> None:
        host, port = self.upstream_address
        creator = protocol.ClientCreator(_reactor, _Upstream, self.ruleset)
        creator.connectTCP(host, port).addCallback(self._connected)

    def _connected(self, upstream: _Upstream) -> None:
        self.upstream = upstream
        if self.waiting:
            data, self.waiting = self.waiting, b""
            self.dataReceived(data)

    def dataReceived(self, data: bytes) -> None:
        if self.upstream is None:
            self.waiting += data
            return
        target = data[: data.find(b"\r\n")].split(b" ")[1]
        self.upstream.client = self
        send_now(self.upstream.transport, b"GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n" % target)


def main(argv: list[str]) -> None:
    port, rules = int(argv[1]), argv[2]
    host, _, upstream_port = (argv[3] if len(argv) > 3 else "127.0.0.1:80").rpartition(":")
    ruleset = load_rules(rules)
    factory = protocol.Factory()
    factory.buildProtocol = lambda addr: _Client(ruleset, (host, int(upstream_port)))  # type: ignore[method-assign]
    _reactor.listenTCP(port, factory, interface="127.0.0.1")
    _reactor.run()


if __name__ == "__main__":
    main(sys.argv)
