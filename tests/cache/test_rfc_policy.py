"""The cache policy's answers to the HTTP caching conformance suite
(cache-tests.fyi, run by ``bench/cache_conformance.py``): no stale use where
the response demands revalidation or arrived stale, ``no-cache`` stored to be
revalidated, ``must-understand``, RFC 9110's heuristically cacheable
statuses, and ``Vary`` values normalised as RFC 9111 4.1 allows."""

from __future__ import annotations

import email.utils
import types

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache import flow
from prexy.cache.policy import (
    Action,
    CachePolicy,
    StoreAction,
    StoreDecision,
    location_urls,
    response_decision,
    vary_key,
)
from prexy.cache.store import ObjectMeta
from tests.cases import expand, param, parametrize

NOW = 1_800_000_000.0
DEFAULT = CachePolicy()
#: A site that also serves stale copies instead of upstream errors.
SIE = CachePolicy(stale_if_error=30)
ETAG = (b"ETag", b'"v1"')


def http_date(when: float) -> bytes:
    return email.utils.formatdate(when, usegmt=True).encode("ascii")


def as_object(d: StoreDecision) -> ObjectMeta:
    """What the proxy stores for a decision (``Cache.begin_store``)."""
    return ObjectMeta(status=200, stored_at=d.stored_at, ttl=d.ttl, grace=d.grace,
                      keep=d.keep, stale_if_error=d.stale_if_error)


def routed(obj: ObjectMeta, now: float) -> flow.Route:
    found = types.SimpleNamespace(obj=obj, url_known=True)
    return flow.route(Action.LOOKUP, found, now, b"GET", None, fetching=False, refreshing=False).route


@expand
class RevalidateDirectiveTests(SynchronousTestCase):
    """must-revalidate, proxy-revalidate and s-maxage (which implies
    proxy-revalidate, RFC 9111 5.2.2.10) forbid stale use: the site's grace
    and stale-if-error do not apply; the response's own RFC 5861 directives
    still do."""

    @parametrize("cc", [
        b"max-age=60, must-revalidate",
        b"max-age=60, proxy-revalidate",
        b"MAX-AGE=60, MUST-REVALIDATE",
        b"s-maxage=60",
        b"max-age=3600, s-maxage=60",
    ])
    def test_no_site_grace_nor_stale_if_error(self, cc: bytes) -> None:
        """Stored with its TTL, no grace, no stale-if-error; kept to revalidate."""
        decision = response_decision(SIE, 200, [(b"Cache-Control", cc), ETAG], NOW)
        assert decision.store and decision.ttl == 60
        assert (decision.grace, decision.stale_if_error, decision.keep) == (0, 0, 300)
        obj = as_object(decision)
        assert routed(obj, NOW + 61) is flow.Route.CLAIM, "revalidated, not served stale"
        assert not obj.stale_usable_on_error(NOW + 61)

    def test_own_stale_directives_still_count(self) -> None:
        """s-maxage=60, stale-while-revalidate=30 (a common CDN header): the
        response allowed stale use itself."""
        cc = (b"Cache-Control", b"s-maxage=60, stale-while-revalidate=30, stale-if-error=90")
        decision = response_decision(SIE, 200, [cc], NOW)
        assert (decision.grace, decision.stale_if_error) == (30, 90)
        assert routed(as_object(decision), NOW + 61) is flow.Route.GRACE_REFRESH

    def test_without_them_the_site_settings_apply(self) -> None:
        """A plain max-age keeps the site's grace and stale-if-error."""
        decision = response_decision(SIE, 200, [(b"Cache-Control", b"max-age=60")], NOW)
        assert (decision.grace, decision.stale_if_error) == (10, 30)
        assert routed(as_object(decision), NOW + 61) is flow.Route.GRACE_REFRESH

    def test_in_a_targeted_field(self) -> None:
        """The winning field's directives decide (here CDN-Cache-Control)."""
        headers = [(b"CDN-Cache-Control", b"max-age=60, must-revalidate"), (b"Cache-Control", b"max-age=60")]
        assert response_decision(SIE, 200, headers, NOW).grace == 0
        headers = [(b"CDN-Cache-Control", b"max-age=60"), (b"Cache-Control", b"max-age=60, must-revalidate")]
        assert response_decision(SIE, 200, headers, NOW).grace == 10


@expand
class ArrivedStaleTests(SynchronousTestCase):
    """An answer already stale when it arrives (its Age past its lifetime)
    was never fresh here: the site's grace does not serve it; it is stored
    only to be revalidated (or for stale-if-error)."""

    @parametrize("headers", [
        # Date slow by 10 s, Expires 20 s after it, Age 25.
        param([(b"Date", http_date(NOW - 10)), (b"Expires", http_date(NOW + 10)), (b"Age", b"25")], id="slow-date"),
        # Date fast by 10 s, Expires 10 s after it, Age 15.
        param([(b"Date", http_date(NOW + 10)), (b"Expires", http_date(NOW + 20)), (b"Age", b"15")], id="fast-date"),
        param([(b"Cache-Control", b"max-age=10"), (b"Age", b"10")], id="max-age"),
    ])
    def test_no_grace(self, headers: list[tuple[bytes, bytes]]) -> None:
        decision = response_decision(SIE, 200, [*headers, ETAG], NOW)
        assert decision.store and decision.stored_at + decision.ttl <= NOW
        assert (decision.grace, decision.stale_if_error, decision.keep) == (0, 30, 300)
        assert routed(as_object(decision), NOW) is flow.Route.CLAIM

    def test_its_own_stale_while_revalidate_counts(self) -> None:
        headers = [(b"Cache-Control", b"max-age=10, stale-while-revalidate=60"), (b"Age", b"20")]
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert decision.grace == 60
        assert routed(as_object(decision), NOW) is flow.Route.GRACE_REFRESH

    def test_fresh_on_arrival_keeps_grace(self) -> None:
        """One second of freshness left: the site's grace follows it."""
        decision = response_decision(DEFAULT, 200, [(b"Cache-Control", b"max-age=10"), (b"Age", b"9")], NOW)
        assert decision.grace == 10
        assert routed(as_object(decision), NOW + 1) is flow.Route.GRACE_REFRESH


@expand
class NoCacheTests(SynchronousTestCase):
    """no-cache (RFC 9111 5.2.2.4): stored, never used without revalidation."""

    @parametrize("cc", [
        b"no-cache",
        b"max-age=10000, no-cache",
        b"No-CaChE, max-age=60",
        b'no-cache="", max-age=60',
    ])
    def test_stored_to_revalidate(self, cc: bytes) -> None:
        decision = response_decision(SIE, 200, [(b"Cache-Control", cc), ETAG], NOW)
        assert decision.action is StoreAction.STORE and decision.reason == "no-cache"
        assert (decision.ttl, decision.stored_at, decision.grace, decision.stale_if_error) == (0, NOW, 0, 0)
        assert decision.keep == 300
        obj = as_object(decision)
        assert not obj.fresh(NOW)
        assert routed(obj, NOW) is flow.Route.CLAIM
        assert not obj.stale_usable_on_error(NOW)

    def test_last_modified_is_a_validator(self) -> None:
        headers = [(b"Cache-Control", b"no-cache"), (b"Last-Modified", http_date(NOW - 100))]
        assert response_decision(DEFAULT, 200, headers, NOW).reason == "no-cache"

    @parametrize("policy, headers", [
        param(DEFAULT, [(b"Cache-Control", b"no-cache, max-age=60")], id="no-validator"),
        param(CachePolicy(keep=0), [(b"Cache-Control", b"no-cache"), ETAG], id="no-keep"),
    ])
    def test_nothing_to_revalidate(self, policy: CachePolicy, headers: list[tuple[bytes, bytes]]) -> None:
        decision = response_decision(policy, 200, headers, NOW)
        assert (decision.action, decision.reason) == (StoreAction.HIT_FOR_MISS, "no-cache")

    def test_targeted_field(self) -> None:
        """CDN-Cache-Control: no-cache wins over a Cache-Control max-age."""
        headers = [(b"CDN-Cache-Control", b"no-cache"), (b"Cache-Control", b"max-age=10000"), ETAG]
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert (decision.reason, decision.ttl) == ("no-cache", 0)

    def test_other_refusals_come_first(self) -> None:
        """no-store, private, Set-Cookie and an uncacheable status still refuse."""
        for status, headers, reason in [
            (200, [(b"Cache-Control", b"no-cache, no-store"), ETAG], "no-store"),
            (200, [(b"Cache-Control", b"no-cache, private"), ETAG], "private"),
            (200, [(b"Cache-Control", b"no-cache"), (b"Set-Cookie", b"a=1"), ETAG], "set-cookie"),
            (500, [(b"Cache-Control", b"no-cache"), ETAG], "status"),
        ]:
            assert response_decision(DEFAULT, status, headers, NOW).reason == reason


@expand
class NoCacheFieldsTests(SynchronousTestCase):
    """no-cache with field names (RFC 9111 5.2.2.4): the response is stored
    and reused as usual; the named fields are not stored."""

    @parametrize("cc, omit", [
        param([b'no-cache="a"', b"max-age=3600"], {b"a"}, id="one"),
        param([b'no-cache="A, b", max-age=3600'], {b"a", b"b"}, id="two"),
        param([b'max-age=3600, no-cache="X-User,  ,Set-Cookie2"'], {b"x-user", b"set-cookie2"}, id="spaces"),
    ])
    def test_stored_without_them(self, cc: list[bytes], omit: set[bytes]) -> None:
        decision = response_decision(DEFAULT, 200, [(b"Cache-Control", v) for v in cc], NOW)
        assert decision.store and decision.ttl == 3600 and decision.reason == "max-age"
        assert decision.omit == omit

    def test_unqualified_omits_nothing(self) -> None:
        assert response_decision(DEFAULT, 200, [(b"Cache-Control", b"max-age=60")], NOW).omit == frozenset()

    def test_targeted_field_counts_whole(self) -> None:
        """In a targeted field a restrictive directive counts whatever its value."""
        headers = [(b"CDN-Cache-Control", b'no-cache="a", max-age=60'), (b"Cache-Control", b"max-age=60"), ETAG]
        decision = response_decision(DEFAULT, 200, headers, NOW)
        assert (decision.reason, decision.ttl, decision.omit) == ("no-cache", 0, frozenset())

    def test_set_cookie_still_refuses(self) -> None:
        """Naming Set-Cookie does not make a response that sets one storable."""
        headers = [(b"Cache-Control", b'no-cache="Set-Cookie", max-age=60'), (b"Set-Cookie", b"s=1")]
        assert response_decision(DEFAULT, 200, headers, NOW).reason == "set-cookie"


class MustUnderstandTests(SynchronousTestCase):
    """must-understand (RFC 9111 5.2.2.3)."""

    def test_understood_status_ignores_no_store(self) -> None:
        cc = (b"Cache-Control", b"max-age=3600, no-store, must-understand")
        decision = response_decision(DEFAULT, 200, [cc], NOW)
        assert decision.store and decision.ttl == 3600

    def test_unknown_status_is_not_stored(self) -> None:
        cc = (b"Cache-Control", b"max-age=3600, no-store, must-understand")
        assert response_decision(DEFAULT, 599, [cc], NOW).reason == "status"
        assert response_decision(DEFAULT, 599, [(b"Cache-Control", b"max-age=3600, must-understand")], NOW).reason == "status"

    def test_no_store_alone_still_refuses(self) -> None:
        assert response_decision(DEFAULT, 200, [(b"Cache-Control", b"max-age=3600, no-store")], NOW).reason == "no-store"

    def test_private_still_refuses(self) -> None:
        cc = (b"Cache-Control", b"max-age=3600, private, no-store, must-understand")
        assert response_decision(DEFAULT, 200, [cc], NOW).reason == "private"


@expand
class StatusTests(SynchronousTestCase):
    """RFC 9110 15.1's heuristically cacheable statuses are stored like 200;
    303 like 302 and 307 with explicit freshness only; errors and unknown
    statuses not even with explicit freshness (a deliberate difference:
    a transient error page must not be served for the origin's max-age)."""

    @parametrize("status", [308, 405, 501])
    def test_heuristically_cacheable(self, status: int) -> None:
        decision = response_decision(DEFAULT, status, [(b"Last-Modified", http_date(NOW - 86400))], NOW)
        assert decision.store and decision.reason == "default"

    def test_303_with_explicit_freshness_only(self) -> None:
        assert response_decision(DEFAULT, 303, [(b"Cache-Control", b"max-age=60")], NOW).store
        assert response_decision(DEFAULT, 303, [], NOW).reason == "status"

    @parametrize("status", [299, 400, 499, 500, 502, 503, 504, 599])
    def test_errors_and_unknown_not_stored(self, status: int) -> None:
        headers = [(b"Cache-Control", b"max-age=100000"), (b"Expires", http_date(NOW + 100000))]
        assert response_decision(DEFAULT, status, headers, NOW).reason == "status"


class VaryNormalisationTests(SynchronousTestCase):
    """A varied-on request header's value is normalised where the meaning
    is the same (RFC 9111 4.1): whitespace around list members, empty
    members, one field line or several; Accept-Language in any case."""

    def key(self, name: bytes, *values: bytes) -> bytes:
        return vary_key(name, [(name, v) for v in values])

    def test_whitespace_and_lines(self) -> None:
        same = [(b"1,2",), (b" 1, 2 ",), (b"1 ,   2",), (b"1", b"2"), (b"1,,2",), (b"1, 2", b"")]
        keys = {self.key(b"Foo", *values) for values in same}
        assert len(keys) == 1, keys

    def test_values_still_matter(self) -> None:
        assert self.key(b"Foo", b"1, 2") != self.key(b"Foo", b"2, 1")
        assert self.key(b"Foo", b"1 2") != self.key(b"Foo", b"12")
        assert self.key(b"Foo", b"A") != self.key(b"Foo", b"a")
        # Absent and empty stay apart.
        assert vary_key(b"Foo", []) != self.key(b"Foo", b"")

    def test_quoted_strings_are_kept_whole(self) -> None:
        assert self.key(b"Foo", b'a="x,  y"') != self.key(b"Foo", b'a="x, y"')
        assert self.key(b"Foo", b'a="x, y" , b') == self.key(b"Foo", b'a="x, y",b')

    def test_accept_language_case(self) -> None:
        assert self.key(b"Accept-Language", b"en, de") == self.key(b"Accept-Language", b"eN, De")
        assert self.key(b"Accept-Language", b"en, de") == self.key(b"Accept-Language", b" en ,   de")
        assert self.key(b"Accept-Language", b"en, de") != self.key(b"Accept-Language", b"de, en")

    @given(st.lists(st.text(alphabet="abc=;", min_size=1, max_size=5), min_size=1, max_size=4),
           st.lists(st.sampled_from(["", " ", "  ", "\t"]), min_size=8, max_size=8))
    def test_spacing_never_changes_the_key(self, members: list[str], spaces: list[str]) -> None:
        """Any OWS around the commas of one list gives the key of the tight form."""
        tight = ",".join(members).encode()
        spaced = ",".join(spaces[i % 8] + m + spaces[(i + 1) % 8] for i, m in enumerate(members)).encode()
        assert self.key(b"Foo", tight) == self.key(b"Foo", spaced)


@expand
class LocationInvalidationTests(SynchronousTestCase):
    """An unsafe request's success also invalidates its answer's Location
    and Content-Location on the same host (RFC 9111 4.4)."""

    @parametrize("headers, urls", [
        param([(b"Location", b"/a/b")], [b"example.com/a/b"], id="absolute-path"),
        param([(b"Content-Location", b"c?x=1")], [b"example.com/posts/c?x=1"], id="relative-path"),
        param([(b"Location", b"http://EXAMPLE.com/z")], [b"example.com/z"], id="same-host"),
        param([(b"Location", b"https://example.com/z")], [b"example.com/z"], id="other-scheme"),
        param([(b"Location", b"http://other.example/z")], [], id="other-host"),
        param([(b"Location", b"//other.example/z")], [], id="network-path"),
        param([(b"Location", b"/posts/new")], [], id="own-url"),
        param([(b"Location", b"/a"), (b"Content-Location", b"/a")], [b"example.com/a"], id="once"),
        param([(b"Location", b"/a"), (b"Location", b"/b")], [], id="repeated"),
        param([(b"Location", b"http://[::1/x")], [], id="unparsable"),
        param([(b"Location", b"/a"), (b"Content-Location", b"/b")], [b"example.com/a", b"example.com/b"], id="both"),
        param([], [], id="none"),
    ])
    def test_location_urls(self, headers: list[tuple[bytes, bytes]], urls: list[bytes]) -> None:
        assert location_urls(DEFAULT, b"example.com", b"/posts/new", headers) == urls

    def test_key_settings(self) -> None:
        """The URLs are keys as the site makes them (no host, no query)."""
        policy = CachePolicy(key_host=False, key_query=False)
        assert location_urls(policy, b"example.com", b"/p", [(b"Location", b"/a?x=1")]) == [b"/a"]

    def test_without_host(self) -> None:
        """No Host: only references without an authority count."""
        headers = [(b"Location", b"/a"), (b"Content-Location", b"http://example.com/b")]
        assert location_urls(DEFAULT, None, b"/p", headers) == [b"/a"]
