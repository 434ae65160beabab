"""What a ban matches (``prexy.cache.bans``), pure: its regex on the path
and query of a stored URL (as Varnish's ``req.url``), its host name or
host regex on the host, the older whole-URL form, and the bans that cannot
be made."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.bans import Ban, BanError, normalise_host, split_key_url
from prexy.cache.policy import CachePolicy, key_url
from tests.cases import expand, parametrize

#: (ban keywords, stored key URL, banned?)
CASES = [
    ({"target": "^/obj"}, b"shop.example/obj", True),
    ({"target": "^/obj"}, b"shop.example/obj/1?x=2", True),
    ({"target": "^/obj"}, b"shop.example/a/obj", False),
    ({"target": "^/obj"}, b"/obj", True),  # a key without the host
    ({"target": r"\?x=2$"}, b"shop.example/obj?x=2", True),
    ({"target": "shop"}, b"shop.example/obj", False),  # the host is not in the path
    ({"target": "^/obj", "host": "shop.example"}, b"shop.example/obj", True),
    ({"target": "^/obj", "host": "other.example"}, b"shop.example/obj", False),
    ({"host": "Shop.Example."}, b"shop.example/anything", True),
    ({"host": "shop.example"}, b"shop.example:8080/obj", True),  # no port: any port
    ({"host": "shop.example:8080"}, b"shop.example:8080/obj", True),
    ({"host": "shop.example:8080"}, b"shop.example/obj", False),
    ({"host": "shop.example:8080"}, b"shop.example:81/obj", False),
    ({"host": "shop.example"}, b"www.shop.example/obj", False),  # whole names
    ({"host": "[::1]"}, b"[::1]:8443/obj", True),
    ({"host": "shop.example"}, b"/obj", True),  # stored without a host: served to every host
    ({"host_regex": r"\.shop\.example$"}, b"www.shop.example/obj", True),
    ({"host_regex": r"\.shop\.example$"}, b"shop.example/obj", False),
    ({"host_regex": r"\.shop\.example$"}, b"www.shop.example:8080/obj", False),  # the port is part of it
    ({"host_regex": "^www[.]", "target": "^/obj"}, b"www.shop.example/obj", True),
    ({"host_regex": "^www[.]", "target": "^/obj"}, b"www.shop.example/other", False),
    ({"host_regex": "^www[.]"}, b"/obj", True),  # stored without a host
    ({"key_url": "^shop.example/obj"}, b"shop.example/obj", True),  # an older node's ban
    ({"key_url": "^/obj"}, b"shop.example/obj", False),
]


@expand
class BanTests(SynchronousTestCase):
    @parametrize("kw, url, banned", CASES)
    def test_matches(self, kw: dict[str, str], url: bytes, banned: bool) -> None:
        self.assertEqual(Ban("s", **kw).matches(url), banned)  # type: ignore[arg-type]

    def test_key_urls_as_the_proxy_makes_them(self) -> None:
        """A ban written against the path and query finds the objects of
        ``key_url`` whatever the site's key holds."""
        ban = Ban("s", target="^/obj$")
        for policy in (CachePolicy(), CachePolicy(key_host=False), CachePolicy(key_query=False)):
            self.assertTrue(ban.matches(key_url(policy, b"Shop.Example:8080", b"/obj")), policy)
            self.assertFalse(ban.matches(key_url(policy, b"shop.example", b"/objx")), policy)
        self.assertTrue(Ban("s", host="shop.example").matches(key_url(CachePolicy(), b"SHOP.example", b"/")))

    def test_refused(self) -> None:
        """A bad regex, a host that is no host, or nothing to match."""
        for kw in ({}, {"target": "("}, {"host": "a b"}, {"host": "a/b"}, {"host": ""}, {"key_url": "["}, {"host_regex": "("},
                   {"target": "^/a", "host": ":80"}):
            with self.assertRaises(BanError, msg=repr(kw)):
                Ban("s", **kw)  # type: ignore[arg-type]

    def test_describe(self) -> None:
        self.assertEqual(
            Ban("a", target="^/obj", host="Shop.example:81").describe(),
            "site a, path and query ~ '^/obj', host shop.example:81",
        )
        self.assertEqual(Ban(None, host="x").describe(), "every site, host x")
        self.assertEqual(Ban(None, host_regex="^w").describe(), "every site, host ~ '^w'")

    def test_parts(self) -> None:
        self.assertEqual(split_key_url(b"a.test:81/p/q?x"), (b"a.test:81", b"/p/q?x"))
        self.assertEqual(split_key_url(b"/p"), (b"", b"/p"))
        self.assertEqual(normalise_host("WWW.A.test.:8080"), ("www.a.test", "8080"))
        self.assertEqual(normalise_host("[::1]:80"), ("[::1]", "80"))
        self.assertEqual(normalise_host("a.test:"), ("a.test", None))

    @given(st.from_regex(r"/[a-z/]{0,8}(\?[a-z=]{0,5})?", fullmatch=True),
           st.sampled_from([b"", b"a.test", b"b.test:8080"]))
    def test_target_regex_sees_the_target_only(self, target: str, host: bytes) -> None:
        """``^`` + the escaped target matches whatever host the URL was stored with."""
        import re

        url = (host + target.encode()) if host else target.encode()
        self.assertTrue(Ban("s", target="^" + re.escape(target) + "$").matches(url))
