"""Header rules of a reverse proxy: hop-by-hop removal and forwarding headers.

Pure functions over ``(name, value)`` byte pairs so they are easy to test and
cheap per request.  Repeated headers (``Set-Cookie``) stay separate pairs.
The response side lives in ``UpstreamResponse.end_to_end``, which reuses the
lower-cased names the upstream parser already computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Headers that describe one connection, never forwarded (RFC 9110 7.6.1),
#: plus Proxy-Authorization/-Authenticate which are meant for this proxy.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authorization",
        b"proxy-authenticate",
    }
)

VIA = b"1.1 prexy"


def raw_header_dict(headers: Any) -> dict[bytes, Sequence[bytes]]:
    """Lower-case name -> values of a twisted.web Headers object.

    Reads Headers' own table (one entry per name) rather than
    getAllRawHeaders(), which re-capitalises every name on every call; falls
    back to the public API if that attribute ever goes away."""
    table = getattr(headers, "_rawHeaders", None)
    items = table.items() if isinstance(table, dict) else headers.getAllRawHeaders()
    return {name.lower(): values for name, values in items}


def forwardable(raw: Mapping[bytes, Sequence[bytes]], drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
    """Request header pairs that may go upstream: without those in ``drop``
    (lower-case names; pass one that includes HOP_BY_HOP) and those named in
    Connection."""
    connection = raw.get(b"connection")
    if connection:
        drop = drop | {t.strip().lower() for v in connection for t in v.split(b",")}
    return [(name, value) for name, values in raw.items() if name not in drop for value in values]


def append_forwarded_for(existing: Sequence[bytes] | None, client_ip: bytes) -> bytes:
    """``X-Forwarded-For`` value with this client's address appended."""
    if existing:
        return b", ".join([*existing, client_ip])
    return client_ip


def append_via(existing: Sequence[bytes] | None) -> bytes:
    """``Via`` value with this proxy appended."""
    if existing:
        return b", ".join([*existing, VIA])
    return VIA


#: Header names whose presence sends a request down the full parser: a body,
#: a protocol switch, or a connection option the quick answer does not handle.
_NOT_SIMPLE = frozenset({b"content-length", b"transfer-encoding", b"expect", b"upgrade"})
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: Largest head answered without the full parser (twisted.web's own limits
#: are 16 KiB and 500 headers).
SIMPLE_HEAD_MAX = 8192
SIMPLE_HEAD_LINES = 100
_PRINTABLE = bytes(range(0x21, 0x7F))


def parse_simple_head(data: bytes) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]] | None:
    """``(method, target, [(lower-case name, value), ...])`` when ``data`` is
    exactly one complete, plain HTTP/1.1 GET or HEAD request head, and None
    for anything else (which then takes twisted.web's full parser).

    Plain means: origin-form target, no body, no obsolete line folding, no
    bare CR or LF, token header names, at most one Host, none of the headers
    in ``_NOT_SIMPLE``, and at most one Connection header, whose value is
    ``close`` or ``keep-alive``.  The answer for a head this accepts must be the same
    as the full parser's, so when in doubt it says None.
    """
    if len(data) > SIMPLE_HEAD_MAX or data.find(b"\r\n\r\n") != len(data) - 4:
        return None
    crlf = data.count(b"\r\n")
    if data.count(b"\n") != crlf or data.count(b"\r") != crlf or b"\x00" in data:
        return None
    lines = data[:-4].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3:
        return None
    method, target, version = parts
    if version != b"HTTP/1.1" or method not in (b"GET", b"HEAD") or not target.startswith(b"/"):
        return None
    if target.translate(None, _PRINTABLE) or len(lines) > SIMPLE_HEAD_LINES:
        return None
    pairs: list[tuple[bytes, bytes]] = []
    once: set[bytes] = set()  # Host and Connection: one of each at most
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep or not name or not _TOKEN.issuperset(name):
            return None
        lname = name.lower()
        if lname in _NOT_SIMPLE:
            return None
        value = value.strip(b" \t")
        if lname == b"host" or lname == b"connection":
            if lname in once:
                return None
            once.add(lname)
            if lname == b"connection" and value.lower() not in (b"close", b"keep-alive"):
                return None
        pairs.append((lname, value))
    return method, target, pairs
