"""What may be cached, under which key, for how long: pure functions over
methods, URIs, headers and times (no Twisted, no I/O, no clock: ``now`` is
an argument; the one exception is the reference time of a two-digit year,
below, when no ``now`` is given).

The defaults are Varnish's built-in VCL, made to follow RFC 9111 (HTTP
Caching), RFC 9110 (HTTP Semantics) and RFC 9213 (Targeted Cache-Control)
where Varnish does not:

* Requests (:func:`request_decision`, ``vcl_recv``): only GET and HEAD are
  looked up; a request with ``Authorization``, ``Cookie`` or (beyond
  Varnish, common practice) ``X-Requested-With`` passes.  Beyond Varnish,
  cookies whose names match ``ignore_cookies`` globs (by default the
  analytics cookies ``_ga*``, ``_gid``, ``_gat*``, ``_fbp``, ``_hj*``) are
  ignored for this decision (they still go upstream).  Like Varnish, the
  client's own ``Cache-Control`` is ignored.  The other safe methods
  (OPTIONS, TRACE; RFC 9110 9.2.1) pass, and so does PURGE, which the proxy
  answers itself before asking.  Every other method, registered or not
  (POST, PUT, DELETE, PATCH, M-SEARCH, FOO, even ``get``: methods are
  case-sensitive), is unsafe: it passes and invalidates the URL
  (RFC 9111 4.4; the proxy does it once the answer is not an error).
* Storability (:func:`response_decision`, ``vcl_backend_response``): a
  response is stored when its status is cacheable (200, 203, 204, 300, 301,
  308, 404, 405, 410, 414, 501: RFC 9110 15.1's heuristically cacheable
  ones; 302, 303 and 307 only with explicit freshness; errors and unknown
  statuses never, even with explicit freshness: a transient error page is
  not served for the origin's max-age) and it has no ``Set-Cookie``, no
  ``private / no-store`` directive (``no-store`` with ``must-understand``
  counts only for a status not in those lists, RFC 9111 5.2.2.3), no
  ``Surrogate-Control: no-store`` and no ``Vary: *``.  Otherwise it becomes
  hit-for-miss for ``hit_for_miss_ttl`` (120 s): later requests go straight
  upstream without queueing behind one another.  ``no-cache`` (RFC 9111
  5.2.2.4) is stored with a TTL of 0 and ``keep`` when it has a validator,
  so every use revalidates it; without one it is hit-for-miss.  With field
  names in ``Cache-Control`` (``no-cache="X-User"``) the response is stored
  as usual without those fields (``StoreDecision.omit``).
* Which directives (RFC 9213 2.2, :func:`_directives`): the first of the
  site's targeted field (``targeted_cache_control``, by default
  ``Prexy-Cache-Control``, case-insensitive; "" for none),
  ``CDN-Cache-Control`` and ``Cache-Control`` present in the response wins,
  and only its directives count.  The two targeted fields are Structured
  Field Dictionaries (RFC 8941 3.2, parsed strictly by
  :func:`_sf_dictionary`; several field lines are joined with ", "); one
  that is empty or does not parse is ignored as if absent, and when one
  wins ``Cache-Control`` and ``Expires`` are ignored.  In a targeted field, delta-seconds directives
  (``max-age``, ``s-maxage``, ``stale-while-revalidate``,
  ``stale-if-error``) take only a non-negative Integer (anything else is an
  invalid value), a directive whose value is Boolean false is absent, and
  the restrictive ones (``no-store``, ``private``, ``no-cache``) count
  whatever other value they carry.  Prexy drops its own targeted field
  before answering clients (:func:`targeted_field_names`) and passes
  ``CDN-Cache-Control`` through for the CDNs in front of it.
* Freshness lifetime (Varnish's ``cache_rfc2616.c``, RFC 9111 4.2.1):
  ``s-maxage``, then ``max-age``, then ``Expires`` (less ``Date`` when
  present, so clock skew does not matter; else less ``now``), else
  ``default_ttl``.  A lifetime of 0 or less is hit-for-miss; so is an
  invalid ``max-age`` (RFC 9111 4.2.1: stale) or ``Expires``: not an
  HTTP-date, or more than one ``Expires`` field (RFC 9111 5.3: already
  expired).  Delta-seconds are capped at 2**31 (RFC 9111 1.2.2).
* Age (RFC 9111 4.2.3, :func:`current_age`): the response's age when it
  arrives is ``max(apparent_age, corrected_age_value)`` with
  ``apparent_age = max(0, now - Date)`` and ``corrected_age_value = Age``
  (the response delay is taken as 0: the request time is not known here).
  ``Age`` (RFC 9111 5.1) is its first list member, whether the members come
  in one field (``Age: 7200, 0``) or several; an invalid first member counts
  as 0.  For explicit freshness (max-age, s-maxage, Expires) the object's
  generation time is ``stored_at = now - current_age``, so it stays fresh
  for ``lifetime - current_age``; a ``default_ttl`` counts from ``now``.
* Stale use: ``stale-while-revalidate`` sets the grace (else the site's
  ``grace``), ``stale-if-error`` (RFC 5861) how long a stale copy may
  replace an upstream error (else the site's ``stale_if_error``); ``keep``
  applies to responses with a validator only.  The site's two settings are
  the out-of-band permission RFC 9111 4.2.4 allows; they do not apply to a
  response with ``must-revalidate``, ``proxy-revalidate`` or ``s-maxage``
  (RFC 9111 5.2.2.2, 5.2.2.8, 5.2.2.10), and the site's grace not to one
  already stale on arrival; the response's own RFC 5861 directives do.
* Vary (:func:`vary_key`): a varied-on request header's lines are combined
  into one list, without the whitespace around members or empty members
  (RFC 9111 4.1); ``Accept-Language`` is lower-cased, ``Accept-Encoding``
  reduced to its bucket, ignored cookies dropped from ``Cookie``.
* HTTP-date (RFC 9110 5.6.7, :func:`parse_http_date`): only IMF-fixdate
  (``Sun, 06 Nov 1994 08:49:37 GMT``), the obsolete RFC 850 form
  (``Sunday, 06-Nov-94 08:49:37 GMT``) and asctime
  (``Sun Nov  6 08:49:37 1994``), exactly: GMT only, one space where the
  grammar has one, two digits for each time part, four for an IMF-fixdate
  year, a real calendar date.  Names match case-insensitively (RFC 9111 4.2
  asks caches to), the weekday is not checked against the date, a
  ``:60`` leap second is accepted.  A two-digit year is the one that puts
  the date at most 50 years after ``now`` (RFC 9110 5.6.7).  Everything
  else is invalid; every date in this module goes through this one parser.
* Conditional requests (:func:`not_modified`, RFC 9110 13.1.3 and 13.2.2):
  ``If-None-Match`` (weak comparison) wins over ``If-Modified-Since``,
  which is ignored when it is not a valid HTTP-date or is repeated.
* 304 (:func:`update_headers`, RFC 9111 3.2 and 4.3.4): the fields of a 304
  replace the stored ones of the same name, except those describing the
  stored body or the connection.

Headers are given as an iterable of ``(name, value)`` byte pairs, names in
any case, repeated names allowed (Twisted's
``[(n, v) for n, vs in headers.getAllRawHeaders() for v in vs]``).  A
request's headers may also be given as a table (:data:`FieldTable`: each
lower-case name to its values, in order), which is read by name instead
of walked.
"""

from __future__ import annotations

import calendar
import enum
import fnmatch
import hashlib
import re
import time
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from prexy.shortmemo import short_memo

_blake2b = hashlib.blake2b

__all__ = [
    "Action",
    "CachePolicy",
    "FieldTable",
    "PolicyError",
    "RequestDecision",
    "StoreAction",
    "StoreDecision",
    "accept_encoding_bucket",
    "age_header",
    "cache_key",
    "cache_status_header",
    "current_age",
    "key_url",
    "location_urls",
    "not_modified",
    "parse_cache_control",
    "parse_http_date",
    "primary_key",
    "request_decision",
    "response_decision",
    "targeted_field_names",
    "update_headers",
    "variant_part",
    "vary_key",
    "vary_names",
]

Headers = Iterable[tuple[bytes, bytes]]
#: A request's header fields by lower-case name, values in order.
FieldTable = Mapping[bytes, Sequence[bytes]]

#: Varnish's list plus the rest of RFC 9110 15.1's heuristically cacheable
#: statuses (308, 405, 501; 206 is answered from whole objects instead).
DEFAULT_CACHEABLE = frozenset({200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501})
#: Cacheable only when the response gives explicit freshness (Varnish's 302
#: and 307, and 303).
DEFAULT_EXPLICIT_ONLY = frozenset({302, 303, 307})
#: Directives that forbid serving the response stale without revalidating it
#: (RFC 9111 5.2.2.2, 5.2.2.8; s-maxage implies proxy-revalidate, 5.2.2.10).
_REVALIDATE = ("must-revalidate", "proxy-revalidate", "s-maxage")
LOOKUP_METHODS = frozenset({b"GET", b"HEAD"})
#: RFC 9110 9.2.1's safe methods (CONNECT aside: the proxy refuses it).
SAFE_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE"})
#: Methods that pass without invalidating: the safe ones not looked up, and
#: PURGE, which the proxy handles before asking (it must not invalidate twice
#: nor go upstream as an unsafe method).
PASS_METHODS = (SAFE_METHODS - LOOKUP_METHODS) | {b"PURGE"}


#: Cookies that analytics scripts set on every page view: they do not make
#: a request private (Google Analytics, Facebook pixel, Hotjar).
DEFAULT_IGNORE_COOKIES = ("_ga*", "_gid", "_gat*", "_fbp", "_hj*")
#: Client addresses allowed to send PURGE.
DEFAULT_PURGE_FROM = ("127.0.0.1", "::1")
#: The targeted Cache-Control field meant for Prexy alone (RFC 9213).
DEFAULT_TARGETED_CACHE_CONTROL = "Prexy-Cache-Control"
#: RFC 9110 5.6.2 token: what a field name is made of.
_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


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


def _targeted_name(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or (value and not _FIELD_NAME.fullmatch(value)):
        raise PolicyError(attribute.name, f"not a header field name: {value!r}")
    if value.lower() in ("cache-control", "cdn-cache-control"):
        # Prexy drops its targeted field before answering clients.
        raise PolicyError(attribute.name, f"must be a field of Prexy's own, not {value}")


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
    #: Seconds a stale object may answer instead of an upstream error
    #: (``stale-if-error`` in a response overrides it).
    stale_if_error: float = attrs.field(default=0.0, validator=_non_negative)
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
    #: The name (any case) of the RFC 9213 targeted field whose directives,
    #: when present and valid, decide for Prexy before ``CDN-Cache-Control``
    #: and ``Cache-Control``; "" for none.
    targeted_cache_control: str = attrs.field(default=DEFAULT_TARGETED_CACHE_CONTROL, validator=_targeted_name)

    _cookie_re: re.Pattern[str] | None = attrs.field(init=False, eq=False, repr=False)
    _pass_re: re.Pattern[str] | None = attrs.field(init=False, eq=False, repr=False)
    #: The fields that may carry the directives, in precedence order, lower-case.
    _targets: tuple[bytes, ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        cookie = (
            re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in self.ignore_cookies))
            if self.ignore_cookies
            else None
        )
        passes = re.compile("|".join(f"(?:{p})" for p in self.pass_rules)) if self.pass_rules else None
        object.__setattr__(self, "_cookie_re", cookie)
        object.__setattr__(self, "_pass_re", passes)
        own = self.targeted_cache_control.lower().encode("ascii")
        object.__setattr__(self, "_targets", ((own,) if own else ()) + (b"cdn-cache-control",))

    def ignored_cookie(self, name: str) -> bool:
        """Whether a cookie of this name does not count for the decision."""
        return self._cookie_re is not None and self._cookie_re.match(name) is not None

    def passes(self, target: str) -> bool:
        """Whether a configured pass rule matches the request target."""
        return self._pass_re is not None and self._pass_re.search(target) is not None


def targeted_field_names(policy: CachePolicy) -> frozenset[bytes]:
    """The lower-case names of the response fields meant for Prexy alone:
    its targeted Cache-Control field (none when disabled).  Drop them from
    what is sent to clients (and stored: a hit must not carry them either).
    ``CDN-Cache-Control`` is not one: it is passed through (RFC 9213 3)."""
    name = policy.targeted_cache_control
    return frozenset({name.lower().encode("ascii")}) if name else frozenset()


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


#: The decision of most requests, made once (it is frozen).
_LOOKUP = RequestDecision(Action.LOOKUP)


def _values(headers: Headers | FieldTable, lname: bytes) -> list[bytes]:
    if isinstance(headers, Mapping):
        return list(headers.get(lname, ()))
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


def request_decision(
    policy: CachePolicy, method: bytes, uri: bytes, headers: Headers | FieldTable,
) -> RequestDecision:
    """Lookup, pass or invalidate, with the reason (Varnish's ``vcl_recv``).

    Methods are case-sensitive (RFC 9110 9.1): ``get`` is not ``GET``.  Any
    method neither looked up nor in :data:`PASS_METHODS` is unsafe and
    invalidates (RFC 9111 4.4: an unknown method cannot be assumed safe)."""
    if method not in LOOKUP_METHODS:
        if method in PASS_METHODS:
            return RequestDecision(Action.PASS, "method", method)
        return RequestDecision(Action.INVALIDATE, "unsafe-method", method)
    if isinstance(headers, Mapping):
        names: Any = headers
    else:
        headers = list(headers)
        names = {name.lower() for name, _ in headers}
    # Authorization is the reason given when both are there.
    if b"authorization" in names:
        return RequestDecision(Action.PASS, "authorization")
    if b"x-requested-with" in names:
        return RequestDecision(Action.PASS, "x-requested-with")
    cookies = _values(headers, b"cookie")
    if cookies and any(not policy.ignored_cookie(n) for n in cookie_names(cookies)):
        return RequestDecision(Action.PASS, "cookie")
    if policy.passes(uri.decode("latin-1")):
        return RequestDecision(Action.PASS, "pass-rule")
    return _LOOKUP


# -- HTTP-date (RFC 9110 5.6.7) --------------------------------------------------

_DAY = rb"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_DAY_L = rb"(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
_MONTH = rb"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_TIME = rb"([0-9]{2}):([0-9]{2}):([0-9]{2})"
#: IMF-fixdate: ``Sun, 06 Nov 1994 08:49:37 GMT``.
_IMF_FIXDATE = re.compile(_DAY + rb", ([0-9]{2}) " + _MONTH + rb" ([0-9]{4}) " + _TIME + rb" GMT", re.I)
#: rfc850-date: ``Sunday, 06-Nov-94 08:49:37 GMT``.
_RFC850_DATE = re.compile(_DAY_L + rb", ([0-9]{2})-" + _MONTH + rb"-([0-9]{2}) " + _TIME + rb" GMT", re.I)
#: asctime-date: ``Sun Nov  6 08:49:37 1994`` (the day is 2DIGIT or SP DIGIT).
_ASCTIME_DATE = re.compile(_DAY + rb" " + _MONTH + rb" ([0-9]{2}| [0-9]) " + _TIME + rb" ([0-9]{4})", re.I)
_MONTHS = {m: i for i, m in enumerate((b"jan", b"feb", b"mar", b"apr", b"may", b"jun",
                                       b"jul", b"aug", b"sep", b"oct", b"nov", b"dec"), 1)}

#: (year, month, day, hour, minute, second); year -1 - yy for a two-digit year.
_Fields = tuple[int, int, int, int, int, int]


@short_memo(1024)
def _date_fields(value: bytes) -> _Fields | None:
    """The fields of one of the three HTTP-date forms, range-checked but for
    the day of a two-digit year's month; None for anything else."""
    text = value.strip(b" \t")
    if (m := _IMF_FIXDATE.fullmatch(text)) is not None:
        day, month, year, hh, mm, ss = m.groups()
        y = int(year)
    elif (m := _RFC850_DATE.fullmatch(text)) is not None:
        day, month, year, hh, mm, ss = m.groups()
        y = -1 - int(year)  # resolved by _full_year
    elif (m := _ASCTIME_DATE.fullmatch(text)) is not None:
        month, day, hh, mm, ss, year = m.groups()
        y = int(year)
    else:
        return None
    d, h, mi, s = int(day), int(hh), int(mm), int(ss)
    if y == 0 or not 1 <= d <= 31 or h > 23 or mi > 59 or s > 60:  # :60 is a leap second
        return None
    return (y, _MONTHS[month.lower()], d, h, mi, s)


def _epoch(fields: _Fields) -> float | None:
    y, mo, d, h, mi, s = fields
    if not 1 <= y <= 9999 or d > calendar.monthrange(y, mo)[1]:
        return None
    return float(calendar.timegm((y, mo, d, h, mi, s)))


def _full_year(yy: int, fields: _Fields, now: float) -> int:
    """RFC 9110 5.6.7: a two-digit year more than 50 years after ``now`` is
    the most recent past year with those digits.  So: the latest year ending
    in ``yy`` whose date is not more than 50 years after ``now``."""
    ref = time.gmtime(now)
    limit = ref.tm_year + 50
    year = limit - (limit - yy) % 100
    if (year, *fields[1:]) > (limit, ref.tm_mon, ref.tm_mday, ref.tm_hour, ref.tm_min, ref.tm_sec):
        year -= 100
    return year


def parse_http_date(value: bytes | None, now: float | None = None) -> float | None:
    """An HTTP-date -> epoch seconds; None when absent or invalid.

    Strictly RFC 9110 5.6.7 (see the module's docstring): IMF-fixdate, RFC
    850 and asctime, GMT only, leading and trailing whitespace ignored.
    ``now`` (epoch seconds) places an RFC 850 two-digit year; without it the
    system clock does.
    """
    if value is None:
        return None
    fields = _date_fields(bytes(value))
    if fields is None:
        return None
    if fields[0] < 0:
        try:
            year = _full_year(-1 - fields[0], fields, time.time() if now is None else now)
        except (OverflowError, OSError, ValueError):  # a ``now`` gmtime cannot take
            return None
        fields = (year, *fields[1:])
    return _epoch(fields)


def _singleton(values: list[bytes]) -> bytes | None:
    """A field that allows one value: that value, or None when absent or
    repeated (RFC 9110 5.5: a list where one value is expected is invalid)."""
    return values[0] if len(values) == 1 else None


# -- responses ----------------------------------------------------------------


class StoreAction(enum.Enum):
    STORE = "store"
    HIT_FOR_MISS = "hit-for-miss"


@attrs.frozen
class StoreDecision:
    """Whether and how long to keep a response (``vcl_backend_response``)."""

    action: StoreAction
    #: Seconds fresh from ``stored_at`` (the hit-for-miss TTL for markers):
    #: the freshness lifetime.
    ttl: float
    #: When the response was generated: ``now`` less its
    #: :func:`current_age` for explicit freshness, else ``now``.
    stored_at: float
    grace: float = 0.0
    keep: float = 0.0
    stale_if_error: float = 0.0
    #: Lower-case names from ``Vary`` (see :func:`vary_names`).
    vary: tuple[bytes, ...] = ()
    #: Lower-case field names not to store (``no-cache="name, ..."``).
    omit: frozenset[bytes] = frozenset()
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


# -- targeted fields: RFC 8941 Dictionaries --------------------------------------


class _SFError(ValueError):
    pass


class _Token(str):
    """An RFC 8941 Token (a String is a plain ``str``)."""


_SF_KEY = re.compile(r"[a-z*][a-z0-9_\-.*]*")
_SF_TOKEN = re.compile(r"[A-Za-z*][!#$%&'*+\-.^_`|~0-9A-Za-z:/]*")
_SF_NUMBER = re.compile(r"-?([0-9]+)(?:\.([0-9]*))?")
_SF_BYTES = re.compile(r":[A-Za-z0-9+/=]*:")
_SF_STRING = re.compile(r'"((?:[ !#-\[\]-~]|\\["\\])*)"')
_SF_UNESCAPE = re.compile(r'\\(["\\])')
_SFValue = Any


def _sf_bare_item(text: str, pos: int) -> tuple[_SFValue, int]:
    """RFC 8941 4.2.3.1: one bare item at ``pos``, and the position after it."""
    ch = text[pos : pos + 1]
    if ch == "-" or ch.isdigit():
        m = _SF_NUMBER.match(text, pos)
        if m is None:
            raise _SFError("number")
        whole, frac = m.groups()
        if frac is None:
            if len(whole) > 15:
                raise _SFError("integer too long")
            return int(m.group()), m.end()
        if len(whole) > 12 or not 1 <= len(frac) <= 3:
            raise _SFError("bad decimal")
        return float(m.group()), m.end()
    if ch == '"':
        m = _SF_STRING.match(text, pos)
        if m is None:
            raise _SFError("string")
        return _SF_UNESCAPE.sub(r"\1", m.group(1)), m.end()
    if ch == ":":
        m = _SF_BYTES.match(text, pos)
        if m is None:
            raise _SFError("byte sequence")
        return m.group()[1:-1].encode("ascii"), m.end()
    if ch == "?":
        flag = text[pos + 1 : pos + 2]
        if flag not in ("0", "1"):
            raise _SFError("boolean")
        return flag == "1", pos + 2
    m = _SF_TOKEN.match(text, pos)
    if m is None:
        raise _SFError("no item")
    return _Token(m.group()), m.end()


def _sf_parameters(text: str, pos: int) -> int:
    """RFC 8941 4.2.3.2: skips an item's parameters (ignored here)."""
    while text.startswith(";", pos):
        pos += 1
        while text.startswith(" ", pos):
            pos += 1
        m = _SF_KEY.match(text, pos)
        if m is None:
            raise _SFError("parameter key")
        pos = m.end()
        if text.startswith("=", pos):
            _, pos = _sf_bare_item(text, pos + 1)
    return pos


def _sf_member_value(text: str, pos: int) -> tuple[_SFValue, int]:
    """An item or an inner list (RFC 8941 4.2.1.1), parameters skipped."""
    if not text.startswith("(", pos):
        value, pos = _sf_bare_item(text, pos)
        return value, _sf_parameters(text, pos)
    pos += 1
    items: list[_SFValue] = []
    while True:
        while text.startswith(" ", pos):
            pos += 1
        if text.startswith(")", pos):
            return items, _sf_parameters(text, pos + 1)
        item, pos = _sf_bare_item(text, pos)
        items.append(item)
        pos = _sf_parameters(text, pos)
        if not text.startswith((" ", ")"), pos):
            raise _SFError("inner list")


def _sf_dictionary(text: str) -> dict[str, _SFValue]:
    """RFC 8941 4.2.2: a Dictionary, keys -> values (True for a bare key;
    Integer int, Decimal float, String str, Token :class:`_Token`, Byte
    Sequence bytes, Boolean bool, Inner List list); the last of a repeated
    key wins.  Raises :class:`_SFError` on any syntax error."""
    if not text.isascii():
        raise _SFError("not ASCII")
    text = text.strip(" ")
    out: dict[str, _SFValue] = {}
    pos = 0
    while pos < len(text):
        m = _SF_KEY.match(text, pos)
        if m is None:
            raise _SFError("key")
        key, pos = m.group(), m.end()
        if text.startswith("=", pos):
            value, pos = _sf_member_value(text, pos + 1)
        else:
            value, pos = True, _sf_parameters(text, pos)
        out[key] = value
        while text.startswith((" ", "\t"), pos):
            pos += 1
        if pos == len(text):
            break
        if not text.startswith(",", pos):
            raise _SFError("expected a comma")
        pos += 1
        while text.startswith((" ", "\t"), pos):
            pos += 1
        if pos == len(text):
            raise _SFError("trailing comma")
    return out


#: Directives whose value is delta-seconds: an Integer in a targeted field.
_DELTA_DIRECTIVES = frozenset({"max-age", "s-maxage", "stale-while-revalidate", "stale-if-error"})


@short_memo(512)
def _targeted_directives(value: bytes) -> dict[str, str | None] | None:
    """A targeted field's (combined) value as :func:`parse_cache_control`
    would give it; None when it is empty or not a Dictionary (RFC 9213 2.2:
    then it is ignored).  The result is shared: do not change it."""
    try:
        members = _sf_dictionary(value.decode("latin-1"))
    except _SFError:
        return None
    if not members:
        return None
    out: dict[str, str | None] = {}
    for name, item in members.items():
        if item is False:
            continue  # a Boolean false directive is not given
        if name in _DELTA_DIRECTIVES:
            # Anything but a non-negative Integer is an invalid value (None).
            out[name] = str(item) if type(item) is int and item >= 0 else None
        else:
            out[name] = item if isinstance(item, str) else None
    return out


def _directives(policy: CachePolicy, headers: list[tuple[bytes, bytes]]) -> tuple[dict[str, str | None], bool]:
    """The cache directives that decide for Prexy (RFC 9213 2.2): those of
    the first targeted field present and valid, else ``Cache-Control``'s;
    and whether a targeted field won (then ``Expires`` does not count)."""
    for name in policy._targets:
        values = _values(headers, name)
        if values:
            found = _targeted_directives(b", ".join(values))
            if found is not None:
                return found, True
    return parse_cache_control(_values(headers, b"cache-control")), False


@short_memo(512)
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


def current_age(headers: Headers, now: float, apparent: bool = True) -> float:
    """RFC 9111 4.2.3: a response's age on arrival at ``now``:
    ``max(max(0, now - Date), Age)``, the response delay taken as 0; with
    ``apparent`` False, ``Age`` alone.

    ``Age`` is its first list member (RFC 9111 5.1: ``Age: 7200, 0`` or two
    ``Age`` fields give 7200); an invalid one counts as 0.  ``Date`` counts
    when there is exactly one, valid."""
    headers = list(headers)
    age = 0.0
    for value in _values(headers, b"age"):
        members = [m.strip() for m in value.split(b",") if m.strip()]
        if members:
            age = _seconds(members[0].decode("latin-1")) or 0.0
            break
    if not apparent:
        return age
    date = parse_http_date(_singleton(_values(headers, b"date")), now)
    seen = max(0.0, now - date) if date is not None else 0.0
    return max(seen, age)


def response_decision(
    policy: CachePolicy,
    status: int,
    headers: Headers,
    now: float,
    content_length: int | None = None,
) -> StoreDecision:
    """Store (with TTL, grace, keep, stale-if-error) or hit-for-miss, with
    the reason; the rules are in the module's docstring.

    ``content_length`` (when the upstream gave one) larger than
    ``policy.max_object_size`` is hit-for-miss ``too-large``.
    """
    headers = list(headers)
    cc, targeted = _directives(policy, headers)
    vary = vary_names(_values(headers, b"vary"))

    def hfm(reason: str) -> StoreDecision:
        return StoreDecision(StoreAction.HIT_FOR_MISS, policy.hit_for_miss_ttl, now, vary=vary, reason=reason)

    if _values(headers, b"set-cookie"):
        return hfm("set-cookie")
    understood = status in policy.cacheable_statuses or status in policy.explicit_only_statuses
    # must-understand (RFC 9111 5.2.2.3): no-store is for caches that do not
    # know the status; one that does ignores it, the others store nothing.
    must_understand = "must-understand" in cc
    if must_understand and not understood:
        return hfm("status")
    if "private" in cc:
        return hfm("private")
    if "no-store" in cc and not must_understand:
        return hfm("no-store")
    surrogate = b" ".join(_values(headers, b"surrogate-control")).lower()
    if b"no-store" in surrogate:
        return hfm("surrogate-no-store")
    if vary == (b"*",):
        return hfm("vary-star")
    if content_length is not None and content_length > policy.max_object_size:
        return hfm("too-large")

    ttl: float | None = None
    source = "default"
    for directive in ("s-maxage", "max-age"):
        if directive in cc:
            # An invalid value means stale (RFC 9111 4.2.1).
            ttl, source = (_seconds(cc[directive]) or 0.0), directive
            break
    if ttl is None and not targeted:
        expires_values = _values(headers, b"expires")
        if expires_values:
            source = "expires"
            # Invalid, or repeated: already expired (RFC 9111 5.3).
            expires = parse_http_date(_singleton(expires_values), now)
            date = parse_http_date(_singleton(_values(headers, b"date")), now)
            ttl = 0.0 if expires is None else expires - (date if date is not None else now)
    explicit = ttl is not None
    if status not in policy.cacheable_statuses and not (explicit and status in policy.explicit_only_statuses):
        return hfm("status")
    # Keeping a dead object only helps when it can be revalidated.
    validators = bool(_values(headers, b"etag") or _values(headers, b"last-modified"))
    # A field list counts in Cache-Control; in a targeted field a
    # restrictive directive counts whole, whatever its value.
    names = "" if targeted else cc.get("no-cache") or ""
    omit = frozenset(n.strip().lower().encode("latin-1") for n in names.split(",") if n.strip())
    if "no-cache" in cc and not omit:
        # RFC 9111 5.2.2.4: stored, but never used without revalidating it.
        # (With field names, only those fields need it: they are not
        # stored, the rest is reused as usual.)  Without validators or a
        # keep time there is nothing to revalidate: hit-for-miss.
        if not validators or policy.keep <= 0:
            return hfm("no-cache")
        return StoreDecision(StoreAction.STORE, 0.0, now, keep=policy.keep, vary=vary, reason="no-cache")
    if ttl is None:
        ttl = policy.default_ttl
    if ttl <= 0:
        return hfm("ttl")
    # max-age and s-maxage count from now less Age, as Varnish and nginx
    # count them: the apparent age (now - Date) would make every answer
    # of an origin whose clock is behind stale on arrival, and Date's
    # one-second resolution alone ages a max-age=1 answer by up to a
    # second.  Expires, whose lifetime is Expires - Date, counts it
    # (RFC 9111 4.2.3), so the origin's clock cancels out there.
    stored_at = now - current_age(headers, now, apparent=source == "expires") if explicit else now
    # The site's grace and stale-if-error are out-of-band permission to serve
    # stale (RFC 9111 4.2.4); not where the response demands revalidation,
    # and grace not for an answer already stale on arrival (never fresh
    # here).  The response's own stale-while-revalidate / stale-if-error
    # (RFC 5861) still count: the same origin allowed them explicitly.
    demands = any(d in cc for d in _REVALIDATE)
    site_grace = 0.0 if demands or stored_at + ttl <= now else policy.grace
    swr = _seconds(cc.get("stale-while-revalidate"))
    sie = _seconds(cc.get("stale-if-error"))
    return StoreDecision(
        StoreAction.STORE,
        ttl,
        stored_at,
        grace=site_grace if swr is None else swr,
        keep=policy.keep if validators else 0.0,
        stale_if_error=(0.0 if demands else policy.stale_if_error) if sie is None else sie,
        vary=vary,
        omit=omit,
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


def location_urls(policy: CachePolicy, host: bytes | None, target: bytes, headers: Headers) -> list[bytes]:
    """The key URLs (as :func:`key_url` makes them) of an answer's
    ``Location`` and ``Content-Location`` that an unsafe request's success
    invalidates too (RFC 9111 4.4): each resolved against the request's
    target, kept when it is on the request's host (a reference without an
    authority always is; the scheme is not part of a key), and not the
    request's own URL.  A repeated or unparsable field is ignored."""
    headers = list(headers)
    base = "http://" + (host or b"").decode("latin-1") + target.decode("latin-1")
    own = key_url(policy, host, target)
    out: list[bytes] = []
    for name in (b"location", b"content-location"):
        value = _singleton(_values(headers, name))
        if not value:
            continue
        try:
            reference = value.decode("latin-1").strip()
            absolute = urllib.parse.urlsplit(reference).netloc != ""
            joined = urllib.parse.urlsplit(urllib.parse.urljoin(base, reference))
        except ValueError:
            continue
        if absolute and (host is None or joined.netloc.lower() != host.decode("latin-1").lower()):
            continue
        path = joined.path or "/"
        url = key_url(policy, host, (path + ("?" + joined.query if joined.query else "")).encode("latin-1"))
        if url != own and url not in out:
            out.append(url)
    return out


@short_memo(4096, arg=1)
def primary_key(site: str, url: bytes) -> bytes:
    """16 bytes naming one URL of one site, whatever its variants.  The
    URLs hashed last are remembered: a hot URL's key, needed on every
    hit, is a dictionary lookup (with ``variant_part``'s, 3-4 µs less per
    in-memory hit)."""
    name = _b(site)
    return _blake2b(b"".join((str(len(name)).encode(), b":", name, url)), digest_size=16).digest()


def cache_key(
    site: str, method_class: bytes, url: bytes, vary_values: bytes, ruleset_version: str | bytes
) -> bytes:
    """32 bytes naming one stored object: :func:`primary_key` (so that all
    the variants of a URL share a prefix and are purged together) followed
    by a hash of the method class, the rule-set version (a changed rule set
    never serves old rewrites) and the :func:`vary_key` values."""
    return primary_key(site, url) + variant_part(method_class, vary_values, ruleset_version)


@short_memo(1024, arg=1)
def variant_part(method_class: bytes, vary_values: bytes, ruleset_version: str | bytes) -> bytes:
    """The last 16 bytes of a :func:`cache_key`: which variant of the URL."""
    version = _b(ruleset_version)
    return _blake2b(
        b"".join((str(len(method_class)).encode(), b":", method_class, str(len(version)).encode(), b":", version, vary_values)),
        digest_size=16,
    ).digest()


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


@short_memo(512)
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
    vary: bytes | Iterable[bytes], request_headers: Headers | FieldTable, policy: CachePolicy | None = None
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
    headers = request_headers if isinstance(request_headers, Mapping) else list(request_headers)
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
            value = _list_value(name, values)
        present = b"+" if values else b"-"
        out.append(name + b"\0" + present + b"%d:" % len(value) + value)
    return b"\0".join(out)


def _list_value(name: bytes, values: list[bytes]) -> bytes:
    """A varied-on request header's value for the key, normalised as RFC
    9111 4.1 allows: the field lines combined into one list, each member
    without the whitespace around it, empty members dropped (commas inside
    quoted strings are not separators); ``Accept-Language`` lower-cased."""
    joined = b",".join(values)
    if b'"' in joined:
        value = ", ".join(_split_commas(joined.decode("latin-1"))).encode("latin-1")
    elif b"," in joined:
        value = b", ".join(m for m in (p.strip() for p in joined.split(b",")) if m)
    else:
        value = joined.strip()
    # Language tags and their parameters are case-insensitive (RFC 4647 2.1).
    return value.lower() if name == b"accept-language" else value


# -- conditional requests -------------------------------------------------------


def _opaque(tag: bytes) -> bytes:
    tag = tag.strip()
    return tag[2:] if tag[:2] in (b"W/", b"w/") else tag


def not_modified(
    request_headers: Headers, etag: bytes | None, last_modified: bytes | None, now: float | None = None
) -> bool:
    """Whether a GET/HEAD may be answered 304 from a stored response with
    these validators (RFC 9110 13.2.2): ``If-None-Match`` with the weak
    comparison when present (``*`` matches any stored response), else
    ``If-Modified-Since`` against ``Last-Modified``.  An If-Modified-Since
    that is not one valid HTTP-date (:func:`parse_http_date`; repeated
    fields are invalid) is ignored (RFC 9110 13.1.3).  ``now`` places
    two-digit years (see :func:`parse_http_date`)."""
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
    since = parse_http_date(_singleton(_values(headers, b"if-modified-since")), now)
    modified = parse_http_date(last_modified, now)
    return since is not None and modified is not None and modified <= since


# -- 304: updating stored headers (RFC 9111 3.2, 4.3.4) -----------------------------

#: Fields a 304 never changes in a stored response: they describe the stored
#: body as it was received and stored (its length, framing, coding, range),
#: or are hop-by-hop (RFC 9110 7.6.1; RFC 9111 3.1 does not store them).
#: Any ``Proxy-*`` field (Proxy-Authenticate, Proxy-Connection...) and the
#: names the 304's own Connection lists are excluded too.
NOT_UPDATED = frozenset({
    b"content-length", b"transfer-encoding", b"content-encoding", b"content-range", b"trailer",
    b"connection", b"keep-alive", b"te", b"upgrade",
})


def update_headers(
    stored: Sequence[tuple[bytes, bytes]],
    fresh: Sequence[tuple[bytes, bytes]],
    keep: frozenset[bytes] = frozenset(),
) -> list[tuple[bytes, bytes]]:
    """The stored response's header fields updated from a 304 (``fresh``)
    that validated it (RFC 9111 4.3.4, the update as in 3.2).

    Each field name of ``fresh`` replaces every stored field of that name
    (names compared case-insensitively): its values, in the 304's order and
    spelling, take the place of the first stored field of that name, the
    later stored ones are dropped; names the stored response does not have
    are appended in the 304's order.  Stored fields the 304 does not name
    stay as they are.  A 304 never changes the fields of
    :data:`NOT_UPDATED`, ``Proxy-*``, those its ``Connection`` lists, nor
    the lower-case names in ``keep`` (the caller's: say ``b"etag"`` when the
    stored ETag is one Prexy derived for a rewritten body): the stored
    values of those, if any, stay and the 304's are ignored.

    This only merges; decide on the result (``response_decision`` on the
    merged fields) before storing it: a 304 may bring ``Cache-Control:
    no-store`` or ``Set-Cookie``.
    """
    hop = {t.strip().lower() for n, v in fresh if n.lower() == b"connection" for t in v.split(b",")}

    def updatable(lname: bytes) -> bool:
        return not (lname in NOT_UPDATED or lname in keep or lname in hop or lname.startswith(b"proxy-"))

    new: dict[bytes, list[tuple[bytes, bytes]]] = {}
    for name, value in fresh:
        lname = name.lower()
        if updatable(lname):
            new.setdefault(lname, []).append((name, value))
    out: list[tuple[bytes, bytes]] = []
    placed: set[bytes] = set()
    for name, value in stored:
        lname = name.lower()
        if lname not in new:
            out.append((name, value))
        elif lname not in placed:
            out.extend(new[lname])
            placed.add(lname)
    out.extend((n, v) for n, v in fresh if n.lower() in new and n.lower() not in placed)
    return out


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
