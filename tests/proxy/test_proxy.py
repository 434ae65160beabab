"""The proxy resource and upstream client together, in memory.

Each test scripts the origin byte by byte through ``tests.proxy.support`` and
checks what reaches the client: headers, framing, errors, backpressure and
connection reuse.  Time is a MemoryReactorClock; nothing touches a socket.
"""

from __future__ import annotations

from twisted.internet.error import ConnectionLost
from twisted.internet.error import TimeoutError as TxTimeout
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, SiteConfig, Timeouts, UpstreamURL

from .support import Harness, Logged, header, parse_response, site_runtime

GET = b"GET /path?q=1 HTTP/1.1\r\nHost: www.example.test\r\n\r\n"
OK_12 = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Type: text/plain\r\n\r\nhello world!"


def request_head(raw: bytes) -> tuple[bytes, dict[bytes, list[bytes]]]:
    head, _, _ = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers: dict[bytes, list[bytes]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(b": ")
        headers.setdefault(name.lower(), []).append(value)
    return lines[0], headers


class ForwardingTests(SynchronousTestCase):
    """What the proxy sends upstream and back."""

    def test_request_line_and_forwarding_headers(self) -> None:
        """The request goes upstream in origin-form with Host passed through,
        X-Forwarded-* and Via set, and hop-by-hop headers removed."""
        h = Harness()
        h.send(
            b"GET /a/b?x=%20y HTTP/1.1\r\nHost: www.example.test\r\n"
            b"Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: 5\r\nTE: trailers\r\n"
            b"Proxy-Authorization: Basic Zm9v\r\nUpgrade: h2c\r\nX-Forwarded-For: 192.0.2.1\r\n"
            b"Cookie: a=1\r\nCookie: b=2\r\n\r\n"
        )
        line, headers = request_head(h.conns[0].sent())
        self.assertEqual(line, b"GET /a/b?x=%20y HTTP/1.1")
        self.assertEqual(headers[b"host"], [b"www.example.test"])
        self.assertEqual(headers[b"x-forwarded-for"], [b"192.0.2.1, 10.1.2.3"])
        self.assertEqual(headers[b"x-forwarded-proto"], [b"http"])
        self.assertEqual(headers[b"x-forwarded-host"], [b"www.example.test"])
        self.assertEqual(headers[b"via"], [b"1.1 prexy"])
        self.assertEqual(headers[b"cookie"], [b"a=1", b"b=2"])
        for gone in (b"connection", b"x-secret", b"keep-alive", b"te", b"proxy-authorization", b"upgrade"):
            self.assertNotIn(gone, headers)

    def test_response_headers(self) -> None:
        """Repeated Set-Cookie survive, hop-by-hop response headers are removed,
        Content-Length is kept, Via and Server-Timing are added."""
        h = Harness()
        _, client = h.send(GET)
        h.conns[0].sent()
        h.conns[0].reply(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
            b"Connection: X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nProxy-Authenticate: Basic\r\n"
            b"Server: origin\r\n\r\nhello"
        )
        status, headers, body = parse_response(client.value())
        self.assertEqual((status, body), (200, b"hello"))
        self.assertEqual(header(headers, b"set-cookie"), [b"a=1", b"b=2"])
        self.assertEqual(header(headers, b"content-length"), [b"5"])
        self.assertEqual(header(headers, b"server"), [b"origin"])
        self.assertEqual(header(headers, b"via"), [b"1.1 prexy"])
        for gone in (b"x-hop", b"keep-alive", b"proxy-authenticate", b"transfer-encoding"):
            self.assertEqual(header(headers, gone), [])
        timing = header(headers, b"server-timing")[0]
        self.assertRegex(timing, rb"upstream-connect;dur=[\d.]+, upstream-first-byte;dur=[\d.]+, prexy;dur=[\d.]+")

    def test_host_header_per_site(self) -> None:
        """Sites are chosen by Host; a site may send its upstream's own Host."""
        config = Config(
            listen=("tcp:0",),
            sites=(
                SiteConfig("a", UpstreamURL.parse("http://a.origin:81"), hosts=("a.test",)),
                SiteConfig("b", UpstreamURL.parse("http://b.origin/base"), hosts=("b.test",), host_header="upstream"),
            ),
            default_site="a",
        )
        h = Harness(config)
        h.send(b"GET /x HTTP/1.1\r\nHost: B.test:8080\r\n\r\n")
        line, headers = request_head(h.conns[0].sent())
        self.assertEqual(line, b"GET /base/x HTTP/1.1")
        self.assertEqual(headers[b"host"], [b"b.origin"])
        h.send(b"GET /y HTTP/1.1\r\nHost: unknown.test\r\n\r\n")
        line, headers = request_head(h.conns[1].sent())
        self.assertEqual((line, headers[b"host"]), (b"GET /y HTTP/1.1", [b"unknown.test"]))

    def test_absolute_form_target(self) -> None:
        """An absolute-form request target is sent upstream in origin-form."""
        h = Harness()
        h.send(b"GET http://www.example.test/abs?q HTTP/1.1\r\nHost: www.example.test\r\n\r\n")
        line, _ = request_head(h.conns[0].sent())
        self.assertEqual(line, b"GET /abs?q HTTP/1.1")


class FramingTests(SynchronousTestCase):
    """Bodies of every framing come through intact."""

    def test_chunked_upstream_fed_byte_by_byte(self) -> None:
        """A chunked upstream body delivered one byte at a time arrives whole,
        re-chunked for the client, and the connection goes back to the pool."""
        h = Harness()
        _, client = h.send(GET)
        conn = h.conns[0]
        conn.sent()
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        for i in range(len(raw)):
            conn.reply(raw[i : i + 1])
        status, headers, body = parse_response(client.value())
        self.assertEqual((status, body), (200, b"hello world!"))
        self.assertEqual(header(headers, b"transfer-encoding"), [b"chunked"])
        self.assertEqual(h.pool.idle_connections(), 1)

    def test_close_delimited_body(self) -> None:
        """A body without length ends when the upstream closes; it is complete."""
        h = Harness()
        _, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\n\r\npart one, ")
        conn.reply(b"part two")
        conn.close()
        status, _, body = parse_response(client.value())
        self.assertEqual((status, body), (200, b"part one, part two"))
        self.assertTrue(client.value().endswith(b"0\r\n\r\n"))
        self.assertEqual(h.pool.idle_connections(), 0)

    def test_keep_alive_reuses_connection(self) -> None:
        """Sequential requests share one pooled upstream connection, and the
        client connection stays open between them."""
        h = Harness()
        channel, client = h.client()
        for _ in range(3):
            channel.dataReceived(GET)
            h.conns[-1].sent()
            h.conns[-1].reply(OK_12)
        self.assertEqual(len(h.conns), 1)
        self.assertEqual(client.value().count(b"hello world!"), 3)
        self.assertFalse(client.disconnecting)

    def test_map_site_plain_requests(self) -> None:
        """On a site with a URL map, a plain GET with a map entry is
        redirected without an upstream connection; one without an entry is
        proxied, sent upstream from the short parse like any other."""
        from prexy.config import MapConfig
        from prexy.urlmap.loader import parse_map

        config = Config(
            listen=("tcp:0",),
            sites=(SiteConfig("m", UpstreamURL.parse("http://origin.test"), map=MapConfig("m.map")),),
            default_site="m",
        )
        h = Harness(config, site_runtime(config, m={"urlmap": parse_map("/old /new;\n", "m.map")}))
        _, client = h.send(b"GET /old HTTP/1.1\r\nHost: www.example.test\r\n\r\n")
        status, headers, _ = parse_response(client.value())
        self.assertEqual((status, header(headers, b"location")), (301, [b"http://www.example.test/new"]))
        self.assertEqual(h.conns, [])
        channel, client = h.client()
        channel.dataReceived(GET)
        self.assertTrue(h.conns[0].sent().startswith(b"GET /path?q=1 HTTP/1.1\r\n"))
        h.conns[0].reply(OK_12)
        self.assertEqual(parse_response(client.value())[2], b"hello world!")

    def test_pipelined_requests_answered_in_order(self) -> None:
        """Two requests in one packet take twisted.web's parser and are
        answered one after the other on the same connection."""
        h = Harness()
        channel, client = h.client()
        channel.dataReceived(b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n")
        self.assertIn(b"GET /1 ", h.conns[0].sent())
        h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none")
        self.assertIn(b"GET /2 ", h.conns[-1].sent())
        h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\ntwo")
        raw = client.value()
        self.assertLess(raw.index(b"one"), raw.index(b"two"))
        self.assertEqual(raw.count(b"HTTP/1.1 200 OK"), 2)

    def test_head_keeps_content_length(self) -> None:
        """HEAD answers carry the upstream's Content-Length and no body."""
        h = Harness()
        _, client = h.send(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n")
        raw = client.value()
        self.assertIn(b"Content-Length: 1234\r\n", raw)
        self.assertTrue(raw.endswith(b"\r\n\r\n"))
        self.assertEqual(h.pool.idle_connections(), 1)

    def test_204_and_304_have_no_body(self) -> None:
        """204 and 304 are passed without body, length or chunking."""
        for code in (b"204 No Content", b"304 Not Modified"):
            h = Harness()
            _, client = h.send(GET)
            h.conns[0].reply(b"HTTP/1.1 " + code + b"\r\nETag: \"x\"\r\n\r\n")
            raw = client.value()
            self.assertTrue(raw.startswith(b"HTTP/1.1 " + code[:3]))
            self.assertNotIn(b"Transfer-Encoding", raw)
            self.assertTrue(raw.endswith(b"\r\n\r\n"))
            self.assertEqual(h.pool.idle_connections(), 1)

    def test_interim_100_skipped(self) -> None:
        """A 100 Continue from upstream is not the response."""
        h = Harness()
        _, client = h.send(GET)
        h.conns[0].reply(b"HTTP/1.1 100 Continue\r\n\r\n" + OK_12)
        self.assertEqual(parse_response(client.value())[2], b"hello world!")

    def test_request_body_forwarded_with_length(self) -> None:
        """A chunked request body is spooled and sent with a Content-Length."""
        h = Harness()
        h.send(
            b"POST /form HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
        )
        sent = h.conns[0].sent()
        line, headers = request_head(sent)
        self.assertEqual(headers[b"content-length"], [b"7"])
        self.assertNotIn(b"transfer-encoding", headers)
        self.assertTrue(sent.endswith(b"\r\n\r\nabcdefg"))

    def test_form_bodies_are_forwarded_not_parsed(self) -> None:
        """A proxy passes form uploads on as bytes: twisted.web would read a
        urlencoded or multipart body into memory to fill request.args, and
        answer 400 itself to a multipart body it cannot parse."""
        for ctype, body in (
            (b"multipart/form-data", b"no boundary: twisted.web says 400"),
            (b"application/x-www-form-urlencoded", b"a=1&b=%zz"),
        ):
            h = Harness()
            _, client = h.send(
                b"POST /upload?q=1 HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                % (ctype, len(body), body)
            )
            self.assertEqual(len(h.conns), 1, client.value()[:200])
            sent = h.conns[0].sent()
            self.assertTrue(sent.startswith(b"POST /upload?q=1 HTTP/1.1\r\n"))
            self.assertTrue(sent.endswith(b"\r\n\r\n" + body))
            h.conns[0].reply(OK_12)
            self.assertTrue(client.value().startswith(b"HTTP/1.1 200 OK"))

    def test_request_body_too_large_is_413(self) -> None:
        """A declared or streamed body over the limit is answered 413 and the
        connection closed; nothing goes upstream."""
        h = Harness(max_request_body=10)
        _, client = h.send(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n")
        self.assertTrue(client.value().startswith(b"HTTP/1.1 413 "))
        self.assertTrue(client.disconnecting)
        h2 = Harness(max_request_body=10)
        _, client2 = h2.send(
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n"
        )
        self.assertTrue(client2.value().startswith(b"HTTP/1.1 413 "))
        self.assertEqual(h.conns + h2.conns, [])

    def test_malformed_request_is_400(self) -> None:
        """A request Twisted cannot parse gets a 4xx, nothing goes upstream."""
        h = Harness()
        _, client = h.send(b"GARBAGE\r\n\r\n")
        self.assertTrue(client.value().startswith(b"HTTP/1.1 400"))
        self.assertEqual(h.conns, [])


class FailureTests(SynchronousTestCase):
    """Upstream and client failures map to 502/504 or a reset, cleanly."""

    def test_refused_is_502(self) -> None:
        """A refusing upstream gives a short plain 502 that says nothing of
        the upstream; the reason, with its address, is logged in one line."""
        logged = Logged(self)
        h = Harness()
        h.refuse = True
        _, client = h.send(GET)
        status, headers, body = parse_response(client.value())
        self.assertEqual((status, body), (502, b"502 Bad Gateway\n"))
        self.assertEqual(header(headers, b"content-type"), [b"text/plain; charset=utf-8"])
        [line] = [x for x in logged.lines if "502 for" in x]
        self.assertIn("cannot connect to origin.test:8000", line)
        self.assertNotIn("\n", line)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_connect_timeout_is_504(self) -> None:
        """A connect attempt that times out gives 504."""
        h = Harness()
        h.hold_connect = True
        _, client = h.send(GET)
        h.held[0][0].errback(Failure(TxTimeout()))
        self.assertEqual(parse_response(client.value())[0], 504)

    def test_first_byte_timeout_is_504(self) -> None:
        """No answer within the first-byte timeout gives 504 and drops the
        upstream connection."""
        logged = Logged(self)
        h = Harness()
        _, client = h.send(GET)
        h.clock.advance(9.9)
        self.assertEqual(client.value(), b"")
        h.clock.advance(0.2)
        status, _, body = parse_response(client.value())
        self.assertEqual((status, body), (504, b"504 Gateway Timeout\n"))
        self.assertIn("first byte timeout", logged.text)
        self.assertTrue(h.conns[0].transport.disconnecting)

    def test_garbage_from_upstream_is_502(self) -> None:
        """A response that is not HTTP gives 502."""
        h = Harness()
        _, client = h.send(GET)
        h.conns[0].reply(b"SSH-2.0-OpenSSH\r\n\r\n")
        self.assertEqual(parse_response(client.value())[0], 502)

    def test_upstream_dies_mid_body_aborts_client(self) -> None:
        """A truncated body never ends cleanly: the client connection is reset
        (no terminating chunk, no complete Content-Length)."""
        h = Harness()
        _, client = h.send(GET)
        h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 40)
        h.conns[0].close(Failure(ConnectionLost()))
        self.assertTrue(client.aborted)  # reset, not closed cleanly
        self.assertTrue(client.value().endswith(b"x" * 40))

    def test_idle_timeout_mid_body_aborts_client(self) -> None:
        """An upstream that stalls mid-body longer than the idle timeout is
        dropped and the client reset; a paused upstream does not time out."""
        h = Harness()
        channel, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
        client.producer.pauseProducing()  # slow client: the upstream is paused
        h.clock.advance(30)
        self.assertFalse(client.disconnecting)
        client.producer.resumeProducing()
        h.clock.advance(6)
        conn.reply(b"def")
        h.clock.advance(6.9)
        self.assertFalse(client.disconnecting)
        h.clock.advance(0.2)
        self.assertTrue(client.aborted)
        self.assertTrue(conn.transport.disconnecting)

    def test_client_gone_before_answer_cancels_upstream(self) -> None:
        """A client that disconnects while the upstream is thinking cancels the
        upstream request; nothing is logged as an error."""
        h = Harness()
        channel, client = h.send(GET)
        client.abortConnection()
        self.assertTrue(h.conns[0].transport.disconnecting)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_client_gone_mid_body_aborts_upstream(self) -> None:
        """A client that goes away mid-body drops the upstream connection
        instead of reading the rest into nowhere or pooling it."""
        h = Harness()
        channel, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"x" * 10)
        client.abortConnection()
        self.assertTrue(conn.transport.disconnecting)
        self.assertEqual(h.pool.idle_connections(), 0)
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_stale_pooled_connection_is_retried(self) -> None:
        """A pooled connection that the upstream closed as the request went
        out is retried once on a new connection for idempotent methods."""
        h = Harness()
        channel, client = h.client()
        channel.dataReceived(GET)
        h.conns[0].reply(OK_12)
        channel.dataReceived(GET)
        h.conns[0].close()  # closed before answering
        self.assertEqual(len(h.conns), 2)
        h.conns[1].reply(OK_12)
        self.assertEqual(client.value().count(b"hello world!"), 2)

    def test_post_on_stale_connection_is_not_retried(self) -> None:
        """A non-idempotent request is never sent twice: 502 instead."""
        h = Harness()
        channel, client = h.client()
        channel.dataReceived(GET)
        h.conns[0].reply(OK_12)
        channel.dataReceived(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz")
        h.conns[0].close()
        self.assertEqual(len(h.conns), 1)
        self.assertIn(b"HTTP/1.1 502", client.value())


class BackpressureTests(SynchronousTestCase):
    """A slow client pauses the upstream socket."""

    def test_client_pause_pauses_upstream(self) -> None:
        """When the client's socket buffer is full the channel pauses, which
        pauses the upstream transport; resuming resumes it; at the end the
        connection returns to the pool unpaused."""
        h = Harness()
        channel, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
        self.assertFalse(conn.paused)
        client.producer.pauseProducing()
        self.assertTrue(conn.paused)
        client.producer.resumeProducing()
        self.assertFalse(conn.paused)
        conn.reply(b"def")
        self.assertEqual(parse_response(client.value())[2], b"abcdef")
        self.assertFalse(conn.paused)
        self.assertEqual(h.pool.idle_connections(), 1)

    def test_body_that_came_with_the_head_registers_no_producer(self) -> None:
        """A body already whole when its head is parsed is written out at
        once: nothing to pause, so no producer is registered with the
        client (two registrations saved per small response).  A body still
        on its way is registered, so a slow client can pause it."""
        h = Harness()
        channel, client = h.send(GET)
        registered: list[object] = []
        original = channel.registerProducer

        def register(producer: object, streaming: bool) -> None:
            registered.append(producer)
            original(producer, streaming)

        channel.registerProducer = register  # type: ignore[method-assign]
        h.conns[0].reply(OK_12)
        self.assertEqual(parse_response(client.value())[2], b"hello world!")
        self.assertEqual(registered, [])
        client.clear()
        channel.dataReceived(GET)
        h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
        self.assertEqual(len(registered), 1)
        h.conns[0].reply(b"def")
        self.assertEqual(parse_response(client.value())[2], b"abcdef")

    def test_pool_idle_connections_expire(self) -> None:
        """A pooled connection idle longer than pool_idle is not reused."""
        h = Harness(timeouts=Timeouts(pool_idle=30))
        channel, client = h.client()
        channel.dataReceived(GET)
        h.conns[0].reply(OK_12)
        h.clock.advance(31)
        channel.dataReceived(GET)
        self.assertEqual(len(h.conns), 2)
        self.assertTrue(h.conns[0].transport.disconnecting)
