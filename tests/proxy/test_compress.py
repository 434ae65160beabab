"""Compression to clients through the in-memory proxy: a rewritten body
goes out in the coding the client prefers and decodes to exactly the bytes
an identity client gets, with Vary and an ETag variant; no-transform, small
bodies, other types, HEAD and a cached site's answers stay as they were."""

from __future__ import annotations

import gzip

import brotli
import zstandard
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import CachePolicy
from prexy.codec import Compression
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.proxy.caching import CacheLayer
from prexy.substitution import parse_rules
from tests.cases import unlinked_store

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
        store = unlinked_store("prexy-compress-", 64 << 20, h.clock.seconds)
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


def hit(
    h: Harness, accept: bytes | None, method: bytes = b"GET", extra: bytes = b""
) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A request the cache should answer (nothing is replied upstream)."""
    request = method + b" / HTTP/1.1\r\nHost: x\r\n" + extra
    if accept is not None:
        request += b"Accept-Encoding: " + accept + b"\r\n"
    _, client = h.send(request + b"\r\n")
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
        compression off (a HEAD too) go out as identity, without Vary."""
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
        status, headers, body = fetch(harness(Compression(enabled=False)), b"gzip", method=b"HEAD")
        self.assertEqual((status, body), (200, b""))
        self.assertEqual(header(headers, b"content-encoding"), [])

    def test_non_rewritten_type_compressed_on_the_way(self) -> None:
        """A type the rules do not apply to passes through unrewritten, and
        is compressed for a client that takes a coding (as nginx's gzip on
        does), with Vary and the coding's ETag; identity to one that does
        not, with its length."""
        data = b"{" + b'"k": "v", ' * 100 + b"}"
        _, headers, body = fetch(harness(), b"gzip", body=data, ctype=b"application/json")
        self.assertEqual(header(headers, b"content-encoding"), [b"gzip"])
        self.assertEqual(gzip.decompress(body), data)
        self.assertEqual(header(headers, b"etag"), [b'"v1-gzip"'])
        self.assertIn(b"Accept-Encoding", b" ".join(header(headers, b"vary")))
        _, headers, body = fetch(harness(), None, body=data, ctype=b"application/json")
        self.assertEqual((body, header(headers, b"content-length")), (data, [b"%d" % len(data)]))
        self.assertEqual(header(headers, b"content-encoding"), [])

    def test_upstream_coding_passes_as_it_is(self) -> None:
        """A body the upstream compressed and the rules do not touch is
        never compressed again."""
        data = gzip.compress(b"x" * 5000)
        _, headers, body = fetch(harness(), b"br", body=data, ctype=b"application/json",
                                 extra=b"Content-Encoding: gzip\r\n")
        self.assertEqual((header(headers, b"content-encoding"), body), ([b"gzip"], data))

    def test_images_pass_untouched(self) -> None:
        data = b"\x89PNG" + b"\0" * 5000
        _, headers, body = fetch(harness(), b"gzip", body=data, ctype=b"image/png")
        self.assertEqual((header(headers, b"content-encoding"), body), ([], data))

    def test_skipped_page_compressed_too(self) -> None:
        """A page version known to match no rule passes unscanned, and is
        still compressed for the client."""
        h = harness()
        page = b"<html>" + b"<p>nothing to change here</p>" * 50 + b"</html>"
        fetch(h, b"gzip", body=page)  # scanned: no rule matched
        _, headers, body = fetch(h, b"gzip", body=page)
        self.assertEqual(h.metrics.counters[("prexy_rewrite_skipped_total", ())], 1)
        self.assertEqual(header(headers, b"content-encoding"), [b"gzip"])
        self.assertEqual(gzip.decompress(body), page)
        self.assertEqual(header(headers, b"content-length"), [])

    def test_head_gets_the_get_head(self) -> None:
        """HEAD: Content-Encoding, Vary and the ETag its GET would get, no body."""
        _, get_headers, _ = fetch(harness(), b"gzip")
        _, headers, body = fetch(harness(), b"gzip", method=b"HEAD")
        self.assertEqual(body, b"")
        for name in (b"content-encoding", b"vary", b"etag"):
            self.assertEqual(header(headers, name), header(get_headers, name), name)

    def test_levels_are_used(self) -> None:
        """The site's level per coding is the encoder's."""
        _, _, fast = fetch(harness(Compression(br_level=0)), b"br")
        _, _, small = fetch(harness(Compression(br_level=11)), b"br")
        self.assertEqual(brotli.decompress(fast), brotli.decompress(small))
        self.assertLess(len(small), len(fast))

    def test_cached_miss_compressed_for_its_client_stored_identity(self) -> None:
        """The leader of a cached miss gets its coding; the cache keeps the
        identity answer (with Vary: Accept-Encoding), which a client that
        takes no coding then gets from the store."""
        h = harness(cache=CachePolicy())
        _, headers, body = fetch(h, b"gzip, br", extra=b"Cache-Control: max-age=60\r\n")
        self.assertEqual(header(headers, b"content-encoding"), [b"br"])
        self.assertEqual(DECODE[b"br"](body), BIG_REWRITTEN)
        self.assertIn(b"stored", b" ".join(header(headers, b"cache-status")))
        status, headers, body = hit(h, None)
        self.assertEqual((status, body), (200, BIG_REWRITTEN))
        self.assertEqual(header(headers, b"content-encoding"), [])
        self.assertIn(b"Accept-Encoding", b" ".join(header(headers, b"vary")))
        self.assertIn(b"hit", b" ".join(header(headers, b"cache-status")))

    def test_hits_compressed_once_per_coding(self) -> None:
        """Hits in a coding are served compressed; the first in each coding
        compresses and stores the variant, the later ones only read it."""
        h = harness(cache=CachePolicy())
        fetch(h, None, extra=b"Cache-Control: max-age=60\r\n")
        conns = len(h.conns)
        answers = {}
        for accept in (b"gzip", b"gzip, deflate", b"br", b"zstd, gzip;q=0.5", b"gzip"):
            status, headers, body = hit(h, accept)
            [coding] = header(headers, b"content-encoding")
            self.assertEqual(DECODE[coding](body), BIG_REWRITTEN)
            self.assertEqual(header(headers, b"content-length"), [b"%d" % len(body)])
            self.assertTrue(header(headers, b"etag")[0].endswith(b"-" + coding + b'"'))
            answers.setdefault(coding, set()).add(body)
        self.assertEqual(len(h.conns), conns)  # every one a hit
        self.assertEqual({c: len(b) for c, b in answers.items()}, {b"gzip": 1, b"br": 1, b"zstd": 1})
        for coding, n in ((b"gzip", 1), (b"br", 1), (b"zstd", 1)):
            self.assertEqual(h.metrics.counters[("prexy_cache_compressed_total", (("coding", coding.decode()),))], n)

    def test_compressed_hit_head_and_304(self) -> None:
        """HEAD gets the GET's head in the same coding; a conditional hit
        with the coding's ETag is a 304."""
        h = harness(cache=CachePolicy())
        fetch(h, None, extra=b"Cache-Control: max-age=60\r\n")
        _, got, _ = hit(h, b"gzip")
        _, head_headers, body = hit(h, b"gzip", method=b"HEAD")
        self.assertEqual(body, b"")
        self.assertEqual(header(head_headers, b"content-length"), header(got, b"content-length"))
        self.assertEqual(header(head_headers, b"content-encoding"), [b"gzip"])
        etag = header(got, b"etag")[0]
        status, _, _ = hit(h, b"gzip", extra=b"If-None-Match: " + etag + b"\r\n")
        self.assertEqual(status, 304)

    def test_purge_removes_the_compressed_variants(self) -> None:
        """PURGE of the URL takes its compressed variants too."""
        h = harness(cache=CachePolicy(purge_from=("10.1.2.3",)))
        fetch(h, None, extra=b"Cache-Control: max-age=60\r\n")
        hit(h, b"gzip")
        hit(h, b"br")
        _, headers, body = hit(h, None, method=b"PURGE")
        self.assertEqual(body, b"purged 3 object(s)\n")

    def test_no_transform_hit_stays_identity(self) -> None:
        h = harness(cache=CachePolicy())
        fetch(h, None, extra=b"Cache-Control: max-age=60, no-transform\r\n")
        _, headers, body = hit(h, b"gzip")
        self.assertEqual((header(headers, b"content-encoding"), body), ([], BIG_REWRITTEN))

    def test_body_with_head_rewritten_at_once(self) -> None:
        """A small body that comes with its head (rewritten at once, right
        after the head goes out) is compressed and finished too."""
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
        self.assertEqual(header(headers, b"trailer"), [b"Server-Timing"])
