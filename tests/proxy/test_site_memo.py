"""The site a Host value selects is looked up once per value
(``ProxyResource.site_for``): a reload that replaces the runtime is obeyed
at the next request, and a client inventing Host values costs lookups,
never memory past ``SITE_MEMO`` values.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.proxy.resource import SITE_MEMO
from prexy.runtime import build_runtime

from .support import Harness


def _config(a_hosts: tuple[str, ...], b_hosts: tuple[str, ...]) -> Config:
    return Config(
        listen=("tcp:0",),
        sites=(
            SiteConfig("a", UpstreamURL.parse("http://a.origin"), hosts=a_hosts),
            SiteConfig("b", UpstreamURL.parse("http://b.origin"), hosts=b_hosts),
        ),
        default_site="a",
    )


class SiteMemo(SynchronousTestCase):
    def test_same_site_as_the_runtime(self) -> None:
        """Each Host value, with any case and port, gets the site the
        runtime selects, the second time too."""
        h = Harness(_config(("a.test",), ("b.test",)))
        for _ in range(2):
            for host in (b"a.test", b"B.TEST:8080", b"b.test", b"other.test", None):
                self.assertIs(h.resource.site_for(host), h.runtime.select(host), host)

    def test_reload_obeyed(self) -> None:
        """A new runtime (a reload moved b.test to site a) is used at once."""
        h = Harness(_config(("a.test",), ("b.test",)))
        self.assertEqual(h.resource.site_for(b"b.test").name, "b")
        h.resource.runtime = build_runtime(_config(("a.test", "b.test"), ("c.test",)))
        self.assertEqual(h.resource.site_for(b"b.test").name, "a")
        h.send(b"GET / HTTP/1.1\r\nHost: b.test\r\n\r\n")
        self.assertIn(b"Host: b.test", h.conns[-1].sent())
        self.assertEqual(h.conns[-1].protocol.key.host, "a.origin")

    def test_bounded(self) -> None:
        """Past SITE_MEMO distinct values the memo starts afresh."""
        h = Harness(_config(("a.test",), ("b.test",)))
        for i in range(SITE_MEMO * 2 + 5):
            self.assertEqual(h.resource.site_for(b"x%d.test" % i).name, "a")
            self.assertLessEqual(len(h.resource._sites), SITE_MEMO)
