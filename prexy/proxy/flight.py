"""A request's part in the cache (:class:`CacheContext`), and a miss's
one upstream fetch that other requests for the same key follow as it
streams in (:class:`Flight`, on the pure ``prexy.cache.flow.Flight``):
each follower at its own pace, paused and resumed by its own connection.

The cache layer (``prexy.proxy.caching.CacheLayer``) makes and ends
flights; a flight reaches it only for the clock, the metrics, its table of
flights in the air and serving a stale copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from twisted.internet.interfaces import IPushProducer
from zope.interface import implementer

from prexy.cache import CachedObject, cache_status_header, flow
from prexy.cache.ranges import Cut, range_of_stream
from prexy.errorpages import ErrorPages
from prexy.fetch import Fetch
from prexy.proxy.client import IClient
from prexy.proxy.delivery import deliver_head
from prexy.proxy.headers import raw_header_dict
from prexy.proxy.request import error_answer
from prexy.runtime import SiteRuntime

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime

    from prexy.metrics import Metrics

__all__ = ["CacheContext", "Flight"]


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
        #: The URL whose objects go when the upstream answers 2xx or 3xx
        #: (a request with an unsafe method).
        self.invalidate: bytes | None = None
        #: Its Host and target: Location and Content-Location on that host
        #: go too (RFC 9111 4.4).
        self.invalidate_from: tuple[bytes | None, bytes] = (None, b"")
        #: The key (and Vary) begin_store chose, for a too-large marker.
        self.store_key: bytes | None = None
        self.store_vary: tuple[bytes, ...] = ()

    def status(self, code: int | None = None, stored: bool = False) -> bytes:
        return cache_status_header(fwd=self.fwd, fwd_status=code, stored=stored, detail=self.detail)

    def wanted(self, head: bool, storing: bool) -> flow.Wanted:
        """Who still wants this request's fetch, now that its own client is
        gone (``flow.wanted``): ``head``, the upstream's head arrived;
        ``storing``, its body is being stored."""
        flight = self.flight
        return flow.wanted(
            followers=flight.following() if flight is not None else 0,
            head=head,
            claimed=self.claim_key is not None,
            storing=storing,
        )


class FlightLayer(Protocol):
    """What a flight uses of the cache layer that made it
    (``prexy.proxy.caching.CacheLayer``)."""

    reactor: IReactorTime
    metrics: Metrics
    #: The flights in the air, by key: a flight leaves it when it ends.
    inflight: dict[bytes, Flight]

    def serve(
        self, request: IClient, obj: CachedObject, now: float, *, stale_reason: str | None = None,
        site: SiteRuntime | None = None,
    ) -> object:
        """Answer ``request`` from a stored object."""


@implementer(IPushProducer)
class _Follower:
    """A request that follows a flight (``prexy.cache.flow.Follower``), and
    the producer its connection pauses and resumes."""

    def __init__(self, flight: Flight, request: IClient, fetch: Fetch) -> None:
        self.flight = flight
        self.request = request
        #: What the request asks upstream: it fetches for itself with it
        #: when the flight's answer may not be shared.
        self.fetch = fetch
        #: The part of the body this follower asked for with a Range,
        #: cut as it streams; None: all of it.
        self.cut: Cut | None = None

    def send(self, data: bytes) -> None:
        cut = self.cut
        part = data if cut is None else cut.take(data)
        if part:
            self.request.write(part)

    def end(self) -> None:
        request = self.request
        if not request.gone and not request.finished:
            request.unregisterProducer()
            request.finish()

    def reset(self) -> None:
        self.request.abort()

    def client_gone(self, reason: object = None) -> None:
        self.flight.left(self)

    def pauseProducing(self) -> None:
        self.flight.core.pause(self)

    def resumeProducing(self) -> None:
        self.flight.core.resume(self)

    def stopProducing(self) -> None:
        self.flight.left(self)


class Flight:
    """One upstream fetch for a key; requests that asked for the same key
    meanwhile follow it as it streams in (``prexy.cache.flow.Flight``),
    each at its own pace."""

    def __init__(
        self, layer: FlightLayer, key: bytes, pages: ErrorPages | None = None, site: SiteRuntime | None = None
    ) -> None:
        self.layer = layer
        self.key = key
        #: The site's error pages, for a 502 to followers.
        self.pages = pages
        #: The site (``SiteRuntime``): its add_header / proxy_hide_header.
        self.site = site
        self.core = flow.Flight()
        self.head: tuple[int, bytes, list[tuple[bytes, bytes]]] | None = None
        #: The body's length when the upstream gave it and nothing changes
        #: it on the way (a follower's Range can then be cut from it).
        self.length: int | None = None
        #: Told when a follower goes away: the leader's exchange, once its
        #: own client went and the fetch goes on for whoever is left.
        self.on_leave: Callable[[], object] | None = None

    @property
    def open(self) -> bool:
        return self.core.open

    def attach(self, request: IClient, fetch: Fetch) -> bool:
        """Follow this fetch; False when it takes no more followers.
        ``fetch``: what the request asks upstream (:meth:`not_storable`)."""
        follower = _Follower(self, request, fetch)
        if not self.core.open:
            return False
        self.layer.metrics.count_cache("collapsed")
        request.cache_status = "collapsed"
        request.exchange = follower
        if self.head is not None and not self._start(follower):
            return True
        self.core.attach(follower)
        return True

    def stream(self, code: int, phrase: bytes, headers: list[tuple[bytes, bytes]], length: int | None = None) -> None:
        """The response is being stored: followers get it as it arrives
        (a follower with a Range its part, when ``length`` is known)."""
        self.head = (code, phrase, headers)
        self.length = length
        for follower in self.core.followers():
            if not self._start(follower):  # type: ignore[arg-type]
                self.core.detach(follower)
        self.core.start()

    def _start(self, follower: _Follower) -> bool:
        """Send a follower the head; False when that is all it gets (HEAD,
        or it went away)."""
        request = follower.request
        if request.gone:
            return False
        assert self.head is not None
        code, phrase, headers = self.head
        status = cache_status_header(fwd="miss", fwd_status=code, collapsed=True)
        length = self.length
        if length is not None and code == 200 and request.method == b"GET" and request.requestHeaders.hasHeader(b"range"):
            # Its range, cut from the whole object as it streams by (as the
            # leader's own client gets it: prexy.cache.ranges).
            pairs = [(n, v) for n, vs in raw_header_dict(request.requestHeaders).items() for v in vs]
            part = range_of_stream(pairs, length, _lookup(headers), headers)
            if part is not None:
                code, phrase, headers, span = part
                follower.cut = Cut(span)
        deliver_head(request, code, phrase, headers, cache_status=status, site=self.site)
        if request.method == b"HEAD":
            request.finish()
            return False
        request.registerProducer(follower, True)
        return True

    def left(self, follower: _Follower) -> None:
        """A follower's client went away."""
        self.core.detach(follower)
        if self.on_leave is not None:
            self.on_leave()

    def following(self) -> int:
        """How many requests follow this fetch now."""
        return len(self.core.followers())

    def data(self, chunk: bytes, keep: bool) -> None:
        self.core.data(chunk, keep)

    def done(self) -> None:
        self.core.done()
        self.end()

    def waiting(self) -> list[Any]:
        """The followers' requests, taken out of the flight."""
        return [f.request for f in self.core.take_all()]  # type: ignore[attr-defined]

    def failed(self, stale: CachedObject | None) -> None:
        """The fetch failed: followers get the stale object when allowed, else
        their connection is reset (if streaming) or a 502."""
        now = self.layer.reactor.seconds()
        for request in self.waiting():
            if request.gone or request.finished:
                continue
            if stale is not None and not request.startedWriting and stale.stale_usable_on_error(now):
                self.layer.serve(request, stale, now, stale_reason="stale-if-error", site=self.site)
            elif request.startedWriting:
                request.abort()
            else:
                error_answer(request, 502, self.pages, self.site)
        self.end()

    def not_storable(self) -> list[tuple[IClient, Fetch]]:
        """The answer may not be shared: the flight ends, and hands back
        each follower still there with its fetch, to fetch for itself."""
        followers = cast("list[_Follower]", self.core.take_all())
        self.end()
        return [(f.request, f.fetch) for f in followers if not f.request.gone]

    def end(self) -> None:
        """No more followers: later requests look in the store."""
        self.on_leave = None
        if self.layer.inflight.get(self.key) is self:
            del self.layer.inflight[self.key]


def _lookup(headers: list[tuple[bytes, bytes]]) -> Callable[[bytes], bytes | None]:
    """The first value of a field of ``headers`` by its lower-case name (for
    an If-Range: the stored object's ETag and Last-Modified)."""

    def value(lname: bytes) -> bytes | None:
        for name, v in headers:
            if name.lower() == lname:
                return v
        return None

    return value
