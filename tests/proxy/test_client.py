"""The client side is a declared seam (``prexy.proxy.client``): the requests
of HTTP/1.1, HTTP/1.0 and HTTP/2 clients and the detached client provide
``IClient`` (``verifyObject``: every member there, with the declared
signatures), their channels ``IClientChannel``, and each says what its
protocol can carry (trailers, 1xx heads, a tunnel) as it should.  A third
protocol is one more ``IClientChannel``: a channel written here in a few
lines serves a whole exchange, 103 and trailers included.  Whether a
request has a body means the same over HTTP/1.1 and HTTP/2 (a GET with one
is never a hit).  And the modules that use a client read its capabilities
instead of probing it."""

from __future__ import annotations

import ast
import inspect
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.http_headers import Headers
from zope.interface import implementer
from zope.interface.verify import verifyObject

from prexy.proxy import caching, client, flight, forward, request, resource, site, storing
from prexy.proxy.client import (
    Capabilities,
    IClient,
    IClientChannel,
    IClientConnection,
    ITunnelClient,
)
from prexy.proxy.request import DetachedRequest, ProxyRequest

from .support import Harness
from .test_http2 import H2Client
from .test_rewrite import PAGE, REWRITTEN, harness


def http1_request(h: Harness, version: bytes = b"HTTP/1.1") -> Any:
    """The request of an HTTP/1.x client, waiting for its upstream."""
    channel, _ = h.send(b"GET /x %s\r\nHost: a\r\n\r\n" % version)
    req = channel.request
    assert req is not None
    return req


def http2_request(h: Harness) -> Any:
    """The request of an HTTP/2 client's stream 1, waiting for its upstream."""
    c = H2Client(h)
    c.get(1)
    stream = c.server.streams[1]
    return stream.request


class Provided(SynchronousTestCase):
    """Each client and each channel provides its interface."""

    def test_http11_request(self) -> None:
        """An HTTP/1.1 request is an IClient; its connection an
        IClientChannel, an ITunnelClient and the site's IClientConnection."""
        req = http1_request(Harness())
        self.assertTrue(verifyObject(IClient, req))
        self.assertTrue(verifyObject(IClientChannel, req.channel))
        self.assertTrue(verifyObject(ITunnelClient, req.channel))
        self.assertTrue(verifyObject(IClientConnection, req.channel))

    def test_http2_request(self) -> None:
        """An HTTP/2 stream's request is an IClient; the stream an
        IClientChannel, not an ITunnelClient; its connection the site's
        IClientConnection."""
        req = http2_request(Harness())
        self.assertTrue(verifyObject(IClient, req))
        self.assertTrue(verifyObject(IClientChannel, req.channel))
        self.assertFalse(ITunnelClient.providedBy(req.channel))
        self.assertTrue(verifyObject(IClientConnection, req.channel.connection))

    def test_detached_request(self) -> None:
        """The stand-in for a client that left is an IClient, and keeps
        what the original knew after its connection went."""
        original = http1_request(Harness())
        secure, peer = original.isSecure(), original.getClientAddress()
        original.channel.transport.loseConnection()
        detached = DetachedRequest(original)
        self.assertTrue(verifyObject(IClient, detached))
        self.assertEqual((detached.uri, detached.getHeader(b"host")), (b"/x", b"a"))
        self.assertEqual((detached.isSecure(), detached.getClientAddress()), (secure, peer))
        self.assertIs(detached.proxy_site, original.proxy_site)


class Capable(SynchronousTestCase):
    """What each protocol's client can be sent."""

    def caps(self, req: Any) -> tuple[bool, bool, bool, bool]:
        return req.trailers, req.interim, req.tunnel, req.detached

    def test_http11(self) -> None:
        """HTTP/1.1: trailers (a chunked body), 1xx heads, a tunnel."""
        self.assertEqual(self.caps(http1_request(Harness())), (True, True, True, False))

    def test_http10(self) -> None:
        """HTTP/1.0: none of them (no chunked framing, no 1xx, no Upgrade)."""
        self.assertEqual(self.caps(http1_request(Harness(), b"HTTP/1.0")), (False, False, False, False))

    def test_http2(self) -> None:
        """HTTP/2: trailers (a last HEADERS frame) and 1xx heads, no tunnel."""
        self.assertEqual(self.caps(http2_request(Harness())), (True, True, False, False))

    def test_detached(self) -> None:
        """A detached client takes trailers (and drops them) as an HTTP/1.1
        client would, so a refresh stores what a miss stores; no 1xx head
        and no tunnel, whatever its original could take."""
        self.assertEqual(self.caps(DetachedRequest(http2_request(Harness()))), (True, False, False, True))

    def test_before_the_request_line(self) -> None:
        """A request whose line is not in yet can be sent nothing extra."""
        h = Harness()
        channel, _ = h.client()
        self.assertEqual(self.caps(ProxyRequest(channel)), (False, False, False, False))


@implementer(IClientChannel)
class MemoryChannel:
    """A third protocol's channel, in memory: what it is sent, kept."""

    def __init__(self, site: Any) -> None:
        self.site = self.factory = site
        self.transport = StringTransport()
        self.interim: list[tuple[int, list[tuple[bytes, bytes]]]] = []
        self.head: tuple[bytes, list[tuple[bytes, list[bytes]]]] | None = None
        self.body = b""
        self.trailers: list[tuple[bytes, bytes]] = []
        self.done = self.reset = self.too_large = False
        self.producer: Any = None

    def getPeer(self) -> Any:
        return IPv4Address("TCP", "10.9.8.7", 4433)

    def getHost(self) -> Any:
        return IPv4Address("TCP", "127.0.0.1", 443)

    def isSecure(self) -> bool:
        return True

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Headers) -> None:
        self.head = (code, list(headers.getAllRawHeaders()))

    def write(self, data: bytes) -> None:
        self.body += data

    def writeSequence(self, iovec: Any) -> None:
        self.write(b"".join(iovec))

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        self.producer = producer

    def unregisterProducer(self) -> None:
        self.producer = None

    def requestDone(self, request: Any) -> None:
        self.done = True

    def loseConnection(self) -> None:
        self.done = True

    def capabilities(self, version: bytes) -> Capabilities:
        return Capabilities(trailers=True, interim=True)

    def write_interim(self, code: int, phrase: bytes, headers: Any) -> None:
        self.interim.append((code, list(headers)))

    def send_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        self.trailers = list(fields)

    def hold_writes(self) -> None:
        pass

    def release_writes(self) -> None:
        pass

    def flush_writes(self) -> None:
        pass

    def abortConnection(self) -> None:
        self.reset = True

    def body_too_large(self, request: Any) -> None:
        self.too_large = True


class ThirdProtocol(SynchronousTestCase):
    """``ProxyRequest`` on a channel that is neither HTTP/1.x nor HTTP/2."""

    def test_whole_exchange(self) -> None:
        """The 103, the rewritten streamed body and its Server-Timing
        trailer reach the channel through its IClientChannel methods."""
        h = harness()
        channel = MemoryChannel(h.site)
        self.assertTrue(verifyObject(IClientChannel, channel))
        req = h.site.requestFactory(channel)
        req.requestHeaders.addRawHeader(b"host", b"x")
        req.gotLength(0)
        req.requestReceived(b"GET", b"/", b"HTTP/3")
        self.assertTrue(verifyObject(IClient, req))
        conn = h.conns[-1]
        self.assertTrue(conn.sent().startswith(b"GET / HTTP/1.1\r\n"))
        conn.reply(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n")
        self.assertEqual(channel.interim, [(103, [(b"Link", b"</a.css>")])])
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.reply(b"%x\r\n%s\r\n0\r\n\r\n" % (len(PAGE), PAGE))
        h.settle()
        assert channel.head is not None
        code, fields = channel.head
        self.assertEqual(code, b"200")
        self.assertIn((b"Trailer", [b"Server-Timing"]), fields)
        self.assertEqual(channel.body, REWRITTEN)
        [(name, value)] = channel.trailers
        self.assertEqual(name, b"Server-Timing")
        self.assertTrue(value.startswith(b"rewrite;dur="))
        self.assertTrue(channel.done)
        self.assertFalse(channel.reset)

    def test_reset_mid_body(self) -> None:
        """An upstream that dies mid-body resets the client through
        ``abortConnection``, never a clean end."""
        h = Harness()
        channel = MemoryChannel(h.site)
        req = h.site.requestFactory(channel)
        req.requestHeaders.addRawHeader(b"host", b"x")
        req.gotLength(0)
        req.requestReceived(b"GET", b"/", b"HTTP/3")
        conn = h.conns[-1]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        conn.close()
        h.settle()
        self.assertEqual(channel.body, b"half")
        self.assertTrue(channel.reset)
        self.assertFalse(channel.done)

    def test_body_over_the_limit(self) -> None:
        """A body over the site's limit is the channel's to refuse."""
        h = Harness(max_request_body=4)
        channel = MemoryChannel(h.site)
        req = h.site.requestFactory(channel)
        req.gotLength(5)
        self.assertTrue(channel.too_large)


#: The modules that use a client through IClient (or, the site, its
#: connections through IClientConnection).
USERS = (forward, storing, caching, flight, resource, request, site)
#: Classes whose isinstance would be a probe of the client.
CLIENT_CLASSES = {"HTTPChannel", "ProxyChannel", "StreamChannel", "ProxyRequest", "DetachedRequest"}


def probes(module: Any) -> list[str]:
    """Where ``module`` probes a client instead of reading IClient: a
    hasattr, a getattr on a request or channel, an isinstance against a
    client or channel class, a comparison of ``clientproto``."""
    found = []
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.args:
            name, first = node.func.id, node.args[0]
            target = ast.unparse(first)
            if name == "hasattr":
                found.append(f"{module.__name__}:{node.lineno} hasattr({target}, ...)")
            elif name == "getattr" and target.split(".")[-1] in ("request", "channel"):
                found.append(f"{module.__name__}:{node.lineno} getattr({target}, ...)")
            elif name == "isinstance" and len(node.args) == 2:
                classes = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                if classes & CLIENT_CLASSES:
                    found.append(f"{module.__name__}:{node.lineno} isinstance({target}, ...)")
        elif isinstance(node, ast.Compare):
            if any(isinstance(n, ast.Attribute) and n.attr == "clientproto" for n in ast.walk(node)):
                found.append(f"{module.__name__}:{node.lineno} a comparison of clientproto")
    return found


class NoProbes(SynchronousTestCase):
    """The modules that use a client read its declared capabilities."""

    def test_no_probes(self) -> None:
        self.assertEqual([p for m in USERS for p in probes(m)], [])

    def test_a_probe_is_seen(self) -> None:
        """The check finds each kind of probe (so an empty list means none)."""
        source = (
            "def f(request, channel):\n"
            "    hasattr(channel, 'send_trailers')\n"
            "    getattr(request, 'channel', None)\n"
            "    isinstance(channel, HTTPChannel)\n"
            "    request.clientproto in TRAILERS_OVER\n"
        )
        module: Any = type("M", (), {"__name__": "m"})
        original = inspect.getsource
        self.patch(inspect, "getsource", lambda m: source if m is module else original(m))
        self.assertEqual(len(probes(module)), 4)

    def test_interfaces_module_is_light(self) -> None:
        """prexy.proxy.client imports no Twisted at run time (a third
        protocol's core can name the capabilities without the reactor)."""
        tree = ast.parse(inspect.getsource(client))
        runtime_imports = [
            n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module
        ] + [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names]
        self.assertEqual([m for m in runtime_imports if m.startswith("twisted")], [])


class BodyOnAnyProtocol(SynchronousTestCase):
    """``IClient.has_body`` means the same over every protocol."""

    def test_get_with_a_body_is_never_a_hit(self) -> None:
        """A GET with a body is forwarded, never answered from the cache,
        over HTTP/2 as over HTTP/1.1 (the body may change the answer)."""
        from .test_header_rules import harness as cache_harness

        h = cache_harness(cache=True)
        _, client = h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok")
        h.settle()
        self.assertTrue(client.value().endswith(b"\r\n\r\nok"))
        hits = ("prexy_cache_total", (("result", "hit"),))
        h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\nContent-Length: 3\r\n\r\nabc")
        self.assertTrue(h.conns[-1].sent().endswith(b"\r\n\r\nabc"), "HTTP/1.1: forwarded")
        c = H2Client(h)
        c.conn.send_headers(1, [(b":method", b"GET"), (b":path", b"/x"), (b":scheme", b"https"),
                                (b":authority", b"clone.test"), (b"content-length", b"3")])
        c.conn.send_data(1, b"abc", end_stream=True)
        c.flush()
        self.assertTrue(h.conns[-1].sent().endswith(b"\r\n\r\nabc"), "HTTP/2: forwarded")
        self.assertNotIn(hits, h.metrics.counters)


class GracefulStop(SynchronousTestCase):
    """``ProxySite.close_idle_connections`` through each HTTP/1.1
    connection's ``IClientConnection.drain``."""

    def test_busy_idle_and_fresh(self) -> None:
        """A connection busy with a request closes after its answer, an
        idle keep-alive one at once, a fresh one only once its grace is
        over."""
        h = Harness()
        _, fresh = h.client()
        _, busy = h.send(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")
        _, idle = h.send(b"GET /y HTTP/1.1\r\nHost: a\r\n\r\n")
        first, second = h.conns[-2:]
        second.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        self.assertFalse(idle.disconnecting)
        h.site.close_idle_connections(fresh_grace=2.0)
        self.assertEqual((fresh.disconnecting, busy.disconnecting, idle.disconnecting), (False, False, True))
        first.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        self.assertTrue(busy.value().endswith(b"\r\n\r\nok"))
        self.assertTrue(busy.disconnecting)
        h.clock.advance(3)
        h.site.close_idle_connections(fresh_grace=2.0)
        self.assertTrue(fresh.disconnecting)
