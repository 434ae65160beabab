"""The house drawn from its imports: no prexy module imports itself back.

Every module under ``prexy/`` is parsed (not imported) and every import of
a prexy module it makes is an edge: module level, inside functions, under
``if TYPE_CHECKING:``, relative or absolute.  ``from prexy.a import b``
is an edge to ``prexy.a.b`` when that is a module, else to ``prexy.a``.
Importing ``prexy.a.b`` runs ``prexy/a/__init__.py`` first, but that is
the package's business, not an edge of the importer: a package's
``__init__`` that gathers its submodules would otherwise make every
submodule that imports a sibling look like a cycle.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

import prexy

ROOT = Path(prexy.__file__).resolve().parent


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of the package at ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The prexy modules that module ``name`` (its source in ``path``) imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
    # "import prexy.a.b" names prexy.a.b; keep only modules that exist (the
    # longest existing prefix, for "import prexy.a.b.attr"-like oddities).
    out = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    names = set(files)
    return {name: imports_of(name, path, names) for name, path in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component that has one (Tarjan),
    each as a closed path ``[a, b, ..., a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def connect(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_in(graph, set(c), c[0]) for c in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """A shortest closed path from ``start`` back to it inside ``component``."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return paths[v] + [start]
                if w not in paths:
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is in a component without a cycle")


#: The modules that wire the Twisted shell (``prexy.proxy``) into a
#: service; no other module outside it imports it.
SHELL_WIRING = frozenset({"prexy.service"})


class ImportGraphTests(SynchronousTestCase):
    """Prexy's modules import each other along a directed acyclic graph."""

    def test_no_cycle(self) -> None:
        """No chain of imports leads from a prexy module back to itself."""
        cycles = find_cycles(import_graph())
        if cycles:
            self.fail("import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles))

    def test_only_the_wiring_imports_the_shell(self) -> None:
        """Outside ``prexy.proxy``, only the service wiring imports it: the
        pool, the cluster node and the demo take what they share with the
        shell (the cache path) from a core module below both."""
        graph = import_graph()
        upward = sorted(
            f"{m} -> {t}"
            for m, targets in graph.items()
            if not (m == "prexy.proxy" or m.startswith("prexy.proxy.")) and m not in SHELL_WIRING
            for t in targets
            if t == "prexy.proxy" or t.startswith("prexy.proxy.")
        )
        self.assertEqual(upward, [])

    def test_cycle_report(self) -> None:
        """The cycle finder reports one closed path per tangle, and none for
        a graph without one."""
        self.assertEqual(
            find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}),
            [["a", "b", "c", "a"]],
        )
        self.assertEqual(find_cycles({"a": {"b"}, "b": set()}), [])

    def test_resolution(self) -> None:
        """Relative imports, ``from pkg import submodule`` and imports inside
        functions and TYPE_CHECKING blocks all become edges."""
        top = tempfile.mkdtemp(prefix="prexy-imports-")
        self.addCleanup(shutil.rmtree, top)
        d = Path(top) / "pkg"
        (d / "sub").mkdir(parents=True)
        (d / "__init__.py").write_text("")
        (d / "a.py").write_text(
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from pkg.b import X\n"
            "def f():\n    from . import sub\n"
        )
        (d / "b.py").write_text("from .sub.c import thing\n")
        (d / "sub" / "__init__.py").write_text("from .. import a\n")
        (d / "sub" / "c.py").write_text("import pkg.sub\nfrom pkg import b\n")
        graph = import_graph(d)
        self.assertEqual(graph["pkg.a"], {"pkg.b", "pkg.sub"})
        self.assertEqual(graph["pkg.b"], {"pkg.sub.c"})
        self.assertEqual(graph["pkg.sub"], {"pkg.a"})
        self.assertEqual(graph["pkg.sub.c"], {"pkg.sub", "pkg.b"})
        self.assertEqual(find_cycles(graph), [["pkg.a", "pkg.sub", "pkg.a"]])


#: The sans-IO cores: what they import, all the way down, is no Twisted and
#: nothing of the shell (``prexy.proxy``), so each is tested on its own.
CORES = (
    "prexy.config",
    "prexy.certs",
    "prexy.endpoints",
    "prexy.hostnames",
    "prexy.runtime",
    "prexy.exchange",
    "prexy.fetch",
    "prexy.http1",
    "prexy.requesthead",
    "prexy.h1server",
    "prexy.headerrules",
    "prexy.forwarding",
    "prexy.errorpages",
    "prexy.upgrade",
    "prexy.codec",
    "prexy.cache.policy",
    "prexy.cache.flow",
    "prexy.cache.ranges",
    "prexy.cache.codings",
    "prexy.cache.bans",
    "prexy.substitution.transducer",
    "prexy.substitution.cli",
    "prexy.substitution.dryrun",
    "prexy.urlmap.index",
    "prexy.urlmap.loader",
    "prexy.nginxconf.parser",
    "prexy.nginxconf.convert",
    "prexy.nginxconf.cli",
    "prexy.h2server",
    "prexy.control",
    "prexy.acme.policy",
    "prexy.acme.storage",
    "prexy.acme.challenges",
    "prexy.clienthello",
)


def top_level_imports(path: Path) -> set[str]:
    """The first dotted part of every module ``path`` imports (absolute
    imports only: a relative one stays inside prexy)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and every prexy module it imports, directly or not."""
    seen = {start}
    todo = [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def bench_graph(root: Path) -> dict[str, set[str]]:
    """The import graph of ``bench/``'s scripts, which import each other as
    top-level modules (``run.py`` puts ``bench/`` on the path)."""
    files = {path.stem: path for path in sorted(root.glob("*.py"))}
    return {name: top_level_imports(path) & set(files) - {name} for name, path in files.items()}


class BenchGraphTests(SynchronousTestCase):
    """The benchmark scripts import each other along a directed acyclic
    graph too: the scenario catalog sits above the scenario modules, which
    take their shared pieces from ``scenarios.py`` below them."""

    def test_no_cycle(self) -> None:
        graph = bench_graph(ROOT.parent / "bench")
        self.assertIn("scenarios", graph)
        cycles = find_cycles(graph)
        if cycles:
            self.fail("bench import cycles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles))


class PureCoreTests(SynchronousTestCase):
    """The cores import neither Twisted nor the shell, however indirectly."""

    def test_cores_are_pure(self) -> None:
        """No core reaches twisted or prexy.proxy through its imports."""
        files = module_files()
        graph = import_graph()
        bad = []
        for core in CORES:
            self.assertIn(core, files)
            for module in sorted(reachable(graph, core)):
                if module == "prexy.proxy" or module.startswith("prexy.proxy."):
                    bad.append(f"{core} -> {module}")
                elif "twisted" in top_level_imports(files[module]):
                    bad.append(f"{core} -> {module} imports twisted")
        if bad:
            self.fail("impure cores:\n" + "\n".join("  " + b for b in bad))

    def test_reachable(self) -> None:
        """Reachability follows imports transitively and stops at cycles."""
        self.assertEqual(reachable({"a": {"b"}, "b": {"c", "a"}, "c": set(), "d": {"a"}}, "a"), {"a", "b", "c"})


#: Packages a core must import without: the LMDB binding (the cache store),
#: the regex engines the rule sets compile to, and Twisted (the shell).
HEAVY = ("lmdb", "re2", "hyperscan", "twisted")

#: Modules importable, and working, without ``HEAVY``: the cores, and the
#: packages whose ``__init__`` re-exports lazily so that importing one pure
#: submodule does not load the rest.
LEAN = (
    *CORES, "prexy.cluster.core", "prexy.fetch", "prexy.headeredits", "prexy.headervars",
    "prexy.cache", "prexy.substitution", "prexy.urlmap",
)


class LeanImportTests(SynchronousTestCase):
    """Each core imports, and works, with the heavy bindings not installed:
    a core that pulled them in through a package ``__init__`` (``config`` ->
    ``prexy.cache`` -> the store -> ``lmdb``) could not be imported, nor
    tested, on its own."""

    def test_cores_import_without_heavy_bindings(self) -> None:
        """A child Python refuses ``HEAVY`` and imports each of ``LEAN`` from
        scratch, running its smoke check (``tests/blockedimports.py``)."""
        tests = Path(__file__).resolve().parent
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tests.parent), os.environ.get("PYTHONPATH")])))
        done = subprocess.run(
            [sys.executable, str(tests / "blockedimports.py"), ",".join(HEAVY), *LEAN],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        self.assertEqual(done.returncode, 0, done.stderr)
        results = [json.loads(line) for line in done.stdout.splitlines()]
        self.assertEqual([r["module"] for r in results], list(LEAN))
        bad = [f"{r['module']}: {r['error'] or 'loaded ' + ', '.join(r['blocked'])}"
               for r in results if r["error"] or r["blocked"]]
        if bad:
            self.fail("cores that need " + "/".join(HEAVY) + ":\n" + "\n".join(bad))

    def test_lazy_reexports(self) -> None:
        """The lazy packages export what ``__all__`` says, each name the
        submodule's own object."""
        import importlib

        for package in ("prexy.cache", "prexy.substitution"):
            module = importlib.import_module(package)
            self.assertEqual(sorted(module._SOURCES), sorted(module.__all__))
            for name in module.__all__:
                source = importlib.import_module(module._SOURCES[name])
                self.assertIs(getattr(module, name), getattr(source, name))
            with self.assertRaises(AttributeError):
                module.no_such_name  # noqa: B018
