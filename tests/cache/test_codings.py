"""``prexy.cache.codings``: which stored answers get a compressed variant,
its key and its headers."""

from __future__ import annotations

import gzip

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.codings import coded_headers, compress_whole, stored_coding, variant_key
from prexy.codec import Compression

DEFAULT = Compression()
HTML = [(b"Content-Type", b"text/html"), (b"Vary", b"Accept-Encoding"), (b"ETag", b'"abc"')]


def coding(headers: list[tuple[bytes, bytes]] = HTML, *, status: int = 200, length: int = 1000,
           method: bytes = b"GET", accept: list[bytes] | None = None,
           compression: Compression = DEFAULT) -> bytes | None:
    return stored_coding(status, headers, length, method=method, compression=compression,
                         accept_encoding=[b"gzip, br"] if accept is None else accept)


class StoredCodingTests(SynchronousTestCase):
    def test_negotiated(self) -> None:
        """A rewritten page goes out in the client's preferred coding."""
        self.assertEqual(coding(), b"br")
        self.assertEqual(coding(accept=[b"gzip"]), b"gzip")
        self.assertEqual(coding(method=b"HEAD"), b"br")

    def test_as_stored(self) -> None:
        """None for: no Accept-Encoding, identity only, not 200, POST, short,
        already encoded, no Vary: Accept-Encoding, no-transform, a type not
        compressed, compression off."""
        self.assertIsNone(coding(accept=[]))
        self.assertIsNone(coding(accept=[b"identity"]))
        self.assertIsNone(coding(status=206))
        self.assertIsNone(coding(method=b"POST"))
        self.assertIsNone(coding(length=100))
        self.assertIsNone(coding([*HTML, (b"Content-Encoding", b"gzip")]))
        self.assertIsNone(coding([(b"Content-Type", b"text/html")]))
        self.assertIsNone(coding([*HTML, (b"Cache-Control", b"public, No-Transform")]))
        self.assertIsNone(coding([(b"Content-Type", b"image/png"), (b"Vary", b"Accept-Encoding")]))
        self.assertIsNone(coding(compression=Compression(enabled=False)))

    def test_vary_among_others(self) -> None:
        self.assertEqual(coding([(b"content-type", b"text/css"), (b"vary", b"Cookie, accept-encoding")]), b"br")


class VariantTests(SynchronousTestCase):
    def test_key(self) -> None:
        """The variant shares its object's key as a prefix; another coding
        or another stored_at is another key."""
        key = b"k" * 32
        one = variant_key(key, b"gzip", 100.0)
        self.assertTrue(one.startswith(key))
        self.assertNotEqual(one, variant_key(key, b"br", 100.0))
        self.assertNotEqual(one, variant_key(key, b"gzip", 100.5))

    def test_key_by_strong_etag(self) -> None:
        """With a strong ETag the key outlives a refresh (another stored_at);
        a weak one, or none, keys by stored_at."""
        key = b"k" * 32
        self.assertEqual(variant_key(key, b"br", 1.0, b'"v1"'), variant_key(key, b"br", 2.0, b'"v1"'))
        self.assertNotEqual(variant_key(key, b"br", 1.0, b'"v1"'), variant_key(key, b"br", 1.0, b'"v2"'))
        self.assertNotEqual(variant_key(key, b"br", 1.0, b'W/"v1"'), variant_key(key, b"br", 2.0, b'W/"v1"'))
        self.assertTrue(variant_key(key, b"br", 1.0, b'"v1"').startswith(key))

    def test_headers(self) -> None:
        out = coded_headers([*HTML, (b"Content-Encoding", b"identity")], b"gzip")
        self.assertEqual(out, [(b"Content-Type", b"text/html"), (b"Vary", b"Accept-Encoding"),
                               (b"ETag", b'"abc-gzip"'), (b"Content-Encoding", b"gzip")])

    def test_compress_whole(self) -> None:
        self.assertEqual(gzip.decompress(compress_whole(b"x" * 5000, b"gzip", 4)), b"x" * 5000)
