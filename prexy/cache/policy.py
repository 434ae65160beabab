"""What may be cached, under which key, for how long: pure functions over
methods, URIs, headers and times (no Twisted, no I/O, no clock: ``now`` is
always an argument).

The defaults are Varnish's built-in VCL:

* ``vcl_recv``: only GET and HEAD are looked up; a request with
  ``Authorization``, ``Cookie`` or (beyond Varnish, common practice)
  ``X-Requested-With`` passes.  Beyond Varnish, cookies whose names match
  ``ignore_cookies`` globs (by default the analytics cookies ``_ga*``,
  ``_gid``, ``_gat*``, ``_fbp``, ``_hj*``) are ignored for this decision
  (they still go upstream).  Unsafe methods pass and invalidate the URL.
  Like Varnish, the client's own ``Cache-Control`` is ignored.
* ``vcl_backend_response``: a response is stored when its status is
  cacheable (200, 203, 204, 300, 301, 404, 410, 414; 302 and 307 only with
  explicit freshness) and it has no ``Set-Cookie``, no
  ``Cache-Control: private / no-store / no-cache``, no
  ``Surrogate-Control: no-store`` and no ``Vary: *``.  Otherwise it becomes
  hit-for-miss for ``hit_for_miss_ttl`` (120 s): later requests go straight
  upstream without queueing behind one another.
* TTL (Varnish's ``cache_rfc2616.c``): ``s-maxage``, then ``max-age`` (both
  less the upstream's ``Age``), then ``Expires`` (relative to ``Date`` when
  present, so clock skew does not matter), else ``default_ttl``.  A TTL of 0
  or less is hit-for-miss; so is an invalid ``max-age`` or ``Expires``
  (RFC 9111: treat as stale).  ``stale-while-revalidate`` sets the grace,
  ``stale-if-error`` how long a stale copy may replace an upstream error.

Headers are given as an iterable of ``(name, value)`` byte pairs, names in
any case, repeated names allowed (Twisted's
``[(n, v) for n, vs in headers.getAllRawHeaders() for v in vs]``).
"""

from __future__ import annotations

import enum
import fnmatch
import functools
import hashlib
import re
from collections.abc import Iterable
from email.utils import mktime_tz, parsedate_tz
from typing import Any

import attrs

_blake2b = hashlib.blake2b

__all__ = [
    "Action",
    "CachePolicy",
    "PolicyError",
    "RequestDecision",
    "StoreAction",
    "StoreDecision",
    "accept_encoding_bucket",
    "age_header",
    "cache_key",
    "cache_status_header",
    "key_url",
    "not_modified",
    "parse_http_date",
    "primary_key",
    "request_decision",
    "response_decision",
    "vary_key",
    "vary_names",
]

Headers = Iterable[tuple[bytes, bytes]]

DEFAULT_CACHEABLE = frozenset({200, 203, 204, 300, 301, 404, 410, 414})
#: Cacheable only when the response gives explicit freshness (Varnish).
DEFAULT_EXPLICIT_ONLY = frozenset({302, 307})
LOOKUP_METHODS = frozenset({b"GET", b"HEAD"})
UNSAFE_METHODS = frozenset({b"POST", b"PUT", b"DELETE", b"PATCH"})


#: Cookies that analytics scripts set on every page view: they do not make
#: a request private (Google Analytics, Facebook pixel, Hotjar).
DEFAULT_IGNORE_COOKIES = ("_ga*", "_gid", "_gat*", "_fbp", "_hj*")
#: Client addresses allowed to send PURGE.
DEFAULT_PURGE_FROM = ("127.0.0.1", "::1")


class PolicyError(ValueError):
    """A setting the policy refuses: ``field`` names it, ``reason`` says why
    (the configuration loader turns both into its ``file:line: key``)."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


def _globs(patterns: Iterable[str]) -> tuple[str, ...]:
    out = tuple(patterns)
    for p in out:
        if not isinstance(p, str) or not p:
            raise PolicyError("ignore_cookies", f"not a cookie name pattern: {p!r}")
    return out


def _regexes(patterns: Iterable[str]) -> tuple[str, ...]:
    out = tuple(patterns)
    for p in out:
        try:
            re.compile(p)
        except (re.error, TypeError) as exc:
            raise PolicyError("pass_rules", f"bad regular expression {p!r}: {exc}") from None
    return out


def _addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    out = tuple(addresses)
    for a in out:
        if not isinstance(a, str) or not a:
            raise PolicyError("purge_from", f"not an address: {a!r}")
    return out


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise PolicyError(attribute.name, f"must be 0 or more, got {value!r}")


@attrs.frozen
class CachePolicy:
    """One site's cache settings; validated and compiled once, at creation.

    This is also what a site's ``cache_*`` keys in the configuration file
    load into (``SiteConfig.cache``): the defaults here are the file's
    documented defaults.  A refused value raises :class:`PolicyError`.
    Change one field with ``attrs.evolve(policy, default_ttl=60)``.
    """

    cacheable_statuses: frozenset[int] = attrs.field(default=DEFAULT_CACHEABLE, converter=frozenset)
    explicit_only_statuses: frozenset[int] = attrs.field(
        default=DEFAULT_EXPLICIT_ONLY, converter=frozenset
    )
    #: Seconds a response without freshness information is fresh.
    default_ttl: float = attrs.field(default=300.0, validator=_non_negative)
    #: Seconds a stale object is still served while one fetch refreshes it
    #: (``stale-while-revalidate`` in a response overrides it).
    grace: float = attrs.field(default=10.0, validator=_non_negative)
    #: Seconds a dead object with validators is kept only to revalidate it
    #: conditionally.
    keep: float = attrs.field(default=300.0, validator=_non_negative)
    hit_for_miss_ttl: float = attrs.field(default=120.0, validator=_non_negative)
    #: Cookie-name globs (``fnmatch``, case-sensitive) ignored when deciding
    #: whether a request with cookies may be looked up.
    ignore_cookies: tuple[str, ...] = attrs.field(default=DEFAULT_IGNORE_COOKIES, converter=_globs)
    #: Regular expressions (``re.search`` on the request target, latin-1);
    #: a match passes the request.
    pass_rules: tuple[str, ...] = attrs.field(default=(), converter=_regexes)
    #: Bodies larger than this are streamed without being stored.
    max_object_size: int = attrs.field(default=8 * 1024 * 1024, validator=_non_negative)
    #: The cache key's URL includes the Host (lower-cased) ...
    key_host: bool = True
    #: ... and the query string.
    key_query: bool = True
    #: Client addresses allowed to send PURGE.
    purge_from: tuple[str, ...] = attrs.field(default=DEFAULT_PURGE_FROM, converter=_addresses)

    _cookie_re: re.Pattern[str] | None = attrs.field(init=False, eq=False, repr=False)
    _pass_re: re.Pattern[str] | None = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        cookie = (
            re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in self.ignore_cookies))
            if self.ignore_cookies
            else None
        )
        passes = re.compile("|".join(f"(?:{p})" for p in self.pass_rules)) if self.pass_rules else None
        object.__setattr__(self, "_cookie_re", cookie)
        object.__setattr__(self, "_pass_re", passes)

    def ignored_cookie(self, name: str) -> bool:
        """Whether a cookie of this name does not count for the decision."""
        return self._cookie_re is not None and self._cookie_re.match(name) is not None

    def passes(self, target: str) -> bool:
        """Whether a configured pass rule matches the request target."""
        return self._pass_re is not None and self._pass_re.search(target) is not None


class Action(enum.Enum):
    """What to do with a request."""

    LOOKUP = "lookup"
    PASS = "pass"
    #: Pass, and purge the URL's objects (every variant): an unsafe method.
    INVALIDATE = "invalidate"


@attrs.frozen
class RequestDecision:
    action: Action
    #: Why, for logs and ``Cache-Status: detail=``: "" on lookup, else one of
    #: method, authorization, cookie, x-requested-with, pass-rule, unsafe-method.
    reason: str = ""
    #: b"GET" for GET and HEAD (a HEAD hit is served from the GET object),
    #: else the method itself.
    method_class: bytes = b"GET"


def _values(headers: Headers, lname: bytes) -> list[bytes]:
    return [v for n, v in headers if n.lower() == lname]


def cookie_names(values: Iterable[bytes]) -> list[str]:
    """Names of the cookies in ``Cookie`` header values."""
    names = []
    for value in values:
        for part in value.split(b";"):
            name = part.split(b"=", 1)[0].strip()
            if name:
                names.append(name.decode("latin-1"))
    return names


def request_decision(policy: CachePolicy, method: bytes, uri: bytes, headers: Headers) -> RequestDecision:
    """Lookup, pass or invalidate, with the reason (Varnish's ``vcl_recv``).
    Methods are case-sensitive (RFC 9110): ``get`` is not ``GET``."""
    if method in UNSAFE_METHODS:
        return RequestDecision(Action.INVALIDATE, "unsafe-method", method)
    if method not in LOOKUP_METHODS:
        return RequestDecision(Action.PASS, "method", method)
    headers = list(headers)
    for name, _ in headers:
        lname = name.lower()
        if lname == b"authorization":
            return RequestDecision(Action.PASS, "authorization")
        if lname == b"x-requested-with":
            return RequestDecision(Action.PASS, "x-requested-with")
    cookies = _values(headers, b"cookie")
    if cookies and any(not policy.ignored_cookie(n) for n in cookie_names(cookies)):
        return RequestDecision(Action.PASS, "cookie")
    if policy.passes(uri.decode("latin-1")):
        return RequestDecision(Action.PASS, "pass-rule")
    return RequestDecision(Action.LOOKUP)


# -- responses ----------------------------------------------------------------


class StoreAction(enum.Enum):
    STORE = "store"
    HIT_FOR_MISS = "hit-for-miss"


@attrs.frozen
class StoreDecision:
    """Whether and how long to keep a response (``vcl_backend_response``)."""

    action: StoreAction
    #: Seconds fresh from ``stored_at`` (the hit-for-miss TTL for markers).
    ttl: float
    #: When the response was generated: ``now`` less the upstream's ``Age``.
    stored_at: float
    grace: float = 0.0
    keep: float = 0.0
    stale_if_error: float = 0.0
    #: Lower-case names from ``Vary`` (see :func:`vary_names`).
    vary: tuple[bytes, ...] = ()
    #: Why not stored (set-cookie, private, no-store, no-cache,
    #: surrogate-no-store, vary-star, status, ttl, too-large), or the source
    #: of the TTL when stored (s-maxage, max-age, expires, default).
    reason: str = ""

    @property
    def store(self) -> bool:
        return self.action is StoreAction.STORE


def parse_cache_control(values: Iterable[bytes]) -> dict[str, str | None]:
    """``Cache-Control`` directives, lower-case names -> value or ``None``;
    the first occurrence of a directive wins."""
    out: dict[str, str | None] = {}
    for value in values:
        for part in _split_commas(value.decode("latin-1")):
            name, eq, arg = part.partition("=")
            name = name.strip().lower()
            if not name or name in out:
                continue
            arg = arg.strip()
            if len(arg) >= 2 and arg[0] == arg[-1] == '"':
                arg = arg[1:-1]
            out[name] = arg if eq else None
    return out


def _split_commas(text: str) -> list[str]:
    """Splits on commas outside quoted strings."""
    parts: list[str] = []
    current: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _seconds(value: str | None) -> float | None:
    """delta-seconds, capped at 2**31 as RFC 9111 1.2.2 says; None if invalid."""
    if value is None or not value.strip().isascii() or not value.strip().isdigit():
        return None
    return float(min(int(value.strip()), 2**31))


def parse_http_date(value: bytes | None) -> float | None:
    """An HTTP date (IMF-fixdate, RFC 850 or asctime) -> epoch seconds."""
    if value is None:
        return None
    try:
        parsed = parsedate_tz(value.decode("latin-1").strip())
    except (TypeError, ValueError, IndexError):
        return None
    if parsed is None:
        return None
    try:
        return float(mktime_tz(parsed))
    except (OverflowError, ValueError):
        return None


@functools.lru_cache(maxsize=512)
def _vary_names(values: tuple[bytes, ...]) -> tuple[bytes, ...]:
    return vary_names(values)


def vary_names(values: Iterable[bytes]) -> tuple[bytes, ...]:
    """``Vary`` values -> sorted, unique, lower-case names (``(b"*",)`` for any ``*``)."""
    names = set()
    for value in values:
        for part in value.split(b","):
            name = part.strip().lower()
            if name == b"*":
                return (b"*",)
            if name:
                names.add(name)
    return tuple(sorted(names))


def response_decision(
    policy: CachePolicy,
    status: int,
    headers: Headers,
    now: float,
    content_length: int | None = None,
) -> StoreDecision:
    """Store (with TTL, grace, keep) or hit-for-miss, with the reason.

    ``content_length`` (when the upstream gave one) larger than
    ``policy.max_object_size`` is hit-for-miss ``too-large``.
    """
    headers = list(headers)
    cc = parse_cache_control(_values(headers, b"cache-control"))
    age = _seconds((_values(headers, b"age") or [b""])[0].decode("latin-1")) or 0.0
    vary = vary_names(_values(headers, b"vary"))

    def hfm(reason: str) -> StoreDecision:
        return StoreDecision(StoreAction.HIT_FOR_MISS, policy.hit_for_miss_ttl, now, vary=vary, reason=reason)

    if _values(headers, b"set-cookie"):
        return hfm("set-cookie")
    for directive in ("private", "no-store", "no-cache"):
        if directive in cc:
            return hfm(directive)
    surrogate = b" ".join(_values(headers, b"surrogate-control")).lower()
    if b"no-store" in surrogate:
        return hfm("surrogate-no-store")
    if vary == (b"*",):
        return hfm("vary-star")
    if content_length is not None and content_length > policy.max_object_size:
        return hfm("too-large")

    ttl: float | None = None
    source = "default"
    stored_at = now
    for directive in ("s-maxage", "max-age"):
        if directive in cc:
            # An invalid value means stale (RFC 9111 4.2.1).
            seconds = _seconds(cc[directive])
            ttl, source, stored_at = (seconds or 0.0), directive, now - age
            break
    if ttl is None:
        expires_values = _values(headers, b"expires")
        if expires_values:
            source = "expires"
            expires = parse_http_date(expires_values[0])
            dates = _values(headers, b"date")
            date = parse_http_date(dates[0]) if dates else None
            if expires is None:
                ttl = 0.0  # an invalid Expires means already expired
            else:
                ttl = expires - (date if date is not None else now)
    explicit = ttl is not None
    if status not in policy.cacheable_statuses and not (explicit and status in policy.explicit_only_statuses):
        return hfm("status")
    if ttl is None:
        ttl = policy.default_ttl
    if ttl <= 0:
        return hfm("ttl")
    swr = _seconds(cc.get("stale-while-revalidate"))
    sie = _seconds(cc.get("stale-if-error"))
    return StoreDecision(
        StoreAction.STORE,
        ttl,
        stored_at,
        grace=policy.grace if swr is None else swr,
        # Keeping a dead object only helps when it can be revalidated.
        keep=policy.keep if (_values(headers, b"etag") or _values(headers, b"last-modified")) else 0.0,
        stale_if_error=sie or 0.0,
        vary=vary,
        reason=source,
    )


# -- keys ---------------------------------------------------------------------


def _b(value: str | bytes) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def key_url(policy: CachePolicy, host: bytes | None, target: bytes) -> bytes:
    """The URL part of a key for a request target (path and query) on a
    Host, as configured: ``host + target`` by default."""
    if not policy.key_query:
        target = target.split(b"?", 1)[0]
    if policy.key_host:
        return (host or b"").lower() + target
    return target


def primary_key(site: str, url: bytes) -> bytes:
    """16 bytes naming one URL of one site, whatever its variants."""
    name = _b(site)
    return _blake2b(b"".join((str(len(name)).encode(), b":", name, url)), digest_size=16).digest()


def cache_key(
    site: str, method_class: bytes, url: bytes, vary_values: bytes, ruleset_version: str | bytes
) -> bytes:
    """32 bytes naming one stored object: :func:`primary_key` (so that all
    the variants of a URL share a prefix and are purged together) followed
    by a hash of the method class, the rule-set version (a changed rule set
    never serves old rewrites) and the :func:`vary_key` values."""
    version = _b(ruleset_version)
    variant = _blake2b(
        b"".join((str(len(method_class)).encode(), b":", method_class, str(len(version)).encode(), b":", version, vary_values)),
        digest_size=16,
    ).digest()
    return primary_key(site, url) + variant


def accept_encoding_bucket(values: Iterable[bytes]) -> bytes:
    """``Accept-Encoding`` values -> one of ``b"br, gzip"``, ``b"br"``,
    ``b"gzip"``, ``b"identity"`` (codings with ``q=0`` do not count; ``*``
    counts as gzip).

    Four buckets rather than three so that a response made for a bucket
    suits every client in it: on a cacheable miss send the bucket upstream
    as ``Accept-Encoding`` (and base any compression Prexy does itself on
    it), not the client's own value.
    """
    values = tuple(values)
    return _bucket(values[0] if len(values) == 1 else b", ".join(values))


@functools.lru_cache(maxsize=512)
def _bucket(value: bytes) -> bytes:
    accepted = set()
    refused = set()
    star = False
    for part in value.split(b","):
        coding, _, params = part.strip().partition(b";")
        coding = coding.strip().lower()
        q = 1.0
        for param in params.split(b";"):
            k, _, v = param.strip().partition(b"=")
            if k.strip().lower() == b"q":
                try:
                    q = float(v.strip())
                except ValueError:
                    q = 0.0
        if coding == b"x-gzip":
            coding = b"gzip"
        if q <= 0:
            refused.add(coding)
        elif coding == b"*":
            star = True
        else:
            accepted.add(coding)
    br = b"br" in accepted
    gzip = b"gzip" in accepted or (star and b"gzip" not in refused)
    if br and gzip:
        return b"br, gzip"
    if br:
        return b"br"
    return b"gzip" if gzip else b"identity"


def vary_key(
    vary: bytes | Iterable[bytes], request_headers: Headers, policy: CachePolicy | None = None
) -> bytes:
    """The request's values for the headers a response varies on, as bytes
    for :func:`cache_key`.

    ``vary`` is a raw ``Vary`` value, or an iterable of them, or the names
    from :func:`vary_names`.  Accept-Encoding is reduced to its
    :func:`accept_encoding_bucket`; with a ``policy``, ``Cookie`` loses the
    cookies it ignores; other headers are their values joined with ``, ``.
    No ``Vary`` gives ``b""``.
    """
    names = _vary_names((vary,) if isinstance(vary, bytes) else tuple(vary))
    if not names:
        return b""
    headers = list(request_headers)
    out = []
    for name in names:
        values = _values(headers, name)
        if name == b"accept-encoding":
            value = accept_encoding_bucket(values)
        elif name == b"cookie" and policy is not None:
            kept = [
                c.strip()
                for v in values
                for c in v.split(b";")
                if c.strip() and not policy.ignored_cookie(c.split(b"=", 1)[0].strip().decode("latin-1"))
            ]
            value = b"; ".join(kept)
        else:
            value = b", ".join(v.strip() for v in values) if values else b""
        present = b"+" if values else b"-"
        out.append(name + b"\0" + present + b"%d:" % len(value) + value)
    return b"\0".join(out)


# -- conditional requests -------------------------------------------------------


def _opaque(tag: bytes) -> bytes:
    tag = tag.strip()
    return tag[2:] if tag[:2] in (b"W/", b"w/") else tag


def not_modified(request_headers: Headers, etag: bytes | None, last_modified: bytes | None) -> bool:
    """Whether a GET/HEAD may be answered 304 from a stored response with
    these validators (RFC 9110 13.2.2): ``If-None-Match`` with the weak
    comparison when present (``*`` matches any stored response), else
    ``If-Modified-Since`` against ``Last-Modified``."""
    headers = list(request_headers)
    inm = _values(headers, b"if-none-match")
    if inm:
        tags = [t.strip() for v in inm for t in v.split(b",") if t.strip()]
        if b"*" in tags:
            return True
        if etag is None:
            return False
        mine = _opaque(etag)
        return any(_opaque(t) == mine for t in tags)
    ims = _values(headers, b"if-modified-since")
    if not ims or last_modified is None:
        return False
    since = parse_http_date(ims[0])
    modified = parse_http_date(last_modified)
    return since is not None and modified is not None and modified <= since


# -- response headers -------------------------------------------------------------

FWD_VALUES = frozenset({"bypass", "method", "uri-miss", "vary-miss", "miss", "request", "stale", "partial"})
_TOKEN = re.compile(r"[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*")


def age_header(stored_at: float, now: float) -> bytes:
    """The ``Age`` value: whole seconds since the response was generated."""
    return b"%d" % int(max(0.0, now - stored_at))


def cache_status_header(
    *,
    hit: bool = False,
    fwd: str | None = None,
    ttl: float | None = None,
    stored: bool = False,
    collapsed: bool = False,
    fwd_status: int | None = None,
    detail: str | None = None,
    name: str = "prexy",
    upstream: bytes | None = None,
) -> bytes:
    """One RFC 9211 ``Cache-Status`` entry, appended to ``upstream``'s value
    when there is one (caches nearer the origin come first).

    ``hit`` and ``fwd`` (one of :data:`FWD_VALUES`) exclude each other;
    ``ttl`` (remaining freshness, negative when stale) is rounded down to
    whole seconds.  Examples: ``prexy; hit; ttl=123``,
    ``prexy; fwd=uri-miss; fwd-status=200; stored``,
    ``prexy; fwd=bypass; detail=cookie``.
    """
    if hit and fwd is not None:
        raise ValueError("a response is either a hit or forwarded, not both")
    if fwd is not None and fwd not in FWD_VALUES:
        raise ValueError(f"unknown fwd value {fwd!r}")
    parts = [name]
    if hit:
        parts.append("hit")
    if fwd is not None:
        parts.append(f"fwd={fwd}")
    if fwd_status is not None:
        parts.append(f"fwd-status={int(fwd_status)}")
    if ttl is not None:
        parts.append(f"ttl={int(ttl // 1)}")
    if stored:
        parts.append("stored")
    if collapsed:
        parts.append("collapsed")
    if detail:
        if _TOKEN.fullmatch(detail):
            parts.append(f"detail={detail}")
        else:
            escaped = detail.replace("\\", "\\\\").replace('"', '\\"')
            parts.append(f'detail="{escaped}"')
    entry = "; ".join(parts).encode("latin-1", "replace")
    if upstream and upstream.strip():
        return upstream.strip() + b", " + entry
    return entry
