"""Compression to clients through the in-memory proxy: a rewritten body
goes out in the coding the client prefers and decodes to exactly the bytes
an identity client gets, with Vary and an ETag variant; no-transform, small
bodies, other types, HEAD and a cached site's answers stay as they were."""

from __future__ import annotations

import gzip
import tempfile

import brotli
import zstandard
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import CachePolicy
from prexy.cache.store import Store
from prexy.codec import Compression
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.proxy.caching import CacheLayer
from prexy.substitution import parse_rules

from .support import Harness, header, parse_response, site_runtime
from .test_rewrite import PAGE, REWRITTEN, RULES

BIG, BIG_REWRITTEN = PAGE * 50, REWRITTEN * 50
DECODE = {
    b"gzip": gzip.decompress,
    b"br": brotli.decompress,
    b"zstd": lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b),
}


DEFAULT = Compression()


def harness(compression: Compression = DEFAULT, cache: CachePolicy | None = None) -> Harness:
    config = Config(
        listen=("tcp:0",),
        sites=(SiteConfig("s", UpstreamURL.parse("http://origin.test"), cache=cache, compression=compression),),
        default_site="s",
    )
    h = Harness(config, site_runtime(config, s={"rules": parse_rules(RULES, "test.rules")}))
    if cache is not None:
        store = Store.open(tempfile.mkdtemp(prefix="prexy-compress-"), 64 << 20, clock=h.clock.seconds)
        h.resource.cache = CacheLayer(h.clock, store, h.metrics)
    return h


def fetch(
    h: Harness,
    accept: bytes | None,
    body: bytes = BIG,
    extra: bytes = b"",
    method: bytes = b"GET",
    ctype: bytes = b"text/html; charset=utf-8",
    pieces: int = 1,
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One request through a fresh client connection; the origin answers
    ``body`` with a length, in ``pieces``."""
    request = method + b" / HTTP/1.1\r\nHost: x\r\n"
    if accept is not None:
        request += b"Accept-Encoding: " + accept + b"\r\n"
    _, client = h.send(request + b"\r\n")
    conn = h.conns[-1]
    conn.sent()
    conn.reply(
        b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\nETag: \"v1\"\r\n%s\r\n"
        % (ctype, len(body), extra)
    )
    if method != b"HEAD":
        step = max(1, len(body) // pieces)
        for i in range(0, len(body), step):
            conn.reply(body[i : i + step])
    h.settle()
    return parse_response(client.value())


class CompressionTests(SynchronousTestCase):
    def test_negotiated_coding_decodes_to_identity_answer(self) -> None:
        """gzip, br and zstd as the client asks, in one piece and streamed
        byte by byte: each decodes to exactly the identity client's body."""
        for pieces in (1, 7, len(BIG)):
            _, plain_headers, plain = fetch(harness(), None, pieces=pieces)
            self.assertEqual(plain, BIG_REWRITTEN)
            self.assertEqual(header(plain_headers, b"content-encoding"), [])
            for accept, coding in [
                (b"gzip", b"gzip"), (b"br", b"br"), (b"zstd", b"zstd"),
                (b"gzip, deflate, br, zstd", b"br"), (b"gzip;q=1, br;q=0.5", b"gzip"),
            ]:
                status, headers, body = fetch(harness(), accept, pieces=pieces)
                self.assertEqual(status, 200)
                self.assertEqual(header(headers, b"content-encoding"), [coding], accept)
                self.assertEqual(DECODE[coding](body), plain, (accept, pieces))
                self.assertLess(len(body), len(plain) // 4)
                self.assertEqual(header(headers, b"vary"), [b"Accept-Encoding"])
                self.assertEqual(header(headers, b"content-length"), [])
                (etag,) = header(headers, b"etag")
                self.assertTrue(etag.endswith(b"-" + coding + b'"'), etag)
                self.assertEqual(etag, header(plain_headers, b"etag")[0][:-1] + b"-" + coding + b'"')

    def test_identity_answer_says_vary(self) -> None:
        """A compressible answer sent as identity (the client takes no
        coding we offer) still says Vary: Accept-Encoding, merged with the
        upstream's Vary, and keeps its plain derived ETag."""
        for accept in (None, b"identity", b"deflate", b"gzip;q=0"):
            _, headers, body = fetch(harness(), accept, extra=b"Vary: Cookie\r\n")
            self.assertEqual(body, BIG_REWRITTEN)
            self.assertEqual(header(headers, b"content-encoding"), [])
            self.assertEqual(header(headers, b"vary"), [b"Cookie, Accept-Encoding"])
            self.assertFalse(header(headers, b"etag")[0].endswith(b'-gzip"'))

    def test_vary_not_duplicated_and_weak_etag(self) -> None:
        _, headers, body = fetch(harness(), b"gzip", extra=b"Vary: accept-encoding\r\n")
        self.assertEqual(header(headers, b"vary"), [b"accept-encoding"])
        self.assertEqual(gzip.decompress(body), BIG_REWRITTEN)

    def test_untouched(self) -> None:
        """no-transform, a body under min_length, a type outside the list,
        compression off, and a HEAD go out as identity, without Vary."""
        cases = [
            ("no-transform", harness(), {"extra": b"Cache-Control: public, No-Transform\r\n"}),
            ("small", harness(), {"body": PAGE}),
            ("min_length", harness(Compression(min_length=len(BIG) + 1)), {}),
            ("off", harness(Compression(enabled=False)), {}),
            ("type", harness(Compression(types=("text/css",))), {}),
        ]
        for name, h, kw in cases:
            _, headers, body = fetch(h, b"gzip, br, zstd", **kw)  # type: ignore[arg-type]
            self.assertEqual(header(headers, b"content-encoding"), [], name)
            self.assertEqual(header(headers, b"vary"), [], name)
            self.assertIn(body, (BIG_REWRITTEN, REWRITTEN), name)
        status, headers, body = fetch(harness(), b"gzip", method=b"HEAD")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(header(headers, b"content-encoding"), [])

    def test_non_rewritten_type_passes(self) -> None:
        """A type the rules do not apply to passes through as it is, with
        its length (the zero-copy path takes no encoder)."""
        data = b"{" + b'"k": "v", ' * 100 + b"}"
        _, headers, body = fetch(harness(), b"gzip", body=data, ctype=b"application/json")
        self.assertEqual(body, data)
        self.assertEqual(header(headers, b"content-encoding"), [])
        self.assertEqual(header(headers, b"content-length"), [b"%d" % len(data)])

    def test_levels_are_used(self) -> None:
        """The site's level per coding is the encoder's."""
        _, _, fast = fetch(harness(Compression(br_level=0)), b"br")
        _, _, small = fetch(harness(Compression(br_level=11)), b"br")
        self.assertEqual(brotli.decompress(fast), brotli.decompress(small))
        self.assertLess(len(small), len(fast))

    def test_cached_site_stays_uncompressed(self) -> None:
        """A response the cache stores goes out as today: identity."""
        h = harness(cache=CachePolicy())
        _, headers, body = fetch(h, b"gzip, br", extra=b"Cache-Control: max-age=60\r\n")
        self.assertEqual(body, BIG_REWRITTEN)
        self.assertEqual(header(headers, b"content-encoding"), [])
        self.assertIn(b"stored", b" ".join(header(headers, b"cache-status")))

    def test_body_with_head_rewritten_before_it(self) -> None:
        """A small body that comes with its head (rewritten before the head
        goes out) is compressed and finished too."""
        h = harness()
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: x\r\nAccept-Encoding: zstd\r\n\r\n")
        conn = h.conns[-1]
        conn.sent()
        body = PAGE * 5
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        h.settle()
        _, headers, out = parse_response(client.value())
        self.assertEqual(header(headers, b"content-encoding"), [b"zstd"])
        self.assertEqual(DECODE[b"zstd"](out), REWRITTEN * 5)
        self.assertEqual(header(headers, b"trailer"), [])
