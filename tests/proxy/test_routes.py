"""The cache layer's routes (``prexy.proxy.routes``): for each way a
request can go, ``CacheLayer.on_request`` returns the route to carry out,
with no resource object anywhere; and a flight whose answer may not be
shared hands its followers back, each with its own fetch, which the
resource then forwards."""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web import server
from twisted.web.http_headers import Headers

from prexy.cache import CachePolicy, ObjectMeta, cache_key, key_url, vary_key
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.fetch import Fetch
from prexy.metrics import Metrics
from prexy.proxy import caching
from prexy.proxy.caching import CacheLayer
from prexy.proxy.flight import CacheContext
from prexy.proxy.routes import Answered, Forward, Parked, Refresh
from prexy.runtime import SiteRuntime, build_runtime
from tests.cases import unlinked_store

from .support import Harness, parse_response
from .test_cache_wait import FakeEvents

HOST = b"www.example"


class Client:
    """A client request as the cache layer sees it."""

    gone = False
    finished = False
    startedWriting = False

    content = None
    uri = b"/page"
    proxy_site = None
    has_body = False
    looked = None
    detached = False
    trailers = False
    interim = False
    tunnel = False
    clientproto = b"HTTP/1.1"

    def __init__(self, method: bytes = b"GET", headers: dict[bytes, list[bytes]] | None = None) -> None:
        self.method = method
        self.code = 0
        self.requestHeaders = Headers({b"host": [HOST], **(headers or {})})
        self.responseHeaders = Headers()
        self.body = b""
        self.exchange: Any = None

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.responseHeaders.setRawHeaders(name, [value])

    def reset_head(self) -> None:
        self.responseHeaders = Headers()

    def getClientAddress(self) -> Any:
        return None

    def getHost(self) -> Any:
        return None

    def isSecure(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.startedWriting = True
        self.body += data

    def write_whole(self, body: bytes) -> None:
        self.write(body)

    def finish(self) -> None:
        self.finished = True


class RouteTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = MemoryReactorClock()
        self.clock.advance(1_000_000)
        config = Config(
            listen=("tcp:0",),
            sites=(SiteConfig("s", UpstreamURL.parse("http://origin.test/base"), cache=CachePolicy(grace=30.0)),),
            default_site="s",
        )
        self.site: SiteRuntime = build_runtime(config).default
        self.store = unlinked_store("prexy-routes-", 8 << 20, self.clock.seconds)
        self.events = FakeEvents()
        self.layer = CacheLayer(self.clock, self.store, Metrics(), self.events)

    def fetch(self, client: Client, target: bytes = b"/page", ip: bytes = b"10.0.0.1") -> Fetch:
        raw = {n.lower(): list(vs) for n, vs in client.requestHeaders.getAllRawHeaders()}
        return Fetch(self.site, client.method, target, target, HOST, raw, client_ip=ip)

    def key(self, target: bytes = b"/page") -> bytes:
        policy = self.site.cache_policy
        assert policy is not None
        url = key_url(policy, HOST, target)
        return cache_key(self.site.name, b"GET", url, vary_key((), [], policy), self.site.rules_version)

    def put(self, body: bytes, age: float, ttl: float = 60.0, target: bytes = b"/page") -> None:
        policy = self.site.cache_policy
        assert policy is not None
        meta = ObjectMeta(
            200, [(b"Content-Type", b"text/plain")], self.clock.seconds() - age, ttl, grace=30.0,
            site=self.site.name, url=key_url(policy, HOST, target),
        )
        self.assertTrue(self.store.put(self.key(target), meta, body))

    def route(self, client: Client, target: bytes = b"/page") -> Any:
        return self.layer.on_request(client, self.fetch(client, target))

    def test_miss_forwards_with_a_flight(self) -> None:
        """A miss claims the key and is forwarded with a flight others can
        follow; the fetch is the request's own."""
        client = Client()
        route = self.route(client)
        self.assertIsInstance(route, Forward)
        ctx = route.ctx
        self.assertEqual((ctx.fwd, ctx.claim_key), ("uri-miss", self.key()))
        self.assertIs(self.layer.inflight[self.key()], ctx.flight)
        self.assertTrue(self.store.claimed(self.key()))
        self.assertEqual(client.code, 0)

    def test_follow(self) -> None:
        """A request for a key being fetched here follows the flight: it is
        answered (as the body streams), not forwarded."""
        first = self.route(Client())
        follower = Client()
        route = self.route(follower)
        self.assertEqual(route, Answered(server.NOT_DONE_YET))
        self.assertEqual(first.ctx.flight.following(), 1)
        self.assertIsNotNone(follower.exchange)

    def test_hit(self) -> None:
        """A fresh object answers at once."""
        self.put(b"stored", age=1.0)
        client = Client()
        route = self.route(client)
        self.assertIsInstance(route, Answered)
        self.assertEqual((client.code, client.body, client.finished), (200, b"stored", True))
        self.assertEqual(self.layer.inflight, {})

    def test_grace_refresh(self) -> None:
        """A stale object in grace answers now, and one background GET (even
        for a HEAD) refreshes it holding the key's claim; a second request
        meanwhile gets the stale copy without another refresh."""
        self.put(b"old", age=70.0)
        client = Client(b"HEAD")
        route = self.route(client)
        self.assertIsInstance(route, Refresh)
        self.assertEqual(route.result, server.NOT_DONE_YET)
        self.assertEqual((client.code, client.finished), (200, True))
        self.assertEqual(route.fetch.method, b"GET")
        self.assertEqual(route.fetch.client_target, b"/page")
        self.assertEqual(route.ctx.claim_key, self.key())
        self.assertEqual(route.ctx.stale.body, b"old")
        self.assertIn(self.key(), self.layer.refreshing)
        again = Client()
        self.assertIsInstance(self.route(again), Answered)
        self.assertEqual(again.body, b"old")

    def test_grace_refreshed_by_another_worker(self) -> None:
        """When another worker holds the key, the stale copy answers and
        nothing is refreshed here."""
        self.put(b"old", age=70.0)
        self.assertTrue(self.store.claim(self.key(), b"other-worker", caching.CLAIM_LEASE))
        client = Client()
        self.assertIsInstance(self.route(client), Answered)
        self.assertEqual(client.body, b"old")
        self.assertEqual(self.layer.refreshing, set())

    def test_park_then_answered(self) -> None:
        """Another worker is fetching the object: the request is parked, and
        answered from the store once that worker says it is done."""
        self.assertTrue(self.store.claim(self.key(), b"other-worker", caching.CLAIM_LEASE))
        client = Client()
        route = self.route(client)
        self.assertIsInstance(route, Parked)
        later: list[Any] = []
        route.next.addCallback(later.append)
        self.assertEqual(later, [])
        self.put(b"fetched there", age=0.0)
        self.store.release(self.key(), b"other-worker")
        self.events.notice(self.key())
        self.assertEqual(later, [Answered(server.NOT_DONE_YET)])
        self.assertEqual(client.body, b"fetched there")

    def test_park_then_forward(self) -> None:
        """The other worker stored nothing: the parked request's next route
        forwards it, with its cache context."""
        self.assertTrue(self.store.claim(self.key(), b"other-worker", caching.CLAIM_LEASE))
        route = self.route(Client())
        later: list[Any] = []
        route.next.addCallback(later.append)
        self.store.release(self.key(), b"other-worker")
        self.events.notice(self.key())
        [forward] = later
        self.assertIsInstance(forward, Forward)
        self.assertEqual(forward.ctx.fwd, "uri-miss")

    def test_park_client_gone(self) -> None:
        """The parked client left: the next route is None (nothing to do)."""
        self.assertTrue(self.store.claim(self.key(), b"other-worker", caching.CLAIM_LEASE))
        client = Client()
        route = self.route(client)
        client.gone = True
        self.events.notice(self.key())
        self.assertIsNone(self.successResultOf(route.next))

    def test_bypass(self) -> None:
        """A request the policy passes (a private one) is forwarded with a
        bypass context and no flight."""
        route = self.route(Client(headers={b"authorization": [b"Basic x"]}))
        self.assertIsInstance(route, Forward)
        self.assertEqual((route.ctx.fwd, route.ctx.flight), ("bypass", None))
        self.assertEqual(self.layer.inflight, {})

    def test_unsafe_method_invalidates(self) -> None:
        """An unsafe method is forwarded with the URL to invalidate."""
        route = self.route(Client(b"DELETE"))
        self.assertIsInstance(route, Forward)
        self.assertEqual(route.ctx.invalidate, HOST + b"/page")

    def test_request_with_a_body(self) -> None:
        """A request with a body is never looked up: forwarded, with the URL
        to invalidate for an unsafe method, without a context otherwise."""
        post = Client(b"POST")
        self.assertEqual(self.layer.invalidating(self.fetch(post)).ctx.invalidate, HOST + b"/page")  # type: ignore[union-attr]
        self.assertEqual(self.layer.invalidating(self.fetch(Client(b"GET"))), Forward(None))

    def test_purge(self) -> None:
        """PURGE is answered by the cache (here refused: not from an allowed
        address)."""
        client = Client(b"PURGE")
        route = self.route(client)
        self.assertEqual(route, Answered(server.NOT_DONE_YET))
        self.assertEqual(client.code, 405)

    def test_not_storable_hands_back_followers_with_their_fetch(self) -> None:
        """When the answer may not be shared, the flight ends and hands back
        each follower still there with the fetch it asked with; one that
        left is not handed back."""
        leader = self.route(Client())
        flight = leader.ctx.flight
        b, c, gone = Client(), Client(), Client()
        fetches = {}
        for client, ip in ((b, b"10.0.0.2"), (c, b"10.0.0.3"), (gone, b"10.0.0.4")):
            fetches[id(client)] = self.fetch(client, ip=ip)
            self.assertEqual(self.layer.on_request(client, fetches[id(client)]), Answered(server.NOT_DONE_YET))
        gone.gone = True
        handed = flight.not_storable()
        self.assertEqual(handed, [(b, fetches[id(b)]), (c, fetches[id(c)])])
        self.assertEqual([f.client_ip for _, f in handed], [b"10.0.0.2", b"10.0.0.3"])
        self.assertNotIn(self.key(), self.layer.inflight)

    def test_fetch_upstream_target(self) -> None:
        """The upstream target is the upstream URL's path, then the
        request's (mapped) target; the client's target is kept for keys."""
        fetch = Fetch(self.site, b"GET", b"/mapped", b"/asked", HOST, {})
        self.assertEqual((fetch.upstream_target, fetch.client_target), (b"/base/mapped", b"/asked"))
        self.assertIs(fetch.as_get(), fetch)
        self.assertEqual(Fetch(self.site, b"HEAD", b"/", b"/", None, {}).as_get().method, b"GET")


class NotStorableThroughTheProxyTests(SynchronousTestCase):
    """Through the proxy: followers of a fetch whose answer may not be
    shared each fetch for themselves, with their own request's fields."""

    def test_followers_forwarded_with_their_own_fetch(self) -> None:
        config = Config(
            listen=("tcp:0",),
            sites=(SiteConfig("s", UpstreamURL.parse("http://origin.test"), cache=CachePolicy()),),
            default_site="s",
        )
        h = Harness(config)
        store = unlinked_store("prexy-routes-", 8 << 20, h.clock.seconds)
        h.resource.cache = CacheLayer(h.clock, store, h.metrics)
        _, leader = h.send(b"GET /p HTTP/1.1\r\nHost: x\r\nX-Who: a\r\n\r\n")
        _, b = h.send(b"GET /p HTTP/1.1\r\nHost: x\r\nX-Who: b\r\n\r\n")
        _, c = h.send(b"GET /p HTTP/1.1\r\nHost: x\r\nX-Who: c\r\n\r\n")
        self.assertEqual(len(h.conns), 1)  # b and c follow a's fetch
        h.conns[0].reply(b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 2\r\n\r\nA!")
        self.assertEqual(parse_response(leader.value())[2], b"A!")
        self.assertEqual(len(h.conns), 3)  # not to be shared: b and c fetch for themselves
        sent = [conn.sent() for conn in h.conns[1:]]
        self.assertIn(b"x-who: b\r\n", sent[0])
        self.assertIn(b"x-who: c\r\n", sent[1])
        for i, (conn, client) in enumerate(((h.conns[1], b), (h.conns[2], c))):
            body = b"%d" % i
            conn.reply(b"HTTP/1.1 200 OK\r\nCache-Control: no-store\r\nContent-Length: 1\r\n\r\n" + body)
            status, headers, got = parse_response(client.value())
            self.assertEqual((status, got), (200, body))
            self.assertIn(b"not-storable", dict(headers)[b"Cache-Status"])


class CarryOutTests(SynchronousTestCase):
    """``ProxyResource.carry_out``: the one place routes are carried out."""

    def setUp(self) -> None:
        config = Config(
            listen=("tcp:0",),
            sites=(SiteConfig("s", UpstreamURL.parse("http://origin.test/base"), cache=CachePolicy()),),
            default_site="s",
        )
        self.h = Harness(config)
        self.site = self.h.runtime.default
        self.fetch = Fetch(self.site, b"GET", b"/mapped", b"/page", HOST, {b"x-who": [b"me"]}, client_ip=b"10.9.9.9")

    def test_forward(self) -> None:
        """Forward sends the fetch upstream: its method, upstream target and
        fields, whatever the request object holds."""
        client = Client(b"HEAD")
        self.assertEqual(self.h.resource.carry_out(client, self.fetch, Forward(None)), server.NOT_DONE_YET)
        [conn] = self.h.conns
        sent = conn.sent()
        self.assertTrue(sent.startswith(b"GET /base/mapped HTTP/1.1\r\n"), sent)
        self.assertIn(b"x-who: me\r\n", sent)
        self.assertIn(b"X-Forwarded-For: 10.9.9.9\r\n", sent)
        self.assertIsNotNone(client.exchange)

    def test_refresh(self) -> None:
        """Refresh returns the answer already made and fetches in the
        background, for a stand-in of the client."""
        client = Client()
        ctx = CacheContext("stale")
        route = Refresh(b"answered", ctx, self.fetch)
        self.assertEqual(self.h.resource.carry_out(client, self.fetch, route), b"answered")
        self.assertEqual(len(self.h.conns), 1)
        self.assertIsNone(client.exchange)  # the fetch is not the client's

    def test_parked(self) -> None:
        """Parked: nothing until the Deferred fires, then its route."""
        client = Client()
        later: Deferred[Any] = Deferred()
        self.assertEqual(self.h.resource.carry_out(client, self.fetch, Parked(later)), server.NOT_DONE_YET)
        self.assertEqual(self.h.conns, [])
        later.callback(Forward(None))
        self.assertEqual(len(self.h.conns), 1)

    def test_parked_client_gone(self) -> None:
        """Parked, and the client left: nothing is fetched."""
        later: Deferred[Any] = Deferred()
        self.h.resource.carry_out(Client(), self.fetch, Parked(later))
        later.callback(None)
        self.assertEqual(self.h.conns, [])

    def test_parked_failure_answers_500(self) -> None:
        """A failure while carrying out a parked request's route is logged
        and answered 500 (the request does not hang)."""
        client = Client()
        later: Deferred[Any] = Deferred()
        self.h.resource.carry_out(client, self.fetch, Parked(later))
        later.errback(RuntimeError("boom"))
        self.assertEqual((client.code, client.finished), (500, True))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
