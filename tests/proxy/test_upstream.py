"""prexy.proxy.pool and prexy.proxy.upstream on their own, against scripted
origins (in memory, MemoryReactorClock), for what the proxy tests do not
reach: bodies that end before a consumer attaches, bytes after a response;
and, through the whole in-memory proxy, what strict framing refuses: a 502
to the client and an upstream connection that is never reused."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, Limits, OriginKey, SiteConfig, Timeouts, UpstreamURL
from prexy.proxy.pool import UpstreamPool
from prexy.proxy.upstream import UpstreamProtocolError, UpstreamResponse
from tests.proxy.support import Harness, Logged, OriginConn, parse_response

KEY = OriginKey("http", "origin.test", 80)


class Body:
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.done = False
        self.failed: Failure | None = None

    def bodyData(self, data: bytes) -> None:
        self.data.append(data)

    def bodyDone(self) -> None:
        self.done = True

    def bodyFailed(self, reason: Failure) -> None:
        self.failed = reason


class Setup:
    def __init__(self) -> None:
        self.clock = MemoryReactorClock()
        self.conns: list[OriginConn] = []
        self.pool = UpstreamPool(self.clock, Timeouts(connect=5, first_byte=10, idle=7), endpoint_factory=self.endpoint)
        self.heads: list[UpstreamResponse] = []
        self.errors: list[Failure] = []

    def endpoint(self, key: OriginKey, timeout: float) -> Any:
        setup = self

        class Endpoint:
            def connect(self, factory: Any) -> defer.Deferred[Any]:
                protocol = factory.buildProtocol(None)
                setup.conns.append(OriginConn(protocol))
                return defer.succeed(protocol)

        return Endpoint()

    def get(self, method: bytes = b"GET") -> OriginConn:
        self.pool.request(KEY, method, b"/", [(b"Host", b"origin.test")], None, 0, self.heads.append, self.errors.append)
        return self.conns[-1]


class UpstreamTests(SynchronousTestCase):
    def test_request_bytes(self) -> None:
        s = Setup()
        conn = s.get()
        self.assertEqual(conn.sent(), b"GET / HTTP/1.1\r\nHost: origin.test\r\n\r\n")

    def test_bytes_after_a_bodiless_response_close_the_connection(self) -> None:
        """Bytes after a 204 mean the connection is out of step: not pooled
        (the old parser dropped them and pooled it)."""
        s = Setup()
        conn = s.get()
        conn.reply(b"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\n")
        body = Body()
        s.heads[0].deliverBody(body)
        self.assertTrue(body.done)
        self.assertEqual(s.pool.idle_connections(), 0)
        self.assertTrue(conn.transport.disconnecting)

    def test_close_delimited_body_complete_before_consumer(self) -> None:
        """A close-delimited body that ended before deliverBody is delivered
        whole and done (it used to wait for the idle timeout)."""
        s = Setup()
        conn = s.get()
        conn.reply(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        conn.close()
        body = Body()
        s.heads[0].deliverBody(body)
        self.assertEqual((b"".join(body.data), body.done, body.failed), (b"all of it", True, None))

    def test_length_body_in_hand_survives_close(self) -> None:
        """A whole Content-Length body that came before the origin closed is
        still the body, not dropped and reported as a failure."""
        s = Setup()
        conn = s.get()
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
        conn.close()
        self.assertTrue(s.heads[0].body_in_hand)
        self.assertEqual(s.heads[0].take_body(), b"abc")

    def test_cut_short_before_consumer_fails(self) -> None:
        s = Setup()
        conn = s.get()
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        conn.close()
        body = Body()
        s.heads[0].deliverBody(body)
        self.assertIsNotNone(body.failed)
        self.assertFalse(body.done)

    def test_chunked_error_after_data(self) -> None:
        """Data before a framing error is delivered, then a 502 failure."""
        s = Setup()
        conn = s.get()
        conn.reply(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        body = Body()
        s.heads[0].deliverBody(body)
        conn.reply(b"2\r\nab\r\nzz\r\n")
        self.assertEqual(body.data, [b"ab"])
        assert body.failed is not None
        self.assertEqual(body.failed.value.status, 502)  # type: ignore[union-attr]
        self.assertTrue(conn.transport.aborted)

    def test_keep_alive_reuse(self) -> None:
        s = Setup()
        conn = s.get()
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        self.assertEqual(s.heads[0].take_body(), b"ok")
        self.assertEqual(s.pool.idle_connections(), 1)
        self.assertIs(s.get(), conn)
        self.assertEqual(s.pool.connections_opened, 1)


GET = b"GET /p HTTP/1.1\r\nHost: www.example.test\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def limited(max_response_head: int) -> Harness:
    """A proxy whose config sets [limits] max_response_head."""
    return Harness(
        Config(
            listen=("tcp:0",),
            sites=(SiteConfig("default", UpstreamURL.parse("http://origin.test:8000")),),
            default_site="default",
            timeouts=Timeouts(connect=5, first_byte=10, idle=7, pool_idle=30),
            limits=Limits(max_response_head=max_response_head),
        )
    )


class StrictFramingTests(SynchronousTestCase):
    """Through the proxy: an upstream response the reader refuses gives the
    client a 502 (its connection stays usable), and the upstream connection
    is aborted, not pooled: the next request opens a new one."""

    def refused(self, response: bytes, h: Harness | None = None) -> bytes:
        """Answer a GET with ``response``; check the 502 and that the next
        request goes on a new upstream connection; what was logged (the
        502's body is the generic one: the reason goes to the log only)."""
        logged = Logged(self)
        h = h or Harness()
        channel, client = h.client()
        channel.dataReceived(GET)
        conn = h.conns[0]
        conn.sent()
        conn.reply(response)
        h.settle()
        status, _, body = parse_response(client.value())
        self.assertEqual((status, body), (502, b"502 Bad Gateway\n"))
        self.assertTrue(conn.transport.aborted)
        self.assertEqual(h.pool.idle_connections(), 0)
        self.assertFalse(client.disconnecting)
        client.clear()
        channel.dataReceived(GET)
        self.assertEqual(len(h.conns), 2)
        h.conns[1].reply(OK)
        self.assertEqual(parse_response(client.value())[::2], (200, b"ok"))
        self.assertEqual(h.pool.idle_connections(), 1)
        return logged.text

    def test_lenient_framing_is_502(self) -> None:
        """What int() took and HTTP does not: Content-Length "+5" and "1_1",
        chunk sizes "0x5", "+5", "5_0" and " 5" (the body with its head:
        nothing has reached the client yet), a status code "2_00", and a NUL
        in a header."""
        for response in (
            b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1_1\r\n\r\nhello world",
            b"HTTP/1.1 2_00 OK\r\nContent-Length: 2\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 2\r\n\r\nok",
            *(CHUNKED + size + b"\r\nhello\r\n0\r\n\r\n" for size in (b"0x5", b"+5", b"5_0", b" 5")),
            CHUNKED + b"2\r\nok\r\n+5\r\nhello\r\n0\r\n\r\n",
        ):
            with self.subTest(response=response):
                self.assertIn("502 for GET", self.refused(response))
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_bad_chunk_after_the_head_resets(self) -> None:
        """A bad chunk size that comes after the head went out cannot be a
        502: the client is reset, and the upstream connection is not
        reused either."""
        h = Harness()
        _, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(CHUNKED + b"2\r\nok\r\n")
        self.assertFalse(client.disconnecting)
        conn.reply(b"0x5\r\nhello\r\n0\r\n\r\n")
        self.assertTrue(client.value().startswith(b"HTTP/1.1 200 OK"))
        self.assertFalse(client.value().endswith(b"0\r\n\r\n"))
        self.assertTrue(client.aborted)
        self.assertTrue(conn.transport.aborted)
        self.assertEqual(h.pool.idle_connections(), 0)
        h.send(GET)
        self.assertEqual(len(h.conns), 2)

    def test_unsolicited_101_is_502(self) -> None:
        """A 101 to a request that did not ask to upgrade (Prexy strips
        Upgrade) is not forwarded, and the connection, which may no longer
        speak HTTP, is dropped (it used to go back to the pool)."""
        logged = self.refused(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno"
        )
        self.assertIn("101", logged)

    def test_max_response_head_from_config(self) -> None:
        """[limits] max_response_head bounds the upstream's head, whole or
        in pieces; the default (64 KiB) holds a head that fits."""
        start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: "
        fits = start + b"y" * (1024 - len(start) - 4) + b"\r\n\r\nok"
        over = start + b"y" * (1025 - len(start) - 4) + b"\r\n\r\nok"
        h = limited(1024)
        _, client = h.send(GET)
        h.conns[0].reply(fits)
        self.assertEqual(parse_response(client.value())[::2], (200, b"ok"))
        self.assertIn("over 1024 bytes", self.refused(over, limited(1024)))
        h = limited(1024)
        _, client = h.send(GET)
        for i in range(0, len(over), 100):
            h.conns[0].reply(over[i : i + 100])
        self.assertEqual(parse_response(client.value())[0], 502)
        # A 1xx head counts toward the limit as well.
        self.refused(b"HTTP/1.1 100 Continue\r\n\r\n" + fits, limited(1024))
        h = Harness()
        _, client = h.send(GET)
        h.conns[0].reply(start + b"y" * 60_000 + b"\r\n\r\nok")
        self.assertEqual(parse_response(client.value())[::2], (200, b"ok"))

    def test_service_passes_limits_to_its_pool(self) -> None:
        """ProxyService gives its pool the config's limits, and a reload
        gives it the new ones."""
        from prexy.config import load_config
        from prexy.runtime import build_runtime
        from prexy.service import ProxyService

        path = self.mktemp()
        text = '[limits]\nmax_response_head = "%s"\n[sites.one]\nupstream = "http://origin.test"\n'
        with open(path, "w") as f:
            f.write(text % "1k")
        config = load_config(path)
        service = ProxyService(MemoryReactorClock(), config, build_runtime(config))
        self.assertEqual(service.pool.limits.max_response_head, 1024)
        with open(path, "w") as f:
            f.write(text % "2k")
        self.assertTrue(service.reload())
        self.assertEqual(service.pool.limits.max_response_head, 2048)

    def test_pool_reads_limits_per_request(self) -> None:
        """The pool's limits are read at each request, so replacing them
        (as a reload does) applies to the next one."""
        h = limited(1024)
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: " + b"y" * 2000 + b"\r\n\r\nok"
        self.refused(head, h)
        h.pool.limits = Limits(max_response_head=4096)
        _, client = h.send(GET)
        h.conns[-1].reply(head)
        self.assertEqual(parse_response(client.value())[::2], (200, b"ok"))


class StrictFramingPoolTests(SynchronousTestCase):
    """The same at the pool: the failure is an UpstreamProtocolError (502)."""

    def test_refused_head_fails_the_request(self) -> None:
        s = Setup()
        conn = s.get()
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello")
        self.assertEqual(s.heads, [])
        (failure,) = s.errors
        error = failure.value
        assert isinstance(error, UpstreamProtocolError)
        self.assertEqual(error.status, 502)
        self.assertTrue(conn.transport.aborted)
        self.assertEqual(s.pool.idle_connections(), 0)
