"""Waiting for another worker's fetch: woken by its notice, bounded
without one, and never a fixed-interval poll."""

from __future__ import annotations

from typing import Any

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web import server
from twisted.web.http_headers import Headers

from prexy.cache import ObjectMeta
from prexy.metrics import Metrics
from prexy.proxy import caching
from prexy.proxy.caching import CacheLayer
from prexy.proxy.events import MAX_FALLBACK
from prexy.proxy.flight import CacheContext
from prexy.proxy.routes import Answered, Forward
from tests.cases import unlinked_store

KEY = b"key-of-/page"


class FakeEvents:
    def __init__(self) -> None:
        self.waiting: dict[bytes, list[Any]] = {}
        self.announced: list[bytes] = []

    def wait(self, key: bytes, callback: Any) -> Any:
        self.waiting.setdefault(key, []).append(callback)

        def forget() -> None:
            if callback in self.waiting.get(key, []):
                self.waiting[key].remove(callback)

        return forget

    def announce(self, key: bytes) -> None:
        self.announced.append(key)

    def notice(self, key: bytes) -> None:
        for callback in list(self.waiting.pop(key, [])):
            callback()


class Waiter:
    """The parked client request."""

    method = b"GET"
    gone = False
    finished = False

    def __init__(self) -> None:
        self.code = 0
        self.responseHeaders = Headers()
        self.requestHeaders = Headers({b"host": [b"h"]})
        self.body = b""

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code

    def write(self, data: bytes) -> None:
        self.body += data

    def write_whole(self, body: bytes) -> None:
        self.body += body

    def finish(self) -> None:
        self.finished = True


class WaitTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.clock.advance(1_000)
        self.store = unlinked_store("prexy-wait-", 8 << 20, self.clock.seconds)
        self.events = FakeEvents()
        self.layer = CacheLayer(self.clock, self.store, Metrics(), self.events)
        self.request = Waiter()
        self.assertTrue(self.store.claim(KEY, b"other-worker", caching.CLAIM_LEASE))
        self.ctx = CacheContext("uri-miss")
        #: The routes the wait ended with (prexy.proxy.routes).
        self.routes: list[Any] = []
        self.layer._wait_for_other_worker(
            self.request, None, self.ctx, KEY, self.clock.seconds()  # type: ignore[arg-type]
        ).addCallback(self.routes.append)

    def store_object(self) -> None:
        meta = ObjectMeta(200, [(b"Content-Type", b"text/plain")], self.clock.seconds(), 60.0, site="s", url=b"/page")
        writer = self.store.writer(KEY, meta)
        writer.write(b"stored by the other worker")
        writer.commit()
        self.store.release(KEY, b"other-worker")

    def test_notice_serves_at_once(self) -> None:
        """The other worker's notice makes the waiter look in the store and
        answer from it, long before the fallback look; no timer is left."""
        self.store_object()
        self.events.notice(KEY)
        self.assertEqual((self.request.code, self.request.body), (200, b"stored by the other worker"))
        self.assertTrue(self.request.finished)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.events.waiting.get(KEY, []), [])
        self.assertEqual(self.routes, [Answered(server.NOT_DONE_YET)])

    def test_without_notice_looks_are_few_and_bounded(self) -> None:
        """With no notice, the waiter looks after FIRST_FALLBACK, then at
        doubling intervals up to MAX_FALLBACK; when the other worker gives up
        without storing, the waiter fetches itself."""
        delays = []
        for _ in range(8):
            [call] = self.clock.getDelayedCalls()
            delays.append(round(call.getTime() - self.clock.seconds(), 3))
            self.clock.advance(call.getTime() - self.clock.seconds())
        self.assertEqual(delays, [0.05, 0.1, 0.2, 0.4, 0.8, MAX_FALLBACK, MAX_FALLBACK, MAX_FALLBACK])
        self.assertEqual(self.routes, [])
        self.store.release(KEY, b"other-worker")
        self.events.notice(KEY)
        self.assertEqual(self.routes, [Forward(self.ctx)])
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_gone_client_stops_waiting(self) -> None:
        self.request.gone = True
        self.store_object()
        self.events.notice(KEY)
        self.assertEqual(self.request.code, 0)
        self.assertEqual(self.clock.getDelayedCalls(), [])
        self.assertEqual(self.routes, [None])

    def test_leader_announces_when_done(self) -> None:
        ctx = CacheContext("uri-miss")
        ctx.claim_key = b"mine"
        self.assertTrue(self.store.claim(b"mine", self.layer.holder, 30.0))
        self.layer.finished(ctx)
        self.assertEqual(self.events.announced, [b"mine"])
        self.assertFalse(self.store.claimed(b"mine"))


class SlowFollowerTests(SynchronousTestCase):
    """Through the proxy: requests that follow one fetch each read at their
    own pace."""

    def test_slow_follower_holds_up_neither_the_fetch_nor_the_others(self) -> None:
        from prexy.cache import CachePolicy
        from prexy.config import Config, SiteConfig, UpstreamURL

        from .support import Harness, parse_response

        config = Config(
            listen=("tcp:0",),
            sites=(SiteConfig("s", UpstreamURL.parse("http://origin.test"), cache=CachePolicy()),),
            default_site="s",
        )
        h = Harness(config)
        store = unlinked_store("prexy-follow-", 64 << 20, h.clock.seconds)
        h.resource.cache = CacheLayer(h.clock, store, h.metrics)
        get = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n"
        _, leader = h.send(get)
        _, slow = h.send(get)
        _, fast = h.send(get)
        self.assertEqual(len(h.conns), 1)  # one fetch for all three
        body = bytes(range(256)) * 400
        conn = h.conns[0]
        conn.reply(b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: %d\r\n\r\n" % len(body))
        slow.producer.pauseProducing()  # its socket is full
        for i in range(0, len(body), 10_000):
            conn.reply(body[i : i + 10_000])
            self.assertFalse(conn.paused)
        self.assertEqual(parse_response(leader.value())[2], body)
        self.assertEqual(parse_response(fast.value())[2], body)
        got_before = len(slow.value())
        self.assertLess(got_before, 20_000)
        slow.producer.resumeProducing()
        status, headers, out = parse_response(slow.value())
        self.assertEqual((status, out), (200, body))
        self.assertIn(b"collapsed", dict(headers)[b"Cache-Status"])
        _, later = h.send(get)  # stored: a hit
        self.assertEqual(parse_response(later.value())[2], body)
        self.assertEqual(len(h.conns), 1)
