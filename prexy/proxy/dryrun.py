"""A dry run of a draft rules file on a site's live pages
(``POST /sites/NAME/dry-run``, ``prexy rules diff``).

The site's most requested URLs (as this process counted them:
``Observer.top_urls``; the site's root when it has had none yet) are
fetched from its upstream through the process's own connection pool, as
GETs the cache never sees, asked as identity and decoded when they come
compressed all the same; the pure part (:mod:`prexy.substitution.dryrun`)
rewrites each with the current rules and with the draft and compares.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure
from zope.interface import implementer

from prexy.codec import DECODABLE, decoder_for, parse_codings
from prexy.exchange import upstream_request_headers
from prexy.proxy.upstream_api import IBodyConsumer, UpstreamError, UpstreamResponse
from prexy.runtime import SiteRuntime

#: Pages fetched at most (a parameter beyond it is refused).
MAX_PAGES = 500
#: Pages fetched at once.
PARALLEL = 4
#: Bytes of one page read at most (a larger one is compared cut here).
MAX_PAGE = 8 * 1024 * 1024


@implementer(IBodyConsumer)
class _Collect:
    """A response body, whole (up to ``MAX_PAGE`` bytes)."""

    def __init__(self, response: UpstreamResponse, done: defer.Deferred[bytes]) -> None:
        self.response = response
        self.done = done
        self.parts: list[bytes] = []
        self.size = 0

    def bodyData(self, data: bytes) -> None:  # noqa: N802
        if self.size < MAX_PAGE:
            self.parts.append(data[: MAX_PAGE - self.size])
            self.size += len(data)

    def bodyDone(self) -> None:  # noqa: N802
        self.done.callback(b"".join(self.parts))

    def bodyFailed(self, reason: Failure) -> None:  # noqa: N802
        self.done.errback(reason)


def fetch_page(pool: Any, site: SiteRuntime, url: str) -> defer.Deferred[tuple[int, bytes, str | None]]:
    """GET ``url`` (path and query) from ``site``'s upstream: (status, body
    decoded of its content codings, Content-Type)."""
    config = site.config
    target = url.encode("latin-1")
    path = config.upstream.path
    client_host = config.hosts[0].encode("ascii") if config.hosts else None
    raw = {b"accept-encoding": [b"identity"], b"user-agent": [b"prexy-dry-run"]}
    if client_host is not None:
        raw[b"host"] = [client_host]
    headers = upstream_request_headers(
        raw, host_header=config.upstream_host_header(client_host), client_host=client_host,
        client_ip=b"127.0.0.1", secure=False, rules_digest=None,
    )
    done: defer.Deferred[tuple[int, bytes, str | None]] = defer.Deferred()

    def on_head(response: UpstreamResponse) -> None:
        codings = parse_codings(response.values(b"content-encoding"))
        body: defer.Deferred[bytes] = defer.Deferred()
        whole = response.take_body()
        if whole is not None:
            body.callback(whole)
        else:
            response.deliverBody(_Collect(response, body))

        content_type = response.header(b"content-type")

        def decoded(data: bytes) -> tuple[int, bytes, str | None]:
            if codings:
                if any(c not in DECODABLE for c in codings):
                    raise UpstreamError(f"content coding {b','.join(codings).decode('latin-1')} cannot be decoded")
                decoder = decoder_for(codings)
                data = decoder.feed(data) + decoder.finish()
            return response.code, data, content_type.decode("latin-1") if content_type is not None else None

        body.addCallback(decoded).chainDeferred(done)

    pool.request(
        site.origin_key, b"GET", (path.encode("latin-1") if path else b"") + target, headers, None, 0,
        on_head, done.errback,
    )
    return done


@defer.inlineCallbacks
def dry_run(pool: Any, site: SiteRuntime, urls: Sequence[str], draft: Any) -> Any:
    """Fetch ``urls`` and compare the site's rules with ``draft`` on them
    (``prexy.substitution.dryrun.compare``); the report."""
    from prexy.substitution.dryrun import compare

    pages: list[tuple[str, bytes]] = []
    types: list[str | None] = []
    failed: list[dict[str, str]] = []
    for start in range(0, len(urls), PARALLEL):
        batch = urls[start : start + PARALLEL]
        results = yield defer.DeferredList(
            [fetch_page(pool, site, url) for url in batch], consumeErrors=True,
        )
        for url, (ok, result) in zip(batch, results, strict=True):
            if not ok:
                failed.append({"url": url, "error": _why(result)})
            elif result[0] != 200:
                failed.append({"url": url, "error": f"status {result[0]}"})
            else:
                pages.append((url, result[1]))
                types.append(result[2])
    report = compare(site.rules, draft, pages, content_types=types)
    out = {"site": site.name, "pages": len(urls), "fetched": len(pages), "failed": failed}
    out.update(report)
    return out


def _why(failure: Failure) -> str:
    """A failed fetch, without the upstream's address (an operator's
    report may be shown further)."""
    error = failure.value
    if isinstance(error, UpstreamError):
        return f"{type(error).__name__}: {error.status}"
    return type(error).__name__
