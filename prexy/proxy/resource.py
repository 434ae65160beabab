"""The reverse-proxy resource: one client request -> one upstream exchange.

The response body streams chunk by chunk: every upstream chunk is written to
the client at once (through the site's substitution transducer when its rules
apply), and the upstream socket is registered as a streaming producer on the
client request, so a slow client pauses the upstream instead of filling
memory.  Failures are mapped the way users of nginx expect: 502 when the
upstream cannot be reached or answers garbage, 504 on a timeout, and a reset
client connection when the upstream dies mid-body (never a clean end).
"""

from __future__ import annotations

import collections
import io
import tempfile
import time
import weakref
from typing import IO, Any

from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.http import NO_BODY_CODES as _NO_BODY_CODES
from twisted.web.http import RESPONSES as _RESPONSES
from twisted.web.http import HTTPChannel
from twisted.web.http import Request as _HTTPRequest
from twisted.web.iweb import INonQueuedRequestFactory
from twisted.web.resource import Resource

from prexy.codec import DECODABLE, DecodeError, Decoder, GzipEncoder, accepts_gzip
from prexy.metrics import Metrics
from prexy.proxy.headers import (
    HOP_BY_HOP,
    VIA,
    append_forwarded_for,
    append_via,
    forwardable,
    parse_simple_head,
    raw_header_dict,
)
from prexy.proxy.upstream import (
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    UpstreamTimeout,
    send_now,
)
from prexy.runtime import Runtime, SiteRuntime
from prexy.substitution.applicability import ApplicabilityMemory, ResourceKey
from prexy.substitution.transducer import Transducer

log = Logger()

#: Request headers never forwarded besides hop-by-hop ones: the proxy frames
#: the body itself, and sets Host and forwarding headers itself.
_REQUEST_DROP = HOP_BY_HOP | frozenset(
    {b"host", b"content-length", b"expect", b"x-forwarded-for", b"x-forwarded-host",
     b"x-forwarded-proto", b"via"}
)
_REQUEST_DROP_REWRITING = _REQUEST_DROP | {b"accept-encoding", b"if-none-match"}
_RESPONSE_DROP = HOP_BY_HOP | {b"content-length", b"via"}
_SPOOL_IN_MEMORY = 1024 * 1024
#: Largest piece of body fed to the transducer in one go, and the longest a
#: response's rewriting may hold the reactor before yielding (seconds).
_FEED_SLICE = 16 * 1024
#: Slices adapt to the rule set's speed so one takes about SLICE_SECONDS,
#: but never go below MIN_SLICE: a feed has a fixed cost (with 1000
#: realistic rules about 45 us, bench/bench_transducer.py), so smaller
#: slices measure slower per byte, which shrank them further, to 1 KiB
#: (1000 rules: 262 of 280 bench requests of a 23 KB page streamed, 4.6 ms
#: each, against 0.8 ms of rewriting in one piece).
SLICE_SECONDS = 0.00025
MIN_SLICE, MAX_SLICE = 8 * 1024, 256 * 1024
#: A body that came whole with its head is rewritten at once, before the
#: head, when the rule set rewrites it in about this long (this many
#: SLICE_SECONDS slices), and nothing else waits to be rewritten.  Measured
#: with the realistic bench sets (bench/realistic.py): at 0.25 ms (one
#: slice) the 23 KB page went through the scheduler in 273-280 of 280
#: requests at 10 to 1000 rules, 1.2-3.0 ms per request.
WHOLE_SECONDS = 0.001
#: Bound once: attribute access through twisted.web.http's deprecation
#: module proxy costs microseconds per request.
_http_write = _HTTPRequest.write
WORK_BUDGET = 0.0003
#: A response waiting for the rewrite scheduler keeps reading its upstream
#: until this many bytes wait to be rewritten (bounded memory, and no
#: pause/resume of the upstream socket on every reactor turn).
BACKLOG_PAUSE = 128 * 1024
#: Resource versions the applicability memory keeps per process.
APPLICABILITY_ENTRIES = 50_000


class ProxyResource(Resource):
    """Forwards every request to its site's upstream."""

    isLeaf = True

    def __init__(
        self, reactor: Any, pool: UpstreamPool, runtime: Runtime, metrics: Metrics, cache: Any = None
    ) -> None:
        super().__init__()
        self.reactor = reactor
        self.pool = pool
        self.runtime = runtime
        self.metrics = metrics
        #: prexy.proxy.caching.CacheLayer when a cache store is configured.
        self.cache = cache
        #: Which rules ever matched each resource version (issue 4).
        self.applicability = ApplicabilityMemory(APPLICABILITY_ENTRIES)
        self.scheduler = RewriteScheduler(reactor)
        #: Rule set digest -> the slice size that took about SLICE_SECONDS
        #: last time, so a response's first slice is already the right size.
        self.slices: dict[str, int] = {}

    def render(self, request: ProxyRequest) -> Any:
        early = request.prexy_early
        if early is not None:
            # Already sent upstream from the connection's short parse.
            request.prexy_early = None
            early.attach(request)
            return server.NOT_DONE_YET
        runtime = self.runtime
        raw = raw_header_dict(request.requestHeaders)
        host_values = raw.get(b"host")
        host = host_values[0] if host_values else None
        site = runtime.select(host)
        target = _origin_form(request.uri)
        if target is None:
            return _plain(request, 400, b"Bad Request: unsupported request target\n")
        client_target = target

        if site.urlmap is not None and request.prexy_looked is None:
            # (The quick path looked into the cache only after finding no
            # map entry for this target.)
            action, result = self._apply_map(request, site, target)
            if action == "redirect":
                return result
            if action == "rewrite":
                target = result

        ctx = None
        if site.cache_policy is not None and self.cache is not None:
            request.prexy_forward = (target, host)
            pairs = [(n, v) for n, vs in raw.items() for v in vs]
            answer, ctx = self.cache.on_request(
                self, request, site, client_target, host, pairs, request.prexy_looked
            )
            if answer is not None:
                return answer
        elif request.method == b"PURGE":
            request.setResponseCode(405)
            return _plain(request, 405, b"405 Method Not Allowed: this site has no cache to purge\n")
        return self.forward(request, site, target, host, ctx, raw)

    def quick_answer(
        self, channel: Any, method: bytes, target: bytes, pairs: list[tuple[bytes, bytes]]
    ) -> tuple[bool, Any, _Exchange | None]:
        """What can be done for a plain GET/HEAD (see ProxyChannel) before a
        twisted.web request exists: ``(answered, looked, early)``.

        - A fresh cached object answers it from the channel: (True, None,
          None).  The bytes sent are those render() would send for that hit.
        - A site with a cache that cannot answer it (pass, miss, stale):
          (False, what the cache made of it, None), for render to reuse.
        - A site without cache: it is sent upstream at once (False, None,
          the started exchange), so that building the twisted.web request
          overlaps the upstream's work; render() attaches the exchange.
        - A URL map entry (or a map using request variables): (False, None,
          None), render() decides.

        ``target`` is origin-form (parse_simple_head accepts nothing else)."""
        host = next((v for n, v in pairs if n == b"host"), None)
        site = self.runtime.select(host)
        urlmap = site.urlmap
        if urlmap is not None and (urlmap.variables or urlmap.lookup(target.decode("latin-1"), None)):
            return False, None, None
        cache = self.cache
        if site.cache_policy is None or cache is None:
            raw: dict[bytes, list[bytes]] = {}
            for name, value in pairs:
                raw.setdefault(name, []).append(value)
            early = self._send_upstream(
                site, method, target, host, raw, channel.getPeer(), channel.isSecure(), None, 0, None, None,
            )
            return False, None, early
        looked = cache.look(site, method, target, host, pairs)
        answer = cache.quick_hit(looked, pairs)
        if answer is None:
            return False, looked, None
        code, phrase, headers, body = answer
        close = any(n == b"connection" and v.lower() == b"close" for n, v in pairs)
        if close:
            headers = [(b"Connection", b"close"), *headers]
        seq = _head_seq(b"HTTP/1.1", code, phrase or _RESPONSES.get(code, b"Unknown Status"), headers)
        sent = 0
        if method != b"HEAD" and code not in _NO_BODY_CODES and body:
            seq.append(body)
            sent = len(body)
        send_now(channel.transport, b"".join(seq))
        channel._prexy_served = True
        self.metrics.count_status(code)
        channel.site.log(_QuickRecord(method, target, code, sent, channel.getPeer(), pairs))
        if close:
            channel.persistent = False
            channel.loseConnection()
        return True, None, None

    def forward(
        self, request: ProxyRequest, site: SiteRuntime, target: bytes, host: bytes | None,
        ctx: Any = None, raw: Any = None, detached_from: Any = None,
    ) -> Any:
        """Send the request upstream and stream the answer back (or, for a
        background refresh, into the cache only)."""
        if raw is None:
            raw = raw_header_dict(request.requestHeaders)
        source = detached_from or request
        body, body_length = _request_body(request)
        self._send_upstream(
            site, request.method, target, host, raw, source.getClientAddress(), source.isSecure(),
            body, body_length, ctx, request,
        )
        return server.NOT_DONE_YET

    def _send_upstream(
        self, site: SiteRuntime, method: bytes, target: bytes, host: bytes | None, raw: Any,
        client: Any, secure: bool, body: IO[bytes] | None, body_length: int, ctx: Any,
        request: ProxyRequest | None,
    ) -> _Exchange:
        """Build the upstream request's headers, start the exchange and send."""
        started = self.reactor.seconds()
        upstream = site.config.upstream
        if upstream.path:
            target = upstream.path.encode("latin-1") + target
        rules = site.rules
        out = forwardable(raw, _REQUEST_DROP_REWRITING if rules is not None else _REQUEST_DROP)
        out.append((b"Host", site.config.upstream_host_header(host)))
        if rules is not None:
            inm = raw.get(b"if-none-match")
            if inm:
                digest = rules.digest
                out += [(b"if-none-match", _upstream_if_none_match(v, digest)) for v in inm]
            # Never let compressed bytes reach the transducer: ask for identity.
            out.append((b"Accept-Encoding", b"identity"))
        if ctx is not None and (ctx.flight is not None or ctx.claim_key is not None):
            # Fetching for the cache: get a full answer, not the client's 304.
            out = [(n, v) for n, v in out if n.lower() not in (b"if-none-match", b"if-modified-since")]
        if ctx is not None and ctx.stale is not None and (ctx.flight is not None or ctx.claim_key is not None):
            # Revalidate the stale copy: a 304 refreshes it without a body.
            etag = ctx.stale.header(b"etag")
            if etag is not None and rules is not None:
                etag = _upstream_if_none_match(etag, rules.digest)
            if etag is not None:
                out.append((b"If-None-Match", etag))
            last_modified = ctx.stale.header(b"last-modified")
            if last_modified is not None:
                out.append((b"If-Modified-Since", last_modified))
            ctx.revalidating = etag is not None or last_modified is not None
        client_ip = getattr(client, "host", None) or "unix"
        out.append((b"X-Forwarded-For", append_forwarded_for(raw.get(b"x-forwarded-for"), client_ip.encode("ascii"))))
        out.append((b"X-Forwarded-Proto", b"https" if secure else b"http"))
        if host:
            out.append((b"X-Forwarded-Host", host))
        out.append((b"Via", append_via(raw.get(b"via"))))

        exchange = _Exchange(self, request, site, started)
        exchange.ctx = ctx
        exchange.upstream_target = target
        if request is not None:
            request.exchange = exchange
        exchange.pending = self.pool.request(
            site.origin_key, method, target, out, body, body_length,
            exchange.on_head, exchange.upstream_failed,
        )
        return exchange

    def refresh_in_background(
        self, request: ProxyRequest, site: SiteRuntime, target: bytes, host: bytes | None, ctx: Any, key: bytes
    ) -> None:
        """Fetch a stale-in-grace object again, for the cache only."""
        cache = self.cache
        if not cache.store.claim(key, cache.holder, 30.0):
            cache.refreshing.discard(key)
            return  # another worker is at it
        ctx.claim_key = key
        detached = _DetachedRequest(request)
        self.forward(detached, site, target, host, ctx, detached_from=request)  # type: ignore[arg-type]

    def _apply_map(self, request: server.Request, site: SiteRuntime, target: bytes) -> tuple[str, bytes]:
        """Per the site's map: ("redirect", body) with the response head set,
        ("rewrite", new target), or ("", b"") when no entry matched."""
        cfg = site.config.map
        assert cfg is not None
        urlmap = site.urlmap
        uri = request.uri.decode("latin-1")
        value = urlmap.lookup(uri, _request_variables(request, uri) if urlmap.variables else None)
        if not value:
            return "", b""
        self.metrics.count("prexy_map_hits_total", action=cfg.action)
        query = b""
        if cfg.keep_query and b"?" in target and "?" not in value:
            query = target[target.index(b"?") :]
        if cfg.action == "rewrite":
            new = value.encode("latin-1")
            if not new.startswith(b"/"):
                new = b"/" + new
            return "rewrite", new + query
        location = value.encode("latin-1") + query
        if location.startswith(b"/") and not location.startswith(b"//"):
            scheme = b"https" if request.isSecure() else b"http"
            host = request.getHeader(b"host") or b"localhost"
            location = scheme + b"://" + (host if isinstance(host, bytes) else host.encode()) + location
        request.setResponseCode(cfg.status)
        request.setHeader(b"Location", location)
        return "redirect", _plain(request, cfg.status, b"Redirecting to " + location + b"\n", keep_code=True)


def _request_variables(request: server.Request, uri: str) -> dict[str, str]:
    """The nginx variables a map value may use besides its captures."""
    path, sep, query = uri.partition("?")
    host = request.getHeader(b"host") or b""
    return {
        "request_uri": uri,
        "uri": path,
        "args": query,
        "query_string": query,
        "is_args": "?" if sep else "",
        "host": host.decode("latin-1").split(":")[0].lower(),
        "http_host": host.decode("latin-1"),
        "scheme": "https" if request.isSecure() else "http",
        "request_method": request.method.decode("latin-1"),
        "remote_addr": getattr(request.getClientAddress(), "host", ""),
    }


def _plain(request: server.Request, code: int, body: bytes, keep_code: bool = False) -> bytes:
    if not keep_code:
        request.setResponseCode(code)
    request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
    request.setHeader(b"Content-Length", b"%d" % len(body))
    return body


def _origin_form(uri: bytes) -> bytes | None:
    """The request target as origin-form (absolute-form is reduced to its path)."""
    if uri.startswith(b"/"):
        return uri
    if uri == b"*":
        return uri
    lower = uri[:8].lower()
    if lower.startswith(b"http://") or lower.startswith(b"https://"):
        rest = uri.split(b"://", 1)[1]
        slash = rest.find(b"/")
        if slash < 0:
            q = rest.find(b"?")
            return b"/" + (rest[q:] if q >= 0 else b"")
        return rest[slash:]
    return None


def _request_body(request: server.Request) -> tuple[IO[bytes] | None, int]:
    content = request.content
    if content is None:
        return None, 0
    content.seek(0, 2)
    length = content.tell()
    content.seek(0)
    if not length:
        return None, 0
    return content, length


class _Exchange:
    """State of one proxied request: from upstream head to the last byte."""

    def __init__(
        self, resource: ProxyResource, request: ProxyRequest | None, site: SiteRuntime, started: float
    ) -> None:
        self.resource = resource
        #: None only between ProxyResource.quick_answer and attach().
        self.request: ProxyRequest = request  # type: ignore[assignment]
        #: What the upstream said before the request was attached.
        self._early: tuple[bool, Any] | None = None
        self.site = site
        self.started = started
        self.pending: Any = None
        self.response: UpstreamResponse | None = None
        self.transducer: Any = None
        self.decoder: Decoder | None = None
        self.encoder: GzipEncoder | None = None
        self.client_gone_flag = False
        self.done = False
        self.producer_registered = False
        self.ctx: Any = None  # prexy.proxy.caching.CacheContext
        self._backlog: collections.deque[bytes] = collections.deque()
        self._backlog_bytes = 0
        self._queued = False  # waiting in the rewrite scheduler
        self._work_paused = False
        self._body_done = False
        self._slice = _FEED_SLICE
        #: Body bytes still to come when the upstream gave a length (and
        #: nothing is decoded): the last piece then ends the transducer.
        self._expect: int | None = None
        self._ended = False
        self._stash = b""  # output of the transducer's last slice, not sent yet
        self.resource_key: Any = None
        self.rules_run = 0
        self.upstream_target: bytes | None = None
        self.writer: Any = None  # cache writer while the body is stored
        self.keep_chunks = True

    # -- upstream head -----------------------------------------------------------

    def attach(self, request: ProxyRequest) -> None:
        """Give an exchange started by quick_answer its request (render()),
        and deliver what the upstream already said, if anything."""
        self.request = request
        request.exchange = self
        early, self._early = self._early, None
        if early is not None:
            is_head, value = early
            if is_head:
                self.on_head(value)
            else:
                self.upstream_failed(value)

    def on_head(self, response: UpstreamResponse) -> None:
        if self.request is None:
            self._early = (True, response)
            return
        try:
            self.response_head(response)
        except Exception:
            self.internal_error(Failure())

    def response_head(self, response: UpstreamResponse) -> None:
        self.pending = None
        request = self.request
        if self.client_gone_flag:
            response.abort()
            return
        self.response = response
        resource = self.resource
        ctx = self.ctx
        if ctx is not None and ctx.revalidating and response.code == 304:
            self._serve_revalidated(response)
            return
        request.setResponseCode(response.code, response.phrase or None)
        headers = response.end_to_end(_RESPONSE_DROP)
        rules = self.site.rules
        rewrite = False
        coding = None
        if rules is not None and response.length != 0 and response.code not in (204, 304):
            ctype = response.header(b"content-type")
            encoding = response.header(b"content-encoding")
            if encoding is not None and encoding.strip().lower() not in (b"", b"identity"):
                coding = encoding.strip().lower()
            if coding is None or coding in DECODABLE:
                rewrite = rules.applies_to_header(ctype)
        has_length = False
        skipped = False
        if rewrite and request.method != b"HEAD":
            memory = resource.applicability
            self.resource_key = _resource_key(self.site, request, response, self.upstream_target)
            only = memory.rules_for(rules, self.resource_key)
            if only is not None and not only and coding is None:
                # This version of the resource matched no rule before: pass
                # it through unscanned, with its length.
                skipped = True
                resource.metrics.count("prexy_rewrite_skipped_total")
            else:
                self.transducer = Transducer(rules, only=only)
                self._slice = resource.slices.get(rules.digest, _FEED_SLICE)
                self.rules_run = len(rules.rules) if only is None else len(only)
        whole: bytes | None = None
        if (
            self.transducer is not None
            and coding is None
            and ctx is None
            and response.length is not None
            and 0 < response.length <= self._slice * WHOLE_SECONDS / SLICE_SECONDS
            and not resource.scheduler.queue
        ):
            # When the whole body came with the head it is a millisecond of
            # work at most: rewrite it before the head goes out, which can
            # then give the rewrite time.
            body = response.take_body()
            if body is not None:
                resource.metrics.bytes_in += len(body)
                whole = self._timed_transform(body, True)
                if whole is None:
                    return  # the rewrite failed: the client was reset
        if rewrite:
            # HEAD gets the same head a GET would: no length, derived validators.
            if coding is not None:
                # Compressed despite Accept-Encoding: identity. Decode, rewrite,
                # and compress again only for clients that take gzip.
                self.decoder = Decoder(coding)
                headers = [(n, v) for n, v in headers if n.lower() != b"content-encoding"]
                if accepts_gzip(request.requestHeaders.getRawHeaders(b"accept-encoding")):
                    self.encoder = GzipEncoder()
                    headers.append((b"Content-Encoding", b"gzip"))
                vary = [v for n, v in headers if n.lower() == b"vary"]
                if not any(b"accept-encoding" in v.lower() or b"*" in v for v in vary):
                    headers.append((b"Vary", b"Accept-Encoding"))
            drop_modified = not rules.keep_last_modified and response.header(b"last-modified") is not None
            if drop_modified or response.header(b"etag") is not None:
                digest = rules.digest
                kept = []
                for name, value in headers:
                    lname = name.lower()
                    if lname == b"etag":
                        value = _derived_etag(value, digest)
                    elif drop_modified and lname == b"last-modified":
                        continue
                    kept.append((name, value))
                headers = kept
            if self.transducer is not None and whole is None:
                # Substitution time is known only at the end: a trailer.
                headers.append((b"Trailer", b"Server-Timing"))
            elif skipped and response.length is not None:
                headers.append((b"Content-Length", b"%d" % response.length))
                has_length = True
        elif response.length is not None and response.code not in (204, 304):
            headers.append((b"Content-Length", b"%d" % response.length))
            has_length = True
        if ctx is not None:
            headers.append((b"Cache-Status", self._cache_head(response, headers, rewrite)))
        via = response.values(b"via") if b"via" in response.lnames else None
        headers.append((b"Via", append_via(via) if via else VIA))
        now = resource.reactor.seconds()
        upstream_time = response.connect_seconds + response.first_byte_seconds
        own = now - self.started - upstream_time
        if whole is not None:
            own -= self.transducer.scan_seconds  # reported as rewrite;dur
        timing = b"upstream-connect;dur=%.3f, upstream-first-byte;dur=%.3f, prexy;dur=%.3f" % (
            response.connect_seconds * 1000, response.first_byte_seconds * 1000, max(0.0, own) * 1000
        )
        if skipped:
            timing += b', rewrite-skipped;desc="no rule matched this version before"'
        elif whole is not None:
            timing += b", " + self._rewrite_timing()
        headers.append((b"Server-Timing", timing))
        request.set_raw_head(headers, has_length)
        resource.metrics.observe_upstream(response.first_byte_seconds + response.connect_seconds)
        if whole is not None:
            resource.metrics.bytes_out += len(whole)
            self._stash = whole
            self._complete(trailer=False)
            return
        if request.method == b"HEAD" or response.length == 0 or response.code in (204, 304):
            response.deliverBody(self)  # nothing to stream: finishes at once
            return
        if self.transducer is not None and self.decoder is None:
            self._expect = response.length
        if not response.body_in_hand:
            request.registerProducer(response.producer, True)
            self.producer_registered = True
        response.deliverBody(self)

    def _cache_head(self, response: UpstreamResponse, headers: list[tuple[bytes, bytes]], rewrite: bool) -> bytes:
        """Start storing (leader of a miss, or background refresh) and return
        this response's Cache-Status."""
        ctx = self.ctx
        cache = self.resource.cache
        if (ctx.flight is not None or ctx.claim_key is not None) and self.request.method == b"GET":
            length = None if rewrite else response.length
            writer, status = cache.begin_store(
                self.site, ctx, response.code, response.phrase, response.headers, headers, length
            )
            self.writer = writer
            if writer is None and ctx.flight is not None:
                site = self.site
                resource = self.resource

                def forward(waiter: Any) -> None:
                    from prexy.proxy.caching import CacheContext

                    target, host = waiter.prexy_forward
                    resource.forward(waiter, site, target, host, CacheContext("miss", "not-storable"))

                ctx.flight.not_storable(forward)
            return status
        return ctx.status(response.code)

    def _serve_revalidated(self, response: UpstreamResponse) -> None:
        """Upstream said our stale copy is still good (304): refresh it and
        answer the client and any waiters from it."""
        cache = self.resource.cache
        ctx = self.ctx
        obj = cache.refreshed(self.site, ctx, response.headers)
        response.deliverBody(_Discard())
        now = self.resource.reactor.seconds()
        self.done = True
        if not isinstance(self.request, _DetachedRequest) and not self.request._disconnected:
            cache.serve(self.request, obj, now)
        if ctx.flight is not None:
            for waiter in list(ctx.flight.waiters):
                if not waiter._disconnected and not waiter.finished:
                    cache.serve(waiter, obj, now, collapsed=True)
            ctx.flight._end()
        cache.finished(ctx)

    def _cache_data(self, out: bytes) -> None:
        writer = self.writer
        if writer is not None and not writer.write(out):
            self.writer = None
            self.keep_chunks = False
            self.resource.cache.too_large(self.site, self.ctx, self.response.code if self.response else 200)
        flight = self.ctx.flight
        if flight is not None:
            flight.data(out, self.keep_chunks)

    def _cache_done(self, ok: bool) -> None:
        ctx = self.ctx
        if ctx is None:
            return
        self.ctx = None
        writer, self.writer = self.writer, None
        if writer is not None:
            if ok:
                writer.commit()
            else:
                writer.abort()
        if ctx.flight is not None:
            if ok:
                ctx.flight.done()
            else:
                ctx.flight.failed(ctx.stale)
        self.resource.cache.finished(ctx)

    # -- body ------------------------------------------------------------------

    def bodyData(self, data: bytes) -> None:
        if self.client_gone_flag or self.done:
            return
        metrics = self.resource.metrics
        metrics.bytes_in += len(data)
        if self.transducer is None:
            metrics.bytes_out += len(data)
            if self.ctx is not None:
                self._cache_data(data)
            self.request.write(data)
            return
        if self._expect is not None:
            self._expect -= len(data)
        self._backlog.append(data)
        self._backlog_bytes += len(data)
        if self._queued and self._backlog_bytes >= BACKLOG_PAUSE:
            self.wait_for_work()
        self.resource.scheduler.want(self)

    def work_one(self) -> bool:
        """Rewrite one slice of what has arrived; True while more is left."""
        backlog = self._backlog
        if self.client_gone_flag or self.done:
            backlog.clear()
            self._backlog_bytes = 0
            return False
        if not backlog:
            return False
        # One slice of what is queued: small pieces (an upstream's 1 KiB
        # chunks, small reads) are joined up to the slice size, since each
        # feed has a fixed cost (20-60 us with the realistic bench sets,
        # bench/bench_transducer.py), so feeding them one by one multiplied it.
        size = self._slice
        data = backlog.popleft()
        if len(data) > size:
            backlog.appendleft(data[size:])
            data = data[:size]
        elif backlog and len(data) + len(backlog[0]) <= size:
            parts = [data]
            total = len(data)
            while backlog and total + len(backlog[0]) <= size:
                piece = backlog.popleft()
                parts.append(piece)
                total += len(piece)
            data = b"".join(parts)
        self._backlog_bytes -= len(data)
        out = self._timed_transform(data, self._expect == 0 and not backlog)
        if out is None:
            backlog.clear()
            self._backlog_bytes = 0
            return False  # failed: the client was reset
        if out:
            self.resource.metrics.bytes_out += len(out)
            if self.ctx is not None:
                self._cache_data(out)
            if self._ended:
                # The body's last output: sent with the trailer by _complete.
                self._stash = out
            else:
                self.request.write(out)
        return bool(backlog)

    def _timed_transform(self, data: bytes, last: bool) -> bytes | None:
        """:meth:`_transform` one slice, and size the next one from its time."""
        size = self._slice
        began = time.perf_counter()
        out = self._transform(data, last=last)
        spent = time.perf_counter() - began
        if spent > 0 and len(data) >= max(MIN_SLICE, size // 2):  # a representative slice
            # Next slice: what this rule set rewrites in ~SLICE_SECONDS, at
            # most halving or doubling per step, so that one slow measurement
            # (a preemption, a collection) does not shrink the slices of
            # every later response to a size where fixed costs dominate.
            estimate = len(data) * SLICE_SECONDS / spent
            self._slice = int(min(MAX_SLICE, max(MIN_SLICE, size / 2, min(estimate, size * 2))))
            if self.site.rules is not None:
                self.resource.slices[self.site.rules.digest] = self._slice
        return out

    def wait_for_work(self) -> None:
        """Stop reading upstream until the scheduler comes back to us, once
        BACKLOG_PAUSE bytes wait."""
        if not self._work_paused and self.response is not None and self._backlog_bytes >= BACKLOG_PAUSE:
            self._work_paused = True
            self.response.pause_for_work()

    def work_drained(self) -> None:
        """Everything received so far is rewritten."""
        if self._work_paused and self.response is not None:
            self._work_paused = False
            self.response.resume_after_work()
        if self._body_done and not self.done and not self.client_gone_flag:
            self._complete()

    def _transform(self, data: bytes, last: bool = False) -> bytes | None:
        """decode -> substitute -> encode one piece; None after a failure.
        ``last``: these are the body's last bytes (its length was known and
        nothing is decoded), so the transducer ends with them."""
        transducer = self.transducer
        try:
            if self.decoder is not None:
                data = self.decoder.feed(data)
            if last:
                out = transducer.finish(data)
                self._ended = True
            elif len(data) <= MAX_SLICE:
                out = transducer.feed(data)
            else:
                # Decompressed bytes can outgrow a slice many times over.
                out = b"".join(
                    transducer.feed(data[i : i + MAX_SLICE]) for i in range(0, len(data), MAX_SLICE)
                )
            if self.encoder is not None:
                out = self.encoder.feed(out)
        except DecodeError as exc:
            log.warn("{uri}: {error}; resetting client connection", uri=self.request.uri.decode("latin-1"), error=str(exc))
            self.abort_client()
            return None
        except Exception:
            log.failure("substitution failed; aborting the response")
            self.abort_client()
            return None
        return out

    def bodyDone(self) -> None:
        if self.client_gone_flag or self.done:
            return
        self._body_done = True
        if not self._queued:
            self._complete()

    def _complete(self, trailer: bool = True) -> None:
        """Finish the response; ``trailer``: the rewrite's Server-Timing goes
        in a trailer (False: it was in the head already)."""
        request = self.request
        transducer = self.transducer
        if transducer is not None:
            try:
                tail = b""
                if self.decoder is not None:
                    tail = transducer.feed(self.decoder.finish())
                if not self._ended:
                    tail += transducer.finish()
                if self.encoder is not None:
                    tail = self.encoder.feed(tail) + self.encoder.finish()
            except DecodeError as exc:
                log.warn("{uri}: {error}; resetting client connection", uri=request.uri.decode("latin-1"), error=str(exc))
                self.abort_client()
                return
            except Exception:
                log.failure("substitution failed at end of body; aborting the response")
                self.abort_client()
                return
            if tail:
                self.resource.metrics.bytes_out += len(tail)
                if self.ctx is not None:
                    self._cache_data(tail)
            tail = self._stash + tail
            self._stash = b""
            self._count_transducer(transducer)
            if trailer:
                request.set_trailer(b"Server-Timing", self._rewrite_timing())
        else:
            tail = b""
        self._unregister()
        self.done = True
        self._cache_done(True)
        request.finish(tail)
        # After the last bytes left: the client does not wait for this.
        if transducer is not None and self.site.rules is not None:
            self.resource.applicability.record(self.site.rules, self.resource_key, transducer)

    def _rewrite_timing(self) -> bytes:
        """The Server-Timing entries of the finished rewrite."""
        transducer = self.transducer
        timing = b"rewrite;dur=%.3f" % (transducer.scan_seconds * 1000)
        timing += b', rewrite-rules;desc="%d matched of %d run"' % (len(transducer.rules_matched), self.rules_run)
        if transducer.bailed_out:
            timing += b', rewrite-bailout;desc="max_buffered_size reached"'
        if transducer.timed_out:
            timing += b', rewrite-timeout;desc="scan timed out, rest passed unchanged"'
        return timing

    def bodyFailed(self, reason: Failure) -> None:
        if self.client_gone_flag:
            return
        log.warn(
            "upstream failed mid-body for {method} {uri}: {why}; resetting client connection",
            method=self.request.method.decode("latin-1"),
            uri=self.request.uri.decode("latin-1"),
            why=reason.getErrorMessage(),
        )
        self.resource.metrics.count("prexy_upstream_errors_total", kind="mid-body")
        self.abort_client()

    def _count_transducer(self, transducer: Any) -> None:
        metrics = self.resource.metrics
        if getattr(transducer, "bailed_out", False):
            metrics.count("prexy_rewrite_bailouts_total")
        if getattr(transducer, "timed_out", False):
            metrics.count("prexy_rewrite_timeouts_total")

    def _unregister(self) -> None:
        if self.producer_registered:
            self.producer_registered = False
            if self.request.channel is not None:
                self.request.unregisterProducer()

    def abort_client(self) -> None:
        self._unregister()
        self.done = True
        self._cache_done(False)
        if self.response is not None:
            self.response.abort()
        channel = self.request.channel
        transport: Any = channel.transport if channel is not None else None
        if transport is not None:
            transport.abortConnection()

    # -- failures --------------------------------------------------------------

    def upstream_failed(self, reason: Failure) -> None:
        if self.request is None:  # failed at once (a refused connection)
            self._early = (False, reason)
            return
        self.pending = None
        if self.client_gone_flag or reason.check(CancelledError):
            return
        try:
            self._upstream_failed(reason)
        except Exception:
            self.internal_error(Failure())

    def _upstream_failed(self, reason: Failure) -> None:
        request = self.request
        status = reason.value.status if isinstance(reason.value, UpstreamError) else 502
        kind = "timeout" if reason.check(UpstreamTimeout) else "connect" if status == 502 else "error"
        self.resource.metrics.count("prexy_upstream_errors_total", kind=kind)
        upstream = self.site.config.upstream
        log.warn(
            "{status} for {method} {uri}: upstream {upstream}: {why}",
            status=status,
            method=request.method.decode("latin-1"),
            uri=request.uri.decode("latin-1"),
            upstream=str(upstream),
            why=reason.getErrorMessage(),
        )
        ctx = self.ctx
        if ctx is not None:
            stale = ctx.stale
            self._cache_done(False)  # waiters get the stale copy or an error too
            now = self.resource.reactor.seconds()
            if stale is not None and stale.stale_usable_on_error(now):
                self.done = True
                self.resource.cache.serve(request, stale, now, stale_reason="stale-if-error")
                return
        phrase = b"Gateway Timeout" if status == 504 else b"Bad Gateway"
        body = b"%d %s: %s\n" % (status, phrase, reason.getErrorMessage().encode("utf-8", "replace"))
        request.setResponseCode(status)
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)
        self.done = True
        request.finish()

    def internal_error(self, reason: Failure) -> None:
        log.failure("internal error while proxying", reason)
        if not self.client_gone_flag and not self.done:
            self.abort_client()

    def client_gone(self, reason: Failure | None = None) -> None:
        """The client disconnected before the response was complete."""
        if self.done:
            return
        self.client_gone_flag = True
        self.producer_registered = False
        self._cache_done(False)
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.cancel()
        elif self.response is not None:
            self.response.abort()


class RewriteScheduler:
    """Shares the reactor between all the responses being rewritten in this
    process: one slice of each in turn, at most WORK_BUDGET seconds per
    reactor turn, then the others wait (their upstreams paused) until the
    next turn, so light requests never queue behind heavy rewriting."""

    def __init__(self, reactor: Any) -> None:
        self.reactor = reactor
        self.queue: collections.deque[_Exchange] = collections.deque()
        self.scheduled = False
        self.running = False

    def want(self, exchange: _Exchange) -> None:
        if not exchange._queued:
            exchange._queued = True
            self.queue.append(exchange)
        if not self.scheduled and not self.running:
            self.tick()

    def tick(self) -> None:
        self.scheduled = False
        self.running = True
        queue = self.queue
        deadline = time.perf_counter() + WORK_BUDGET
        try:
            while queue:
                exchange = queue.popleft()
                if exchange.work_one():
                    queue.append(exchange)
                else:
                    exchange._queued = False
                    exchange.work_drained()
                if queue and time.perf_counter() > deadline:
                    for waiting in queue:
                        waiting.wait_for_work()
                    self.scheduled = True
                    self.reactor.callLater(0, self.tick)
                    return
        finally:
            self.running = False


class _Discard:
    """A body consumer that drops what it gets (a 304 after revalidation)."""

    def bodyData(self, data: bytes) -> None:
        pass

    def bodyDone(self) -> None:
        pass

    def bodyFailed(self, reason: Failure) -> None:
        pass


class _DetachedRequest:
    """Stands in for a client in a background refresh: the fetched body only
    goes into the cache."""

    channel = None
    _disconnected = False
    startedWriting = False
    finished = False
    content = None
    code = 200
    exchange: Any = None

    def __init__(self, original: Any) -> None:
        self.method = b"GET"
        self.uri = original.uri
        self.requestHeaders = original.requestHeaders
        self.clientproto = b"HTTP/1.1"

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code

    def set_raw_head(self, headers: Any, has_length: bool) -> None:
        self.startedWriting = True

    def set_trailer(self, name: bytes, value: bytes) -> None:
        pass

    def setHeader(self, name: bytes, value: bytes) -> None:
        pass

    def write(self, data: bytes) -> None:
        pass

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def finish(self, tail: bytes = b"") -> None:
        self.finished = True


def _resource_key(
    site: SiteRuntime, request: Any, response: UpstreamResponse, exchange_target: bytes | None = None,
) -> Any:
    """The version of this resource, for the applicability memory (None when
    the upstream gave no validator: then nothing is remembered)."""
    etag = response.header(b"etag")
    last_modified = response.header(b"last-modified")
    if etag is None and last_modified is None:
        return None
    vary = response.header(b"vary")
    variant = b""
    if vary:
        raw = raw_header_dict(request.requestHeaders)
        names = [n.strip().lower() for n in vary.split(b",") if n.strip()]
        variant = b"\n".join(b",".join(raw.get(n, ())) for n in names)
    return ResourceKey.of_bytes(
        site.name_bytes,
        # The upstream target, not the client's URI: a URL map may point the
        # same URI at another upstream file with an equal-looking ETag.
        exchange_target or request.uri,
        etag=etag,
        last_modified=last_modified,
        length=response.length,
        variant=variant,
    )


def _head_seq(proto: bytes, code: int, message: bytes, headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The pieces of a response head (status line, header lines, blank line),
    to be joined with any body bytes into one write."""
    seq = [proto, b" %d " % code, message, b"\r\n"]
    for name, value in headers:
        seq += (name, b": ", value, b"\r\n")
    seq.append(b"\r\n")
    return seq


def _etag_suffix(digest: str) -> bytes:
    return b"-px" + digest[:8].encode("ascii")


def _derived_etag(etag: bytes, digest: str) -> bytes:
    """A validator for the rewritten bytes: the upstream's entity tag with the
    rule set's hash appended inside the quotes, weak or strong as it was, so
    a changed rule set changes every validator and the original can be
    recovered for conditional requests upstream."""
    etag = etag.strip()
    if etag.endswith(b'"') and len(etag) >= 2:
        return etag[:-1] + _etag_suffix(digest) + b'"'
    return etag


def _upstream_if_none_match(value: bytes, digest: str) -> bytes:
    """If-None-Match as the upstream knows it: derived tags of this rule set
    back to the upstream's own; other tags unchanged."""
    suffix = _etag_suffix(digest) + b'"'
    tags = []
    for tag in value.split(b","):
        tag = tag.strip()
        if tag.endswith(suffix):
            tag = tag[: -len(suffix)] + b'"'
        tags.append(tag)
    return b", ".join(tags)


class ProxyRequest(server.Request):
    """A request that spools its body with a size limit and skips
    twisted.web's default headers (the upstream's Server, Date and
    Content-Type pass through unchanged)."""

    defaultContentType = None
    _rejected = False
    _body_seen = 0
    _raw_head: list[tuple[bytes, bytes]] | None = None
    _has_length = False
    #: (target, host) for forwarding later (a coalesced waiter).
    prexy_forward: tuple[bytes, bytes | None] = (b"/", None)
    #: What quick_answer's cache lookup found (prexy.proxy.caching.Looked).
    prexy_looked: Any = None
    #: The exchange ProxyResource.quick_answer started for this request.
    prexy_early: _Exchange | None = None
    _trailer: bytes = b""
    exchange: _Exchange | None = None

    def _site_of_channel(self) -> ProxySite:
        return self.channel.site  # type: ignore[attr-defined]

    def set_raw_head(self, headers: list[tuple[bytes, bytes]], has_length: bool) -> None:
        """Use these (already validated) header pairs as the response head.

        twisted.web's Headers object normalises and re-encodes every name and
        value; for a proxied response that is most of the per-request cost,
        and the upstream parser has already rejected CR/LF in headers."""
        self._raw_head = headers
        self._has_length = has_length

    def write(self, data: bytes) -> None:
        if not self.startedWriting and self._raw_head is not None:
            if self.finished:
                raise RuntimeError("Request.write called on a request after Request.finish was called.")
            if not self._disconnected:
                self._write_raw_head(data)
            return
        _http_write(self, data)

    def _write_raw_head(self, data: bytes, end: bool = False) -> None:
        """Write the status line and headers with the first body bytes (one
        send); ``end``: they are the last ones, so the last chunk and the
        trailer go too."""
        self.startedWriting = 1
        headers = self._raw_head
        assert headers is not None
        code = self.code
        no_body = self.method == b"HEAD" or code in _NO_BODY_CODES
        if self.clientproto == b"HTTP/1.1" and not self._has_length and not no_body:
            headers.append((b"Transfer-Encoding", b"chunked"))
            self.chunked = 1
        # Connection: close, if the channel set it, comes first.
        own = [(n, v) for n, vs in self.responseHeaders.getAllRawHeaders() for v in vs]
        seq = _head_seq(self.clientproto, code, self.code_message, own + headers if own else headers)
        if no_body:
            self.write = lambda data: None  # type: ignore[method-assign]
        else:
            self.sentLength += len(data)
            if not self.chunked:
                seq.append(data)
            else:
                if data:
                    seq += (b"%x\r\n" % len(data), data, b"\r\n")
                if end:
                    seq += (b"0\r\n", self._trailer, b"\r\n")
                    self.chunked = 0  # the last chunk is written
        # One bytes object: writeSequence checks every piece separately.
        self.channel.write(b"".join(seq))

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self._site_of_channel().active_requests -= 1

    def connectionLost(self, reason: Failure) -> None:
        exchange = self.exchange
        if not self.finished:
            self._uncount()
        super().connectionLost(reason)
        if exchange is not None and not self.finished:
            exchange.client_gone(reason)

    def gotLength(self, length: int | None) -> None:
        limit = self._site_of_channel().max_request_body
        if length is not None and length > limit:
            self._reject_too_large()
            return
        if length is not None and length <= _SPOOL_IN_MEMORY:
            self.content = io.BytesIO()
        else:
            self.content = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)

    def handleContentChunk(self, data: bytes) -> None:
        if self._rejected:
            return
        self._body_seen += len(data)
        if self._body_seen > self._site_of_channel().max_request_body:
            self._reject_too_large()
            return
        content: Any = self.content
        content.write(data)

    def _reject_too_large(self) -> None:
        self._rejected = True
        self.content = io.BytesIO()
        body = b"413 Payload Too Large: request body exceeds the configured limit\n"
        transport: Any = self.channel.transport
        transport.write(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
        )
        self._site_of_channel().metrics.count("prexy_requests_total", status="413")
        self.channel.loseConnection()

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        """twisted.web's requestReceived without its argument parsing: a
        proxy forwards the target and the body as bytes, so it never fills
        ``args`` from the query (work for nothing on every request) or from
        a form body (which twisted.web reads whole into memory, and answers
        400 itself when a multipart body does not parse)."""
        if self._rejected:
            return  # already answered 413; the connection is closing
        content: Any = self.content
        content.seek(0, 0)
        self.args = {}
        self.method, self.uri = command, path
        self.clientproto = version
        self.path = path.split(b"?", 1)[0]
        self.process()

    _counted = False

    def process(self) -> None:
        site = self._site_of_channel()
        site.active_requests += 1
        self._counted = True
        self.site = site
        self.prepath = []
        self.postpath = []
        try:
            self.render(self.site.resource)
        except BaseException:
            self.processingFailed(Failure())

    def set_trailer(self, name: bytes, value: bytes) -> None:
        """A trailer field sent after the last chunk (chunked responses only)."""
        self._trailer += name + b": " + value + b"\r\n"

    def finish(self, tail: bytes = b"") -> None:
        """Finish the response; ``tail``: its last body bytes, sent in the
        same write as the last chunk and trailer (and the head, if it was
        not sent yet)."""
        if not self.finished and not self._disconnected:
            if not self.startedWriting and self._raw_head is not None:
                self._write_raw_head(tail, end=True)
            elif self._trailer and self.chunked:
                self.sentLength += len(tail)
                chunk = b"%x\r\n%s\r\n" % (len(tail), tail) if tail else b""
                self.channel.write(chunk + b"0\r\n" + self._trailer + b"\r\n")
                self.chunked = 0  # the last chunk is written
            elif tail:
                self.write(tail)
        self.exchange = None
        if self.channel is not None:
            self.channel._prexy_served = True  # type: ignore[attr-defined]
        self._site_of_channel().metrics.count_status(self.code)
        self._uncount()
        super().finish()


class _PairHeaders:
    """``getRawHeaders`` over (lower-case name, value) pairs."""

    __slots__ = ("_pairs",)

    def __init__(self, pairs: list[tuple[bytes, bytes]]) -> None:
        self._pairs = pairs

    def getRawHeaders(self, name: bytes, default: Any = None) -> Any:
        lname = name.lower()
        values = [v for n, v in self._pairs if n == lname]
        return values or default


class _QuickRecord:
    """What the access log reads from a request answered by quick_answer."""

    __slots__ = ("method", "uri", "code", "sentLength", "_peer", "requestHeaders")
    clientproto = b"HTTP/1.1"

    def __init__(
        self, method: bytes, uri: bytes, code: int, sent: int, peer: Any, pairs: list[tuple[bytes, bytes]]
    ) -> None:
        self.method = method
        self.uri = uri
        self.code = code
        self.sentLength = sent
        self._peer = peer
        self.requestHeaders = _PairHeaders(pairs)

    def getClientAddress(self) -> Any:
        return self._peer


class ProxyChannel(HTTPChannel):
    """twisted.web's HTTP/1.1 channel, with a short way for plain requests.

    When the connection is idle and the bytes that arrive are exactly one
    plain GET or HEAD head (``parse_simple_head``), the resource may answer
    it from the cache directly (``ProxyResource.quick_answer``: no Request
    object, no header tables, one write); otherwise the request is started
    from that parse (``_quick_request``) instead of twisted.web parsing it
    again line by line.  Everything else (bodies, pipelining, partial
    heads, other methods and versions) takes twisted.web's parser as before.
    """

    _prexy_served = False
    _host: Any = None
    _secure: bool | None = None
    _peer: Any = None
    site: ProxySite  # set by Site.buildProtocol

    def write(self, data: bytes) -> None:
        send_now(self.transport, data)

    def writeSequence(self, iovec: Any) -> None:
        send_now(self.transport, b"".join(iovec))

    def getHost(self) -> Any:
        # twisted.web asks for every request; the socket's address never changes.
        if self._host is None:
            self._host = super().getHost()
        return self._host

    def getPeer(self) -> Any:
        # Asked for by every request (twisted.web's Request.client); the
        # transport builds a new address object each time.
        if self._peer is None:
            self._peer = super().getPeer()
        return self._peer

    def isSecure(self) -> bool:
        # An interface lookup on every request otherwise; TLS or not is
        # decided when the connection is made.
        secure = self._secure
        if secure is None:
            secure = self._secure = super().isSecure()
        return secure

    def dataReceived(self, data: bytes) -> None:
        if (
            not self._handlingRequest
            and not self.requests
            and self.line_mode
            and not self._buffer
            and not self._busyReceiving
            and not self.paused
            and self.persistent
            and self._HTTPChannel__first_line  # type: ignore[attr-defined]
        ):
            head = parse_simple_head(data)
            if head is not None:
                self.resetTimeout()
                answered, looked, early = self.site.resource.quick_answer(self, *head)
                if not answered:
                    self._quick_request(*head, looked, early)
                return
        super().dataReceived(data)

    def _quick_request(
        self, method: bytes, target: bytes, pairs: list[tuple[bytes, bytes]], looked: Any = None,
        early: _Exchange | None = None,
    ) -> None:
        """Start a request from a head parse_simple_head accepted, leaving
        the channel as twisted.web's line parser would (lineReceived,
        headerReceived, allHeadersReceived, allContentReceived for a GET or
        HEAD without a body), without parsing it line by line again.
        ``looked`` and ``early``: what ProxyResource.quick_answer already
        did for it (a cache lookup, or the exchange it sent upstream)."""
        if INonQueuedRequestFactory.providedBy(self.requestFactory):
            request = self.requestFactory(self)
        else:
            request = self.requestFactory(self, len(self.requests))
        self.requests.append(request)
        request.prexy_looked = looked  # the cache's lookup, not done again
        request.prexy_early = early
        add = request.requestHeaders.addRawHeader
        close = False
        for name, value in pairs:
            add(name, value)
            if name == b"connection" and value.lower() == b"close":
                close = True
        request.parseCookies()
        self.persistent = not close
        if close:
            request.responseHeaders.setRawHeaders(b"Connection", [b"close"])
        request.gotLength(0)
        if self.timeOut:
            self._savedTimeOut = self.setTimeout(None)
        self._handlingRequest = True
        self.setRawMode()  # later bytes wait in _dataBuffer until requestDone
        request.requestReceived(method, target, b"HTTP/1.1")


class ProxySite(server.Site):
    """The HTTP factory for the proxy: our request class, access log in
    combined log format, request body limit."""

    requestFactory = ProxyRequest
    protocol = ProxyChannel  # type: ignore[assignment]  # no HTTP/2 wrapper: h2 is not installed
    noisy = False

    def __init__(
        self,
        resource: ProxyResource,
        max_request_body: int,
        metrics: Metrics,
        log_path: str | None = None,
        reactor: Any = None,
        timeout: float = 75.0,
    ) -> None:
        super().__init__(resource, logPath=log_path, timeout=timeout, reactor=reactor)
        self.max_request_body = max_request_body
        self.metrics = metrics
        self.active_requests = 0
        self._channels: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        self._channels[protocol] = self.reactor.seconds()
        return protocol

    def open_connections(self) -> int:
        """Client connections still open."""
        count = 0
        for wrapper in list(self._channels):
            transport = getattr(getattr(wrapper, "_channel", wrapper), "transport", None)
            if transport is not None and getattr(transport, "connected", False):
                count += 1
        return count

    def close_idle_connections(self, fresh_grace: float = 2.0) -> None:
        """Graceful shutdown: make busy connections close after their
        response, close idle keep-alive ones, and give connections accepted
        moments ago ``fresh_grace`` seconds to send their first request."""
        now = self.reactor.seconds()
        for wrapper, created in list(self._channels.items()):
            channel = getattr(wrapper, "_channel", wrapper)
            transport = getattr(channel, "transport", None)
            if transport is None:
                continue
            if getattr(channel, "requests", None):
                channel.persistent = False
            elif getattr(channel, "_prexy_served", False) or now - created >= fresh_grace:
                transport.loseConnection()
