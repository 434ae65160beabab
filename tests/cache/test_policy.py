"""The cache policy: every request and response rule of Varnish's built-in
behaviour (plus ignored cookies and pass rules), TTL precedence, Vary
normalisation, keys, conditional requests and the Cache-Status header."""

from __future__ import annotations

import calendar
import datetime
import email.utils
import itertools
import time

import attrs
from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import (
    Action,
    CachePolicy,
    PolicyError,
    StoreAction,
    accept_encoding_bucket,
    age_header,
    cache_key,
    cache_status_header,
    current_age,
    key_url,
    not_modified,
    parse_cache_control,
    parse_http_date,
    primary_key,
    request_decision,
    response_decision,
    targeted_field_names,
    update_headers,
    vary_key,
    vary_names,
)
from prexy.config import CACHE_KEYS
from tests.cases import expand, param, parametrize

NOW = 1_800_000_000.0
DEFAULT = CachePolicy()
#: Varnish's built-in VCL: every cookie makes a request pass.
VARNISH = CachePolicy(ignore_cookies=())
ANALYTICS = CachePolicy(ignore_cookies=("_ga*", "_gid"), pass_rules=(r"^/admin/", r"[?&]nocache="))


# -- requests ---------------------------------------------------------------------


LM = b"Sun, 06 Nov 1994 08:49:37 GMT"


@expand
class PolicyTests(SynchronousTestCase):
    @parametrize(
        "policy, method, uri, headers, action, reason",
        [
            (DEFAULT, b"GET", b"/", [], Action.LOOKUP, ""),
            (DEFAULT, b"HEAD", b"/", [], Action.LOOKUP, ""),
            (DEFAULT, b"GET", b"/", [(b"Accept", b"*/*")], Action.LOOKUP, ""),
            (DEFAULT, b"POST", b"/", [], Action.INVALIDATE, "unsafe-method"),
            (DEFAULT, b"PUT", b"/", [], Action.INVALIDATE, "unsafe-method"),
            (DEFAULT, b"DELETE", b"/", [], Action.INVALIDATE, "unsafe-method"),
            (DEFAULT, b"PATCH", b"/", [], Action.INVALIDATE, "unsafe-method"),
            (DEFAULT, b"OPTIONS", b"/", [], Action.PASS, "method"),
            (DEFAULT, b"TRACE", b"/", [], Action.PASS, "method"),
            # Methods are case-sensitive: "get" is an unknown, so unsafe, method.
            (DEFAULT, b"get", b"/", [], Action.INVALIDATE, "unsafe-method"),
            (DEFAULT, b"GET", b"/", [(b"Authorization", b"Basic eDp5")], Action.PASS, "authorization"),
            (DEFAULT, b"GET", b"/", [(b"authorization", b"")], Action.PASS, "authorization"),
            (DEFAULT, b"GET", b"/", [(b"Cookie", b"session=1")], Action.PASS, "cookie"),
            (VARNISH, b"GET", b"/", [(b"Cookie", b"_ga=GA1.2.3")], Action.PASS, "cookie"),
            # By default the analytics cookies are ignored.
            (DEFAULT, b"GET", b"/", [(b"Cookie", b"_ga=GA1.2.3; _fbp=fb.1; _hjSession=1")], Action.LOOKUP, ""),
            (DEFAULT, b"GET", b"/", [(b"X-Requested-With", b"XMLHttpRequest")], Action.PASS, "x-requested-with"),
            # Ignored cookies: only analytics cookies left -> still a lookup.
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b"_ga=GA1.2.3; _gid=GA1.4")], Action.LOOKUP, ""),
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b"_ga_ABC=1"), (b"Cookie", b"_gid=2")], Action.LOOKUP, ""),
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b"_ga=1; session=2")], Action.PASS, "cookie"),
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b"_gid=1"), (b"Cookie", b"sid=2")], Action.PASS, "cookie"),
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b"_gidx=1")], Action.PASS, "cookie"),
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b"")], Action.LOOKUP, ""),
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b" ; ")], Action.LOOKUP, ""),
            # Pass rules (re.search on the target).
            (ANALYTICS, b"GET", b"/admin/x", [], Action.PASS, "pass-rule"),
            (ANALYTICS, b"GET", b"/a?x=1&nocache=1", [], Action.PASS, "pass-rule"),
            (ANALYTICS, b"GET", b"/public/admin/", [], Action.LOOKUP, ""),
            (ANALYTICS, b"HEAD", b"/admin/", [], Action.PASS, "pass-rule"),
            # Authorization wins over ignorable cookies.
            (ANALYTICS, b"GET", b"/", [(b"Cookie", b"_ga=1"), (b"Authorization", b"x")], Action.PASS, "authorization"),
        ],
    )
    def test_request_decision(
        self,
        policy: CachePolicy, method: bytes, uri: bytes, headers: list[tuple[bytes, bytes]], action: Action, reason: str
    ) -> None:
        """Each vcl_recv rule gives its action and reason."""
        decision = request_decision(policy, method, uri, headers)
        assert (decision.action, decision.reason) == (action, reason)

    def test_method_class(self) -> None:
        """GET and HEAD share one method class; other methods keep their own."""
        assert request_decision(DEFAULT, b"HEAD", b"/", []).method_class == b"GET"
        assert request_decision(DEFAULT, b"GET", b"/", []).method_class == b"GET"
        assert request_decision(DEFAULT, b"POST", b"/", []).method_class == b"POST"

    def test_policy_validation(self) -> None:
        """Bad configuration fails at creation, with the field named."""
        with self.assertRaisesRegex(ValueError, "pass_rules"):
            CachePolicy(pass_rules=("(",))
        with self.assertRaisesRegex(ValueError, "default_ttl"):
            CachePolicy(default_ttl=-1)
        with self.assertRaisesRegex(ValueError, "ignore_cookies"):
            CachePolicy(ignore_cookies=("",))
        with self.assertRaises(PolicyError) as info:
            CachePolicy(keep=-1)
        assert (info.exception.field, info.exception.reason) == ("keep", "must be 0 or more, got -1")
        assert attrs.evolve(DEFAULT, default_ttl=60).default_ttl == 60
        assert CachePolicy(pass_rules=["^/x"]) == CachePolicy(pass_rules=("^/x",))

    def test_defaults_are_the_documented_ones(self) -> None:
        """The defaults are those README.md and conf/prexy.toml document for a
        site's cache keys (``SiteConfig.cache`` is this same value)."""
        assert (DEFAULT.default_ttl, DEFAULT.grace, DEFAULT.keep, DEFAULT.hit_for_miss_ttl) == (300, 10, 300, 120)
        assert DEFAULT.stale_if_error == 0
        assert DEFAULT.targeted_cache_control == "Prexy-Cache-Control"
        assert DEFAULT.max_object_size == 8 * 1024 * 1024
        assert DEFAULT.ignore_cookies == ("_ga*", "_gid", "_gat*", "_fbp", "_hj*")
        assert DEFAULT.pass_rules == ()
        assert DEFAULT.purge_from == ("127.0.0.1", "::1")

    @parametrize(
        "status, headers, reason",
        [
            (200, [(b"Set-Cookie", b"a=1")], "set-cookie"),
            (200, [(b"Cache-Control", b"private")], "private"),
            (200, [(b"Cache-Control", b"max-age=60, private")], "private"),
            (200, [(b"Cache-Control", b"no-store")], "no-store"),
            (200, [(b"Cache-Control", b"no-cache")], "no-cache"),
            (200, [(b"CACHE-CONTROL", b"Max-Age=60"), (b"Cache-Control", b"No-Store")], "no-store"),
            (200, [(b"Surrogate-Control", b"no-store")], "surrogate-no-store"),
            (200, [(b"Vary", b"*")], "vary-star"),
            (200, [(b"Vary", b"Accept-Encoding, *")], "vary-star"),
            (500, [], "status"),
            (503, [(b"Cache-Control", b"max-age=60")], "status"),
            (206, [], "status"),
            (302, [], "status"),
            (307, [], "status"),
            (200, [(b"Cache-Control", b"max-age=0")], "ttl"),
            (200, [(b"Cache-Control", b"s-maxage=0, max-age=60")], "ttl"),
            (200, [(b"Expires", b"0")], "ttl"),
            # An invalid max-age means stale (RFC 9111 4.2.1).
            (200, [(b"Cache-Control", b"max-age=soon")], "ttl"),
            (200, [(b"Cache-Control", b"max-age=-1")], "ttl"),
            (200, [(b"Cache-Control", b"max-age")], "ttl"),
            (200, [(b"Expires", b"Thu, 01 Jan 1970 00:00:00 GMT")], "ttl"),
        ],
    )
    def test_not_stored(self, status: int, headers: list[tuple[bytes, bytes]], reason: str) -> None:
        """Anything that forbids storing makes the answer hit-for-miss for 120 s."""
        decision = response_decision(DEFAULT, status, headers, NOW)
        assert decision.action is StoreAction.HIT_FOR_MISS
        assert decision.reason == reason
        assert decision.ttl == 120.0
        assert not decision.store

    @parametrize("status", [200, 203, 204, 300, 301, 404, 410, 414])
    def test_cacheable_statuses_default_ttl(self, status: int) -> None:
        """Every cacheable status without freshness headers gets the default TTL and grace."""
        decision = response_decision(DEFAULT, status, [(b"Content-Type", b"text/html")], NOW)
        assert decision.store
        assert (decision.ttl, decision.grace, decision.reason, decision.stored_at) == (300.0, 10.0, "default", NOW)

    @parametrize("status", [302, 307])
    def test_explicit_only_statuses(self, status: int) -> None:
        """302 and 307 are stored only with explicit freshness."""
        decision = response_decision(DEFAULT, status, [(b"Cache-Control", b"max-age=30")], NOW)
        assert decision.store and decision.ttl == 30

    @parametrize(
        "headers, ttl, reason",
        [
            ([(b"Cache-Control", b"s-maxage=10, max-age=20"), (b"Expires", b"Fri, 15 Jan 2027 08:00:00 GMT")], 10, "s-maxage"),
            ([(b"Cache-Control", b"max-age=20, s-maxage=10")], 10, "s-maxage"),
            ([(b"Cache-Control", b"max-age=20"), (b"Expires", b"Fri, 15 Jan 2027 08:00:00 GMT")], 20, "max-age"),
            ([(b"Cache-Control", b"public"), (b"Cache-Control", b"max-age=20")], 20, "max-age"),
            ([(b"Cache-Control", b'max-age="20"')], 20, "max-age"),
            # Expires relative to Date, whatever our clock says.
            (
                [(b"Date", b"Fri, 15 Jan 2027 08:00:00 GMT"), (b"Expires", b"Fri, 15 Jan 2027 08:01:40 GMT")],
                100,
                "expires",
            ),
            ([(b"Cache-Control", b"max-age=99999999999999")], 2**31, "max-age"),
            ([], 300, "default"),
        ],
    )
    def test_ttl_precedence(self, headers: list[tuple[bytes, bytes]], ttl: float, reason: str) -> None:
        """s-maxage, then max-age, then Expires (against Date when present), then the default."""
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert decision.store
        assert decision.reason == reason
        # pytest.approx's default tolerance: relative 1e-6, absolute 1e-12.
        assert abs(decision.ttl - ttl) <= max(1e-6 * abs(ttl), 1e-12), (decision.ttl, ttl)

    def test_expires_without_date_is_relative_to_now(self) -> None:
        """With no Date, Expires counts from ``now``."""
        expires = parse_http_date(b"Fri, 15 Jan 2027 08:01:40 GMT")
        assert expires is not None
        decision = response_decision(DEFAULT, 200, [(b"Expires", b"Fri, 15 Jan 2027 08:01:40 GMT")], expires - 42)
        assert decision.ttl == 42

    def test_age_counts_against_max_age(self) -> None:
        """An upstream Age moves the generation time back; the TTL stays max-age."""
        decision = response_decision(DEFAULT, 200, [(b"Cache-Control", b"max-age=100"), (b"Age", b"30")], NOW)
        assert (decision.ttl, decision.stored_at) == (100, NOW - 30)
        decision = response_decision(DEFAULT, 200, [(b"Age", b"30")], NOW)
        assert decision.stored_at == NOW  # default TTL: from now

    def test_stale_directives(self) -> None:
        """stale-while-revalidate sets the grace, stale-if-error is kept; keep
        comes from the policy, for responses with a validator only."""
        policy = CachePolicy(grace=5, keep=60)
        cc = (b"Cache-Control", b"max-age=10, stale-while-revalidate=30, stale-if-error=600")
        decision = response_decision(policy, 200, [cc, (b"ETag", b'"x"')], NOW)
        assert (decision.grace, decision.stale_if_error, decision.keep) == (30, 600, 60)
        decision = response_decision(policy, 200, [(b"Cache-Control", b"max-age=10")], NOW)
        assert (decision.grace, decision.stale_if_error, decision.keep) == (5, 0, 0)

    def test_too_large_and_vary(self) -> None:
        """A Content-Length above max_object_size is hit-for-miss; Vary names are recorded."""
        policy = CachePolicy(max_object_size=100, hit_for_miss_ttl=7)
        too_large = response_decision(policy, 200, [], NOW, content_length=101)
        assert (too_large.action, too_large.reason, too_large.ttl) == (StoreAction.HIT_FOR_MISS, "too-large", 7)
        fits = response_decision(policy, 200, [(b"Vary", b"Accept-Encoding, Accept-Language")], NOW, content_length=100)
        assert fits.store and fits.vary == (b"accept-encoding", b"accept-language")

    def test_parse_cache_control(self) -> None:
        """Directives are lower-cased, quoted values unquoted, commas in quotes kept, first one wins."""
        assert parse_cache_control([b'Max-Age=5, no-cache="a, b", public', b"max-age=9"]) == {
            "max-age": "5",
            "no-cache": "a, b",
            "public": None,
        }

    @parametrize(
        "text",
        [b"Sun, 06 Nov 1994 08:49:37 GMT", b"Sunday, 06-Nov-94 08:49:37 GMT", b"Sun Nov  6 08:49:37 1994"],
    )
    def test_http_dates(self, text: bytes) -> None:
        """The three HTTP date formats parse to the same instant; garbage to None."""
        assert parse_http_date(text) == 784111777.0
        assert parse_http_date(b"garbage") is None
        assert parse_http_date(None) is None

    @parametrize(
        "values, bucket",
        [
            ([b"gzip, deflate, br"], b"br, gzip"),
            ([b"gzip, deflate, br, zstd"], b"br, gzip"),
            ([b"br;q=1.0, gzip;q=0.8, *;q=0.1"], b"br, gzip"),
            ([b"gzip"], b"gzip"),
            ([b"x-gzip"], b"gzip"),
            ([b"GZIP;q=0.5"], b"gzip"),
            ([b"deflate, gzip"], b"gzip"),
            ([b"br"], b"br"),
            ([b"br, gzip;q=0"], b"br"),
            ([b"*"], b"gzip"),
            ([b"*, gzip;q=0"], b"identity"),
            ([b"identity"], b"identity"),
            ([b"deflate"], b"identity"),
            ([b"gzip;q=0"], b"identity"),
            ([b"gzip;q=nonsense"], b"identity"),
            ([], b"identity"),
            ([b"gzip", b"br"], b"br, gzip"),
        ],
    )
    def test_accept_encoding_buckets(self, values: list[bytes], bucket: bytes) -> None:
        """Accept-Encoding collapses to four buckets; q=0 refuses a coding."""
        assert accept_encoding_bucket(values) == bucket

    def test_vary_names(self) -> None:
        """Vary values become sorted, unique, lower-case names; * wins."""
        assert vary_names([b"Accept-Encoding, User-Agent", b"accept-encoding"]) == (b"accept-encoding", b"user-agent")
        assert vary_names([b"Accept, *"]) == (b"*",)
        assert vary_names([b"", b" , "]) == ()

    def test_vary_key(self) -> None:
        """Only the named headers matter; Accept-Encoding by bucket; order and case of names do not."""
        chrome = [(b"Accept-Encoding", b"gzip, deflate, br"), (b"User-Agent", b"Chrome"), (b"Accept-Language", b"fr")]
        firefox = [(b"accept-encoding", b"br, gzip"), (b"User-Agent", b"Firefox"), (b"Accept-Language", b"fr")]
        curl = [(b"User-Agent", b"curl")]
        assert vary_key(b"", chrome) == b""
        assert vary_key([], chrome) == b""
        assert vary_key(b"Accept-Encoding", chrome) == vary_key(b"accept-encoding", firefox)
        assert vary_key(b"Accept-Encoding", chrome) != vary_key(b"Accept-Encoding", curl)
        assert vary_key(b"Accept-Encoding, Accept-Language", chrome) == vary_key(
            [b"accept-language", b"ACCEPT-ENCODING"], firefox
        )
        assert vary_key(b"User-Agent", chrome) != vary_key(b"User-Agent", firefox)
        # An absent header differs from an empty one.
        assert vary_key(b"Accept-Language", curl) != vary_key(b"Accept-Language", [(b"Accept-Language", b"")])
        # Repeated headers are joined.
        assert vary_key(b"Accept-Language", [(b"Accept-Language", b"fr"), (b"Accept-Language", b"en")]) == vary_key(
            b"Accept-Language", [(b"Accept-Language", b"fr, en")]
        )

    def test_vary_cookie_ignores_ignored_cookies(self) -> None:
        """With a policy, Vary: Cookie sees only the cookies that count."""
        a = [(b"Cookie", b"_ga=1; theme=dark")]
        b = [(b"Cookie", b"theme=dark; _gid=7")]
        assert vary_key(b"Cookie", a, ANALYTICS) == vary_key(b"Cookie", b, ANALYTICS)
        assert vary_key(b"Cookie", a) != vary_key(b"Cookie", b)

    @given(st.lists(st.tuples(st.sampled_from([b"Accept-Encoding", b"Accept", b"X"]), st.binary(max_size=20)), max_size=6))
    def test_vary_key_header_order(self, headers: list[tuple[bytes, bytes]]) -> None:
        """Only the relative order of repeated headers of one name can change the key."""
        ae_last = [h for h in headers if h[0] != b"Accept-Encoding"] + [h for h in headers if h[0] == b"Accept-Encoding"]
        assert vary_key(b"Accept-Encoding, Accept", headers) == vary_key(b"Accept, Accept-Encoding", ae_last)

    @given(st.lists(st.binary(max_size=40), max_size=4))
    def test_accept_encoding_never_fails(self, values: list[bytes]) -> None:
        """Any Accept-Encoding bytes give one of the four buckets."""
        assert accept_encoding_bucket(values) in (b"br, gzip", b"br", b"gzip", b"identity")

    def test_cache_key(self) -> None:
        """Keys: 32 bytes, the URL's primary key first; every component changes the key."""
        base = cache_key("site", b"GET", b"example.com/a?b=1", b"", "rules-1")
        assert len(base) == 32 and base[:16] == primary_key("site", b"example.com/a?b=1")
        variants = [
            cache_key("other", b"GET", b"example.com/a?b=1", b"", "rules-1"),
            cache_key("site", b"POST", b"example.com/a?b=1", b"", "rules-1"),
            cache_key("site", b"GET", b"example.com/a?b=2", b"", "rules-1"),
            cache_key("site", b"GET", b"example.com/a?b=1", vary_key(b"Accept-Encoding", []), "rules-1"),
            cache_key("site", b"GET", b"example.com/a?b=1", b"", "rules-2"),
            cache_key("site", b"GET", b"example.com/a?b=1", b"", b"rules-2"),
        ]
        assert base not in variants
        assert variants[4] == variants[5]
        assert len(set(variants)) == 5
        # Same URL, other variant: same prefix (purge_url scans it).
        assert variants[3][:16] == variants[4][:16] == base[:16]
        # No ambiguity between site and URL.
        assert primary_key("a", b"b\0c") != primary_key("a\0b", b"c")

    def test_key_url(self) -> None:
        """The key's URL: Host (lower-cased) and target by default; both configurable."""
        assert key_url(DEFAULT, b"Example.COM", b"/a?b=1") == b"example.com/a?b=1"
        assert key_url(DEFAULT, None, b"/a") == b"/a"
        assert key_url(CachePolicy(key_host=False), b"x", b"/a?b=1") == b"/a?b=1"
        assert key_url(CachePolicy(key_query=False), b"x", b"/a?b=1") == b"x/a"

    @parametrize(
        "headers, etag, last_modified, expected",
        [
            ([(b"If-None-Match", b'"abc"')], b'"abc"', None, True),
            ([(b"If-None-Match", b'W/"abc"')], b'"abc"', None, True),
            ([(b"If-None-Match", b'"abc"')], b'W/"abc"', None, True),
            ([(b"If-None-Match", b'"x", "abc"')], b'"abc"', None, True),
            ([(b"If-None-Match", b'"x"'), (b"If-None-Match", b'"abc"')], b'"abc"', None, True),
            ([(b"If-None-Match", b'"abcd"')], b'"abc"', None, False),
            ([(b"If-None-Match", b'"abc"')], None, LM, False),
            ([(b"If-None-Match", b"*")], None, None, True),
            # If-None-Match wins over If-Modified-Since.
            ([(b"If-None-Match", b'"x"'), (b"If-Modified-Since", LM)], b'"abc"', LM, False),
            ([(b"If-Modified-Since", LM)], None, LM, True),
            ([(b"If-Modified-Since", b"Sun, 06 Nov 1994 08:49:38 GMT")], None, LM, True),
            ([(b"If-Modified-Since", b"Sun, 06 Nov 1994 08:49:36 GMT")], None, LM, False),
            ([(b"If-Modified-Since", b"yesterday")], None, LM, False),
            ([(b"If-Modified-Since", LM)], b'"abc"', None, False),
            ([], b'"abc"', LM, False),
        ],
    )
    def test_not_modified(
        self,
        headers: list[tuple[bytes, bytes]], etag: bytes | None, last_modified: bytes | None, expected: bool
    ) -> None:
        """RFC 9110 13.2.2: weak If-None-Match comparison first, else If-Modified-Since."""
        assert not_modified(headers, etag, last_modified) is expected

    def test_cache_status_header(self) -> None:
        """RFC 9211 entries for the outcomes the proxy reports."""
        assert cache_status_header(hit=True, ttl=123.7) == b"prexy; hit; ttl=123"
        assert cache_status_header(hit=True, ttl=-2.5) == b"prexy; hit; ttl=-3"
        assert cache_status_header(fwd="miss", stored=True) == b"prexy; fwd=miss; stored"
        assert cache_status_header(fwd="uri-miss", fwd_status=200, stored=True) == b"prexy; fwd=uri-miss; fwd-status=200; stored"
        assert cache_status_header(fwd="stale", fwd_status=304, ttl=-5) == b"prexy; fwd=stale; fwd-status=304; ttl=-5"
        assert cache_status_header(fwd="bypass", detail="cookie") == b"prexy; fwd=bypass; detail=cookie"
        assert cache_status_header(fwd="miss", collapsed=True) == b"prexy; fwd=miss; collapsed"
        assert cache_status_header(fwd="bypass", detail="x-requested-with") == b"prexy; fwd=bypass; detail=x-requested-with"
        assert cache_status_header(fwd="bypass", detail='a "b"') == b'prexy; fwd=bypass; detail="a \\"b\\""'
        assert cache_status_header(hit=True, upstream=b"origin; fwd=uri-miss") == b"origin; fwd=uri-miss, prexy; hit"
        with self.assertRaises(ValueError):
            cache_status_header(hit=True, fwd="miss")
        with self.assertRaises(ValueError):
            cache_status_header(fwd="nonsense")

    def test_age_header(self) -> None:
        """Age: whole seconds, never negative."""
        assert age_header(NOW, NOW + 12.9) == b"12"
        assert age_header(NOW, NOW - 5) == b"0"

    def test_every_rule_combination_is_decided(self) -> None:
        """No combination of request headers makes the decision raise."""
        headers = [(b"Authorization", b"x"), (b"Cookie", b"_ga=1"), (b"Cookie", b"s=1"), (b"X-Requested-With", b"y")]
        for n in range(len(headers) + 1):
            for combo in itertools.combinations(headers, n):
                for method in (b"GET", b"HEAD", b"POST", b"BREW"):
                    request_decision(ANALYTICS, method, b"/", list(combo))


# -- RFC 9111 conformance -----------------------------------------------------------

#: 2027-01-15 08:00:00 GMT, as an HTTP-date.
NOW_DATE = b"Fri, 15 Jan 2027 08:00:00 GMT"
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_LONG_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def imf(t: float) -> bytes:
    """``t`` as an IMF-fixdate."""
    return email.utils.formatdate(t, usegmt=True).encode()


def gmt(*fields: int) -> float:
    return float(calendar.timegm((*fields, 0, 0, 0)[:6]))


@expand
class HttpDateTests(SynchronousTestCase):
    """RFC 9110 5.6.7: three forms, exactly; everything else is invalid."""

    @parametrize(
        "text, expected",
        [
            param(b"Sun, 06 Nov 1994 08:49:37 GMT", 784111777.0, id="imf_fixdate"),
            param(b"Sunday, 06-Nov-94 08:49:37 GMT", 784111777.0, id="rfc850"),
            param(b"Sun Nov  6 08:49:37 1994", 784111777.0, id="asctime"),
            param(b"Sun Nov 06 08:49:37 1994", 784111777.0, id="asctime_two_digit_day"),
            param(b"Sun Nov 16 08:49:37 1994", 784111777.0 + 10 * 86400, id="asctime_day_16"),
            # RFC 9111 4.2: a cache matches dates case-insensitively.
            param(b"sun, 06 nov 1994 08:49:37 gmt", 784111777.0, id="imf_lower_case"),
            param(b"SUNDAY, 06-NOV-94 08:49:37 GMT", 784111777.0, id="rfc850_upper_case"),
            # Leading and trailing whitespace is not part of a field value.
            param(b" Sun, 06 Nov 1994 08:49:37 GMT\t", 784111777.0, id="surrounding_whitespace"),
            # The weekday is redundant: not checked against the date.
            param(b"Mon, 06 Nov 1994 08:49:37 GMT", 784111777.0, id="weekday_not_checked"),
            param(b"Thu, 01 Jan 1970 00:00:00 GMT", 0.0, id="epoch"),
            param(b"Wed, 31 Dec 1969 23:59:59 GMT", -1.0, id="before_epoch"),
            param(b"Thu, 29 Feb 1996 00:00:00 GMT", gmt(1996, 2, 29), id="leap_day"),
            param(b"Tuesday, 29-Feb-00 00:00:00 GMT", gmt(2000, 2, 29), id="rfc850_leap_day_2000"),
            param(b"Sat, 31 Dec 2016 23:59:60 GMT", gmt(2017, 1, 1), id="leap_second"),
            param(b"Fri, 31 Dec 9999 23:59:59 GMT", gmt(9999, 12, 31, 23, 59, 59), id="year_9999"),
            param(b"Mon, 01 Jan 0001 00:00:00 GMT", gmt(1, 1, 1), id="year_1"),
            param(b"Fri, 15 Jan 2027 08:00:00 GMT", NOW, id="now"),
        ],
    )
    def test_valid(self, text: bytes, expected: float) -> None:
        """Each RFC 9110 form (any case, any weekday) parses to its instant."""
        assert parse_http_date(text, NOW) == expected

    @parametrize(
        "text",
        [
            param(b"Sun, 06 Nov 1994 08:49:37 UTC", id="zone_utc"),
            param(b"Sun, 06 Nov 1994 08:49:37 UT", id="zone_ut"),
            param(b"Sun, 06 Nov 1994 08:49:37 EST", id="zone_est"),
            param(b"Sun, 06 Nov 1994 08:49:37 +0000", id="zone_plus_0000"),
            param(b"Sun, 06 Nov 1994 08:49:37 -0800", id="zone_minus_0800"),
            param(b"Sun, 06 Nov 1994 08:49:37 Z", id="zone_z"),
            param(b"Sun, 06 Nov 1994 08:49:37", id="no_zone"),
            param(b"Sun Nov  6 08:49:37 1994 GMT", id="asctime_with_zone"),
            param(b"Sun, 06 Nov 94 08:49:37 GMT", id="imf_two_digit_year"),
            param(b"Sun, 06 Nov 01994 08:49:37 GMT", id="imf_five_digit_year"),
            param(b"Sunday, 06-Nov-1994 08:49:37 GMT", id="rfc850_four_digit_year"),
            param(b"Sun 06 Nov 1994 08:49:37 GMT", id="imf_no_comma"),
            param(b"Sunday 06-Nov-94 08:49:37 GMT", id="rfc850_no_comma"),
            param(b"Sun,06 Nov 1994 08:49:37 GMT", id="no_space_after_comma"),
            param(b"Sun,  06 Nov 1994 08:49:37 GMT", id="two_spaces_after_comma"),
            param(b"Sun, 06 Nov 1994  08:49:37 GMT", id="two_spaces_before_time"),
            param(b"Sun, 06  Nov 1994 08:49:37 GMT", id="two_spaces_before_month"),
            param(b"Sun, 06 Nov 1994 08:49:37  GMT", id="two_spaces_before_zone"),
            param(b"Sun Nov 6 08:49:37 1994", id="asctime_one_space_one_digit_day"),
            param(b"Sun Nov   6 08:49:37 1994", id="asctime_three_spaces"),
            param(b"Sun, 06-Nov-1994 08:49:37 GMT", id="imf_with_dashes"),
            param(b"Sunday, 06 Nov 94 08:49:37 GMT", id="rfc850_without_dashes"),
            param(b"Sun, 06.Nov.1994 08:49:37 GMT", id="periods_in_date"),
            param(b"Sun, 06 Nov 1994 08.49.37 GMT", id="periods_in_time"),
            param(b"Sun., 06 Nov 1994 08:49:37 GMT", id="period_after_day"),
            param(b"Sun, 6 Nov 1994 08:49:37 GMT", id="one_digit_day"),
            param(b"Sun, 06 Nov 1994 8:49:37 GMT", id="one_digit_hour"),
            param(b"Sun, 06 Nov 1994 08:9:37 GMT", id="one_digit_minute"),
            param(b"Sun, 06 Nov 1994 08:49:7 GMT", id="one_digit_second"),
            param(b"Sun, 06 Nov 1994 08:49 GMT", id="no_seconds"),
            param(b"Sunday, 06 Nov 1994 08:49:37 GMT", id="imf_long_day_name"),
            param(b"Sun, 06-Nov-94 08:49:37 GMT", id="rfc850_short_day_name"),
            param(b"Sunday Nov  6 08:49:37 1994", id="asctime_long_day_name"),
            param(b"Sux, 06 Nov 1994 08:49:37 GMT", id="not_a_day_name"),
            param(b"06 Nov 1994 08:49:37 GMT", id="no_day_name"),
            param(b"Sun, 06 November 1994 08:49:37 GMT", id="long_month_name"),
            param(b"Sun, 06 Nox 1994 08:49:37 GMT", id="not_a_month"),
            param(b"Sun, 06 11 1994 08:49:37 GMT", id="numeric_month"),
            param(b"Sun, 00 Nov 1994 08:49:37 GMT", id="day_0"),
            param(b"Thu, 31 Nov 1994 08:49:37 GMT", id="november_31"),
            param(b"Wed, 29 Feb 1995 00:00:00 GMT", id="february_29_not_a_leap_year"),
            param(b"Mon, 29 Feb 1900 00:00:00 GMT", id="february_29_1900"),
            param(b"Sun, 06 Nov 1994 24:00:00 GMT", id="hour_24"),
            param(b"Sun, 06 Nov 1994 08:60:00 GMT", id="minute_60"),
            param(b"Sun, 06 Nov 1994 08:49:61 GMT", id="second_61"),
            param(b"Sun, 06 Nov 0000 08:49:37 GMT", id="year_0"),
            param(b"Sun, 06 Nov 1994 08:49:37 GMT;", id="trailing_garbage"),
            param(b"Sun, 06 Nov 1994 08:49:37 GMT, Sun, 06 Nov 1994 08:49:37 GMT", id="two_dates"),
            param(b"Sun, 06 Nov 1994 08:49:37 GMT\xa0", id="trailing_nbsp"),
            param(b"Sun, \xef\xbc\x90\xef\xbc\x96 Nov 1994 08:49:37 GMT", id="fullwidth_digits"),
            param(b"1994-11-06T08:49:37Z", id="iso_8601"),
            param(b"784111777", id="epoch_seconds"),
            param(b"0", id="zero"),
            param(b"-1", id="minus_one"),
            param(b"", id="empty"),
            param(b"garbage", id="garbage"),
        ],
    )
    def test_invalid(self, text: bytes) -> None:
        """Other zones, two-digit IMF years, missing commas, extra or missing
        spaces, misplaced dashes or periods, one-digit fields, wrong day or
        month names, impossible dates and times: all None."""
        assert parse_http_date(text, NOW) is None

    def test_none(self) -> None:
        """No value, no date."""
        assert parse_http_date(None) is None

    @parametrize(
        "text, now, year",
        [
            param(b"Sunday, 06-Nov-94 08:49:37 GMT", NOW, 1994, id="94_is_1994"),
            param(b"Saturday, 01-Jan-00 00:00:00 GMT", NOW, 2000, id="00_is_2000"),
            param(b"Thursday, 01-Jan-50 00:00:00 GMT", NOW, 2050, id="50_is_2050"),
            # Exactly 50 years ahead is not "more than 50 years in the future".
            param(b"Friday, 15-Jan-77 08:00:00 GMT", NOW, 2077, id="50_years_ahead"),
            param(b"Saturday, 15-Jan-77 08:00:01 GMT", NOW, 1977, id="50_years_and_1_s_ahead"),
            param(b"Saturday, 01-Jan-78 00:00:00 GMT", NOW, 1978, id="78_is_1978"),
            # The window moves with now: in 2090, 05 is 2105, 41 is 2041.
            param(b"Monday, 01-Jun-05 00:00:00 GMT", gmt(2090, 1, 1), 2105, id="in_2090_05_is_2105"),
            param(b"Monday, 01-Jun-41 00:00:00 GMT", gmt(2090, 1, 1), 2041, id="in_2090_41_is_2041"),
        ],
    )
    def test_rfc850_two_digit_year(self, text: bytes, now: float, year: int) -> None:
        """RFC 9110 5.6.7: a two-digit year more than 50 years after now is the
        most recent past year with the same last two digits."""
        parsed = parse_http_date(text, now)
        assert parsed is not None
        assert time.gmtime(parsed).tm_year == year

    def test_rfc850_without_now_uses_the_clock(self) -> None:
        """Without ``now`` the system clock places two-digit years (the only
        clock read of the module): 94 is 1994 until 2044."""
        assert parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT") == 784111777.0

    def test_rfc850_with_an_impossible_now(self) -> None:
        """A ``now`` the calendar cannot place makes a two-digit year invalid, not an error."""
        for now in (1e30, float("nan"), -1e30):
            assert parse_http_date(b"Sunday, 06-Nov-94 08:49:37 GMT", now) is None
        assert parse_http_date(b"Sun, 06 Nov 1994 08:49:37 GMT", 1e30) == 784111777.0

    @given(st.binary(max_size=64))
    def test_never_raises_on_bytes(self, value: bytes) -> None:
        """Arbitrary bytes give a float or None, never an exception."""
        result = parse_http_date(value, NOW)
        assert result is None or isinstance(result, float)

    @given(st.text(alphabet=" ,:-0123456789SunMoTeWdhFriaJFbMpyAgOctNvDcGT\t", max_size=40))
    def test_never_raises_on_date_like_text(self, text: str) -> None:
        """Near-dates (which reach the range checks) never raise either."""
        result = parse_http_date(text.encode("ascii"), NOW)
        assert result is None or isinstance(result, float)

    @given(st.datetimes(min_value=datetime.datetime(1000, 1, 1), max_value=datetime.datetime(9999, 12, 31, 23, 59, 59)))
    def test_agrees_with_email_utils(self, when: datetime.datetime) -> None:
        """On valid IMF-fixdates the parser agrees with the standard
        library's ``email.utils.parsedate_to_datetime``; the RFC 850 and
        asctime forms of the same instant parse to it too."""
        when = when.replace(microsecond=0)
        day, month = _DAYS[when.weekday()], _MONTHS[when.month - 1]
        clock = f"{when.hour:02d}:{when.minute:02d}:{when.second:02d}"
        text = f"{day}, {when.day:02d} {month} {when.year:04d} {clock} GMT"
        expected = email.utils.parsedate_to_datetime(text).timestamp()
        assert parse_http_date(text.encode(), NOW) == expected
        asctime = f"{day} {month} {when.day:2d} {clock} {when.year}"
        assert parse_http_date(asctime.encode(), NOW) == expected
        rfc850 = f"{_LONG_DAYS[when.weekday()]}, {when.day:02d}-{month}-{when.year % 100:02d} {clock} GMT"
        assert parse_http_date(rfc850.encode(), expected) == expected

    @parametrize(
        "since, expected",
        [
            param(b"Sunday, 06-Nov-94 08:49:37 GMT", True, id="rfc850"),
            param(b"Sun Nov  6 08:49:37 1994", True, id="asctime"),
            param(b"Sun, 06 Nov 1994 08:49:37 UTC", False, id="utc_is_invalid"),
            param(b"Sun, 06 Nov 1994 09:49:37 +0100", False, id="offset_is_invalid"),
            param(b"Sun, 06 Nov 94 08:49:37 GMT", False, id="imf_two_digit_year_is_invalid"),
        ],
    )
    def test_if_modified_since_uses_the_strict_parser(self, since: bytes, expected: bool) -> None:
        """not_modified parses If-Modified-Since with the same strict parser:
        a date in another form or zone is ignored (RFC 9110 13.1.3)."""
        assert not_modified([(b"If-Modified-Since", since)], None, LM, now=NOW) is expected

    def test_repeated_if_modified_since_is_ignored(self) -> None:
        """RFC 9110 13.1.3: an If-Modified-Since with more than one member is ignored."""
        assert not_modified([(b"If-Modified-Since", LM)], None, LM)
        assert not not_modified([(b"If-Modified-Since", LM), (b"If-Modified-Since", LM)], None, LM)

    def test_invalid_last_modified_never_matches(self) -> None:
        """A stored Last-Modified that is not a valid HTTP-date validates nothing."""
        assert not not_modified([(b"If-Modified-Since", LM)], None, b"Sun, 06 Nov 1994 08:49:37 +0000")


@expand
class AgeTests(SynchronousTestCase):
    """RFC 9111 4.2.3 and 5.1: a response's age on arrival, and what it does
    to explicit freshness."""

    @parametrize(
        "ages, age",
        [
            param([b"30"], 30, id="one"),
            param([b" 30 "], 30, id="whitespace"),
            param([b"7200, 0"], 7200, id="list_first_member"),
            param([b"7200", b"0"], 7200, id="repeated_first_field"),
            param([b"0", b"7200"], 0, id="repeated_first_is_0"),
            param([b", 30"], 30, id="empty_list_element_skipped"),
            param([b"x, 30"], 0, id="invalid_first_member"),
            param([b"-5"], 0, id="negative"),
            param([b"1.5"], 0, id="decimal"),
            param([b""], 0, id="empty"),
            param([b"99999999999"], 2**31, id="capped"),
            param([], 0, id="absent"),
        ],
    )
    def test_age_header(self, ages: list[bytes], age: float) -> None:
        """Age is its first list member, however the members come; an
        invalid one counts as 0 (RFC 9111 5.1)."""
        headers = [(b"Age", a) for a in ages]
        assert current_age(headers, NOW) == age
        decision = response_decision(DEFAULT, 200, [(b"Cache-Control", b"max-age=99999"), *headers], NOW)
        assert (decision.ttl, decision.stored_at) == (99999, NOW - age)

    @parametrize(
        "date, age, expected",
        [
            param(NOW - 100, None, 100, id="apparent_age"),
            param(NOW - 100, b"30", 100, id="apparent_age_wins"),
            param(NOW - 100, b"500", 500, id="age_wins"),
            # The origin's clock is ahead: the apparent age is 0, not negative.
            param(NOW + 60, None, 0, id="date_in_the_future"),
            param(NOW + 60, b"20", 20, id="date_in_the_future_with_age"),
            param(None, b"20", 20, id="no_date"),
        ],
    )
    def test_current_age(self, date: float | None, age: bytes | None, expected: float) -> None:
        """current_age = max(max(0, now - Date), Age), the response delay taken as 0."""
        headers = []
        if date is not None:
            headers.append((b"Date", imf(date)))
        if age is not None:
            headers.append((b"Age", age))
        assert current_age(headers, NOW) == expected

    def test_invalid_or_repeated_date_does_not_count(self) -> None:
        """A Date that is not one valid HTTP-date gives no apparent age."""
        assert current_age([(b"Date", b"Sun, 06 Nov 1994 08:49:37 +0000")], NOW) == 0
        assert current_age([(b"Date", imf(NOW - 10)), (b"Date", imf(NOW - 20))], NOW) == 0

    def test_max_age_counts_age_not_the_apparent_age(self) -> None:
        """max-age counts from now less Age, as Varnish does: a Date in the
        past (an origin clock behind, or Date's one-second resolution) does
        not age it; Age does."""
        decision = response_decision(DEFAULT, 200, [(b"Cache-Control", b"max-age=300"), (b"Date", imf(NOW - 100))], NOW)
        assert (decision.ttl, decision.stored_at, decision.reason) == (300, NOW, "max-age")
        decision = response_decision(
            DEFAULT, 200, [(b"Cache-Control", b"max-age=300"), (b"Date", imf(NOW - 100)), (b"Age", b"40")], NOW
        )
        assert decision.stored_at == NOW - 40
        assert current_age([(b"Date", imf(NOW - 100)), (b"Age", b"40")], NOW, apparent=False) == 40

    @parametrize(
        "headers, ttl, stored_at",
        [
            # Fresh until Expires: 200 s from now.
            param([(b"Date", imf(NOW - 100)), (b"Expires", imf(NOW + 200))], 300, NOW - 100, id="date_and_expires"),
            # An upstream cache held it 500 s: stale on arrival, though stored.
            param([(b"Date", imf(NOW - 100)), (b"Expires", imf(NOW + 200)), (b"Age", b"500")], 300, NOW - 500,
                  id="age_larger_than_apparent_age"),
            param([(b"Date", imf(NOW - 100)), (b"Expires", imf(NOW + 200)), (b"Age", b"50")], 300, NOW - 100,
                  id="age_smaller_than_apparent_age"),
            # Without Date the lifetime is Expires - now, less the Age.
            param([(b"Expires", imf(NOW + 300)), (b"Age", b"30")], 300, NOW - 30, id="no_date_with_age"),
            param([(b"Expires", imf(NOW + 300))], 300, NOW, id="no_date_no_age"),
            # The origin's clock is 60 s ahead: Expires - Date still holds.
            param([(b"Date", imf(NOW + 60)), (b"Expires", imf(NOW + 360))], 300, NOW, id="skewed_origin_clock"),
            # Every HTTP-date form.
            param([(b"Date", b"Friday, 15-Jan-27 08:00:00 GMT"), (b"Expires", b"Fri Jan 15 08:01:40 2027")], 100, NOW,
                  id="rfc850_date_asctime_expires"),
            # A repeated Date is ignored: Expires counts from now.
            param([(b"Date", imf(NOW - 100)), (b"Date", imf(NOW - 100)), (b"Expires", imf(NOW + 200))], 200, NOW,
                  id="repeated_date"),
        ],
    )
    def test_age_corrected_expires(self, headers: list[tuple[bytes, bytes]], ttl: float, stored_at: float) -> None:
        """RFC 9111 4.2.3: Expires freshness is corrected by the current age:
        the lifetime is Expires - Date (else Expires - now) and the object was
        generated at now - current_age."""
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert decision.store and decision.reason == "expires"
        assert (decision.ttl, decision.stored_at) == (ttl, stored_at)

    @parametrize(
        "expires",
        [
            param([imf(NOW + 300), imf(NOW + 300)], id="repeated"),
            param([imf(NOW + 300), imf(NOW + 600)], id="two_values"),
            param([imf(NOW + 300) + b", " + imf(NOW + 600)], id="a_list"),
            param([b"Sun, 06 Nov 2044 08:49:37 UTC"], id="utc"),
            param([b"Sun, 06 Nov 2044 08:49:37 +0000"], id="numeric_zone"),
            param([b"Sun, 06 Nov 44 08:49:37 GMT"], id="two_digit_imf_year"),
            param([b"never"], id="garbage"),
        ],
    )
    def test_invalid_expires_is_expired(self, expires: list[bytes]) -> None:
        """An Expires that is not one valid HTTP-date means already expired (RFC 9111 5.3)."""
        decision = response_decision(DEFAULT, 200, [(b"Expires", e) for e in expires], NOW)
        assert (decision.action, decision.reason) == (StoreAction.HIT_FOR_MISS, "ttl")

    def test_default_ttl_counts_from_now(self) -> None:
        """Without explicit freshness the site's default TTL counts from now,
        whatever Date and Age say."""
        decision = response_decision(DEFAULT, 200, [(b"Date", imf(NOW - 100)), (b"Age", b"30")], NOW)
        assert (decision.ttl, decision.stored_at, decision.reason) == (300, NOW, "default")


@expand
class MethodTests(SynchronousTestCase):
    """RFC 9111 4.4: a method not known to be safe invalidates."""

    @parametrize("method", [b"POST", b"PUT", b"DELETE", b"PATCH", b"M-SEARCH", b"FOO", b"PROPFIND", b"LOCK",
                            b"get", b"Get", b"purge", b"CONNECT"])
    def test_unsafe_methods_invalidate(self, method: bytes) -> None:
        """Every method but the safe ones and PURGE invalidates, registered or not."""
        decision = request_decision(DEFAULT, method, b"/", [])
        assert (decision.action, decision.reason, decision.method_class) == (Action.INVALIDATE, "unsafe-method", method)

    @parametrize("method", [b"OPTIONS", b"TRACE", b"PURGE"])
    def test_safe_methods_and_purge_pass(self, method: bytes) -> None:
        """OPTIONS and TRACE are safe; PURGE is answered by the proxy itself
        (it purges, then answers), so it must neither be looked up nor
        invalidate as an unsafe method."""
        decision = request_decision(DEFAULT, method, b"/", [])
        assert (decision.action, decision.reason, decision.method_class) == (Action.PASS, "method", method)

    def test_unsafe_method_invalidates_whatever_the_headers(self) -> None:
        """Credentials, cookies or pass rules do not stop an invalidation."""
        headers = [(b"Authorization", b"x"), (b"Cookie", b"s=1")]
        assert request_decision(ANALYTICS, b"PATCH", b"/admin/x", headers).action is Action.INVALIDATE


T = (b"Prexy-Cache-Control", b"max-age=10")
CDN = (b"CDN-Cache-Control", b"max-age=20")
CC = (b"Cache-Control", b"max-age=30")
PAST = (b"Expires", b"Thu, 01 Jan 1970 00:00:00 GMT")


@expand
class TargetedTests(SynchronousTestCase):
    """RFC 9213: Prexy's targeted field, then CDN-Cache-Control, then Cache-Control."""

    @parametrize(
        "headers, ttl, reason",
        [
            param([T, CDN, CC], 10, "max-age", id="targeted_wins"),
            param([CC, CDN, T], 10, "max-age", id="targeted_wins_in_any_order"),
            param([CDN, CC], 20, "max-age", id="cdn_over_cache_control"),
            param([CC], 30, "max-age", id="cache_control_alone"),
            param([(b"prexy-cache-control", b"max-age=10"), CC], 10, "max-age", id="field_name_any_case"),
            param([(b"CDN-Cache-Control", b"max-age=600"), (b"Cache-Control", b"max-age=60, s-maxage=120")], 600,
                  "max-age", id="rfc9213_cdn_example"),
            param([(b"CDN-Cache-Control", b"max-age=600"), (b"Cache-Control", b"no-store")], 600, "max-age",
                  id="cdn_over_no_store"),
            # A field with no known directive still wins (RFC 9213's "none").
            param([(b"CDN-Cache-Control", b"none"), (b"Cache-Control", b"no-store")], 300, "default",
                  id="cdn_none_over_no_store"),
            # The winning field ignores Expires as well as Cache-Control.
            param([(b"CDN-Cache-Control", b"public"), PAST], 300, "default", id="cdn_ignores_expires"),
            param([(b"Prexy-Cache-Control", b"s-maxage=5, max-age=10"), CC], 5, "s-maxage", id="targeted_s_maxage"),
            param([(b"Prexy-Cache-Control", b"max-age=10;ignored=1"), CC], 10, "max-age", id="parameters_ignored"),
            param([(b"Prexy-Cache-Control", b"max-age=99999999999"), CC], 2**31, "max-age", id="capped"),
            param([(b"Prexy-Cache-Control", b"private=?0, max-age=10"), CC], 10, "max-age", id="boolean_false_is_off"),
            param([(b"Prexy-Cache-Control", b"max-age=10 , no-transform"), CC], 10, "max-age", id="whitespace"),
            # Invalid or empty targeted fields are ignored as if absent.
            param([(b"Prexy-Cache-Control", b"Max-Age=10"), CDN, CC], 20, "max-age", id="upper_case_key_is_invalid"),
            param([(b"Prexy-Cache-Control", b"max-age=10,"), CDN, CC], 20, "max-age", id="trailing_comma_is_invalid"),
            param([(b"Prexy-Cache-Control", b"max-age=10 no-store"), CC], 30, "max-age", id="missing_comma_is_invalid"),
            param([(b"Prexy-Cache-Control", b'no-cache="a'), CC], 30, "max-age", id="open_string_is_invalid"),
            param([(b"Prexy-Cache-Control", b"max-age=10\xe9"), CC], 30, "max-age", id="non_ascii_is_invalid"),
            param([(b"Prexy-Cache-Control", b""), CDN, CC], 20, "max-age", id="empty_is_ignored"),
            param([(b"Prexy-Cache-Control", b"  "), CC], 30, "max-age", id="blank_is_ignored"),
            param([(b"CDN-Cache-Control", b"max-age=20, =1"), CC], 30, "max-age", id="invalid_cdn_is_ignored"),
        ],
    )
    def test_precedence(self, headers: list[tuple[bytes, bytes]], ttl: float, reason: str) -> None:
        """The first valid, non-empty field of the target list decides, and
        only its directives count."""
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert decision.store
        assert (decision.ttl, decision.reason) == (ttl, reason)

    @parametrize(
        "headers, reason",
        [
            param([(b"Prexy-Cache-Control", b"no-store"), CC], "no-store", id="targeted_no_store"),
            param([(b"Prexy-Cache-Control", b"private"), CDN], "private", id="targeted_private"),
            param([(b"Prexy-Cache-Control", b'no-cache="set-cookie"'), CC], "no-cache", id="targeted_no_cache_fields"),
            param([(b"Prexy-Cache-Control", b"no-store=1"), CC], "no-store", id="restrictive_with_any_value"),
            param([(b"Prexy-Cache-Control", b"max-age=10"), (b"Prexy-Cache-Control", b"no-store"), CC], "no-store",
                  id="field_lines_combined"),
            param([(b"CDN-Cache-Control", b"no-store"), CC], "no-store", id="cdn_no_store"),
            param([(b"CDN-Cache-Control", b"max-age=0"), CC], "ttl", id="cdn_max_age_0"),
            # A max-age that is not a non-negative Integer is invalid: stale.
            param([(b"Prexy-Cache-Control", b"max-age=1.5"), CC], "ttl", id="decimal_max_age"),
            param([(b"Prexy-Cache-Control", b'max-age="60"'), CC], "ttl", id="string_max_age"),
            param([(b"Prexy-Cache-Control", b"max-age=-1"), CC], "ttl", id="negative_max_age"),
            param([(b"Prexy-Cache-Control", b"max-age"), CC], "ttl", id="bare_max_age"),
            param([(b"Prexy-Cache-Control", b"max-age=(1 2)"), CC], "ttl", id="inner_list_max_age"),
            # Without a valid targeted field, Cache-Control and Expires decide.
            param([(b"Prexy-Cache-Control", b"MAX-AGE=60"), PAST], "ttl", id="invalid_targeted_expires_counts"),
            param([(b"Prexy-Cache-Control", b"max-age=60,"), (b"Cache-Control", b"no-store")], "no-store",
                  id="invalid_targeted_cache_control_counts"),
        ],
    )
    def test_not_stored(self, headers: list[tuple[bytes, bytes]], reason: str) -> None:
        """The winning field's no-store, private, no-cache and invalid
        freshness make the response hit-for-miss."""
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert (decision.action, decision.reason) == (StoreAction.HIT_FOR_MISS, reason)

    def test_stale_directives_from_the_winning_field(self) -> None:
        """stale-while-revalidate and stale-if-error come from the winning
        field only."""
        headers = [
            (b"Prexy-Cache-Control", b"max-age=10, stale-while-revalidate=30, stale-if-error=600"),
            (b"Cache-Control", b"max-age=60, stale-while-revalidate=1, stale-if-error=2"),
        ]
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert (decision.ttl, decision.grace, decision.stale_if_error) == (10, 30, 600)
        decision = response_decision(DEFAULT, 200, [(b"CDN-Cache-Control", b"max-age=10"), headers[1]], NOW)
        assert (decision.ttl, decision.grace, decision.stale_if_error) == (10, DEFAULT.grace, 0)
        decision = response_decision(DEFAULT, 200, [(b"CDN-Cache-Control", b"stale-if-error=1.5"), headers[1]], NOW)
        assert decision.stale_if_error == 0  # invalid: the site's default

    def test_configured_name(self) -> None:
        """Another targeted field name replaces Prexy-Cache-Control (which then
        does not count); "" leaves CDN-Cache-Control first."""
        example = CachePolicy(targeted_cache_control="ExampleCDN-Cache-Control")
        headers = [(b"examplecdn-cache-control", b"max-age=5"), T, CDN, CC]
        assert response_decision(example, 200, headers, NOW).ttl == 5
        assert response_decision(example, 200, [T, CDN, CC], NOW).ttl == 20
        assert response_decision(CachePolicy(targeted_cache_control=""), 200, [T, CDN, CC], NOW).ttl == 20
        assert response_decision(CachePolicy(targeted_cache_control=""), 200, [T, CC], NOW).ttl == 30

    def test_targeted_field_names(self) -> None:
        """The fields to drop before answering clients: the targeted one,
        lower-case (CDN-Cache-Control is passed through)."""
        assert targeted_field_names(DEFAULT) == frozenset({b"prexy-cache-control"})
        assert targeted_field_names(CachePolicy(targeted_cache_control="Example-CC")) == frozenset({b"example-cc"})
        assert targeted_field_names(CachePolicy(targeted_cache_control="")) == frozenset()

    @parametrize("name", ["bad name", "a:b", "Cache-Control", "cdn-cache-control", "é-Cache-Control"])
    def test_name_validation(self, name: str) -> None:
        """The targeted field name must be a token, and not one of the fields
        Prexy passes on."""
        with self.assertRaises(PolicyError) as info:
            CachePolicy(targeted_cache_control=name)
        assert info.exception.field == "targeted_cache_control"

    @given(st.lists(st.binary(max_size=30), min_size=1, max_size=3))
    def test_never_raises(self, values: list[bytes]) -> None:
        """Any bytes in the targeted fields give a decision."""
        headers = [(b"Prexy-Cache-Control", v) for v in values] + [(b"CDN-Cache-Control", values[0]), CC]
        assert response_decision(DEFAULT, 200, headers, NOW).action in StoreAction

    @given(st.lists(st.sampled_from(["max-age=5", "no-store", "private=?0", 's-maxage=7;a="b"', "x=(1 2);q",
                                     "y=:YWI=:", "z=?1", "w=-1.25", "t=a/b"]), min_size=1, max_size=5))
    def test_valid_dictionaries_win(self, members: list[str]) -> None:
        """A valid Dictionary, however its members are combined, always wins
        over Cache-Control."""
        headers = [(b"Prexy-Cache-Control", ", ".join(members).encode()), (b"Cache-Control", b"max-age=30")]
        decision = response_decision(DEFAULT, 200, headers, NOW)
        # The last of a repeated key wins (RFC 8941 4.2.2).
        if "no-store" in members:
            assert decision.reason == "no-store"
        elif any(m.startswith("s-maxage") for m in members):
            assert decision.ttl == 7
        elif "max-age=5" in members:
            assert decision.ttl == 5
        else:
            assert (decision.ttl, decision.reason) == (300, "default")


class StaleIfErrorDefaultTests(SynchronousTestCase):
    """CachePolicy.stale_if_error: the site's default for responses without
    a stale-if-error directive."""

    def test_default_applies_without_directive(self) -> None:
        """No directive (or an invalid one): the site's value."""
        policy = CachePolicy(stale_if_error=30)
        assert response_decision(policy, 200, [(b"Cache-Control", b"max-age=10")], NOW).stale_if_error == 30
        assert response_decision(policy, 200, [], NOW).stale_if_error == 30
        bad = [(b"Cache-Control", b"max-age=10, stale-if-error=soon")]
        assert response_decision(policy, 200, bad, NOW).stale_if_error == 30
        assert response_decision(DEFAULT, 200, [], NOW).stale_if_error == 0

    def test_directive_wins(self) -> None:
        """The response's own stale-if-error wins, 0 included."""
        policy = CachePolicy(stale_if_error=30)
        for value, expected in ((b"600", 600), (b"0", 0), (b"5", 5)):
            headers = [(b"Cache-Control", b"max-age=10, stale-if-error=" + value)]
            assert response_decision(policy, 200, headers, NOW).stale_if_error == expected

    def test_not_on_hit_for_miss(self) -> None:
        """A hit-for-miss marker has nothing stale to serve."""
        decision = response_decision(CachePolicy(stale_if_error=30), 200, [(b"Cache-Control", b"no-store")], NOW)
        assert (decision.store, decision.stale_if_error) == (False, 0)

    def test_validation_and_configuration_key(self) -> None:
        """Negative values are refused with the field named; the file's key
        is cache_stale_if_error."""
        with self.assertRaises(PolicyError) as info:
            CachePolicy(stale_if_error=-1)
        assert info.exception.field == "stale_if_error"
        assert CACHE_KEYS["cache_stale_if_error"] == "stale_if_error"
        assert attrs.has(CachePolicy) and "stale_if_error" in attrs.fields_dict(CachePolicy)


STORED = [
    (b"Date", b"old"),
    (b"Content-Type", b"text/html"),
    (b"ETag", b'"derived"'),
    (b"X-A", b"1"),
    (b"Content-Length", b"100"),
    (b"x-a", b"2"),
    (b"Last-Modified", LM),
    (b"Cache-Control", b"max-age=10"),
]


@expand
class UpdateHeadersTests(SynchronousTestCase):
    """RFC 9111 3.2 and 4.3.4: a 304's fields update the stored response."""

    def test_replace_in_place_and_append(self) -> None:
        """A 304 field replaces every stored field of its name at the first
        one's place; new names are appended in the 304's order; stored-only
        fields stay."""
        fresh = [(b"date", b"new"), (b"X-B", b"b"), (b"X-A", b"n1"), (b"Cache-Control", b"max-age=60"),
                 (b"X-C", b"c"), (b"X-A", b"n2")]
        assert update_headers(STORED, fresh) == [
            (b"date", b"new"),
            (b"Content-Type", b"text/html"),
            (b"ETag", b'"derived"'),
            (b"X-A", b"n1"),
            (b"X-A", b"n2"),
            (b"Content-Length", b"100"),
            (b"Last-Modified", LM),
            (b"Cache-Control", b"max-age=60"),
            (b"X-B", b"b"),
            (b"X-C", b"c"),
        ]

    def test_no_fields(self) -> None:
        """An empty 304 leaves the stored fields as they were (in a new list)."""
        out = update_headers(STORED, [])
        assert out == STORED and out is not STORED
        assert update_headers([], [(b"X", b"1")]) == [(b"X", b"1")]

    @parametrize(
        "name",
        [b"Content-Length", b"Transfer-Encoding", b"Content-Encoding", b"Content-Range", b"Trailer",
         b"Connection", b"Keep-Alive", b"TE", b"Upgrade", b"Proxy-Authenticate", b"Proxy-Connection",
         b"proxy-authentication-info"],
    )
    def test_not_updated(self, name: bytes) -> None:
        """Fields describing the stored body or the connection are never
        changed by a 304, nor added by one."""
        stored = [(b"Content-Type", b"text/html"), (name, b"stored")]
        assert update_headers(stored, [(name, b"304"), (b"X", b"1")]) == [*stored, (b"X", b"1")]
        assert update_headers(stored[:1], [(name.upper(), b"304")]) == stored[:1]

    def test_connection_listed_fields(self) -> None:
        """The fields the 304's Connection names are hop-by-hop: ignored."""
        stored = [(b"X-Hop", b"stored"), (b"X-Other", b"stored")]
        fresh = [(b"Connection", b"close, X-Hop"), (b"X-Hop", b"304"), (b"X-Other", b"304")]
        assert update_headers(stored, fresh) == [(b"X-Hop", b"stored"), (b"X-Other", b"304")]

    def test_keep(self) -> None:
        """The caller's ``keep`` names stay as stored (a derived ETag)."""
        fresh = [(b"ETag", b'"origin"'), (b"Date", b"new")]
        out = update_headers(STORED, fresh, keep=frozenset({b"etag"}))
        assert (b"ETag", b'"derived"') in out and (b"ETag", b'"origin"') not in out
        assert (b"Date", b"new") in out
        assert update_headers([], fresh, keep=frozenset({b"etag"})) == [(b"Date", b"new")]

    def test_inputs_unchanged(self) -> None:
        """Pure: the arguments are not modified."""
        stored, fresh = list(STORED), [(b"Date", b"new")]
        update_headers(stored, fresh)
        assert (stored, fresh) == (STORED, [(b"Date", b"new")])

    def test_merged_fields_decide(self) -> None:
        """The merge is what response_decision then sees: a 304 can make a
        stored response fresh again, or unstorable."""
        merged = update_headers(STORED, [(b"Date", imf(NOW)), (b"Cache-Control", b"max-age=600")])
        assert response_decision(DEFAULT, 200, merged, NOW).ttl == 600
        merged = update_headers(STORED, [(b"Cache-Control", b"no-store")])
        assert response_decision(DEFAULT, 200, merged, NOW).reason == "no-store"

    @given(
        st.lists(st.tuples(st.sampled_from([b"A", b"a", b"B", b"Content-Length", b"ETag", b"Proxy-X"]), st.binary(max_size=3)), max_size=6),
        st.lists(st.tuples(st.sampled_from([b"a", b"B", b"b", b"C", b"content-length", b"ETag", b"Proxy-X"]), st.binary(max_size=3)), max_size=6),
    )
    def test_each_name_from_one_side(self, stored: list[tuple[bytes, bytes]], fresh: list[tuple[bytes, bytes]]) -> None:
        """Every name's values come all from the 304 (if it has the name and
        may change it) or all from the stored response; nothing is lost."""
        keep = frozenset({b"etag"})
        out = update_headers(stored, fresh, keep)

        def of(headers: list[tuple[bytes, bytes]], lname: bytes) -> list[bytes]:
            return [v for n, v in headers if n.lower() == lname]

        fixed = {b"content-length", b"etag", b"proxy-x"}
        names = {n.lower() for n, _ in stored} | {n.lower() for n, _ in fresh if n.lower() not in fixed}
        assert {n.lower() for n, _ in out} == names
        for lname in names:
            source = fresh if lname not in fixed and of(fresh, lname) else stored
            assert of(out, lname) == of(source, lname)


_FIELD_NAMES = st.sampled_from([
    b"Host", b"Authorization", b"authorization", b"X-Requested-With", b"Cookie", b"cookie", b"Accept-Encoding",
    b"Accept-Language", b"User-Agent", b"X-Other",
])
_FIELD_VALUES = st.sampled_from([b"", b"a", b"gzip, br", b"_ga=1; sid=2", b"_ga=1", b"en-US, fr;q=0.5", b"x, y"])


class FieldTableTests(SynchronousTestCase):
    """A request's headers given as a table by lower-case name decide and
    key exactly as the same headers given as pairs."""

    @given(st.lists(st.tuples(_FIELD_NAMES, _FIELD_VALUES), max_size=8), st.sampled_from([b"GET", b"HEAD", b"POST"]))
    def test_table_and_pairs_agree(self, pairs: list[tuple[bytes, bytes]], method: bytes) -> None:
        table: dict[bytes, list[bytes]] = {}
        for name, value in pairs:
            table.setdefault(name.lower(), []).append(value)
        policy = CachePolicy(pass_rules=(r"^/private",))
        for target in (b"/a", b"/private/x"):
            self.assertEqual(request_decision(policy, method, target, pairs),
                             request_decision(policy, method, target, table))
        for vary in (b"Accept-Encoding", b"Cookie, Accept-Language", b"X-Other", b""):
            self.assertEqual(vary_key(vary, pairs, policy), vary_key(vary, table, policy))
