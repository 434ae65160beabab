"""The proxy over Prexy's HTTP/2 connection (``prexy.proxy.h2connection``),
in memory: an ``h2`` client on one side, the scripted origin of
``support.Harness`` on the other, a MemoryReactorClock for time.  Proves:
answers arrive whole on several streams at once; a stream whose window is
closed pauses its upstream and leaves nothing due on the reactor (no
``callLater(0)`` loop) while another stream completes; the transport's own
backpressure pauses every stream; the rewrite's Server-Timing arrives as
trailers; an upstream dying mid-body resets that stream only; a request
body over the limit gets its 413, a stalled one its 408; connection-specific fields never reach
the client; the access line says HTTP/2.0; a rapid-reset flood gets GOAWAY
ENHANCE_YOUR_CALM and starts no upstream request; a drain's GOAWAY lets the
stream in flight finish, then closes; an idle connection is closed; a
cleartext connection opening with the preface speaks HTTP/2 (h2c)."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
from hyperframe.frame import DataFrame, GoAwayFrame
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Limits
from prexy.h2server import PREFACE
from prexy.logformat import combined_line
from prexy.proxy.http2 import PriorKnowledgeFactory
from tests.test_h2server import frames

from .support import ClosingTransport, Harness
from .test_rewrite import PAGE, REWRITTEN, harness


def new_transport() -> ClosingTransport:
    return ClosingTransport(
        hostAddress=IPv4Address("TCP", "127.0.0.1", 8443), peerAddress=IPv4Address("TCP", "10.1.2.3", 5555)
    )


class H2Client:
    """An h2 client on a ClosingTransport to the site's HTTP/2 connection."""

    def __init__(self, h: Harness, window: int | None = None, server: Any = None) -> None:
        self.h = h
        self.server: Any = server or h.site.http2_connection()
        self.transport = new_transport()
        self.transport.protocol = self.server
        self.server.makeConnection(self.transport)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
        self.conn.initiate_connection()
        self.conn.increment_flow_control_window(1 << 24)
        self.ack = window is None
        self.flush()

    def flush(self) -> list[Any]:
        data = self.conn.data_to_send()
        if data:
            self.server.dataReceived(data)
        self.h.clock.advance(0)
        self.h.clock.advance(0)
        events = self.conn.receive_data(self.transport.value())
        self.transport.clear()
        if self.ack:
            for e in events:
                if isinstance(e, h2.events.DataReceived) and e.flow_controlled_length:
                    self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        more = self.conn.data_to_send()
        if more:
            self.server.dataReceived(more)
        return events

    def get(self, sid: int, path: bytes = b"/x", body: bytes | None = None,
            extra: list[tuple[bytes, bytes]] | None = None) -> list[Any]:
        headers = [(b":method", b"POST" if body else b"GET"), (b":path", path), (b":scheme", b"https"),
                   (b":authority", b"a")] + (extra or [])
        if body:
            headers.append((b"content-length", b"%d" % len(body)))
        self.conn.send_headers(sid, headers, end_stream=body is None)
        if body:
            self.conn.send_data(sid, body, end_stream=True)
        return self.flush()


def body(events: list[Any], sid: int) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived) and e.stream_id == sid)


def ended(events: list[Any], sid: int) -> bool:
    return any(isinstance(e, h2.events.StreamEnded) and e.stream_id == sid for e in events)


def due_now(h: Harness) -> list[Any]:
    """Reactor calls due without time passing (a callLater(0) loop would
    always leave one)."""
    return [c for c in h.clock.getDelayedCalls() if c.getTime() <= h.clock.seconds()]


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

    def test_stalled_request_body_gets_408(self) -> None:
        """A request body that pauses longer than client_body (60 s) gets a
        408 on its stream and goes no further upstream; a body that keeps
        moving, and the connection's other streams, go on; one timer for
        the connection, none left once no body is coming."""
        h = Harness()
        c = H2Client(h)
        post = [(b":method", b"POST"), (b":path", b"/up"), (b":scheme", b"https"), (b":authority", b"a"),
                (b"content-length", b"10")]
        c.conn.send_headers(1, post)
        c.conn.send_data(1, b"12345")
        c.conn.send_headers(3, post)
        c.conn.send_data(3, b"12345")
        c.flush()
        h.clock.advance(40)
        c.conn.send_data(3, b"67")  # stream 3's body moves; stream 1's does not
        c.flush()
        h.clock.advance(21)
        events = c.flush()
        heads = {e.stream_id: dict(e.headers) for e in events if isinstance(e, h2.events.ResponseReceived)}
        self.assertEqual(heads[1][b":status"], b"408")
        self.assertNotIn(3, heads)
        self.assertFalse(self.transport_closed(c))
        c.conn.send_data(3, b"890", end_stream=True)
        c.flush()
        sent = h.conns[-1].sent()
        self.assertIn(b"POST /up ", sent)
        self.assertTrue(sent.endswith(b"1234567890"))
        self.assertEqual(len(h.conns), 1)  # stream 1 never went upstream
        self.assertEqual([d for d in h.clock.getDelayedCalls() if getattr(d.func, "__name__", "") == "_body_check"], [])
        c.get(5)  # the connection still serves
        self.assertIn(b"GET /x ", h.conns[-1].sent())

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


    def test_several_streams_at_once(self) -> None:
        """Three streams in flight, answered in reverse order: each body on
        its own stream, whole."""
        h = Harness()
        c = H2Client(h)
        for sid in (1, 3, 5):
            c.conn.send_headers(sid, [(b":method", b"GET"), (b":path", b"/p%d" % sid), (b":scheme", b"https"),
                                      (b":authority", b"a")], end_stream=True)
        c.flush()
        self.assertEqual(len(h.conns), 3)
        events: list[Any] = []
        for conn in reversed(h.conns):
            path = conn.sent().split(b" ")[1]
            answer = b"answer for " + path
            conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer))
            events += c.flush()
        for sid in (1, 3, 5):
            self.assertEqual(body(events, sid), b"answer for /p%d" % sid)
            self.assertTrue(ended(events, sid))

    def test_connection_specific_fields_never_reach_the_client(self) -> None:
        """Keep-Alive, Connection and the fields Connection names are left
        out of the HTTP/2 head; an ordinary field passes; the request's
        cookie crumbs reach the origin joined in one Cookie field."""
        h = Harness()
        c = H2Client(h)
        c.get(1, extra=[(b"cookie", b"a=1"), (b"cookie", b"b=2")])
        sent = h.conns[-1].sent()
        self.assertIn(b"\r\ncookie: a=1; b=2\r\n", sent.lower())
        h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nConnection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n"
                          b"X-Kept: yes\r\nContent-Length: 2\r\n\r\nok")
        [head] = [e for e in c.flush() if isinstance(e, h2.events.ResponseReceived)]
        names = [n for n, _ in head.headers]
        self.assertIn(b"x-kept", names)
        for name in (b"connection", b"x-hop", b"keep-alive", b"transfer-encoding"):
            self.assertNotIn(name, names)


class FlowControlTests(SynchronousTestCase):
    def test_closed_window_pauses_upstream_and_nothing_spins(self) -> None:
        """Stream 1's window (1000 bytes) stays closed: its upstream is
        paused after a bounded amount, nothing is due on the reactor, the
        clock can run without a byte more being sent; stream 3 beside it
        completes.  Opening the window resumes the upstream and the body
        arrives whole."""
        h = Harness()
        c = H2Client(h, window=1000)
        c.get(1, b"/big")
        c.get(3, b"/small")
        big, small = h.conns
        big.sent()
        small.sent()
        total = 1024 * 1024
        big.reply(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n" % total)
        fed = 0
        events: list[Any] = []
        while not big.paused and fed < total:
            big.reply(b"b" * 16384)
            fed += 16384
            events += c.flush()
        self.assertTrue(big.paused)
        self.assertLessEqual(fed, 128 * 1024)
        self.assertEqual(len(body(events, 1)), 1000)
        small.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmall")
        events = c.flush()
        self.assertEqual(body(events, 3), b"small")
        self.assertTrue(ended(events, 3))
        self.assertEqual(due_now(h), [])
        h.clock.advance(1)
        h.clock.advance(0)
        self.assertEqual(c.transport.value(), b"")
        self.assertEqual(due_now(h), [])
        self.assertTrue(big.paused)
        # The client opens the window wide: the rest flows.
        c.ack = True
        c.conn.increment_flow_control_window(total, stream_id=1)
        received = 1000
        for _ in range(400):
            events = c.flush()
            received += len(body(events, 1))
            if ended(events, 1):
                break
            if not big.paused and fed < total:
                piece = min(65536, total - fed)
                big.reply(b"b" * piece)
                fed += piece
        self.assertEqual(received, total)

    def test_transport_backpressure_pauses_every_stream(self) -> None:
        """When the client's transport buffer fills (pauseProducing on the
        connection), every stream's upstream pauses; resumeProducing
        resumes them."""
        h = Harness()
        c = H2Client(h)
        c.get(1)
        c.get(3)
        for conn in h.conns:
            conn.sent()
            conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\nxx")
        c.flush()
        self.assertFalse(any(conn.paused for conn in h.conns))
        c.transport.producer.pauseProducing()
        self.assertTrue(all(conn.paused for conn in h.conns))
        for conn in h.conns:
            conn.reply(b"y" * 1000)
        self.assertEqual(c.transport.value(), b"")
        c.transport.producer.resumeProducing()
        self.assertFalse(any(conn.paused for conn in h.conns))
        events = c.flush()
        self.assertEqual(len(body(events, 1)) + len(body(events, 3)), 2000)


class TrailerTests(SynchronousTestCase):
    def test_rewrite_timing_as_trailers(self) -> None:
        """A rewritten, streamed answer announces ``Trailer: Server-Timing``
        and ends with the rewrite's Server-Timing in HTTP/2 trailers."""
        h = harness()
        c = H2Client(h)
        c.get(1, b"/")
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.reply(b"%x\r\n%s\r\n0\r\n\r\n" % (len(PAGE), PAGE))
        h.settle()
        events = c.flush()
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        self.assertIn((b"trailer", b"Server-Timing"), head.headers)
        self.assertEqual(body(events, 1), REWRITTEN)
        [trailers] = [e for e in events if isinstance(e, h2.events.TrailersReceived)]
        [(name, value)] = trailers.headers
        self.assertEqual(name, b"server-timing")
        self.assertRegex(value, rb'^rewrite;dur=[\d.]+, rewrite-rules;desc="2 matched of 2 run"$')
        self.assertTrue(ended(events, 1))


class AbuseTests(SynchronousTestCase):
    def test_rapid_reset(self) -> None:
        """Streams opened and reset at once (CVE-2023-44487): past
        max_resets the connection gets GOAWAY ENHANCE_YOUR_CALM and is
        closed; no upstream request was started for a stream reset in the
        read that opened it."""
        h = Harness()
        c = H2Client(h)
        data = b""
        for i in range(300):
            sid = 1 + 2 * i
            c.conn.send_headers(sid, [(b":method", b"GET"), (b":path", b"/r"), (b":scheme", b"https"),
                                      (b":authority", b"a")], end_stream=True)
            c.conn.reset_stream(sid)
            data += c.conn.data_to_send()
        for at in range(0, len(data), 4096):
            if c.transport.disconnecting:
                break
            c.server.dataReceived(data[at : at + 4096])
        self.assertTrue(c.transport.disconnecting)
        [goaway] = [f for f in frames(c.transport.value()) if isinstance(f, GoAwayFrame)]
        self.assertEqual(goaway.error_code, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
        self.assertEqual(h.conns, [])

    def test_idle_connection_closed(self) -> None:
        """No stream and nothing received for idle_timeout: GOAWAY, close."""
        h = Harness()
        c = H2Client(h)
        h.clock.advance(74)
        self.assertFalse(c.transport.disconnecting)
        h.clock.advance(1.5)
        self.assertTrue(c.transport.disconnecting)
        [goaway] = [f for f in frames(c.transport.value()) if isinstance(f, GoAwayFrame)]
        self.assertEqual(goaway.error_code, 0)
        self.assertEqual(h.clock.getDelayedCalls(), [])


class DrainTests(SynchronousTestCase):
    def test_goaway_lets_the_stream_in_flight_finish(self) -> None:
        """A graceful stop (``close_idle_connections``): GOAWAY naming
        stream 1 at once, stream 1's answer still arrives whole, then the
        connection closes."""
        h = Harness()
        c = H2Client(h)
        c.get(1)
        conn = h.conns[-1]
        conn.sent()
        h.site.close_idle_connections()
        out = frames(c.transport.value())
        c.transport.clear()
        [goaway] = [f for f in out if isinstance(f, GoAwayFrame)]
        self.assertEqual((goaway.last_stream_id, goaway.error_code), (1, 0))
        self.assertFalse(c.transport.disconnecting)
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
        h.settle()
        data = [f for f in frames(c.transport.value()) if isinstance(f, DataFrame)]
        self.assertEqual(b"".join(f.data for f in data), b"done")
        self.assertIn("END_STREAM", data[-1].flags)
        self.assertTrue(c.transport.disconnecting)
        self.assertEqual(due_now(h), [])


class PriorKnowledgeTests(SynchronousTestCase):
    def connect(self, h: Harness) -> tuple[Any, ClosingTransport]:
        protocol = PriorKnowledgeFactory(h.site).buildProtocol(IPv4Address("TCP", "10.1.2.3", 5555))
        transport = new_transport()
        transport.protocol = protocol
        protocol.makeConnection(transport)
        return protocol, transport

    def test_preface_speaks_http2(self) -> None:
        """A cleartext connection starting with the preface (fed one byte
        at a time) is served over HTTP/2."""
        h = Harness()
        protocol, transport = self.connect(h)
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        client.initiate_connection()
        client.send_headers(1, [(b":method", b"GET"), (b":path", b"/c"), (b":scheme", b"http"),
                                (b":authority", b"a")], end_stream=True)
        data = client.data_to_send()
        self.assertTrue(data.startswith(PREFACE))
        for i in range(len(data)):
            protocol.dataReceived(data[i : i + 1])
        self.assertIn(b"GET /c HTTP/1.1\r\n", h.conns[-1].sent())
        h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nh2")
        h.settle()  # written at the end of the turn
        events = client.receive_data(transport.value())
        self.assertEqual(body(events, 1), b"h2")

    def test_http11_still_served(self) -> None:
        """Anything else on that listener is HTTP/1.1."""
        h = Harness()
        protocol, transport = self.connect(h)
        protocol.dataReceived(b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertIn(b"GET /one HTTP/1.1\r\n", h.conns[-1].sent())
        h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nh1")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"))


class RefusalTests(SynchronousTestCase):
    def test_bad_target_answered_400_never_forwarded(self) -> None:
        """A :path with a space (it would break the upstream's HTTP/1.1
        request line) gets a 400 on its stream; nothing reaches the origin;
        the connection goes on serving."""
        h = Harness()
        c = H2Client(h)
        events = c.get(1, b"/a b")
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        self.assertEqual(dict(head.headers)[b":status"], b"400")
        self.assertEqual(h.conns, [])
        c.get(3, b"/ok")
        self.assertIn(b"GET /ok HTTP/1.1\r\n", h.conns[-1].sent())


    def test_too_many_fields_answered_431_on_the_stream(self) -> None:
        """A header list of 101 fields (``:authority`` is the Host) gets 431
        on its stream, counted like an HTTP/1.1 refusal; 100 are forwarded;
        the connection goes on."""
        h = Harness()
        c = H2Client(h)
        fields = [(b"x-%d" % i, b"v") for i in range(99)]
        events = c.get(1, b"/many", extra=[*fields, (b"x-99", b"v")])
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        self.assertEqual(dict(head.headers)[b":status"], b"431")
        self.assertEqual(body(events, 1), b"431 Request Header Fields Too Large\n")  # the reason goes to the log
        self.assertEqual(h.conns, [])
        self.assertEqual(h.metrics.counters[("prexy_requests_total", (("status", "431"),))], 1)
        c.get(3, b"/ok", extra=fields)
        sent = h.conns[-1].sent()
        self.assertIn(b"GET /ok HTTP/1.1\r\n", sent)
        self.assertIn(b"x-98: v\r\n", sent.lower())

    def test_field_limit_comes_from_the_site(self) -> None:
        h = Harness()
        h.site.limits = Limits(max_header_lines=5)
        c = H2Client(h)
        events = c.get(1, b"/five", extra=[(b"x-%d" % i, b"v") for i in range(5)])
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        self.assertEqual(dict(head.headers)[b":status"], b"431")
        c.get(3, b"/four", extra=[(b"x-%d" % i, b"v") for i in range(4)])
        self.assertIn(b"GET /four HTTP/1.1\r\n", h.conns[-1].sent())


class UploadTests(SynchronousTestCase):
    def test_body_larger_than_the_window_arrives_whole(self) -> None:
        """A 300 KB POST body (over the 64 KB initial windows): the server
        returns the credit as it reads, the client sends it all, and the
        origin gets the whole body after the head, with its length."""
        h = Harness()
        c = H2Client(h)
        payload = bytes(range(256)) * 1200
        c.conn.send_headers(1, [(b":method", b"POST"), (b":path", b"/up"), (b":scheme", b"https"),
                                (b":authority", b"a"), (b"content-length", b"%d" % len(payload))])
        sent = 0
        for _ in range(100):
            window = min(c.conn.local_flow_control_window(1), c.conn.max_outbound_frame_size)
            piece = payload[sent : sent + window]
            if piece:
                sent += len(piece)
                c.conn.send_data(1, piece, end_stream=sent == len(payload))
            c.flush()
            if sent == len(payload):
                break
        self.assertEqual(sent, len(payload))
        origin = h.conns[-1]
        upstream = origin.sent()
        while origin.transport.producer is not None:  # the spooled body, pulled a piece at a time
            origin.transport.producer.resumeProducing()
            upstream += origin.sent()
        head, _, body = upstream.partition(b"\r\n\r\n")
        self.assertIn(b"POST /up HTTP/1.1\r\n", head)
        self.assertIn(b"\r\ncontent-length: %d" % len(payload), head.lower())
        self.assertEqual(body, payload)


class ShellFuzzTests(SynchronousTestCase):
    @settings(max_examples=150, deadline=None)
    @given(st.data())
    def test_mutated_client_bytes_never_raise(self, data: st.DataObject) -> None:
        """Mutated client bytes through the whole connection (requests,
        their answers from the origin): nothing raises out of
        dataReceived; the connection serves or closes."""
        h = Harness()
        c = H2Client(h)
        c.conn.send_headers(1, [(b":method", b"POST"), (b":path", b"/p?q=1"), (b":scheme", b"https"),
                                (b":authority", b"a"), (b"content-length", b"4"), (b"cookie", b"a=1")])
        c.conn.send_data(1, b"body", end_stream=True)
        c.conn.send_headers(3, [(b":method", b"GET"), (b":path", b"/g"), (b":scheme", b"https"),
                                (b":authority", b"a")], end_stream=True)
        raw = bytearray(c.conn.data_to_send())
        for _ in range(data.draw(st.integers(0, 6))):
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] = data.draw(st.integers(0, 255))
        step = data.draw(st.integers(1, len(raw)))
        for at in range(0, len(raw), step):
            if c.transport.disconnecting:
                break
            c.server.dataReceived(bytes(raw[at : at + step]))
        for conn in h.conns:
            conn.reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        h.settle()
        h.clock.advance(100)


class EarlyHintsTests(SynchronousTestCase):
    def test_103_before_the_answer(self) -> None:
        """A 103 Early Hints from the upstream reaches an HTTP/2 client as an
        informational head (after the header rules) before the 200."""
        from .test_header_rules import harness as rules_harness

        h = rules_harness(b"replace_filter 'www\\.origin\\.test' 'clone.test' g;\nreplace_filter_headers Link;\n")
        c = H2Client(h)
        c.get(1)
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 103 Early Hints\r\nLink: <https://www.origin.test/a.css>; rel=preload\r\n\r\n")
        events = c.flush()
        [hints] = [e for e in events if isinstance(e, h2.events.InformationalResponseReceived)]
        self.assertEqual(hints.headers, [(b":status", b"103"), (b"link", b"<https://clone.test/a.css>; rel=preload")])
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
        events = c.flush()
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        self.assertEqual(dict(head.headers)[b":status"], b"200")
        self.assertEqual(body(events, 1), b"ok")


class UnreadTests(SynchronousTestCase):
    def test_a_client_that_reads_nothing_cannot_fill_memory_with_resets(self) -> None:
        """While the client's socket is full, frames on a closed stream make
        the server answer RST_STREAM each time; past the budget of bytes
        written while paused, the connection is aborted."""
        h = Harness()
        c = H2Client(h)
        c.server.unread_budget = 2000
        c.get(1)
        h.conns[-1].sent()
        h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        c.flush()
        c.transport.producer.pauseProducing()
        for _ in range(400):
            if c.transport.disconnecting:
                break
            c.server.dataReceived(DataFrame(1, b"x").serialize())
        self.assertTrue(c.transport.aborted)
