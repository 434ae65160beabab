"""The reverse-proxy resource: one client request -> one upstream exchange.

``ProxyResource.render`` routes a request: the site's URL map (a redirect,
or a rewritten target), an upgrade (WebSocket) straight upstream, its cache
(a hit, a coalesced miss, PURGE), else the upstream.  The response body streams chunk by chunk through the
exchange (``prexy.proxy.forward``), with the upstream socket registered as
a streaming producer on the client request, so a slow client pauses the
upstream instead of filling memory.  Failures are mapped the way users of
nginx expect: 502 when the upstream cannot be reached, answers garbage or
dies before any byte of the answer was sent, 504 on a timeout, and a reset
client connection when the upstream dies later in the body (never a clean
end).  Those answers, and every other one Prexy makes itself, carry the
site's error page or a generic body (``prexy.errorpages``), never the
reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO, Any

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.resource import Resource

from prexy.cache.memo import MEMO_SIZE, Memos
from prexy.codec import coding_label
from prexy.exchange import Revalidation, upstream_request_headers
from prexy.fetch import Fetch
from prexy.metrics import Metrics
from prexy.observe.stats import Observer
from prexy.proxy.caching import CacheLayer
from prexy.proxy.client import IClient
from prexy.proxy.flight import CacheContext
from prexy.proxy.forward import Exchange
from prexy.proxy.headers import raw_header_dict
from prexy.proxy.pool import IUpstreamPool
from prexy.proxy.request import (
    DetachedRequest,
    ProxyRequest,
    error_answer,
    plain_answer,
    request_vars,
)
from prexy.proxy.rewriting import Rewriting
from prexy.proxy.routes import Answered, CacheRoute, Forward, Refresh
from prexy.proxy.site import ProxySite
from prexy.proxy.tunnel import Tunnel
from prexy.runtime import Runtime, SiteRuntime
from prexy.substitution.applicability import DEFAULT_BYTES as APPLICABILITY_BYTES
from prexy.substitution.applicability import ApplicabilityMemory
from prexy.upgrade import upgrade_headers, upgrade_request

__all__ = ["ProxyRequest", "ProxyResource", "ProxySite"]

#: Host values whose site a process remembers (``ProxyResource.site_for``:
#: a node with thousands of sites sees thousands); past them the memo
#: starts afresh, so a client inventing names costs a lookup each, never
#: memory (about 100 bytes an entry).
SITE_MEMO = 4096
#: Distinct coding labels of prexy_unknown_coding_total: past them, an
#: upstream inventing codings is counted as "other" (and logged once).
UNKNOWN_CODING_LABELS = 64

log = Logger()


class ProxyResource(Resource):
    """Forwards every request to its site's upstream.

    ``timer``: the clock that times rewriting (slice sizes, the work budget
    per reactor turn); the reactor's clock when not given."""

    isLeaf = True

    def __init__(
        self, reactor: Any, pool: IUpstreamPool, runtime: Runtime, metrics: Metrics, cache: CacheLayer | None = None,
        timer: Callable[[], float] | None = None, observer: Observer | None = None,
        memos: Memos | None = None, applicability_memory: int = APPLICABILITY_BYTES,
    ) -> None:
        super().__init__()
        self.reactor = reactor
        self.pool = pool
        self.runtime = runtime
        self.metrics = metrics
        #: Per-site and per-rule counters, and the live log (prexy.observe).
        self.observer = observer if observer is not None else Observer()
        #: The worker's cache when a cache store is configured.
        self.cache = cache
        #: The ACME challenge answers (prexy.acme.challenges.ChallengeRegistry)
        #: when HTTP-01 is answered here; None: no [acme].
        self.challenges: Any = None
        #: What this process keeps of what it decoded or made from the cache
        #: store (``[cache] memo_size``): the store's objects, the compressed
        #: variants and the hit path's answers draw on it.
        self.memos = memos if memos is not None else Memos(MEMO_SIZE)
        #: Which rules ever matched each resource version (``[server]
        #: applicability_memory`` bytes).
        self.applicability = ApplicabilityMemory(max_bytes=applicability_memory)
        self.rewriting = Rewriting(reactor, timer or reactor.seconds)
        #: Rule set digest -> the slice size that took about SLICE_SECONDS
        #: last time, so a response's first slice is already the right size.
        self.slices: dict[str, int] = {}
        #: (site, coding label) pairs whose undecodable bodies were logged.
        self.unknown_codings: set[tuple[str, str]] = set()
        #: Sites whose upstream bodies' trailing garbage was logged.
        self.garbage_sites: set[str] = set()
        self._coding_labels: set[str] = set()
        #: Host value -> its site, for ``runtime`` (a reload replaces it).
        self._sites: dict[bytes | None, SiteRuntime] = {}
        self._sites_of: Runtime | None = None

    def site_for(self, host: bytes | None) -> SiteRuntime:
        """The site a Host value selects (``Runtime.select``), looked up
        once per value: the lookup decodes, lower-cases and splits the
        value, the same few values on every request."""
        runtime = self.runtime
        sites = self._sites
        if self._sites_of is not runtime:
            sites.clear()
            self._sites_of = runtime
        site = sites.get(host)
        if site is None:
            site = runtime.select(host)  # (compiles its rules the first time: they stay so)
            if len(sites) >= SITE_MEMO:
                sites.clear()
            sites[host] = site
        return site

    def coding_not_decoded(self, site: SiteRuntime, coding: bytes, uri: bytes) -> None:
        """A response the site's rules would rewrite came in a coding the
        proxy cannot decode and passes untouched: counted every time, logged
        once per site and coding."""
        label = coding_label(coding)
        if label not in self._coding_labels:
            if len(self._coding_labels) >= UNKNOWN_CODING_LABELS:
                label = "other"
            self._coding_labels.add(label)
        self.metrics.count("prexy_unknown_coding_total", coding=label)
        key = (site.name, label)
        if key in self.unknown_codings:
            return
        self.unknown_codings.add(key)
        log.warn(
            "site {site}: content coding {coding!r} cannot be decoded, so its bodies pass unrewritten"
            " (first seen on {uri}; counted in prexy_unknown_coding_total, not logged again)",
            site=site.name, coding=coding.decode("latin-1"), uri=uri.decode("latin-1"),
        )

    def trailing_garbage(self, site: SiteRuntime, coding: bytes, size: int, uri: bytes) -> None:
        """An upstream body had ``size`` bytes after the end of its
        ``coding`` stream, ignored (the body before them decoded whole and
        was served): counted every time, logged once per site."""
        self.metrics.count("prexy_decode_trailing_garbage_total", coding=coding_label(coding))
        if site.name in self.garbage_sites:
            return
        self.garbage_sites.add(site.name)
        log.warn(
            "site {site}: {size} byte(s) of garbage after the end of a {coding} body ignored, as gzip -d and"
            " browsers do (first seen on {uri}; counted in prexy_decode_trailing_garbage_total, not logged again)",
            site=site.name, size=size, coding=coding.decode("latin-1"), uri=uri.decode("latin-1"),
        )

    def render(self, request: ProxyRequest) -> Any:
        if self.challenges is not None and request.path.startswith(b"/.well-known/acme-challenge/"):
            # The CA's HTTP-01 validation: answered before any site's
            # routing, map or cache (RFC 8555, 8.3).
            from prexy.acme.web import http01_response

            found = http01_response(self.challenges, request.path)
            if found is not None:
                request.setHeader(b"Cache-Control", b"no-store")
                plain_answer(request, *found)
                return server.NOT_DONE_YET
        raw = raw_header_dict(request.requestHeaders)
        host_values = raw.get(b"host")
        host = host_values[0] if host_values else None
        site = self.site_for(host)
        request.site_name = site.name
        target = _origin_form(request.uri)
        if target is None:
            error_answer(request, 400, site.config.error_pages, site)
            return server.NOT_DONE_YET
        client_target = target
        if request.method == b"TRACE" and not site.config.allow_trace:
            # TRACE echoes the request, credentials included (nginx: 405).
            error_answer(request, 405, site.config.error_pages, site)
            return server.NOT_DONE_YET

        if site.urlmap is not None:
            action, result = self._apply_map(request, site, target)
            if action == "redirect":
                return result
            if action == "rewrite":
                target = result

        upgrade = None
        if site.config.upgrade and b"upgrade" in raw:
            upgrade = upgrade_request(
                raw, method=request.method, version=request.clientproto,
                has_body=request.has_body, allowed=site.config.upgrade,
            )
        client_ip = getattr(request.getClientAddress(), "host", None) or "unix"
        fetch = Fetch(
            site, request.method, target, client_target, host, raw, client_ip.encode("ascii"), request.isSecure(), upgrade
        )
        if upgrade is not None:  # a tunnel if the upstream says 101; never cached
            return self.forward(request, fetch, None)
        # A request with a body is never answered from the cache, nor does
        # its answer go into it: the body may change the answer.
        if site.cache_policy is not None and self.cache is not None:
            if request.has_body:
                # Not looked up nor stored; an unsafe method still invalidates.
                request.cache_status = "pass"
                return self.carry_out(request, fetch, self.cache.invalidating(fetch))
            return self.carry_out(request, fetch, self.cache.on_request(request, fetch))
        if request.method == b"PURGE":
            error_answer(request, 405, site.config.error_pages, site)
            return server.NOT_DONE_YET
        return self.forward(request, fetch, None)

    def carry_out(self, request: IClient, fetch: Fetch, route: CacheRoute) -> object:
        """Carry out where the cache sent ``request`` (``prexy.proxy.routes``);
        returns what ``render`` returns."""
        if isinstance(route, Forward):
            return self.forward(request, fetch, route.ctx)
        if isinstance(route, Answered):
            return route.result
        if isinstance(route, Refresh):
            # The stale copy answered the client; the fetch fills the cache only.
            self.forward(DetachedRequest(request), route.fetch, route.ctx)
            return route.result

        # Parked: carried out when the other worker's fetch is done.
        def then(later: CacheRoute | None) -> None:
            if later is not None:
                self.carry_out(request, fetch, later)

        def failed(failure: Failure) -> None:
            log.failure("internal error while proxying a request that waited for another worker", failure)
            if not request.gone and not request.startedWriting and not request.finished:
                error_answer(request, 500, fetch.site.config.error_pages, fetch.site)

        route.next.addCallback(then).addErrback(failed)
        return server.NOT_DONE_YET

    def forward(self, request: IClient, fetch: Fetch, ctx: CacheContext | None) -> object:
        """Send the request upstream and stream the answer back (or, for a
        background refresh, into the cache only)."""
        started = self.reactor.seconds()
        site = fetch.site
        rules = site.rules
        for_cache = ctx is not None and (ctx.flight is not None or ctx.claim_key is not None)
        revalidate = None
        if for_cache and ctx is not None and ctx.stale is not None:
            # Revalidate the stale copy: a 304 refreshes it without a body.
            revalidate = Revalidation(ctx.stale.header(b"etag"), ctx.stale.header(b"last-modified"))
            ctx.revalidating = revalidate.conditional
        headers = upstream_request_headers(
            fetch.raw,
            host_header=site.config.upstream_host_header(fetch.host),
            client_host=fetch.host,
            client_ip=fetch.client_ip,
            secure=fetch.secure,
            rules_digest=rules.digest if rules is not None else None,
            for_cache=for_cache,
            revalidate=revalidate,
        )
        if site.header_rules.edits.sets:  # proxy_set_header (prexy.headeredits)
            headers = site.header_rules.edits.request_headers(headers, request_vars(request, site))
        if fetch.upgrade is not None:
            headers += upgrade_headers(fetch.upgrade)
        target = fetch.upstream_target
        exchange = Exchange(self, request, site, started, ctx)
        exchange.upstream_target = target
        request.exchange = exchange
        body, body_length = _request_body(request)
        exchange.pending = self.pool.request(
            site.origin_key, fetch.method, target, headers, body, body_length,
            exchange.on_head, exchange.upstream_failed, exchange.on_interim,
        )
        return server.NOT_DONE_YET

    def tunnel_closed(self, request: IClient, channel: Any, tunnel: Tunnel) -> None:
        """A tunnel ended: count it, log its access line (status 101, the
        bytes sent to the client) and one line with its duration and bytes."""
        metrics = self.metrics
        metrics.count("prexy_tunnels_closed_total", by=tunnel.ended_by or "client")
        metrics.count("prexy_tunnel_bytes_total", tunnel.bytes_up, direction="up")
        metrics.count("prexy_tunnel_bytes_total", tunnel.bytes_down, direction="down")
        metrics.count_status(101)
        request.sentLength = tunnel.bytes_down
        site = request.proxy_site
        site.log(request)
        site.observer.answered(request, self.reactor.seconds())
        log.info(
            "tunnel {uri} closed by {by}{how} after {seconds:.1f} s: {up} bytes up, {down} bytes down",
            uri=request.uri.decode("latin-1"), by=tunnel.ended_by,
            how="" if tunnel.clean else " (reset)", seconds=tunnel.seconds,
            up=tunnel.bytes_up, down=tunnel.bytes_down,
        )

    def _apply_map(self, request: ProxyRequest, site: SiteRuntime, target: bytes) -> tuple[str, Any]:
        """Per the site's map: ("redirect", what render returns) with the
        response under way, ("rewrite", new target), or ("", b"") when no
        entry matched."""
        cfg = site.config.map
        assert cfg is not None
        urlmap = site.urlmap
        assert urlmap is not None
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
        request.setHeader(b"Location", location)
        body = b"Redirecting to " + location + b"\n"
        plain_answer(request, cfg.status, body)
        return "redirect", server.NOT_DONE_YET


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


def _request_body(request: IClient) -> tuple[IO[bytes] | None, int]:
    content = request.content
    if content is None or not request.has_body:
        return None, 0
    content.seek(0, 2)
    length = content.tell()
    content.seek(0)
    if not length:
        return None, 0
    return content, length

