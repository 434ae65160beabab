"""The cache's part in one exchange (``prexy.proxy.forward.Exchange``):
what the cache decided for the request (its ``CacheContext``), the body
stored as it goes by, the followers fed from it, and how that part ends:
committed, aborted (followers then get a stale copy or an error), or a 304
that refreshes the stored copy.

The exchange owns one :class:`Storing` while it has a cache context and
drops it when the cache's part is over; the decisions are the pure
``prexy.cache.flow`` and the cache layer's (``prexy.proxy.caching``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from prexy.cache import flow
from prexy.proxy.client import IClient
from prexy.proxy.flight import CacheContext

if TYPE_CHECKING:
    from prexy.cache.store import Writer
    from prexy.fetch import Fetch
    from prexy.proxy.caching import CacheLayer
    from prexy.proxy.upstream_api import UpstreamResponse
    from prexy.runtime import SiteRuntime

__all__ = ["Storing"]


class Storing:
    """The cache's part of one exchange (see the module docstring)."""

    def __init__(self, cache: CacheLayer, site: SiteRuntime, ctx: CacheContext) -> None:
        self.cache = cache
        self.site = site
        self.ctx = ctx
        #: The store's writer while the body is being stored.
        self.writer: Writer | None = None
        #: Followers may be fed from chunks kept in memory (False once the
        #: body outgrew the store's limit).
        self.keep_chunks = True

    def begin(
        self, method: bytes, response: UpstreamResponse, stored: Sequence[tuple[bytes, bytes]], rewrite: bool,
    ) -> tuple[bytes, list[tuple[IClient, Fetch]]]:
        """The upstream's head is in: start storing (the leader of a miss, or
        a background refresh).  Returns the answer's Cache-Status and the
        followers that must fetch for themselves (the answer may not be
        shared)."""
        ctx = self.ctx
        if (ctx.flight is not None or ctx.claim_key is not None) and method == b"GET":
            length = None if rewrite else response.length
            self.writer, status = self.cache.begin_store(
                self.site, ctx, response.code, response.phrase, response.headers, stored, length
            )
            if self.writer is None and ctx.flight is not None:
                return status, ctx.flight.not_storable()
            return status, []
        return ctx.status(response.code), []

    def data(self, out: bytes, code: int) -> None:
        """Body bytes as the cache keeps them (identity): to the store while
        they fit, and to the followers."""
        writer = self.writer
        if writer is not None and not writer.write(out):
            self.writer = None
            self.keep_chunks = False
            self.cache.too_large(self.site, self.ctx, code)
        if self.ctx.flight is not None:
            self.ctx.flight.data(out, self.keep_chunks)

    def done(self, ok: bool) -> None:
        """The cache's part ends: the body stored and the followers finished
        (``ok``), or the store aborted and the followers given the stale
        copy or an error."""
        ctx = self.ctx
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

    def refreshed(self, client: IClient | None, upstream_headers: list[tuple[bytes, bytes]], now: float) -> None:
        """The upstream said the stale copy is still good (304): refresh it,
        and answer ``client`` (None: none of its own) and the followers
        from it."""
        cache, ctx, site = self.cache, self.ctx, self.site
        obj = cache.refreshed(site, ctx, upstream_headers)
        assert obj is not None  # only a stale copy is revalidated
        if client is not None:
            cache.serve(client, obj, now, site=site)
        if ctx.flight is not None:
            for waiter in ctx.flight.waiting():
                if not waiter.gone and not waiter.finished:
                    cache.serve(waiter, obj, now, collapsed=True, site=site)
            ctx.flight.end()
        cache.finished(ctx)

    def wanted(self, head: bool) -> flow.Wanted:
        """Who still wants the fetch once its own client left (``head``:
        the upstream's head arrived)."""
        return self.ctx.wanted(head, self.writer is not None)
