"""In-memory wiring for proxy tests: a scripted origin behind a fake endpoint,
a client connection on a StringTransport, and a MemoryReactorClock.

Each upstream connection the pool opens is recorded as an ``OriginConn``; the
test reads what the proxy sent (``conn.sent()``) and answers by feeding bytes
(``conn.reply(...)``), so every HTTP edge case can be scripted byte by byte.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionDone, ConnectionLost, ConnectionRefusedError
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import formatEvent, globalLogPublisher
from twisted.python.failure import Failure

from prexy.config import Config, SiteConfig, Timeouts, UpstreamURL
from prexy.metrics import Metrics
from prexy.proxy.pool import UpstreamPool
from prexy.proxy.resource import ProxyResource, ProxySite
from prexy.runtime import Runtime, SiteRuntime, build_runtime


class Logged:
    """Every line logged while a test runs, formatted (``text``: all of
    them, one a line)."""

    def __init__(self, case: Any) -> None:
        self.lines: list[str] = []
        globalLogPublisher.addObserver(self)
        case.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event: dict[str, Any]) -> None:
        self.lines.append(formatEvent(event))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class ClosingTransport(StringTransport):
    """A StringTransport that tells its protocol when it is closed:
    ``loseConnection`` -> ConnectionDone, ``abortConnection`` -> ConnectionLost
    (and ``aborted`` set), as a real transport would, but synchronously."""

    aborted = False
    protocol: Any = None
    #: Each write since ``record_writes``, or None.
    recorded: list[bytes] | None = None

    def record_writes(self) -> list[bytes]:
        """Keep each later write, one item per call: how many sends an
        answer takes on a real connection."""
        self.recorded = []
        return self.recorded

    def write(self, data: bytes) -> None:
        if self.recorded is not None:
            self.recorded.append(data)
        super().write(data)

    def writeSequence(self, data: Any) -> None:  # noqa: N802 (twisted's name)
        """One write of several buffers (one ``writev`` on a real
        connection): recorded as one."""
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        self._close(Failure(ConnectionDone("closed")))

    def abortConnection(self) -> None:
        self.aborted = True
        self._close(Failure(ConnectionLost("aborted")))

    def _close(self, reason: Failure) -> None:
        if self.disconnecting:
            return
        self.disconnecting = True
        self.disconnected = True
        if self.protocol is not None:
            self.protocol.connectionLost(reason)


class OriginConn:
    """One upstream connection as the origin sees it."""

    def __init__(self, protocol: Any) -> None:
        self.protocol = protocol
        self.transport = ClosingTransport(
            hostAddress=IPv4Address("TCP", "127.0.0.1", 40000),
            peerAddress=IPv4Address("TCP", "127.0.0.1", 80),
        )
        self.transport.protocol = protocol
        protocol.makeConnection(self.transport)

    def sent(self) -> bytes:
        data = self.transport.value()
        self.transport.clear()
        return data

    def reply(self, data: bytes) -> None:
        self.protocol.dataReceived(data)

    def close(self, reason: Failure | None = None) -> None:
        """The origin closes (cleanly unless a reason says otherwise)."""
        self.transport._close(reason or Failure(ConnectionDone()))

    @property
    def paused(self) -> bool:
        return self.transport.producerState == "paused"


class FakeEndpoint:
    def __init__(self, harness: Harness) -> None:
        self.harness = harness

    def connect(self, factory: Any) -> defer.Deferred[Any]:
        h = self.harness
        if h.refuse:
            return defer.fail(ConnectionRefusedError("refused"))
        if h.hold_connect:
            d: defer.Deferred[Any] = defer.Deferred()
            h.held.append((d, factory))
            return d
        protocol = factory.buildProtocol(None)
        h.conns.append(OriginConn(protocol))
        return defer.succeed(protocol)


class Harness:
    """A proxy with one or more sites, wired to in-memory origins."""

    def __init__(
        self,
        config: Config | None = None,
        runtime: Runtime | None = None,
        timeouts: Timeouts = Timeouts(connect=5, first_byte=10, idle=7, pool_idle=30),
        max_request_body: int = 1024 * 1024,
    ) -> None:
        self.clock = MemoryReactorClock()
        self.conns: list[OriginConn] = []
        self.refuse = False
        self.hold_connect = False
        self.held: list[tuple[defer.Deferred[Any], Any]] = []
        if config is None:
            config = Config(
                listen=("tcp:0",),
                sites=(SiteConfig("default", UpstreamURL.parse("http://origin.test:8000")),),
                default_site="default",
                timeouts=timeouts,
                max_request_body=max_request_body,
            )
        self.config = config
        self.runtime = runtime or build_runtime(config)
        self.metrics = Metrics()
        self.pool = UpstreamPool(
            self.clock, config.timeouts, endpoint_factory=lambda k, t: FakeEndpoint(self), limits=config.limits
        )
        self.resource = ProxyResource(self.clock, self.pool, self.runtime, self.metrics)
        self.site = ProxySite(self.resource, config.max_request_body, self.metrics, reactor=self.clock)
        self.site.log = lambda request: None  # type: ignore[method-assign]

    def settle(self) -> None:
        """Run what the reactor has due now (the rewriting's cooperative
        turns are ``callLater(0)`` calls)."""
        self.clock.advance(0)

    def client(self) -> tuple[Any, ClosingTransport]:
        """A new client connection to the proxy."""
        channel = self.site.buildProtocol(IPv4Address("TCP", "10.1.2.3", 5555))
        transport = ClosingTransport(
            hostAddress=IPv4Address("TCP", "127.0.0.1", 8080),
            peerAddress=IPv4Address("TCP", "10.1.2.3", 5555),
        )
        transport.protocol = channel
        channel.makeConnection(transport)
        return channel, transport

    def send(self, raw: bytes) -> tuple[Any, ClosingTransport]:
        channel, transport = self.client()
        channel.dataReceived(raw)
        return channel, transport


def site_runtime(config: Config, **overrides: Any) -> Runtime:
    """A runtime with objects injected per site name (rules=..., urlmap=...)."""
    sites = []
    for s in config.sites:
        extra = overrides.get(s.name, {})
        sites.append(SiteRuntime(s, extra.get("rules"), extra.get("urlmap")))
    by_host = {h: s for s in sites for h in s.config.hosts}
    default = next(s for s in sites if s.name == config.default_site)
    return Runtime(config, tuple(sites), by_host, default)


def parse_response(raw: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Split one raw HTTP/1.1 response into status, headers and (de-chunked) body."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ")[1])
    headers = [tuple(line.split(b": ", 1)) for line in lines[1:]]
    if any(n.lower() == b"transfer-encoding" for n, _ in headers):
        out = b""
        rest = body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out += rest[:size]
            rest = rest[size + 2 :]
        body = out
    return status, headers, body  # type: ignore[return-value]


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> list[bytes]:
    return [v for n, v in headers if n.lower() == name.lower()]
