"""Protocol upgrades (WebSocket and the like), without I/O: which requests
are tunnelled, the headers that ask the upstream to upgrade, and the 101
head that goes back to the client.

A request is an upgrade the proxy tunnels when it is an HTTP/1.1 ``GET``
without a body whose ``Connection`` header lists ``upgrade`` and whose
``Upgrade`` header names, first, a protocol the site allows (by default
``websocket``; ``[sites.NAME] upgrade = [...]``).  Such a request goes
upstream with its ``Upgrade`` header and ``Connection: upgrade``; a ``101``
answer turns both connections into a tunnel (``prexy.proxy.tunnel``), any
other answer is an ordinary response.  Every other request loses both
headers on the way, as hop-by-hop headers do (RFC 9110 7.6.1).

Bytes a client sends after its upgrade request and before the answer are
held by the channel: they go through the tunnel first after a 101, or are
the connection's next request otherwise (``ProxyChannel``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prexy.forwarding import HOP_BY_HOP

__all__ = ["DEFAULT_PROTOCOLS", "protocol_name", "tunnel_head", "upgrade_request"]

#: What a site tunnels unless its config says otherwise.
DEFAULT_PROTOCOLS: tuple[str, ...] = ("websocket",)


def protocol_name(value: bytes) -> bytes:
    """The first protocol an ``Upgrade`` value names, lower-cased and
    without its version (``WebSocket`` -> ``websocket``, ``foo/2, bar``
    -> ``foo``)."""
    return value.split(b",", 1)[0].split(b"/", 1)[0].strip().lower()


def upgrade_request(
    raw: Mapping[bytes, Sequence[bytes]],
    *,
    method: bytes,
    version: bytes,
    has_body: bool,
    allowed: frozenset[bytes],
) -> bytes | None:
    """The ``Upgrade`` value to send upstream when this request is one the
    site tunnels, else None.  ``raw``: the client's headers by lower-case
    name; ``allowed``: lower-case protocol names."""
    if not allowed or method != b"GET" or version != b"HTTP/1.1" or has_body:
        return None
    upgrade = raw.get(b"upgrade")
    connection = raw.get(b"connection")
    if not upgrade or not connection or len(upgrade) != 1:
        return None
    if not any(t.strip().lower() == b"upgrade" for v in connection for t in v.split(b",")):
        return None
    value = upgrade[0].strip()
    if not value or protocol_name(value) not in allowed:
        return None
    return value


def upgrade_headers(value: bytes) -> list[tuple[bytes, bytes]]:
    """The hop-by-hop pair that asks the upstream to switch to ``value``."""
    return [(b"Connection", b"upgrade"), (b"Upgrade", value)]


def tunnel_head(phrase: bytes, headers: Sequence[tuple[bytes, bytes]], upgrade: bytes | None) -> bytes:
    """The client's ``101`` head for the upstream's: its end-to-end headers
    (``headers``, as received), then ``Connection: upgrade`` and the
    protocol the upstream switched to (``upgrade``: its ``Upgrade`` value)."""
    drop = HOP_BY_HOP
    connection = [t.strip().lower() for n, v in headers if n.lower() == b"connection" for t in v.split(b",")]
    if connection:
        drop = drop | frozenset(connection)
    lines = [b"HTTP/1.1 101 ", phrase or b"Switching Protocols", b"\r\n"]
    for name, value in headers:
        if name.lower() not in drop:
            lines += (name, b": ", value, b"\r\n")
    lines.append(b"Connection: upgrade\r\n")
    if upgrade:
        lines += (b"Upgrade: ", upgrade, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)
