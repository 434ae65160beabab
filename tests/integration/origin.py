"""A real HTTP origin for integration tests, served by twisted.web on loopback.

Paths: ``/hello`` (12 bytes), ``/cookies`` (two Set-Cookie), ``/echo`` (the
request head and body as JSON), ``/big?mb=N`` (N MiB streamed by a push
producer, counting what it produced and its pauses), ``/chunked`` (chunked text),
``/stall`` (never answers), ``/slow?s=N`` (answers after N s), ``/reset`` (half a body, then a reset),
``/html`` (an HTML page for rewriting), ``/c/NAME?cc=..`` (cacheable pages that count their hits).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from twisted.web import http, resource, server
from zope.interface import implementer

HTML = (
    b"<html><head><script>ga('create', 'UA-12345-1');</script></head>"
    b"<body><a href='https://www.original-shop.example/x'>Original Shop</a></body></html>\n"
)


@implementer(IPushProducer)
class Streamer:
    """The body of ``/big``: written as fast as the connection takes it.
    The transport pauses it when its buffer is full and resumes it when
    that drained; each pause is counted (``Origin.pauses``), so a test can
    wait for the origin to be held back instead of sleeping."""

    PIECE = b"0123456789abcdef" * 4096  # 64 KiB

    def __init__(self, origin: Origin, request: server.Request, size: int) -> None:
        self.origin = origin
        self.request = request
        self.left = size
        self.paused = False
        self.stopped = False

    def start(self) -> None:
        self.origin.streams.append(self)
        self._pump()

    def _pump(self) -> None:
        while not self.paused and not self.stopped and self.left > 0:
            piece = self.PIECE[: min(len(self.PIECE), self.left)]
            self.left -= len(piece)
            self.origin.produced += len(piece)
            self.request.write(piece)  # may pause this producer at once
        if self.left <= 0 and not self.stopped:
            self.stopped = True
            self.request.unregisterProducer()
            self.request.finish()

    def pauseProducing(self) -> None:
        self.paused = True
        self.origin.pauses += 1
        self.origin.check_soon()

    def resumeProducing(self) -> None:
        self.paused = False
        self._pump()

    def stopProducing(self) -> None:
        self.stopped = True


class Origin(resource.Resource):
    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.produced = 0
        #: The ``/big`` bodies started, and how often one was paused.
        self.streams: list[Streamer] = []
        self.pauses = 0
        #: Connections to the origin now open (``origin_site``'s channels).
        self.open_connections = 0
        self.requests: list[server.Request] = []
        self.lost: list[bytes] = []
        self.peer_ports: list[int] = []
        self.hits: dict[bytes, int] = {}
        self.not_modified: dict[bytes, int] = {}
        self._when: list[tuple[Callable[[], bool], defer.Deferred[None]]] = []

    def when(self, condition: Callable[[], bool]) -> defer.Deferred[None]:
        """Fires once ``condition()`` holds: checked now, after each request
        is rendered, after each request's connection is lost and after each
        connection closes."""
        d: defer.Deferred[None] = defer.Deferred()
        self._when.append((condition, d))
        self._check()
        return d

    def check_soon(self) -> None:
        """Looks at the ``when`` conditions in the next reactor turn (from a
        transport's call, which must return first)."""
        from twisted.internet import reactor

        reactor.callLater(0, self._check)

    def _check(self) -> None:
        waiting, self._when = self._when, []
        for condition, d in waiting:
            if condition():
                d.callback(None)
            else:
                self._when.append((condition, d))

    def _lost(self, request: server.Request) -> None:
        self.lost.append(request.path)
        self._check()

    def render(self, request: server.Request) -> Any:
        try:
            return self._render(request)
        finally:
            self._check()

    def _render(self, request: server.Request) -> Any:
        self.requests.append(request)
        self.peer_ports.append(request.getClientAddress().port)
        request.notifyFinish().addErrback(lambda _: self._lost(request))
        path = request.path
        if path == b"/hello":
            request.setHeader(b"content-type", b"text/plain")
            return b"hello world!"
        if path == b"/html":
            request.setHeader(b"content-type", b"text/html; charset=utf-8")
            request.setHeader(b"etag", b'"v1"')
            request.setHeader(b"last-modified", b"Mon, 30 Nov 2026 00:00:00 GMT")
            return HTML
        if path == b"/cookies":
            request.addCookie(b"a", b"1")
            request.addCookie(b"b", b"2")
            return b"cookies"
        if path == b"/echo":
            body = request.content.read()
            request.setHeader(b"content-type", b"application/json")
            return json.dumps(
                {
                    "method": request.method.decode(),
                    "uri": request.uri.decode(),
                    "headers": [[n.decode(), v.decode()] for n, vs in request.requestHeaders.getAllRawHeaders() for v in vs],
                    "body": body.decode("latin-1"),
                }
            ).encode()
        if path == b"/big":
            mb = float(request.args.get(b"mb", [b"1"])[0])
            size = int(mb * 1024 * 1024)
            request.setHeader(b"content-length", b"%d" % size)
            request.setHeader(b"content-type", b"application/octet-stream")
            streamer = Streamer(self, request, size)
            request.registerProducer(streamer, True)
            streamer.start()
            return server.NOT_DONE_YET
        if path == b"/chunked":
            request.setHeader(b"content-type", b"text/plain")
            request.write(b"first ")
            request.write(b"second")
            request.finish()
            return server.NOT_DONE_YET
        if path.startswith(b"/c/"):
            # Cacheable pages: /c/<name>?cc=<Cache-Control>&vary=<header>&cookie=1&delay=<s>&noetag=1
            args = request.args
            etag = b'"%s-v1"' % path.rsplit(b"/", 1)[1]
            request.setHeader(b"cache-control", args.get(b"cc", [b"max-age=60"])[0])
            if b"noetag" not in args:
                request.setHeader(b"etag", etag)
            if b"noetag" not in args and request.getHeader(b"if-none-match") == etag:
                self.not_modified[path] = self.not_modified.get(path, 0) + 1
                request.setResponseCode(304)
                return b""
            self.hits[path] = self.hits.get(path, 0) + 1
            request.setHeader(b"content-type", b"text/plain")
            if b"vary" in args:
                request.setHeader(b"vary", args[b"vary"][0])
            if b"cookie" in args:
                request.addCookie(b"session", b"secret-%d" % self.hits[path])
            language = request.getHeader(b"accept-language") or b"-"
            body = b"page %s #%d lang=%s" % (path, self.hits[path], language)
            delay = float(args.get(b"delay", [b"0"])[0])
            if not delay:
                return body
            from twisted.internet import reactor

            def later() -> None:
                if not request.finished and request.channel is not None:
                    request.write(body)
                    request.finish()

            reactor.callLater(delay, later)
            return server.NOT_DONE_YET
        if path == b"/stall":
            return server.NOT_DONE_YET
        if path == b"/slow":
            from twisted.internet import reactor

            delay = float(request.args.get(b"s", [b"1"])[0])

            def answer() -> None:
                if not request.finished and request.channel is not None:
                    request.write(b"slow answer")
                    request.finish()

            request.setHeader(b"content-type", b"text/plain")
            reactor.callLater(delay, answer)
            return server.NOT_DONE_YET
        if path == b"/reset":
            request.setHeader(b"content-length", b"1000")
            request.write(b"x" * 400)
            from twisted.internet import reactor

            transport = request.channel.transport
            reactor.callLater(0.05, transport.abortConnection)  # after the bytes left
            return server.NOT_DONE_YET
        request.setResponseCode(404)
        return b"no such page\n"


class _CountedChannel(http.HTTPChannel):
    """An HTTP/1.1 channel that keeps its origin's count of open connections."""

    def connectionMade(self) -> None:
        self.site.resource.open_connections += 1
        super().connectionMade()

    def connectionLost(self, reason: Any) -> None:
        super().connectionLost(reason)
        origin = self.site.resource
        origin.open_connections -= 1
        origin._check()


def origin_site(origin: Origin) -> server.Site:
    site = server.Site(origin)
    site.protocol = _CountedChannel
    site.log = lambda request: None  # type: ignore[method-assign]
    return site


def listen_origin(cleanup: Callable[..., object]) -> tuple[Origin, str]:
    """A fresh :class:`Origin` listening on loopback until ``cleanup``
    runs, and its URL."""
    from twisted.internet import reactor

    origin = Origin()
    port = reactor.listenTCP(0, origin_site(origin), interface="127.0.0.1")
    cleanup(port.stopListening)
    return origin, f"http://127.0.0.1:{port.getHost().port}"
