"""Range requests answered from stored objects (RFC 9110 14), without I/O.

A cache hit of a complete 200 answers a ``Range: bytes=...`` GET with a
``206`` and ``Content-Range`` (one range), or ``416`` when no range of it
can be satisfied.  Several ranges are answered with the whole object (a
200, which RFC 9110 14.2 allows), and so is a Range that does not parse,
names another unit, or whose ``If-Range`` does not match the object
(``If-Range`` with an entity tag needs a strong match, with a date the
object's exact ``Last-Modified``).  A range of a compressed copy is a range
of the compressed bytes (the representation the client gets).

The upstream never sees a cacheable request's ``Range`` (the cache fetches
the whole object) nor a rewriting site's (a range of the original bytes is
not one of the rewritten bytes); see ``prexy.exchange``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import attrs

__all__ = ["Cut", "RangeAnswer", "choose_range", "part_of", "range_of_stream"]

_SPEC = re.compile(rb"\s*(\d*)\s*-\s*(\d*)\s*")


@attrs.frozen
class RangeAnswer:
    """``status`` 206 with ``first``..``last`` (inclusive), or 416."""

    status: int
    first: int = 0
    last: int = -1

    def content_range(self, length: int) -> bytes:
        if self.status == 416:
            return b"bytes */%d" % length
        return b"bytes %d-%d/%d" % (self.first, self.last, length)


def _strong(tag: bytes) -> bytes | None:
    tag = tag.strip()
    if tag.startswith(b"W/") or len(tag) < 2 or not (tag[:1] == tag[-1:] == b'"'):
        return None
    return tag


def choose_range(
    request_headers: Sequence[tuple[bytes, bytes]],
    length: int,
    validator: Callable[[bytes], bytes | None],
) -> RangeAnswer | None:
    """What a GET with these headers (lower-case names) gets from a stored
    complete object of ``length`` bytes: a 206 range, a 416, or None for
    the whole object.  ``validator(b"etag")`` and
    ``validator(b"last-modified")`` give the object's validators; they are
    asked for only when the request has an If-Range."""
    value = None
    if_range = None
    for name, v in request_headers:
        if name == b"range":
            if value is not None:
                return None  # two Range fields
            value = v
        elif name == b"if-range":
            if if_range is not None:
                return None
            if_range = v.strip()
    if value is None:
        return None
    if if_range is not None:
        if if_range[:1] in (b'"', b"W"):
            wanted = _strong(if_range)
            etag = validator(b"etag")
            if wanted is None or etag is None or _strong(etag) != wanted:
                return None
        else:
            last_modified = validator(b"last-modified")
            if last_modified is None or if_range != last_modified.strip():
                return None
    unit, eq, spec = value.partition(b"=")
    if not eq or unit.strip().lower() != b"bytes" or b"," in spec:
        return None  # another unit, or several ranges: the whole object
    m = _SPEC.fullmatch(spec)
    if m is None:
        return None
    first_s, last_s = m.groups()
    if not first_s and not last_s:
        return None
    if not first_s:  # a suffix: the last N bytes
        suffix = int(last_s)
        if suffix == 0 or length == 0:
            return RangeAnswer(416)
        return RangeAnswer(206, max(0, length - suffix), length - 1)
    first = int(first_s)
    last = int(last_s) if last_s else length - 1
    if last_s and last < first:
        return None  # invalid: ignored (RFC 9110 14.1.1)
    if first >= length:
        return RangeAnswer(416)
    return RangeAnswer(206, first, min(last, length - 1))


def range_of_stream(
    request_headers: Sequence[tuple[bytes, bytes]],
    length: int,
    validator: Callable[[bytes], bytes | None],
    headers: Sequence[tuple[bytes, bytes]],
) -> tuple[int, bytes, list[tuple[bytes, bytes]], tuple[int, int]] | None:
    """For a whole 200 of ``length`` bytes on its way to the cache: the
    status, phrase and head the client gets instead (``headers`` with the
    part's Content-Length and a Content-Range), and the span ``(first,
    last)`` of the body to send it (empty for a 416); None when the client
    gets the whole answer."""
    chosen = choose_range(request_headers, length, validator)
    if chosen is None:
        return None
    out = [(n, v) for n, v in headers if n.lower() != b"content-length"]
    out.append((b"Content-Range", chosen.content_range(length)))
    if chosen.status == 416:
        return 416, b"Range Not Satisfiable", [*out, (b"Content-Length", b"0")], (length, length - 1)
    size = chosen.last - chosen.first + 1
    return 206, b"Partial Content", [*out, (b"Content-Length", b"%d" % size)], (chosen.first, chosen.last)


def part_of(span: tuple[int, int], at: int, data: bytes) -> bytes:
    """The bytes of ``data``, a piece of the body that starts at offset
    ``at``, that fall inside ``span`` (first, last; an empty span, as a
    416's, takes none)."""
    first, last = span
    if at + len(data) <= first or at > last:
        return b""
    return data[max(0, first - at) : last + 1 - at]


class Cut:
    """A span (first, last) of a body that goes by in pieces: :meth:`take`
    gives each piece's part of it, in order."""

    __slots__ = ("span", "offset")

    def __init__(self, span: tuple[int, int]) -> None:
        self.span = span
        #: Body bytes that went by so far.
        self.offset = 0

    def take(self, data: bytes) -> bytes:
        part = part_of(self.span, self.offset, data)
        self.offset += len(data)
        return part
