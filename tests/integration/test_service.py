"""The proxy service on real loopback sockets against a real origin.

These run the same ``ProxyService`` twistd starts, in the test process, so
socket-level behaviour is real: streaming with a slow reader, resets, refused
and stalled upstreams, client disconnects.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, reactor, task
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.trial.unittest import TestCase

from prexy.config import Config, SiteConfig, Timeouts, UpstreamURL
from prexy.runtime import build_runtime
from prexy.service import ProxyService

from .origin import Origin, origin_site


class RawClient(Protocol):
    """Sends one raw request; collects the answer; may stop reading."""

    def __init__(self, request: bytes, read_limit: int | None = None) -> None:
        self.request = request
        self.read_limit = read_limit
        self.data = bytearray()
        self.closed: defer.Deferred[Any] = defer.Deferred()
        self.reason: Any = None

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if self.read_limit is not None and len(self.data) >= self.read_limit:
            self.transport.pauseProducing()  # a slow client: stop reading

    def connectionLost(self, reason: Any) -> None:
        self.reason = reason
        self.closed.callback(None)


def connect(port: int, client: RawClient) -> defer.Deferred[Any]:
    factory = ClientFactory.forProtocol(lambda: client)
    d: defer.Deferred[Any] = defer.Deferred()
    factory.clientConnectionFailed = lambda c, r: d.errback(r)  # type: ignore[method-assign]
    reactor.connectTCP("127.0.0.1", port, factory)
    return client.closed


def wait(seconds: float) -> defer.Deferred[None]:
    return task.deferLater(reactor, seconds, lambda: None)


class ServiceTests(TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def setUp(self) -> Any:
        self.origin = Origin()
        self.origin_port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        self.addCleanup(self.origin_port.stopListening)
        yield self.start_proxy(f"http://127.0.0.1:{self.origin_port.getHost().port}")

    @defer.inlineCallbacks
    def start_proxy(self, upstream: str, timeouts: Timeouts = Timeouts(), rules: tuple[str, ...] = ()) -> Any:
        config = Config(
            listen=("tcp:0:interface=127.0.0.1",),
            sites=(SiteConfig("t", UpstreamURL.parse(upstream), rules=rules),),
            default_site="t",
            timeouts=timeouts,
            access_log=None,
        )
        self.service = ProxyService(reactor, config, build_runtime(config))
        self.service.startService()
        self.addCleanup(self.service.stopService)
        ports = yield self.service.listening_ports()
        self.port = ports[0].getHost().port

    @defer.inlineCallbacks
    def get(self, path: str, extra: bytes = b"") -> Any:
        client = RawClient(
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + extra + b"\r\n"
        )
        yield connect(self.port, client)
        return bytes(client.data)

    @defer.inlineCallbacks
    def test_get_through_proxy(self) -> Any:
        """A request goes through real sockets and comes back whole."""
        raw = yield self.get("/hello")
        self.assertTrue(raw.startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertIn(b"Content-Length: 12\r\n", raw)
        self.assertTrue(raw.endswith(b"\r\n\r\nhello world!"))

    @defer.inlineCallbacks
    def test_repeated_set_cookie(self) -> Any:
        """Both Set-Cookie headers of the origin reach the client."""
        raw = yield self.get("/cookies")
        self.assertEqual(raw.count(b"Set-Cookie:"), 2)

    @defer.inlineCallbacks
    def test_large_body_streams_and_matches(self) -> Any:
        """A 20 MiB body arrives complete with its Content-Length."""
        raw = yield self.get("/big?mb=20")
        head, _, body = raw.partition(b"\r\n\r\n")
        self.assertIn(b"Content-Length: 20971520", head)
        self.assertEqual(len(body), 20 * 1024 * 1024)

    @defer.inlineCallbacks
    def test_slow_reader_bounds_bytes_in_flight(self) -> Any:
        """A client that stops reading makes the proxy pause the upstream: the
        origin produces only what the socket buffers hold, not the body."""
        client = RawClient(b"GET /big?mb=200 HTTP/1.1\r\nHost: t\r\n\r\n", read_limit=256 * 1024)
        connect(self.port, client)
        yield wait(1.5)
        produced_early = self.origin.produced
        yield wait(1.0)
        self.assertLess(len(client.data), 32 * 1024 * 1024)
        # Nothing more is produced once the buffers are full...
        self.assertLess(self.origin.produced - produced_early, 1024 * 1024)
        # ...and what is in flight stays far below the body size.
        self.assertLess(self.origin.produced, 40 * 1024 * 1024)
        client.transport.abortConnection()
        yield client.closed

    @defer.inlineCallbacks
    def test_upstream_reset_mid_body_resets_client(self) -> Any:
        """An origin that dies mid-body makes the client connection end
        without a complete body."""
        raw = yield self.get("/reset")
        head, _, body = raw.partition(b"\r\n\r\n")
        self.assertIn(b"Content-Length: 1000", head)
        self.assertLess(len(body), 1000)

    @defer.inlineCallbacks
    def test_refused_upstream_is_502(self) -> Any:
        """Nothing listening upstream: 502 with a plain body."""
        port = reactor.listenTCP(0, origin_site(Origin()), interface="127.0.0.1")
        dead = port.getHost().port
        yield port.stopListening()
        yield self.service.stopService()
        yield self.start_proxy(f"http://127.0.0.1:{dead}")
        raw = yield self.get("/hello")
        self.assertTrue(raw.startswith(b"HTTP/1.1 502 "), raw[:100])

    @defer.inlineCallbacks
    def test_stalled_upstream_is_504(self) -> Any:
        """An origin that never answers: 504 after the first-byte timeout."""
        yield self.service.stopService()
        yield self.start_proxy(
            f"http://127.0.0.1:{self.origin_port.getHost().port}", Timeouts(first_byte=0.5)
        )
        raw = yield self.get("/stall")
        self.assertTrue(raw.startswith(b"HTTP/1.1 504 "), raw[:100])

    @defer.inlineCallbacks
    def test_client_disconnect_cancels_upstream(self) -> Any:
        """A client that leaves while the origin thinks: the origin sees its
        request's connection go away."""
        client = RawClient(b"GET /stall HTTP/1.1\r\nHost: t\r\n\r\n")
        connect(self.port, client)
        for _ in range(50):
            if self.origin.requests:
                break
            yield wait(0.05)
        client.transport.loseConnection()
        yield client.closed
        for _ in range(50):
            if b"/stall" in self.origin.lost:
                break
            yield wait(0.05)
        self.assertIn(b"/stall", self.origin.lost)

    @defer.inlineCallbacks
    def test_keep_alive_both_ways(self) -> Any:
        """Two requests on one client connection; one upstream connection."""
        client = RawClient(
            b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        yield connect(self.port, client)
        self.assertEqual(bytes(client.data).count(b"hello world!"), 2)
        self.assertEqual(len(set(self.origin.peer_ports)), 1)


class MapWatchTests(TestCase):
    """A map file whose modification time changes is reloaded (validated
    first); a broken one keeps the old map."""

    timeout = 30

    @defer.inlineCallbacks
    def test_changed_map_is_picked_up(self) -> Any:
        import os
        import tempfile

        origin = Origin()
        origin_port = reactor.listenTCP(0, origin_site(origin), interface="127.0.0.1")
        self.addCleanup(origin_port.stopListening)
        map_path = os.path.join(tempfile.mkdtemp(prefix="prexy-map-"), "old.map")
        with open(map_path, "w") as f:
            f.write("/old /new-one;\n")
        from prexy.config import MapConfig

        config = Config(
            listen=("tcp:0:interface=127.0.0.1",),
            sites=(SiteConfig("t", UpstreamURL.parse(f"http://127.0.0.1:{origin_port.getHost().port}"),
                              map=MapConfig(map_path)),),
            default_site="t",
            access_log=None,
        )
        service = ProxyService(reactor, config, build_runtime(config))
        service.startService()
        self.addCleanup(service.stopService)
        (port,) = yield service.listening_ports()

        @defer.inlineCallbacks
        def location() -> Any:
            client = RawClient(b"GET /old HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            yield connect(port.getHost().port, client)
            for line in bytes(client.data).split(b"\r\n"):
                if line.startswith(b"Location: "):
                    return line[10:]
            return None

        self.assertEqual((yield location()), b"http://t/new-one")
        with open(map_path, "w") as f:
            f.write("/old /new-two;\n")
        os.utime(map_path, (1, 1))  # a different mtime, whatever the clock
        yield service.check_maps()
        self.assertEqual((yield location()), b"http://t/new-two")
        with open(map_path, "w") as f:
            f.write("~^/(broken /x;\n")
        os.utime(map_path, (2, 2))
        yield service.check_maps()
        self.assertEqual((yield location()), b"http://t/new-two")
        self.assertEqual(len(self.flushLoggedErrors()), 0)
