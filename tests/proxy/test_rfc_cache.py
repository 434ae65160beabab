"""The cache by RFC 9111 through the proxy, in memory: ranges answered
from stored objects, the whole object fetched for a range miss,
stale-if-error on 5xx answers, invalidation after non-error answers only,
and 304s that update the stored headers."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import CachePolicy
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.proxy.caching import CacheLayer
from prexy.runtime import build_runtime
from tests.cases import unlinked_store

from .support import Harness, header, parse_response

BODY = bytes(range(256)) * 4


def harness(policy: CachePolicy | None = None) -> Harness:
    site = SiteConfig("s", UpstreamURL.parse("http://o.test"), cache=policy or CachePolicy(purge_from=("10.1.2.3",)))
    config = Config(listen=("tcp:0",), sites=(site,), default_site="s")
    h = Harness(config, build_runtime(config))
    store = unlinked_store("prexy-rfc-", 64 << 20, h.clock.seconds)
    h.resource.cache = CacheLayer(h.clock, store, h.metrics)
    return h


def ok(extra: bytes = b"Cache-Control: max-age=60\r\n", body: bytes = BODY, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/octet-stream\r\nETag: \"t1\"\r\n%sContent-Length: %d\r\n\r\n%s" % (
        status, extra, len(body), body)


def request(h: Harness, extra: bytes = b"", method: bytes = b"GET", reply: bytes | None = None,
            body: bytes = b"") -> tuple[int, list[tuple[bytes, bytes]], bytes, bytes | None]:
    """One request; ``reply`` answers it upstream (None: expect no upstream
    request).  Returns status, headers, body and what went upstream."""
    before = len(h.conns)
    raw = method + b" /f HTTP/1.1\r\nHost: a\r\n" + extra
    if body:
        raw += b"Content-Length: %d\r\n" % len(body)
    _, client = h.send(raw + b"\r\n" + body)
    sent = None
    if reply is not None:
        conn = h.conns[-1]
        sent = conn.sent()
        assert sent, "nothing went upstream"
        conn.reply(reply)
    else:
        assert len(h.conns) == before
    h.settle()
    status, headers, out = parse_response(client.value())
    return status, headers, out, sent


class HitTests(SynchronousTestCase):
    def test_hit_is_one_write(self) -> None:
        """A hit's head and body go to the client in one write (one send
        on a TCP connection), the same bytes as two writes would be."""
        h = harness()
        request(h, reply=ok())
        channel, client = h.client()
        writes = client.record_writes()
        channel.dataReceived(b"GET /f HTTP/1.1\r\nHost: a\r\n\r\n")
        h.settle()
        [one] = writes
        status, headers, body = parse_response(one)
        self.assertEqual((status, body), (200, BODY))
        self.assertIn(b"hit", b" ".join(header(headers, b"cache-status")))


class RangeTests(SynchronousTestCase):
    def test_range_hit(self) -> None:
        """A stored object answers a Range with a 206 of its bytes."""
        h = harness()
        request(h, reply=ok())
        status, headers, body, _ = request(h, b"Range: bytes=10-19\r\n")
        self.assertEqual((status, body), (206, BODY[10:20]))
        self.assertEqual(header(headers, b"content-range"), [b"bytes 10-19/1024"])
        self.assertEqual(header(headers, b"content-length"), [b"10"])
        self.assertIn(b"hit", b" ".join(header(headers, b"cache-status")))

    def test_suffix_and_unsatisfiable(self) -> None:
        h = harness()
        request(h, reply=ok())
        self.assertEqual(request(h, b"Range: bytes=-4\r\n")[2], BODY[-4:])
        status, headers, body, _ = request(h, b"Range: bytes=5000-\r\n")
        self.assertEqual((status, body), (416, b""))
        self.assertEqual(header(headers, b"content-range"), [b"bytes */1024"])

    def test_if_range_mismatch_gives_the_whole_object(self) -> None:
        h = harness()
        request(h, reply=ok())
        status, headers, body, _ = request(h, b'Range: bytes=0-0\r\nIf-Range: "old"\r\n')
        self.assertEqual((status, body), (200, BODY))
        self.assertEqual(header(headers, b"accept-ranges"), [b"bytes"])

    def test_range_miss_fetches_the_whole_object(self) -> None:
        """A range miss asks the upstream for the whole object (no Range),
        stores it, and gives its own client the range as it streams by;
        the next range is a hit."""
        h = harness()
        status, headers, body, sent = request(h, b"Range: bytes=1000-1009\r\nIf-Range: \"t1\"\r\n", reply=ok())
        assert sent is not None
        self.assertNotIn(b"range", sent.lower())
        self.assertEqual((status, body), (206, BODY[1000:1010]))
        self.assertEqual(header(headers, b"content-range"), [b"bytes 1000-1009/1024"])
        self.assertIn(b"stored", b" ".join(header(headers, b"cache-status")))
        status, _, body, _ = request(h, b"Range: bytes=0-9\r\n")
        self.assertEqual((status, body), (206, BODY[:10]))
        self.assertEqual(request(h)[2], BODY)  # the whole object was stored

    def test_range_miss_in_pieces_and_unsatisfiable(self) -> None:
        """The range is cut right however the body arrives; a range past the
        end is a 416 while the object is still stored."""
        h = harness()
        _, client = h.send(b"GET /f HTTP/1.1\r\nHost: a\r\nRange: bytes=300-700\r\n\r\n")
        conn = h.conns[-1]
        conn.sent()
        whole = ok()
        for i in range(0, len(whole), 97):
            conn.reply(whole[i : i + 97])
        h.settle()
        status, _, body = parse_response(client.value())
        self.assertEqual((status, body), (206, BODY[300:701]))
        h2 = harness()
        status, headers, body, _ = request(h2, b"Range: bytes=5000-\r\n", reply=ok())
        self.assertEqual((status, body, header(headers, b"content-range")), (416, b"", [b"bytes */1024"]))
        self.assertEqual(request(h2)[2], BODY)

    def test_followers_of_a_miss_get_their_ranges(self) -> None:
        """Requests that follow a miss (one upstream fetch) get their own
        range cut as the whole object streams by; an If-Range that does not
        match, and a request with no Range, get the whole object."""
        h = harness()
        _, leader = h.send(b"GET /f HTTP/1.1\r\nHost: a\r\n\r\n")
        _, part = h.send(b"GET /f HTTP/1.1\r\nHost: a\r\nRange: bytes=500-519\r\n\r\n")
        _, tail = h.send(b"GET /f HTTP/1.1\r\nHost: a\r\nRange: bytes=-4\r\n\r\n")
        _, other = h.send(b"GET /f HTTP/1.1\r\nHost: a\r\nRange: bytes=0-9\r\nIf-Range: \"t0\"\r\n\r\n")
        self.assertEqual(len(h.conns), 1)  # one fetch for all four
        conn = h.conns[-1]
        self.assertNotIn(b"range", conn.sent().lower())
        whole = ok()
        for i in range(0, len(whole), 101):
            conn.reply(whole[i : i + 101])
        h.settle()
        status, _, body = parse_response(leader.value())
        self.assertEqual((status, body), (200, BODY))
        status, headers, body = parse_response(part.value())
        self.assertEqual((status, body), (206, BODY[500:520]))
        self.assertEqual(header(headers, b"content-range"), [b"bytes 500-519/1024"])
        self.assertEqual(header(headers, b"content-length"), [b"20"])
        self.assertEqual(parse_response(tail.value())[::2], (206, BODY[-4:]))
        self.assertEqual(parse_response(other.value())[::2], (200, BODY))

    def test_an_unasked_206_does_not_poison_the_url(self) -> None:
        """A 206 the upstream sends anyway passes, and the next request
        still fetches and stores the object."""
        h = harness()
        part = b"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-1/1024\r\nContent-Length: 2\r\n\r\nab"
        self.assertEqual(request(h, reply=part)[0], 206)
        request(h, reply=ok())
        self.assertEqual(request(h)[0], 200)  # a hit: no upstream request


class StaleIfErrorTests(SynchronousTestCase):
    def test_5xx_serves_the_stale_copy(self) -> None:
        """Past its TTL (and grace), an object whose stale-if-error window
        is open is served when the upstream answers 500-504; the copy is
        kept for the next error."""
        h = harness(CachePolicy(grace=0))
        request(h, reply=ok(b"Cache-Control: max-age=10, stale-if-error=300\r\n"))
        h.clock.advance(20)
        for code in (b"500 Internal Server Error", b"502 Bad Gateway", b"503 Service Unavailable", b"504 Gateway Timeout"):
            status, headers, body, _ = request(h, reply=ok(b"", b"down", code))
            self.assertEqual((status, body), (200, BODY), code)
            self.assertIn(b"stale-if-error", b" ".join(header(headers, b"cache-status")))

    def test_404_is_not_an_error_to_hide(self) -> None:
        h = harness(CachePolicy(grace=0))
        request(h, reply=ok(b"Cache-Control: max-age=10, stale-if-error=300\r\n"))
        h.clock.advance(20)
        self.assertEqual(request(h, reply=ok(b"", b"gone", b"404 Not Found"))[0], 404)

    def test_window_closed(self) -> None:
        h = harness(CachePolicy(grace=0))
        request(h, reply=ok(b"Cache-Control: max-age=10, stale-if-error=5\r\n"))
        h.clock.advance(30)
        self.assertEqual(request(h, reply=ok(b"", b"down", b"503 Service Unavailable"))[0], 503)

    def test_background_refresh_5xx_keeps_the_copy(self) -> None:
        """During grace a refresh that gets a 503 leaves the good copy."""
        h = harness(CachePolicy(grace=60))
        request(h, reply=ok(b"Cache-Control: max-age=10\r\n"))
        h.clock.advance(15)
        _, client = h.send(b"GET /f HTTP/1.1\r\nHost: a\r\n\r\n")  # grace hit, refresh starts
        h.settle()
        self.assertEqual(parse_response(client.value())[2], BODY)
        conn = h.conns[-1]
        conn.sent()
        conn.reply(ok(b"", b"down", b"503 Service Unavailable"))
        h.settle()
        status, _, body, _ = request(h)  # still in grace: served from the store
        self.assertEqual((status, body), (200, BODY))


class InvalidationTests(SynchronousTestCase):
    def test_after_a_success_only(self) -> None:
        """POST answered 500 leaves the object; POST answered 200 removes it."""
        h = harness()
        request(h, reply=ok())
        request(h, method=b"POST", body=b"x", reply=ok(b"", b"no", b"500 Internal Server Error"))
        self.assertEqual(request(h)[0], 200)  # still a hit
        request(h, method=b"POST", body=b"x", reply=ok(b"", b"ok"))
        self.assertEqual(request(h, reply=ok())[0], 200)  # fetched again
        self.assertEqual(h.metrics.counters[("prexy_cache_invalidations_total", ())], 1)


class NotModifiedTests(SynchronousTestCase):
    """A 304 to a revalidation updates the stored head (RFC 9111 4.3.4)."""

    def revalidated(self, first: bytes, not_modified: bytes, policy: CachePolicy | None = None) -> Harness:
        h = harness(policy or CachePolicy(grace=0, keep=600))
        request(h, reply=ok(first))
        h.clock.advance(5)
        _, _, _, sent = request(h, reply=b"HTTP/1.1 304 Not Modified\r\n" + not_modified + b"\r\n")
        assert sent is not None
        self.assertIn(b'if-none-match: "t1"', sent.lower())
        return h

    def test_new_cache_control_and_headers(self) -> None:
        """max-age=3600 on the 304 replaces the stored max-age=1; new and
        changed fields (CSP, X-*) are stored; the body is kept."""
        h = self.revalidated(
            b"Cache-Control: max-age=1\r\nX-Frame-Options: DENY\r\nX-Old: 1\r\n",
            b"Cache-Control: max-age=3600\r\nContent-Security-Policy: default-src 'self'\r\n"
            b"X-Frame-Options: SAMEORIGIN\r\nContent-Length: 5\r\n",
        )
        h.clock.advance(1000)
        status, headers, body, _ = request(h)  # fresh for 3600 s now: a hit
        self.assertEqual((status, body), (200, BODY))
        self.assertEqual(header(headers, b"cache-control"), [b"max-age=3600"])
        self.assertEqual(header(headers, b"x-frame-options"), [b"SAMEORIGIN"])
        self.assertEqual(header(headers, b"content-security-policy"), [b"default-src 'self'"])
        self.assertEqual(header(headers, b"x-old"), [b"1"])
        self.assertEqual(header(headers, b"content-length"), [b"1024"])

    def test_304_without_cache_control_keeps_the_stored_max_age(self) -> None:
        """No Cache-Control on the 304: the stored max-age=1 still rules,
        not the site's default TTL."""
        h = self.revalidated(b"Cache-Control: max-age=1\r\n", b"X-A: b\r\n", CachePolicy(grace=0, keep=600, default_ttl=3600))
        h.clock.advance(10)
        _, _, _, sent = request(h, reply=b"HTTP/1.1 304 Not Modified\r\n\r\n")  # stale again: revalidated
        self.assertIsNotNone(sent)


class TargetedFieldTests(SynchronousTestCase):
    def test_prexy_cache_control_wins_and_is_not_passed_on(self) -> None:
        """Prexy-Cache-Control: max-age=600 over Cache-Control: no-store:
        stored for Prexy; the client never sees the field, a hit neither;
        CDN-Cache-Control is passed on."""
        h = harness()
        extra = (b"Cache-Control: no-store\r\nPrexy-Cache-Control: max-age=600\r\n"
                 b"CDN-Cache-Control: max-age=60\r\n")
        status, headers, _, _ = request(h, reply=ok(extra))
        self.assertEqual(header(headers, b"prexy-cache-control"), [])
        self.assertEqual(header(headers, b"cdn-cache-control"), [b"max-age=60"])
        self.assertIn(b"stored", b" ".join(header(headers, b"cache-status")))
        h.clock.advance(300)
        status, headers, body, _ = request(h)
        self.assertEqual((status, body), (200, BODY))
        self.assertEqual(header(headers, b"prexy-cache-control"), [])
        self.assertEqual(header(headers, b"cache-control"), [b"no-store"])


class CompressedRefreshTests(SynchronousTestCase):
    def test_copies_outlive_a_304_and_show_its_head(self) -> None:
        """A 304 keeps the compressed copy (made once) and its head shows in
        compressed hits: the copy is keyed by the strong ETag."""
        import gzip

        h = harness(CachePolicy(grace=0, keep=600))
        page = b"<p>text</p>" * 200
        first = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: \"t1\"\r\nCache-Control: max-age=10\r\n"
                 b"X-V: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))
        request(h, reply=first)
        _, headers, body, _ = request(h, b"Accept-Encoding: gzip\r\n")
        self.assertEqual((gzip.decompress(body), header(headers, b"x-v")), (page, [b"1"]))
        h.clock.advance(20)
        request(h, reply=b"HTTP/1.1 304 Not Modified\r\nETag: \"t1\"\r\nCache-Control: max-age=600\r\nX-V: 2\r\n\r\n")
        _, headers, body, _ = request(h, b"Accept-Encoding: gzip\r\n")
        self.assertEqual((gzip.decompress(body), header(headers, b"x-v")), (page, [b"2"]))
        self.assertEqual(header(headers, b"content-encoding"), [b"gzip"])
        self.assertEqual(h.metrics.counters[("prexy_cache_compressed_total", (("coding", "gzip"),))], 1)
