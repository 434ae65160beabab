"""Fresh hits answered on the HTTP/1.x connection (``prexy.proxy.hitpath``)
give what the general path gives, byte for byte: the same requests go to
two proxies, one with the hit path and one without, after the same miss
filled each one's cache; the answers, the access log lines and the
metrics must be equal, and the hit path must have answered."""

from __future__ import annotations

import gc
import weakref
from typing import Any

import attrs
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import CachePolicy
from prexy.codec import Compression
from prexy.logformat import combined_line
from tests.cases import expand, parametrize

from . import test_compress, test_header_rules, test_rfc_cache
from .support import Harness, site_runtime

PAGE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: \"v1\"\r\nLast-Modified: Tue, 01 Dec 2026 10:00:00 GMT\r\n"
        b"X-Powered-By: PHP\r\ncontent-language: en\r\nLink: </a.css>\r\nLink: </b.js>\r\n"
        b"Cache-Control: max-age=60\r\nContent-Length: 3000\r\n\r\n" + b"<p>hello</p>" * 250)
GET = b"GET /x HTTP/1.1\r\nHost: clone.test\r\nUser-Agent: t\r\nReferer: r\r\n"

#: name -> the request after the miss that filled the cache
REQUESTS = {
    "plain": GET + b"\r\n",
    "HEAD": GET.replace(b"GET", b"HEAD", 1) + b"\r\n",
    "If-None-Match": GET + b"If-None-Match: \"v1\"\r\n\r\n",
    "If-None-Match, other": GET + b"If-None-Match: \"v2\"\r\n\r\n",
    "If-Modified-Since": GET + b"If-Modified-Since: Tue, 01 Dec 2026 10:00:00 GMT\r\n\r\n",
    "range": GET + b"Range: bytes=0-9\r\n\r\n",
    "range past the end": GET + b"Range: bytes=99999-\r\n\r\n",
    "Connection: close": GET + b"Connection: close\r\n\r\n",
    "HTTP/1.0": b"GET /x HTTP/1.0\r\nHost: clone.test\r\n\r\n",
    "absolute-form": b"GET http://clone.test/x HTTP/1.1\r\nHost: other.test\r\n\r\n",
    "pipelined": GET + b"\r\n" + GET + b"Range: bytes=1-2\r\n\r\n",
    "gzip taken": GET + b"Accept-Encoding: gzip\r\n\r\n",
    "repeated fields": GET + b"Accept: a\r\nX-A: 1\r\naccept: b\r\n\r\n",
}


def answered_by_hits(h: Harness) -> list[bool]:
    """Record whether the hit path answered each request."""
    hits = h.site.hits
    assert hits is not None
    seen: list[bool] = []
    answer = hits.answer

    def spy(channel: Any, event: Any, headers: Any) -> Any:
        result = answer(channel, event, headers)
        seen.append(result is True)
        return result

    hits.answer = spy  # type: ignore[method-assign]
    return seen


def cached_page() -> Harness:
    """A harness whose cache holds ``PAGE`` (fetched once, from its origin)."""
    h = test_compress.harness(Compression(), cache=CachePolicy())
    h.send(GET + b"\r\n")
    h.conns[-1].reply(PAGE)
    h.settle()
    return h


def logged(h: Harness) -> list[str]:
    lines: list[str] = []
    h.site.log = lambda request: lines.append(combined_line(request, "[T]"))  # type: ignore[method-assign]
    return lines


@expand
class SameAnswerTests(SynchronousTestCase):

    def both(self, make: Any, raw: bytes, page: bytes = PAGE) -> list[bool]:
        """Fill each proxy's cache, send ``raw`` to both; compare."""
        outs, logs, metrics, seen = [], [], [], []
        for fast in (True, False):
            h = make()
            if not fast:
                h.site.hits = None
            lines = logged(h)
            _, client = h.send(GET + b"\r\n")
            h.conns[-1].reply(page)
            h.settle()
            self.assertIn(b"200 OK", client.value())
            spied = answered_by_hits(h) if fast else []
            h.conns[-1].sent()
            answers = []
            # The same request again, with time passing: a hit path answer
            # made once (``HitPath.ready``) is used for the second and third.
            for wait in (0.0, 1.5, 7.25):
                h.clock.advance(wait)
                _, client = h.send(raw)
                h.settle()
                answers.append(client.value())
            self.assertEqual([c.sent() for c in h.conns], [b""] * len(h.conns))  # nothing went upstream
            outs.append(answers)
            logs.append(lines[1:])
            metrics.append({k: v for k, v in h.metrics.counters.items() if "cache" in k[0] or "requests" in k[0]})
            seen = seen or spied
        self.assertEqual(outs[0], outs[1])
        self.assertEqual(logs[0], logs[1])
        self.assertEqual(metrics[0], metrics[1])
        return seen

    @parametrize("name", list(REQUESTS))
    def test_cached_site(self, name: str) -> None:
        seen = self.both(lambda: test_rfc_cache.harness(CachePolicy()), REQUESTS[name])
        self.assertTrue(seen and all(seen), seen)

    @parametrize("name", ["plain", "If-None-Match", "HEAD"])
    def test_header_edits(self, name: str) -> None:
        seen = self.both(lambda: test_header_rules.harness(test_header_rules.EDITS, cache=True), REQUESTS[name])
        self.assertTrue(seen and all(seen), seen)

    @parametrize("name", ["gzip taken", "plain", "range"])
    def test_compressed_variants(self, name: str) -> None:
        seen = self.both(lambda: test_compress.harness(Compression(), cache=CachePolicy()), REQUESTS[name])
        self.assertTrue(seen and all(seen), seen)

    def test_not_a_hit_goes_the_general_way(self) -> None:
        """A request that is not a fresh hit (another URL: a miss) is left
        to the general path, which uses the hit path's lookup: the store
        is read once."""
        h = test_rfc_cache.harness(CachePolicy())
        seen = answered_by_hits(h)
        cache = h.resource.cache
        assert cache is not None
        lookup = cache.store.lookup
        calls: list[bytes] = []

        def counting(*args: Any, **kw: Any) -> Any:
            calls.append(args[2])
            return lookup(*args, **kw)

        cache.store.lookup = counting  # type: ignore[method-assign]
        h.send(b"GET /other HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertEqual(seen, [False])
        self.assertEqual(len(h.conns), 1)
        self.assertEqual(len(calls), 1)


class RememberedAnswerTests(SynchronousTestCase):
    """An answer the hit path made once is used only for the very object
    the store gives now."""

    def test_a_new_object_under_the_key_is_answered(self) -> None:
        h = test_rfc_cache.harness(CachePolicy())
        h.send(GET + b"\r\n")
        h.conns[-1].reply(PAGE)
        for _ in range(2):
            _, client = h.send(GET + b"\r\n")
            self.assertTrue(client.value().endswith(b"<p>hello</p>"))
        hits = h.site.hits
        cache = h.resource.cache
        assert hits is not None and cache is not None
        self.assertEqual(len(hits.ready), 1)
        found = cache.store.lookup("s", b"GET", b"clone.test/x", h.runtime.select(b"clone.test").rules_version, [])
        assert found.obj is not None
        # Another worker stores the URL anew: same head, same time, other bytes.
        cache.store.put(found.key, found.obj, b"<p>new</p>")
        _, client = h.send(GET + b"\r\n")
        self.assertTrue(client.value().endswith(b"Content-Length: 10\r\nAge: 0\r\nVia: 1.1 prexy\r\n"
                                                b"Cache-Status: prexy; hit; ttl=60\r\n\r\n<p>new</p>"), client.value())
        cache.store.purge_url("s", b"clone.test/x")
        h.conns[-1].sent()
        _, client = h.send(GET + b"\r\n")
        self.assertTrue(h.conns[-1].sent().startswith(b"GET /x HTTP/1.1\r\n"))  # a miss: fetched again
        h.conns[-1].reply(PAGE.replace(b"hello", b"again"))
        self.assertIn(b"Cache-Status: prexy; fwd=uri-miss", client.value())
        self.assertTrue(client.value().endswith(b"<p>again</p>"))


@expand
class PipelinedTests(SynchronousTestCase):
    """Hundreds of requests in one read, each answered at once (hits), one
    after another, whichever path answers them: in order, none lost, and
    no nesting that grows with their number."""

    @parametrize("fast", [True, False])
    def test_many_pipelined_hits_in_one_read(self, fast: bool) -> None:
        h = test_rfc_cache.harness(CachePolicy())
        if not fast:
            h.site.hits = None
        _, client = h.send(GET + b"\r\n")
        h.conns[-1].reply(PAGE)
        channel, client = h.client()
        channel.dataReceived((GET + b"\r\n") * 1500)
        h.settle()
        self.assertEqual(client.value().count(b"HTTP/1.1 200 OK\r\n"), 1500)
        self.assertFalse(client.disconnecting)


class FailureTests(SynchronousTestCase):
    def test_a_failure_before_the_answer_leaves_it_to_the_general_path(self) -> None:
        """A defect in the hit path costs the request nothing: it is logged
        and the general path answers."""
        h = test_rfc_cache.harness(CachePolicy())
        _, client = h.send(GET + b"\r\n")
        h.conns[-1].reply(PAGE)
        cache = h.resource.cache

        def broken(*args: Any, **kw: Any) -> Any:
            raise RuntimeError("broken")

        hits = h.site.hits
        assert hits is not None
        hits._answer = broken  # type: ignore[method-assign]
        _, client = h.send(GET + b"\r\n")
        self.assertIn(b"200 OK", client.value())
        self.assertIn(b"Cache-Status: prexy; hit", client.value())
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertIsNotNone(cache)


@expand
class ConnectionCloseTests(SynchronousTestCase):
    @parametrize("fast", [True, False])
    def test_a_request_that_asks_to_close_is_told_so(self, fast: bool) -> None:
        """Whichever path answers, an HTTP/1.1 request with
        ``Connection: close`` gets ``connection: close`` first in its
        answer, and the connection closes after it."""
        h = test_rfc_cache.harness(CachePolicy())
        if not fast:
            h.site.hits = None
        h.send(GET + b"\r\n")
        h.conns[-1].reply(PAGE)
        _, client = h.send(REQUESTS["Connection: close"])
        self.assertTrue(client.value().startswith(b"HTTP/1.1 200 OK\r\nconnection: close\r\n"), client.value()[:80])
        self.assertTrue(client.disconnecting)


class GracefulStopTests(SynchronousTestCase):
    def test_a_connection_answered_by_a_hit_counts_as_served(self) -> None:
        """A graceful stop closes at once an idle connection whose only
        answer was a hit, as it does one the general path answered (a
        connection that has answered nothing gets a grace for its first
        request)."""
        h = test_rfc_cache.harness(CachePolicy())
        h.send(GET + b"\r\n")
        h.conns[-1].reply(PAGE)
        seen = answered_by_hits(h)
        _, client = h.send(GET + b"\r\n")
        _, fresh = h.client()
        self.assertEqual(seen, [True])
        h.site.close_idle_connections(fresh_grace=2.0)
        self.assertEqual((client.disconnecting, fresh.disconnecting), (True, False))


@expand
class ReloadTests(SynchronousTestCase):
    @parametrize("fast", [True, False])
    def test_a_reload_is_obeyed_by_made_answers(self, fast: bool) -> None:
        """An answer made once is not used after a reload replaced its
        site: a site that stops compressing answers identity at once,
        as the general path does."""
        h = test_compress.harness(Compression(), cache=CachePolicy())
        if not fast:
            h.site.hits = None
        gzip = GET + b"Accept-Encoding: gzip\r\n\r\n"
        h.send(GET + b"\r\n")
        h.conns[-1].reply(PAGE)
        h.settle()
        for _ in range(3):
            _, client = h.send(gzip)
            h.settle()
            self.assertIn(b"Content-Encoding: gzip", client.value())
        config = h.config
        off = attrs.evolve(config, sites=(attrs.evolve(config.sites[0], compression=Compression(enabled=False)),))
        h.resource.runtime = site_runtime(off, s={"rules": h.runtime.select(b"clone.test").rules})
        _, client = h.send(gzip)
        h.settle()
        self.assertIn(b"200 OK", client.value())
        self.assertNotIn(b"Content-Encoding: gzip", client.value())


@expand
class RememberedAnswerMemoryTests(SynchronousTestCase):
    """``HitPath.ready`` is charged for the head and body it keeps: it
    must not keep more than that alive.  An answer that pinned its whole
    object (a range or a HEAD is charged a few bytes for a body of
    megabytes) or its site (a reload's old rules) would let the worker's
    memory grow far past the memo's budget."""

    @parametrize("name", ["range", "HEAD", "gzip taken", "plain"])
    def test_a_made_answer_does_not_keep_its_object(self, name: str) -> None:
        h = cached_page()
        seen = answered_by_hits(h)
        for _ in range(2):
            h.send(REQUESTS[name])
            h.settle()
        self.assertEqual(seen, [True, True])
        hits, cache = h.site.hits, h.resource.cache
        assert hits is not None and cache is not None
        self.assertEqual(len(hits.ready), 1)
        found = cache.store.lookup("s", b"GET", b"clone.test/x", h.runtime.select(b"clone.test").rules_version, [])
        assert found.obj is not None
        obj = weakref.ref(found.obj)
        del found
        # The store's own memo lets it go (it is full of other pages):
        # nothing else keeps it.
        cache.store._decoded.clear()
        gc.collect()
        self.assertIsNone(obj())
        # The answer made from it is not used for the object decoded anew.
        _, client = h.send(REQUESTS[name])
        h.settle()
        self.assertEqual(seen, [True, True, True])
        self.assertIn(b"HTTP/1.1 2", client.value())

    def test_a_made_answer_does_not_keep_a_replaced_site(self) -> None:
        h = cached_page()
        h.send(REQUESTS["range"])
        h.settle()
        hits = h.site.hits
        assert hits is not None
        self.assertEqual(len(hits.ready), 1)
        old = weakref.ref(h.resource.runtime.select(b"clone.test"))
        config = h.config
        h.resource.runtime = h.runtime = site_runtime(
            attrs.evolve(config, sites=(attrs.evolve(config.sites[0], compression=Compression(enabled=False)),)),
            s={"rules": h.runtime.select(b"clone.test").rules})
        # A request of another shape after the reload: the new site answers it
        # (the resource's host memo moves on to it); the range's answer, made
        # for the old site, stays in the memo until it is pushed out.
        _, client = h.send(REQUESTS["plain"])
        h.settle()
        self.assertIn(b"200 OK", client.value())
        self.assertEqual(len(hits.ready), 2)
        gc.collect()
        self.assertIsNone(old())

    def test_a_whole_answer_keeps_no_second_body(self) -> None:
        """An answer of the whole object (the plain GET, the most common
        hit) takes its body from the object it is used for: the memo is
        charged for its head, not for a second copy of the body, and the
        bytes sent are the object's."""
        h = cached_page()
        hits = h.site.hits
        assert hits is not None
        seen = answered_by_hits(h)
        clients = []
        for _ in range(2):
            _, client = h.send(REQUESTS["plain"])
            h.settle()
            clients.append(client.value())
        self.assertEqual(seen, [True, True])
        self.assertEqual(clients[0].split(b"\r\n\r\n", 1)[1], b"<p>hello</p>" * 250)
        self.assertEqual(clients[0], clients[1])
        self.assertEqual(len(hits.ready), 1)
        self.assertLess(hits.ready.used, 3000)  # the body is 3,000 bytes

    def test_a_refreshed_page_keeps_one_compressed_variant(self) -> None:
        """A page revalidated (a 304: a new ``stored_at``) then served
        compressed again replaces its older variant in the memo: a page
        refreshed every few minutes keeps one entry per coding, not one
        per refresh."""
        h = cached_page()
        cache = h.resource.cache
        assert cache is not None
        for _ in range(3):
            _, client = h.send(REQUESTS["gzip taken"])
            h.settle()
            self.assertIn(b"Content-Encoding: gzip", client.value())
            self.assertEqual(len(cache.variants), 1)
            h.clock.advance(61)  # stale: the next request revalidates
            h.send(GET + b"\r\n")
            h.settle()
            self.assertIn(b"If-None-Match", h.conns[-1].sent())
            h.conns[-1].reply(b"HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n\r\n")
            h.settle()
        self.assertEqual(len(cache.variants), 1)

    def test_a_range_keeps_its_span_not_its_bytes(self) -> None:
        """A range of an object in identity is answered from the object's
        body by its span: the memo is charged the head, so ranges asked
        once each (a player seeking) do not fill it with bytes; the bytes
        sent are the general path's (``SameAnswerTests``)."""
        h = cached_page()
        hits = h.site.hits
        assert hits is not None
        seen = answered_by_hits(h)
        ranges = [b"bytes=%d-%d" % (start, start + 1999) for start in range(0, 1000, 100)]
        for spec in ranges:
            _, client = h.send(GET + b"Range: " + spec + b"\r\n\r\n")
            h.settle()
            self.assertIn(b"206 Partial Content", client.value())
            start = int(spec[6:].split(b"-")[0])
            self.assertTrue(client.value().endswith((b"<p>hello</p>" * 250)[start : start + 2000]))
        self.assertEqual(seen, [True] * len(ranges))
        self.assertEqual(len(hits.ready), len(ranges))
        self.assertLess(hits.ready.used, 2000 * len(ranges))  # each range is 2,000 bytes
