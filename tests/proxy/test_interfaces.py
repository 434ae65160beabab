"""The zope interfaces at the proxy's seams are really provided, with the
declared methods and signatures (zope.interface.verify), and the connection
module does not import the pool that owns its connections."""

from __future__ import annotations

import ast
import inspect
import shutil
import tempfile

from twisted.internet.testing import MemoryReactorClock
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyClass, verifyObject

from prexy.cache import ICacheStore, Store
from prexy.config import Timeouts
from prexy.proxy import forward, upstream
from prexy.proxy.pool import IUpstreamPool, PendingRequest, UpstreamPool
from prexy.proxy.upstream import IBodyConsumer, IConnectionOwner, IPendingRequest


class ProvidedInterfaces(SynchronousTestCase):
    """Each implementer provides the interface its consumers are typed with."""

    def test_pool(self) -> None:
        """The pool is the resource's IUpstreamPool and its connections'
        IConnectionOwner (reactor and timeouts included)."""
        pool = UpstreamPool(MemoryReactorClock(), Timeouts())
        self.assertTrue(verifyObject(IUpstreamPool, pool))
        self.assertTrue(verifyObject(IConnectionOwner, pool))

    def test_pending_request(self) -> None:
        """A pending request is what a connection reports the head to."""
        self.assertTrue(verifyClass(IPendingRequest, PendingRequest))

    def test_body_consumers(self) -> None:
        """The exchange and the discarding consumer take a response body."""
        self.assertTrue(verifyClass(IBodyConsumer, forward.Exchange))
        self.assertTrue(verifyObject(IBodyConsumer, forward._Discard()))

    def test_store(self) -> None:
        """An open LMDB store is the cache layer's ICacheStore."""
        path = tempfile.mkdtemp(prefix="prexy-iface-")
        self.addCleanup(shutil.rmtree, path, True)
        store = Store.open(path, 1 << 20)
        self.addCleanup(store.close)
        self.assertTrue(verifyObject(ICacheStore, store))


class NoImportCircle(SynchronousTestCase):
    """prexy.proxy.upstream knows its pool only through IConnectionOwner."""

    def test_upstream_does_not_import_pool(self) -> None:
        """No import of prexy.proxy.pool in upstream.py, not even one
        guarded by TYPE_CHECKING."""
        tree = ast.parse(inspect.getsource(upstream))
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        self.assertNotIn("prexy.proxy.pool", imported)
