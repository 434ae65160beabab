"""The cache through the proxy service on loopback, against a real origin:
what is stored and served, what passes, coalescing, grace, stale-if-error,
revalidation, PURGE, and that rewritten bytes are what is cached; admin
bans through ``twistd prexy --workers 2``."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.protocol import DatagramProtocol
from zope.interface import directlyProvides, providedBy

from prexy.cache.policy import CachePolicy
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.runtime import build_runtime
from prexy.service import ProxyService

from .conftest import Cleanups
from .origin import Origin, origin_site
from .test_service import RawClient, connect
from .twistd_support import Twistd, body_of, free_port_block, scratch_dir


class SkewedReactor:
    """The real reactor, whose clock (``seconds()``) the test moves forward:
    what the proxy reads as now (an object's age, its TTL, grace) jumps by
    :meth:`skip` at once, while sockets and timers run on the real reactor.
    A TTL passes without the test waiting for it."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.offset = 0.0
        directlyProvides(self, providedBy(real))

    def seconds(self) -> float:
        return float(self._real.seconds()) + self.offset

    def skip(self, seconds: float) -> None:
        self.offset += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class FetchNotices(DatagramProtocol):
    """A listener among the workers' notice sockets beside the store
    (``prexy.proxy.events``): the proxy sends each one the key of a cache
    fetch when that fetch is over, its object stored (or not)."""

    def __init__(self) -> None:
        self._waiting: list[defer.Deferred[bytes]] = []

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(datagram)

    def next(self) -> defer.Deferred[bytes]:
        """Fires with the key of the next fetch to end, from now on."""
        d: defer.Deferred[bytes] = defer.Deferred()
        self._waiting.append(d)
        return d.addTimeout(10, reactor)


def header(raw: bytes, name: bytes) -> bytes | None:
    head = raw.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        n, _, v = line.partition(b": ")
        if n.lower() == name.lower():
            return v
    return None


class TestCache:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        # Runs last: the origin has seen the proxy's pooled connections close.
        cleanup(lambda: self.origin.when(lambda: self.origin.open_connections == 0).addTimeout(10, reactor))
        self.origin = Origin()
        self.origin_port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        cleanup(self.origin_port.stopListening)
        pytest_twisted.blockon(self.start())

    @defer.inlineCallbacks
    def restart_rewriting(self, **cache: Any) -> Any:
        """Restart the proxy with a rule that rewrites ``page`` to ``PAGE``
        in text/plain (and ``cache`` settings)."""
        rules = os.path.join(scratch_dir(), "r.rules")
        with open(rules, "w") as f:
            f.write("replace_filter 'page' 'PAGE' g;\nreplace_filter_types text/plain;\n")
        yield self.service.stopService()
        yield self.start(rules=(rules,), **cache)

    @defer.inlineCallbacks
    def start(self, rules: tuple[str, ...] = (), **cache: Any) -> Any:
        self.dir = scratch_dir("prexy-cache-test-")
        config = Config(
            listen=("tcp:0:interface=127.0.0.1",),
            sites=(
                SiteConfig(
                    "t", UpstreamURL.parse(f"http://127.0.0.1:{self.origin_port.getHost().port}"),
                    rules=rules, cache=CachePolicy(**cache),
                ),
            ),
            default_site="t",
            access_log=None,
            cache_size=16 * 1024 * 1024,
            cache_path=os.path.join(self.dir, "store"),
        )
        self.clock = SkewedReactor(reactor)
        self.service = ProxyService(self.clock, config, build_runtime(config))
        self.service.startService()
        self.cleanup(self.service.stopService)
        # The proxy made the notice directory when it opened the store.
        self.notices = FetchNotices()
        notices_port = reactor.listenUNIXDatagram(os.path.join(self.dir, "store.events", "test.sock"), self.notices)
        self.cleanup(notices_port.stopListening)
        (port,) = yield self.service.listening_ports()
        self.port = port.getHost().port

    @defer.inlineCallbacks
    def get(self, path: str, headers: bytes = b"", method: bytes = b"GET") -> Any:
        client = RawClient(method + b" " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + headers + b"\r\n")
        yield connect(self.port, client)
        return bytes(client.data)

    @defer.inlineCallbacks
    def stored(self, path: str) -> Any:
        """GET ``path`` (a miss) and wait until the proxy's fetch is over,
        the object stored."""
        over = self.notices.next()
        raw = yield self.get(path)
        yield over
        return raw

    @pytest_twisted.inlineCallbacks
    def test_second_get_is_a_hit(self) -> Any:
        """The first GET is stored, the second served from the cache with Age
        and Cache-Status, without touching the origin; HEAD hits too."""
        first = yield self.get("/c/a")
        second = yield self.get("/c/a")
        head = yield self.get("/c/a", method=b"HEAD")
        assert b"fwd=uri-miss" in header(first, b"cache-status")
        assert b"stored" in header(first, b"cache-status")
        assert header(second, b"cache-status").startswith(b"prexy; hit; ttl=")
        assert header(second, b"age") is not None
        assert body_of(second) == b"page /c/a #1 lang=-"
        assert header(head, b"content-length") == b"%d" % len(body_of(second))
        assert head.endswith(b"\r\n\r\n")
        assert self.origin.hits[b"/c/a"] == 1

    @pytest_twisted.inlineCallbacks
    def test_private_requests_pass(self) -> Any:
        """Cookie, Authorization and X-Requested-With pass; ignored analytics
        cookies do not."""
        yield self.get("/c/p")
        for extra in (b"Cookie: session=abc\r\n", b"Authorization: Basic eDp5\r\n", b"X-Requested-With: XMLHttpRequest\r\n"):
            raw = yield self.get("/c/p", extra)
            assert b"fwd=bypass" in header(raw, b"cache-status")
        raw = yield self.get("/c/p", b"Cookie: _ga=GA1.2.3; _gid=x\r\n")
        assert b"hit" in header(raw, b"cache-status")
        assert self.origin.hits[b"/c/p"] == 4

    @pytest_twisted.inlineCallbacks
    def test_get_with_a_body_passes(self) -> Any:
        """A GET with a body is neither answered from the cache nor stored
        (its answer may depend on the body): the bodiless GET after it is a
        miss, and it does not get the other's answer."""
        client = RawClient(b"GET /c/b HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
        yield connect(self.port, client)
        with_body = bytes(client.data)
        assert with_body.startswith(b"HTTP/1.1 200"), with_body[:200]
        assert header(with_body, b"cache-status") is None or b"stored" not in header(with_body, b"cache-status")
        plain = yield self.get("/c/b")
        assert b"miss" in header(plain, b"cache-status")
        again = yield self.get("/c/b")
        assert b"hit" in header(again, b"cache-status")
        client = RawClient(b"GET /c/b HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabc")
        yield connect(self.port, client)
        assert header(bytes(client.data), b"cache-status") is None or b"hit" not in header(bytes(client.data), b"cache-status")
        assert self.origin.hits[b"/c/b"] == 3

    @pytest_twisted.inlineCallbacks
    def test_private_responses_never_shared(self) -> Any:
        """Set-Cookie and Cache-Control: private answers are not stored: each
        visitor gets their own."""
        a = yield self.get("/c/s?cookie=1")
        b = yield self.get("/c/s?cookie=1")
        assert header(a, b"set-cookie") != header(b, b"set-cookie")
        c = yield self.get("/c/v?cc=private")
        d = yield self.get("/c/v?cc=private")
        assert body_of(c) != body_of(d)
        assert (self.origin.hits[b"/c/s"], self.origin.hits[b"/c/v"]) == (2, 2)

    @pytest_twisted.inlineCallbacks
    def test_vary(self) -> Any:
        """Vary: each Accept-Language gets its own object."""
        en = yield self.get("/c/l?vary=Accept-Language", b"Accept-Language: en\r\n")
        nl = yield self.get("/c/l?vary=Accept-Language", b"Accept-Language: nl\r\n")
        en2 = yield self.get("/c/l?vary=Accept-Language", b"Accept-Language: en\r\n")
        assert b"lang=en" in body_of(en)
        assert b"lang=nl" in body_of(nl)
        assert body_of(en2) == body_of(en)
        assert self.origin.hits[b"/c/l"] == 2

    @pytest_twisted.inlineCallbacks
    def test_coalescing(self) -> Any:
        """100 concurrent misses for one URL make one upstream request."""
        answers = yield defer.gatherResults([self.get("/c/co?delay=0.3") for _ in range(100)])
        assert self.origin.hits[b"/c/co"] == 1
        assert all(body_of(a) == b"page /c/co #1 lang=-" for a in answers)

    @pytest_twisted.inlineCallbacks
    def test_ttl_then_grace_then_refresh(self) -> Any:
        """After max-age the object is served stale within grace while one
        background fetch revalidates it (the origin's 304 keeps the body);
        the next request is a fresh hit again."""
        yield self.service.stopService()
        yield self.start(grace=10.0)
        yield self.stored("/c/g?cc=max-age%3D1")
        self.clock.skip(1.2)
        refreshed = self.notices.next()
        stale = yield self.get("/c/g?cc=max-age%3D1")
        assert re.search(rb"hit; ttl=-\d", header(stale, b"cache-status"))
        assert body_of(stale) == b"page /c/g #1 lang=-"
        yield refreshed  # the background fetch is over, its 304 stored
        fresh = yield self.get("/c/g?cc=max-age%3D1")
        assert re.search(rb"hit; ttl=0", header(fresh, b"cache-status"))
        assert body_of(fresh) == b"page /c/g #1 lang=-"
        assert (self.origin.hits[b"/c/g"], self.origin.not_modified[b"/c/g"]) == (1, 1)

    @pytest_twisted.inlineCallbacks
    def test_grace_refresh_fetches_a_new_body(self) -> Any:
        """Without a validator the background fetch gets a full answer: it
        replaces the stored object (rewritten, since rules apply), and the
        client that triggered it got the stale copy at once."""
        yield self.restart_rewriting(grace=10.0)
        path = "/c/n?cc=max-age%3D1&noetag=1"
        yield self.stored(path)
        self.clock.skip(1.2)
        refreshed = self.notices.next()
        stale = yield self.get(path)
        assert body_of(stale) == b"PAGE /c/n #1 lang=-"
        yield refreshed  # the background fetch is over, its new body stored
        fresh = yield self.get(path)
        assert re.search(rb"hit; ttl=\d", header(fresh, b"cache-status"))
        assert body_of(fresh) == b"PAGE /c/n #2 lang=-"
        assert self.origin.hits[b"/c/n"] == 2

    @pytest_twisted.inlineCallbacks
    def test_stale_if_error(self) -> Any:
        """Upstream down after expiry: the stale copy instead of a 502."""
        yield self.service.stopService()
        yield self.start(grace=0.0)
        yield self.stored("/c/e?cc=max-age%3D1%2C%20stale-if-error%3D60")
        self.clock.skip(1.2)
        yield self.origin_port.stopListening()
        yield self.service.pool.close_idle()  # the pooled connection too
        raw = yield self.get("/c/e?cc=max-age%3D1%2C%20stale-if-error%3D60")
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        assert b"stale-if-error" in header(raw, b"cache-status")

    @pytest_twisted.inlineCallbacks
    def test_revalidation(self) -> Any:
        """An expired object with an ETag is revalidated with a conditional
        request; the origin's 304 refreshes it and the client gets the stored
        body; a client's own If-None-Match is answered 304 from the cache."""
        yield self.service.stopService()
        yield self.start(grace=0.0)
        yield self.stored("/c/r?cc=max-age%3D1")
        self.clock.skip(1.2)
        raw = yield self.get("/c/r?cc=max-age%3D1")
        assert raw.startswith(b"HTTP/1.1 200")
        assert body_of(raw) == b"page /c/r #1 lang=-"
        assert (self.origin.hits[b"/c/r"], self.origin.not_modified[b"/c/r"]) == (1, 1)
        again = yield self.get("/c/r?cc=max-age%3D1")
        assert b"hit" in header(again, b"cache-status")
        conditional = yield self.get("/c/r?cc=max-age%3D1", b'If-None-Match: "r-v1"\r\n')
        assert conditional.startswith(b"HTTP/1.1 304"), conditional[:100]

    @pytest_twisted.inlineCallbacks
    def test_purge(self) -> Any:
        """PURGE from an allowed address removes the object; from another, 405."""
        yield self.get("/c/x")
        raw = yield self.get("/c/x", method=b"PURGE")
        assert b"purged 1" in raw
        again = yield self.get("/c/x")
        assert b"miss" in header(again, b"cache-status")
        yield self.service.stopService()
        yield self.start(purge_from=())
        raw = yield self.get("/c/x", method=b"PURGE")
        assert raw.startswith(b"HTTP/1.1 405")

    @pytest_twisted.inlineCallbacks
    def test_post_invalidates(self) -> Any:
        """An unsafe method on a URL drops its cached object."""
        yield self.get("/c/i")
        yield self.get("/c/i", b"Content-Length: 0\r\n", method=b"POST")
        raw = yield self.get("/c/i")
        assert b"miss" in header(raw, b"cache-status")

    @pytest_twisted.inlineCallbacks
    def test_rewritten_bytes_are_cached(self) -> Any:
        """A rewriting site stores the rewritten body: a hit is rewritten and
        costs no substitution (no Server-Timing trailer)."""
        yield self.restart_rewriting()
        first = yield self.get("/c/w")
        second = yield self.get("/c/w")
        assert body_of(first) == b"PAGE /c/w #1 lang=-"
        assert body_of(second) == b"PAGE /c/w #1 lang=-"
        assert b"Server-Timing: rewrite" in first
        assert b"rewrite;dur" not in second
        assert b"hit" in header(second, b"cache-status")

    @pytest_twisted.inlineCallbacks
    def test_body_outgrowing_the_limit_is_remembered_per_variant(self) -> Any:
        """A rewritten (unknown-length) body that outgrows max_object_size is
        not stored, and the next request of that variant goes straight
        upstream (hit-for-miss under the same Vary-aware key)."""
        yield self.restart_rewriting(max_object_size=10)
        path = "/c/big?vary=Accept-Language"
        first = yield self.get(path, b"Accept-Language: en\r\n")
        second = yield self.get(path, b"Accept-Language: en\r\n")
        assert body_of(first) == b"PAGE /c/big #1 lang=en"
        assert body_of(second) == b"PAGE /c/big #2 lang=en"
        assert b"hit-for-miss" in header(second, b"cache-status")
        other = yield self.get(path, b"Accept-Language: nl\r\n")
        assert b"hit-for-miss" not in header(other, b"cache-status")  # another variant

    @pytest_twisted.inlineCallbacks
    def test_hits_of_every_shape(self) -> Any:
        """Hits for GET, HEAD, a 304 for a matching If-None-Match, a Vary
        variant, tracking cookies, and a head with repeated fields and a tab
        in a value (an obs-fold line is a 400 now, test_strict): each is
        a hit, the same bytes every time (but Age), and the origin saw only
        the two fetches that filled the cache."""
        cases = [
            (b"GET", b"/c/q", b""),
            (b"HEAD", b"/c/q", b""),
            (b"GET", b"/c/q", b'If-None-Match: "q-v1"\r\n'),
            (b"GET", b"/c/q?vary=Accept-Language", b"Accept-Language: nl\r\n"),
            (b"GET", b"/c/q", b"Cookie: _ga=1\r\nUser-Agent: t/1\r\nReferer: http://r/\r\n"),
            (b"GET", b"/c/q", b"X-Rep: a\r\nX-Rep: b\r\nX-Tab: a\tb\r\n"),
        ]
        yield self.get("/c/q")
        yield self.get("/c/q?vary=Accept-Language", b"Accept-Language: nl\r\n")
        for method, path, extra in cases:
            first = yield self.get(path.decode(), extra, method=method)
            again = yield self.get(path.decode(), extra, method=method)
            assert b"hit" in header(first, b"cache-status"), (method, path, extra)
            assert first.replace(header(first, b"age") or b"", b"A") == again.replace(
                header(again, b"age") or b"", b"A"
            )
        assert (self.origin.hits[b"/c/q"]) == 2
        assert self.service.metrics.counters[("prexy_requests_total", (("status", "304"),))] == 2

    @pytest_twisted.inlineCallbacks
    def test_one_store_lookup_per_request(self) -> Any:
        """The store is read once per request (a miss, a hit), and not at
        all for a request the cache passes."""
        store = self.service.resource.cache.store
        lookup = store.lookup
        calls: list[bytes] = []

        def counting(*args: Any, **kw: Any) -> Any:
            calls.append(args[2])
            return lookup(*args, **kw)

        store.lookup = counting
        first = yield self.get("/c/once")
        assert b"fwd=uri-miss" in header(first, b"cache-status")
        assert len(calls) == 1
        second = yield self.get("/c/once")
        assert b"hit" in header(second, b"cache-status")
        assert len(calls) == 2
        passed = yield self.get("/c/once", b"Cookie: session=1\r\n")
        assert b"fwd=bypass" in header(passed, b"cache-status")
        assert len(calls) == 2


class TestBanThroughTwistd:
    """``POST /ban`` on the admin endpoint of ``twistd prexy --workers 2``
    with the cache on: the regex is matched against the path and query (as
    Varnish's ``req.url``), ``host=`` and ``host_regex=`` select by host,
    ``site=`` by site, and a ban that matches nothing says so."""

    @pytest_twisted.inlineCallbacks
    def test_ban_by_path_host_and_site(self, cleanup: Cleanups) -> Any:
        origin = Origin()
        origin_port = reactor.listenTCP(0, origin_site(origin), interface="127.0.0.1")
        cleanup(origin_port.stopListening)
        upstream = f"http://127.0.0.1:{origin_port.getHost().port}"
        base = free_port_block(2)
        port, admin = base, base + 1
        directory = scratch_dir("prexy-ban-")
        config = os.path.join(directory, "prexy.toml")
        with open(config, "w") as f:
            f.write(
                f"[server]\nlisten = ['tcp:{port}:interface=127.0.0.1']\nadmin = 'tcp:{admin}:interface=127.0.0.1'\n"
                f"workers = 2\naccess_log = 'off'\n[cache]\nsize = '32M'\npath = {os.path.join(directory, 'store')!r}\n"
                f"[sites.a]\nhosts = ['a.test', 'www.a.test']\nupstream = '{upstream}'\n"
                f"[sites.b]\nhosts = ['b.test']\nupstream = '{upstream}'\n"
            )
        child = Twistd("--config", config)
        cleanup(child.stop)
        yield child.ready()
        assert len(child.children()) == 2

        @defer.inlineCallbacks
        def get(host: bytes, path: bytes) -> Any:
            client = RawClient(b"GET " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\nConnection: close\r\n\r\n")
            yield connect(port, client)
            raw = bytes(client.data)
            assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
            return header(raw, b"cache-status") or b""

        @defer.inlineCallbacks
        def ban(query: bytes) -> Any:
            client = RawClient(b"POST /ban?" + query + b" HTTP/1.1\r\nHost: admin\r\nContent-Length: 0\r\n"
                               b"Connection: close\r\n\r\n")
            yield connect(admin, client)
            raw = bytes(client.data)
            assert raw.startswith(b"HTTP/1.1 200"), raw
            return body_of(raw)

        pages = [(b"a.test", b"/c/obj"), (b"a.test", b"/c/obj/2?x=1"), (b"www.a.test", b"/c/obj"),
                 (b"a.test", b"/c/other"), (b"b.test", b"/c/obj")]
        for host, path in pages:
            yield get(host, path)
            assert b"hit" in (yield get(host, path)), (host, path)

        assert (yield ban(b"regex=%5E/c/obj&site=a")) == b"banned 3 object(s)\n"
        assert b"miss" in (yield get(b"a.test", b"/c/obj"))
        assert b"miss" in (yield get(b"www.a.test", b"/c/obj"))
        assert b"hit" in (yield get(b"a.test", b"/c/other"))
        assert b"hit" in (yield get(b"b.test", b"/c/obj"))  # another site

        # host= selects: a.test's /c/obj goes, www.a.test's stays.
        assert (yield ban(b"regex=%5E/c/obj&host=a.test&site=a")) == b"banned 1 object(s)\n"
        assert b"miss" in (yield get(b"a.test", b"/c/obj"))
        assert b"hit" in (yield get(b"www.a.test", b"/c/obj"))
        assert (yield ban(b"regex=%5E/c/obj&host_regex=%5Ewww%5C.&site=a")) == b"banned 1 object(s)\n"
        assert b"miss" in (yield get(b"www.a.test", b"/c/obj"))
        assert (yield ban(b"host=b.test")) == b"banned 1 object(s)\n"
        assert b"miss" in (yield get(b"b.test", b"/c/obj"))

        # A ban that matches nothing says so; the URL as stored (host and
        # path) is not what the regex is matched against.
        nothing = yield ban(b"regex=%5Ea.test/c/other&site=a")
        assert nothing.startswith(b"banned 0 object(s): no stored object matched (site a, path and query ~ ")
        assert b"hit" in (yield get(b"a.test", b"/c/other"))
        yield child.stop()
        assert "ban (site a, path and query ~ '^/c/obj'): 3 object(s)" in child.output()
