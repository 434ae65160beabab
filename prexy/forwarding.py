"""Header rules of a reverse proxy: hop-by-hop removal and forwarding headers.

Pure functions (no Twisted: the cores and the shell both use them) over
``(name, value)`` byte pairs, easy to test and cheap per request.  Repeated headers (``Set-Cookie``) stay separate pairs.
The response side lives in ``UpstreamResponse.end_to_end``, which reuses the
lower-cased names the upstream parser already computed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
