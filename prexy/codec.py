"""Streaming content codings around the transducer: every common upstream
coding in, gzip out.

Upstreams are asked for ``identity``, but some compress anyway; their bodies
are decoded chunk by chunk before substitution (compressed bytes never reach
the transducer) and compressed again, chunk by chunk, for clients that accept
gzip.  Decoders: gzip (``x-gzip``), deflate (zlib-wrapped or raw), br
(``brotli``) and zstd (``zstandard``); a stacked ``Content-Encoding`` (``gzip,
br``: gzip first, then br) is decoded by a chain, last coding first.  Every
decoder has the same interface (``feed`` / ``finish``, ``DecodeError`` on a
corrupt or truncated body).  Bytes after the end of a stream that do not
start another gzip member or zstd frame are trailing garbage: ignored, as
``gzip -d`` and browsers ignore them, and counted (``trailing_garbage``),
since the stream before them decoded whole.  Encoders sit behind one seam too
(``encoder_for``): gzip, br and zstd, chosen from the client's
Accept-Encoding by ``negotiate``.  No Twisted.
"""

from __future__ import annotations

import re
import types
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs
import brotli
import zstandard

__all__ = [
    "DECODABLE",
    "BodyDecoder",
    "BrotliDecoder",
    "BrotliEncoder",
    "Codec",
    "Encoder",
    "Compression",
    "DecodeError",
    "Decoder",
    "DecoderChain",
    "GzipEncoder",
    "ZstdDecoder",
    "ZstdEncoder",
    "accepts_gzip",
    "coding_label",
    "decoder_for",
    "encoder_for",
    "negotiate",
    "parse_accept_encoding",
    "type_matches",
    "parse_codings",
    "unknown_coding",
]


class DecodeError(Exception):
    """The upstream's compressed body is corrupt or truncated; ``coding``
    names the coding that failed."""

    def __init__(self, message: str, coding: bytes) -> None:
        super().__init__(message)
        self.coding = coding


class Codec(Protocol):
    """One streaming coding step: bytes in, bytes out."""

    def feed(self, data: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


class BodyDecoder(Codec, Protocol):
    """A decoder of an upstream body, which also says what it ignored."""

    def trailing_garbage(self) -> tuple[tuple[bytes, int], ...]:
        """(coding, bytes) for each coding whose stream ended with bytes
        after it that were ignored (none: an empty tuple)."""
        ...


class Encoder(Codec, Protocol):
    """A coding step for the client's side, which can also take the last
    bytes of the stream and end it in one call (``last``: no flush of
    its own before the end, which ``feed`` makes so that what was fed can
    be decoded at once; for br on a 23 KB page that flush cost 20-30% of
    the whole encoding, 0.20 against 0.24-0.28 ms)."""

    def last(self, data: bytes) -> bytes: ...


#: Bytes a deflate body is given to show its wrapping: a zlib header that
#: fails within them means raw deflate.
DEFLATE_PROBE = 64

#: How a gzip member starts (RFC 1952: ID1, ID2, CM = deflate).  After a
#: member, bytes that start so are the next member; any others are trailing
#: garbage.  (``gzip -d`` checks the two ID bytes and then fails on another
#: method; here those bytes are garbage too.)
GZIP_START = b"\x1f\x8b\x08"


class Decoder:
    """Incremental gzip or deflate decoder (zlib).

    "deflate" is meant to be zlib-wrapped, but some servers send raw deflate:
    it is decoded as zlib, and if that fails within the first
    ``DEFLATE_PROBE`` bytes before any output, decoded again as raw.

    A gzip body may hold several members (RFC 1952), decoded one after the
    other.  What follows the end of the stream (the last gzip member, the
    deflate stream) and starts no new member is trailing garbage: ignored
    and counted in ``garbage``.  Gzip and zlib end with a check value, so
    the bytes before the garbage are known whole; raw deflate has none, and
    is treated the same (as browsers do)."""

    def __init__(self, coding: bytes) -> None:
        self.coding = coding.lower()
        if self.coding in (b"gzip", b"x-gzip"):
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            self._probe: bytearray | None = None
            self._members = True
        elif self.coding == b"deflate":
            self._d = zlib.decompressobj(zlib.MAX_WBITS)
            self._probe = bytearray()
            self._members = False
        else:
            raise ValueError(f"cannot decode {coding!r}")
        self._started = False
        #: Bytes after a member's end, too few yet to tell whether they
        #: start another one.
        self._tail = b""
        #: The stream ended and what came after it is garbage: the rest of
        #: the body is ignored.
        self._ignoring = False
        #: Bytes ignored after the end of the stream.
        self.garbage = 0

    def _error(self, what: str) -> DecodeError:
        return DecodeError(f"bad {self.coding.decode()} body: {what}", self.coding)

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        self._started = True
        if self._ignoring:
            self.garbage += len(data)
            return b""
        if self._d.eof:  # between gzip members
            return self._after_end(self._tail + data)
        probe = self._probe
        if probe is not None:
            probe += data
            try:
                out = self._d.decompress(data)
            except zlib.error:
                self._probe = None
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                data = bytes(probe)
            else:
                if out or len(probe) > DEFLATE_PROBE:
                    self._probe = None
                return out + self._after_end(self._d.unused_data) if self._d.eof else out
        try:
            out = self._d.decompress(data)
        except zlib.error as exc:
            raise self._error(str(exc)) from None
        return out + self._after_end(self._d.unused_data) if self._d.eof else out

    def _after_end(self, rest: bytes) -> bytes:
        """Decode ``rest``, the bytes after the end of a stream: further
        gzip members, then trailing garbage if any."""
        out: list[bytes] = []
        while rest:
            if not self._members or rest[: len(GZIP_START)] != GZIP_START[: len(rest)]:
                self._probe = None
                self._ignoring = True
                self.garbage += len(rest)
                break
            if len(rest) < len(GZIP_START):
                self._tail = rest  # maybe the start of a member
                return b"".join(out)
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out.append(self._d.decompress(rest))
            except zlib.error as exc:
                raise self._error(str(exc)) from None
            if not self._d.eof:
                break
            rest = self._d.unused_data
        self._tail = b""
        return b"".join(out)

    def finish(self) -> bytes:
        if self._ignoring:
            return b""
        if self._d.eof:
            # A partial member start at the very end is garbage too.
            self.garbage += len(self._tail)
            self._tail = b""
            return b""
        try:
            tail = self._d.flush()
        except zlib.error as exc:
            raise self._error(str(exc)) from None
        if self._started and not self._d.eof:
            raise DecodeError(f"truncated {self.coding.decode()} body", self.coding)
        return tail

    def trailing_garbage(self) -> tuple[tuple[bytes, int], ...]:
        return ((self.coding, self.garbage),) if self.garbage else ()


#: A br body keeps its input for a replay (below) while it is no longer
#: than this; past it, garbage in the same piece as the end of the stream
#: is a DecodeError.
BR_REPLAY_LIMIT = 256 * 1024


class BrotliDecoder:
    """Incremental br decoder (``brotli.Decompressor``).

    Bytes after the end of the stream are trailing garbage (ignored and
    counted in ``garbage``).  ``brotli`` fails a call whose input runs past
    the end, keeping none of its output and no way to tell where the end
    was; so the input is kept (up to ``BR_REPLAY_LIMIT``) and, when a call
    fails, decoded again by a new decompressor up to the failing piece,
    whose end is then found by bisection: the longest prefix that decodes.
    If the stream has ended there, the rest is garbage; if not, the body is
    corrupt."""

    coding = b"br"

    def __init__(self) -> None:
        self._d = brotli.Decompressor()
        self._started = False
        #: The stream ended: the rest of the body is ignored.
        self._ended = False
        #: The input so far, while it is short enough to replay.
        self._kept: list[bytes] | None = []
        self._kept_size = 0
        #: Bytes ignored after the end of the stream.
        self.garbage = 0

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        self._started = True
        if self._ended:
            self.garbage += len(data)
            return b""
        try:
            out = self._d.process(data)
        except brotli.error as exc:
            return self._past_end(data, exc)
        if self._d.is_finished():
            self._ended = True
            self._kept = None
        elif self._kept is not None:
            self._kept_size += len(data)
            if self._kept_size > BR_REPLAY_LIMIT:
                self._kept = None
            else:
                self._kept.append(data)
        return out

    def _replay(self, prefix: bytes) -> tuple[brotli.Decompressor, bytes]:
        """A decompressor given the kept input and then ``prefix`` (which
        decoded before), and the output of ``prefix``."""
        assert self._kept is not None
        d = brotli.Decompressor()
        for piece in self._kept:
            d.process(piece)
        return d, d.process(prefix) if prefix else b""

    def _past_end(self, data: bytes, exc: brotli.error) -> bytes:
        """``data`` failed to decode: its output up to the end of the
        stream if the stream ends in it (the rest is garbage), else a
        DecodeError."""
        if self._kept is None:
            raise DecodeError(f"bad br body: {exc}", b"br") from None
        d, first = self._replay(b"")
        outs = [first]
        good, bad = 0, len(data)  # data[:good] decodes, data[:bad] fails
        while bad - good > 1 and not d.is_finished():
            mid = (good + bad) // 2
            try:
                outs.append(d.process(data[good:mid]))
            except brotli.error:
                bad = mid
                d, first = self._replay(data[:good])
                outs = [first]
            else:
                good = mid
        if not d.is_finished():
            raise DecodeError(f"bad br body: {exc}", b"br") from None
        self._d = d
        self._ended = True
        self._kept = None
        self.garbage += len(data) - good
        return b"".join(outs)

    def finish(self) -> bytes:
        if self._started and not self._ended and not self._d.is_finished():
            raise DecodeError("truncated br body", b"br")
        return b""

    def trailing_garbage(self) -> tuple[tuple[bytes, int], ...]:
        return ((b"br", self.garbage),) if self.garbage else ()


#: Largest zstd window accepted: RFC 9659 caps it at 8 MB for HTTP, so one
#: response cannot make the decoder hold more.
ZSTD_MAX_WINDOW = 8 * 1024 * 1024

#: How a zstd frame starts (RFC 8878 3.1): the magic number of a frame, or
#: of a skippable frame (0x184D2A50 to 0x184D2A5F), little-endian.
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ZSTD_SKIPPABLE = re.compile(rb"[\x50-\x5f](?:\x2a(?:\x4d\x18?)?)?\Z")


def _starts_zstd_frame(rest: bytes) -> bool:
    """Whether ``rest`` starts (or, shorter than a magic number, may start)
    a zstd frame."""
    head = rest[:4]
    return ZSTD_MAGIC.startswith(head) or ZSTD_SKIPPABLE.match(head) is not None


class ZstdDecoder:
    """Incremental zstd decoder (``zstandard`` decompressobj); a body of
    several frames is decoded frame after frame.  After a frame, bytes
    that start no frame are trailing garbage (ignored and counted in
    ``garbage``)."""

    coding = b"zstd"

    def __init__(self) -> None:
        self._z = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW)
        self._d = self._z.decompressobj()
        #: The current frame has begun and not ended.
        self._open = False
        #: Bytes after a frame, too few yet to tell whether they start one.
        self._tail = b""
        #: A frame ended and what came after it is garbage.
        self._ignoring = False
        #: Bytes ignored after the end of the stream.
        self.garbage = 0

    def feed(self, data: bytes) -> bytes:
        if self._ignoring:
            self.garbage += len(data)
            return b""
        out = []
        try:
            if self._tail:
                data, self._tail = self._tail + data, b""
            while data:
                if self._d.eof:
                    if not _starts_zstd_frame(data):
                        self._ignoring = True
                        self.garbage += len(data)
                        break
                    if len(data) < len(ZSTD_MAGIC):
                        self._tail = data
                        break
                    self._d = self._z.decompressobj()
                self._open = True
                out.append(self._d.decompress(data))
                data = b""
                if self._d.eof:
                    self._open = False
                    data = self._d.unused_data
        except zstandard.ZstdError as exc:
            raise DecodeError(f"bad zstd body: {exc}", b"zstd") from None
        return b"".join(out)

    def finish(self) -> bytes:
        if self._open:
            raise DecodeError("truncated zstd body", b"zstd")
        self.garbage += len(self._tail)
        self._tail = b""
        return b""

    def trailing_garbage(self) -> tuple[tuple[bytes, int], ...]:
        return ((b"zstd", self.garbage),) if self.garbage else ()


class DecoderChain:
    """Stacked codings: each decoder's output is the next one's input
    (``decoders`` in decoding order, the last-applied coding first)."""

    def __init__(self, decoders: Sequence[BodyDecoder]) -> None:
        self.decoders = tuple(decoders)

    def feed(self, data: bytes) -> bytes:
        for decoder in self.decoders:
            if not data:
                break
            data = decoder.feed(data)
        return data

    def finish(self) -> bytes:
        tail = b""
        for decoder in self.decoders:
            tail = decoder.feed(tail) + decoder.finish()
        return tail

    def trailing_garbage(self) -> tuple[tuple[bytes, int], ...]:
        return tuple(g for decoder in self.decoders for g in decoder.trailing_garbage())


def _zlib(coding: bytes) -> Callable[[], BodyDecoder]:
    return lambda: Decoder(coding)


#: Coding -> a new decoder for it.
DECODERS: dict[bytes, Callable[[], BodyDecoder]] = {
    b"gzip": _zlib(b"gzip"),
    b"x-gzip": _zlib(b"x-gzip"),
    b"deflate": _zlib(b"deflate"),
    b"br": BrotliDecoder,
    b"zstd": ZstdDecoder,
}
#: Codings we can decode before rewriting.
DECODABLE = frozenset(DECODERS)


def parse_codings(values: Iterable[bytes]) -> tuple[bytes, ...]:
    """The codings of Content-Encoding header values, lower-case, in the
    order they were applied; ``identity`` and empty entries dropped."""
    codings = []
    for value in values:
        for item in value.split(b","):
            coding = item.strip().lower()
            if coding and coding != b"identity":
                codings.append(coding)
    return tuple(codings)


def unknown_coding(codings: Sequence[bytes]) -> bytes | None:
    """The first of ``codings`` we cannot decode, or None."""
    for coding in codings:
        if coding not in DECODABLE:
            return coding
    return None


_TOKEN = frozenset(b"abcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+.^_`|~-")
MAX_CODING_LABEL = 32


def coding_label(coding: bytes) -> str:
    """A coding as a metric label: a short HTTP token as it is, anything
    else ``invalid`` (labels must not carry quotes, and an upstream's
    garbage must not make a new series per response)."""
    if 0 < len(coding) <= MAX_CODING_LABEL and all(c in _TOKEN for c in coding.lower()):
        return coding.lower().decode("ascii")
    return "invalid"


def decoder_for(codings: Sequence[bytes]) -> BodyDecoder:
    """A decoder for a body with ``codings`` (as ``parse_codings`` gives
    them, every one decodable): one decoder, or a chain, last coding first."""
    if not codings:
        raise ValueError("no coding to decode")
    decoders = [DECODERS[c]() for c in reversed(codings)]
    return decoders[0] if len(decoders) == 1 else DecoderChain(decoders)


#: Default levels, measured for dynamic content (a rewritten page is
#: compressed once per response, so CPU per response is what counts):
#: bench/realistic.py's 23 KB html-20k page, fed in 8 KB batches with a
#: flush after each, best of 30 (ms, bytes out):
#:   gzip 1: 0.29 ms 6556; gzip 4: 0.40 ms 5809; gzip 6: 0.55 ms 5606
#:   br 3: 0.33 ms 6001; br 4: 0.53 ms 5591; br 5: 0.71 ms 5131
#:   zstd 1: 0.12 ms 6456; zstd 3: 0.11 ms 6116; zstd 6: 0.34 ms 5762
#: gzip 4 costs 28% less than 6 for 4% more bytes; br 4 is as small as
#: gzip 6 at the same cost; zstd 3 is the cheapest of all.
GZIP_LEVEL, BR_LEVEL, ZSTD_LEVEL = 4, 4, 3


#: The deflate implementation of GzipEncoder: zlib-ng's when installed
#: (the ``zlib-ng`` package), else zlib.  One speed trick behind this one
#: name: the output is ordinary gzip either way.  At level 4 on the 23 KB
#: html-20k page, zlib-ng takes about half zlib's time for a slightly
#: smaller output.  Decoding stays on zlib (its errors are the ones handled
#: below).
_deflate: types.ModuleType
try:
    from zlib_ng import zlib_ng as _deflate
except ImportError:  # pragma: no cover - no wheel for this platform
    _deflate = zlib


class GzipEncoder:
    """Incremental gzip encoder; each fed chunk is flushed so streaming
    latency does not grow (a sync flush costs a few bytes per chunk)."""

    def __init__(self, level: int = GZIP_LEVEL) -> None:
        self._c = _deflate.compressobj(level, _deflate.DEFLATED, 16 + _deflate.MAX_WBITS)

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        return self._c.compress(data) + self._c.flush(_deflate.Z_SYNC_FLUSH)

    def finish(self) -> bytes:
        return self._c.flush(_deflate.Z_FINISH)

    def last(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(_deflate.Z_FINISH)


class BrotliEncoder:
    """Incremental br encoder (``brotli.Compressor``); each fed chunk is
    flushed, like ``GzipEncoder``."""

    def __init__(self, level: int = BR_LEVEL) -> None:
        self._c = brotli.Compressor(quality=level)

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        return self._c.process(data) + self._c.flush()

    def finish(self) -> bytes:
        return self._c.finish()

    def last(self, data: bytes) -> bytes:
        return self._c.process(data) + self._c.finish()


class ZstdEncoder:
    """Incremental zstd encoder (one frame); each fed chunk ends a block,
    so what was fed can be decoded at once."""

    def __init__(self, level: int = ZSTD_LEVEL) -> None:
        self._c = zstandard.ZstdCompressor(level=level).compressobj()

    def feed(self, data: bytes) -> bytes:
        if not data:
            return b""
        return self._c.compress(data) + self._c.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)

    def finish(self) -> bytes:
        return self._c.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)

    def last(self, data: bytes) -> bytes:
        return self._c.compress(data) + self._c.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH)


#: Coding -> a new encoder for it at a level: the codings Prexy can send
#: to clients.
ENCODERS: dict[bytes, Callable[[int], Encoder]] = {
    b"gzip": GzipEncoder,
    b"br": BrotliEncoder,
    b"zstd": ZstdEncoder,
}
#: Valid levels per coding (inclusive).
LEVELS: dict[bytes, tuple[int, int]] = {b"gzip": (1, 9), b"br": (0, 11), b"zstd": (1, 19)}
#: Server preference among codings the client rates equally: br first (the
#: smallest at equal cost, above), then zstd (the cheapest), then gzip.
PREFERENCE: tuple[bytes, ...] = (b"br", b"zstd", b"gzip")


def encoder_for(coding: bytes | None, level: int | None = None) -> Encoder | None:
    """An encoder for the client's coding (None: identity), at ``level``
    (None: the coding's default)."""
    if coding is None:
        return None
    make = ENCODERS[coding]
    return make() if level is None else make(level)  # type: ignore[call-arg]


def _qvalue(params: bytes) -> float:
    """The q of an Accept-Encoding item's parameters (1 when absent; a
    malformed or out-of-range one counts as 0)."""
    for p in params.split(b";"):
        k, _, v = p.strip().partition(b"=")
        if k.strip().lower() == b"q":
            v = v.strip()
            if not re.fullmatch(rb"0(\.[0-9]{0,3})?|1(\.0{0,3})?", v):
                return 0.0
            return float(v)
    return 1.0


def parse_accept_encoding(values: Sequence[bytes] | None) -> dict[bytes, float]:
    """Accept-Encoding header values as coding -> q (lower-case; ``x-gzip``
    counts as gzip; a coding named twice keeps its first q)."""
    out: dict[bytes, float] = {}
    for value in values or ():
        for item in value.split(b","):
            coding, _, params = item.partition(b";")
            coding = coding.strip().lower()
            if not coding:
                continue
            if coding == b"x-gzip":
                coding = b"gzip"
            out.setdefault(coding, _qvalue(params))
    return out


def negotiate(accept_encoding: Sequence[bytes] | None, offered: Sequence[bytes] = PREFERENCE) -> bytes | None:
    """The coding to send a client (RFC 9110 12.5.3), of ``offered`` in
    the server's order of preference; None: identity.

    A coding the client names gets its q; one it does not name gets the q
    of ``*`` if present, else 0 (no header at all: identity).  The highest
    q above 0 wins, ties going to the earlier in ``offered``.  Identity is
    never refused here: when the client refuses it (``identity;q=0``) and
    accepts nothing offered, None still means identity (a 406 helps no
    one)."""
    accepted = parse_accept_encoding(accept_encoding)
    if not accepted:
        return None
    star = accepted.get(b"*", 0.0)
    best, best_q = None, 0.0
    for coding in offered:
        q = accepted.get(coding, star)
        if q > best_q:
            best, best_q = coding, q
    return best


def accepts_gzip(accept_encoding: Sequence[bytes] | None) -> bool:
    """Whether an Accept-Encoding header allows gzip (q > 0)."""
    return negotiate(accept_encoding, (b"gzip",)) is not None


#: Content types compressed by default (``type/*`` and ``type/*+suffix``
#: patterns allowed).
COMPRESSIBLE_TYPES: tuple[str, ...] = (
    "text/*", "application/javascript", "application/json", "application/xml",
    "application/*+json", "application/*+xml", "image/svg+xml",
)


def _lower_types(types: Sequence[str]) -> tuple[str, ...]:
    return tuple(t.strip().lower() for t in types)


_COMPRESSIBLE: dict[tuple[tuple[str, ...], bytes | None], bool] = {}


def type_matches(content_type: bytes | None, patterns: Sequence[str]) -> bool:
    """Whether a Content-Type value (parameters ignored) matches one of
    ``patterns`` (lower-case): ``text/html``, ``text/*``, ``application/*+json``."""
    if not content_type:
        return False
    media = content_type.split(b";", 1)[0].strip().lower().decode("latin-1")
    kind, _, sub = media.partition("/")
    if not kind or not sub:
        return False
    for pattern in patterns:
        pkind, _, psub = pattern.partition("/")
        if pkind != kind:
            continue
        if psub == sub or psub == "*" or (psub.startswith("*+") and sub.endswith(psub[1:])):
            return True
    return False


@attrs.frozen
class Compression:
    """How answers are compressed for clients (one site's, or the server's
    default): on or off, which content types, from what length, at which
    level per coding."""

    enabled: bool = True
    types: tuple[str, ...] = attrs.field(default=COMPRESSIBLE_TYPES, converter=_lower_types)
    #: A body whose length is known and below this goes uncompressed.
    min_length: int = 256
    gzip_level: int = GZIP_LEVEL
    br_level: int = BR_LEVEL
    zstd_level: int = ZSTD_LEVEL

    def compressible(self, content_type: bytes | None) -> bool:
        if not self.enabled:
            return False
        # Memoised per (types, Content-Type value): asked of every answer,
        # and sites send a handful of values (2.6 us a call unmemoised).
        key = (self.types, content_type)
        known = _COMPRESSIBLE.get(key)
        if known is None:
            known = type_matches(content_type, self.types)
            if len(_COMPRESSIBLE) < 1024:
                _COMPRESSIBLE[key] = known
        return known

    def level(self, coding: bytes) -> int:
        return {b"gzip": self.gzip_level, b"br": self.br_level, b"zstd": self.zstd_level}[coding]


def coding_etag(etag: bytes, coding: bytes) -> bytes:
    """The entity tag of a compressed variant: the coding appended inside
    the quotes (``"abc"`` -> ``"abc-gzip"``, ``W/"abc"`` -> ``W/"abc-gzip"``),
    so caches downstream never take one coding's bytes for another's."""
    etag = etag.strip()
    if etag.endswith(b'"') and len(etag) >= 2:
        return etag[:-1] + b"-" + coding + b'"'
    return etag
