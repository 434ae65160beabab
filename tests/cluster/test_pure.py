"""The cluster's cores (settings, messages, node core) import neither Twisted
nor the proxy shell, however indirectly (the checks of tests.test_imports,
run on this package's cores)."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from tests.test_imports import import_graph, module_files, reachable, top_level_imports

CORES = ("prexy.cluster.settings", "prexy.cluster.messages", "prexy.cluster.core")


class PureClusterCoreTests(SynchronousTestCase):
    def test_cores_are_pure(self) -> None:
        files = module_files()
        graph = import_graph()
        bad = []
        for core in CORES:
            for module in sorted(reachable(graph, core)):
                if module.startswith("prexy.proxy") or "twisted" in top_level_imports(files[module]):
                    bad.append(f"{core} -> {module}")
        self.assertEqual(bad, [])
