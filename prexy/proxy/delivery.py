"""The delivery step: where every answer's head is finished and started,
whatever produced it (a miss, a hit, a collapsed follower, a 304 refresh,
a stale copy), as Varnish's ``vcl_deliver`` is for every object.

The fields added here (``prexy.exchange.finish_head``: Age, Via,
Cache-Status, Server-Timing) and the site's header directives apply to all
of them alike; a header rule added here never misses a kind of answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from prexy.exchange import finish_head
from prexy.proxy.client import IClient
from prexy.proxy.request import edit_head, start_response
from prexy.runtime import SiteRuntime

__all__ = ["deliver_head"]


def deliver_head(
    request: IClient,
    code: int,
    phrase: bytes | None,
    headers: Sequence[tuple[bytes, bytes]],
    *,
    via: Sequence[bytes] = (),
    age: bytes | None = None,
    cache_status: bytes | None = None,
    timing: bytes | None = None,
    site: SiteRuntime | None,
) -> None:
    """Finish the head of an answer to ``request`` and set it (it leaves
    with the first body bytes, or at the end).  ``site``: the site the
    answer is for, whose ``add_header`` and ``proxy_hide_header`` apply
    (``prexy.headeredits``); a required argument, so that no way of
    answering forgets them (None only where no site is known)."""
    headers = finish_head(headers, via=via, age=age, cache_status=cache_status, timing=timing)
    if site is not None:
        headers = edit_head(request, site, code, headers)
    start_response(request, code, phrase, headers)
