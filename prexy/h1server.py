"""One HTTP/1.1 client connection's requests, without I/O: the bytes a
client sends in, requests out (``RequestReader``).

llhttp (through ``httptools``), the parser Node.js hardens against request
smuggling, is the one parser: it reads the request line, the header fields
and the body's framing (Content-Length, chunked with its extensions and
trailer section), and refuses in C what RFC 9112 forbids: bare CR or LF
line ends, obs-fold, header names that are not tokens, control bytes in
values, a Content-Length said twice or with anything but digits, a
Transfer-Encoding beside a Content-Length, malformed chunk framing.

Prexy's own rules, which llhttp does not apply, are checked on what it
parsed (``prexy.requesthead``): the target's form and bytes, Host (exactly
one on HTTP/1.1, a host a name can have), CONNECT, the versions spoken,
only ``chunked`` as a transfer coding, and the head limits (request line
414, header line, number of lines, whole head 431), which refuse a head as
soon as it outgrows them, before it ends.  A head is handed on only once
it is whole and passed, so nothing of a refused head reaches the proxy.

Two things llhttp does differently from what a proxy needs are handled
here, each in one place:

- llhttp knows a fixed table of methods; nginx serves any method of
  upper-case letters, ``_`` and ``-``.  A request line whose method llhttp
  does not know is parsed with ``GET`` in its place and the method kept
  aside, where the request starts a read (it does,
  but for pipelined requests behind another one in the same read, which
  then get a 400).
- llhttp treats the end of a head that asks to switch protocols
  (``Connection: upgrade`` and ``Upgrade``) as the end of the message.
  Only a ``GET`` without a body can be tunnelled (``prexy.upgrade``); its
  following bytes are held for the tunnel or the next request.  Any other
  request's body is read by a parser given a framing-only head in front of
  the bytes that follow (``_body_after_upgrade``).

Requests behind the one being answered (pipelining) are parsed as they
come and handed on in order; the connection decides when to read more.
It imports no Twisted.
"""

from __future__ import annotations

import re
from typing import NamedTuple, NoReturn

import httptools

from prexy.config import Limits
from prexy.requesthead import CHUNKED, LENGTH, Head, Refusal, check_target, conclude

__all__ = ["END", "End", "Request", "RequestReader"]

_VERSIONS = {"1.1": b"HTTP/1.1", "1.0": b"HTTP/1.0"}
#: A method nginx takes that llhttp's table may lack.
_METHOD = re.compile(rb"[A-Z_-]{1,32}")
_METHOD_PREFIX = re.compile(rb"[A-Z_-]{0,32}")
#: llhttp's reasons that are not a 400.
_VERSION_REASONS = ("Invalid HTTP version", "Pause on PRI")
#: llhttp's reasons said in RFC 9112's words where they are shorter.
_REASONS = {
    "Unexpected whitespace after header value": "obs-fold continuation line",
    "Expected CRLF after version": "bare CR or LF in the request line",
    "Missing expected LF after header value": "bare CR in a header line",
    "Missing expected CR after header value": "bare LF in a header line",
}


class Request(NamedTuple):
    """A request head that passed: the proxy's request starts here (its
    body, if any, follows as ``bytes`` events, then ``END``)."""

    head: Head
    #: The header fields in order, names as sent, values without the
    #: white space around them.
    fields: list[tuple[bytes, bytes]]
    #: The connection stays open after the answer (HTTP/1.1 without
    #: ``Connection: close``); otherwise the answer says ``Connection:
    #: close`` where the request asked for it, and the connection closes.
    persistent: bool
    #: The client waits for a 100 Continue before it sends the body.
    expect_continue: bool
    #: A GET without a body that asks to switch protocols: what follows
    #: its head is held until the connection says whether it was tunnelled
    #: (``tunnel``) or not (``resume``).
    upgrade: bool


class End:
    """The request's body is complete (one per ``Request``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "END"


END = End()

#: What ``feed`` returns: requests, body pieces (bytes), ends, and at most
#: one refusal, last (the connection answers it and closes).
Event = Request | bytes | End | Refusal


#: ``_events`` between reads (parser callbacks only run within ``feed``).
_NO_EVENTS: list[Event] = []


class _Stop(Exception):
    """Raised from a parser callback to stop at a refusal."""


class _Last(Exception):
    """Raised from a parser callback once the connection's last request is
    complete: what follows is not read."""


class RequestReader:
    """Reads the requests of one connection.  ``feed`` takes bytes as
    they arrive and returns what they completed.  After a refusal, or once
    a request that closes the connection is complete, it reads nothing
    more."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._parser = self._new_parser()
        self._events: list[Event] = []
        #: A head has begun and is not complete: the header deadline runs.
        self.in_head = False
        #: A body is being read.
        self.in_body = False
        #: Reads nothing more (refused, or after a last request).
        self.done = False
        #: Bytes held after an upgrade request, or None.
        self._held: bytearray | None = None
        #: Bytes of a method llhttp does not know, waiting for the rest of
        #: the request line (a read that ends inside the method).
        self._method_prefix = b""
        #: What was read of a request that began a read, until its target
        #: starts (a method llhttp does not know is read again from it).
        self._line: bytes | None = None
        self._method: bytes | None = None
        #: Parsing the framing-only head of a body after an upgrade head.
        self._synthetic = False
        self._refusal: Refusal | None = None
        #: The connection's last request is complete.
        self._ended = False
        self._reset_head()

    def _reset_head(self) -> None:
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._hosts: list[bytes] = []
        self._length: bytes | None = None
        self._coding: bytes | None = None
        self._expect = False
        self._close = False
        #: Bytes of the head counted so far (its lines, as parsed).
        self._head_size = 0
        #: Bytes read while the head was incomplete, since counting began,
        #: and the bytes of its lines parsed then (-1: not begun).
        self._head_read = 0
        self._head_base = -1
        self._persistent = False

    def _new_parser(self) -> httptools.HttpRequestParser:
        parser = httptools.HttpRequestParser(self)
        # White space between a chunk size and its extensions is RFC 9112's
        # BWS; the body is forwarded with its length, never as received.
        parser.set_dangerous_leniencies(lenient_spaces_after_chunk_size=True)
        return parser

    # -- feeding -----------------------------------------------------------------------

    def feed(self, data: bytes) -> list[Event]:
        """The requests, body pieces and ends that ``data`` completes, in
        order; a refusal ends the list and the reader."""
        if self.done or not data:
            return []
        held = self._held
        if held is not None:
            held += data
            return []
        if self._method_prefix:
            data, self._method_prefix = self._method_prefix + data, b""
        events = self._events = []
        try:
            return self._feed(data, events)
        finally:
            # The events go to the caller only: body pieces are not kept.
            self._events = _NO_EVENTS

    def close(self) -> None:
        """The connection is gone: let go of the parser (it holds this
        reader's methods, so the two would wait for the cycle collector)."""
        self.done = True
        self._parser = None  # type: ignore[assignment]
        self._held = None

    def _feed(self, data: bytes, events: list[Event]) -> list[Event]:
        at_start = not self.in_head and not self.in_body
        line = self._line
        if at_start:
            line = self._line = data
        elif line is not None:
            line = self._line = line + data
        self._begins = 0
        try:
            self._parse(data)
        except httptools.HttpParserInvalidMethodError as error:
            if line is not None and not events:
                return self._unknown_method(line)
            return self._refuse_parse(error)
        except httptools.HttpParserError as error:
            if self._ended:
                return events
            return self._refuse_parse(error)
        if self.in_head:
            return self._head_so_far(data, at_start) or events
        return events

    def _parse(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            self._after_upgrade(data[upgrade.args[0] :])

    def _head_so_far(self, data: bytes, at_start: bool) -> list[Event] | None:
        """A head is incomplete at the end of a read: refuse it now if it
        already outgrew a limit, so that no more of it is held.  Its bytes
        are counted from its first read when it began a read, else from
        the read after the one it began in (how much of that one is its
        own is not known; it is at most one read)."""
        parsed = self._head_size or len(self._url) + 14
        if self._head_base >= 0:
            self._head_read += len(data)
        elif at_start and self._begins == 1:
            self._head_base, self._head_read = 0, len(data)
        else:
            self._head_base = parsed  # counted from the next read
            return None
        limits = self.limits
        if self._head_read > limits.max_request_head:
            return self._stop_now(Refusal(431, "request head too large"))
        # The line being read: what was read past the lines parsed since
        # counting began (their separators counted as one space each).
        partial = self._head_read - (parsed - self._head_base) - 2
        if partial > limits.max_header_line + 8:
            return self._stop_now(Refusal(431, "header line too long"))
        return None

    def _stop_now(self, refusal: Refusal) -> list[Event]:
        self.done = True
        self._events.append(refusal)
        return self._events

    def _refuse_parse(self, error: Exception | None) -> list[Event]:
        """The events before a parse error, and the refusal it makes."""
        self.done = True
        events = self._events
        refusal = self._refusal
        if refusal is None:
            refusal = self._refusal_for(error)
        events.append(refusal)
        return events

    def _refusal_for(self, error: Exception | None) -> Refusal:
        """The answer to a parse error llhttp stopped at (None: a method
        that is not one)."""
        if error is None:
            return Refusal(400, "malformed request line (method)")
        reason = str(error)
        if self.in_head and len(self._fields) >= self.limits.max_header_lines - 1 and (
            reason.startswith("Invalid header token")
        ):
            # A malformed line past the last one allowed: llhttp stops at it
            # before it reports the line before it (which it holds until the
            # next field starts), so the lines it reported are one short.
            return Refusal(431, "too many header lines")
        if "Transfer-Encoding" in reason and (self._coding is None or self._coding.lower() != b"chunked"):
            # A coding other than chunked alone (nginx: 501), where llhttp
            # stops before the field is reported, or beside a Content-Length.
            return Refusal(501, "only the chunked transfer coding is supported")
        status = 505 if reason.startswith(_VERSION_REASONS) else 400
        return Refusal(status, _REASONS.get(reason) or f"malformed request: {reason}")

    def _unknown_method(self, data: bytes) -> list[Event]:
        """A read that starts with a request line whose method llhttp does
        not know: parse it with GET in the method's place, or refuse."""
        start = len(data) - len(data.lstrip(b"\r\n"))
        space = data.find(b" ", start)
        if space < 0:
            if _METHOD_PREFIX.fullmatch(data, start) and len(data) - start <= 32:
                # The method so far: wait for the rest of the line.
                self._method_prefix = data
                self.in_head = False
                self._parser = self._new_parser()
                return []
            return self._refuse_parse(None)
        method = data[start:space]
        if not _METHOD.fullmatch(method):
            return self._refuse_parse(None)
        self._parser = self._new_parser()
        self._method = method
        self.in_head = False
        return self.feed(b"GET" + data[space:])

    def _after_upgrade(self, rest: bytes) -> None:
        """llhttp stopped after a head that asks to switch protocols."""
        if self._synthetic:
            raise AssertionError("a framing-only head never asks to upgrade")
        events = self._events
        if len(events) >= 2 and events[-1] is END and isinstance(events[-2], Request) and events[-2].upgrade:
            self._held = bytearray(rest)  # the tunnel's, or the next request's
            return
        # A request with a body, or one that cannot be tunnelled: its body
        # (if any) and what follows are read as for any other request.
        self._body_after_upgrade(rest)

    def _body_after_upgrade(self, rest: bytes) -> None:
        head = self._last_head
        if head.framing == CHUNKED:
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            framing = b"Content-Length: %d\r\n" % head.length
        self._synthetic = True
        self._parser = self._new_parser()
        try:
            self._parser.feed_data(b"POST / HTTP/1.1\r\n" + framing + b"\r\n")
        finally:
            self._synthetic = False
        if rest and not self.done:
            self._parse(rest)

    def resume(self) -> list[Event]:
        """The upgrade request was answered without a switch: the bytes
        held after it are the connection's next request."""
        held, self._held = self._held, None
        return self.feed(bytes(held)) if held else []

    def tunnel(self) -> bytes:
        """The upgrade request was answered with a switch: the bytes held
        after it, for the tunnel; the reader reads nothing more."""
        held, self._held = self._held, None
        self.done = True
        return bytes(held or b"")

    # -- llhttp's callbacks ----------------------------------------------------------------

    def _stop(self, refusal: Refusal) -> NoReturn:
        self._refusal = refusal
        raise _Stop(refusal.reason)

    def on_message_begin(self) -> None:
        if self._synthetic:
            return
        self._begins += 1
        if self._begins > 1:
            self._line = None
        self.in_head = True
        self._reset_head()

    def on_url(self, piece: bytes) -> None:
        if self._synthetic:
            return
        self._line = None
        url = self._url = self._url + piece if self._url else piece
        if len(url) + 14 > self.limits.max_request_line:
            self._stop(Refusal(414, "request line too long"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._synthetic:
            return
        if not self.in_head:
            # The trailer section of a chunked body: read and dropped, as
            # Prexy forwards a request body with its length; bounded like
            # a head.
            self._head_size += len(name) + len(value) + 4
            if self._head_size > self.limits.max_request_head:
                self._stop(Refusal(400, "trailer section too large"))
            return
        if value[-1:] in (b" ", b"\t"):
            value = value.rstrip(b" \t")
        fields = self._fields
        fields.append((name, value))
        limits = self.limits
        line = len(name) + 2 + len(value)
        if not self._head_size:
            self._head_size = len(self._url) + 14
        self._head_size += line + 2
        if len(fields) > limits.max_header_lines:
            self._stop(Refusal(431, "too many header lines"))
        if line > limits.max_header_line:
            self._stop(Refusal(431, "header line too long"))
        if self._head_size > limits.max_request_head:
            self._stop(Refusal(431, "request head too large"))
        first = name[0] | 0x20
        if first == 0x68 or first == 0x63 or first == 0x74 or first == 0x65:  # h, c, t, e
            low = name.lower()
            if low == b"host":
                self._hosts.append(value)
            elif low == b"content-length":
                self._length = value
            elif low == b"transfer-encoding":
                if self._coding is not None:
                    self._stop(Refusal(400, "Transfer-Encoding given twice"))
                self._coding = value
            elif low == b"connection":
                if any(t.strip().lower() == b"close" for t in value.split(b",")):
                    self._close = True
            elif low == b"expect":
                self._expect = value.lower() == b"100-continue"

    def on_headers_complete(self) -> None:
        if self._synthetic:
            self.in_body = True
            return
        parser = self._parser
        version = _VERSIONS.get(parser.get_http_version())
        if version is None:
            if parser.get_http_version() == "0.9":
                self._stop(Refusal(400, "malformed request line (no version)"))
            self._stop(Refusal(505, "HTTP version not supported"))
        method = self._method
        if method is None:
            method = parser.get_method()
        else:
            self._method = None
        if method == b"CONNECT":
            self._stop(Refusal(405, "CONNECT is not supported"))
        checked = check_target(method, self._url)
        if isinstance(checked, Refusal):
            self._stop(checked)
        head = conclude(method, checked[0], checked[1], version, self._hosts, self._length, self._coding)
        if isinstance(head, Refusal):
            self._stop(head)
        assert isinstance(head, Head)
        self.in_head = False
        self._last_head = head
        persistent = version == b"HTTP/1.1" and not self._close
        upgrade = parser.should_upgrade() and method == b"GET" and not head.has_body and version == b"HTTP/1.1"
        self._events.append(Request(head, self._fields, persistent, self._expect, upgrade))
        self._persistent = persistent
        self.in_body = head.framing == LENGTH and head.length > 0 or head.framing == CHUNKED
        self._head_size = 0  # from here on, the trailer section's size

    def on_body(self, data: bytes) -> None:
        self._events.append(data)

    def on_message_complete(self) -> None:
        if not self._synthetic and self._parser.should_upgrade():
            # llhttp ends a head that asks to switch protocols here, and
            # then stops (``_after_upgrade``): a request that is not
            # tunnelled goes on with its body there.
            if self._events and isinstance(self._events[-1], Request) and self._events[-1].upgrade:
                self._events.append(END)
            return
        self.in_body = False
        self._events.append(END)
        if not self._persistent:
            # The last request of the connection: whatever follows is
            # not read (llhttp itself refuses data after a close).
            self.done = self._ended = True
            raise _Last()
