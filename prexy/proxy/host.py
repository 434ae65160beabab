"""What an exchange (``prexy.proxy.forward.Exchange``) uses of the
resource that made it (``prexy.proxy.resource.ProxyResource``): the
process's clock, metrics, cache and rewriting work, the per-process
memories of rule applicability and slice sizes, the once-per-site log
lines, and the one entry point that carries a route out (a follower of a
fetch whose answer may not be shared goes upstream through it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from prexy.proxy.routes import RouteCarrier

if TYPE_CHECKING:
    from twisted.internet.interfaces import IReactorTime

    from prexy.metrics import Metrics
    from prexy.observe.stats import Observer
    from prexy.proxy.caching import CacheLayer
    from prexy.proxy.client import IClient
    from prexy.proxy.rewriting import Rewriting
    from prexy.proxy.tunnel import Tunnel
    from prexy.runtime import SiteRuntime
    from prexy.substitution.applicability import ApplicabilityMemory

__all__ = ["ExchangeHost"]


class ExchangeHost(RouteCarrier, Protocol):
    """The resource, as its exchanges see it."""

    reactor: IReactorTime
    metrics: Metrics
    #: Per-site and per-rule counters (prexy.observe).
    observer: Observer
    #: The worker's cache; an exchange reaches it only for a request the
    #: cache routed (one with a cache context), so only when there is one.
    cache: CacheLayer | None
    rewriting: Rewriting
    applicability: ApplicabilityMemory
    #: Rule set digest -> the slice size that took about SLICE_SECONDS.
    slices: dict[str, int]

    def coding_not_decoded(self, site: SiteRuntime, coding: bytes, uri: bytes) -> None: ...

    def trailing_garbage(self, site: SiteRuntime, coding: bytes, size: int, uri: bytes) -> None: ...

    def tunnel_closed(self, request: IClient, channel: Any, tunnel: Tunnel) -> None: ...
