"""Fresh cache hits answered on the HTTP/1.x connection itself.

A request without a body that the cache answers with a fresh object (its
304, a range cut of it, a compressed variant) is answered here, from the
parsed head (``prexy.h1server.Request``), in one write: no twisted.web
request, no header tables, no routing through the resource.  The answer
is the one the general path gives, byte for byte (``tests/proxy/
test_hitpath.py`` sends the same requests both ways): the same answer
(``CacheLayer.hit``), the same delivery step (``finish_head`` and the
site's ``add_header`` / ``proxy_hide_header``), the same access log line
and metrics.  Anything else (a miss, a stale object, a request another is
fetching, a site with a map, an upgrade, an ACME challenge's path, a
body) goes the general way, which looks the object up again.

This is one speed trick behind one seam (``ProxySite.hits``; None turns
it off): in memory, a 20 KB hit took 118-123 µs of CPU through the
general path and 76-81 µs through this one (``process_time`` over 5,000
keep-alive hits on one connection, alternated, this 2-core machine under
load); bench/README.md has the figures under load from outside.
"""

from __future__ import annotations

import weakref
from typing import Any

from twisted.logger import Logger
from twisted.web.http import NO_BODY_CODES, RESPONSES

from prexy.cache import Action, flow
from prexy.cache.memo import Memo
from prexy.exchange import finish_head
from prexy.h1server import Request
from prexy.headervars import RequestVars
from prexy.proxy.caching import Looked, hit_marks
from prexy.proxy.headers import RequestHeaders
from prexy.proxy.request import client_vars
from prexy.runtime import SiteRuntime

__all__ = ["HitPath"]

_log = Logger("prexy")

_GET, _HEAD = b"GET", b"HEAD"
#: Request fields that change a hit's answer beyond what an answer made
#: once is kept by (a 304, a range against a validator): such requests get
#: theirs made each time.  A Range alone is part of the key.
_SHAPING = frozenset((b"if-none-match", b"if-modified-since", b"if-match", b"if-unmodified-since", b"if-range"))
#: Where a remembered head takes each hit's Age and Cache-Status (bytes no
#: field value holds: a parsed field never has a NUL).
_AGE_MARK, _STATUS_MARK = b"\0age\0", b"\0cache-status\0"
#: Bytes of remembered answers (heads and the bodies they keep) when the
#: resource has no memo budget to draw on (``ProxyResource.memos``).
READY_BUDGET = 32 * 1024 * 1024
#: A remembered answer beside its head and body bytes: the instance, its
#: two weak references, the head's tuple and the bytes objects' headers.
_READY = 320
_ACME = b"/.well-known/acme-challenge/"


class HitRecord:
    """What the access log and the operator's view (``prexy.observe``) read
    of an answered hit."""

    __slots__ = ("client", "clientproto", "code", "method", "requestHeaders", "sentLength", "site_name", "started", "uri")

    cache_status = "hit"
    upstream_seconds = None
    bytes_in = 0
    rewrite = None

    def __init__(
        self, client: Any, method: bytes, uri: bytes, proto: bytes, fields: RequestHeaders, code: int, sent: int,
        site_name: str, started: float,
    ) -> None:
        self.client = client
        self.method = method
        self.uri = uri
        self.clientproto = proto
        self.requestHeaders = fields
        self.code = code
        self.sentLength = sent
        self.site_name = site_name
        self.started = started

    def getClientAddress(self) -> Any:  # noqa: N802
        return self.client


def _sent_body(answer: Any, method: bytes) -> bytes:
    """The body a hit's answer sends: none for HEAD or a bodiless status."""
    body: bytes = answer.body
    if not body or method == _HEAD or answer.code in NO_BODY_CODES:
        return b""
    return body


class Ready:
    """A hit's answer made once: the head cut around its Age and
    Cache-Status values (``head``: before, between, after), the body sent
    (None: the object's own body, which the object keeps: whole, or the
    span ``cut`` of it for a range), the status, and the object and the
    site (its settings at the time: a reload replaces it) it was made
    from.

    The object and the site are held weakly (``made_from`` tells whether
    they are still the ones given): the memo is charged for the head and
    the body alone, so a strong reference would keep, beyond its budget,
    a whole object for an answer charged a few bytes (a range, a HEAD, a
    compressed variant) and the rules of every site a reload replaced.
    An object nothing else keeps (the store's own memo let it go) is
    decoded anew as another object, so the answer is made again either
    way."""

    __slots__ = ("_obj", "_site", "body", "code", "cut", "head")

    def __init__(
        self, obj: Any, site: Any, head: tuple[bytes, bytes, bytes], body: bytes | None, code: int,
        cut: tuple[int, int] | None = None,
    ) -> None:
        self._obj = weakref.ref(obj)
        self._site = weakref.ref(site)
        self.head = head
        self.body = body
        self.code = code
        self.cut = cut

    def body_of(self, obj: Any) -> bytes:
        """The body to send, for ``obj`` (the object it was made from)."""
        if self.body is not None:
            return self.body
        if self.cut is not None:
            return obj.body[self.cut[0] : self.cut[1]]
        return obj.body

    def size(self) -> int:
        """The bytes this answer keeps: its head's, its body's when it is
        not the object's own, and its own."""
        return _READY + sum(map(len, self.head)) + (len(self.body) if self.body is not None else 0)

    def made_from(self, obj: Any, site: Any) -> bool:
        """Whether this answer was made from ``obj`` for ``site``."""
        return self._obj() is obj and self._site() is site


class HitPath:
    """Answers fresh hits for the resource's cache (see the module
    docstring)."""

    def __init__(self, resource: Any, memo: Memo[tuple[Any, ...], Ready] | None = None) -> None:
        self.resource = resource
        #: The answers made last, by what they depend on besides the object
        #: (its key, the method, the version, whether the connection closes,
        #: Accept-Encoding, Range); each is used only for the very object the store
        #: gives now (``Ready.obj``) and the site as it is now (``Ready.site``:
        #: a reload replaces it), so nothing here needs invalidating.  A part
        #: of the resource's memo budget (``[cache] memo_size``), or a budget
        #: of its own.
        if memo is None:
            memos = getattr(resource, "memos", None)
            memo = memos.part("answers", own_keys=True) if memos is not None else Memo(READY_BUDGET, "answers")
        self.ready: Memo[tuple[Any, ...], Ready] = memo

    def answer(self, channel: Any, event: Request, headers: RequestHeaders) -> bool | Looked:
        """Answer ``event`` (a request whose body is complete, or that has
        none; ``headers``, its header table) if it is a fresh hit: True.  Else False, or the cache's
        lookup it made, for the general path to use (``IClient.looked``:
        the store is read once per request).  A failure before the answer
        is written is logged and leaves the request to the general path;
        one after it (the log line, the counters) is logged."""
        try:
            ready = self._answer(channel, event, headers)
        except Exception:
            _log.failure("hit path: {uri} goes the general way", uri=event.head.target.decode("latin-1"))
            return False
        if ready is None:
            return False
        if isinstance(ready, Looked):
            return ready
        out, record = ready
        channel.write_parts(out)
        try:
            metrics = self.resource.metrics
            metrics.count_cache("hit")
            proxy_site = channel.site
            metrics.count_answer(record.code, record.clientproto)
            proxy_site.log(record)
            proxy_site.observer.answered(record, self.resource.reactor.seconds())
        except Exception:
            _log.failure("hit path: after answering {uri}", uri=record.uri.decode("latin-1"))
        return True

    def _answer(
        self, channel: Any, event: Request, headers: RequestHeaders,
    ) -> tuple[list[bytes], HitRecord] | Looked | None:
        """The whole answer to ``event`` and its access log record, when it
        is a fresh hit; else the lookup made, or None."""
        head = event.head
        method = head.method
        if (method != _GET and method != _HEAD) or head.has_body:
            return None
        resource = self.resource
        cache = resource.cache
        if cache is None:
            return None
        target = head.target
        if resource.challenges is not None and target.startswith(_ACME):
            return None
        raw = headers.raw
        if b"upgrade" in raw:
            return None
        host = head.host
        if head.replace_host and host is not None:
            raw[b"host"] = [host]
        else:
            hosts = raw.get(b"host")
            host = hosts[0] if hosts else None
        site: SiteRuntime = resource.site_for(host)
        if site.cache_policy is None or site.urlmap is not None:
            return None
        looked = cache.look(site, method, target, host, raw)
        found = looked.found
        if looked.decision.action is not Action.LOOKUP or found is None or found.obj is None:
            return looked
        key = found.key
        now = resource.reactor.seconds()
        routed = flow.route(
            looked.decision.action, found, now, method, looked.decision.reason,
            fetching=key in cache.inflight, refreshing=key in cache.refreshing,
        )
        if routed.route is not flow.Route.HIT:
            return looked
        obj = routed.obj
        version = head.version
        accept_encoding = raw.get(b"accept-encoding")
        edits = site.header_rules.edits
        # An answer that depends only on the object and these: made once.
        ready_key = None
        if not edits.responds and _SHAPING.isdisjoint(raw):
            ranges = raw.get(b"range")
            ready_key = (
                key, method, version, channel.says_close, tuple(accept_encoding or ()), tuple(ranges) if ranges else (),
            )
            ready = self.ready.get(ready_key)
            if ready is None or not ready.made_from(obj, site):
                ready = self._make(obj, site, channel, now, method, raw, accept_encoding, key, version)
                if ready is not None:
                    self.ready.put(ready_key, ready, ready.size())
            if ready is not None:
                age, status = hit_marks(obj, now)
                out = [b"".join((ready.head[0], age, ready.head[1], status, ready.head[2]))]
                body = ready.body_of(obj)
                if body:
                    out.append(body)
                return out, HitRecord(
                    channel.getPeer(), method, target, version, headers, ready.code, len(body), site.name, now,
                )
        pairs = [(n, v) for n, vs in raw.items() for v in vs]
        answer = cache.hit(obj, now, method, pairs, accept_encoding, key=key, site=site)
        code = answer.code
        fields = finish_head(answer.headers, age=answer.age, cache_status=answer.cache_status)
        if edits.responds:
            fields = edits.respond(fields, code, self._vars(channel, site, method, target, version, headers), False)
        reason = answer.phrase or RESPONSES.get(code, b"Unknown Status")
        out = [channel.answer_head(version, b"%d" % code, reason, fields)]
        body = _sent_body(answer, method)
        if body:
            out.append(body)
        return out, HitRecord(channel.getPeer(), method, target, version, headers, code, len(body), site.name, now)

    def _make(
        self, obj: Any, site: SiteRuntime, channel: Any, now: float, method: bytes, raw: dict[bytes, list[bytes]],
        accept_encoding: list[bytes] | None, key: bytes, version: bytes,
    ) -> Ready | None:
        """The answer ``obj`` gives this request shape, made once: its head
        made with marks where each hit's Age and Cache-Status go, cut
        there; None if the marks are not found once each."""
        pairs = [(n, v) for n, vs in raw.items() for v in vs]
        answer = self.resource.cache.hit(obj, now, method, pairs, accept_encoding, key=key, site=site)
        code = answer.code
        fields = finish_head(answer.headers, age=_AGE_MARK, cache_status=_STATUS_MARK)
        reason = answer.phrase or RESPONSES.get(code, b"Unknown Status")
        head = channel.answer_head(version, b"%d" % code, reason, fields)
        before, mark, rest = head.partition(_AGE_MARK)
        middle, mark2, after = rest.partition(_STATUS_MARK)
        if not mark or not mark2 or _AGE_MARK in after or _STATUS_MARK in after:
            return None
        body = _sent_body(answer, method)
        # The object's own body is not kept twice: the answer takes it (or
        # its range's span) from the object it is used for, the very one
        # it was made from.  A range asked once (a player seeking) then
        # costs its head, not its bytes.
        if body and body is obj.body:
            return Ready(obj, site, (before, middle, after), None, code)
        if code == 206 and body and answer.span is not None and answer.whole is obj.body:
            return Ready(obj, site, (before, middle, after), None, code, answer.span)
        return Ready(obj, site, (before, middle, after), body, code)

    @staticmethod
    def _vars(
        channel: Any, site: SiteRuntime, method: bytes, target: bytes, version: bytes, fields: RequestHeaders,
    ) -> RequestVars:
        """The header directives' variables, as ``request_vars`` gives them
        for a twisted.web request."""
        hosts = fields.raw.get(b"host")
        return client_vars(
            site, hosts[0] if hosts else b"", channel.isSecure(), channel.getHost(), channel.getPeer(),
            method, target, version, fields,
        )
