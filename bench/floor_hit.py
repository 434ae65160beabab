"""The least a Twisted server can do per cache hit with Prexy's duties.

Not Prexy and not a cache anyone should run: it answers every request
with one object it stored at start, but it does, per request, each thing
Prexy's hit path must do, written flat, without Prexy's layers:

- parse the request with ``httptools`` (llhttp), keeping every field;
- find the Host, refuse to look up a request with Authorization or a
  Cookie (the policy's pass rules, reduced to those two);
- compute the object's key and read it from Prexy's own LMDB store
  (``prexy.cache.store.Store.lookup``: the URL's Vary, the variant, the
  index entry; decoded objects are remembered, as in Prexy);
- send the head made once for the object, with this hit's Age and
  Cache-Status, and the body, in one ``sendmsg``;
- write a combined-format access log line into a buffered file, count
  the request, and push the connection's idle deadline back.

Its CPU per hit, beside Prexy's and Varnish's under the same load
(``bench/run.py --only floor``) is the floor of this architecture for a
hit: what Prexy spends above it goes to how Prexy is written.

    python bench/floor_hit.py PORT BODY_FILE
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httptools
from twisted.internet import protocol, reactor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's prexy

from prexy.cache.store import ObjectMeta, Store  # noqa: E402

_reactor: Any = reactor
SITE = "bench"
IDLE = 75.0


class Hit(protocol.Protocol):
    """One client connection: every complete request is a hit."""

    def connectionMade(self) -> None:  # noqa: N802 (Twisted's name)
        self.parser = httptools.HttpRequestParser(self)
        self.transport.setTcpNoDelay(True)
        self.sock = self.transport.getHandle()
        self.peer = self.transport.getPeer().host
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.idle = _reactor.callLater(IDLE, self.transport.loseConnection)

    def connectionLost(self, reason: Any = None) -> None:  # noqa: N802
        if self.idle.active():
            self.idle.cancel()

    def dataReceived(self, data: bytes) -> None:  # noqa: N802
        self.idle.reset(IDLE)
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url
        self.fields = []

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_message_complete(self) -> None:
        server: Server = self.factory  # type: ignore[attr-defined]
        host = b""
        agent = referer = None
        for name, value in self.fields:
            low = name.lower()
            if low == b"host":
                host = value
            elif low == b"authorization" or low == b"cookie":
                raise ValueError("not a hit")
            elif low == b"user-agent":
                agent = value
            elif low == b"referer":
                referer = value
        method = self.parser.get_method()
        now = _reactor.seconds()
        url = host.lower() + self.url
        found = server.store.lookup(SITE, b"GET", url, "v", self.fields)
        if found.obj is None:
            # Every URL answers with the same object, stored at its first request.
            server.store.put(found.key, ObjectMeta(200, server.headers, now, 3600.0, site=SITE, url=url), server.body)
            found = server.store.lookup(SITE, b"GET", url, "v", self.fields)
        obj = found.obj
        if obj is None or not obj.fresh(now):
            raise ValueError("not a hit")
        ready = server.ready.get(found.key)
        if ready is None or ready[0] is not obj:
            ready = server.ready[found.key] = (obj, server.head_for(obj))
        before, middle, after = ready[1]
        head = b"%s%d%s%d%s" % (before, int(now - obj.stored_at), middle, int(obj.stored_at + obj.ttl - now), after)
        self.sock.sendmsg([head, obj.body])
        second = int(now)
        if second != server.second:
            server.second = second
            server.when = time.strftime("[%d/%b/%Y:%H:%M:%S +0000]", time.gmtime(second))
        server.log.write(
            f'{self.peer} - - {server.when} "{method.decode()} {self.url.decode("latin-1")} HTTP/1.1" 200 '
            f'{len(obj.body)} "{referer.decode("latin-1") if referer else "-"}" '
            f'"{agent.decode("latin-1") if agent else "-"}"\n'
        )
        server.counters["hit"] += 1


class Server(protocol.ServerFactory):
    protocol = Hit

    def __init__(self, store: Store, body: bytes) -> None:
        self.store = store
        self.body = body
        self.headers = ((b"Content-Type", b"text/html"), (b"ETag", b'"v1"'), (b"Cache-Control", b"max-age=3600"))
        self.ready: dict[bytes, Any] = {}
        self.second = -1
        self.when = ""
        self.log = open("/dev/null", "a", buffering=65536)  # noqa: SIM115
        self.counters = {"hit": 0}

    @staticmethod
    def head_for(obj: Any) -> tuple[bytes, bytes, bytes]:
        fields = b"".join(b"%s: %s\r\n" % pair for pair in obj.headers)
        return (
            b"HTTP/1.1 200 OK\r\n" + fields + b"Accept-Ranges: bytes\r\nContent-Length: %d\r\nAge: " % len(obj.body),
            b"\r\nVia: 1.1 prexy\r\nCache-Status: prexy; hit; ttl=",
            b"\r\n\r\n",
        )


def main() -> None:
    port, body_file = int(sys.argv[1]), sys.argv[2]
    body = Path(body_file).read_bytes()
    store = Store.open(tempfile.mkdtemp(prefix="floor-hit-"), 64 << 20, clock=_reactor.seconds)
    _reactor.listenTCP(port, Server(store, body), interface="127.0.0.1")
    _reactor.run()


if __name__ == "__main__":
    main()
