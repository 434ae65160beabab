"""The admin endpoint: health, Prometheus metrics, reload, bans, and the
operator's view (:mod:`prexy.adminviews`: ``/sites/NAME``, ``/stats.json``,
``/log``, dry runs).

Bound separately from the proxy ports (loopback by default) so it is never
reachable through a site; with ``[server] admin_token`` set, every request
must also carry ``Authorization: Bearer TOKEN`` (401 otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.logger import Logger
from twisted.web import resource, server

from prexy.metrics import render

if TYPE_CHECKING:
    from prexy.cache.bans import Ban

log = Logger()


def _still_open(request: server.Request) -> Callable[[], bool]:
    """A check, for an answer that comes later, that ``request`` may still
    be answered: neither finished nor lost (``notifyFinish`` errs when the
    client goes away first)."""
    lost: list[bool] = []
    request.notifyFinish().addErrback(lambda _: lost.append(True))
    return lambda: not request.finished and not lost


def authorized(request: server.Request, token: str) -> bool:
    """Whether ``request`` carries ``Authorization: Bearer token``
    (compared in constant time)."""
    import hmac

    given = request.getHeader(b"authorization") or b""
    scheme, _, value = given.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), token.encode("utf-8"))


def admin_service(reactor: Any, endpoint: str, owner: Any) -> Any:
    """The service listening on ``endpoint`` with the admin resource of
    ``owner`` (a master or a single process); a port that cannot be had at
    start-up stops twistd with one line (``prexy.listen.ListenError``)."""
    from prexy.listen import listening_service

    site = server.Site(AdminResource(owner, lambda: owner.config.admin_token))
    site.log = lambda request: None  # type: ignore[method-assign]
    return listening_service(reactor, endpoint, site)


class AdminResource(resource.Resource):
    """``GET /health``, ``GET /metrics``, ``POST /reload[?cluster=1]``,
    ``POST /ban``, and the operator's view (``prexy.adminviews``)."""

    isLeaf = True

    def __init__(self, owner: Any, token: Callable[[], str | None] = lambda: None) -> None:
        super().__init__()
        self.owner = owner
        #: The token in force (a reload may change it); None: none asked.
        self.token = token

    def render(self, request: server.Request) -> bytes | int:
        path = request.path
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        token = self.token()
        if token is not None and not authorized(request, token):
            request.setResponseCode(401)
            request.setHeader(b"www-authenticate", b'Bearer realm="prexy admin"')
            return b"this admin endpoint wants Authorization: Bearer TOKEN ([server] admin_token)\n"
        if path == b"/stats.json" or path == b"/log" or path == b"/sites" or path.startswith(b"/sites/"):
            from prexy.adminviews import render_view

            return render_view(self.owner, request)
        if path == b"/health":
            body = b"ok\n"
            cluster = getattr(self.owner, "cluster", None)
            if cluster is not None:  # a node of a fleet: its link to Redis (it serves either way)
                body += cluster.health().encode("utf-8") + b"\n"
            acme = getattr(self.owner, "acme", None)
            if acme is not None:  # names whose certificate orders fail (the old ones serve)
                body += "".join(line + "\n" for line in acme.health_lines()).encode("utf-8")
            return body
        if path == b"/metrics":
            request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
            collect = getattr(self.owner, "collect_metrics", None)
            if collect is not None:
                return collect()
            cluster = getattr(self.owner, "cluster", None)
            text = render([self.owner.metrics], cluster.gauges() if cluster is not None else None)
            acme = getattr(self.owner, "acme", None)
            if acme is not None:
                text += ("\n".join(acme.metric_lines()) + "\n").encode("utf-8")
            return text
        if path == b"/reload":
            if request.method != b"POST":
                request.setResponseCode(405)
                request.setHeader(b"allow", b"POST")
                return b"use POST /reload\n"
            still_open = _still_open(request)
            d = defer.maybeDeferred(self.owner.reload)
            everywhere = (request.args or {}).get(b"cluster", [b""])[0] in (b"1", b"true", b"yes")
            cluster = getattr(self.owner, "cluster", None)
            if everywhere and cluster is None:
                request.setResponseCode(409)

                def alone(ok: bool) -> bool:
                    if ok and still_open():
                        request.write(b"this node is in no cluster: reloaded here only\n")
                    return ok

                d.addCallback(alone)
            elif everywhere:
                from prexy.cluster.messages import Invalidation

                fleet: Any = cluster

                def share(ok: bool) -> Any:
                    if not ok:
                        return ok
                    shared = fleet.publish(Invalidation.reload())
                    shared.addCallback(lambda note: still_open() and request.write(note))
                    return shared.addCallback(lambda _: ok)

                d.addCallback(share)

            def answer(ok: bool) -> None:
                if not still_open():
                    return
                if ok:
                    request.write(b"reloaded\n")
                else:
                    request.setResponseCode(409)
                    why = getattr(self.owner, "last_reload_error", "") or "see the log"
                    request.write(
                        f"reload refused, the running configuration stays: {why}\n".encode()
                    )
                request.finish()

            d.addCallback(answer)
            d.addErrback(lambda f: log.failure("reload failed", f))
            return server.NOT_DONE_YET
        if path == b"/ban":
            return self._ban(request)
        request.setResponseCode(404)
        return (
            b"not found: try /health, /metrics, /sites, /sites/NAME, /stats.json, /log, POST /reload,"
            b" POST /ban?regex=RE[&host=NAME][&site=NAME]\n"
        )

    def _ban(self, request: server.Request) -> bytes | int:
        """Remove every cached object whose path and query match ``regex``
        and whose host is ``host`` or matches ``host_regex`` (any may be
        left out), of one site or
        of all (all workers share the store, so one ban reaches them all).
        The scan runs in the owner's reactor's thread pool."""
        if request.method != b"POST":
            request.setResponseCode(405)
            request.setHeader(b"allow", b"POST")
            return BAN_USAGE
        store = self.owner.cache_store()
        if store is None:
            request.setResponseCode(409)
            return b"no cache configured\n"
        args = request.args or {}

        def arg(name: bytes) -> str | None:
            return args.get(name, [b""])[0].decode("utf-8", "replace") or None

        regex, host, host_regex, site = arg(b"regex"), arg(b"host"), arg(b"host_regex"), arg(b"site")
        from prexy.cache.bans import Ban, BanError

        try:
            ban = Ban(site, target=regex, host=host, host_regex=host_regex)
        except BanError as exc:
            request.setResponseCode(400)
            return f"{exc}\n".encode() + BAN_USAGE
        config = getattr(self.owner, "config", None)
        if site is not None and config is not None and site not in {s.name for s in config.sites}:
            request.setResponseCode(400)
            names = ", ".join(s.name for s in config.sites)
            return f"no site named {site!r} (sites: {names})\n".encode()
        from twisted.internet.threads import deferToThreadPool

        still_open = _still_open(request)
        reactor = self.owner.reactor
        d = deferToThreadPool(reactor, reactor.getThreadPool(), store.ban, ban)

        def answer(count: int) -> None:
            log.info("ban ({what}): {n} object(s)", what=ban.describe(), n=count)
            text = ban_answer(ban, count)
            announce = getattr(self.owner, "announce", None)
            if announce is not None:  # a cluster: answer once the other nodes applied it
                from prexy.cluster.answer import answer_with_note
                from prexy.cluster.messages import Invalidation

                answer_with_note(request, announce(Invalidation.ban(site, regex, host, host_regex)), text)
                return
            if still_open():
                request.setHeader(b"content-length", b"%d" % len(text))
                request.write(text)
                request.finish()

        d.addCallback(answer)
        d.addErrback(lambda f: log.failure("ban failed", f))
        return server.NOT_DONE_YET


BAN_USAGE = (
    b"use POST /ban?regex=RE[&host=NAME|&host_regex=RE][&site=NAME] or /ban?host=NAME[&site=NAME]:\n"
    b"regex is searched in the path and query (/obj?x=1, as Varnish's req.url), host is a Host\n"
    b"compared whole (req.http.host ==), host_regex is searched in the Host (req.http.host ~)\n"
)


def ban_answer(ban: Ban, count: int) -> bytes:
    """What ``POST /ban`` answers: how many objects went, and when none did,
    that the ban matched nothing (and what it was matched against)."""
    if count:
        return b"banned %d object(s)\n" % count
    return (
        f"banned 0 object(s): no stored object matched ({ban.describe()}); the regex is searched in the "
        "path and query, the host is given with host= or host_regex=\n"
    ).encode()
