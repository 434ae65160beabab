"""Streaming content codings around the transducer: gzip/deflate in, gzip out.

Upstreams are asked for ``identity``, but some compress anyway; their bodies
are decoded chunk by chunk before substitution (compressed bytes never reach
the transducer) and compressed again, chunk by chunk, for clients that accept
gzip.  Pure stdlib zlib, no Twisted.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

#: Codings we can decode before rewriting.
DECODABLE = frozenset({b"gzip", b"x-gzip", b"deflate"})


class DecodeError(Exception):
    """The upstream's compressed body is corrupt."""


class Decoder:
    """Incremental gzip or deflate decoder."""

    def __init__(self, coding: bytes) -> None:
        self.coding = coding.lower()
        if self.coding in (b"gzip", b"x-gzip"):
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._raw_fallback = False
        elif self.coding == b"deflate":
            # "deflate" is meant to be zlib-wrapped, but some servers send raw
            # deflate: decide on the first bytes.
            self._d = zlib.decompressobj(zlib.MAX_WBITS)
            self._raw_fallback = True
        else:
            raise ValueError(f"cannot decode {coding!r}")
        self._started = False

    def feed(self, data: bytes) -> bytes:
        try:
            if not self._started and self._raw_fallback:
                self._started = True
                try:
                    probe = zlib.decompressobj(zlib.MAX_WBITS)
                    probe.decompress(data[:64])
                except zlib.error:
                    self._d = zlib.decompressobj(-zlib.MAX_WBITS)
            self._started = True
            return self._d.decompress(data)
        except zlib.error as exc:
            raise DecodeError(f"bad {self.coding.decode()} body: {exc}") from None

    def finish(self) -> bytes:
        try:
            tail = self._d.flush()
        except zlib.error as exc:
            raise DecodeError(f"bad {self.coding.decode()} body: {exc}") from None
        if self._started and not self._d.eof and self.coding != b"deflate":
            raise DecodeError(f"truncated {self.coding.decode()} body")
        return tail


class GzipEncoder:
    """Incremental gzip encoder; each fed chunk is flushed so streaming
    latency does not grow (a sync flush costs a few bytes per chunk)."""

    def __init__(self, level: int = 6) -> None:
        self._c = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._c.flush(zlib.Z_FINISH)


def accepts_gzip(accept_encoding: Sequence[bytes] | None) -> bool:
    """Whether an Accept-Encoding header allows gzip (q > 0)."""
    if not accept_encoding:
        return False
    for value in accept_encoding:
        for item in value.split(b","):
            coding, _, params = item.strip().partition(b";")
            coding = coding.strip().lower()
            if coding in (b"gzip", b"x-gzip", b"*"):
                q = 1.0
                for p in params.split(b";"):
                    k, _, v = p.strip().partition(b"=")
                    if k.strip().lower() == b"q":
                        try:
                            q = float(v)
                        except ValueError:
                            q = 0.0
                if q > 0:
                    return True
    return False
