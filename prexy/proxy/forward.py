"""One forwarded request on Twisted: the upstream's answer carried to the
client through the body pipeline, with backpressure both ways.

The decisions are the pure ``prexy.exchange`` (states, header rules,
validators, Server-Timing, the pipeline); this module feeds it the upstream
response's events and carries out what it decides on the twisted.web
request.  Rewriting is cooperative: every response being rewritten is a
task of one ``task.Cooperator`` per process (``Rewriting``), so light
requests never queue behind a heavy rewrite.

How an exchange ends other than by a completed stream is here too: an
upstream failure (502/504), a body that breaks (a 502 while the answer's
head is still held, else the client is reset), a client that leaves while
others still want the fetch (it goes on detached, ``flow.wanted``).  Every
answer Prexy makes itself has the site's error page or a generic body
(``prexy.errorpages``); the reason, which may name the upstream, goes to
the log, one line.  The cache's part of an exchange (storing the body, its
followers, a 304 refresh) is :class:`prexy.proxy.storing.Storing`.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import CancelledError
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from prexy.cache import flow
from prexy.cache.ranges import Cut
from prexy.codec import decoder_for, encoder_for
from prexy.exchange import (
    FIRST_SLICE,
    Backlog,
    BodyPipeline,
    Event,
    HeadPlan,
    Lifecycle,
    Mode,
    PipelineError,
    State,
    passes_as_it_came,
    plan_head,
    plan_passed,
    resource_key,
    rewrite_timing,
    server_timing,
    whole_limit,
)
from prexy.proxy.client import IClient
from prexy.proxy.delivery import deliver_head
from prexy.proxy.flight import CacheContext
from prexy.proxy.headers import raw_header_dict
from prexy.proxy.host import ExchangeHost
from prexy.proxy.pool import PendingRequest
from prexy.proxy.request import DetachedRequest, error_answer, request_vars
from prexy.proxy.routes import Forward
from prexy.proxy.storing import Storing
from prexy.proxy.tunnel import Tunnel
from prexy.proxy.upstream_api import IBodyConsumer, UpstreamError, UpstreamResponse, UpstreamTimeout
from prexy.runtime import SiteRuntime
from prexy.substitution.applicability import ResourceKey
from prexy.substitution.transducer import Transducer
from prexy.upgrade import tunnel_head

log = Logger()

# What each answer reads, as globals: Python 3.11 reads a member off an
# Enum class through EnumType's __getattr__ hook, about 100 ns a read
# against 10 for a global (timeit).
_TUNNEL, _REFRESH, _STALE, _RANGE, _NO_BODY = Mode.TUNNEL, Mode.REFRESH, Mode.STALE, Mode.RANGE, Mode.NO_BODY
_WHOLE_FIRST, _HEAD_FIRST = Mode.WHOLE_FIRST, Mode.HEAD_FIRST
_ON_HEAD, _ON_COMPLETE = Event.HEAD, Event.COMPLETE

@implementer(IBodyConsumer)
class Exchange:
    """One forwarded request, from the upstream's head to the last byte.

    Also the upstream body's consumer (``bodyData``, ``bodyDone``,
    ``bodyFailed``).  What most exchanges never set (a cache's part, a
    pipeline, a range) is a class default, not stored per exchange."""

    pending: PendingRequest | None = None
    response: UpstreamResponse | None = None
    #: The cache's part while the exchange has one (a cache context).
    storing: Storing | None = None
    upstream_target: bytes | None = None
    pipeline: BodyPipeline | None = None
    #: What plan_head decided on the upstream's head.
    plan: HeadPlan | None = None
    task: Any = None
    #: The transducer's last output, sent with the end of the response.
    stash = b""
    resource_key: ResourceKey | None = None
    rules_run = 0
    producer_registered = False
    #: The cache gets the body before it is compressed for the client.
    tapped = False
    #: The client's range of a miss, cut from the body as it streams.
    cut: Cut | None = None

    def __init__(
        self, resource: ExchangeHost, request: IClient, site: SiteRuntime, started: float,
        ctx: CacheContext | None = None,
    ) -> None:
        self.resource = resource
        self.request = request
        self.site = site
        self.started = started
        self.life = Lifecycle(detached=request.detached)
        if ctx is not None and resource.cache is not None:
            self.storing = Storing(resource.cache, site, ctx)

    _backlog: Backlog | None = None

    @property
    def backlog(self) -> Backlog:
        """What has arrived of the body and waits to be rewritten or
        compressed: made when first asked for (an answer passed as it
        comes never has one)."""
        backlog = self._backlog
        if backlog is None:
            backlog = self._backlog = Backlog()
        return backlog

    # -- the upstream head -------------------------------------------------------

    def on_head(self, response: UpstreamResponse) -> None:
        channel = self.request.channel  # what is written meanwhile leaves in one send
        if channel is not None:
            channel.hold_writes()
        try:
            self.response_head(response)
        except Exception:
            self.internal_error(Failure())
        finally:
            if channel is not None:
                channel.release_writes()

    def response_head(self, response: UpstreamResponse) -> None:
        """Carry out ``plan_head``'s decisions on the upstream's head."""
        self.pending = None
        request = self.request
        if self.life.over:
            response.abort()
            return
        self.response = response
        resource = self.resource
        site = self.site
        ctx = self.ctx
        if ctx is not None and ctx.invalidate is not None and response.code != 101:
            assert self.storing is not None
            self.storing.cache.answered(site, ctx, response.code, response.headers)
        method = request.method
        body_in_hand = response.body_in_hand
        plan = self.plan = self._plan(response)
        mode = plan.mode
        if mode is _TUNNEL:  # asked for (else the reader made it a 502)
            self._open_tunnel(response)
            return
        if mode is _REFRESH:
            self._serve_revalidated(response)
            return
        if mode is _STALE:
            self._serve_stale(response)
            return
        if plan.unknown_coding is not None:
            resource.coding_not_decoded(site, plan.unknown_coding, request.uri)
        transducer = None
        whole: bytes | None = None
        after_head: bytes | None = None
        if plan.rewrite or plan.coding.coding is not None:
            # The body goes through the pipeline: rewritten, compressed, or both.
            started = self._start_pipeline(plan, response)
            if started is None:
                return  # the rewrite failed: the client got a 5xx
            transducer, whole, after_head = started
        if self.pipeline is None and body_in_hand and self.storing is None and mode is not _RANGE:
            # Passed as it came, and all of it is here (or there is none):
            # the answer is written and finished at once, not streamed
            # through bodyData and bodyDone.
            whole = response.take_body()
            if whole is not None:
                resource.metrics.bytes_in += len(whole)
                request.bytes_in = len(whole)
        cache_status = None
        if self.storing is not None:
            assert plan.stored is not None
            cache_status, refetch = self.storing.begin(method, response, plan.stored, plan.rewrite)
            for waiter, fetch in refetch:
                # Not to be shared: each follower fetches for itself.
                resource.carry_out(waiter, fetch, Forward(CacheContext("miss", "not-storable")))
        upstream_time = response.connect_seconds + response.first_byte_seconds
        request.upstream_seconds = upstream_time
        own = resource.reactor.seconds() - self.started - upstream_time
        extra = plan.timing_extra
        if whole is not None and transducer is not None:
            own -= transducer.scan_seconds  # reported as rewrite;dur
            extra = rewrite_timing(transducer, self.rules_run)
        if plan.span is not None:
            self.cut = Cut(plan.span)
        deliver_head(
            request, plan.code, plan.phrase, plan.headers,
            via=response.values(b"via") if b"via" in response.lnames else (),
            cache_status=cache_status,
            timing=server_timing(response.connect_seconds, response.first_byte_seconds, own, extra),
            site=self.site,
        )
        resource.metrics.observe_upstream(upstream_time)
        if after_head is not None:
            request.write(b"")  # the head, alone: the client reads it during the rewrite
            channel = request.channel
            if channel is not None:
                channel.flush_writes()
            whole = self._feed(after_head, True)
            if whole is None:
                return  # the rewrite failed: the client was reset
        if whole is not None:
            resource.metrics.bytes_out += len(whole)
            self.stash = whole
            self._complete()
            return
        self.life.on(_ON_HEAD)
        if mode is _NO_BODY:
            response.deliverBody(self)  # nothing to stream: finishes at once
            return
        if self.pipeline is not None:
            self.backlog.expect = response.length
        if not body_in_hand:
            if self._unwanted():
                return
            request.registerProducer(_ClientProducer(self, response.producer), True)
            self.producer_registered = True
        response.deliverBody(self)

    def _plan(self, response: UpstreamResponse) -> HeadPlan:
        """What to do with the upstream's head (``plan_passed`` where it
        applies, else ``plan_head``)."""
        request, resource, site, ctx = self.request, self.resource, self.site, self.ctx
        rules = site.rules
        method = request.method
        trailers = request.trailers
        whole_max = 0
        if rules is not None:
            self.backlog.slice = resource.slices.get(rules.digest, FIRST_SLICE)
            if not resource.rewriting.busy:
                whole_max = whole_limit(self.backlog.slice)
        body_in_hand = response.body_in_hand
        accept_encoding = request.requestHeaders.getRawHeaders(b"accept-encoding")
        if passes_as_it_came(rules, ctx is not None, site.targeted, site.header_names, response.lnames):
            return plan_passed(
                response, method=method, accept_encoding=accept_encoding, compression=site.config.compression,
            )
        return plan_head(
            response,
            method=method,
            trailers=trailers,
            accept_encoding=accept_encoding,
            rules=rules,
            compression=site.config.compression,
            applicable=self._applicable,
            cached=ctx is not None,
            revalidating=ctx is not None and ctx.revalidating,
            stale_usable=self._stale_usable,
            whole_max=whole_max,
            body_in_hand=body_in_hand,
            range_pairs=ctx.pairs if ctx is not None else (),
            targeted=site.targeted,
            header_names=site.header_names,
            rewrite_headers=self._rewrite_headers,
            rules_count=len(rules.rules) if rules is not None else 0,
        )

    def _start_pipeline(
        self, plan: HeadPlan, response: UpstreamResponse,
    ) -> tuple[Transducer | None, bytes | None, bytes | None] | None:
        """Set up the body's pipeline (rewrite, compression) the plan asks
        for: its transducer, and the whole body done now when it came with
        the head (``whole``), or to be done after the head leaves
        (``after_head``); None if that rewrite failed (the client got a
        5xx)."""
        resource, site, mode = self.resource, self.site, plan.mode
        rules = site.rules
        transducer = None
        whole: bytes | None = None
        after_head: bytes | None = None
        if plan.skipped and rules is not None:
            resource.metrics.count("prexy_rewrite_skipped_total")
            # The rules apply, and none can match: a response of theirs all the same.
            resource.observer.rewritten(site.name, rules, None, resource.reactor.seconds())
        self.rules_run = plan.rules_run
        out_coding = plan.coding.coding
        encoder = None
        if plan.encodes and out_coding is not None:
            encoder = encoder_for(out_coding, site.config.compression.level(out_coding))
        tap = self._tap if plan.tap else None
        self.tapped = tap is not None
        if plan.transduce and rules is not None:
            transducer = Transducer(rules, only=plan.only)
        if mode is _WHOLE_FIRST or mode is _HEAD_FIRST:
            # The whole body came with the head and is a millisecond of
            # work at most: it is rewritten in one piece, not in slices.
            # Where the answer can end with trailers, the head leaves
            # first and the client reads it while the body is rewritten;
            # elsewhere the rewrite comes first and its time goes in the
            # head (measured side by side: bench/README.md).
            body = response.take_body()
            if body is not None:
                resource.metrics.bytes_in += len(body)
                self.request.bytes_in = len(body)
                self.pipeline = BodyPipeline(transducer, None, encoder)
                if mode is _HEAD_FIRST:
                    after_head = body
                else:
                    whole = self._feed(body, True)
                    if whole is None:
                        return None  # the rewrite failed: the client got a 5xx
        if transducer is not None and self.pipeline is None:
            decoder = decoder_for(plan.codings) if plan.decode else None
            self.pipeline = BodyPipeline(transducer, decoder, encoder, tap)
        elif encoder is not None and transducer is None:
            self.pipeline = BodyPipeline(None, None, encoder, tap)
        return transducer, whole, after_head

    def _applicable(self) -> Any:
        """The rules to run on this version of the resource (None: all),
        from the applicability memory."""
        request = self.request
        rules = self.site.rules
        assert self.response is not None and rules is not None  # asked only when the site rewrites
        self.resource_key = resource_key(
            self.site.name_bytes, self.response, self.upstream_target or request.uri,
            lambda: raw_header_dict(request.requestHeaders),
        )
        return self.resource.applicability.rules_for(rules, self.resource_key)

    def _stale_usable(self) -> bool:
        """A stale copy may answer this upstream error (RFC 5861 4)."""
        ctx = self.ctx
        return (
            ctx is not None and ctx.stale is not None
            and ctx.stale.stale_usable_on_error(self.resource.reactor.seconds())
        )

    def on_interim(self, interim: Any) -> None:
        """A 103 Early Hints (or another 1xx) before the response: passed on
        to an HTTP/1.1 or HTTP/2 client that has nothing of its answer yet, after the
        header rules; never to a background fetch nor to followers, never
        cached."""
        request = self.request
        if self.life.over or not request.interim or request.startedWriting:
            return
        headers = interim.headers
        names = self.site.header_names
        if names and not names.isdisjoint(n.lower() for n, _ in headers):
            headers = self._rewrite_headers(headers)
        request.write_interim(interim.code, interim.phrase, headers)
        self.resource.metrics.count("prexy_interim_responses_total", status=str(interim.code))

    def _rewrite_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The site's header rules (proxy_redirect, proxy_cookie_*,
        replace_filter_headers) on a response head, before the cache sees it."""
        site = self.site
        rules = site.rules
        substitute = None
        if rules is not None and site.header_rules.filter_headers:
            substitute = lambda value: Transducer(rules).finish(value)  # noqa: E731
        return site.header_rules.apply(headers, request_vars(self.request, site), substitute)

    def _open_tunnel(self, response: UpstreamResponse) -> None:
        """The upstream switched protocols: splice the client's connection
        and the upstream's (``prexy.proxy.tunnel``)."""
        request = self.request
        self.life.on(Event.ANSWERED)
        channel = request.channel if request.tunnel else None
        if channel is None or request.gone:
            response.abort()
            return
        request.exchange = None
        resource = self.resource
        request.setResponseCode(101)
        tunnel = Tunnel(
            resource.reactor, request.proxy_site.timeouts.tunnel_idle,
            lambda t: resource.tunnel_closed(request, channel, t),
        )
        upgrade = response.values(b"upgrade")
        early = channel.start_tunnel(
            tunnel, tunnel_head(response.phrase, response.headers, upgrade[0] if upgrade else None)
        )
        first = response.tunnel(tunnel)
        resource.metrics.count("prexy_tunnels_total")
        tunnel.attach(channel, response.tunnel_side(), first, early)

    def _out(self, data: bytes) -> None:
        """Body bytes for the client (and the cache, unless it gets them
        before they are compressed: ``_tap``)."""
        self.resource.metrics.bytes_out += len(data)
        if self.storing is not None and not self.tapped:
            self.storing.data(data, self._code)

    # -- the body ------------------------------------------------------------------------

    def bodyData(self, data: bytes) -> None:
        if self.life.over or (self.storing is not None and self.storing.writer is None and self._unwanted()):
            return
        self.resource.metrics.bytes_in += len(data)
        self.request.bytes_in += len(data)
        if self.pipeline is None:
            self._out(data)
            cut = self.cut
            # A range of a miss: the cache gets every byte, the client its part.
            part = data if cut is None else cut.take(data)
            if part:
                self.request.write(part)
            return
        if self.backlog.add(data) and self.response is not None:
            self.response.pause_for_work()
        if self.task is None:
            self.resource.rewriting.start(self)

    def slices(self) -> Any:
        """The rewriting task: one slice of what has arrived per step."""
        while self.backlog and not self.life.over:
            self._work_one()
            yield None

    def _work_one(self) -> None:
        pipeline = self.pipeline
        assert pipeline is not None
        # The last piece ends the pipeline with its data.
        data, last = self.backlog.take(self.life.state is State.DRAINING)
        out = self._feed(data, last)
        if out is None:
            self.backlog.clear()
            return  # failed: answered or reset (``_pipeline_failed``)
        if out:
            self._out(out)
            if pipeline.ended:
                self.stash = out  # the body's last output: sent with the end
            else:
                self.request.write(out)

    def _feed(self, data: bytes, last: bool) -> bytes | None:
        """One slice through the pipeline, timed to size the next one; None
        when it failed (the client got a 5xx, or is reset once the head
        went out)."""
        pipeline = self.pipeline
        assert pipeline is not None
        timer = self.resource.rewriting.timer
        began = timer()
        try:
            out = pipeline.feed(data, last)
        except PipelineError as exc:
            self._pipeline_failed(exc)
            return None
        size = self.backlog.measured(len(data), timer() - began)
        if size is not None:
            if self.site.rules is not None:
                self.resource.slices[self.site.rules.digest] = size
        return out

    def work_drained(self) -> None:
        """The rewriting task ended: everything received so far is rewritten."""
        self.task = None
        if self.backlog.resume() and self.response is not None:
            self.response.resume_after_work()
        if self.life.state is State.DRAINING:
            self._complete()

    def bodyDone(self) -> None:
        if self.life.over:
            return
        if self.task is not None:
            self.life.on(Event.BODY_END)
        else:
            self._complete()

    def _complete(self) -> None:
        """Finish the response (the rewrite's Server-Timing in a trailer
        where the plan puts it there)."""
        request = self.request
        pipeline = self.pipeline
        tail, self.stash = self.stash, b""
        if pipeline is not None:
            try:
                end = pipeline.finish()
            except PipelineError as exc:
                self._pipeline_failed(exc)
                return
            for coding, size in pipeline.trailing_garbage():
                self.resource.trailing_garbage(self.site, coding, size, request.uri)
            if end:
                self._out(end)
                if self.life.over:
                    return  # the last follower left with it, and nothing is stored
            tail += end
            transducer = pipeline.transducer
            resource = self.resource
            metrics = resource.metrics
            if transducer is not None:
                request.rewrite = transducer
                resource.observer.rewritten(self.site.name, transducer.ruleset, transducer, resource.reactor.seconds())
                if transducer.bailed_out:
                    metrics.count("prexy_rewrite_bailouts_total")
                if transducer.timed_out:
                    metrics.count("prexy_rewrite_timeouts_total")
                if self.plan is not None and self.plan.timing_in_trailer:
                    request.add_trailer(b"Server-Timing", rewrite_timing(transducer, self.rules_run))
        self._unregister()
        self.life.on(_ON_COMPLETE)
        self._cache_done(True)
        request.finish(tail)
        # After the last bytes left: the client does not wait for this.
        if pipeline is not None and pipeline.transducer is not None and self.site.rules is not None:
            self.resource.applicability.record(self.site.rules, self.resource_key, pipeline.transducer)

    # -- the cache's part ---------------------------------------------------------------

    @property
    def ctx(self) -> CacheContext | None:
        """What the cache decided for the request, while its part lasts."""
        return self.storing.ctx if self.storing is not None else None

    @property
    def _code(self) -> int:
        return self.response.code if self.response is not None else 200

    def _tap(self, data: bytes) -> None:
        """Rewritten bytes before the client's compression: for the cache."""
        if self.storing is not None:
            self.storing.data(data, self._code)

    def _cache_done(self, ok: bool) -> None:
        storing, self.storing = self.storing, None
        if storing is not None:
            storing.done(ok)

    def _serve_revalidated(self, response: UpstreamResponse) -> None:
        """Upstream said our stale copy is still good (304): refresh it and
        answer the client and any waiters from it."""
        storing, self.storing = self.storing, None
        assert storing is not None
        response.deliverBody(_Discard())
        self.life.on(Event.ANSWERED)
        client = None if self.detached or self.request.gone else self.request
        storing.refreshed(client, response.headers, self.resource.reactor.seconds())

    def _serve_stale(self, response: UpstreamResponse) -> None:
        """The upstream answered 500/502/503/504 for an object the cache
        holds stale, and stale-if-error (or grace) allows it: serve that
        copy, and keep it (RFC 5861 4)."""
        storing = self.storing
        assert storing is not None and storing.ctx.stale is not None
        stale = storing.ctx.stale
        response.deliverBody(_Discard())
        self.resource.metrics.count_cache("stale-if-error")
        self.request.cache_status = "stale-if-error"
        self._cache_done(False)  # waiters get the stale copy too; nothing is stored
        self.life.on(Event.ANSWERED)
        storing.cache.serve(self.request, stale, self.resource.reactor.seconds(), stale_reason="stale-if-error",
                            site=self.site)

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
        storing = self.storing
        if storing is not None:
            stale = storing.ctx.stale
            self._cache_done(False)  # waiters get the stale copy or an error too
            now = self.resource.reactor.seconds()
            if stale is not None and stale.stale_usable_on_error(now):
                self.life.on(Event.ANSWERED)
                if not self.detached:
                    request.reset_head()
                storing.cache.serve(request, stale, now, stale_reason="stale-if-error", site=self.site)
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
        storing = self.storing
        wanted = flow.Wanted.NOBODY if storing is None else storing.wanted(self.response is not None)
        if storing is None or wanted is flow.Wanted.NOBODY:
            self._cancel()
            return
        self.life.on(Event.CLIENT_LEFT)
        self.request.exchange = None
        self.request = DetachedRequest(self.request)
        if self.response is not None and self.life.state is State.STREAMING:
            self.response.producer.resumeProducing()  # the gone client's pause
        if storing.ctx.flight is not None:
            storing.ctx.flight.on_leave = self._unwanted
        self.resource.metrics.count("prexy_cache_fetch_without_client_total", wanted=wanted.value)

    @property
    def detached(self) -> bool:
        """No client of its own: a background refresh, or a fetch that went
        on after its client left."""
        return self.life.detached

    def _unwanted(self) -> bool:
        """Cancel a fetch without a client once nobody wants it; True when
        it is over."""
        storing = self.storing
        if self.life.over or storing is None or not self.detached:
            return self.life.over
        if storing.wanted(self.response is not None) is flow.Wanted.NOBODY:
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


@implementer(IPushProducer)
class _ClientProducer:
    """What the client's connection pauses and resumes: the upstream socket,
    while the body comes from it (once it ended, the connection may serve
    another request).  Its end is the client going away, for the exchange
    to decide on, not an abort of a fetch that others may still want."""

    def __init__(self, exchange: Exchange, upstream: IPushProducer) -> None:
        self.exchange = exchange
        self.upstream = upstream

    def pauseProducing(self) -> None:
        if self.exchange.life.state is State.STREAMING:
            self.upstream.pauseProducing()

    def resumeProducing(self) -> None:
        if self.exchange.life.state is State.STREAMING:
            self.upstream.resumeProducing()

    def stopProducing(self) -> None:
        self.exchange.client_gone()


@implementer(IBodyConsumer)
class _Discard:
    """A body consumer that drops what it gets (a 304 after revalidation)."""

    def bodyData(self, data: bytes) -> None:
        pass

    def bodyDone(self) -> None:
        pass

    def bodyFailed(self, reason: Failure) -> None:
        pass
