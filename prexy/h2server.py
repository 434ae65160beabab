"""The server side of one HTTP/2 connection, without I/O.

Bytes from the client go in (:meth:`ServerConnection.receive`, with the
time, which only the flood limits read); what the proxy must do comes out
as a list of events (a request head, a piece of its body, its end, a
reset); the answers go in by stream (:meth:`ServerConnection.send_head`,
:meth:`~ServerConnection.send_data`, :meth:`~ServerConnection.end`,
:meth:`~ServerConnection.reset`) and the bytes to write come out of
:meth:`ServerConnection.data_to_send`.  The ``h2`` library does the
framing, HPACK and the protocol's state; this module adds what a
production server needs on top of it:

* Flow control as backpressure.  Each stream has a queue of answer bytes;
  :meth:`~ServerConnection.pump` sends from the queues in round robin, one
  frame per stream per turn, as far as the stream's and the connection's
  windows and the ``budget`` allow.  A stream whose window is closed leaves
  the round and is sent nothing until a WINDOW_UPDATE opens it (nothing is
  retried on a timer); its queue stays, and :meth:`~ServerConnection.queued`
  tells the I/O layer to pause the stream's producer.  Streams whose queue
  emptied are listed by :meth:`~ServerConnection.take_drained` (resume their
  producers).
* Trailers: :meth:`~ServerConnection.end` with fields ends the stream with a
  HEADERS frame carrying them.
* Limits (:class:`H2Settings`): concurrent streams and header list size
  (advertised, and enforced by ``h2``), a cap on the client's RST_STREAMs,
  SETTINGS and PINGs within ``flood_window`` seconds (CVE-2023-44487 "rapid
  reset" and the older floods; empty DATA frames, CVE-2019-9518): past one, GOAWAY ENHANCE_YOUR_CALM and the
  :class:`Close` event.  A stream the client resets in the same read that
  opened it is never started.  Each answer sent whole takes one reset off
  the count: a browser cancels the pending assets of a page at every
  navigation, but between two navigations it gets answers, where a
  rapid-reset flood gets none (Chromium through Prexy, 40 pages of 100
  assets navigated away from after 5-50 ms: no GOAWAY; 200 resets in a
  row: GOAWAY).
* A graceful GOAWAY (:meth:`~ServerConnection.drain`): the streams opened so
  far finish, newer ones are refused (REFUSED_STREAM), and :class:`Close`
  comes once none is left.
* The request heads as the HTTP/1.1 upstream side needs them:
  :func:`check_request` (the HTTP/1.1 gate's rules, so nothing reaches an
  origin that an HTTP/1.1 client could not send), :func:`request_fields`
  (``:authority`` as Host) and :func:`response_fields` (no
  connection-specific field goes to the client).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import hpack
from hyperframe.frame import GoAwayFrame

from prexy.config import Limits
from prexy.h2settings import H2Settings
from prexy.requesthead import Refusal, check_host, check_target

__all__ = [
    "Body", "Close", "End", "H2Settings", "Head", "Reset", "ServerConnection", "CONNECTION_SPECIFIC", "PREFACE",
    "check_request", "request_fields", "response_fields",
]

#: What a client with prior knowledge (h2c) sends first (RFC 9113 3.4).
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

#: Header fields that belong to one HTTP/1.1 connection and never appear
#: in HTTP/2 (RFC 9113 8.2.2); the names a Connection header lists too.
CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"te"}
)

#: A stream's producer is asked to pause once this much of its answer waits.
HIGH_WATER = 64 * 1024

#: What HTTP/1.1's head gate (``prexy.requesthead``) lets through as a
#: method and as a field name; the upstream side speaks HTTP/1.1, so an
#: HTTP/2 request must fit in an HTTP/1.1 head.
_METHOD = re.compile(rb"[A-Z_-]{1,32}")
_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9a-z-]+")
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


def check_request(
    fields: Sequence[tuple[bytes, bytes]], max_target: int, max_fields: int = Limits().max_header_lines,
) -> tuple[int, str] | None:
    """Why an HTTP/2 request head cannot be forwarded as an HTTP/1.1 one
    (the status to answer and the reason), or None.  The same rules as
    the HTTP/1.1 gate: a token method, an origin-form target that does not
    climb above the root, a valid authority, token field names and values
    without control bytes, at most ``max_fields`` header lines once the
    head is HTTP/1.1 (``:authority`` becomes Host; cookie crumbs are one
    Cookie field already).  CONNECT (no ``:path``) is not served."""
    method = path = authority = None
    hosts = 0
    ordinary = 0
    for name, value in fields:
        if name[:1] == b":":
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
            elif name == b":authority":
                authority = value
        elif (ordinary := ordinary + 1) > max_fields:
            return 431, "too many header fields"
        elif not _NAME.fullmatch(name):
            return 400, "a field name holds a byte it cannot hold"
        elif _BAD_VALUE.search(value):
            return 400, "a field value holds a control byte"
        elif name == b"host":
            hosts += 1
            why = check_host(value)
            if why is not None or hosts > 1:
                return 400, f"host: {why or 'more than one'}"
        elif name == b"content-length" and not value.isdigit():
            return 400, "content-length is not a number"
    if method is None or not _METHOD.fullmatch(method):
        return (501 if method == b"CONNECT" else 400), "method not served over HTTP/2"
    if path is None:
        return 501, "CONNECT is not served over HTTP/2"
    if len(path) > max_target:
        return 414, "request target too long"
    if path[:1] != b"/":
        return 400, "request target is not /path"
    checked = check_target(method, path)
    if isinstance(checked, Refusal):
        return checked.status, checked.reason
    if authority is not None:
        why = check_host(authority)
        if why is not None:
            return 400, f":authority: {why}"
        if not hosts and ordinary >= max_fields:
            return 431, "too many header fields"
    return None


def response_fields(code: bytes, headers: Iterable[tuple[bytes, Sequence[bytes]]]) -> list[tuple[bytes, bytes]]:
    """An HTTP/2 response head from a status and twisted.web's raw header
    pairs: names in lower case, the connection-specific fields (and those
    a Connection field names) left out."""
    fields = [(b":status", code)]
    nominated: set[bytes] = set()
    pairs = [(name.lower(), values) for name, values in headers]
    for name, values in pairs:
        if name == b"connection":
            for value in values:
                nominated.update(token.strip().lower() for token in value.split(b","))
    for name, values in pairs:
        if name in CONNECTION_SPECIFIC or name in nominated:
            continue
        for value in values:
            fields.append((name, value))
    return fields


def request_fields(fields: Iterable[tuple[bytes, bytes]]) -> tuple[bytes, bytes | None, list[tuple[bytes, bytes]]]:
    """(method, path, ordinary fields) of an HTTP/2 request head; the
    ``:authority`` becomes the Host field (RFC 9113 8.3.1)."""
    method = b"GET"
    path: bytes | None = None
    authority: bytes | None = None
    ordinary: list[tuple[bytes, bytes]] = []
    has_host = False
    for name, value in fields:
        if name[:1] != b":":
            if name == b"host":
                has_host = True
                if authority is not None:
                    continue
            ordinary.append((name, value))
        elif name == b":method":
            method = value
        elif name == b":path":
            path = value
        elif name == b":authority":
            authority = value
    if authority is not None:
        if has_host:
            ordinary = [(n, v) for n, v in ordinary if n != b"host"]
        ordinary.insert(0, (b"host", authority))
    return method, path, ordinary


@attrs.frozen
class Head:
    """A request's head: ``fields`` as received (pseudo-fields first,
    names lower-case, cookies joined); ``ended``: no body follows."""

    stream_id: int
    fields: Sequence[tuple[bytes, bytes]]
    ended: bool


@attrs.frozen
class Body:
    """A piece of a request body (its flow-control credit is returned)."""

    stream_id: int
    data: bytes


@attrs.frozen
class End:
    """A request body is complete."""

    stream_id: int


@attrs.frozen
class Reset:
    """A stream is over before its answer was: the client reset it, or
    the connection refused it."""

    stream_id: int
    error_code: int


@attrs.frozen
class Close:
    """Close the connection once the bytes to send are written: ``reason``
    says why (``"drained"`` after a graceful GOAWAY, else an error); the
    streams still open are lost."""

    reason: str
    graceful: bool


Event = Head | Body | End | Reset | Close


class _LiteralEncoder(hpack.Encoder):
    """HPACK without Huffman coding of the strings: measured 38 against 15
    µs for a typical answer head (8 fields, two of them new each time),
    for about 30% more header bytes (RFC 7541 makes it the encoder's
    choice)."""

    def encode(self, headers: Any, huffman: bool = True) -> bytes:
        return super().encode(headers, huffman=False)


class _Out:
    """What one stream still has to send."""

    __slots__ = ("chunks", "queued", "ending", "trailers", "in_round")

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.queued = 0
        self.ending = False
        self.trailers: list[tuple[bytes, bytes]] | None = None
        self.in_round = False


class _Counter:
    """Events counted within a fixed window of time."""

    __slots__ = ("limit", "window", "start", "count")

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window
        self.start = float("-inf")
        self.count = 0

    def over(self, now: float) -> bool:
        """Count one; whether that is past the limit."""
        if now - self.start >= self.window:
            self.start = now
            self.count = 0
        self.count += 1
        return self.count > self.limit

    def forgive(self) -> None:
        """Take one off the count (not below zero)."""
        if self.count:
            self.count -= 1


class ServerConnection:
    """One HTTP/2 connection, server side (see the module docstring)."""

    def __init__(self, settings: H2Settings | None = None) -> None:
        self.settings = settings = settings or H2Settings()
        # The answer heads are built here already lower-case and without
        # connection-specific fields (``CONNECTION_SPECIFIC``), so h2's
        # outbound checks would only repeat the work.
        config = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        conn = h2.connection.H2Connection(config=config)
        conn.encoder = _LiteralEncoder()
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: settings.max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: settings.max_header_list_size,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
            },
        )
        conn.decoder.max_header_list_size = settings.max_header_list_size
        conn.initiate_connection()
        self.h2 = conn
        self._out: dict[int, _Out] = {}
        self._round: deque[int] = deque()
        self._drained: list[int] = []
        self._resets = _Counter(settings.max_resets, settings.flood_window)
        self._settings_count = _Counter(settings.max_settings, settings.flood_window)
        self._pings = _Counter(settings.max_pings, settings.flood_window)
        self._empty = _Counter(settings.max_empty_frames, settings.flood_window)
        #: Streams the proxy serves: opened and not yet ended nor reset.
        self.open: set[int] = set()
        #: Open streams whose request body is still coming.
        self._receiving: set[int] = set()
        #: After a GOAWAY: the last stream that is served.
        self.last_stream: int | None = None
        self.closed: Close | None = None
        self._extra = b""

    # -- input ------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> list[Event]:
        """The events ``data`` from the client brings (a :class:`Close`
        is always the last)."""
        if self.closed is not None:
            return []
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 has queued its GOAWAY (ENHANCE_YOUR_CALM for a head over
            # the header list size, else the error's code).
            self.closed = Close(f"protocol error: {exc}", graceful=False)
            return [self.closed]
        reset_at_once = {e.stream_id for e in events if isinstance(e, h2.events.StreamReset)}
        out: list[Event] = []
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                sid = event.stream_id
                if sid in reset_at_once:
                    continue  # opened and reset in one read: never started
                if self.last_stream is not None and sid > self.last_stream:
                    self.h2.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
                    continue
                ended = event.stream_ended is not None
                self.open.add(sid)
                if not ended:
                    self._receiving.add(sid)
                self._out[sid] = _Out()
                out.append(Head(sid, event.headers, ended))
            elif isinstance(event, h2.events.DataReceived):
                sid = event.stream_id
                if not event.data and event.stream_ended is None and self._empty.over(now):
                    return [self._close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, "too many empty DATA frames")]
                if event.flow_controlled_length:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, sid)
                if sid in self._receiving and event.data:
                    out.append(Body(sid, event.data))
            elif isinstance(event, h2.events.StreamEnded):
                sid = event.stream_id
                if sid in self._receiving:
                    self._receiving.discard(sid)
                    out.append(End(sid))
            elif isinstance(event, h2.events.StreamReset):
                if self._resets.over(now):
                    return [self._close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, "too many stream resets")]
                sid = event.stream_id
                if sid in self.open:
                    self._drop(sid)
                    out.append(Reset(sid, int(event.error_code or 0)))
            elif isinstance(event, h2.events.WindowUpdated):
                self._window_opened(event.stream_id)
            elif isinstance(event, h2.events.RemoteSettingsChanged):
                if self._settings_count.over(now):
                    return [self._close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, "too many SETTINGS frames")]
                if h2.settings.SettingCodes.INITIAL_WINDOW_SIZE in event.changed_settings:
                    self._initial_window_changed()
            elif isinstance(event, h2.events.PingReceived):
                if self._pings.over(now):
                    return [self._close(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, "too many PING frames")]
            elif isinstance(event, h2.events.ConnectionTerminated):
                self.closed = Close("the client sent GOAWAY", graceful=False)
                out.append(self.closed)
                return out
        self._check_drained(out)
        return out

    def _window_opened(self, stream_id: int) -> None:
        """A stream's WINDOW_UPDATE: the stream rejoins the round if it
        waited for it (stream 0, the connection's, changes nothing here:
        streams waiting for it never left the round)."""
        out = self._out.get(stream_id)
        if out is not None and not out.in_round and (out.chunks or out.ending):
            out.in_round = True
            self._round.append(stream_id)

    def _initial_window_changed(self) -> None:
        """A new SETTINGS_INITIAL_WINDOW_SIZE: every waiting stream may
        send again."""
        for sid, out in self._out.items():
            if not out.in_round and (out.chunks or out.ending):
                out.in_round = True
                self._round.append(sid)

    # -- output -----------------------------------------------------------------------

    def refuse(self, stream_id: int, status: int, content_type: bytes, body: bytes) -> None:
        """Answer a request that will not be served with ``status`` and
        ``body`` (``prexy.errorpages``), and end the stream."""
        self.send_head(stream_id, [(b":status", b"%d" % status), (b"content-type", content_type),
                                   (b"content-length", b"%d" % len(body))])
        self.send_data(stream_id, body)
        self.end(stream_id)

    def send_head(self, stream_id: int, fields: list[tuple[bytes, bytes]]) -> None:
        """Send a response head, or an informational one (``fields``:
        ``:status`` first, names in lower case, no connection-specific
        field)."""
        if stream_id in self._out:
            self.h2.send_headers(stream_id, fields)

    def send_data(self, stream_id: int, data: bytes) -> None:
        """Queue answer bytes (sent by :meth:`pump`)."""
        out = self._out.get(stream_id)
        if out is None or not data or out.ending:
            return
        out.chunks.append(data)
        out.queued += len(data)
        if not out.in_round:
            out.in_round = True
            self._round.append(stream_id)

    def end(self, stream_id: int, trailers: Sequence[tuple[bytes, bytes]] = ()) -> None:
        """The answer is complete: end the stream after its queued bytes
        (with ``trailers`` in a last HEADERS frame)."""
        out = self._out.get(stream_id)
        if out is None or out.ending:
            return
        out.ending = True
        out.trailers = list(trailers) or None
        if not out.in_round:
            out.in_round = True
            self._round.append(stream_id)

    def reset(self, stream_id: int, error_code: int = h2.errors.ErrorCodes.INTERNAL_ERROR) -> None:
        """Abandon a stream's answer: what is queued goes out as far as the
        windows allow (a 413's body before the reset that stops the
        upload; a broken answer's bytes, never its end), then RST_STREAM."""
        if stream_id in self.open:
            out = self._out.get(stream_id)
            conn = self.h2
            while out is not None and out.chunks:
                size = min(conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
                if size <= 0:
                    break
                chunk = out.chunks.popleft()
                if len(chunk) > size:
                    out.chunks.appendleft(chunk[size:])
                    chunk = chunk[:size]
                conn.send_data(stream_id, chunk)
            self._drop(stream_id)
            try:
                self.h2.reset_stream(stream_id, error_code)
            except h2.exceptions.StreamClosedError:
                pass
        self._check_drained(None)

    def queued(self, stream_id: int) -> int:
        """Bytes of the stream's answer waiting to be sent (0 for a stream
        that is over): above :data:`HIGH_WATER`, pause its producer."""
        out = self._out.get(stream_id)
        return out.queued if out is not None else 0

    def take_drained(self) -> list[int]:
        """Streams whose queue emptied since the last call (their producer
        may go on)."""
        drained, self._drained = self._drained, []
        return drained

    def pump(self, budget: int = 256 * 1024) -> bool:
        """Frame queued answer bytes, one frame per stream in turn, within
        the windows and about ``budget`` bytes; whether the budget stopped
        it (call again once the transport took these)."""
        conn = self.h2
        round_ = self._round
        frame = conn.max_outbound_frame_size
        while round_:
            if budget <= 0:
                return True
            sid = round_[0]
            out = self._out.get(sid)
            if out is None:
                round_.popleft()
                continue
            if out.chunks:
                window = conn.local_flow_control_window(sid)
                if window <= 0:
                    if conn.outbound_flow_control_window <= 0:
                        return False  # the connection's window: everyone waits, in order
                    round_.popleft()  # this stream's window: it waits for its update
                    out.in_round = False
                    continue
                size = min(window, frame)
                chunk = out.chunks[0]
                if len(chunk) <= size:
                    out.chunks.popleft()
                else:
                    out.chunks[0] = chunk[size:]
                    chunk = chunk[:size]
                out.queued -= len(chunk)
                last = not out.chunks and out.ending and out.trailers is None
                conn.send_data(sid, chunk, end_stream=last)
                budget -= len(chunk)
                if not out.chunks:
                    self._drained.append(sid)
                if last:
                    self._finished(sid)
                    continue
            elif out.ending:
                if out.trailers is not None:
                    conn.send_headers(sid, out.trailers, end_stream=True)
                else:
                    conn.end_stream(sid)
                self._finished(sid)
                continue
            else:
                round_.popleft()
                out.in_round = False
                continue
            round_.rotate(-1)
        return False

    def _finished(self, sid: int) -> None:
        """The stream's answer is all sent (it is first in the round)."""
        self._resets.forgive()
        self._round.popleft()
        del self._out[sid]
        self.open.discard(sid)
        if sid in self._receiving:
            # Answered before the request body ended: the rest of it is not
            # wanted (RFC 9113 8.1).
            self._receiving.discard(sid)
            self.h2.reset_stream(sid, h2.errors.ErrorCodes.NO_ERROR)
        self._check_drained(None)

    def _drop(self, sid: int) -> None:
        """Forget a stream that is over before its answer was sent."""
        out = self._out.pop(sid, None)
        if out is not None and out.in_round:
            self._round.remove(sid)
        self.open.discard(sid)
        self._receiving.discard(sid)

    # -- the connection ----------------------------------------------------------------

    def drain(self) -> list[Event]:
        """Graceful GOAWAY: the streams opened so far are served, newer
        ones refused; a :class:`Close` once none is left (at once when
        none is open)."""
        if self.closed is not None or self.last_stream is not None:
            return []
        self.last_stream = self.h2.highest_inbound_stream_id
        # The frame goes out without telling h2's state machine, which
        # would refuse every later frame (WINDOW_UPDATEs the open streams
        # still need) once it has sent a GOAWAY.
        goaway = GoAwayFrame(0, last_stream_id=self.last_stream, error_code=0)
        self._extra += self.h2.data_to_send() + goaway.serialize()
        out: list[Event] = []
        self._check_drained(out)
        return out

    def _check_drained(self, out: list[Event] | None) -> None:
        if self.last_stream is not None and not self.open and self.closed is None:
            self.closed = Close("drained", graceful=True)
            if out is not None:
                out.append(self.closed)

    def idle(self) -> Close:
        """The idle timeout: GOAWAY and close (the open streams are lost)."""
        return self._close(h2.errors.ErrorCodes.NO_ERROR, "idle timeout")

    def _close(self, code: int, reason: str) -> Close:
        if self.closed is None:
            self.h2.close_connection(code, last_stream_id=self.h2.highest_inbound_stream_id)
            self.closed = Close(reason, graceful=code == h2.errors.ErrorCodes.NO_ERROR)
        return self.closed

    def data_to_send(self) -> bytes:
        """The bytes to write to the client now."""
        extra = self._extra
        if extra:
            self._extra = b""
            return extra + self.h2.data_to_send()
        return self.h2.data_to_send()

