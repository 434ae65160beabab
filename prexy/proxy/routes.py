"""Where the cache sends a request: the route values
``CacheLayer.on_request`` returns (``prexy.proxy.caching``), and the one
entry point that carries them out (:class:`RouteCarrier`, the resource).

The cache layer decides and answers what it can from the store; it never
calls back into the resource.  Whatever must reach the upstream comes back
as a route with the request's :class:`~prexy.fetch.Fetch`:

- :class:`Answered`: the cache answered (a hit, a stale copy in grace, a
  PURGE) or the request follows a fetch under way; nothing more to do.
- :class:`Forward`: send it upstream, with the cache's part in it.
- :class:`Refresh`: answered from a stale copy, and one background fetch
  (for the cache only) refreshes the object.
- :class:`Parked`: another worker is fetching the object; the Deferred
  fires with the next route once it is done (the object stored: answered;
  nothing stored or its lease ran out: forward), or with None when the
  client went away meanwhile.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred

    from prexy.fetch import Fetch
    from prexy.proxy.client import IClient
    from prexy.proxy.flight import CacheContext

__all__ = ["Answered", "CacheRoute", "Forward", "Parked", "Refresh", "RouteCarrier"]


@attrs.frozen
class Answered:
    """Nothing left to do: ``result`` is what ``render`` returns (the
    answer's bytes, or NOT_DONE_YET while it is under way)."""

    result: object


@attrs.frozen
class Forward:
    """Send the request upstream; ``ctx``: the cache's part in the fetch
    (storing it, invalidating a URL, revalidating a stale copy), None when
    the cache has none."""

    ctx: CacheContext | None


@attrs.frozen
class Refresh:
    """``result`` answered the request from a stale copy in grace;
    ``fetch`` (a GET) refreshes the object in the background, for the
    cache only, holding the key's claim in ``ctx``."""

    result: object
    ctx: CacheContext
    fetch: Fetch


@attrs.frozen
class Parked:
    """Waiting on another worker's fetch of the same object: ``next``
    fires with the route to carry out then, or None when the client went."""

    next: Deferred[CacheRoute | None]


CacheRoute = Answered | Forward | Refresh | Parked


class RouteCarrier(Protocol):
    """Carries out a route for a request (``ProxyResource.carry_out``):
    where the cache's routes, and the followers a flight hands back when
    its answer may not be shared, go upstream."""

    def carry_out(self, request: IClient, fetch: Fetch, route: CacheRoute) -> object:
        """``request``: the client's (or the stand-in of a background
        fetch); returns what ``render`` returns."""
