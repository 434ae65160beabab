"""How an exchange (``prexy.proxy.forward.Exchange``) ends other than by a
completed stream, and the cache's part in each: storing the body as it goes
by, a 304 that refreshes the stored copy, a stale copy served on an
upstream error (RFC 5861), upstream failures (502/504), a body that breaks
(a 502 while the answer's head is still held, else the client is reset),
and a client that leaves while others still want the fetch (it goes on
detached, ``flow.wanted``).

Every answer Prexy makes itself here has the site's error page or a
generic body (``prexy.errorpages``); the reason, which may name the
upstream, goes to the log, one line.

:class:`Outcomes` is the half of the exchange that carries these out; the
decisions are the pure ``prexy.cache.flow`` and ``prexy.exchange``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.internet.defer import CancelledError
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from prexy.cache import flow
from prexy.exchange import Event, Lifecycle, PipelineError, State
from prexy.proxy.flight import CacheContext
from prexy.proxy.pool import PendingRequest
from prexy.proxy.request import DetachedRequest, error_answer
from prexy.proxy.routes import Forward
from prexy.proxy.upstream_api import IBodyConsumer, UpstreamError, UpstreamResponse, UpstreamTimeout
from prexy.runtime import SiteRuntime

if TYPE_CHECKING:
    from prexy.exchange import BodyPipeline
    from prexy.proxy.caching import CacheLayer
    from prexy.proxy.host import ExchangeHost

__all__ = ["Outcomes"]

log = Logger()


class Outcomes:
    """The cache and failure half of ``Exchange`` (its attributes are the
    exchange's; see there)."""

    resource: ExchangeHost
    request: Any
    site: SiteRuntime
    life: Lifecycle
    pending: PendingRequest | None
    response: UpstreamResponse | None
    ctx: CacheContext | None
    pipeline: BodyPipeline | None
    writer: Any
    keep_chunks: bool
    producer_registered: bool

    # -- the cache ---------------------------------------------------------------------

    @property
    def cache(self) -> CacheLayer:
        """The worker's cache: an exchange with a cache context has one."""
        cache = self.resource.cache
        assert cache is not None
        return cache

    def _cache_head(self, response: UpstreamResponse, headers: list[tuple[bytes, bytes]], rewrite: bool) -> bytes:
        """Start storing (leader of a miss, or background refresh) and return
        this response's Cache-Status."""
        ctx = self.ctx
        assert ctx is not None
        cache = self.cache
        if (ctx.flight is not None or ctx.claim_key is not None) and self.request.method == b"GET":
            length = None if rewrite else response.length
            writer, status = cache.begin_store(
                self.site, ctx, response.code, response.phrase, response.headers, headers, length
            )
            self.writer = writer
            if writer is None and ctx.flight is not None:
                # Not to be shared: each follower fetches for itself.
                for waiter, fetch in ctx.flight.not_storable():
                    self.resource.carry_out(waiter, fetch, Forward(CacheContext("miss", "not-storable")))
            return status
        return ctx.status(response.code)

    def _serve_revalidated(self, response: UpstreamResponse) -> None:
        """Upstream said our stale copy is still good (304): refresh it and
        answer the client and any waiters from it."""
        cache = self.cache
        ctx = self.ctx
        assert ctx is not None
        obj = cache.refreshed(self.site, ctx, response.headers)
        assert obj is not None  # only a stale copy is revalidated
        response.deliverBody(_Discard())
        now = self.resource.reactor.seconds()
        self.life.on(Event.ANSWERED)
        if not self.detached and not self.request.gone:
            cache.serve(self.request, obj, now, site=self.site)
        if ctx.flight is not None:
            for waiter in ctx.flight.waiting():
                if not waiter.gone and not waiter.finished:
                    cache.serve(waiter, obj, now, collapsed=True, site=self.site)
            ctx.flight.end()
        cache.finished(ctx)

    def _serve_stale(self, response: UpstreamResponse) -> None:
        """The upstream answered 500/502/503/504 for an object the cache
        holds stale, and stale-if-error (or grace) allows it: serve that
        copy, and keep it (RFC 5861 4)."""
        ctx = self.ctx
        assert ctx is not None and ctx.stale is not None
        now = self.resource.reactor.seconds()
        stale = ctx.stale
        response.deliverBody(_Discard())
        self.resource.metrics.count("prexy_cache_total", result="stale-if-error")
        self._cache_done(False)  # waiters get the stale copy too; nothing is stored
        self.life.on(Event.ANSWERED)
        self.cache.serve(self.request, stale, now, stale_reason="stale-if-error", site=self.site)

    def _cache_data(self, out: bytes) -> None:
        ctx = self.ctx
        assert ctx is not None
        writer = self.writer
        if writer is not None and not writer.write(out):
            self.writer = None
            self.keep_chunks = False
            self.cache.too_large(self.site, ctx, self.response.code if self.response else 200)
        if ctx.flight is not None:
            ctx.flight.data(out, self.keep_chunks)

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
        self.cache.finished(ctx)

    def _tap(self, data: bytes) -> None:
        """Rewritten bytes before the client's compression: for the cache."""
        if self.ctx is not None:
            self._cache_data(data)

    # -- failures ------------------------------------------------------------------------

    @property
    def head_held(self) -> bool:
        """Nothing of the client's answer was sent yet (its head is still
        being prepared, or held while its body is rewritten or compressed):
        a failure can still be answered with an error status."""
        return not self.detached and not self.request.startedWriting

    def bodyFailed(self, reason: Failure) -> None:
        if self.life.over:
            return
        self.resource.metrics.count("prexy_upstream_errors_total", kind="mid-body")
        held = self.head_held
        log.warn(
            "upstream {upstream} failed mid-body for {method} {uri}: {why}; {then}",
            upstream=str(self.site.config.upstream),
            method=self.request.method.decode("latin-1"),
            uri=self.request.uri.decode("latin-1"),
            why=reason.getErrorMessage(),
            then="answering 502 (no byte of the answer was sent)" if held else "resetting the client connection",
        )
        if held:
            self.fail_before_head(502)
        else:
            self.abort_client()

    def _pipeline_failed(self, exc: PipelineError) -> None:
        held = self.head_held
        if exc.decode:
            log.warn(
                "{uri}: {error}; {then}", uri=self.request.uri.decode("latin-1"), error=str(exc),
                then="answering 502" if held else "resetting the client connection",
            )
            self.resource.metrics.count(
                "prexy_decode_errors_total", coding=(exc.coding or b"").decode("ascii", "replace")
            )
        else:
            log.failure(
                "substitution failed; " + ("answering 500" if held else "aborting the response"),
                Failure(exc.__cause__ or exc),
            )
        if held:
            self.fail_before_head(502 if exc.decode else 500)
        else:
            self.abort_client()

    def fail_before_head(self, status: int) -> None:
        """The answer cannot be completed, and nothing of it was sent: the
        upstream's answer is dropped and the client gets ``status`` (or a
        stale copy, when stale-if-error allows one), on a connection that
        stays usable."""
        self._unregister()
        if self.response is not None:
            self.response.abort()
        self._answer_error(status)

    def _unregister(self) -> None:
        if self.producer_registered:
            self.producer_registered = False
            if self.request.channel is not None:
                self.request.unregisterProducer()

    def abort_client(self) -> None:
        """Reset the client connection: its answer cannot be completed."""
        self._unregister()
        if not self.life.over:
            self.life.on(Event.RESET)
        self._cache_done(False)
        if self.response is not None:
            self.response.abort()
        self.request.abort()

    def upstream_failed(self, reason: Failure) -> None:
        self.pending = None
        if self.life.over or reason.check(CancelledError):
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
        log.warn(
            "{status} for {method} {uri}: upstream {upstream}: {why}",
            status=status,
            method=request.method.decode("latin-1"),
            uri=request.uri.decode("latin-1"),
            upstream=str(self.site.config.upstream),
            why=reason.getErrorMessage(),
        )
        self._answer_error(status)

    def _answer_error(self, status: int) -> None:
        """Answer ``status`` (with the site's page, else a generic body), or
        the stale copy when stale-if-error allows it; waiters get the
        same."""
        request = self.request
        ctx = self.ctx
        if ctx is not None:
            stale = ctx.stale
            self._cache_done(False)  # waiters get the stale copy or an error too
            now = self.resource.reactor.seconds()
            if stale is not None and stale.stale_usable_on_error(now):
                self.life.on(Event.ANSWERED)
                if not self.detached:
                    request.reset_head()
                self.cache.serve(request, stale, now, stale_reason="stale-if-error", site=self.site)
                return
        self.life.on(Event.ANSWERED)
        error_answer(request, status, self.site.config.error_pages, self.site)

    def internal_error(self, reason: Failure) -> None:
        log.failure("internal error while proxying", reason)
        if self.life.over:
            return
        if self.head_held:
            try:
                self.fail_before_head(500)
                return
            except Exception:
                log.failure("internal error while answering 500", Failure())
        self.abort_client()

    # -- a client that leaves --------------------------------------------------------------

    def client_gone(self, reason: Failure | None = None) -> None:
        """The client disconnected before the response was complete: the
        fetch goes on without it while others want it (``flow.wanted``),
        else it is cancelled."""
        if self.life.over or self.detached:
            return
        self.producer_registered = False
        ctx = self.ctx
        wanted = flow.Wanted.NOBODY if ctx is None else ctx.wanted(self.response is not None, self.writer is not None)
        if ctx is None or wanted is flow.Wanted.NOBODY:
            self._cancel()
            return
        self.life.on(Event.CLIENT_LEFT)
        self.request.exchange = None
        self.request = DetachedRequest(self.request)
        if self.response is not None and self.life.state is State.STREAMING:
            self.response.producer.resumeProducing()  # the gone client's pause
        if ctx.flight is not None:
            ctx.flight.on_leave = self._unwanted
        self.resource.metrics.count("prexy_cache_fetch_without_client_total", wanted=wanted.value)

    @property
    def detached(self) -> bool:
        """No client of its own: a background refresh, or a fetch that went
        on after its client left."""
        return self.life.detached

    def _unwanted(self) -> bool:
        """Cancel a fetch without a client once nobody wants it; True when
        it is over."""
        ctx = self.ctx
        if self.life.over or ctx is None or not self.detached:
            return self.life.over
        if ctx.wanted(self.response is not None, self.writer is not None) is flow.Wanted.NOBODY:
            self._cancel()
        return self.life.over

    def _cancel(self) -> None:
        """Stop the upstream request: nobody wants its answer."""
        streaming = self.life.state is State.STREAMING  # DRAINING: the upstream is done
        self.life.on(Event.UNWANTED)
        self.producer_registered = False
        self._cache_done(False)
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.cancel()
        elif self.response is not None and streaming:
            self.response.abort()


@implementer(IBodyConsumer)
class _Discard:
    """A body consumer that drops what it gets (a 304 after revalidation)."""

    def bodyData(self, data: bytes) -> None:
        pass

    def bodyDone(self) -> None:
        pass

    def bodyFailed(self, reason: Failure) -> None:
        pass
