"""Header rules of a reverse proxy: hop-by-hop removal and forwarding headers.

Pure functions over ``(name, value)`` byte pairs so they are easy to test and
cheap per request.  Repeated headers (``Set-Cookie``) stay separate pairs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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


def connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> frozenset[bytes]:
    """Lower-cased header names listed in every ``Connection`` header."""
    names: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            for token in value.split(b","):
                token = token.strip().lower()
                if token:
                    names.add(token)
    return frozenset(names)


def end_to_end(
    headers: list[tuple[bytes, bytes]], also_drop: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """The headers that may cross the proxy: hop-by-hop ones and those named in
    ``Connection`` removed, as well as any in ``also_drop`` (lower-case)."""
    named = connection_tokens(headers)
    drop = HOP_BY_HOP | named | also_drop
    return [(n, v) for n, v in headers if n.lower() not in drop]


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
