"""The proxy over twisted.web's HTTP/2 connection, in memory: an ``h2``
client on one side, the scripted origin of ``support.Harness`` on the
other.  Proves: a streamed answer arrives whole without a Trailer it could
not send; an upstream dying mid-body resets the stream (not the
connection); a request body over the limit gets its 413 and a reset; the
access line says HTTP/2.0."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.accesslog import combined_line

from .support import Harness


class H2Client:
    def __init__(self, h: Harness) -> None:
        self.h = h
        self.server: Any = h.site.http2_connection()
        self.transport = StringTransport()
        self.server.makeConnection(self.transport)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.conn.initiate_connection()
        self.flush()

    def flush(self) -> list[Any]:
        data = self.conn.data_to_send()
        if data:
            self.server.dataReceived(data)
        self.h.clock.advance(0)
        self.h.clock.advance(0)
        events = self.conn.receive_data(self.transport.value())
        self.transport.clear()
        more = self.conn.data_to_send()
        if more:
            self.server.dataReceived(more)
        return events

    def get(self, sid: int, path: bytes = b"/x", body: bytes | None = None) -> list[Any]:
        headers = [(b":method", b"POST" if body else b"GET"), (b":path", path), (b":scheme", b"https"),
                   (b":authority", b"a")]
        if body:
            headers.append((b"content-length", b"%d" % len(body)))
        self.conn.send_headers(sid, headers, end_stream=body is None)
        if body:
            self.conn.send_data(sid, body, end_stream=True)
        return self.flush()


class HTTP2Tests(SynchronousTestCase):
    def test_streamed_answer_whole_no_trailer(self) -> None:
        h = Harness()
        c = H2Client(h)
        c.get(1)
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.reply(b"5\r\nhello\r\n")
        conn.reply(b"6\r\n world\r\n0\r\n\r\n")
        events = c.flush()
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        headers = dict(head.headers)
        self.assertEqual(headers[b":status"], b"200")
        self.assertNotIn(b"trailer", headers)
        body = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
        self.assertEqual(body, b"hello world")
        self.assertTrue(any(isinstance(e, h2.events.StreamEnded) for e in events))

    def test_upstream_dying_resets_the_stream_only(self) -> None:
        h = Harness()
        c = H2Client(h)
        c.get(1)
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\npartial")
        c.flush()
        conn.close(Failure(ConnectionLost("gone")))
        events = c.flush()
        self.assertTrue(any(isinstance(e, h2.events.StreamReset) for e in events), events)
        self.assertFalse(self.transport_closed(c))
        c.get(3)  # the connection still serves
        self.assertIn(b"GET /x ", h.conns[-1].sent())

    def transport_closed(self, c: H2Client) -> bool:
        return bool(c.transport.disconnecting)

    def test_request_body_over_the_limit(self) -> None:
        h = Harness(max_request_body=10)
        c = H2Client(h)
        events = c.get(1, body=b"x" * 100)
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        self.assertEqual(dict(head.headers)[b":status"], b"413")
        self.assertEqual(h.conns, [])

    def test_access_line_says_http_2_0(self) -> None:
        h = Harness()
        logged: list[Any] = []
        h.site.log = logged.append  # type: ignore[method-assign]
        c = H2Client(h)
        c.get(1)
        h.conns[-1].sent()
        h.conns[-1].reply(b"HTTP/1.1 204 No Content\r\n\r\n")
        c.flush()
        self.assertEqual(len(logged), 1)
        self.assertIn('"GET /x HTTP/2.0" 204', combined_line(logged[0], "[t]"))
        counted = h.metrics.counters[("prexy_requests_by_protocol_total", (("protocol", "HTTP/2.0"),))]
        self.assertEqual(counted, 1)


class HTTP2AbuseTests(SynchronousTestCase):
    def test_rapid_reset_closes_the_connection(self) -> None:
        """Streams opened and reset at once (CVE-2023-44487): past
        twisted.web's reset budget the connection is closed, and the
        upstream requests of the reset streams are not left running."""
        h = Harness()
        c = H2Client(h)
        for i in range(1200):
            sid = 1 + 2 * i
            c.conn.send_headers(sid, [(b":method", b"GET"), (b":path", b"/r"), (b":scheme", b"https"),
                                      (b":authority", b"a")], end_stream=True)
            c.conn.reset_stream(sid)
            if c.transport.disconnecting:
                break
            c.server.dataReceived(c.conn.data_to_send())
        self.assertTrue(c.transport.disconnecting)
        open_upstream = [conn for conn in h.conns if not conn.transport.disconnecting]
        self.assertLessEqual(len(open_upstream), 1)
