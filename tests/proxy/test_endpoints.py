"""Which endpoint the upstream pool connects with by default: an address
is connected to directly (no name resolution in the thread pool), a host
name through HostnameEndpoint; https wraps either in TLS."""

from __future__ import annotations

from twisted.internet.endpoints import HostnameEndpoint, TCP4ClientEndpoint, TCP6ClientEndpoint
from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import OriginKey, Timeouts
from prexy.proxy.pool import UpstreamPool


class DefaultEndpointTests(SynchronousTestCase):
    def _endpoint(self, host: str, scheme: str = "http") -> object:
        pool = UpstreamPool(MemoryReactorClock(), Timeouts())
        return pool.default_endpoint(OriginKey(scheme, host, 8080), 5)

    def test_addresses_are_not_resolved(self) -> None:
        self.assertIsInstance(self._endpoint("127.0.0.1"), TCP4ClientEndpoint)
        self.assertIsInstance(self._endpoint("::1"), TCP6ClientEndpoint)

    def test_names_are_resolved(self) -> None:
        self.assertIsInstance(self._endpoint("origin.example"), HostnameEndpoint)

    def test_https_wraps_the_endpoint(self) -> None:
        endpoint = self._endpoint("127.0.0.1", "https")
        self.assertNotIsInstance(endpoint, TCP4ClientEndpoint)
        self.assertTrue(hasattr(endpoint, "connect"))
