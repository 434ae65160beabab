"""Upgrades and tunnels through the proxy, in memory (``support.Harness``):
what goes upstream, the 101 the client gets, bytes both ways, backpressure
both ways, each side's close passed on, the idle timeout on a fake clock,
and the metrics.  The real-socket version is tests/integration/test_tunnel.py.
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, SiteConfig, Timeouts, UpstreamURL

from .support import Harness, parse_response

WS = (
    b"GET /chat HTTP/1.1\r\nHost: www.example.test\r\nConnection: keep-alive, Upgrade\r\n"
    b"Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
SWITCH = (
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n"
)


def counter(h: Harness, name: str, **labels: str) -> int:
    return h.metrics.counters[(name, tuple(sorted(labels.items())))]


class Opened:
    """A tunnel opened through a fresh harness."""

    def __init__(self, case: SynchronousTestCase, after_head: bytes = b"", **timeouts: float) -> None:
        config = None
        if timeouts:
            config = Config(
                listen=("tcp:0",),
                sites=(SiteConfig("default", UpstreamURL.parse("http://origin.test:8000")),),
                default_site="default",
                timeouts=attrs.evolve(Timeouts(), **timeouts),
            )
        self.h = h = Harness(config)
        h.site.timeouts = h.config.timeouts
        self.channel, self.client = h.send(WS)
        [self.conn] = h.conns
        self.request_head = self.conn.sent()
        self.conn.reply(SWITCH + after_head)
        self.head = self.client.value()
        self.client.clear()


class UpgradeRequestTests(SynchronousTestCase):
    def test_the_upgrade_goes_upstream(self) -> None:
        """The upstream gets Upgrade and Connection: upgrade besides the
        WebSocket headers, and no keep-alive token from the client."""
        t = Opened(self)
        head = t.request_head
        self.assertIn(b"\r\nUpgrade: websocket\r\n", head)
        self.assertIn(b"\r\nConnection: upgrade\r\n", head)
        self.assertIn(b"\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n".lower(), head.lower())
        self.assertNotIn(b"keep-alive", head.lower())

    def test_the_client_gets_the_101(self) -> None:
        """The client's 101 carries the upstream's end-to-end headers, one
        Connection: upgrade and the Upgrade the upstream chose; no body
        framing."""
        t = Opened(self)
        status, headers, body = parse_response(t.head)
        self.assertEqual(status, 101)
        names = [n.lower() for n, _ in headers]
        self.assertEqual(names.count(b"connection"), 1)
        self.assertIn((b"Upgrade", b"websocket"), headers)
        self.assertIn((b"Sec-WebSocket-Accept", b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), headers)
        self.assertNotIn(b"transfer-encoding", names)
        self.assertNotIn(b"content-length", names)
        self.assertEqual(body, b"")

    def test_not_an_upgrade_without_connection_upgrade(self) -> None:
        """Upgrade without the Connection token is an ordinary request: the
        header does not go upstream."""
        h = Harness()
        h.send(b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n")
        self.assertNotIn(b"upgrade", h.conns[0].sent().lower())

    def test_a_protocol_the_site_does_not_allow(self) -> None:
        """Upgrade: h2c is not tunnelled by default: it goes upstream as an
        ordinary GET, and a 101 to it would be a 502."""
        h = Harness()
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
        sent = h.conns[0].sent().lower()
        self.assertNotIn(b"upgrade", sent)
        h.conns[0].reply(SWITCH)
        self.assertEqual(parse_response(client.value())[0], 502)

    def test_a_post_is_never_tunnelled(self) -> None:
        """Only a GET without a body upgrades."""
        h = Harness()
        h.send(
            b"POST / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Content-Length: 2\r\n\r\nhi"
        )
        self.assertNotIn(b"upgrade:", h.conns[0].sent().lower())

    def test_a_refused_upgrade_is_an_ordinary_response(self) -> None:
        """A 403 to the upgrade request reaches the client as it is, and
        the connection serves requests again."""
        h = Harness()
        channel, client = h.send(WS)
        h.conns[0].sent()
        h.conns[0].reply(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 3\r\n\r\nno\n")
        status, _, body = parse_response(client.value())
        self.assertEqual((status, body), (403, b"no\n"))
        client.clear()
        channel.dataReceived(b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertIn(b"GET /next ", h.conns[0].sent())


class TunnelTests(SynchronousTestCase):
    def test_bytes_both_ways(self) -> None:
        """Bytes after the 101 head (same read) and later reads go to the
        client; the client's bytes go upstream; untouched, HTTP-looking or not."""
        t = Opened(self, after_head=b"\x81\x05hello")
        self.assertTrue(t.head.endswith(b"\r\n\r\n\x81\x05hello"))
        t.conn.reply(b"GET / HTTP/1.1\r\n\r\n")
        self.assertEqual(t.client.value(), b"GET / HTTP/1.1\r\n\r\n")
        t.channel.dataReceived(b"HTTP/1.1 200 OK\r\n\x00\xff")
        self.assertEqual(t.conn.sent(), b"HTTP/1.1 200 OK\r\n\x00\xff")
        self.assertEqual(counter(t.h, "prexy_tunnels_total"), 1)

    def test_slow_client_pauses_the_upstream(self) -> None:
        """When the client's send buffer is full the upstream is not read,
        and it is read again once the buffer drains."""
        t = Opened(self)
        t.client.producer.pauseProducing()  # what a full buffer does
        self.assertTrue(t.conn.paused)
        t.client.producer.resumeProducing()
        self.assertFalse(t.conn.paused)

    def test_slow_upstream_pauses_the_client(self) -> None:
        """When the upstream's send buffer is full the client is not read."""
        t = Opened(self)
        t.conn.transport.producer.pauseProducing()
        self.assertEqual(t.client.producerState, "paused")
        t.conn.transport.producer.resumeProducing()
        self.assertEqual(t.client.producerState, "producing")

    def test_upstream_close_closes_the_client(self) -> None:
        """A clean close upstream is a clean close to the client (after what
        is queued), counted and logged as the upstream's."""
        t = Opened(self)
        t.conn.reply(b"last")
        t.conn.close()
        self.assertTrue(t.client.disconnecting)
        self.assertFalse(t.client.aborted)
        self.assertEqual(t.client.value(), b"last")
        self.assertEqual(counter(t.h, "prexy_tunnels_closed_total", by="upstream"), 1)
        self.assertEqual(counter(t.h, "prexy_tunnel_bytes_total", direction="down"), 4)
        self.assertEqual(counter(t.h, "prexy_requests_total", status="101"), 1)

    def test_upstream_reset_resets_the_client(self) -> None:
        t = Opened(self)
        t.conn.close(Failure(ConnectionLost("reset")))
        self.assertTrue(t.client.aborted)

    def test_client_close_closes_the_upstream(self) -> None:
        t = Opened(self)
        t.channel.dataReceived(b"bye")
        t.client.loseConnection()
        self.assertTrue(t.conn.transport.disconnecting)
        self.assertFalse(t.conn.transport.aborted)
        self.assertEqual(counter(t.h, "prexy_tunnels_closed_total", by="client"), 1)
        self.assertEqual(counter(t.h, "prexy_tunnel_bytes_total", direction="up"), 3)

    def test_client_reset_resets_the_upstream(self) -> None:
        t = Opened(self)
        t.client.abortConnection()
        self.assertTrue(t.conn.transport.aborted)

    def test_idle_timeout(self) -> None:
        """No byte either way for tunnel_idle closes both sides; a byte
        restarts the count."""
        t = Opened(self, tunnel_idle=30.0)
        t.h.clock.advance(20)
        t.conn.reply(b"x")
        t.h.clock.advance(20)
        self.assertFalse(t.client.disconnecting)
        t.h.clock.advance(10.5)
        self.assertTrue(t.client.disconnecting)
        self.assertTrue(t.conn.transport.disconnecting)
        self.assertEqual(counter(t.h, "prexy_tunnels_closed_total", by="idle"), 1)

    def test_no_idle_timeout(self) -> None:
        """tunnel_idle = 0 keeps a quiet tunnel open; the HTTP keep-alive
        timeout of the channel no longer applies either."""
        t = Opened(self, tunnel_idle=0.0)
        t.h.clock.advance(24 * 3600)
        self.assertFalse(t.client.disconnecting)
        self.assertFalse(t.conn.transport.disconnecting)

    def test_the_upstream_connection_is_never_pooled(self) -> None:
        """After the tunnel ends, a new request opens a new connection."""
        t = Opened(self)
        t.conn.close()
        t.h.send(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertEqual(len(t.h.conns), 2)

    def test_logged_once(self) -> None:
        """One access-log line (status 101, bytes to the client) per tunnel."""
        t = Opened(self)
        logged: list[Any] = []
        t.h.site.log = logged.append  # type: ignore[method-assign]
        t.conn.reply(b"12345")
        t.conn.close()
        t.client.loseConnection()
        self.assertEqual(len(logged), 1)
        self.assertEqual((logged[0].code, logged[0].sentLength), (101, 5))


class EarlyBytesTests(SynchronousTestCase):
    def test_bytes_before_the_101_go_through_the_tunnel(self) -> None:
        """What a client sends right after its upgrade request, before the
        101 (same read or later), reaches the upstream once the tunnel is
        open, before anything it sends after."""
        h = Harness()
        channel, client = h.send(WS + b"early-1")
        channel.dataReceived(b"|early-2")
        [conn] = h.conns
        self.assertNotIn(b"early", conn.sent())
        conn.reply(SWITCH)
        channel.dataReceived(b"|later")
        self.assertEqual(conn.sent(), b"early-1|early-2|later")

    def test_a_refused_upgrade_releases_a_pipelined_request(self) -> None:
        """No 101: the held bytes are the next request, served after."""
        h = Harness()
        channel, client = h.send(WS + b"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
        conn = h.conns[0]
        self.assertNotIn(b"/next", conn.sent())
        conn.reply(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        self.assertIn(b"GET /next ", conn.sent())

    def test_ordinary_requests_are_not_held(self) -> None:
        """A pipelined pair of plain GETs (a browser's Upgrade-Insecure-Requests
        header included) is served in order as before."""
        h = Harness()
        first = b"GET /a HTTP/1.1\r\nHost: a\r\nUpgrade-Insecure-Requests: 1\r\n\r\n"
        channel, client = h.send(first + b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n")
        conn = h.conns[0]
        self.assertIn(b"GET /a ", conn.sent())
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")
        self.assertIn(b"GET /b ", conn.sent())
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb")
        self.assertEqual(client.value().count(b"HTTP/1.1 200 OK"), 2)


class TunnelPropertyTests(SynchronousTestCase):
    @given(st.lists(st.tuples(st.booleans(), st.binary(min_size=1, max_size=64)), max_size=30))
    @settings(max_examples=60)
    def test_any_interleaving_arrives_whole_and_in_order(self, pieces: list[tuple[bool, bytes]]) -> None:
        """Pieces sent either way in any order and any sizes arrive at the
        other side whole and in order, and are counted."""
        t = Opened(self)
        up = down = b""
        for to_upstream, data in pieces:
            if to_upstream:
                t.channel.dataReceived(data)
                up += data
            else:
                t.conn.reply(data)
                down += data
        self.assertEqual(t.conn.sent(), up)
        self.assertEqual(t.client.value(), down)
