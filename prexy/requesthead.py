"""The rules a client's request head must meet, checked on its raw bytes.

twisted.web's HTTP/1.1 parser is lenient where a proxy must not be: it joins
obs-fold continuation lines (so a ``Transfer-Encoding`` can hide on one), it
keeps two Host headers and lets the first win, it waits for ever on
LF-only line ends, and it takes ``GET *`` or a target with a DEL byte.
A front proxy that forwards what the next hop reads differently is a request
smuggling hole, so Prexy checks each head here first and twisted.web only
ever sees heads that passed.  The rules are RFC 9112's, made as strict as
nginx 1.22 where nginx refuses more (``tests/integration/test_strict.py``
sends the same requests to both):

- Line ends are CRLF; a bare CR or LF, or a line that starts with white
  space (obs-fold, RFC 9112 5.2), is a 400.  Empty lines before the
  request line are skipped (RFC 9112 2.2; nginx does the same).
- The request line is ``METHOD SP target SP HTTP/1.x``.  The method is
  upper-case letters, ``_`` and ``-`` (nginx's set; ``get`` is a 400).  Other
  versions get 505.  ``CONNECT`` gets 405: Prexy is not a forward proxy.
- The target is origin-form (``/path?query``) or absolute-form with an
  ``http`` or ``https`` scheme, whose authority then wins over the Host
  header (RFC 9112 3.2.2).  ``*``, other schemes, a userinfo, bytes outside
  visible ASCII, ``#``, a bad ``%`` escape, ``%00``, and dot-segments that
  climb above the root are 400s.
- Header names are tokens; a value holds no control byte but HTAB.
- Exactly one Host on HTTP/1.1 (none or several: 400), with a host a name
  can have (no white space, ``/``, ``\\``, ``@``, empty label, or port that is
  not digits).
- Content-Length is digits and said once; Transfer-Encoding is said once,
  never beside Content-Length or on HTTP/1.0 (400), and ``chunked`` is the
  only coding (anything else: 501, as nginx answers).
- The request line is at most ``max_request_line`` bytes (else 414), each
  header line at most ``max_header_line``, the whole head at most
  ``max_request_head`` and the header lines at most ``max_header_lines``
  in number (else 431).

``HeadGate`` holds a head's bytes until the head is complete, so nothing of
a head that is refused reaches twisted.web.  It imports no Twisted.
"""

from __future__ import annotations

import re
from typing import NamedTuple

import attrs

from prexy.config import Limits

#: Body framings a head can announce.
NO_BODY = "none"
LENGTH = "length"
CHUNKED = "chunked"


@attrs.frozen
class Refusal:
    """A head that is not answered normally: the status to send and why."""

    status: int
    reason: str


class Head(NamedTuple):
    """What a head that passed says, for the proxy to act on.  (A named
    tuple: made once per request, it costs a quarter of a frozen attrs
    class.)"""

    method: bytes
    #: The target in origin-form (an absolute-form target's path and query).
    target: bytes
    #: The authority to route by: an absolute-form target's, else the Host
    #: header's; None on an HTTP/1.0 request without Host.
    host: bytes | None
    version: bytes
    #: The Host header differed from the absolute-form target's authority
    #: (or was missing), so the proxy must replace it.
    replace_host: bool
    framing: str
    #: The Content-Length, when ``framing`` is ``LENGTH``.
    length: int = 0

    @property
    def has_body(self) -> bool:
        return self.framing == CHUNKED or (self.framing == LENGTH and self.length > 0)


_REQUEST_LINE = re.compile(rb"([A-Z_-]{1,32}) ([^ ]+) HTTP/([0-9])\.([0-9])")
_FIELD = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*")
#: Bytes a field value may not hold: controls but HTAB, and DEL.
_BAD_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
#: Bytes a request target may not hold: controls, space, DEL, non-ASCII, '#'.
_BAD_TARGET = re.compile(rb"[\x00-\x20\x7f-\xff#]")
_BAD_ESCAPE = re.compile(rb"%(?![0-9A-Fa-f]{2})|%00")
#: A reg-name (RFC 3986 3.2.2) and a port; bytes >= 0x80 pass, as in nginx.
_REG_NAME = re.compile(rb"[A-Za-z0-9\-._~!$&'()*+,;=%\x80-\xff]+")
_IP_LITERAL = re.compile(rb"\[[0-9A-Fa-f:.]+\]|\[v[0-9A-Fa-f]+\.[A-Za-z0-9\-._~!$&'()*+,;=:]+\]")
_DIGITS = re.compile(rb"[0-9]*")
_SCHEME = re.compile(rb"(?i:https?)://")


#: The shape of nearly every Host: labels of letters, digits and '-', a port.
_PLAIN_HOST = re.compile(rb"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.?(?::[0-9]{0,5})?")


def check_host(value: bytes) -> str | None:
    """Why ``value`` cannot be a Host (an authority: host and optional
    port), or None when it can."""
    if _PLAIN_HOST.fullmatch(value):
        return None
    if not value:
        return "empty Host"
    if value.startswith(b"["):
        end = value.find(b"]")
        literal, rest = value[: end + 1], value[end + 1 :]
        if end < 0 or not _IP_LITERAL.fullmatch(literal):
            return "bad IP literal in Host"
    else:
        colon = value.rfind(b":")
        literal, rest = (value, b"") if colon < 0 else (value[:colon], value[colon:])
        if not _REG_NAME.fullmatch(literal):
            return "a host name cannot hold these characters"
        if b".." in literal:
            return "empty label in host name"
    if rest and (rest[:1] != b":" or not _DIGITS.fullmatch(rest, 1) or len(rest) > 6):
        return "port is not a number"
    return None


def _climbs_above_root(path: bytes) -> bool:
    """Whether the dot-segments of ``path`` (escaped dots included) go
    above the root, as ``/../etc`` does."""
    if b"." not in path and b"%2" not in path:
        return False
    depth = 0
    for segment in path.split(b"/")[1:]:
        segment = segment.replace(b"%2e", b".").replace(b"%2E", b".")
        if segment == b"..":
            depth -= 1
            if depth < 0:
                return True
        elif segment != b".":
            depth += 1
    return False


def check_target(method: bytes, target: bytes) -> tuple[bytes, bytes | None] | Refusal:
    """``(origin-form target, authority or None)`` for a request target,
    or the refusal."""
    if _BAD_TARGET.search(target):
        return Refusal(400, "request target holds a byte it cannot hold")
    authority = None
    if target[:1] != b"/":
        if target == b"*":
            return Refusal(400, "asterisk-form target")
        if not _SCHEME.match(target):
            return Refusal(400, "request target is neither /path nor an http(s) URL")
        rest = target[target.index(b"//") + 2 :]
        end = len(rest)
        for sep in (b"/", b"?"):
            i = rest.find(sep)
            if 0 <= i < end:
                end = i
        authority, target = rest[:end], rest[end:]
        if b"@" in authority:
            return Refusal(400, "userinfo in request target")
        why = check_host(authority)
        if why is not None:
            return Refusal(400, f"request target: {why}")
        if not target.startswith(b"/"):
            target = b"/" + target
    if b"%" in target and _BAD_ESCAPE.search(target):
        return Refusal(400, "bad percent-escape in request target")
    path = target.split(b"?", 1)[0]
    if _climbs_above_root(path):
        return Refusal(400, "request target climbs above the root")
    return target, authority


class HeadReader:
    """Reads one head a line at a time, the request line first, and checks
    each line as it comes (so a bad request line is answered before the
    rest of its head arrives); ``end`` checks the head as a whole."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._request: tuple[bytes, bytes, bytes | None, bytes] | None = None
        #: Header lines read so far.
        self._fields = 0
        self._hosts: list[bytes] = []
        self._length: bytes | None = None
        self._coding: bytes | None = None

    def line(self, line: bytes) -> Refusal | None:
        if self._request is None:
            return self._request_line(line)
        self._fields += 1
        if self._fields > self.limits.max_header_lines:
            return Refusal(431, "too many header lines")
        if len(line) > self.limits.max_header_line:
            return Refusal(431, "header line too long")
        if line[:1] in (b" ", b"\t"):
            return Refusal(400, "obs-fold continuation line")
        f = _FIELD.fullmatch(line)
        if f is None:
            return Refusal(400, "malformed header line")
        name, value = f.groups()
        if _BAD_VALUE.search(value):
            return Refusal(400, "control character in a header value")
        lname = name.lower()
        if lname == b"host":
            self._hosts.append(value)
        elif lname == b"content-length":
            if self._length is not None:
                return Refusal(400, "Content-Length given twice")
            if not value.isdigit():
                return Refusal(400, "Content-Length is not a number")
            self._length = value
        elif lname == b"transfer-encoding":
            if self._coding is not None:
                return Refusal(400, "Transfer-Encoding given twice")
            self._coding = value
        return None

    def _request_line(self, line: bytes) -> Refusal | None:
        if len(line) > self.limits.max_request_line:
            return Refusal(414, "request line too long")
        m = _REQUEST_LINE.fullmatch(line)
        if m is None:
            return Refusal(400, "malformed request line")
        method, target, major, minor = m.groups()
        if major != b"1" or minor not in (b"0", b"1"):
            return Refusal(505, "HTTP version not supported")
        if method == b"CONNECT":
            return Refusal(405, "CONNECT is not supported")
        checked = check_target(method, target)
        if isinstance(checked, Refusal):
            return checked
        self._request = (method, checked[0], checked[1], b"HTTP/1." + minor)
        return None

    def end(self) -> Head | Refusal:
        if self._request is None:
            return Refusal(400, "empty request head")
        method, target, authority, version = self._request
        return conclude(method, target, authority, version, self._hosts, self._length, self._coding)


def conclude(
    method: bytes, target: bytes, authority: bytes | None, version: bytes,
    hosts: list[bytes], length: bytes | None, coding: bytes | None,
) -> Head | Refusal:
    """The checks of a head as a whole, once its lines passed: Host, and
    the body's framing."""
    if len(hosts) > 1:
        return Refusal(400, "more than one Host header")
    host = hosts[0] if hosts else None
    if host is not None:
        why = check_host(host)
        if why is not None:
            return Refusal(400, why)
    elif version == b"HTTP/1.1":
        return Refusal(400, "HTTP/1.1 request without Host")
    framing, size = NO_BODY, 0
    if coding is not None:
        if version == b"HTTP/1.0":
            return Refusal(400, "Transfer-Encoding on an HTTP/1.0 request")
        if coding.lower() != b"chunked":
            return Refusal(501, "only the chunked transfer coding is supported")
        if length is not None:
            return Refusal(400, "Transfer-Encoding beside Content-Length")
        framing = CHUNKED
    elif length is not None:
        framing, size = LENGTH, int(length)
    route = authority if authority is not None else host
    replace = authority is not None and (host is None or host.lower() != authority.lower())
    return Head(method, target, route, version, replace, framing, size)


#: A whole head in the shape almost every client sends, checked by one
#: regular expression (see ``fast_head``): the same grammar as
#: ``HeadReader``'s line by line.
_FAST_HEAD = re.compile(
    rb"([A-Z_-]{1,32}) (/[!\x22$-~]*|[hH][tT][tT][pP][sS]?://[!\x22$-~]*) HTTP/1\.([01])\r\n"
    # the fields; a Host first (as browsers, curl and wrk send it) is captured
    rb"((?:[Hh][Oo][Ss][Tt]:[ \t]*([\t\x20-\x7e\x80-\xff]*)\r\n)?"
    rb"(?:[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t\x20-\x7e\x80-\xff]*\r\n)*)\r\n"
)
_HTTP10, _HTTP11 = b"HTTP/1.0", b"HTTP/1.1"


def _values(block: bytes, low: bytes, key: bytes) -> list[bytes] | None:
    """The values of the fields named ``key`` (``b"host:"``) in a block of
    field lines (``low`` is the block lower-cased), or None for none."""
    if low.startswith(key):
        at = 0
    else:
        at = low.find(b"\n" + key) + 1
        if not at:
            return None
    out = []
    while True:
        start = at + len(key)
        end = block.index(b"\r", start)
        out.append(block[start:end].strip(b" \t"))
        at = low.find(b"\n" + key, end) + 1
        if not at:
            return out


def fast_head(data: bytes, start: int, end: int) -> Head | Refusal | None:
    """The verdict on the head ``data[start:end]`` (its final empty line
    included) when it has the common shape, else None (for ``HeadReader``
    to read it line by line).  It gives what ``HeadReader`` gives on the
    same head (the tests compare the two) in a third to a fifth of the
    instructions (callgrind: wrk's 57-byte head, a 499-byte browser head).
    A first Host with a plain name and no body is decided without
    ``conclude``."""
    m = _FAST_HEAD.match(data, start, end)
    if m is None or m.end() != end:
        return None
    method, target, minor, block, first_host = m.groups()
    if method == b"CONNECT":
        return None
    authority = None
    if target[:1] == b"/":
        # Only a '%' or a dot-segment ("/." or "/%2e") needs a closer look.
        if b"%" in target or b"/." in target:
            checked = check_target(method, target)
            if isinstance(checked, Refusal):
                return checked
    else:
        checked = check_target(method, target)
        if isinstance(checked, Refusal):
            return checked
        target, authority = checked
    low = block.lower()
    if (
        first_host is not None and authority is None and b"\nhost:" not in low
        and b"content-length:" not in low and b"transfer-encoding:" not in low
        and _PLAIN_HOST.fullmatch(first_host)
    ):
        # One plain Host, first, and no body: nothing else to decide.
        return Head(method, target, first_host, _HTTP11 if minor == b"1" else _HTTP10, False, NO_BODY, 0)
    low = block.lower()
    length = coding = None
    lengths = _values(block, low, b"content-length:")
    if lengths is not None:
        if len(lengths) > 1:
            return Refusal(400, "Content-Length given twice")
        length = lengths[0]
        if not length.isdigit():
            return Refusal(400, "Content-Length is not a number")
    codings = _values(block, low, b"transfer-encoding:")
    if codings is not None:
        if len(codings) > 1:
            return Refusal(400, "Transfer-Encoding given twice")
        coding = codings[0]
    hosts = _values(block, low, b"host:") or []
    return conclude(method, target, authority, b"HTTP/1." + minor, hosts, length, coding)


def parse_head(lines: list[bytes], limits: Limits) -> Head | Refusal:
    """Check a complete head, given as its lines without line ends (the
    request line first, no empty line)."""
    reader = HeadReader(limits)
    for line in lines:
        refusal = reader.line(line)
        if refusal is not None:
            return refusal
    return reader.end()


@attrs.frozen
class Pending:
    """The head is not complete yet; its bytes so far are held."""


class Passed(NamedTuple):
    """A head passed: ``data`` is all bytes held and given, for the HTTP
    parser (the head, and whatever followed it)."""

    head: Head
    data: bytes


PENDING = Pending()


class HeadGate:
    """Holds the bytes of one request head until it is complete, then
    checks it (``feed``).  After a head passed, the gate lets bytes through
    untouched until ``reset`` (the request is done and the next head may
    start).

    Bytes are scanned once, line by line as they arrive, so a head sent a
    byte at a time costs what it costs whole, and the limits refuse a head
    as soon as it outgrows them rather than when it ends."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        #: Heads up to this size may take the one-expression path: no line
        #: of theirs can be over a line limit.
        self._fast_limit = min(limits.max_request_line, limits.max_header_line, limits.max_request_head)
        #: Heads up to this size cannot hold more header lines than the
        #: limit: the shortest request line is 14 bytes
        #: (``A / HTTP/1.0\r\n``), a header line 4 (``a:\r\n``), the end 2.
        #: A larger one has its LFs counted before the fast path (about 4%
        #: more instructions for a browser-sized head); wrk's 57-byte head
        #: is not counted.
        self._lines_fit = 14 + 4 * (limits.max_header_lines + 1) + 2 - 1
        self.reset()

    def reset(self) -> None:
        #: The bytes held while a head is incomplete (None: nothing held).
        self._buf: bytearray | None = None
        #: Where the current (incomplete) line starts in ``_buf``.
        self._pos = 0
        #: Where the head starts (after the empty lines skipped).
        self._start = 0
        self._lines = 0
        self._reader: HeadReader | None = None
        #: A head has passed and the gate is open until ``reset``.
        self.open = False
        #: Bytes of the current head have arrived (its deadline runs).
        self.started = False

    def feed(self, data: bytes) -> Passed | Pending | Refusal:
        if not data:
            return PENDING
        self.started = True
        held = self._buf
        if held is None:
            # A whole head in one read, the common case: one expression.
            start = 0
            while data.startswith(b"\r\n", start):
                start += 2
            end = data.find(b"\r\n\r\n", start) + 4
            if 4 <= end - start <= self._fast_limit and (
                # Too many lines: the line reader refuses it where it would.
                end - start <= self._lines_fit
                or data.count(b"\n", start, end) - 2 <= self.limits.max_header_lines
            ):
                result = fast_head(data, start, end)
                if result is not None:
                    if isinstance(result, Refusal):
                        return result
                    self.open = True
                    return Passed(result, data[start:] if start else data)
            held = self._buf = bytearray()
            self._reader = HeadReader(self.limits)
        if held:
            held += data
            buf: bytes | bytearray = held
        else:
            buf = data
        reader = self._reader
        assert reader is not None
        limits = self.limits
        lines = self._lines
        pos = self._pos
        find = buf.find
        while True:
            i = find(b"\n", pos)
            if i < 0:
                break
            if i == pos or buf[i - 1] != 13:
                return Refusal(400, "bare LF in the request head")
            line = bytes(buf[pos : i - 1])
            if b"\r" in line:
                return Refusal(400, "bare CR in the request head")
            pos = i + 1
            if not line:
                if lines:
                    result = reader.end()
                    if isinstance(result, Refusal):
                        return result
                    # Empty lines before the request line are skipped
                    # here, as nginx does (twisted.web skips only one).
                    out = bytes(buf[self._start :])
                    self.reset()
                    self.open = True
                    return Passed(result, out)
                self._start = pos
                continue
            if lines:
                if len(line) > limits.max_header_line:
                    return Refusal(431, "header line too long")
            elif len(line) > limits.max_request_line:
                return Refusal(414, "request line too long")
            refusal = reader.line(line)
            if refusal is not None:
                return refusal
            lines += 1
            if pos - self._start > limits.max_request_head:
                return Refusal(431, "request head too large")
        self._lines = lines
        # An incomplete line: refuse now what can already be refused, so a
        # client cannot make the gate hold more than a head may be.
        size = len(buf)
        partial = size - pos
        if partial:
            if find(b"\r", pos, size - 1) >= 0:
                return Refusal(400, "bare CR in the request head")
            if buf[size - 1] == 13:
                partial -= 1
            if lines:
                if partial > limits.max_header_line:
                    return Refusal(431, "header line too long")
            elif partial > limits.max_request_line:
                return Refusal(414, "request line too long")
        if size - self._start > limits.max_request_head:
            return Refusal(431, "request head too large")
        if not held:
            held += buf
        self._pos = pos
        return PENDING


_HEX = frozenset(b"0123456789abcdefABCDEF")


class ChunkedCheck:
    """Follows the framing of a chunked request body beside twisted.web's
    decoder, only to refuse at once what that decoder would wait on until
    the body deadline: a chunk-size or trailer line ended by a bare LF (400,
    as a bare LF in a head is), a chunk size that is not hex digits, and a
    chunk-size line over 4 KiB.  Chunk data is skipped by count, not read.
    ``done`` once the last chunk and its trailer section have passed; what
    follows is not looked at."""

    MAX_LINE = 4096

    def __init__(self) -> None:
        self._left = 0
        self._line = b""
        self._trailer = False
        self.done = False

    def feed(self, data: bytes) -> Refusal | None:
        pos, n = 0, len(data)
        while pos < n and not self.done:
            if self._left:
                take = min(self._left, n - pos)
                self._left -= take
                pos += take
                continue
            i = data.find(b"\n", pos)
            if i < 0:
                self._line += data[pos:]
                if len(self._line) > self.MAX_LINE:
                    return Refusal(400, "chunk-size line too long")
                return None
            line, self._line = self._line + data[pos:i], b""
            pos = i + 1
            if not line.endswith(b"\r"):
                return Refusal(400, "bare LF in a chunked body")
            line = line[:-1]
            if len(line) > self.MAX_LINE:
                return Refusal(400, "chunk-size line too long")
            if self._trailer:
                self.done = not line
                continue
            size = line.split(b";", 1)[0].rstrip(b" \t")
            if not size or not _HEX.issuperset(size):
                return Refusal(400, "chunk size is not hex digits")
            length = int(size, 16)
            if length:
                self._left = length + 2  # the data and its CRLF (twisted.web checks the CRLF)
            else:
                self._trailer = True
        return None
