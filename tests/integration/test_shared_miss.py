"""A shared miss over loopback sockets: the client that
made the fetch hanging up mid-body cuts nobody else's answer.  Real TCP
tells the proxy in its own order (the channel's producer is stopped before
the request hears connectionLost), which the in-memory tests only imitate
(``tests/proxy/test_shared_miss.py``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.web import resource, server

from prexy.cache.policy import CachePolicy
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.runtime import build_runtime
from prexy.service import ProxyService

from .conftest import Cleanups
from .twistd_support import body_of, scratch_dir

BODY = bytes(range(256)) * 256  # 64 KiB
PIECE = 16 * 1024
#: Between the origin's 16 KiB pieces: the body takes 4 of these.
STEP = 0.15


class SlowOrigin(resource.Resource):
    """Serves BODY in 16 KiB pieces, STEP seconds apart, with the
    Cache-Control of ``?cc=``; records each fetch and whether its
    connection was lost before the end."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.fetches = 0
        self.started: defer.Deferred[None] = defer.Deferred()
        self.outcomes: list[defer.Deferred[str]] = []

    def render_GET(self, request: server.Request) -> Any:
        self.fetches += 1
        outcome: defer.Deferred[str] = defer.Deferred()
        self.outcomes.append(outcome)
        request.notifyFinish().addCallbacks(lambda _: outcome.callback("finished"), lambda _: outcome.callback("lost"))
        request.setHeader(b"cache-control", request.args.get(b"cc", [b"max-age=60"])[0])
        request.setHeader(b"content-type", b"application/octet-stream")
        request.setHeader(b"content-length", b"%d" % len(BODY))
        calls = []

        def piece(at: int) -> None:
            if request.channel is None:
                return
            request.write(BODY[at : at + PIECE])
            if at + PIECE < len(BODY):
                calls.append(reactor.callLater(STEP, piece, at + PIECE))
            else:
                request.finish()

        piece(0)
        request.notifyFinish().addErrback(lambda _: [c.cancel() for c in calls if c.active()])
        if not self.started.called:
            self.started.callback(None)
        return server.NOT_DONE_YET


class Client(Protocol):
    """Sends one request; collects the answer; with ``hang_up_after``,
    resets the connection once that many bytes arrived."""

    def __init__(self, request: bytes, hang_up_after: int | None = None) -> None:
        self.request = request
        self.hang_up_after = hang_up_after
        self.data = bytearray()
        self.closed: defer.Deferred[None] = defer.Deferred()

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        if self.hang_up_after is not None and len(self.data) >= self.hang_up_after:
            self.hang_up_after = None
            self.transport.abortConnection()

    def connectionLost(self, reason: Any) -> None:
        self.closed.callback(None)


class TestSharedMiss:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.origin = SlowOrigin()
        site = server.Site(self.origin)
        site.log = lambda request: None  # type: ignore[method-assign]
        self.origin_port = reactor.listenTCP(0, site, interface="127.0.0.1")
        cleanup(self.origin_port.stopListening)
        directory = scratch_dir("prexy-shared-miss-")
        config = Config(
            listen=("tcp:0:interface=127.0.0.1",),
            sites=(
                SiteConfig(
                    "t", UpstreamURL.parse(f"http://127.0.0.1:{self.origin_port.getHost().port}"),
                    cache=CachePolicy(),
                ),
            ),
            default_site="t",
            access_log=None,
            cache_size=16 * 1024 * 1024,
            cache_path=os.path.join(directory, "store"),
        )
        self.service = ProxyService(reactor, config, build_runtime(config))
        self.service.startService()
        cleanup(self.service.stopService)
        (port,) = pytest_twisted.blockon(self.service.listening_ports())
        self.port = port.getHost().port

    def connect(self, path: bytes, hang_up_after: int | None = None) -> Client:
        client = Client(b"GET " + path + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", hang_up_after)
        reactor.connectTCP("127.0.0.1", self.port, ClientFactory.forProtocol(lambda: client))
        return client

    @pytest_twisted.inlineCallbacks
    def test_leader_hanging_up_cuts_nobody(self) -> Any:
        """A asks for a cacheable 64 KiB answer that takes a while; B asks
        for it just after; A resets its connection after about 16 KiB.  B
        gets all 64 KiB, the origin was asked once and sent it to the end,
        and the next request is a hit."""
        a = self.connect(b"/big", hang_up_after=PIECE)
        yield self.origin.started.addTimeout(5, reactor)
        b = self.connect(b"/big")
        yield a.closed.addTimeout(5, reactor)
        yield b.closed.addTimeout(10, reactor)
        assert len(a.data) < len(BODY)
        assert bytes(b.data).startswith(b"HTTP/1.1 200")
        assert body_of(bytes(b.data)) == BODY
        outcome = yield self.origin.outcomes[0]
        assert outcome == "finished"
        c = self.connect(b"/big")
        yield c.closed.addTimeout(5, reactor)
        assert b"hit" in bytes(c.data).split(b"\r\n\r\n")[0].lower()
        assert body_of(bytes(c.data)) == BODY
        assert self.origin.fetches == 1

    @pytest_twisted.inlineCallbacks
    def test_nobody_left_and_nothing_stored_cancels(self) -> Any:
        """The same answer, not storable (no-store), and nobody follows:
        the upstream request is dropped when its client hangs up."""
        a = self.connect(b"/big?cc=no-store", hang_up_after=PIECE)
        yield a.closed.addTimeout(5, reactor)
        outcome = yield self.origin.outcomes[0].addTimeout(5, reactor)
        assert outcome == "lost"
