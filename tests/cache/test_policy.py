"""The cache policy: every request and response rule of Varnish's built-in
behaviour (plus ignored cookies and pass rules), TTL precedence, Vary
normalisation, keys, conditional requests and the Cache-Status header."""

from __future__ import annotations

import itertools

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
    key_url,
    not_modified,
    parse_cache_control,
    parse_http_date,
    primary_key,
    request_decision,
    response_decision,
    vary_key,
    vary_names,
)
from tests.cases import expand, parametrize

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
            (DEFAULT, b"get", b"/", [], Action.PASS, "method"),
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
            (200, [(b"Cache-Control", b'no-cache="Set-Cookie", max-age=60')], "no-cache"),
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
