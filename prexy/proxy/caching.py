"""The cache inside the proxy: lookups, hits, coalesced misses, grace,
stale-if-error, revalidation and PURGE.

The decisions (what may be looked up or stored, keys, TTLs, validators)
are the pure ``prexy.cache.policy``; the bytes live in the machine-wide
``prexy.cache.store`` (LMDB) that every worker opens, so an object fetched
by one worker is a hit in all of them.  What is stored is what the client
was sent: the rewritten (and possibly re-compressed) body, so a hit costs
neither the origin nor the rules.

A miss makes one upstream request per key: later requests for the same key
in this worker attach to the in-flight ``Flight`` (``prexy.proxy.flight``)
and are served as the body streams in; other workers see the store's claim on the key and wait for the
object to appear.  The client that made the fetch hanging up cuts nobody's
answer: the fetch goes on while followers wait or the answer is being
stored, and is cancelled once neither holds (``flow.wanted``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import attrs
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger
from twisted.web import server

from prexy.cache import (
    Action,
    CachedObject,
    ICacheStore,
    LookupResult,
    ObjectMeta,
    RequestDecision,
    Writer,
    age_header,
    cache_key,
    cache_status_header,
    flow,
    key_url,
    not_modified,
    request_decision,
    response_decision,
    update_headers,
    vary_key,
)
from prexy.cache.codings import (
    VariantMemo,
    coded_headers,
    compress_whole,
    stored_coding,
    variant_key,
)
from prexy.cache.memo import Memos
from prexy.cache.policy import CachePolicy, FieldTable, location_urls
from prexy.cache.ranges import choose_range
from prexy.cluster.messages import Invalidation
from prexy.fetch import Fetch
from prexy.metrics import Metrics
from prexy.proxy.client import IClient
from prexy.proxy.delivery import deliver_head
from prexy.proxy.events import MAX_FALLBACK, NoEvents
from prexy.proxy.flight import CacheContext, Flight
from prexy.proxy.headers import HOP_BY_HOP, raw_header_dict
from prexy.proxy.request import error_answer
from prexy.proxy.routes import Answered, CacheRoute, Forward, Parked, Refresh
from prexy.runtime import SiteRuntime

log = Logger()

#: Per-response headers never stored with an object.
_NOT_STORED = frozenset({b"content-length", b"trailer", b"server-timing", b"age", b"cache-status", b"via"})
#: How long another worker's claim on a key is honoured.
CLAIM_LEASE = 30.0
#: A worker waiting for another's fetch looks in the store when that worker
#: says it is done (prexy.proxy.events), and without a notice after this
#: long, doubling up to events.MAX_FALLBACK.
FIRST_FALLBACK = 0.05


class Looked:
    """What the cache made of a request: the decision and, for a lookup, the
    URL key and what the store found (an invalidation has the URL only)."""

    __slots__ = ("decision", "url", "found")

    def __init__(self, decision: RequestDecision, url: bytes, found: LookupResult | None) -> None:
        self.decision = decision
        self.url = url
        self.found = found


class CacheLayer:
    """The cache of one worker process (the store is shared)."""

    def __init__(
        self, reactor: IReactorTime, store: ICacheStore, metrics: Metrics, events: Any = None,
        memos: Memos | None = None,
    ) -> None:
        self.reactor = reactor
        self.store = store
        self.metrics = metrics
        #: Notices to and from the other workers (prexy.proxy.events).
        self.events = events if events is not None else NoEvents()
        self.inflight: dict[bytes, Flight] = {}
        self.refreshing: set[bytes] = set()
        self.holder = b"%d" % os.getpid()
        #: The compressed variants served last: a part of the worker's memo
        #: budget (``memos``), or a budget of their own.
        self.variants = VariantMemo(memos) if memos is not None else VariantMemo()
        #: The cluster's seam (prexy.cluster): shares a PURGE applied here;
        #: its Deferred fires with a line for the answer.  None: a node alone.
        self.announce: Callable[[Invalidation], Any] | None = None

    # -- requests ----------------------------------------------------------------

    def look(
        self, site: SiteRuntime, method: bytes, target: bytes, host: bytes | None,
        fields: list[tuple[bytes, bytes]] | FieldTable,
    ) -> Looked:
        """Decide on a request (not PURGE) and, for a lookup, read the
        store.  ``fields``: its header fields, as pairs or by name."""
        policy = _policy(site)
        decision = request_decision(policy, method, target, fields)
        if decision.action is Action.PASS:
            return Looked(decision, b"", None)
        url = key_url(policy, host, target)
        if decision.action is Action.INVALIDATE:
            return Looked(decision, url, None)
        found = self.store.lookup(site.name, decision.method_class, url, site.rules_version, fields, policy)
        return Looked(decision, url, found)

    def on_request(self, request: IClient, fetch: Fetch) -> CacheRoute:
        """Where ``request`` goes (``prexy.proxy.routes``): answered here (a
        hit, a stale copy in grace, PURGE, a follower of a fetch under way),
        forwarded with its cache context, refreshed in the background, or
        parked until another worker's fetch of the same object is done."""
        site, target, host = fetch.site, fetch.client_target, fetch.host
        if request.method == b"PURGE":
            return Answered(self.purge(request, site, host, target))
        pairs = fetch.pairs
        looked = request.looked
        if looked is None:
            looked = self.look(site, request.method, target, host, pairs)
        else:
            request.looked = None  # made for this request, by the hit path, in this turn
        decision, url, found = looked.decision, looked.url, looked.found
        invalidate = decision.action is Action.INVALIDATE
        key = found.key if found is not None else b""
        now = self.reactor.seconds()
        routed = flow.route(
            decision.action, found, now, request.method, decision.reason,
            fetching=key in self.inflight, refreshing=key in self.refreshing,
        )
        way = routed.route
        Way = flow.Route
        if way is Way.BYPASS:
            self.metrics.count_cache("pass")
            request.cache_status = "pass"
            ctx = CacheContext(routed.fwd, routed.detail)
            if invalidate:
                # An unsafe method: the URL's objects go once the upstream
                # answered it without an error (RFC 9111 4.4).
                ctx.invalidate = url
                ctx.invalidate_from = (host, target)
            return Forward(ctx)
        if way is Way.HIT_FOR_MISS:
            self.metrics.count_cache("hit-for-miss")
            request.cache_status = "hit-for-miss"
            return Forward(CacheContext(routed.fwd, routed.detail))
        if way is Way.HIT:
            self.metrics.count_cache("hit")
            request.cache_status = "hit"
            return Answered(self.serve(request, routed.obj, now, pairs=pairs, key=key, site=site))
        ctx = CacheContext(routed.fwd)
        ctx.pairs = pairs
        ctx.url = url
        ctx.method_class = decision.method_class
        ctx.stale = routed.obj  # past grace: revalidated if it has validators
        if way in (Way.GRACE, Way.GRACE_REFRESH):
            # Serve the stale object now; one background fetch refreshes it.
            self.metrics.count_cache("grace")
            request.cache_status = "grace"
            answer = self.serve(request, routed.obj, now, pairs=pairs, key=key, site=site)
            if way is Way.GRACE_REFRESH and self.store.claim(key, self.holder, CLAIM_LEASE):
                self.refreshing.add(key)
                ctx.claim_key = key
                return Refresh(answer, ctx, fetch.as_get())
            return Answered(answer)  # refreshed already, here or by another worker
        if way is Way.FOLLOW and self.inflight[key].attach(request, fetch):
            return Answered(server.NOT_DONE_YET)
        self.metrics.count_cache("miss")
        request.cache_status = "miss"
        if way is Way.MISS_HEAD:
            return Forward(ctx)  # a HEAD answer has no body to store as the GET object
        if not self.store.claim(key, self.holder, CLAIM_LEASE):
            # Another worker is fetching it: wait for the object to appear.
            return Parked(self._wait_for_other_worker(request, site, ctx, key, now))
        ctx.claim_key = key
        ctx.flight = self.inflight[key] = Flight(self, key, site.config.error_pages, site)
        return Forward(ctx)

    def _wait_for_other_worker(
        self, request: IClient, site: SiteRuntime, ctx: CacheContext, key: bytes, started: float,
    ) -> Deferred[CacheRoute | None]:
        """Wait until the worker holding ``key``'s claim is done; the
        Deferred fires with the request answered from what it stored, with
        a forward (``ctx``) when it stored nothing or its lease ran out, or
        with None when the client went away meanwhile."""
        armed: list[Any] = []  # [timer, forget-the-notice]
        delay = [FIRST_FALLBACK]
        done: Deferred[CacheRoute | None] = Deferred()

        def disarm() -> None:
            if armed:
                timer, forget = armed
                del armed[:]
                if timer.active():
                    timer.cancel()
                forget()

        def look() -> None:
            disarm()
            if request.gone:
                done.callback(None)
                return
            now = self.reactor.seconds()
            obj = self.store.get(key)
            if obj is not None and not obj.hit_for_miss and obj.fresh(now):
                done.callback(Answered(self.serve(request, obj, now, collapsed=True, key=key, site=site)))
                return
            if self.store.claimed(key) and now - started < CLAIM_LEASE:
                arm()
                return
            done.callback(Forward(ctx))

        def arm() -> None:
            armed[:] = [self.reactor.callLater(delay[0], look), self.events.wait(key, look)]
            delay[0] = min(delay[0] * 2, MAX_FALLBACK)

        arm()
        return done

    # -- hits ----------------------------------------------------------------------

    def hit(
        self, obj: CachedObject, now: float, method: bytes, pairs: list[tuple[bytes, bytes]],
        accept_encoding: list[bytes] | None, *, key: bytes | None = None, site: SiteRuntime | None = None,
        collapsed: bool = False, stale_reason: str | None = None,
    ) -> HitAnswer:
        """The answer a stored object gives a request, before the delivery
        step (``hit_answer``).  With the object's ``key`` and ``site``, a
        client that takes a coding the site compresses in gets the
        object's compressed variant (``prexy.cache.codings``)."""
        if key is not None and site is not None and obj.status == 200:
            compression = site.config.compression
            coding = stored_coding(
                obj.status, obj.headers, len(obj.body), method=method, compression=compression,
                accept_encoding=accept_encoding,
            )
            if coding is not None:
                obj = self._coded(key, obj, coding, compression.level(coding))
        return hit_answer(obj, now, pairs, collapsed, stale_reason, method)

    def serve(
        self, request: Any, obj: CachedObject, now: float, collapsed: bool = False,
        stale_reason: str | None = None, pairs: list[tuple[bytes, bytes]] | None = None,
        key: bytes | None = None, site: SiteRuntime | None = None,
    ) -> Any:
        """Answer from a stored object (a 304 when the request's validators
        match; ``hit``); returns what render() returns.  With ``site``, its
        add_header / proxy_hide_header apply."""
        if pairs is None:
            pairs = request_pairs(request)
        answer = self.hit(
            obj, now, request.method, pairs, request.requestHeaders.getRawHeaders(b"accept-encoding"),
            key=key, site=site, collapsed=collapsed, stale_reason=stale_reason,
        )
        deliver_head(
            request, answer.code, answer.phrase, answer.headers, age=answer.age, cache_status=answer.cache_status,
            site=site,
        )
        if answer.body:
            request.write_whole(answer.body)
        request.finish()
        return server.NOT_DONE_YET

    def _coded(self, key: bytes, obj: CachedObject, coding: bytes, level: int) -> CachedObject:
        """``obj`` in ``coding``: the compressed bytes from the store, or
        compressed now (the first hit in this coding) and stored for the
        next ones; the head is the object's, coded (``coded_headers``)."""
        vkey = variant_key(key, coding, obj.stored_at, obj.header(b"etag"))
        mkey = vkey + b"\0%r" % obj.stored_at
        memo = self.variants
        variant = memo.variant(key, coding, mkey)
        if variant is not None:
            return variant
        stored = self.store.get(vkey)
        if stored is not None and not stored.hit_for_miss:
            body = stored.body
        else:
            body = compress_whole(obj.body, coding, level)
            self.store.put(vkey, ObjectMeta(**{f.name: getattr(obj, f.name) for f in attrs.fields(ObjectMeta)}), body)
            self.metrics.count("prexy_cache_compressed_total", coding=coding.decode("ascii"))
        variant = attrs.evolve(obj, headers=coded_headers(obj.headers, coding), body=body)
        memo.keep(key, coding, mkey, variant)
        return variant

    # -- storing ---------------------------------------------------------------------

    def begin_store(
        self, site: SiteRuntime, ctx: CacheContext, code: int, phrase: bytes,
        upstream_headers: list[tuple[bytes, bytes]], client_headers: Sequence[tuple[bytes, bytes]],
        length: int | None,
    ) -> tuple[Writer | None, bytes]:
        """Decide on the upstream head; a writer when the body is to be
        stored, and the Cache-Status for the leader."""
        policy = _policy(site)
        now = self.reactor.seconds()
        if code == 206:
            # A part the upstream sent unasked (the cache asks for whole
            # objects): passed on, and the URL stays cacheable.
            return None, ctx.status(code)
        decision = response_decision(policy, code, upstream_headers, now, length)
        omit = _NOT_STORED | decision.omit
        stored = [(n, v) for n, v in client_headers if n.lower() not in omit]
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
                ctx.flight.stream(code, phrase, stored, length)
            return writer, ctx.status(code, stored=True)
        marker = ObjectMeta(status=code, stored_at=now, ttl=decision.ttl, site=site.name, url=ctx.url,
                            vary=decision.vary, hit_for_miss=True)
        self.store.put_hit_for_miss(key, marker)
        self.metrics.count("prexy_cache_not_stored_total", reason=decision.reason or "unknown")
        return None, ctx.status(code)

    def invalidating(self, fetch: Fetch) -> Forward:
        """For a request with a body (never looked up): forwarded, with a
        context that invalidates its URL after a non-error answer when its
        method is unsafe."""
        policy = _policy(fetch.site)
        host, target = fetch.host, fetch.client_target
        decision = request_decision(policy, fetch.method, target, ())
        if decision.action is not Action.INVALIDATE:
            return Forward(None)
        self.metrics.count_cache("pass")
        ctx = CacheContext("bypass", "request-body")
        ctx.invalidate = key_url(policy, host, target)
        ctx.invalidate_from = (host, target)
        return Forward(ctx)

    def answered(self, site: SiteRuntime, ctx: CacheContext, code: int,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        """The upstream's status (and head) for a forwarded request: an
        unsafe request's URL is invalidated on a non-error answer only, with
        the answer's Location and Content-Location on the same host."""
        url = ctx.invalidate
        if url is not None and code < 400:
            ctx.invalidate = None
            count = self.store.purge_url(site.name, url)
            host, target = ctx.invalidate_from
            for other in location_urls(_policy(site), host, target, headers or ()):
                count += self.store.purge_url(site.name, other)
            self.metrics.count("prexy_cache_invalidations_total")
            if count:
                log.debug("invalidated {n} object(s) of {url}", n=count, url=url)

    def too_large(self, site: SiteRuntime, ctx: CacheContext, code: int) -> None:
        """The body outgrew max_object_size: remember not to wait for it."""
        if ctx.store_key is None:
            return
        now = self.reactor.seconds()
        self.store.put_hit_for_miss(
            ctx.store_key,
            ObjectMeta(status=code, stored_at=now, ttl=_policy(site).hit_for_miss_ttl,
                       site=site.name, url=ctx.url, vary=ctx.store_vary, hit_for_miss=True),
        )

    def refreshed(self, site: SiteRuntime, ctx: CacheContext, upstream_headers: list[tuple[bytes, bytes]]) -> CachedObject | None:
        """A 304 answered our revalidation of ``ctx.stale``: store it again
        with fresh times, return the object to serve."""
        stale = ctx.stale
        if stale is None:
            return None
        now = self.reactor.seconds()
        # RFC 9111 3.2 / 4.3.4: the 304's fields replace the stored ones
        # (not the framing ones; not the validators of rewritten bytes,
        # which are derived), and freshness comes from the merged head.
        connection = {t.strip().lower() for n, v in upstream_headers if n.lower() == b"connection" for t in v.split(b",")}
        fresh = [(n, v) for n, v in upstream_headers
                 if n.lower() not in _NOT_STORED and n.lower() not in HOP_BY_HOP and n.lower() not in connection]
        keep: frozenset[bytes] = frozenset()
        rules = site.rules
        if rules is not None and rules.applies_to_header(stale.header(b"content-type")):
            keep = frozenset({b"etag", b"last-modified"})
        headers = update_headers(stale.headers, fresh, keep)
        decision = response_decision(_policy(site), stale.status, headers, now)
        if not decision.store:
            return stale
        if decision.omit:
            headers = [(n, v) for n, v in headers if n.lower() not in decision.omit]
        targeted = site.targeted
        if targeted:  # decided on; never stored nor sent
            headers = [(n, v) for n, v in headers if n.lower() not in targeted]
        key = _variant_key(site, ctx, stale.vary)
        meta = ObjectMeta(
            status=stale.status, headers=headers, stored_at=decision.stored_at, ttl=decision.ttl,
            grace=decision.grace, keep=decision.keep, stale_if_error=decision.stale_if_error,
            site=site.name, url=ctx.url, vary=stale.vary, phrase=stale.phrase,
        )
        self.store.refresh(key, meta)
        return self.store.get(key) or stale

    def finished(self, ctx: CacheContext) -> None:
        """The leader's exchange is over (stored or not)."""
        if ctx.claim_key is not None:
            self.store.release(ctx.claim_key, self.holder)
            self.events.announce(ctx.claim_key)
            self.refreshing.discard(ctx.claim_key)
            ctx.claim_key = None

    # -- invalidation ------------------------------------------------------------------

    def purge(self, request: Any, site: SiteRuntime, host: bytes | None, target: bytes) -> Any:
        client = getattr(request.getClientAddress(), "host", "")
        allowed = site.config.cache.purge_from if site.config.cache is not None else ()
        if client not in allowed:
            error_answer(request, 405, site.config.error_pages, site)
            return server.NOT_DONE_YET
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        url = key_url(_policy(site), host, target)
        count = self.store.purge_url(site.name, url)
        self.metrics.count("prexy_cache_purges_total")
        log.info("PURGE {url} from {client}: {n} object(s)", url=target.decode("latin-1"), client=client, n=count)
        if self.announce is not None:  # a cluster: answer once the other nodes applied it
            from prexy.cluster.answer import answer_with_note

            note = self.announce(Invalidation.purge(site.name, url))
            return answer_with_note(request, note, b"purged %d object(s)\n" % count)
        return b"purged %d object(s)\n" % count


def _policy(site: SiteRuntime) -> CachePolicy:
    """The cache settings of a site the cache is serving: a cached one."""
    policy = site.cache_policy
    assert policy is not None, f"site {site.name} is not cached"
    return policy


def _variant_key(site: SiteRuntime, ctx: CacheContext, vary: tuple[bytes, ...]) -> bytes:
    """The store key of this request's variant for a response varying on ``vary``."""
    return cache_key(
        site.name, ctx.method_class, ctx.url, vary_key(vary, ctx.pairs, _policy(site)), site.rules_version
    )


class HitAnswer(NamedTuple):
    """The answer a stored object gives one request, before the delivery
    step: the status, phrase, the object's fields (coded, ranged), the body
    to send (the stored one, to be left out for HEAD), its Age and its
    Cache-Status."""

    code: int
    phrase: bytes | None
    headers: list[tuple[bytes, bytes]]
    body: bytes
    age: bytes
    cache_status: bytes
    #: A 206's body is ``whole[span[0]:span[1]]`` (``whole``: the body of
    #: the object the answer was made from).
    span: tuple[int, int] | None = None
    whole: bytes | None = None


def hit_answer(
    obj: CachedObject, now: float, pairs: list[tuple[bytes, bytes]], collapsed: bool = False,
    stale_reason: str | None = None, method: bytes = b"GET",
) -> HitAnswer:
    """The answer a stored object gives a request: a 304 without Content-*
    fields when the request's validators match, a 206 or 416 for a GET with
    a Range (``prexy.cache.ranges``), else the object with its
    Content-Length.  A stored 200 says ``Accept-Ranges: bytes``."""
    age, status = hit_marks(obj, now, collapsed, stale_reason)
    headers = obj.headers
    conditional = any(n == b"if-none-match" or n == b"if-modified-since" for n, _ in pairs)
    if conditional and obj.status == 200 and not_modified(pairs, obj.header(b"etag"), obj.header(b"last-modified"), now=now):
        return HitAnswer(304, None, [(n, v) for n, v in headers if not n.lower().startswith(b"content-")], b"", age, status)
    body = obj.body
    headers = list(headers)
    if obj.status == 200:
        headers.append((b"Accept-Ranges", b"bytes"))
        if method == b"GET":
            chosen = choose_range(pairs, len(body), obj.header)
            if chosen is not None:
                headers.append((b"Content-Range", chosen.content_range(len(body))))
                if chosen.status == 416:
                    return HitAnswer(
                        416, b"Range Not Satisfiable", [*headers, (b"Content-Length", b"0")], b"", age, status
                    )
                part = body[chosen.first : chosen.last + 1]
                headers.append((b"Content-Length", b"%d" % len(part)))
                return HitAnswer(
                    206, b"Partial Content", headers, part, age, status, (chosen.first, chosen.last + 1), body
                )
    headers.append((b"Content-Length", b"%d" % len(body)))
    return HitAnswer(obj.status, obj.phrase or None, headers, body, age, status)


def hit_marks(obj: CachedObject, now: float, collapsed: bool = False, stale_reason: str | None = None) -> tuple[bytes, bytes]:
    """The Age and Cache-Status values of a hit on ``obj`` at ``now``."""
    remaining = obj.remaining(now)
    if stale_reason:
        status = cache_status_header(hit=True, ttl=remaining, detail=stale_reason)
    else:
        status = cache_status_header(hit=True, ttl=remaining, collapsed=collapsed)
    return age_header(obj.stored_at, now), status


def request_pairs(request: Any) -> list[tuple[bytes, bytes]]:
    """The request's headers as (lower-case name, value) pairs."""
    return [(n, v) for n, vs in raw_header_dict(request.requestHeaders).items() for v in vs]
