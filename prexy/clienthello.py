"""A TLS ClientHello read before the TLS layer sees it: its server name.

Pure (no Twisted, no I/O): bytes go in (:meth:`ClientHelloReader.feed`),
in pieces as they arrive, and once the first handshake message is whole
an outcome comes out: :class:`Hello` (the SNI host name, None when the
client sent none, and the ALPN protocols offered) or :class:`NotAHello`
(the bytes are not a TLS ClientHello, or it is larger than the bound).
The reader never raises on what it is fed and keeps nothing but what it
needs: the caller hands every byte on to the TLS layer unchanged, which
answers garbage with its usual alert.

The ClientHello may span several handshake records (RFC 8446 5.1 allows a
message fragmented across records); records of any other content type
before it is whole are not a hello.  ``limit`` bounds the handshake
message (16 KiB by default: real hellos, post-quantum key shares
included, are under 2 KiB).
"""

from __future__ import annotations

import attrs

__all__ = ["ClientHelloReader", "Hello", "NotAHello", "parse_client_hello"]

_HANDSHAKE = 22
_CLIENT_HELLO = 1
_SERVER_NAME = 0
_ALPN = 16
_HOST_NAME = 0
#: A TLS record's largest plaintext fragment (RFC 8446 5.1).
_MAX_FRAGMENT = 1 << 14


@attrs.frozen
class Hello:
    """A whole ClientHello: its SNI host name (bytes as sent; None: none)
    and the ALPN protocols it offers (empty: none)."""

    server_name: bytes | None
    alpn: tuple[bytes, ...] = ()


@attrs.frozen
class NotAHello:
    """The bytes are not a TLS ClientHello (or not one within the bound);
    ``reason`` says why."""

    reason: str


class ClientHelloReader:
    """Reads the first handshake message of a TLS connection from its
    bytes, fed in pieces of any size."""

    def __init__(self, limit: int = 16384) -> None:
        self.limit = limit
        #: Record bytes not yet parsed (a partial record header or fragment).
        self._pending = bytearray()
        #: The handshake bytes of the records read so far.
        self._handshake = bytearray()
        self.outcome: Hello | NotAHello | None = None

    def feed(self, data: bytes) -> Hello | NotAHello | None:
        """The outcome once the bytes fed so far decide it, else None
        (more needed).  After an outcome, further bytes change nothing."""
        if self.outcome is not None:
            return self.outcome
        self._pending += data
        self.outcome = self._read()
        if self.outcome is not None:
            self._pending = bytearray()
            self._handshake = bytearray()
        return self.outcome

    def _read(self) -> Hello | NotAHello | None:
        pending = self._pending
        while len(pending) >= 5:
            kind, major, length = pending[0], pending[1], (pending[3] << 8) | pending[4]
            if kind != _HANDSHAKE:
                return NotAHello(f"record of content type {kind}, not a handshake")
            if major != 3:
                return NotAHello(f"record version {major}.{pending[2]} is not TLS")
            if length == 0 or length > _MAX_FRAGMENT:
                return NotAHello(f"record of {length} bytes")
            if len(pending) < 5 + length:
                # The message's header may be here already: judge it now.
                return self._header(self._handshake[:4] + pending[5:9])
            self._handshake += pending[5 : 5 + length]
            del pending[: 5 + length]
            found = self._message()
            if found is not None:
                return found
        return None

    def _header(self, handshake: bytes | bytearray) -> NotAHello | None:
        """The start of the handshake bytes refused (not a ClientHello, or
        one over the bound), else None."""
        if not handshake:
            return None
        if handshake[0] != _CLIENT_HELLO:
            return NotAHello(f"handshake message of type {handshake[0]}, not a ClientHello")
        if len(handshake) >= 4:
            size = (handshake[1] << 16) | (handshake[2] << 8) | handshake[3]
            if size > self.limit:
                return NotAHello(f"ClientHello of {size} bytes, over the bound of {self.limit}")
        return None

    def _message(self) -> Hello | NotAHello | None:
        handshake = self._handshake
        refused = self._header(handshake)
        if refused is not None:
            return refused
        if len(handshake) < 4:
            return None
        size = (handshake[1] << 16) | (handshake[2] << 8) | handshake[3]
        if len(handshake) < 4 + size:
            return None
        return parse_client_hello(bytes(handshake[4 : 4 + size]))


class _Short(Exception):
    pass


class _Cursor:
    """Reads big-endian fields off a bytes value; :class:`_Short` past its end."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise _Short
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def number(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, n: int) -> bytes:
        """A field prefixed by its length in ``n`` bytes."""
        return self.take(self.number(n))

    @property
    def left(self) -> int:
        return len(self.data) - self.at


def parse_client_hello(body: bytes) -> Hello | NotAHello:
    """The SNI name and ALPN protocols of a ClientHello's body (the
    handshake message after its 4-byte header)."""
    try:
        return _parse(_Cursor(body))
    except _Short:
        return NotAHello("ClientHello shorter than its fields say")


def _parse(hello: _Cursor) -> Hello | NotAHello:
    if hello.number(1) != 3:
        return NotAHello("ClientHello version is not TLS")
    hello.take(1 + 32)  # minor version, random
    if len(hello.vector(1)) > 32:
        return NotAHello("session id longer than 32 bytes")
    suites = hello.vector(2)
    if not suites or len(suites) % 2:
        return NotAHello("cipher suites not a list of pairs")
    if not hello.vector(1):
        return NotAHello("no compression methods")
    if hello.left == 0:
        return Hello(None)
    extensions = hello.vector(2)
    if hello.left:
        return NotAHello("bytes after the extensions")
    name: bytes | None = None
    alpn: tuple[bytes, ...] = ()
    seen: set[int] = set()
    # (Indexed by hand: a hello has some twenty extensions, read per connection.)
    at, end = 0, len(extensions)
    while at < end:
        if at + 4 > end:
            raise _Short
        kind = (extensions[at] << 8) | extensions[at + 1]
        size = (extensions[at + 2] << 8) | extensions[at + 3]
        at += 4
        if at + size > end:
            raise _Short
        if kind in seen:
            return NotAHello(f"extension {kind} twice")
        seen.add(kind)
        if kind == _SERVER_NAME:
            name = _server_name(_Cursor(extensions[at : at + size]))
        elif kind == _ALPN:
            alpn = _protocols(_Cursor(extensions[at : at + size]))
        at += size
    return Hello(name, alpn)


def _server_name(data: _Cursor) -> bytes | None:
    names = _Cursor(data.vector(2))
    if data.left:
        raise _Short
    while names.left:
        kind = names.number(1)
        value = names.vector(2)
        if kind == _HOST_NAME:
            return value or None
    return None


def _protocols(data: _Cursor) -> tuple[bytes, ...]:
    offered = _Cursor(data.vector(2))
    if data.left:
        raise _Short
    out = []
    while offered.left:
        out.append(offered.vector(1))
    return tuple(out)
