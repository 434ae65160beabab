"""The operator's view on the admin endpoint (:mod:`prexy.admin` routes here).

- ``GET /sites``: the sites with traffic (HTML; JSON with
  ``Accept: application/json`` or as ``/sites.json``);
- ``GET /sites/NAME``: a site's page, its rules with their counters
  (HTML; JSON likewise, or as ``/sites/NAME.json``);
- ``POST /sites/NAME/dry-run[?count=N][&file=NAME]``: a draft rules file
  (the body) against the site's rules on its most requested pages;
- ``GET /stats.json``: the totals, top sites and top rules that
  ``prexy top`` and ``prexy hist`` poll;
- ``GET /log[?site=&status=&slower=&miss=&rule=&url=]``: the live request
  log, one JSON record a line as requests finish.

The owner (a pool's master, or a process alone) gives ``observed()`` (the
summed counters, ``prexy.observe.stats.Aggregate``), ``view.hub`` (the
live log's readers), ``config`` and ``dry_run(...)``.  Every route refuses
a method, parameter or name it does not expect (405, 400, 404).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

from twisted.internet import defer
from twisted.internet.interfaces import IPushProducer
from twisted.logger import Logger
from twisted.web import server
from zope.interface import implementer

from prexy.observe.tap import FilterError, Reader, parse_filter

log = Logger()

#: Bytes of a draft rules file a dry run takes at most.
MAX_DRAFT = 4 * 1024 * 1024
#: Pages a dry run fetches at most.
MAX_COUNT = 500


def _text(request: server.Request, code: int, text: str) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"text/plain; charset=utf-8")
    return text.encode("utf-8") + b"\n"


def _json(request: server.Request, value: Any, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(value, indent=1).encode("utf-8") + b"\n"


def _html(request: server.Request, body: bytes) -> bytes:
    request.setHeader(b"content-type", b"text/html; charset=utf-8")
    request.setHeader(b"cache-control", b"no-store")
    from prexy.observe.page import CONTENT_SECURITY_POLICY

    request.setHeader(b"content-security-policy", CONTENT_SECURITY_POLICY.encode("ascii"))
    request.setHeader(b"x-content-type-options", b"nosniff")
    return body


def _wants_json(request: server.Request) -> bool:
    accept = request.getHeader(b"accept") or b""
    return b"application/json" in accept.lower()


def _args(request: server.Request) -> dict[str, list[str]]:
    return {
        k.decode("utf-8", "replace"): [v.decode("utf-8", "replace") for v in vs]
        for k, vs in (request.args or {}).items()
    }


def _method(request: server.Request, allowed: Sequence[bytes]) -> bytes | None:
    """None when the method is one of ``allowed``; else the 405 answer."""
    if request.method in allowed:
        return None
    request.setHeader(b"allow", b", ".join(allowed))
    return _text(request, 405, f"use {' or '.join(m.decode() for m in allowed)}")


def _no_query(request: server.Request) -> bytes | None:
    args = _args(request)
    if args:
        return _text(request, 400, f"unexpected parameter(s): {', '.join(sorted(args))}")
    return None


def render_view(owner: Any, request: server.Request) -> bytes | int:
    path = request.path
    if path == b"/log":
        return _log(owner, request)
    if path.startswith(b"/sites/") and path.endswith(b"/dry-run"):
        return _dry_run(owner, request, unquote(path[len(b"/sites/") : -len(b"/dry-run")].decode("latin-1")))
    refused = _method(request, (b"GET", b"HEAD")) or _no_query(request)
    if refused is not None:
        return refused
    now = owner.reactor.seconds()
    if path == b"/stats.json":
        return _json(request, owner.observed().stats(now))
    if path in (b"/sites", b"/sites/", b"/sites.json"):
        stats = owner.observed().stats(now, top=len(owner.config.sites) + 1)
        listed = {s["site"] for s in stats["sites"]}
        sites = stats["sites"] + [
            {"site": s.name, "requests": 0, "hit": 0, "miss": 0, "errors": 0, "bytes_out": 0}
            for s in owner.config.sites if s.name not in listed
        ]
        if path == b"/sites.json" or _wants_json(request):
            return _json(request, {"sites": sites})
        from prexy.observe.page import sites_index

        return _html(request, sites_index(sites))
    name = unquote(path[len(b"/sites/") :].decode("latin-1"))
    as_json = name.endswith(".json")
    if as_json:
        name = name[: -len(".json")]
    try:
        site = owner.config.site(name)
    except KeyError:
        return _text(request, 404, f"no site named {name!r}: see /sites")
    report = owner.observed().site_report(name, now, site.rules)
    if as_json or _wants_json(request):
        return _json(request, report)
    from prexy.observe.page import site_page

    return _html(request, site_page(report))


def _dry_run(owner: Any, request: server.Request, name: str) -> bytes | int:
    refused = _method(request, (b"POST",))
    if refused is not None:
        return refused
    args = _args(request)
    unknown = sorted(set(args) - {"count", "file"})
    if unknown:
        return _json(request, {"error": f"unexpected parameter(s): {', '.join(unknown)} (known: count, file)"}, 400)
    count_text = args.get("count", ["50"])[-1]
    if not count_text.isdigit() or not 1 <= int(count_text) <= MAX_COUNT:
        return _json(request, {"error": f"count {count_text!r}: expected 1 to {MAX_COUNT}"}, 400)
    file_name = args.get("file", ["draft.rules"])[-1] or "draft.rules"
    try:
        site = owner.config.site(name)
    except KeyError:
        return _json(request, {"error": f"no site named {name!r}"}, 404)
    content: Any = request.content
    draft = content.read(MAX_DRAFT + 1) if content is not None else b""
    if len(draft) > MAX_DRAFT:
        return _json(request, {"error": f"the draft is larger than {MAX_DRAFT} bytes"}, 413)
    if not draft.strip():
        return _json(request, {"error": "the draft is empty: POST the rules file as the body"}, 400)
    d = owner.dry_run(site.name, draft, file_name, int(count_text))
    lost: list[bool] = []
    request.notifyFinish().addErrback(lambda _: lost.append(True))

    def answer(result: tuple[int, dict[str, Any]]) -> None:
        if lost or request.finished:
            return
        status, report = result
        request.write(_json(request, report, status))
        request.finish()

    def failed(failure: Any) -> None:
        log.failure("dry run of {site} failed", failure, site=name)
        answer((500, {"error": "the dry run failed: see the log"}))

    d.addCallbacks(answer, failed)
    return server.NOT_DONE_YET


@implementer(IPushProducer)
class _Backpressure:
    """Whether a ``/log`` reader's connection keeps up: its transport
    pauses this producer when its buffer fills."""

    def __init__(self) -> None:
        self.paused = False

    def pauseProducing(self) -> None:  # noqa: N802
        self.paused = True

    def resumeProducing(self) -> None:  # noqa: N802
        self.paused = False

    def stopProducing(self) -> None:  # noqa: N802
        self.paused = True


def _log(owner: Any, request: server.Request) -> bytes | int:
    refused = _method(request, (b"GET",))
    if refused is not None:
        return refused
    try:
        log_filter = parse_filter(_args(request))
    except FilterError as exc:
        return _text(request, 400, f"/log: {exc}")
    if log_filter.site is not None:
        try:
            owner.config.site(log_filter.site)
        except KeyError:
            return _text(request, 404, f"/log: no site named {log_filter.site!r}: see /sites")
    request.setHeader(b"content-type", b"application/x-ndjson")
    request.setHeader(b"cache-control", b"no-store")
    pressure = _Backpressure()
    request.registerProducer(pressure, True)
    reader = Reader(log_filter, request.write, lambda: pressure.paused)
    hub = owner.view.hub
    gone: list[bool] = []

    def left(_: object) -> None:
        gone.append(True)
        hub.detach(reader)

    request.notifyFinish().addBoth(left)
    # The head once every process records for this reader: from then on
    # no request it asks for is missed.
    in_force = defer.maybeDeferred(hub.attach, reader)
    in_force.addCallback(lambda _: gone or request.write(b""))
    in_force.addErrback(lambda f: log.failure("live log reader", f))
    return server.NOT_DONE_YET

