"""The upstream codings (prexy.codec): every decodable coding, alone and
stacked, decodes to exactly the original bytes whole, byte by byte and at
any chunking; a corrupt or truncated body is a DecodeError, never a short
clean end; bytes after the end that start no new member or frame are
ignored and counted; the header's codings are parsed as applied."""

from __future__ import annotations

import gzip
import random
import shutil
import subprocess
import zlib
from collections.abc import Callable

import brotli
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.codec import (
    BR_REPLAY_LIMIT,
    DECODABLE,
    ENCODERS,
    BodyDecoder,
    BrotliDecoder,
    BrotliEncoder,
    Compression,
    DecodeError,
    DecoderChain,
    GzipEncoder,
    ZstdEncoder,
    coding_label,
    decoder_for,
    encoder_for,
    negotiate,
    parse_accept_encoding,
    parse_codings,
    type_matches,
    unknown_coding,
)
from tests.cases import expand, parametrize

_rng = random.Random(18)
#: Text that compresses well, with a stretch of noise so no coding
#: finishes in its first few bytes.
ORIGINAL = (
    b"<p>www.origin.example says hello</p>\n" * 400
    + bytes(_rng.randrange(256) for _ in range(3000))
    + b"<script>ga('UA-123-4')</script>" * 50
)


def _deflate(data: bytes, wbits: int) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, wbits)
    return c.compress(data) + c.flush()


ENCODE: dict[bytes, Callable[[bytes], bytes]] = {
    b"gzip": gzip.compress,
    b"x-gzip": gzip.compress,
    b"deflate": lambda d: _deflate(d, zlib.MAX_WBITS),
    b"br": brotli.compress,
    b"zstd": lambda d: zstandard.ZstdCompressor().compress(d),
}

#: (name, Content-Encoding codings as applied, how the body was made)
CASES: list[tuple[str, tuple[bytes, ...], Callable[[bytes], bytes]]] = [
    ("gzip", (b"gzip",), gzip.compress),
    ("gzip-two-members", (b"gzip",), lambda d: gzip.compress(d[:100]) + gzip.compress(d[100:])),
    ("x-gzip", (b"x-gzip",), gzip.compress),
    ("deflate-zlib", (b"deflate",), lambda d: _deflate(d, zlib.MAX_WBITS)),
    ("deflate-raw", (b"deflate",), lambda d: _deflate(d, -zlib.MAX_WBITS)),
    ("br", (b"br",), brotli.compress),
    ("zstd", (b"zstd",), lambda d: zstandard.ZstdCompressor().compress(d)),
    ("zstd-two-frames", (b"zstd",), lambda d: b"".join(
        zstandard.ZstdCompressor().compress(d[i : i + len(d) // 2 + 1]) for i in (0, len(d) // 2 + 1)
    )),
    ("gzip,br", (b"gzip", b"br"), lambda d: brotli.compress(gzip.compress(d))),
    ("br,zstd,deflate", (b"br", b"zstd", b"deflate"),
     lambda d: _deflate(zstandard.ZstdCompressor().compress(brotli.compress(d)), -zlib.MAX_WBITS)),
]
BODIES = {name: (codings, make(ORIGINAL)) for name, codings, make in CASES}


#: Trailing garbage seen after real bodies: a CRLF, zero padding, an HTML
#: footer a server appends after a compressed body, random bytes.
GARBAGE = (
    b"\r\n",
    b"\x00" * 512,
    b"<!-- served by origin -->\n" * 40,
    b"~" + bytes(_rng.randrange(256) for _ in range(999)),
)
#: First bytes that may start a new gzip member or zstd frame.
NEW_STREAM_BYTES = frozenset({b"\x1f", b"\x28", *(bytes([b]) for b in range(0x50, 0x60))})


def decode(codings: tuple[bytes, ...], body: bytes, cuts: list[int]) -> bytes:
    """``body`` fed in pieces of the sizes in ``cuts`` (cycled), then finished."""
    return feed_in(decoder_for(codings), body, cuts)


def feed_in(decoder: BodyDecoder, body: bytes, cuts: list[int]) -> bytes:
    """``body`` fed to ``decoder`` in pieces of the sizes in ``cuts``
    (cycled), then finished."""
    out, pos, i = [], 0, 0
    while pos < len(body):
        cut = cuts[i % len(cuts)]
        out.append(decoder.feed(body[pos : pos + cut]))
        pos += cut
        i += 1
    out.append(decoder.finish())
    return b"".join(out)


class DecodeTests(SynchronousTestCase):
    def test_whole(self) -> None:
        """Each coding, fed in one piece, gives the original bytes."""
        for name, (codings, body) in BODIES.items():
            self.assertEqual(decode(codings, body, [len(body)]), ORIGINAL, name)

    def test_byte_by_byte(self) -> None:
        """Each coding, fed one byte at a time, gives the original bytes."""
        for name, (codings, body) in BODIES.items():
            self.assertEqual(decode(codings, body, [1]), ORIGINAL, name)

    @settings(deadline=None, max_examples=60)
    @given(st.sampled_from(sorted(BODIES)), st.lists(st.integers(1, 5000), min_size=1, max_size=20))
    def test_any_chunking(self, name: str, cuts: list[int]) -> None:
        """Any chunking of any coding's body gives the original bytes."""
        codings, body = BODIES[name]
        self.assertEqual(decode(codings, body, cuts), ORIGINAL)

    def test_empty_feeds_are_harmless(self) -> None:
        for name, (codings, body) in BODIES.items():
            decoder = decoder_for(codings)
            out = decoder.feed(b"") + decoder.feed(body) + decoder.feed(b"") + decoder.finish()
            self.assertEqual(out, ORIGINAL, name)

    def test_truncated_is_an_error(self) -> None:
        """A body cut short anywhere past its first byte fails at finish (or
        before), whatever the chunking: never a clean short answer."""
        for name, (codings, body) in BODIES.items():
            for keep in (1, len(body) // 3, len(body) - 1):
                for cuts in ([len(body)], [1], [7, 300]):
                    with self.assertRaises(DecodeError, msg=f"{name} cut at {keep}, fed {cuts}"):
                        decode(codings, body[:keep], cuts)

    @settings(deadline=None, max_examples=60)
    @given(st.sampled_from(sorted(BODIES)), st.floats(0.0, 0.999), st.lists(st.integers(1, 3000), min_size=1))
    def test_truncated_at_any_point(self, name: str, where: float, cuts: list[int]) -> None:
        codings, body = BODIES[name]
        with self.assertRaises(DecodeError):
            decode(codings, body[: max(1, int(len(body) * where))], cuts)

    def test_corrupt_is_an_error(self) -> None:
        """Garbage, and a valid start followed by garbage, are DecodeErrors
        naming the coding that failed."""
        garbage = b"\x1f\x8b\x08\x00garbage-not-any-coding-at-all" * 4
        for name, (codings, body) in BODIES.items():
            spliced = body[: len(body) // 2] + b"\xff" * 64 + body[len(body) // 2 :]
            # Raw deflate has no check value: this splice decodes to other
            # bytes that end cleanly, nothing can tell.
            for bad in (garbage,) if name == "deflate-raw" else (garbage, spliced):
                for cuts in ([len(bad)], [1]):
                    with self.assertRaises(DecodeError, msg=f"{name} fed {cuts}") as caught:
                        decode(codings, bad, cuts)
                    self.assertIn(caught.exception.coding, codings)

    def test_trailing_garbage_is_ignored_and_counted(self) -> None:
        """Bytes after the end of the stream that start no new gzip member
        or zstd frame are ignored, as ``gzip -d`` and browsers ignore them:
        the body decodes whole and the garbage is counted against the
        coding it followed.  Every coding, stacked ones and several gzip
        members too; whole, byte by byte, and with the garbage in the same
        piece as the end or in later ones."""
        for name, (codings, body) in BODIES.items():
            for garbage in GARBAGE:
                for cuts in ([len(body) + len(garbage)], [1], [len(body)], [len(body) - 1, 2], [7, 300]):
                    decoder = decoder_for(codings)
                    out = feed_in(decoder, body + garbage, cuts)
                    what = f"{name} + {garbage[:8]!r}, fed {cuts}"
                    self.assertEqual(out, ORIGINAL, what)
                    self.assertEqual(decoder.trailing_garbage(), ((codings[-1], len(garbage)),), what)
                decoder = decoder_for(codings)
                self.assertEqual(feed_in(decoder, body, [len(body)]), ORIGINAL)
                self.assertEqual(decoder.trailing_garbage(), (), name)

    @settings(deadline=None, max_examples=80)
    @given(
        st.sampled_from(sorted(BODIES)),
        st.binary(min_size=1, max_size=1).filter(lambda b: b not in NEW_STREAM_BYTES),
        st.binary(max_size=200),
        st.lists(st.integers(1, 5000), min_size=1, max_size=20),
    )
    def test_trailing_garbage_any_chunking(self, name: str, first: bytes, rest: bytes, cuts: list[int]) -> None:
        """Any garbage (that starts no member or frame) after any coding's
        body, at any chunking: the original bytes, the garbage counted."""
        codings, body = BODIES[name]
        decoder = decoder_for(codings)
        self.assertEqual(feed_in(decoder, body + first + rest, cuts), ORIGINAL)
        self.assertEqual(decoder.trailing_garbage(), ((codings[-1], 1 + len(rest)),))

    def test_garbage_inside_a_stacked_coding(self) -> None:
        """Garbage after the inner coding's stream (inside the outer one)
        is that coding's: the outer stream decodes whole, then the inner."""
        body = brotli.compress(gzip.compress(ORIGINAL) + b"\r\n<!-- footer -->")
        for cuts in ([len(body)], [1], [100]):
            decoder = decoder_for((b"gzip", b"br"))
            self.assertEqual(feed_in(decoder, body, cuts), ORIGINAL)
            self.assertEqual(decoder.trailing_garbage(), ((b"gzip", 17),))

    def test_gzip_members_then_garbage_like_gzip_d(self) -> None:
        """Several gzip members then garbage: every member decoded, the
        garbage ignored, exactly as ``gzip -d`` outputs (it warns "trailing
        garbage ignored"); a partial member start at the very end is
        garbage too."""
        half = len(ORIGINAL) // 2
        members = gzip.compress(ORIGINAL[:half]) + gzip.compress(ORIGINAL[half:])
        for garbage in (b"\x00" * 10, b"junk", b"\x1f", b"\x1f\x8b", b"\x1f\x8b\x09xyz", b"\x1fjunk"):
            for cuts in ([1 << 20], [1], [len(members), 1]):
                decoder = decoder_for((b"gzip",))
                self.assertEqual(feed_in(decoder, members + garbage, cuts), ORIGINAL, garbage)
                self.assertEqual(decoder.trailing_garbage(), ((b"gzip", len(garbage)),))
            if shutil.which("gzip"):
                oracle = subprocess.run(["gzip", "-dc"], input=members + garbage, capture_output=True, check=False)
                self.assertEqual(oracle.stdout, ORIGINAL, garbage)

    def test_a_broken_next_member_is_an_error(self) -> None:
        """Bytes that start a gzip member must be one: a member start
        followed by corrupt data, or cut short, fails as in ``gzip -d``."""
        body = gzip.compress(ORIGINAL)
        for bad in (b"\x1f\x8b\x08", b"\x1f\x8b\x08\x00garbage-not-a-member" * 3, gzip.compress(b"next")[:-3]):
            for cuts in ([1 << 20], [1]):
                with self.assertRaises(DecodeError, msg=bad):
                    feed_in(decoder_for((b"gzip",)), body + bad, cuts)

    def test_zstd_frame_starts_are_not_garbage(self) -> None:
        """After a zstd frame, a skippable frame and another frame are part
        of the body; a partial magic number at the very end is garbage."""
        frame = zstandard.ZstdCompressor().compress(ORIGINAL)
        skippable = b"\x5a\x2a\x4d\x18" + (3).to_bytes(4, "little") + b"abc"
        body = frame + skippable + zstandard.ZstdCompressor().compress(b"more")
        for cuts in ([1 << 20], [1], [len(frame) + 2, 5]):
            decoder = decoder_for((b"zstd",))
            self.assertEqual(feed_in(decoder, body, cuts), ORIGINAL + b"more")
            self.assertEqual(decoder.trailing_garbage(), ())
            for partial in (b"\x28", b"\x28\xb5\x2f", b"\x5a\x2a"):
                decoder = decoder_for((b"zstd",))
                self.assertEqual(feed_in(decoder, body + partial, cuts), ORIGINAL + b"more")
                self.assertEqual(decoder.trailing_garbage(), ((b"zstd", len(partial)),))

    def test_br_garbage_at_every_offset_of_the_last_piece(self) -> None:
        """br fails a call whose input runs past the end of the stream; the
        decoder finds the end inside that piece wherever it is."""
        body = brotli.compress(ORIGINAL[:2000], quality=5)
        for start in range(0, len(body), 37):
            decoder = BrotliDecoder()
            out = decoder.feed(body[:start]) + decoder.feed(body[start:] + b"junk") + decoder.finish()
            self.assertEqual(out, ORIGINAL[:2000], start)
            self.assertEqual(decoder.trailing_garbage(), ((b"br", 4),))

    def test_br_garbage_past_the_replay_limit(self) -> None:
        """A br body longer than the replay limit: garbage in a later piece
        than the end is still ignored; garbage in the same piece as the end
        can no longer be told from corruption, and is a DecodeError."""
        rng = random.Random(5)
        big = bytes(rng.randrange(256) for _ in range(BR_REPLAY_LIMIT + 1000))
        body = brotli.compress(big, quality=1)
        self.assertGreater(len(body), BR_REPLAY_LIMIT)
        decoder = BrotliDecoder()
        self.assertEqual(feed_in(decoder, body + b"junk", [len(body), 4]), big)
        self.assertEqual(decoder.trailing_garbage(), ((b"br", 4),))
        with self.assertRaises(DecodeError):
            feed_in(BrotliDecoder(), body + b"junk", [len(body) - 10, 14])

    def test_gzip_members(self) -> None:
        """A gzip body of several members (RFC 1952) decodes whole."""
        half = len(ORIGINAL) // 2
        body = gzip.compress(ORIGINAL[:half]) + gzip.compress(ORIGINAL[half:])
        for cuts in ([len(body)], [1], [5, 999]):
            self.assertEqual(decode((b"gzip",), body, cuts), ORIGINAL)

    def test_raw_deflate_in_tiny_pieces(self) -> None:
        """Raw deflate is recognised whatever the first piece's size (it was
        taken for zlib when the first piece was under two bytes)."""
        body = _deflate(ORIGINAL, -zlib.MAX_WBITS)
        for first in (1, 2, 3, 63, 64, 65):
            self.assertEqual(decode((b"deflate",), body, [first, 1000]), ORIGINAL, first)

    def test_zstd_window_over_rfc_9659_limit_refused(self) -> None:
        """A zstd frame asking for a window over 8 MB is refused: one body
        cannot make the decoder hold more."""
        params = zstandard.ZstdCompressionParameters.from_level(19, window_log=24)
        compressor = zstandard.ZstdCompressor(compression_params=params).compressobj()
        body = compressor.compress(ORIGINAL * 10) + compressor.flush()
        with self.assertRaises(DecodeError):
            decode((b"zstd",), body, [1 << 20])

    def test_decoder_for(self) -> None:
        self.assertIsInstance(decoder_for((b"gzip", b"br")), DecoderChain)
        self.assertNotIsInstance(decoder_for((b"br",)), DecoderChain)
        self.assertRaises(ValueError, decoder_for, ())
        self.assertEqual(DECODABLE, frozenset(ENCODE))


class HeaderTests(SynchronousTestCase):
    def test_parse_codings(self) -> None:
        """Codings in the order applied, over several header lines,
        lower-case, without identity or empty entries."""
        self.assertEqual(parse_codings([b" GZIP , br"]), (b"gzip", b"br"))
        self.assertEqual(parse_codings([b"gzip", b"identity, ,Zstd"]), (b"gzip", b"zstd"))
        self.assertEqual(parse_codings([b"identity", b""]), ())
        self.assertEqual(parse_codings([]), ())

    def test_unknown_coding(self) -> None:
        self.assertIsNone(unknown_coding((b"gzip", b"br", b"zstd", b"deflate", b"x-gzip")))
        self.assertEqual(unknown_coding((b"gzip", b"compress", b"sdch")), b"compress")

    def test_coding_label(self) -> None:
        """A metric label is a short token or "invalid", never a quote."""
        self.assertEqual(coding_label(b"Compress"), "compress")
        self.assertEqual(coding_label(b'x"y'), "invalid")
        self.assertEqual(coding_label(b"a" * 100), "invalid")
        self.assertEqual(coding_label(b""), "invalid")


class EncoderTests(SynchronousTestCase):
    @settings(deadline=None, max_examples=30)
    @given(st.lists(st.integers(1, 5000), min_size=1, max_size=10))
    def test_gzip_encoder_streams(self, cuts: list[int]) -> None:
        """Each fed piece is flushed: what came out so far decodes to what
        went in so far; the whole is a gzip body of the original."""
        encoder = encoder_for(b"gzip")
        assert encoder is not None
        self.assertIsInstance(encoder, GzipEncoder)
        out, pos, i = [], 0, 0
        partial = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while pos < len(ORIGINAL):
            piece = ORIGINAL[pos : pos + cuts[i % len(cuts)]]
            out.append(encoder.feed(piece))
            self.assertEqual(partial.decompress(out[-1]), piece)
            pos += len(piece)
            i += 1
        out.append(encoder.finish())
        self.assertEqual(gzip.decompress(b"".join(out)), ORIGINAL)
        self.assertIsNone(encoder_for(None))

    def _streams(self, coding: bytes, cuts: list[int], level: int | None = None) -> None:
        """Fed in pieces of ``cuts`` (cycled): after each feed, everything
        out so far decodes to everything in so far (the flush works), and
        the finished whole decodes (with Prexy's own decoder) to the input."""
        encoder = encoder_for(coding, level)
        assert encoder is not None
        partial = decoder_for((coding,))
        out, pos, i = [], 0, 0
        while pos < len(ORIGINAL):
            piece = ORIGINAL[pos : pos + cuts[i % len(cuts)]]
            out.append(encoder.feed(piece))
            self.assertEqual(partial.feed(out[-1]), piece, (coding, pos))
            pos += len(piece)
            i += 1
        out.append(encoder.finish())
        body = b"".join(out)
        self.assertEqual(partial.feed(out[-1]) + partial.finish(), b"")
        self.assertEqual(decode((coding,), body, [len(body)]), ORIGINAL)
        reference = {b"gzip": gzip.decompress, b"br": brotli.decompress,
                     b"zstd": lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b)}
        self.assertEqual(reference[coding](body), ORIGINAL)

    def test_every_encoder_whole(self) -> None:
        """Each coding, fed in one piece, at its default and extreme levels."""
        self.assertEqual(set(ENCODERS), {b"gzip", b"br", b"zstd"})
        for coding in ENCODERS:
            for level in (None, 1):
                self._streams(coding, [len(ORIGINAL)], level)

    def test_every_encoder_byte_by_byte(self) -> None:
        for coding in ENCODERS:
            self._streams(coding, [1])

    @settings(deadline=None, max_examples=40)
    @given(st.sampled_from(sorted(ENCODERS)), st.lists(st.integers(1, 5000), min_size=1, max_size=10))
    def test_every_encoder_any_chunking(self, coding: bytes, cuts: list[int]) -> None:
        self._streams(coding, cuts)

    def test_empty_body_and_empty_feeds(self) -> None:
        """An empty feed gives nothing; an empty body is still a valid stream."""
        for coding in ENCODERS:
            encoder = encoder_for(coding)
            assert encoder is not None
            self.assertEqual(encoder.feed(b""), b"")
            self.assertEqual(decode((coding,), encoder.finish(), [1]), b"")

    @settings(deadline=None, max_examples=40)
    @given(st.sampled_from(sorted(ENCODERS)), st.lists(st.integers(0, 5000), max_size=6))
    def test_last_ends_the_stream(self, coding: bytes, cuts: list[int]) -> None:
        """``last`` takes the final bytes and ends the stream in one call,
        after any number of feeds (or none, or with nothing left): the whole
        decodes to the input, by Prexy's decoder and the coding's own."""
        encoder = encoder_for(coding)
        assert encoder is not None
        out, pos = [], 0
        for cut in cuts:
            out.append(encoder.feed(ORIGINAL[pos : pos + cut]))
            pos += cut
        out.append(encoder.last(ORIGINAL[pos:]))
        body = b"".join(out)
        self.assertEqual(decode((coding,), body, [len(body) or 1]), ORIGINAL)
        reference = {b"gzip": gzip.decompress, b"br": brotli.decompress,
                     b"zstd": lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b)}
        self.assertEqual(reference[coding](body), ORIGINAL)

    def test_last_makes_no_flush(self) -> None:
        """A body given whole to ``last`` is not flushed before its end: for
        br no longer than feed-then-finish, which carries a flushed block."""
        for coding in ENCODERS:
            a, b = encoder_for(coding), encoder_for(coding)
            assert a is not None and b is not None
            self.assertLessEqual(len(a.last(ORIGINAL)), len(b.feed(ORIGINAL) + b.finish()), coding)
        a, b = encoder_for(b"br"), encoder_for(b"br")
        assert a is not None and b is not None
        self.assertLess(len(a.last(ORIGINAL)), len(b.feed(ORIGINAL) + b.finish()))

    def test_classes(self) -> None:
        self.assertIsInstance(encoder_for(b"br", 5), BrotliEncoder)
        self.assertIsInstance(encoder_for(b"zstd"), ZstdEncoder)


@expand
class NegotiationTests(SynchronousTestCase):
    @parametrize(
        "header, expected",
        [
            (None, None),
            ([], None),
            ([b""], None),
            ([b"gzip"], b"gzip"),
            ([b"GZIP"], b"gzip"),
            ([b"x-gzip"], b"gzip"),
            ([b"gzip, br"], b"br"),  # a tie: the server's order
            ([b"gzip, zstd"], b"zstd"),
            ([b"gzip, deflate, br, zstd"], b"br"),
            ([b"gzip", b"Br"], b"br"),  # over two header lines
            ([b"br;q=0.5, gzip"], b"gzip"),
            ([b"br;q=0.5, gzip;q=0.8, zstd;q=0.7"], b"gzip"),
            ([b"br ; Q=0.9 , gzip;q=0.9"], b"br"),
            ([b"gzip;q=0"], None),
            ([b"gzip;q=0.000"], None),
            ([b"gzip;q=0, br"], b"br"),
            ([b"*"], b"br"),
            ([b"*;q=0.5, gzip"], b"gzip"),
            ([b"*, br;q=0"], b"zstd"),
            ([b"*;q=0"], None),
            ([b"*;q=0, gzip"], b"gzip"),
            ([b"identity"], None),
            ([b"identity;q=0"], None),  # nothing acceptable: identity anyway
            ([b"identity;q=0, gzip;q=0.1"], b"gzip"),
            ([b"deflate, compress"], None),
            ([b"gzip;q=high"], None),  # malformed q: 0
            ([b"gzip;q=1.5"], None),
            ([b"gzip;q=-1"], None),
            ([b"gzip;q=0.1234"], None),
            ([b"gzip;q=1.000"], b"gzip"),
            ([b"gzip;q="], None),
            ([b"gzip;level=9"], b"gzip"),  # another parameter: q stays 1
            ([b"gzip;q=0.2, gzip;q=0.9, br;q=0.5"], b"br"),  # the first q of a coding counts
            ([b",, gzip ,"], b"gzip"),
        ],
    )
    def test_negotiate(self, header: list[bytes] | None, expected: bytes | None) -> None:
        """RFC 9110 12.5.3: q-values, ``*``, refusals, the server's order on ties."""
        self.assertEqual(negotiate(header), expected)

    def test_offered_order_and_subset(self) -> None:
        self.assertEqual(negotiate([b"gzip, br"], (b"gzip", b"br")), b"gzip")
        self.assertEqual(negotiate([b"br"], (b"gzip",)), None)

    def test_parse_accept_encoding(self) -> None:
        self.assertEqual(
            parse_accept_encoding([b"GZip;q=0.5, br", b"*;q=bad"]), {b"gzip": 0.5, b"br": 1.0, b"*": 0.0}
        )

    @parametrize(
        "content_type, expected",
        [
            (b"text/html", True),
            (b"TEXT/HTML; charset=utf-8", True),
            (b"text/css", True),
            (b"application/javascript", True),
            (b"application/json", True),
            (b"application/ld+json", True),
            (b"application/atom+xml", True),
            (b"image/svg+xml", True),
            (b"image/png", False),
            (b"application/octet-stream", False),
            (b"application/jsonx", False),
            (b"text", False),
            (b"", False),
            (None, False),
        ],
    )
    def test_default_types(self, content_type: bytes | None, expected: bool) -> None:
        """The default compressible types, by media type (parameters and
        case ignored) and ``*`` / ``*+suffix`` patterns."""
        self.assertEqual(Compression().compressible(content_type), expected)

    def test_types_configurable_and_off(self) -> None:
        self.assertTrue(type_matches(b"image/png", ("image/*",)))
        self.assertFalse(Compression(enabled=False).compressible(b"text/html"))
        self.assertTrue(Compression(types=("Image/PNG",)).compressible(b"image/png"))
