"""prexy.proxy.pool and prexy.proxy.upstream on their own, against scripted
origins (in memory, MemoryReactorClock), for what the proxy tests do not
reach: bodies that end before a consumer attaches, bytes after a response."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import OriginKey, Timeouts
from prexy.proxy.pool import UpstreamPool
from prexy.proxy.upstream import UpstreamResponse
from tests.proxy.support import OriginConn

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
        still the body (it used to be dropped and reported as a failure)."""
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
