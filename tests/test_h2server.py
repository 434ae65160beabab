"""The HTTP/2 server core (``prexy.h2server``) against an ``h2`` client, no
I/O: requests arrive as events whole, byte by byte and in any chunking;
answers are framed in round robin within the flow-control windows, a
stream whose window is closed is sent nothing until its WINDOW_UPDATE;
trailers end a stream; the flood limits answer GOAWAY ENHANCE_YOUR_CALM;
a graceful GOAWAY lets open streams finish and refuses new ones."""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    RstStreamFrame,
    WindowUpdateFrame,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import ConfigError, parse_config
from prexy.h2server import (
    Body,
    Close,
    End,
    H2Settings,
    Head,
    Reset,
    ServerConnection,
    check_request,
    request_fields,
    response_fields,
)

GET = [(b":method", b"GET"), (b":path", b"/x"), (b":scheme", b"https"), (b":authority", b"a.test")]


def post(length: int) -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":path", b"/up"), (b":scheme", b"https"), (b":authority", b"a.test"),
            (b"content-length", b"%d" % length)]


class Pair:
    """A server core and an h2 client, bytes passed by hand."""

    def __init__(self, limits: H2Settings | None = None, window: int | None = None) -> None:
        self.server = ServerConnection(limits or H2Settings())
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        if window is not None:
            self.client.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
            )
        self.client.initiate_connection()
        self.now = 0.0
        self.events: list[Any] = []
        self.to_client()
        self.to_server()
        self.to_client()

    def to_server(self, split: int | None = None) -> list[Any]:
        data = self.client.data_to_send()
        if split is None:
            self.events += self.server.receive(data, self.now)
        else:
            for i in range(0, len(data), split):
                self.events += self.server.receive(data[i : i + split], self.now)
        return self.events

    def to_client(self) -> list[Any]:
        return self.client.receive_data(self.server.data_to_send())

    def take(self) -> list[Any]:
        events, self.events = self.events, []
        return events


def body_of(events: list[Any], sid: int) -> bytes:
    return b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived) and e.stream_id == sid)


class RequestEventTests(SynchronousTestCase):
    def test_get_whole(self) -> None:
        """A GET comes as one Head that ends the request; the authority
        stays a pseudo-field for the shell."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        events = p.to_server()
        self.assertEqual(events, [Head(1, GET, True)])
        self.assertEqual(p.server.open, {1})

    def test_post_byte_by_byte(self) -> None:
        """A POST fed one byte at a time: its head, every byte of the body
        and its end, in order; the body's credit goes back to the client."""
        p = Pair()
        p.client.send_headers(1, post(5))
        p.client.send_data(1, b"hello", end_stream=True)
        events = p.to_server(split=1)
        self.assertEqual(events[0], Head(1, post(5), False))
        self.assertEqual(b"".join(e.data for e in events if isinstance(e, Body)), b"hello")
        self.assertEqual(events[-1], End(1))
        before = p.client.remote_flow_control_window(1)
        p.to_client()
        self.assertGreaterEqual(p.client.remote_flow_control_window(1), before)

    def test_trailing_bytes_of_the_next_request(self) -> None:
        """Two requests in one read, the second cut in the middle: the first
        comes whole, the second once its last bytes do."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        p.client.send_headers(3, GET, end_stream=True)
        data = p.client.data_to_send()
        cut = len(data) - 3
        self.assertEqual(p.server.receive(data[:cut], 0), [Head(1, GET, True)])
        self.assertEqual(p.server.receive(data[cut:], 0), [Head(3, GET, True)])

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30))
    def test_any_chunking_same_events(self, cuts: list[int]) -> None:
        """However the client's bytes are split, the events are the same."""
        p = Pair()
        p.client.send_headers(1, post(300))
        p.client.send_data(1, b"a" * 300, end_stream=True)
        p.client.send_headers(3, GET, end_stream=True)
        data = p.client.data_to_send()
        whole = Pair()
        whole.client.send_headers(1, post(300))
        whole.client.send_data(1, b"a" * 300, end_stream=True)
        whole.client.send_headers(3, GET, end_stream=True)
        expected = whole.to_server()
        events: list[Any] = []
        at = 0
        for cut in cuts:
            events += p.server.receive(data[at : at + cut], 0)
            at += cut
        events += p.server.receive(data[at:], 0)
        joined = [e for e in events if not isinstance(e, Body)]
        self.assertEqual(joined, [e for e in expected if not isinstance(e, Body)])
        self.assertEqual(b"".join(e.data for e in events if isinstance(e, Body)), b"a" * 300)

    def test_client_reset(self) -> None:
        """A client's RST_STREAM on an open stream is a Reset event."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        p.take()
        p.client.reset_stream(1, h2.errors.ErrorCodes.CANCEL)
        self.assertEqual(p.to_server(), [Reset(1, h2.errors.ErrorCodes.CANCEL)])
        self.assertEqual(p.server.open, set())

    def test_opened_and_reset_in_one_read_never_starts(self) -> None:
        """A stream opened and reset in the same read (the rapid-reset
        pattern) gives no event at all: no request is started."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        p.client.reset_stream(1)
        self.assertEqual(p.to_server(), [])


class SendTests(SynchronousTestCase):
    def answer(self, p: Pair, sid: int, body: bytes, end: bool = True) -> None:
        p.server.send_head(sid, [(b":status", b"200")])
        p.server.send_data(sid, body)
        if end:
            p.server.end(sid)

    def test_answer_whole(self) -> None:
        """Head, body and end arrive whole; the stream is then forgotten."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        self.answer(p, 1, b"x" * 40000)
        self.assertFalse(p.server.pump())
        events = p.to_client()
        self.assertEqual(body_of(events, 1), b"x" * 40000)
        self.assertTrue(any(isinstance(e, h2.events.StreamEnded) for e in events))
        self.assertEqual((p.server.open, p.server.queued(1)), (set(), 0))

    def test_trailers_end_the_stream(self) -> None:
        """end() with fields sends them as trailers, after the data."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        p.server.send_head(1, [(b":status", b"200"), (b"trailer", b"server-timing")])
        p.server.send_data(1, b"body")
        p.server.end(1, [(b"server-timing", b"rewrite;dur=1.5")])
        p.server.pump()
        events = p.to_client()
        kinds = [type(e).__name__ for e in events if not isinstance(e, h2.events.SettingsAcknowledged)]
        self.assertEqual(kinds, ["ResponseReceived", "DataReceived", "TrailersReceived", "StreamEnded"])
        [trailers] = [e for e in events if isinstance(e, h2.events.TrailersReceived)]
        self.assertEqual(trailers.headers, [(b"server-timing", b"rewrite;dur=1.5")])

    def test_closed_window_sends_nothing_until_update(self) -> None:
        """With a 1000-byte stream window: 1000 bytes go, the rest waits
        queued, pumping again sends nothing (no retry loop needed or
        possible), and a WINDOW_UPDATE lets exactly that much more go."""
        p = Pair(window=1000)
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        self.answer(p, 1, b"y" * 5000)
        p.server.pump()
        self.assertEqual(len(body_of(p.to_client(), 1)), 1000)
        self.assertEqual(p.server.queued(1), 4000)
        for _ in range(3):
            self.assertFalse(p.server.pump())
            self.assertEqual(p.server.data_to_send(), b"")
        p.client.increment_flow_control_window(1500, stream_id=1)
        p.to_server()
        p.server.pump()
        self.assertEqual(len(body_of(p.to_client(), 1)), 1500)
        self.assertEqual(p.server.queued(1), 2500)

    def test_stalled_stream_does_not_stall_another(self) -> None:
        """Stream 1's window is closed; stream 3, with its window opened by
        the client, is sent whole."""
        p = Pair(window=100)
        p.client.send_headers(1, GET, end_stream=True)
        p.client.send_headers(3, GET, end_stream=True)
        p.to_server()
        self.answer(p, 1, b"s" * 1000)
        self.answer(p, 3, b"f" * 300)
        p.server.pump()
        p.to_client()
        p.client.increment_flow_control_window(1000, stream_id=3)
        p.to_server()
        p.server.pump()
        events = p.to_client()
        self.assertEqual(body_of(events, 3), b"f" * 200)
        self.assertTrue(any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 3 for e in events))
        self.assertEqual(p.server.queued(1), 900)
        self.assertEqual(p.server.take_drained(), [3])

    def test_round_robin(self) -> None:
        """Two streams with three frames each are framed alternately."""
        p = Pair(window=1 << 20)
        p.client.increment_flow_control_window(1 << 20)
        p.client.send_headers(1, GET, end_stream=True)
        p.client.send_headers(3, GET, end_stream=True)
        p.to_server()
        self.answer(p, 1, b"a" * 3 * 16384)
        self.answer(p, 3, b"b" * 3 * 16384)
        p.server.pump()
        order = [e.stream_id for e in p.to_client() if isinstance(e, h2.events.DataReceived)]
        self.assertEqual(order, [1, 3, 1, 3, 1, 3])

    def test_budget_stops_a_pump(self) -> None:
        """pump() stops near its budget and says there is more."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        self.answer(p, 1, b"z" * 50000)
        self.assertTrue(p.server.pump(budget=20000))
        self.assertEqual(p.server.queued(1), 50000 - 2 * 16384)
        self.assertFalse(p.server.pump())

    def test_connection_window(self) -> None:
        """When the connection's window (65535) is spent, streams wait in
        order and go on after a connection WINDOW_UPDATE."""
        p = Pair(window=1 << 20)
        for sid in (1, 3):
            p.client.send_headers(sid, GET, end_stream=True)
        p.to_server()
        self.answer(p, 1, b"a" * 60000)
        self.answer(p, 3, b"b" * 60000)
        p.server.pump()
        events = p.to_client()
        self.assertEqual(len(body_of(events, 1)) + len(body_of(events, 3)), 65535)
        p.client.increment_flow_control_window(1 << 20)
        p.to_server()
        p.server.pump()
        events = p.to_client()
        self.assertEqual(len(body_of(events, 1)) + len(body_of(events, 3)), 120000 - 65535)

    def test_reset_drops_the_queue(self) -> None:
        """reset() sends RST_STREAM and forgets what was queued beyond the
        window."""
        p = Pair(window=10)
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        self.answer(p, 1, b"q" * 100, end=False)
        p.server.pump()
        p.server.reset(1)
        self.assertEqual(p.server.queued(1), 0)
        events = p.to_client()
        self.assertEqual(body_of(events, 1), b"q" * 10)
        self.assertFalse(any(isinstance(e, h2.events.StreamEnded) for e in events))
        self.assertTrue(any(isinstance(e, h2.events.StreamReset) for e in events))

    def test_reset_sends_what_fits_first(self) -> None:
        """A short answer queued and not yet pumped (a 413 before the reset
        that stops an upload) goes out before the RST_STREAM."""
        p = Pair()
        p.client.send_headers(1, post(10**6))
        p.to_server()
        self.answer(p, 1, b"413 too large", end=False)
        p.server.reset(1, h2.errors.ErrorCodes.NO_ERROR)
        events = p.to_client()
        self.assertEqual(body_of(events, 1), b"413 too large")
        self.assertIsInstance(events[-1], h2.events.StreamReset)


class LimitTests(SynchronousTestCase):
    def goaway(self, p: Pair) -> Any:
        [event] = [e for e in p.to_client() if isinstance(e, h2.events.ConnectionTerminated)]
        return event

    def test_rapid_reset(self) -> None:
        """More than max_resets RST_STREAMs within the window: GOAWAY
        ENHANCE_YOUR_CALM and Close; no request was started."""
        p = Pair(H2Settings(max_resets=10))
        closed = []
        for i in range(11):
            sid = 1 + 2 * i
            p.client.send_headers(sid, GET, end_stream=True)
            p.client.reset_stream(sid)
            closed = [e for e in p.to_server() if isinstance(e, Close)]
        self.assertEqual(len(closed), 1)
        self.assertFalse(any(isinstance(e, Head) for e in p.events))
        self.assertEqual(self.goaway(p).error_code, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def test_navigation_resets_are_fine(self) -> None:
        """A browser's pattern (each page's assets partly answered, the
        rest reset when it navigates away), far more resets in the window
        than max_resets: answers sent whole offset them, no GOAWAY; the
        same resets with no answer between them trip the cap."""
        p = Pair(H2Settings(max_resets=20))
        sid = 1
        for _page in range(30):
            pending = []
            for _k in range(10):
                p.client.send_headers(sid, GET, end_stream=True)
                pending.append(sid)
                sid += 2
            p.to_server()
            for done in pending[:6]:
                p.server.send_head(done, [(b":status", b"200")])
                p.server.send_data(done, b"asset")
                p.server.end(done)
            p.server.pump()
            p.to_client()
            for gone in pending[6:]:
                p.client.reset_stream(gone)
            p.to_server()
        self.assertIsNone(p.server.closed)
        for _k in range(21):
            p.client.send_headers(sid, GET, end_stream=True)
            p.client.reset_stream(sid)
            sid += 2
            p.to_server()
        self.assertIsNotNone(p.server.closed)

    def test_resets_spread_out_are_fine(self) -> None:
        """The same resets spread over more than the window are allowed."""
        p = Pair(H2Settings(max_resets=10, flood_window=1.0))
        for i in range(30):
            p.now = i * 0.2
            sid = 1 + 2 * i
            p.client.send_headers(sid, GET, end_stream=True)
            p.to_server()
            p.client.reset_stream(sid)
            p.to_server()
        self.assertIsNone(p.server.closed)

    def test_ping_flood(self) -> None:
        p = Pair(H2Settings(max_pings=5))
        for i in range(6):
            p.client.ping(b"%08d" % i)
        p.to_server()
        self.assertEqual(p.server.closed, Close("too many PING frames", graceful=False))
        self.assertEqual(self.goaway(p).error_code, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def test_empty_data_flood(self) -> None:
        """DATA frames that carry nothing and end nothing, past
        max_empty_frames within the window: GOAWAY ENHANCE_YOUR_CALM; a
        body's last empty frame (END_STREAM) is not one of them."""
        p = Pair(H2Settings(max_empty_frames=5))
        p.client.send_headers(1, post(10), end_stream=False)
        p.client.send_data(1, b"0123456789")
        for _ in range(5):
            p.client.send_data(1, b"")
        p.client.end_stream(1)
        p.to_server()
        self.assertIsNone(p.server.closed)
        p.client.send_headers(3, post(10), end_stream=False)
        for _ in range(6):
            p.client.send_data(3, b"")
        p.to_server()
        self.assertEqual(p.server.closed, Close("too many empty DATA frames", graceful=False))
        self.assertEqual(self.goaway(p).error_code, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def test_settings_flood(self) -> None:
        p = Pair(H2Settings(max_settings=5))
        for _ in range(6):
            p.client.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 10})
        p.to_server()
        self.assertEqual(p.server.closed, Close("too many SETTINGS frames", graceful=False))

    def test_header_list_too_large(self) -> None:
        """A request head above max_header_list_size closes the connection
        with ENHANCE_YOUR_CALM."""
        p = Pair(H2Settings(max_header_list_size=2048))
        p.client.send_headers(1, GET + [(b"x-big", b"v" * 4000)], end_stream=True)
        events = p.to_server()
        self.assertIsInstance(events[-1], Close)
        self.assertEqual(self.goaway(p).error_code, h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)

    def test_continuation_flood(self) -> None:
        """A head that never ends (CONTINUATION after CONTINUATION, the 2024
        "CONTINUATION flood"): the connection is closed after h2's backlog
        of 64 frames, holding at most about 1 MB."""
        p = Pair()
        frames_ = HeadersFrame(1, b"\x82").serialize()  # :method GET, no END_HEADERS
        for _ in range(70):
            frames_ += ContinuationFrame(1, b"\x40\x01a\x01b").serialize()
        events = p.server.receive(frames_, 0)
        self.assertIsInstance(events[-1], Close)
        self.assertFalse(any(isinstance(e, Head) for e in events))

    def test_settings_advertised(self) -> None:
        """The client learns the stream and header-list limits."""
        p = Pair(H2Settings(max_concurrent_streams=7, max_header_list_size=9999))
        self.assertEqual(p.client.remote_settings.max_concurrent_streams, 7)
        self.assertEqual(p.client.remote_settings.max_header_list_size, 9999)

    def test_protocol_error(self) -> None:
        """Garbage after the preface: GOAWAY PROTOCOL_ERROR and Close."""
        p = Pair()
        events = p.server.receive(b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x", 0)  # DATA on stream 0
        self.assertIsInstance(events[-1], Close)
        self.assertEqual(self.goaway(p).error_code, h2.errors.ErrorCodes.PROTOCOL_ERROR)


def frames(data: bytes) -> list[Any]:
    """The frames in ``data`` (hyperframe: the h2 client state machine
    accepts nothing after a GOAWAY, where a real client goes on reading
    the streams it named)."""
    out = []
    while data:
        frame, length = Frame.parse_frame_header(memoryview(data[:9]))
        frame.parse_body(memoryview(data[9 : 9 + length]))
        out.append(frame)
        data = data[9 + length :]
    return out


class DrainTests(SynchronousTestCase):
    def test_goaway_lets_open_streams_finish(self) -> None:
        """drain(): GOAWAY naming stream 1; stream 3 opened later is refused
        (REFUSED_STREAM); stream 1 still takes WINDOW_UPDATEs and gets its
        whole answer; Close (graceful) once it ended."""
        p = Pair(window=100)
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        p.take()
        self.assertEqual(p.server.drain(), [])
        [goaway] = [f for f in frames(p.server.data_to_send()) if isinstance(f, GoAwayFrame)]
        self.assertEqual((goaway.last_stream_id, goaway.error_code), (1, 0))
        p.client.send_headers(3, GET, end_stream=True)
        self.assertEqual(p.to_server(), [])
        [refused] = [f for f in frames(p.server.data_to_send()) if isinstance(f, RstStreamFrame)]
        self.assertEqual((refused.stream_id, refused.error_code), (3, h2.errors.ErrorCodes.REFUSED_STREAM))
        p.server.send_head(1, [(b":status", b"200")])
        p.server.send_data(1, b"d" * 300)
        p.server.end(1)
        p.server.pump()
        sent = [f for f in frames(p.server.data_to_send()) if isinstance(f, DataFrame)]
        self.assertEqual(sum(len(f.data) for f in sent), 100)
        self.assertIsNone(p.server.closed)
        update = WindowUpdateFrame(1, window_increment=1000)
        self.assertEqual(p.server.receive(update.serialize(), 0), [])
        p.server.pump()
        sent = [f for f in frames(p.server.data_to_send()) if isinstance(f, DataFrame)]
        self.assertEqual(sum(len(f.data) for f in sent), 200)
        self.assertIn("END_STREAM", sent[-1].flags)
        self.assertEqual(p.server.closed, Close("drained", graceful=True))

    def test_drain_with_nothing_open_closes_at_once(self) -> None:
        p = Pair()
        self.assertEqual(p.server.drain(), [Close("drained", graceful=True)])

    def test_idle(self) -> None:
        """idle(): GOAWAY NO_ERROR, a graceful Close."""
        p = Pair()
        self.assertEqual(p.server.idle(), Close("idle timeout", graceful=True))
        [goaway] = [e for e in p.to_client() if isinstance(e, h2.events.ConnectionTerminated)]
        self.assertEqual(goaway.error_code, 0)


class EarlyAnswerTests(SynchronousTestCase):
    def test_answer_before_the_body_ends(self) -> None:
        """An answer complete while the request body is still coming: the
        stream ends, then RST_STREAM NO_ERROR tells the client to stop
        sending; later DATA for it gives no event."""
        p = Pair()
        p.client.send_headers(1, post(100))
        p.client.send_data(1, b"x" * 10)
        p.to_server()
        p.take()
        p.server.send_head(1, [(b":status", b"413")])
        p.server.end(1)
        p.server.pump()
        events = p.to_client()
        self.assertTrue(any(isinstance(e, h2.events.StreamEnded) for e in events))
        [reset] = [e for e in events if isinstance(e, h2.events.StreamReset)]
        self.assertEqual(reset.error_code, h2.errors.ErrorCodes.NO_ERROR)
        self.assertEqual(p.server.open, set())


SITE = '\n[sites.a]\nupstream = "http://127.0.0.1:8000"\n'


class ConfigTests(SynchronousTestCase):
    """The [http2] table and [server] h2c_listen: accepted, and refused with
    file, line and key."""

    def test_defaults(self) -> None:
        config = parse_config(SITE, "/etc/prexy.toml")
        self.assertEqual((config.http2_settings, config.h2c_listen), (H2Settings(), ()))

    def test_values(self) -> None:
        config = parse_config(
            '[server]\nlisten = ["tcp:8080", "tcp:8081"]\nh2c_listen = "tcp:8081"\n'
            '[http2]\nmax_concurrent_streams = 10\nmax_header_list_size = "16k"\nidle_timeout = 5\n'
            "max_resets = 50\nmax_settings = 7\nmax_pings = 9\nflood_window = 2.5\nmax_empty_frames = 3\n" + SITE,
            "/etc/prexy.toml",
        )
        self.assertEqual(config.http2_settings, H2Settings(10, 16384, 5.0, 50, 7, 9, 2.5, 3))
        self.assertEqual(config.h2c_listen, ("tcp:8081",))

    def test_refused(self) -> None:
        cases = [
            ("[http2]\nmax_resets = 0\n", 2, "http2.max_resets: must be from 1 to 2147483647"),
            ("[http2]\nmax_concurrent_streams = true\n", 2, "http2.max_concurrent_streams: must be a int"),
            ("[http2]\nfoo = 1\n", 2, "http2.foo: unknown key"),
            ("[http2]\n\nflood_window = 0\n", 3, "http2.flood_window: must be more than 0 seconds"),
            ("[http2]\nidle_timeout = -1\n", 2, "http2.idle_timeout: must be 0 (off) or more seconds"),
            ("[http2]\nmax_header_list_size = \"100\"\n", 2, "http2.max_header_list_size: must be from 1k to 2G"),
            ("http2 = 3\n", 1, "http2: must be a table"),
            ('[server]\nlisten = ["tcp:8080"]\nh2c_listen = ["tcp:9"]\n', 3,
             "server.h2c_listen: 'tcp:9' is not one of server.listen"),
            ('[server]\nlisten = ["ssl:8443:privateKey=k.pem"]\nh2c_listen = ["ssl:8443:privateKey=k.pem"]\n', 3,
             "server.h2c_listen: 'ssl:8443:privateKey=k.pem': h2c is cleartext HTTP/2"),
            ('[server]\nh2c_listen = 5\n', 2, "server.h2c_listen: must be a list of endpoint strings"),
        ]
        for text, line, message in cases:
            with self.assertRaises(ConfigError) as caught:
                parse_config(text + SITE, "/etc/prexy.toml")
            self.assertIn(f"/etc/prexy.toml:{line}: {message}", str(caught.exception), text)


class CheckRequestTests(SynchronousTestCase):
    """``check_request``: an HTTP/2 head is forwarded only if it fits the
    HTTP/1.1 gate's rules."""

    def test_ordinary_heads_pass(self) -> None:
        for fields in (GET, post(3), GET + [(b"x-a", b"v w"), (b"cookie", b"a=1; b=2")],
                       [(b":method", b"OPTIONS"), (b":path", b"/?q=%20"), (b":scheme", b"https"), (b":authority", b"[::1]:8443")]):
            self.assertIsNone(check_request(fields, 8192), fields)

    def test_refused(self) -> None:
        def head(method: bytes = b"GET", path: bytes | None = b"/x", authority: bytes = b"a.test",
                 extra: tuple[tuple[bytes, bytes], ...] = ()) -> list[tuple[bytes, bytes]]:
            fields = [(b":method", method), (b":scheme", b"https"), (b":authority", authority)]
            if path is not None:
                fields.append((b":path", path))
            return fields + list(extra)

        cases = [
            (head(path=b"/a b"), 400),
            (head(path=b"/a\x01"), 400),
            (head(path=b"/../etc/passwd"), 400),
            (head(path=b"/%2e%2e/x"), 400),
            (head(path=b"/%zz"), 400),
            (head(path=b"*", method=b"OPTIONS"), 400),
            (head(path=b"http://a/x"), 400),
            (head(path=b"/" + b"a" * 9000), 414),
            (head(method=b"get"), 400),
            (head(method=b"G\x00T"), 400),
            (head(method=b"CONNECT", path=None), 501),
            (head(authority=b"a b"), 400),
            (head(authority=b"a.test:http"), 400),
            (head(extra=((b"x a", b"v"),)), 400),
            (head(extra=((b"x-a", b"v\x1fw"),)), 400),
            (head(extra=((b"host", b"a..b"),)), 400),
            (head(extra=((b"host", b"a"), (b"host", b"b"))), 400),
            (head(method=b"POST", extra=((b"content-length", b"-5"),)), 400),
        ]
        for fields, status in cases:
            refusal = check_request(fields, 8192)
            self.assertIsNotNone(refusal, fields)
            assert refusal is not None
            self.assertEqual(refusal[0], status, fields)

    def test_field_count(self) -> None:
        """At most ``max_fields`` header lines once the head is HTTP/1.1:
        pseudo-fields do not count, ``:authority`` counts as the Host unless
        a host field is there too."""
        base = [(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/")]
        many = [(b"x-%d" % i, b"v") for i in range(4)]
        self.assertIsNone(check_request(base + many, 8192, 4))
        self.assertEqual(check_request(base + [*many, (b"x-4", b"v")], 8192, 4), (431, "too many header fields"))
        self.assertEqual(check_request([*base, (b":authority", b"a"), *many], 8192, 4), (431, "too many header fields"))
        self.assertIsNone(check_request([*base, (b":authority", b"a"), *many[:3]], 8192, 4))
        self.assertIsNone(check_request([*base, (b":authority", b"a"), (b"host", b"a"), *many[:3]], 8192, 4))
        self.assertIsNone(check_request(base + [(b"x-%d" % i, b"v") for i in range(100)], 8192))
        self.assertEqual(check_request(base + [(b"x-%d" % i, b"v") for i in range(101)], 8192)[:1], (431,))  # type: ignore[index]

    def test_refusal_answers_on_the_stream(self) -> None:
        """refuse(): the answer it is given, and the stream ends."""
        p = Pair()
        p.client.send_headers(1, GET, end_stream=True)
        p.to_server()
        p.server.refuse(1, 400, b"text/plain; charset=utf-8", b"400 Bad Request\n")
        p.server.pump()
        events = p.to_client()
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        fields = dict(head.headers)
        self.assertEqual((fields[b":status"], fields[b"content-type"]), (b"400", b"text/plain; charset=utf-8"))
        self.assertEqual(body_of(events, 1), b"400 Bad Request\n")
        self.assertEqual(p.server.open, set())


class FuzzTests(SynchronousTestCase):
    """Whatever bytes a client sends, ``receive`` gives events or a Close;
    no exception escapes it."""

    @settings(max_examples=300, deadline=None)
    @given(st.data())
    def test_mutated_client_bytes(self, data: st.DataObject) -> None:
        p = Pair()
        p.client.send_headers(1, post(20) + [(b"x-a", b"b")])
        p.client.send_data(1, b"0123456789" * 2, end_stream=True)
        p.client.send_headers(3, GET, end_stream=True)
        p.client.ping(b"12345678")
        p.client.reset_stream(3)
        raw = bytearray(p.client.data_to_send())
        for _ in range(data.draw(st.integers(0, 8))):
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(raw)))
        events = p.server.receive(bytes(raw[:cut]), 0) + p.server.receive(bytes(raw[cut:]), 0)
        for i, event in enumerate(events):
            if isinstance(event, Close):
                self.assertEqual(i, len(events) - 1)
            if isinstance(event, Head):
                check_request(event.fields, 8192)
        p.server.pump()
        p.server.data_to_send()


class FieldTests(SynchronousTestCase):
    def test_response_fields(self) -> None:
        """Names in lower case, repeated fields kept in order, the
        connection-specific ones and those Connection names left out."""
        fields = response_fields(b"200", [
            (b"Content-Type", [b"text/html"]), (b"Connection", [b"X-Hop, close"]), (b"X-Hop", [b"1"]),
            (b"Set-Cookie", [b"a=1", b"b=2"]), (b"Keep-Alive", [b"timeout=5"]), (b"Transfer-Encoding", [b"chunked"]),
            (b"Upgrade", [b"h2c"]), (b"TE", [b"trailers"]), (b"Proxy-Connection", [b"keep-alive"]), (b"Trailer", [b"x"]),
        ])
        self.assertEqual(fields, [(b":status", b"200"), (b"content-type", b"text/html"), (b"set-cookie", b"a=1"),
                                  (b"set-cookie", b"b=2"), (b"trailer", b"x")])

    def test_request_fields(self) -> None:
        """Method and path out of the pseudo-fields; :authority becomes the
        first Host field and a Host beside it is dropped."""
        method, path, fields = request_fields(GET + [(b"host", b"other"), (b"accept", b"*/*")])
        self.assertEqual((method, path, fields), (b"GET", b"/x", [(b"host", b"a.test"), (b"accept", b"*/*")]))
        method, path, fields = request_fields([(b":method", b"CONNECT"), (b"host", b"h")])
        self.assertEqual((method, path, fields), (b"CONNECT", None, [(b"host", b"h")]))
