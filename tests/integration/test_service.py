"""The proxy service on real loopback sockets against a real origin.

These run the same ``ProxyService`` twistd starts, in the test process, so
socket-level behaviour is real: streaming with a slow reader, resets, refused
and stalled upstreams, client disconnects.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task
from twisted.internet.protocol import ClientFactory, Protocol

from prexy.config import Timeouts
from prexy.service import ProxyService

from .conftest import OriginServer, Proxy
from .origin import Origin, origin_site


class RawClient(Protocol):
    """Sends one raw request; collects the answer; may stop reading."""

    def __init__(self, request: bytes, read_limit: int | None = None) -> None:
        self.request = request
        self.read_limit = read_limit
        self.data = bytearray()
        self.closed: defer.Deferred[Any] = defer.Deferred()
        #: Fires when ``read_limit`` bytes have come and it stopped reading.
        self.stopped_reading: defer.Deferred[None] = defer.Deferred()
        self.reason: Any = None

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def read_more(self, n: int) -> defer.Deferred[None]:
        """Reads on until ``n`` more bytes have come, then stops again;
        fires then (or when the connection ends first)."""
        if self.closed.called:
            return defer.succeed(None)
        self.read_limit = len(self.data) + n
        self.stopped_reading = defer.Deferred()
        self.transport.resumeProducing()
        return self.stopped_reading

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if self.read_limit is not None and len(self.data) >= self.read_limit:
            self.transport.pauseProducing()  # a slow client: stop reading
            if not self.stopped_reading.called:
                self.stopped_reading.callback(None)

    def connectionLost(self, reason: Any) -> None:
        self.reason = reason
        if not self.stopped_reading.called:
            self.stopped_reading.callback(None)
        self.closed.callback(None)


def connect(port: int, client: RawClient) -> defer.Deferred[Any]:
    factory = ClientFactory.forProtocol(lambda: client)
    d: defer.Deferred[Any] = defer.Deferred()
    factory.clientConnectionFailed = lambda c, r: d.errback(r)  # type: ignore[method-assign]
    reactor.connectTCP("127.0.0.1", port, factory)
    return client.closed


@defer.inlineCallbacks
def metrics_showing(admin: int, line: str, seconds: float = 10) -> Any:
    """The master's /metrics page once it shows the sample ``line``
    (``name{labels} value``, compared as parsed samples: 30 is 30.0).  The
    workers' reports reach the master on their own timer
    (``prexy.worker``), with no event outside the processes: the page is
    asked again, for at most ``seconds``, each time after a report interval
    has passed."""
    from prometheus_client.parser import text_string_to_metric_families

    from prexy.worker import METRICS_INTERVAL

    (wanted,) = next(iter(text_string_to_metric_families(line + "\n"))).samples
    give_up = reactor.seconds() + seconds
    while True:
        client = RawClient(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        yield connect(admin, client)
        text = bytes(client.data).decode()
        body = text.partition("\r\n\r\n")[2]
        samples = [s for f in text_string_to_metric_families(body) for s in f.samples]
        if any((s.name, s.labels, s.value) == (wanted.name, wanted.labels, wanted.value) for s in samples):
            return text
        if reactor.seconds() > give_up:
            raise AssertionError(f"no {line!r} in /metrics after {seconds} s:\n{text}")
        yield task.deferLater(reactor, METRICS_INTERVAL / 4, lambda: None)


@defer.inlineCallbacks
def held_back(origin: Origin, round_trip: Callable[[], defer.Deferred[Any]], rounds: int = 500) -> Any:
    """Fires once the origin's latest ``/big`` stream is paused (its
    connection's buffers full) and stays so across ``round_trip`` (a request
    through the proxy): the proxy's reactor turned over many times
    meanwhile, and an upstream socket it still read from would have let the
    origin resume.  Every step waits on an event (a pause, an answer);
    fails after ``rounds`` steps without that state."""
    for _ in range(rounds):
        stream = origin.streams[-1]
        yield origin.when(lambda s=stream: s.paused).addTimeout(20, reactor)
        produced = origin.produced
        yield round_trip()
        if stream.paused and origin.produced == produced:
            return
    raise AssertionError(f"the origin was never held back: {origin.produced} bytes produced")


class Served:
    """The origin and the proxy in front of it (what setUp built)."""

    def __init__(self, origin_server: OriginServer, proxy: Proxy) -> None:
        self.origin_server = origin_server
        self.origin = origin_server.origin
        self.origin_port = origin_server.port
        self.proxy = proxy

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def service(self) -> ProxyService:
        return self.proxy.service

    def start_proxy(self, upstream: str, timeouts: Timeouts = Timeouts(), rules: tuple[str, ...] = ()) -> Any:
        return self.proxy.start_site(upstream, timeouts, rules)

    @defer.inlineCallbacks
    def get(self, path: str, extra: bytes = b"") -> Any:
        client = RawClient(
            b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + extra + b"\r\n"
        )
        yield connect(self.port, client)
        return bytes(client.data)


@pytest.fixture
def served(origin_server: OriginServer, proxy: Proxy) -> Served:
    s = Served(origin_server, proxy)
    pytest_twisted.blockon(s.start_proxy(origin_server.url))
    return s


@pytest_twisted.inlineCallbacks
def test_get_through_proxy(served: Served) -> Any:
    """A request goes through real sockets and comes back whole."""
    raw = yield served.get("/hello")
    assert raw.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Length: 12\r\n" in raw
    assert raw.endswith(b"\r\n\r\nhello world!")


@pytest_twisted.inlineCallbacks
def test_repeated_set_cookie(served: Served) -> Any:
    """Both Set-Cookie headers of the origin reach the client."""
    raw = yield served.get("/cookies")
    assert raw.count(b"Set-Cookie:") == 2


@pytest_twisted.inlineCallbacks
def test_large_body_streams_and_matches(served: Served) -> Any:
    """A 20 MiB body arrives complete with its Content-Length."""
    raw = yield served.get("/big?mb=20")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Content-Length: 20971520" in head
    assert len(body) == 20 * 1024 * 1024


@pytest_twisted.inlineCallbacks
def test_slow_reader_bounds_bytes_in_flight(served: Served) -> Any:
    """A client that stops reading makes the proxy pause the upstream: the
    origin produces only what the socket buffers hold, not the body."""
    client = RawClient(b"GET /big?mb=200 HTTP/1.1\r\nHost: t\r\n\r\n", read_limit=256 * 1024)
    connect(served.port, client)
    yield client.stopped_reading
    yield held_back(served.origin, lambda: served.get("/hello"))
    produced_early = served.origin.produced
    for _ in range(3):  # the proxy serves on; the stream stays held back
        yield served.get("/hello")
    assert len(client.data) < 32 * 1024 * 1024
    # Nothing more is produced once the buffers are full...
    assert served.origin.produced - produced_early < 1024 * 1024
    # ...and what is in flight stays far below the body size.
    assert served.origin.produced < 40 * 1024 * 1024
    client.transport.abortConnection()
    yield client.closed


@pytest_twisted.inlineCallbacks
def test_upstream_reset_mid_body_resets_client(served: Served) -> Any:
    """An origin that dies mid-body makes the client connection end
    without a complete body."""
    raw = yield served.get("/reset")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Content-Length: 1000" in head
    assert len(body) < 1000


@pytest_twisted.inlineCallbacks
def test_refused_upstream_is_502(served: Served) -> Any:
    """Nothing listening upstream: 502 with a plain body."""
    port = reactor.listenTCP(0, origin_site(Origin()), interface="127.0.0.1")
    dead = port.getHost().port
    yield port.stopListening()
    yield served.service.stopService()
    yield served.start_proxy(f"http://127.0.0.1:{dead}")
    raw = yield served.get("/hello")
    assert raw.startswith(b"HTTP/1.1 502 "), raw[:100]


@pytest_twisted.inlineCallbacks
def test_stalled_upstream_is_504(served: Served) -> Any:
    """An origin that never answers: 504 after the first-byte timeout."""
    yield served.service.stopService()
    yield served.start_proxy(f"http://127.0.0.1:{served.origin_port.getHost().port}", Timeouts(first_byte=0.5))
    raw = yield served.get("/stall")
    assert raw.startswith(b"HTTP/1.1 504 "), raw[:100]


@pytest_twisted.inlineCallbacks
def test_client_disconnect_cancels_upstream(served: Served) -> Any:
    """A client that leaves while the origin thinks: the origin sees its
    request's connection go away."""
    client = RawClient(b"GET /stall HTTP/1.1\r\nHost: t\r\n\r\n")
    connect(served.port, client)
    yield served.origin.when(lambda: bool(served.origin.requests)).addTimeout(5, reactor)
    client.transport.loseConnection()
    yield client.closed
    yield served.origin.when(lambda: b"/stall" in served.origin.lost).addTimeout(5, reactor)
    assert b"/stall" in served.origin.lost


@pytest_twisted.inlineCallbacks
def test_keep_alive_both_ways(served: Served) -> Any:
    """Two requests on one client connection; one upstream connection."""
    client = RawClient(
        b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\nGET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    yield connect(served.port, client)
    assert bytes(client.data).count(b"hello world!") == 2
    assert len(set(served.origin.peer_ports)) == 1


@pytest_twisted.inlineCallbacks
def test_changed_map_goes_live_on_reload(origin_server: OriginServer, proxy: Proxy, logged_errors: list[Any]) -> Any:
    """A map file changed on disk goes live on a reload, not before (as a
    rules file does); a broken one is refused on reload and the old map
    keeps serving."""
    import os

    from .twistd_support import scratch_dir

    map_path = os.path.join(scratch_dir("prexy-map-"), "old.map")
    with open(map_path, "w") as f:
        f.write("/old /new-one;\n")
    from prexy.config import MapConfig

    yield proxy.start_site(origin_server.url, map=MapConfig(map_path))
    service = proxy.service

    @defer.inlineCallbacks
    def location() -> Any:
        client = RawClient(b"GET /old HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield connect(proxy.port, client)
        for line in bytes(client.data).split(b"\r\n"):
            if line.startswith(b"Location: "):
                return line[10:]
        return None

    assert (yield location()) == b"http://t/new-one"
    with open(map_path, "w") as f:
        f.write("/old /new-two;\n")
    os.utime(map_path, (1, 1))  # a different mtime, whatever the clock
    assert (yield location()) == b"http://t/new-one"
    assert service.reload()
    assert (yield location()) == b"http://t/new-two"
    with open(map_path, "w") as f:
        f.write("~^/(broken /x;\n")
    os.utime(map_path, (2, 2))
    assert not service.reload()
    assert f"{map_path}:1:" in service.last_reload_error
    assert (yield location()) == b"http://t/new-two"
    assert len(logged_errors) == 0
