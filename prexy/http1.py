"""HTTP/1.1 framing for the upstream client, without any I/O.

Two halves, both pure (no Twisted here; ``prexy/proxy/upstream.py`` wires
them to a socket):

- the request writer: :func:`request_head` returns the bytes of a request's
  line and headers with the body's framing (Content-Length, or chunked),
  :func:`chunk` frames one piece of a chunked body and :data:`LAST_CHUNK`
  ends it;
- the response reader: a :class:`ResponseReader` is fed the bytes that
  arrive (:meth:`~ResponseReader.receive_data`) and told when the
  connection closes (:meth:`~ResponseReader.connection_closed`); each call
  returns the events the bytes completed, in order: one :class:`Head`,
  :class:`Data` pieces of the body, one :class:`End`, or a
  :class:`ResponseError` (then nothing more).  Interim 1xx responses other
  than 101 are skipped, or with ``interim=True`` come first as
  :class:`Interim` events (100 Continue is always skipped); a 101 is an
  :class:`UnsolicitedUpgrade` unless the
  reader was told the request asked to upgrade.  The events do not depend
  on how the bytes were cut into reads, except that body data is split
  where the reads split it.

What the reader refuses (a ResponseError, status 502; the connection must
not be reused) and what it lets through on purpose:

- numbers are ASCII digits only, never what ``int()`` also takes (a sign,
  ``_``, surrounding whitespace, ``0x``): the status code is 3 digits
  (100-999), a Content-Length 1*DIGIT (RFC 9110 8.6), a chunk size
  1*HEXDIG (RFC 9112 7.1), then optional whitespace and ``;`` extensions,
  which are ignored;
- the version is ``HTTP/1.`` and one digit (1.0 closes unless keep-alive,
  any other is read as 1.1);
- a NUL anywhere in the head, a CR or LF in the head that is not part of
  a CRLF, and a CR in a chunk line other than one right before its LF;
- a head (interim 1xx heads included) over ``max_head`` bytes, however it
  is cut into reads;
- accepted: a repeated equal Content-Length, Transfer-Encoding beside
  Content-Length (chunked wins), obs-fold continuation lines (joined with
  one space; framing headers are decided on their first line), chunk lines
  ending in LF alone, any version 1.x, a HEAD response's Content-Length
  without its body.

The body framings are one small class each, in the manner of h11's
``_readers.py``: :class:`_LengthReader`,
:class:`_ChunkedReader`, :class:`_CloseReader`.

Hand-written, measured against a reader on httptools (llhttp) that does
the same job (``bench/bench_http1.py``'s ``LlhttpReader``: these events,
limits and HEAD, 1xx and 101 rules; median µs of CPU per response, 15
interleaved rounds, a 12-field nginx head; two runs, the chunked rows one
run after the per-chunk shortcut in :class:`_ChunkedReader`)::

                                      hand-written   httptools  bare llhttp
    12-byte body, one read              12.0, 12.2   11.5, 10.9    4.6
    20 KB Content-Length, one read      13.2, 13.6   12.2, 13.1    5.2
    20 KB in 16 KiB reads               13.3, 13.9   13.1, 14.4    5.5
    304                                 10.3, 10.4   10.3, 10.5    4.5
    20 KB chunked (4 chunks), one read     18.9         12.4       5.6
    1 MB chunked (1 KiB chunks)            1120          318       223

llhttp parses in C, but each header field still costs a Python callback
and the reader's own work (names, framing, events) is the same: from 4%
more to 10% less CPU on the common responses, not the 15% that would pay
for what the proxy would lose.  llhttp refuses what origins send and this
reader takes (a repeated equal Content-Length, Transfer-Encoding beside
Content-Length, obs-fold, LF-only chunk lines, control characters in
field values, versions other than 1.0/1.1), cannot be told that a
response answers HEAD, and does not say where in a read a response ended
(``trailing_data``).  Chunked bodies are where llhttp pays (1.5x at 20 KB
in 4 chunks, 3.5x in 1 KiB chunks).  h11 is out (10x slower: ``--h11``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "LAST_CHUNK",
    "MAX_CHUNK_LINE",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_COUNT",
    "NO_BODY_STATUSES",
    "CHUNKED",
    "CLOSE",
    "LENGTH",
    "NONE",
    "Data",
    "End",
    "Event",
    "Head",
    "Interim",
    "ResponseError",
    "ResponseIncomplete",
    "ResponseReader",
    "UnsolicitedUpgrade",
    "chunk",
    "request_head",
]

#: The most bytes a response head may take by default (a reader's
#: ``max_head``): status line and blank line included, with the interim 1xx
#: heads before it.
MAX_HEADER_BYTES = 64 * 1024
#: The most lines a response head may have, status line included (and the
#: most trailer fields a chunked body may end with).
MAX_HEADER_COUNT = 200
#: The longest line of chunked framing (a size line, a trailer field).
MAX_CHUNK_LINE = 4096
#: Final statuses that never have a body (1xx other than 101 are skipped;
#: a 101 has none either).
NO_BODY_STATUSES = frozenset({204, 304})

#: Body framings, as the Head reports them.
NONE = "none"  # no body: HEAD, 204, 304, an asked-for 101, Content-Length: 0
LENGTH = "length"  # Content-Length bytes
CHUNKED = "chunked"  # Transfer-Encoding: chunked
CLOSE = "close"  # until the connection closes

_BODY_METHODS = frozenset({b"POST", b"PUT", b"PATCH"})


# -- the request writer ---------------------------------------------------------


def request_head(
    method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]], body_length: int | None = 0
) -> bytes:
    """The request line and header block of one HTTP/1.1 request.

    ``headers`` must not frame the body themselves: the framing is added
    here from ``body_length``: a positive length gives ``Content-Length``,
    ``None`` gives ``Transfer-Encoding: chunked`` (then send the body with
    :func:`chunk` and :data:`LAST_CHUNK`), 0 gives no body, announced as
    ``Content-Length: 0`` for the methods that usually carry one (POST, PUT,
    PATCH), since some servers wait for a body otherwise.
    """
    lines = [method, b" ", target, b" HTTP/1.1\r\n"]
    for name, value in headers:
        lines += [name, b": ", value, b"\r\n"]
    if body_length is None:
        lines.append(b"Transfer-Encoding: chunked\r\n\r\n")
    elif body_length:
        lines += [b"Content-Length: ", b"%d" % body_length, b"\r\n\r\n"]
    elif method in _BODY_METHODS:
        lines.append(b"Content-Length: 0\r\n\r\n")
    else:
        lines.append(b"\r\n")
    return b"".join(lines)


def chunk(data: bytes) -> bytes:
    """One piece of a chunked body; an empty piece frames to nothing (an
    empty chunk would end the body)."""
    if not data:
        return b""
    return b"%x\r\n%s\r\n" % (len(data), data)


#: What ends a chunked body (no trailers).
LAST_CHUNK = b"0\r\n\r\n"


# -- events -----------------------------------------------------------------------


class ResponseError(Exception):
    """The upstream's response is not valid HTTP/1.x; ``status`` is what the
    proxy should answer its own client with."""

    status = 502

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.args == self.args

    def __hash__(self) -> int:
        return hash((type(self), self.args))


class ResponseIncomplete(ResponseError):
    """The connection closed before the response was complete."""


class UnsolicitedUpgrade(ResponseError):
    """A ``101 Switching Protocols`` to a request that did not ask to
    upgrade: the upstream may have stopped speaking HTTP on the connection,
    so the connection must be closed, and the client gets a 502."""


class Head:
    """The status line and header fields of the final response."""

    __slots__ = (
        "code", "phrase", "version", "headers", "lnames", "connection_names", "length", "framing", "keep_alive",
    )

    def __init__(
        self,
        code: int,
        phrase: bytes,
        version: bytes,
        headers: list[tuple[bytes, bytes]],
        lnames: list[bytes],
        connection_names: frozenset[bytes],
        length: int | None,
        framing: str,
        keep_alive: bool,
    ) -> None:
        self.code = code
        self.phrase = phrase
        #: ``HTTP/1.x`` as sent.
        self.version = version
        #: Header fields in order, repeated ones as separate pairs, names as
        #: sent, values without surrounding whitespace.
        self.headers = headers
        #: The lower-cased name of each header, in the same order.
        self.lnames = lnames
        #: Lower-case names listed in Connection (hop-by-hop for this message).
        self.connection_names = connection_names
        #: Content-Length for a length-delimited body, None for chunked or
        #: close-delimited ones, 0 for bodiless ones; for HEAD, the
        #: upstream's Content-Length (or None) though no body follows.
        self.length = length
        #: NONE, LENGTH, CHUNKED or CLOSE.
        self.framing = framing
        #: The connection may carry another request after this response, as
        #: far as the version, Connection and the framing say.
        self.keep_alive = keep_alive

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Head) and all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__)
        return f"Head({fields})"


class Interim:
    """An informational (1xx) response before the final one, other than
    ``100 Continue`` and ``101``: ``103 Early Hints`` and the like.  Its
    header fields without hop-by-hop ones.  Only when the reader was asked
    for them (``interim=True``); otherwise they are skipped."""

    __slots__ = ("code", "phrase", "headers")

    def __init__(self, code: int, phrase: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        self.code = code
        self.phrase = phrase
        self.headers = headers

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Interim) and (other.code, other.phrase, other.headers) == (
            self.code, self.phrase, self.headers)

    def __repr__(self) -> str:
        return f"Interim({self.code!r}, {self.phrase!r}, {self.headers!r})"


#: Hop-by-hop fields (RFC 9110 7.6.1), never passed on with an interim head.
_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer",
                  b"transfer-encoding", b"upgrade", b"content-length"})


class Data:
    """A piece of the response body."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Data) and other.data == self.data

    def __repr__(self) -> str:
        return f"Data({self.data!r})"


class End:
    """The response is complete."""

    __slots__ = ("keep_alive", "trailers")

    def __init__(self, keep_alive: bool, trailers: list[tuple[bytes, bytes]]) -> None:
        #: As Head.keep_alive; bytes already past the end
        #: (ResponseReader.trailing_data) also rule reuse out.
        self.keep_alive = keep_alive
        #: Trailer fields of a chunked body, as (name, value) pairs.
        self.trailers = trailers

    def __eq__(self, other: object) -> bool:
        return isinstance(other, End) and (other.keep_alive, other.trailers) == (self.keep_alive, self.trailers)

    def __repr__(self) -> str:
        return f"End(keep_alive={self.keep_alive!r}, trailers={self.trailers!r})"


Event = Interim | Head | Data | End | ResponseError

_NO_TRAILERS: list[tuple[bytes, bytes]] = []


# -- the head ---------------------------------------------------------------------

_FRAMING_HEADERS = frozenset({b"content-length", b"transfer-encoding", b"connection"})
#: HTTP/1.DIGIT (a prefix check alone took "HTTP/1.0junk" for 1.1).
_VERSIONS = frozenset(b"HTTP/1.%d" % minor for minor in range(10))
#: A status code is 3DIGIT, 100 to 999; int() also took "+200", "2_00",
#: "\t200" and "0200".  One lookup instead of a check and int().
_CODES = {b"%d" % code: code for code in range(100, 1000)}
_TOKENS: dict[bytes, frozenset[bytes]] = {}


def _connection_tokens(value: bytes) -> frozenset[bytes]:
    """The lower-case options of a Connection header value (the common
    values are parsed once per process)."""
    tokens = _TOKENS.get(value)
    if tokens is None:
        tokens = frozenset(t.strip().lower() for t in value.split(b","))
        if len(_TOKENS) < 64:
            _TOKENS[value] = tokens
    return tokens


def _parse_head(head: bytes, method: bytes, upgrade: bool, interim: bool = False) -> Head | Interim | None:
    """One head block (without its blank line); an Interim for a 1xx to
    pass on (``interim``), None for a skipped one."""
    lines = head.split(b"\r\n")
    status_line = lines[0]
    parts = status_line.split(b" ", 2)
    version = parts[0]
    if len(parts) < 2 or version not in _VERSIONS:
        raise ResponseError(f"bad status line {status_line[:80]!r}")
    code = _CODES.get(parts[1])
    if code is None:
        raise ResponseError(f"bad status code {parts[1][:20]!r}")
    informational = False
    if code < 200:
        if code != 101:
            if not interim or code == 100:
                return None  # interim: the real response follows
            informational = True
        elif not upgrade:
            raise UnsolicitedUpgrade("101 Switching Protocols to a request that did not ask to upgrade")
    phrase = parts[2] if len(parts) > 2 else b""
    if len(lines) > MAX_HEADER_COUNT:
        raise ResponseError("too many response headers")
    crlf = len(lines) - 1
    if head.count(b"\r") != crlf or head.count(b"\n") != crlf:
        raise ResponseError("bare CR or LF in a response header")
    if 0 in head:  # a NUL; an int is one memchr (b"\x00" in head took 8x as long)
        raise ResponseError("NUL in a response header")
    headers: list[tuple[bytes, bytes]] = []
    lnames: list[bytes] = []
    content_length: int | None = None
    chunked = False
    close = version == b"HTTP/1.0"
    connection_names: frozenset[bytes] = frozenset()
    for line in lines[1:]:
        if line[0] in (32, 9):  # obs-fold; no line is empty (the head ends at the first)
            if not headers:
                raise ResponseError("continuation line before any header")
            name, value = headers[-1]
            headers[-1] = (name, value + b" " + line.strip())
            continue
        name, colon, value = line.partition(b":")
        if not colon or not name or name[-1] in (32, 9):
            raise ResponseError(f"bad header line {line[:80]!r}")
        value = value.strip()
        lname = name.lower()
        if lname in _FRAMING_HEADERS:  # decided on this line alone, before any fold
            if lname == b"content-length":
                # 1*DIGIT (RFC 9110 8.6): int() also takes "+5" and "1_1".
                if not value.isdigit():
                    raise ResponseError(f"bad Content-Length {value[:40]!r}")
                try:
                    length = int(value)
                except ValueError:  # more digits than int() converts
                    raise ResponseError(f"bad Content-Length {value[:40]!r}") from None
                if content_length is not None and content_length != length:
                    raise ResponseError("conflicting Content-Length")
                content_length = length
            elif lname == b"transfer-encoding":
                if value.split(b",")[-1].strip().lower() == b"chunked":
                    chunked = True
                else:
                    raise ResponseError(f"unsupported Transfer-Encoding {value[:40]!r}")
            else:
                tokens = _connection_tokens(value)
                connection_names = connection_names | tokens if connection_names else tokens
                if b"close" in tokens:
                    close = True
                elif b"keep-alive" in tokens and version == b"HTTP/1.0":
                    close = False
        headers.append((name, value))
        lnames.append(lname)
    if informational:
        return Interim(code, phrase, [pair for pair, lname in zip(headers, lnames, strict=True)
                                      if lname not in connection_names and lname not in _HOP])
    length_out: int | None
    if code == 101:  # asked for: the connection now speaks another protocol
        framing, length_out, close = NONE, 0, True
    elif method == b"HEAD" or code in NO_BODY_STATUSES:
        framing, length_out = NONE, 0
        if method == b"HEAD" and code not in NO_BODY_STATUSES:
            length_out = content_length
    elif chunked:  # Transfer-Encoding wins over Content-Length
        framing, length_out = CHUNKED, None
    elif content_length is not None:
        framing, length_out = (LENGTH if content_length else NONE), content_length
    else:
        framing, length_out, close = CLOSE, None, True
    return Head(code, phrase, version, headers, lnames, connection_names, length_out, framing, not close)


# -- the body readers -------------------------------------------------------------
#
# Each takes the bytes of one read and appends events to ``out``; it returns
# None while the body goes on, or, once the body ended, the bytes past its
# end.  A framing error raises ResponseError after the data before it.


class _LengthReader:
    def __init__(self, length: int, keep_alive: bool) -> None:
        self.remaining = length
        self.keep_alive = keep_alive

    def feed(self, data: bytes, out: list[Event]) -> bytes | None:
        remaining = self.remaining
        size = len(data)
        if size < remaining:
            self.remaining = remaining - size
            out.append(Data(data))
            return None
        self.remaining = 0
        if size == remaining:
            out.append(Data(data))
            out.append(End(self.keep_alive, _NO_TRAILERS))
            return b""
        out.append(Data(data[:remaining]))
        out.append(End(self.keep_alive, _NO_TRAILERS))
        return data[remaining:]

    def closed(self, out: list[Event]) -> None:
        out.append(ResponseIncomplete(f"closed with {self.remaining} body bytes to come"))


class _CloseReader:
    def feed(self, data: bytes, out: list[Event]) -> bytes | None:
        out.append(Data(data))
        return None

    def closed(self, out: list[Event]) -> None:
        out.append(End(False, _NO_TRAILERS))


_SIZE, _DATA, _DATA_END, _TRAILERS = range(4)

#: A chunk-size line without its line end: 1*HEXDIG, then optional
#: whitespace (BWS before ";", or trailing) and extensions, which are
#: ignored (RFC 9112 7.1).  int(x, 16) alone also took "0x5", "+5", "5_0"
#: and " 5".
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]+)[ \t]*(?:;[^\r]*)?")
_HEXDIG = b"0123456789ABCDEFabcdef"


def _data(pieces: list[bytes | memoryview]) -> Data:
    """One Data of the chunk data of one read."""
    if len(pieces) > 1:
        return Data(b"".join(pieces))
    piece = pieces[0]
    return Data(piece if type(piece) is bytes else bytes(piece))


class _ChunkedReader:
    """Chunked framing; the data of all the chunks complete in one read is
    handed over as one Data (a site sending 1 KiB chunks otherwise costs
    the proxy one rewrite feed, with its fixed cost, and one client write
    per chunk).  Lines may end in LF alone (or CRLF, not CR CR LF); a size
    line's extensions are ignored."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.state = _SIZE
        self.remaining = 0
        self.buffer = b""
        self.trailers: list[tuple[bytes, bytes]] = []

    def feed(self, data: bytes, out: list[Event]) -> bytes | None:
        buf = self.buffer + data if self.buffer else data
        self.buffer = b""
        pos = 0
        size = len(buf)
        # Chunk data as views of ``buf``: joined, the pieces are copied once.
        view = memoryview(buf)
        pending: list[bytes | memoryview] = []
        try:
            while pos < size:
                state = self.state
                if state == _DATA:
                    take = min(self.remaining, size - pos)
                    pending.append(view[pos : pos + take] if take != size else buf)
                    pos += take
                    self.remaining -= take
                    if not self.remaining:
                        self.state = _DATA_END
                    continue
                eol = buf.find(b"\n", pos)
                if eol < 0:
                    if size - pos > MAX_CHUNK_LINE:
                        raise ResponseError("chunk line too long")
                    self.buffer = buf[pos:]
                    break
                if eol - pos > MAX_CHUNK_LINE:
                    raise ResponseError("chunk line too long")
                # One CR of the line end (rstrip took "5\r\r\n" as "5").
                line = buf[pos : eol - 1] if eol > pos and buf[eol - 1] == 13 else buf[pos:eol]
                pos = eol + 1
                if state == _SIZE:
                    if line and not line.lstrip(_HEXDIG):  # only hex digits: the usual line (translate took 5x as long)
                        length = int(line, 16)
                    else:
                        match = _CHUNK_SIZE.fullmatch(line)
                        if match is None:
                            raise ResponseError(f"bad chunk size {line[:20]!r}")
                        length = int(match[1], 16)
                    if length:
                        # The usual case: the chunk and its line end are in
                        # this read; taken at once, no trip through the states.
                        end = pos + length
                        if end + 1 < size and buf[end] == 13 and buf[end + 1] == 10:
                            pending.append(view[pos:end])
                            pos = end + 2
                        elif end < size and buf[end] == 10:
                            pending.append(view[pos:end])
                            pos = end + 1
                        else:
                            self.remaining = length
                            self.state = _DATA
                    else:
                        self.state = _TRAILERS
                elif state == _DATA_END:
                    if line:
                        raise ResponseError("missing CRLF after chunk")
                    self.state = _SIZE
                elif line:  # a trailer field
                    name, colon, value = line.partition(b":")
                    if colon:
                        if len(self.trailers) >= MAX_HEADER_COUNT:
                            raise ResponseError("too many trailer fields")
                        self.trailers.append((name, value.strip()))
                else:  # the blank line after the trailers
                    if pending:
                        out.append(_data(pending))
                    out.append(End(self.keep_alive, self.trailers))
                    return buf[pos:]
        except ResponseError:
            if pending:
                out.append(_data(pending))
            raise
        if pending:
            out.append(_data(pending))
        return None

    def closed(self, out: list[Event]) -> None:
        out.append(ResponseIncomplete("closed inside a chunked body"))


# -- the reader -------------------------------------------------------------------

_HEAD, _BODY, _DONE, _ERROR = range(4)


class ResponseReader:
    """Reads one response to a request made with ``method``.

    Feed it with :meth:`receive_data` and :meth:`connection_closed`; both
    return the events completed so far.  After :class:`End`, the bytes that
    came after the response are in :attr:`trailing_data` (a pipelined
    response, or garbage); after a :class:`ResponseError`, further calls
    return nothing.

    ``max_head`` bounds the bytes before the body: the final head and any
    interim 1xx heads before it, blank lines included, whether they arrive
    whole or in pieces.  ``upgrade`` says the request asked to switch
    protocols (it carried ``Upgrade``): only then is a 101 a response (the
    final one, without a body and with keep_alive False; the new
    protocol's first bytes are in :attr:`trailing_data`), otherwise it is
    an :class:`UnsolicitedUpgrade`.
    """

    __slots__ = (
        "method", "max_head", "upgrade", "interim", "_state", "_buffer", "_scan", "_consumed", "_body", "framing",
        "trailing_data", "received_any",
    )

    def __init__(
        self, method: bytes = b"GET", max_head: int = MAX_HEADER_BYTES, upgrade: bool = False, interim: bool = False,
    ) -> None:
        self.method = method
        self.max_head = max_head
        self.upgrade = upgrade
        self.interim = interim
        self._state = _HEAD
        #: Bytes of the interim heads already read.
        self._consumed = 0
        self._buffer = bytearray()
        self._scan = 0
        self._body: _LengthReader | _ChunkedReader | _CloseReader | None = None
        #: The body's framing (NONE, LENGTH, CHUNKED, CLOSE) once the head
        #: arrived, else None.
        self.framing: str | None = None
        #: Bytes received after the end of the response.
        self.trailing_data = b""
        #: Whether any byte at all arrived.
        self.received_any = False

    def receive_data(self, data: bytes) -> list[Event]:
        """The events that ``data`` completes."""
        if not data:
            return []
        self.received_any = True
        state = self._state
        out: list[Event] = []
        if state == _BODY:
            assert self._body is not None
            try:
                rest = self._body.feed(data, out)
            except ResponseError as error:
                self._state = _ERROR
                out.append(error)
                return out
            if rest is not None:
                self._state = _DONE
                self.trailing_data = rest
            return out
        if state == _HEAD:
            self._read_head(data, out)
        elif state == _DONE:
            self.trailing_data += data
        return out

    def _read_head(self, data: bytes, out: list[Event]) -> None:
        buffer = self._buffer
        try:
            if buffer:
                buffer += data
                end = buffer.find(b"\r\n\r\n", self._scan)
                if end < 0:
                    self._wait(buffer)
                    return
                buf = bytes(buffer)
                buffer.clear()
            else:
                buf = data
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    buffer += buf
                    self._wait(buffer)
                    return
            while True:
                if self._consumed + end + 4 > self.max_head:
                    raise ResponseError(f"response head over {self.max_head} bytes")
                head = _parse_head(buf[:end], self.method, self.upgrade, self.interim)
                if type(head) is Head:
                    break
                if head is not None:
                    out.append(head)  # an Interim to pass on
                self._consumed += end + 4
                buf = buf[end + 4 :]  # a 1xx: on to the next head
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    buffer += buf
                    self._wait(buffer)
                    return
        except ResponseError as error:
            self._state = _ERROR
            out.append(error)
            return
        self._scan = 0
        out.append(head)
        rest = buf[end + 4 :] if len(buf) > end + 4 else b""
        framing = self.framing = head.framing
        if framing is NONE:
            self._state = _DONE
            out.append(End(head.keep_alive, _NO_TRAILERS))
            self.trailing_data = rest
            return
        body: _LengthReader | _ChunkedReader | _CloseReader
        if framing is LENGTH:
            assert head.length is not None
            body = _LengthReader(head.length, head.keep_alive)
        elif framing is CHUNKED:
            body = _ChunkedReader(head.keep_alive)
        else:
            body = _CloseReader()
        self._body = body
        self._state = _BODY
        if rest:
            try:
                left = body.feed(rest, out)
            except ResponseError as error:
                self._state = _ERROR
                out.append(error)
                return
            if left is not None:
                self._state = _DONE
                self.trailing_data = left

    def _wait(self, buffer: bytearray) -> None:
        """No complete head yet: remember where to look next time (a head
        that ends later is at least one byte longer than ``buffer``)."""
        if self._consumed + len(buffer) >= self.max_head:
            raise ResponseError(f"response head over {self.max_head} bytes")
        self._scan = max(0, len(buffer) - 3)

    def connection_closed(self) -> list[Event]:
        """The events that the end of the connection completes: the End of
        a close-delimited body, or ResponseIncomplete for anything cut
        short."""
        state = self._state
        if state == _BODY:
            assert self._body is not None
            out: list[Event] = []
            self._body.closed(out)
            self._state = _ERROR if isinstance(out[-1], ResponseError) else _DONE
            return out
        if state == _HEAD:
            self._state = _ERROR
            return [ResponseIncomplete("closed before the response head")]
        return []

    @property
    def done(self) -> bool:
        """The response is complete."""
        return self._state == _DONE
