"""Compressed variants of cached answers, without I/O.

The cache stores a rewritten answer as identity bytes (with the
``Vary: Accept-Encoding`` the proxy gave it).  A hit from a client that
takes a coding is served from a second object: the same answer compressed
once in that coding, stored beside the first under :func:`variant_key` and
purged, banned and expired with it.  The first hit in a coding compresses
(any worker; the store is shared), every later one serves the stored
bytes: a hit never compresses twice.

The variant's key holds the identity object's strong ETag, or else its
``stored_at``, so a new fetch of the URL with other bytes never finds the
bytes of an older body (those age out of the store on their own), while a
304 that refreshes the object keeps its copies.  The copy's head is always
made from the object's current head (``coded_headers``), so what a 304
changed shows in compressed hits too.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from prexy.cache.memo import Memo, Memos, object_size
from prexy.codec import Compression, coding_etag, encoder_for, negotiate

__all__ = ["VariantMemo", "coded_headers", "compress_whole", "stored_coding", "variant_key"]

_STORED_AT = struct.Struct(">d")


def stored_coding(
    status: int,
    headers: Sequence[tuple[bytes, bytes]],
    length: int,
    *,
    method: bytes,
    compression: Compression,
    accept_encoding: Sequence[bytes] | None,
) -> bytes | None:
    """The coding a stored answer goes to this client in (None: as stored).

    Only a 200 to GET or HEAD whose stored form is identity, that says
    ``Vary: Accept-Encoding`` (the answers the proxy compresses say so), of
    a compressible type, without ``no-transform``, and at least
    ``compression.min_length`` long; the coding is ``negotiate``'s."""
    if status != 200 or method not in (b"GET", b"HEAD") or not accept_encoding or length < compression.min_length:
        return None
    vary = False
    content_type = None
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-encoding":
            if value.strip().lower() not in (b"", b"identity"):
                return None
        elif lname == b"vary":
            names = [x.strip().lower() for x in value.split(b",")]
            vary = vary or b"accept-encoding" in names
        elif lname == b"content-type":
            if content_type is None:
                content_type = value
        elif lname == b"cache-control" and b"no-transform" in value.lower():
            return None
    if not vary or not compression.compressible(content_type):
        return None
    key = accept_encoding[0] if len(accept_encoding) == 1 else b", ".join(accept_encoding)
    try:
        return _NEGOTIATED[key]
    except KeyError:
        coding = negotiate([key])
        if len(_NEGOTIATED) < 256:  # browsers send a handful of values
            _NEGOTIATED[key] = coding
        return coding


#: Accept-Encoding value -> negotiate()'s answer.
_NEGOTIATED: dict[bytes, bytes | None] = {}


class VariantMemo(Memo[tuple[bytes, bytes], tuple[bytes, Any]]):
    """The compressed variants this process served last, one per object
    key and coding, each with the name of the body it holds (its variant
    key and the object's ``stored_at``, so a refreshed head is seen): a
    hit in a coding then reads the store once (the object) instead of
    twice.  A variant made for a newer body or head replaces the older
    one, so a page refetched every few minutes keeps one entry, not one
    per fetch.  Safe without invalidation: the name says which body it
    is, and the object itself is still looked up in the store first, so
    a purge, a ban or an expiry is seen there.  A part of the worker's
    memo budget (``[cache] memo_size``), or a budget of its own.

    ``bench/hits.py`` measures hits in a coding against identity hits
    (figures in bench/README.md)."""

    def __init__(self, budget: int | Memos = 16 * 1024 * 1024) -> None:
        super().__init__(budget, "variants", own_keys=True)

    def variant(self, key: bytes, coding: bytes, name: bytes) -> Any:
        """The variant of ``key`` in ``coding`` named ``name``, if kept."""
        entry = self.get((key, coding))
        if entry is None or entry[0] != name:
            return None
        return entry[1]

    def keep(self, key: bytes, coding: bytes, name: bytes, variant: Any) -> None:
        """Keep ``variant`` (named ``name``) as ``key``'s in ``coding``,
        charged for all it holds (``object_size``) and its name."""
        self.put((key, coding), (name, variant), 96 + len(name) + object_size(variant))


def variant_key(key: bytes, coding: bytes, stored_at: float, etag: bytes | None = None) -> bytes:
    """The store key of ``key``'s object compressed in ``coding``: ``key``
    first, so it shares the URL's prefix (purges find it); then what names
    the body: its strong ETag when it has one (a 304 that refreshes the
    object keeps it, so the copy outlives the refresh), else its
    ``stored_at`` (a weak tag allows other bytes)."""
    if etag is not None:
        tag = etag.strip()
        if tag[:1] == b'"' and tag[-1:] == b'"' and len(tag) >= 2:
            return key + b"\0" + coding + b"\1" + tag
    return key + b"\0" + coding + _STORED_AT.pack(stored_at)


def coded_headers(headers: Sequence[tuple[bytes, bytes]], coding: bytes) -> list[tuple[bytes, bytes]]:
    """The stored headers for the compressed variant: ``Content-Encoding``
    set, the ETag made the coding's (``coding_etag``)."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        lname = name.lower()
        if lname == b"content-encoding":
            continue
        if lname == b"etag":
            value = coding_etag(value, coding)
        out.append((name, value))
    out.append((b"Content-Encoding", coding))
    return out


def compress_whole(body: bytes, coding: bytes, level: int) -> bytes:
    """``body`` compressed in ``coding`` at ``level``, whole."""
    encoder = encoder_for(coding, level)
    assert encoder is not None
    return encoder.last(body)
