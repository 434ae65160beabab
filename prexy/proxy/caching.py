"""The cache inside the proxy: lookups, hits, coalesced misses, grace,
stale-if-error, revalidation and PURGE.

The decisions (what may be looked up or stored, keys, TTLs, validators)
are the pure ``prexy.cache.policy``; the bytes live in the machine-wide
``prexy.cache.store`` (LMDB) that every worker opens, so an object fetched
by one worker is a hit in all of them.  What is stored is what the client
was sent: the rewritten (and possibly re-compressed) body, so a hit costs
neither the origin nor the rules.

A miss makes one upstream request per key: later requests for the same key
in this worker attach to the in-flight ``Flight`` and are served as the body
streams in; other workers see the store's claim on the key and wait for the
object to appear.
"""

from __future__ import annotations

import os
from typing import Any

from twisted.logger import Logger
from twisted.web import server

from prexy.cache import (
    Action,
    CachedObject,
    ObjectMeta,
    Store,
    Writer,
    age_header,
    cache_key,
    cache_status_header,
    key_url,
    not_modified,
    request_decision,
    response_decision,
    vary_key,
)
from prexy.proxy.headers import VIA
from prexy.runtime import SiteRuntime

log = Logger()

#: Per-response headers never stored with an object.
_NOT_STORED = frozenset({b"content-length", b"trailer", b"server-timing", b"age", b"cache-status", b"via"})
#: How long another worker's claim on a key is honoured, and how often a
#: waiting worker looks for the object.
CLAIM_LEASE = 30.0
POLL_INTERVAL = 0.02


def default_cache_path() -> str:
    """Where the shared store lives unless configured: tmpfs when there is one."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else os.environ.get("TMPDIR", "/tmp")
    return os.path.join(base, f"prexy-cache-{os.getuid()}")


class CacheContext:
    """What the cache decided for one forwarded request."""

    def __init__(self, fwd: str, detail: str | None = None) -> None:
        self.fwd = fwd
        self.detail = detail
        self.flight: Flight | None = None
        self.stale: CachedObject | None = None
        self.pairs: list[tuple[bytes, bytes]] = []
        self.url = b""
        self.method_class = b"GET"
        self.claim_key: bytes | None = None
        self.revalidating = False
        #: The key (and Vary) begin_store chose, for a too-large marker.
        self.store_key: bytes | None = None
        self.store_vary: tuple[bytes, ...] = ()

    def status(self, code: int | None = None, stored: bool = False) -> bytes:
        return cache_status_header(fwd=self.fwd, fwd_status=code, stored=stored, detail=self.detail)


class Flight:
    """One upstream fetch for a key; requests that asked for the same key
    meanwhile are served from it as it streams in."""

    def __init__(self, layer: CacheLayer, key: bytes) -> None:
        self.layer = layer
        self.key = key
        self.waiters: list[Any] = []
        self.head: tuple[int, bytes, list[tuple[bytes, bytes]]] | None = None
        self.chunks: list[bytes] = []
        self.open = True  # new requests may still attach
        self.streaming = False

    def attach(self, request: Any) -> None:
        self.waiters.append(request)
        self.layer.metrics.count("prexy_cache_total", result="collapsed")
        if self.streaming:
            self._start(request)

    def stream(self, code: int, phrase: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """The response is being stored: waiters get it as it arrives."""
        self.head = (code, phrase, headers)
        self.streaming = True
        for request in list(self.waiters):
            self._start(request)

    def _start(self, request: Any) -> None:
        if request._disconnected:
            return
        assert self.head is not None
        code, phrase, headers = self.head
        request.setResponseCode(code, phrase or None)
        status = cache_status_header(fwd="miss", fwd_status=code, collapsed=True)
        request.set_raw_head([*headers, (b"Via", VIA), (b"Cache-Status", status)], False)
        if request.method == b"HEAD":
            request.finish()
            self.waiters.remove(request)
            return
        for chunk in self.chunks:
            request.write(chunk)

    def data(self, chunk: bytes, keep: bool) -> None:
        if keep:
            self.chunks.append(chunk)
        else:
            self.chunks = []
            self.open = False
        for request in self.waiters:
            if not request._disconnected:
                request.write(chunk)

    def done(self) -> None:
        self.open = False
        for request in self.waiters:
            if not request._disconnected and not request.finished:
                request.finish()
        self._end()

    def failed(self, stale: CachedObject | None) -> None:
        """The fetch failed: waiters get the stale object when allowed, else
        their connection is reset (if streaming) or a 502."""
        self.open = False
        now = self.layer.reactor.seconds()
        for request in self.waiters:
            if request._disconnected or request.finished:
                continue
            if stale is not None and not request.startedWriting and stale.stale_usable_on_error(now):
                self.layer.serve(request, stale, now, stale_reason="stale-if-error")
            elif request.startedWriting:
                transport = request.channel.transport if request.channel is not None else None
                if transport is not None:
                    transport.abortConnection()
            else:
                body = b"502 Bad Gateway: upstream failed\n"
                request.setResponseCode(502)
                request.setHeader(b"content-type", b"text/plain; charset=utf-8")
                request.setHeader(b"content-length", b"%d" % len(body))
                request.write(body)
                request.finish()
        self._end()

    def not_storable(self, forward: Any) -> None:
        """The answer may not be shared: every waiter fetches for itself."""
        self.open = False
        waiters, self.waiters = self.waiters, []
        self._end()
        for request in waiters:
            if not request._disconnected:
                forward(request)

    def _end(self) -> None:
        self.waiters = []
        self.chunks = []
        if self.layer.inflight.get(self.key) is self:
            del self.layer.inflight[self.key]


class Looked:
    """What the cache made of a request: the decision and, for a lookup, the
    URL key and what the store found (an invalidation has the URL only)."""

    __slots__ = ("decision", "url", "found")

    def __init__(self, decision: Any, url: bytes, found: Any) -> None:
        self.decision = decision
        self.url = url
        self.found = found


class CacheLayer:
    """The cache of one worker process (the store is shared)."""

    def __init__(self, reactor: Any, store: Store, metrics: Any) -> None:
        self.reactor = reactor
        self.store = store
        self.metrics = metrics
        self.inflight: dict[bytes, Flight] = {}
        self.refreshing: set[bytes] = set()
        self.holder = b"%d" % os.getpid()

    # -- requests ----------------------------------------------------------------

    def look(
        self, site: SiteRuntime, method: bytes, target: bytes, host: bytes | None,
        pairs: list[tuple[bytes, bytes]],
    ) -> Looked:
        """Decide on a request (not PURGE) and, for a lookup, read the store."""
        policy = site.cache_policy
        assert policy is not None
        decision = request_decision(policy, method, target, pairs)
        if decision.action is Action.PASS:
            return Looked(decision, b"", None)
        url = key_url(policy, host, target)
        if decision.action is Action.INVALIDATE:
            return Looked(decision, url, None)
        found = self.store.lookup(site.name, decision.method_class, url, site.rules_version, pairs, policy)
        return Looked(decision, url, found)

    def on_request(
        self,
        resource: Any,
        request: Any,
        site: SiteRuntime,
        target: bytes,
        host: bytes | None,
        pairs: list[tuple[bytes, bytes]],
        looked: Looked | None = None,
    ) -> tuple[Any, CacheContext | None]:
        """(answer, None) when the cache answered or parked the request;
        (None, context) when it must be forwarded.  ``looked``: what
        :meth:`look` already made of this request (the quick path's try)."""
        if request.method == b"PURGE":
            return self.purge(request, site, host, target), None
        if looked is None:
            looked = self.look(site, request.method, target, host, pairs)
        decision, url, found = looked.decision, looked.url, looked.found
        if decision.action is Action.INVALIDATE:
            self.store.purge_url(site.name, url)
            self.metrics.count("prexy_cache_total", result="pass")
            return None, CacheContext("bypass", decision.reason)
        if decision.action is Action.PASS or found is None:
            self.metrics.count("prexy_cache_total", result="pass")
            return None, CacheContext("bypass", decision.reason)
        obj = found.obj
        now = self.reactor.seconds()
        if obj is not None and obj.hit_for_miss:
            self.metrics.count("prexy_cache_total", result="hit-for-miss")
            ctx = CacheContext("miss", "hit-for-miss")
            return None, ctx
        if obj is not None and obj.fresh(now):
            self.metrics.count("prexy_cache_total", result="hit")
            return self.serve(request, obj, now, pairs=pairs), None
        ctx = CacheContext("uri-miss" if not found.url_known else "vary-miss" if obj is None else "stale")
        ctx.pairs = pairs
        ctx.url = url
        ctx.method_class = decision.method_class
        if obj is not None and obj.in_grace(now):
            # Serve the stale object now; one background fetch refreshes it.
            self.metrics.count("prexy_cache_total", result="grace")
            answer = self.serve(request, obj, now, pairs=pairs)
            if found.key not in self.refreshing and found.key not in self.inflight:
                self.refreshing.add(found.key)
                ctx.stale = obj
                resource.refresh_in_background(request, site, target, host, ctx, found.key)
            return answer, None
        if obj is not None:
            ctx.stale = obj  # past grace: revalidate if it has validators
        if request.method == b"HEAD":
            # A HEAD answer has no body to store as the GET object.
            self.metrics.count("prexy_cache_total", result="miss")
            return None, ctx
        flight = self.inflight.get(found.key)
        if flight is not None and flight.open:
            flight.attach(request)
            return server.NOT_DONE_YET, None
        self.metrics.count("prexy_cache_total", result="miss")
        if not self.store.claim(found.key, self.holder, CLAIM_LEASE):
            # Another worker is fetching it: wait for the object to appear.
            self._wait_for_other_worker(resource, request, site, target, host, ctx, found.key, now)
            return server.NOT_DONE_YET, None
        ctx.claim_key = found.key
        ctx.flight = self.inflight[found.key] = Flight(self, found.key)
        return None, ctx

    def _wait_for_other_worker(
        self, resource: Any, request: Any, site: SiteRuntime, target: bytes, host: bytes | None,
        ctx: CacheContext, key: bytes, started: float,
    ) -> None:
        def poll() -> None:
            if request._disconnected:
                return
            now = self.reactor.seconds()
            obj = self.store.get(key)
            if obj is not None and not obj.hit_for_miss and obj.fresh(now):
                self.serve(request, obj, now, collapsed=True)
                return
            if self.store.claimed(key) and now - started < CLAIM_LEASE:
                self.reactor.callLater(POLL_INTERVAL, poll)
                return
            resource.forward(request, site, target, host, ctx)

        self.reactor.callLater(POLL_INTERVAL, poll)

    # -- hits ----------------------------------------------------------------------

    def serve(
        self, request: Any, obj: CachedObject, now: float, collapsed: bool = False,
        stale_reason: str | None = None, pairs: list[tuple[bytes, bytes]] | None = None,
    ) -> Any:
        """Answer from a stored object (a 304 when the request's validators
        match); returns what render() returns."""
        if pairs is None:
            pairs = request_pairs(request)
        code, phrase, headers, body = hit_answer(obj, now, pairs, collapsed, stale_reason)
        request.setResponseCode(code, phrase or None)
        request.set_raw_head(headers, True)
        if request.method != b"HEAD" and body:
            request.write(body)
        elif code == 304:
            request.write(b"")
        request.finish()
        return server.NOT_DONE_YET

    def quick_hit(
        self, looked: Looked, pairs: list[tuple[bytes, bytes]]
    ) -> tuple[int, bytes | None, list[tuple[bytes, bytes]], bytes] | None:
        """The answer for a request a fresh stored object serves, as
        :func:`hit_answer` gives it, or None when the request needs the full
        path (pass, miss, stale, hit-for-miss).  Counts the hit."""
        found = looked.found
        obj = found.obj if found is not None else None
        if obj is None or obj.hit_for_miss:
            return None
        now = self.reactor.seconds()
        if not obj.fresh(now):
            return None
        self.metrics.count("prexy_cache_total", result="hit")
        return hit_answer(obj, now, pairs)

    # -- storing ---------------------------------------------------------------------

    def begin_store(
        self, site: SiteRuntime, ctx: CacheContext, code: int, phrase: bytes,
        upstream_headers: list[tuple[bytes, bytes]], client_headers: list[tuple[bytes, bytes]],
        length: int | None,
    ) -> tuple[Writer | None, bytes]:
        """Decide on the upstream head; a writer when the body is to be
        stored, and the Cache-Status for the leader."""
        policy = site.cache_policy
        now = self.reactor.seconds()
        decision = response_decision(policy, code, upstream_headers, now, length)
        stored = [(n, v) for n, v in client_headers if n.lower() not in _NOT_STORED]
        key = ctx.store_key = _variant_key(site, ctx, decision.vary)
        ctx.store_vary = decision.vary
        if decision.store:
            meta = ObjectMeta(
                status=code, headers=stored, stored_at=decision.stored_at, ttl=decision.ttl,
                grace=decision.grace, keep=decision.keep, stale_if_error=decision.stale_if_error,
                site=site.name, url=ctx.url, vary=decision.vary, phrase=phrase,
            )
            writer = self.store.writer(key, meta, limit=policy.max_object_size)
            if ctx.flight is not None:
                ctx.flight.stream(code, phrase, stored)
            return writer, ctx.status(code, stored=True)
        marker = ObjectMeta(status=code, stored_at=now, ttl=decision.ttl, site=site.name, url=ctx.url,
                            vary=decision.vary, hit_for_miss=True)
        self.store.put_hit_for_miss(key, marker)
        self.metrics.count("prexy_cache_not_stored_total", reason=decision.reason or "unknown")
        return None, ctx.status(code)

    def too_large(self, site: SiteRuntime, ctx: CacheContext, code: int) -> None:
        """The body outgrew max_object_size: remember not to wait for it."""
        if ctx.store_key is None:
            return
        now = self.reactor.seconds()
        self.store.put_hit_for_miss(
            ctx.store_key,
            ObjectMeta(status=code, stored_at=now, ttl=site.cache_policy.hit_for_miss_ttl,
                       site=site.name, url=ctx.url, vary=ctx.store_vary, hit_for_miss=True),
        )

    def refreshed(self, site: SiteRuntime, ctx: CacheContext, upstream_headers: list[tuple[bytes, bytes]]) -> CachedObject | None:
        """A 304 answered our revalidation of ``ctx.stale``: store it again
        with fresh times, return the object to serve."""
        stale = ctx.stale
        if stale is None:
            return None
        now = self.reactor.seconds()
        decision = response_decision(site.cache_policy, stale.status, upstream_headers, now)
        if not decision.store:
            return stale
        key = _variant_key(site, ctx, stale.vary)
        meta = ObjectMeta(
            status=stale.status, headers=stale.headers, stored_at=decision.stored_at, ttl=decision.ttl,
            grace=decision.grace, keep=decision.keep, stale_if_error=decision.stale_if_error,
            site=site.name, url=ctx.url, vary=stale.vary, phrase=stale.phrase,
        )
        self.store.refresh(key, meta)
        return self.store.get(key) or stale

    def finished(self, ctx: CacheContext) -> None:
        """The leader's exchange is over (stored or not)."""
        if ctx.claim_key is not None:
            self.store.release(ctx.claim_key, self.holder)
            self.refreshing.discard(ctx.claim_key)
            ctx.claim_key = None

    # -- invalidation ------------------------------------------------------------------

    def purge(self, request: Any, site: SiteRuntime, host: bytes | None, target: bytes) -> bytes:
        client = getattr(request.getClientAddress(), "host", "")
        allowed = site.config.cache.purge_from if site.config.cache is not None else ()
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        if client not in allowed:
            request.setResponseCode(405)
            return b"405 Method Not Allowed: PURGE is not allowed from this address\n"
        count = self.store.purge_url(site.name, key_url(site.cache_policy, host, target))
        self.metrics.count("prexy_cache_purges_total")
        log.info("PURGE {url} from {client}: {n} object(s)", url=target.decode("latin-1"), client=client, n=count)
        return b"purged %d object(s)\n" % count


def _variant_key(site: SiteRuntime, ctx: CacheContext, vary: tuple[bytes, ...]) -> bytes:
    """The store key of this request's variant for a response varying on ``vary``."""
    return cache_key(
        site.name, ctx.method_class, ctx.url, vary_key(vary, ctx.pairs, site.cache_policy), site.rules_version
    )


def hit_answer(
    obj: CachedObject, now: float, pairs: list[tuple[bytes, bytes]], collapsed: bool = False,
    stale_reason: str | None = None,
) -> tuple[int, bytes | None, list[tuple[bytes, bytes]], bytes]:
    """``(status, phrase, headers, body)`` of the answer a stored object
    gives a request: a 304 without Content-* headers when the request's
    validators match, else the object with Age, Via, Cache-Status and
    Content-Length (the body is the stored one, to be left out for HEAD)."""
    remaining = obj.remaining(now)
    if stale_reason:
        status = cache_status_header(hit=True, ttl=remaining, detail=stale_reason)
    else:
        status = cache_status_header(hit=True, ttl=remaining, collapsed=collapsed)
    headers = [*obj.headers, (b"Age", age_header(obj.stored_at, now)), (b"Via", VIA), (b"Cache-Status", status)]
    conditional = any(n == b"if-none-match" or n == b"if-modified-since" for n, _ in pairs)
    if conditional and obj.status == 200 and not_modified(pairs, obj.header(b"etag"), obj.header(b"last-modified")):
        return 304, None, [(n, v) for n, v in headers if not n.lower().startswith(b"content-")], b""
    body = obj.body
    headers.append((b"Content-Length", b"%d" % len(body)))
    return obj.status, obj.phrase or None, headers, body


def request_pairs(request: Any) -> list[tuple[bytes, bytes]]:
    """The request's headers as (lower-case name, value) pairs."""
    from prexy.proxy.headers import raw_header_dict

    return [(n, v) for n, vs in raw_header_dict(request.requestHeaders).items() for v in vs]
