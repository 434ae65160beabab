"""The policy and the store together, the way the proxy drives them: a miss
is stored and the next request hits; private answers and requests never
reach another visitor; Vary buckets, hit-for-miss, grace, conditional hits,
PURGE on an unsafe method, and a rule-set change."""

from __future__ import annotations

import attrs
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache import (
    Action,
    CachedObject,
    CachePolicy,
    ObjectMeta,
    Store,
    age_header,
    cache_key,
    cache_status_header,
    key_url,
    not_modified,
    request_decision,
    response_decision,
    vary_key,
)
from tests.cases import tmp_dir

NOW = 1_800_000_000.0
SITE = "example"
HOST = b"example.com"


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@attrs.define
class Origin:
    """A fake upstream: the response it gives, and how often it was asked."""

    status: int = 200
    headers: list[tuple[bytes, bytes]] = attrs.Factory(lambda: [(b"Content-Type", b"text/html")])
    body: bytes = b"<p>hello</p>"
    calls: int = 0


@attrs.define
class Proxy:
    """Just enough of the proxy's cache logic to drive the API end to end."""

    store: Store
    clock: Clock
    origin: Origin
    policy: CachePolicy = CachePolicy(ignore_cookies=("_ga*",))
    rules: str = "rules-v1"

    def request(self, target: bytes, headers: list[tuple[bytes, bytes]] | None = None, method: bytes = b"GET") -> tuple[int, dict[bytes, bytes], bytes]:
        raw = list(headers or [])
        now = self.clock.now
        url = key_url(self.policy, HOST, target)
        decision = request_decision(self.policy, method, target, raw)
        if decision.action is Action.INVALIDATE:
            self.store.purge_url(SITE, url)
            return self._forward(raw, cache_status_header(fwd="method"))
        if decision.action is Action.PASS:
            return self._forward(raw, cache_status_header(fwd="bypass", detail=decision.reason))
        found = self.store.lookup(SITE, decision.method_class, url, self.rules, raw, policy=self.policy)
        obj = found.obj
        if obj is not None and not obj.hit_for_miss and (obj.fresh(now) or obj.in_grace(now)):
            return self._hit(obj, raw, now)
        if obj is not None and obj.hit_for_miss:
            return self._forward(raw, cache_status_header(fwd="miss", detail="hit-for-miss"))
        fwd = "uri-miss" if not found.url_known else "vary-miss" if obj is None else "stale"
        self.origin.calls += 1
        o = self.origin
        sd = response_decision(self.policy, o.status, o.headers, now, len(o.body))
        key = cache_key(SITE, decision.method_class, url, vary_key(sd.vary, raw, self.policy), self.rules)
        if sd.store:
            w = self.store.writer(key, ObjectMeta(o.status, o.headers, sd.stored_at, sd.ttl, sd.grace, sd.keep, sd.stale_if_error, SITE, url, sd.vary))
            for i in range(0, len(o.body), 4):
                w.write(o.body[i : i + 4])
            w.commit()
        else:
            self.store.put_hit_for_miss(key, ObjectMeta(o.status, (), now, sd.ttl, site=SITE, url=url, vary=sd.vary))
        status = cache_status_header(fwd=fwd, fwd_status=o.status, stored=sd.store)
        return o.status, dict(o.headers) | {b"Cache-Status": status}, o.body

    def _forward(self, raw: list[tuple[bytes, bytes]], status: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
        self.origin.calls += 1
        return self.origin.status, dict(self.origin.headers) | {b"Cache-Status": status}, self.origin.body

    def _hit(self, obj: CachedObject, raw: list[tuple[bytes, bytes]], now: float) -> tuple[int, dict[bytes, bytes], bytes]:
        headers = dict(obj.headers) | {
            b"Age": age_header(obj.stored_at, now),
            b"Cache-Status": cache_status_header(hit=True, ttl=obj.remaining(now)),
        }
        if not_modified(raw, obj.header(b"etag"), obj.header(b"last-modified")):
            return 304, headers, b""
        return obj.status, headers, obj.body


class FlowTests(SynchronousTestCase):
    def make_proxy(self) -> Proxy:
        """A proxy on a new 8 MiB store, closed after the test."""
        clock = Clock()
        store = Store.open(str(tmp_dir(self) / "c"), 8 * 1024 * 1024, clock=clock)
        self.addCleanup(store.close)
        return Proxy(store, clock, Origin())

    def test_second_get_hits(self) -> None:
        """The first GET is a stored uri-miss, the second a hit with Age and ttl, and HEAD hits too."""
        proxy = self.make_proxy()
        status, headers, body = proxy.request(b"/")
        assert headers[b"Cache-Status"] == b"prexy; fwd=uri-miss; fwd-status=200; stored"
        proxy.clock.now += 5
        status, headers, body = proxy.request(b"/")
        assert (status, body, proxy.origin.calls) == (200, b"<p>hello</p>", 1)
        assert headers[b"Age"] == b"5" and headers[b"Cache-Status"] == b"prexy; hit; ttl=295"
        proxy.request(b"/", method=b"HEAD")
        assert proxy.origin.calls == 1

    def test_private_never_shared(self) -> None:
        """Cookie and Authorization requests pass; Set-Cookie / private answers are never served to another visitor."""
        proxy = self.make_proxy()
        proxy.request(b"/me", [(b"Cookie", b"session=alice")])
        proxy.request(b"/me", [(b"Authorization", b"Basic YWxpY2U=")])
        assert proxy.store.stats()["count"] == 0
        proxy.origin.headers = [(b"Set-Cookie", b"session=alice"), (b"Content-Type", b"text/html")]
        proxy.origin.body = b"alice's page"
        proxy.request(b"/account")
        proxy.origin.headers = [(b"Content-Type", b"text/html")]
        proxy.origin.body = b"anonymous page"
        _, headers, body = proxy.request(b"/account")
        assert body == b"anonymous page"
        assert headers[b"Cache-Status"] == b"prexy; fwd=miss; detail=hit-for-miss"
        proxy.origin.headers = [(b"Cache-Control", b"private, max-age=60")]
        proxy.origin.body = b"bob's page"
        proxy.request(b"/private")
        proxy.origin.body = b"carol's page"
        assert proxy.request(b"/private")[2] == b"carol's page"

    def test_ignored_cookies_still_hit(self) -> None:
        """Analytics cookies do not make a request pass."""
        proxy = self.make_proxy()
        proxy.request(b"/", [(b"Cookie", b"_ga=GA1.1")])
        _, headers, _ = proxy.request(b"/", [(b"Cookie", b"_ga=GA1.2; _ga_X=3")])
        assert headers[b"Cache-Status"].startswith(b"prexy; hit")
        assert proxy.origin.calls == 1

    def test_vary_buckets(self) -> None:
        """With Vary: Accept-Encoding, each bucket is fetched once and then hits."""
        proxy = self.make_proxy()
        proxy.origin.headers = [(b"Vary", b"Accept-Encoding"), (b"Content-Type", b"text/html")]
        chrome = [(b"Accept-Encoding", b"gzip, deflate, br")]
        firefox = [(b"Accept-Encoding", b"br, gzip, deflate, zstd")]
        curl: list[tuple[bytes, bytes]] = []
        assert proxy.request(b"/v", chrome)[1][b"Cache-Status"].startswith(b"prexy; fwd=uri-miss")
        assert proxy.request(b"/v", curl)[1][b"Cache-Status"].startswith(b"prexy; fwd=vary-miss")
        assert proxy.request(b"/v", firefox)[1][b"Cache-Status"].startswith(b"prexy; hit")
        assert proxy.request(b"/v", curl)[1][b"Cache-Status"].startswith(b"prexy; hit")
        assert proxy.origin.calls == 2

    def test_expiry_grace_and_conditional(self) -> None:
        """Fresh for max-age, served in grace, refetched after; validators give 304 from the cache."""
        proxy = self.make_proxy()
        proxy.origin.headers = [(b"Cache-Control", b"max-age=10"), (b"ETag", b'"v1"')]
        proxy.request(b"/t")
        assert proxy.request(b"/t", [(b"If-None-Match", b'W/"v1"')])[0] == 304
        proxy.clock.now += 12  # stale, within the 10 s grace
        _, headers, _ = proxy.request(b"/t")
        assert headers[b"Cache-Status"] == b"prexy; hit; ttl=-2"
        proxy.clock.now += 10  # past grace
        _, headers, _ = proxy.request(b"/t")
        assert headers[b"Cache-Status"].startswith(b"prexy; fwd=")
        assert proxy.origin.calls == 2

    def test_unsafe_method_invalidates(self) -> None:
        """A POST to a URL purges every cached variant of it."""
        proxy = self.make_proxy()
        proxy.request(b"/form")
        proxy.request(b"/form", method=b"POST")
        _, headers, _ = proxy.request(b"/form")
        assert headers[b"Cache-Status"].startswith(b"prexy; fwd=uri-miss")

    def test_rules_change_never_serves_old_rewrite(self) -> None:
        """A new rule-set version misses what the old one stored."""
        proxy = self.make_proxy()
        proxy.request(b"/r")
        proxy.rules = "rules-v2"
        _, headers, _ = proxy.request(b"/r")
        assert b"fwd=" in headers[b"Cache-Status"]
        assert proxy.origin.calls == 2
