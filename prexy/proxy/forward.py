"""One forwarded request on Twisted: the upstream's answer carried to the
client through the body pipeline, with backpressure both ways.

The decisions are the pure ``prexy.exchange`` (states, header rules,
validators, Server-Timing, the pipeline); this module feeds it the upstream
response's events and carries out what it decides on the twisted.web
request.  Rewriting is cooperative: every response being rewritten is a
task of one ``task.Cooperator`` per process (``Rewriting``), so light
requests never queue behind a heavy rewrite.  The cache's part and every
way an exchange ends badly are :class:`prexy.proxy.outcomes.Outcomes`, the
other half of :class:`Exchange`.
"""

from __future__ import annotations

import collections
from typing import Any

from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from prexy.cache.ranges import Cut, range_of_stream
from prexy.codec import accepts_gzip, decoder_for, encoder_for
from prexy.exchange import (
    FIRST_SLICE,
    SKIPPED_TIMING,
    BodyPipeline,
    ClientCoding,
    Lifecycle,
    PipelineError,
    State,
    choose_client_coding,
    has_own_coding,
    next_slice,
    plan_response,
    resource_key,
    rewrite_coding,
    rewrite_timing,
    server_timing,
    take_slice,
    via_value,
    whole_limit,
)
from prexy.headerrules import RequestVars
from prexy.proxy.flight import CacheContext
from prexy.proxy.headers import raw_header_dict
from prexy.proxy.outcomes import Outcomes
from prexy.proxy.pool import PendingRequest
from prexy.proxy.request import TRAILERS_OVER, start_response
from prexy.proxy.tunnel import Tunnel
from prexy.proxy.upstream_api import IBodyConsumer, UpstreamResponse
from prexy.runtime import SiteRuntime
from prexy.substitution.applicability import ResourceKey
from prexy.substitution.transducer import Transducer
from prexy.upgrade import tunnel_head

log = Logger()

#: Upstream statuses for which a stale copy is served instead (RFC 5861 4).
STALE_IF_ERROR_STATUSES = frozenset({500, 502, 503, 504})

#: A response whose rewriting is behind pauses its upstream once this many
#: bytes wait (bounded memory; no pause/resume of the socket on every turn).
BACKLOG_PAUSE = 128 * 1024


@implementer(IBodyConsumer)
class Exchange(Outcomes):
    """One forwarded request, from the upstream's head to the last byte.

    Also the upstream body's consumer (``bodyData``, ``bodyDone``,
    ``bodyFailed``)."""

    def __init__(self, resource: Any, request: Any, site: SiteRuntime, started: float) -> None:
        self.resource = resource
        self.request = request
        self.site = site
        self.started = started
        self.life = Lifecycle()
        self.pending: PendingRequest | None = None
        self.response: UpstreamResponse | None = None
        self.ctx: CacheContext | None = None
        self.upstream_target: bytes | None = None
        self.pipeline: BodyPipeline | None = None
        self.backlog: collections.deque[bytes] = collections.deque()
        self.backlog_bytes = 0
        self.task: Any = None
        self.work_paused = False
        self.slice = FIRST_SLICE
        #: Body bytes still to come when the upstream gave a length: the
        #: last piece then ends the pipeline with its data.
        self.expect: int | None = None
        #: The transducer's last output, sent with the end of the response.
        self.stash = b""
        self.resource_key: ResourceKey | None = None
        self.rules_run = 0
        self.writer: Any = None  # cache writer while the body is stored
        self.keep_chunks = True
        self.producer_registered = False
        #: The cache gets the body before it is compressed for the client.
        self.tapped = False
        #: The client's range of a miss, cut from the body as it streams.
        self.cut: Cut | None = None

    # -- the upstream head -------------------------------------------------------

    def on_head(self, response: UpstreamResponse) -> None:
        try:
            self.response_head(response)
        except Exception:
            self.internal_error(Failure())

    def response_head(self, response: UpstreamResponse) -> None:
        self.pending = None
        request = self.request
        if self.life.over:
            response.abort()
            return
        self.response = response
        if response.code == 101:  # asked for (else the reader made it a 502)
            self._open_tunnel(response)
            return
        resource = self.resource
        ctx = self.ctx
        if ctx is not None:
            if ctx.invalidate is not None:
                resource.cache.answered(self.site, ctx, response.code, response.headers)
            if ctx.revalidating and response.code == 304:
                self._serve_revalidated(response)
                return
            if ctx.stale is not None and response.code in STALE_IF_ERROR_STATUSES and self._serve_stale(response):
                return
        rules = self.site.rules
        rewrite, codings, unknown = rewrite_coding(response, rules)
        if unknown is not None:
            resource.coding_not_decoded(self.site, unknown, request.uri)
        transducer = None
        skipped = False
        if rewrite and rules is not None and request.method != b"HEAD":
            self.resource_key = resource_key(
                self.site.name_bytes, response, self.upstream_target or request.uri,
                lambda: raw_header_dict(request.requestHeaders),
            )
            only = resource.applicability.rules_for(rules, self.resource_key)
            if only is not None and not only and not codings:
                # This version of the resource matched no rule before: pass
                # it through unscanned, with its length.
                skipped = True
                resource.metrics.count("prexy_rewrite_skipped_total")
            else:
                transducer = Transducer(rules, only=only)
                self.slice = resource.slices.get(rules.digest, FIRST_SLICE)
                self.rules_run = len(rules.rules) if only is None else len(only)
        decode = rewrite and bool(codings)
        accept = request.requestHeaders.getRawHeaders(b"accept-encoding")
        if transducer is not None or skipped or (rewrite and request.method == b"HEAD"):
            # Compressed for this client in the coding it prefers; what the
            # cache stores (and followers get) stays identity, and each hit
            # gets its coding from the store (CacheLayer.serve).
            choice = choose_client_coding(
                response, method=request.method, compression=self.site.config.compression,
                accept_encoding=accept, encoded=bool(codings) and not decode,
            )
        elif not rewrite:
            # Passed through: compressed here when the upstream sent identity.
            choice = choose_client_coding(
                response, method=request.method, compression=self.site.config.compression,
                accept_encoding=accept, encoded=has_own_coding(response),
            )
        else:
            # The client's coding for a decoded body: gzip if it takes it.
            choice = ClientCoding(b"gzip" if decode and accepts_gzip(accept) else None)
        out_coding = choice.coding
        encoder = None
        if out_coding is not None and request.method != b"HEAD":
            encoder = encoder_for(out_coding, self.site.config.compression.level(out_coding))
        whole: bytes | None = None
        after_head: bytes | None = None
        if (
            transducer is not None
            and not codings
            and ctx is None
            and response.length is not None
            and 0 < response.length <= whole_limit(self.slice)
            and not resource.rewriting.busy
        ):
            # The whole body came with the head and is a millisecond of work
            # at most: it is rewritten in one piece, not in slices.  Where
            # the answer can end with trailers, the head leaves first and
            # the client reads it while the body is rewritten (a little
            # faster than the head last on the realistic 20 KB page;
            # bench/README.md); elsewhere the rewrite comes first and its
            # time goes in the head.
            body = response.take_body()
            if body is not None:
                resource.metrics.bytes_in += len(body)
                self.pipeline = BodyPipeline(transducer, None, encoder)
                if request.clientproto in TRAILERS_OVER:
                    after_head = body
                else:
                    whole = self._feed(body, True)
                    if whole is None:
                        return  # the rewrite failed: the client got a 5xx
        tap = None
        plain = transducer is None and (skipped or not rewrite)  # only compressed, if at all
        if ctx is not None and encoder is not None and (transducer is not None or plain):
            self.tapped = True
            tap = self._tap
        if transducer is not None and self.pipeline is None:
            self.pipeline = BodyPipeline(transducer, decoder_for(codings) if decode else None, encoder, tap)
        elif encoder is not None and plain:
            self.pipeline = BodyPipeline(None, None, encoder, tap)
        plan = plan_response(
            response, rules=rules, rewrite=rewrite, decode=decode, out_coding=out_coding,
            transduce=transducer is not None, skipped=skipped,
            # Trailers: HTTP/1.1 chunked ones, or an HTTP/2 stream's last HEADERS.
            timing_in_trailer=whole is None and request.clientproto in TRAILERS_OVER,
            negotiated=choice.varies,
        )
        headers = plan.headers
        targeted = self.site.targeted
        if targeted and not targeted.isdisjoint(response.lnames):
            headers = [(n, v) for n, v in headers if n.lower() not in targeted]
        names = self.site.header_names
        rewrite_headers = bool(names) and not names.isdisjoint(response.lnames)
        if rewrite_headers:
            headers = self._rewrite_headers(headers)
        if ctx is not None:
            stored = headers
            if tap is not None:  # the cache keeps the identity answer
                stored = plan_response(
                    response, rules=rules, rewrite=rewrite, decode=decode, out_coding=None,
                    transduce=transducer is not None, skipped=False, timing_in_trailer=True, negotiated=True,
                ).headers
                if targeted:
                    stored = [(n, v) for n, v in stored if n.lower() not in targeted]
                if rewrite_headers:
                    stored = self._rewrite_headers(stored)
            headers.append((b"Cache-Status", self._cache_head(response, stored, rewrite)))
        headers.append((b"Via", via_value(response)))
        upstream_time = response.connect_seconds + response.first_byte_seconds
        own = resource.reactor.seconds() - self.started - upstream_time
        extra = b""
        if skipped:
            extra = SKIPPED_TIMING
        elif whole is not None and transducer is not None:
            own -= transducer.scan_seconds  # reported as rewrite;dur
            extra = rewrite_timing(transducer, self.rules_run)
        headers.append(
            (b"Server-Timing", server_timing(response.connect_seconds, response.first_byte_seconds, own, extra))
        )
        code, phrase = response.code, response.phrase
        if (
            ctx is not None and ctx.pairs and self.pipeline is None and code == 200
            and request.method == b"GET" and response.length is not None
        ):
            # A cacheable GET with a Range: the whole object is fetched and
            # stored; its client gets its range as the body streams by.
            part = range_of_stream(ctx.pairs, response.length, response.header, headers)
            if part is not None:
                code, phrase, headers, span = part
                self.cut = Cut(span)
        start_response(request, code, phrase, headers)
        resource.metrics.observe_upstream(upstream_time)
        if after_head is not None:
            request.write(b"")  # the head, alone
            whole = self._feed(after_head, True)
            if whole is None:
                return  # the rewrite failed: the client was reset
        if whole is not None:
            resource.metrics.bytes_out += len(whole)
            self.stash = whole
            self._complete(trailer=after_head is not None)
            return
        self.life.move(State.STREAMING)
        if request.method == b"HEAD" or response.length == 0 or response.code in (204, 304):
            response.deliverBody(self)  # nothing to stream: finishes at once
            return
        if self.pipeline is not None:
            self.expect = response.length
        if not response.body_in_hand:
            if self._unwanted():
                return
            request.registerProducer(_ClientProducer(self, response.producer), True)
            self.producer_registered = True
        response.deliverBody(self)

    def on_interim(self, interim: Any) -> None:
        """A 103 Early Hints (or another 1xx) before the response: passed on
        to an HTTP/1.1 or HTTP/2 client that has nothing of its answer yet, after the
        header rules; never to a background fetch nor to followers, never
        cached."""
        request = self.request
        channel = getattr(request, "channel", None)
        if self.life.over or channel is None or request.startedWriting or request.clientproto not in TRAILERS_OVER:
            return
        headers = interim.headers
        names = self.site.header_names
        if names and not names.isdisjoint(n.lower() for n, _ in headers):
            headers = self._rewrite_headers(headers)
        channel.write_interim(interim.code, interim.phrase, headers)
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
        self.life.move(State.DONE)
        channel = getattr(request, "channel", None)
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
        if self.ctx is not None and not self.tapped:
            self._cache_data(data)

    # -- the body ------------------------------------------------------------------------

    def bodyData(self, data: bytes) -> None:
        if self.life.over or (self.writer is None and self.ctx is not None and self._unwanted()):
            return
        self.resource.metrics.bytes_in += len(data)
        if self.pipeline is None:
            self._out(data)
            cut = self.cut
            # A range of a miss: the cache gets every byte, the client its part.
            part = data if cut is None else cut.take(data)
            if part:
                self.request.write(part)
            return
        if self.expect is not None:
            self.expect -= len(data)
        self.backlog.append(data)
        self.backlog_bytes += len(data)
        if self.backlog_bytes >= BACKLOG_PAUSE and not self.work_paused and self.response is not None:
            self.work_paused = True
            self.response.pause_for_work()
        if self.task is None:
            self.resource.rewriting.start(self)

    def slices(self) -> Any:
        """The rewriting task: one slice of what has arrived per step."""
        while self.backlog and not self.life.over:
            self._work_one()
            yield None

    def _work_one(self) -> None:
        backlog = self.backlog
        data = take_slice(backlog, self.slice)
        self.backlog_bytes -= len(data)
        pipeline = self.pipeline
        assert pipeline is not None
        # The last piece ends the pipeline with its data when the body is
        # known complete: its length fully read, or its end already come.
        out = self._feed(data, (self.expect == 0 or self.life.state is State.DRAINING) and not backlog)
        if out is None:
            backlog.clear()
            self.backlog_bytes = 0
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
        size = next_slice(self.slice, len(data), timer() - began)
        if size is not None:
            self.slice = size
            if self.site.rules is not None:
                self.resource.slices[self.site.rules.digest] = size
        return out

    def work_drained(self) -> None:
        """The rewriting task ended: everything received so far is rewritten."""
        self.task = None
        if self.work_paused and self.response is not None:
            self.work_paused = False
            self.response.resume_after_work()
        if self.life.state is State.DRAINING:
            self._complete()

    def bodyDone(self) -> None:
        if self.life.over:
            return
        if self.task is not None:
            self.life.move(State.DRAINING)
        else:
            self._complete()

    def _complete(self, trailer: bool = True) -> None:
        """Finish the response; ``trailer``: the rewrite's Server-Timing goes
        in a trailer (False: it was in the head already)."""
        request = self.request
        pipeline = self.pipeline
        tail = b""
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
            tail, self.stash = self.stash + end, b""
            transducer = pipeline.transducer
            metrics = self.resource.metrics
            if transducer is not None:
                if transducer.bailed_out:
                    metrics.count("prexy_rewrite_bailouts_total")
                if transducer.timed_out:
                    metrics.count("prexy_rewrite_timeouts_total")
                if trailer and request.clientproto in TRAILERS_OVER:
                    request.add_trailer(b"Server-Timing", rewrite_timing(transducer, self.rules_run))
        self._unregister()
        self.life.move(State.DONE)
        self._cache_done(True)
        request.finish(tail)
        # After the last bytes left: the client does not wait for this.
        if pipeline is not None and pipeline.transducer is not None and self.site.rules is not None:
            self.resource.applicability.record(self.site.rules, self.resource_key, pipeline.transducer)

def request_vars(request: Any, site: SiteRuntime) -> RequestVars:
    """The header rules' variables for this request (``RequestVars.of``)."""
    values = request.requestHeaders.getRawHeaders(b"host")
    local = request.getHost()
    return RequestVars.of(
        http_host=values[0] if values else b"", secure=request.isSecure(),
        local_host=str(getattr(local, "host", "localhost")), local_port=getattr(local, "port", 0),
        proxy_host=site.config.upstream.host_header,
    )


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
