"""The unit tier is found on disk, so a new test module runs in CI without
anyone listing it (``tests/units.py``, run by tox)."""

from __future__ import annotations

import configparser
import shutil
import tempfile
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from tests import units

ROOT = Path(__file__).resolve().parent.parent


class DiscoveryTests(SynchronousTestCase):
    """What ``discover`` finds in a tests tree."""

    def tree(self, files: list[str]) -> Path:
        top = Path(tempfile.mkdtemp(prefix="prexy-units-"))
        self.addCleanup(shutil.rmtree, top)
        root = top / "tests"
        root.mkdir()
        for name in ["__init__.py", *files]:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        return root

    def test_modules_and_packages(self) -> None:
        """Top-level test modules by name, packages holding test modules
        (at any depth) whole; helpers, empty packages and the integration
        tier left out."""
        root = self.tree([
            "test_a.py", "helpers.py", "test_b.py",
            "pkg/__init__.py", "pkg/deep/__init__.py", "pkg/deep/test_c.py",
            "empty/__init__.py", "empty/helpers.py",
            "integration/__init__.py", "integration/test_socket.py",
            "data/cases.json",
        ])
        self.assertEqual(units.discover(root), ["tests.pkg", "tests.test_a", "tests.test_b"])

    def test_new_module_is_found(self) -> None:
        """A module added to the tree is in the next discovery."""
        root = self.tree(["test_a.py"])
        (root / "test_new.py").write_text("")
        self.assertIn("tests.test_new", units.discover(root))

    def test_stray_module(self) -> None:
        """A test module in a directory that is not a package would never
        be collected: discovery refuses the tree, naming it."""
        root = self.tree(["pkg/__init__.py", "pkg/loose/test_x.py"])
        with self.assertRaises(units.Stray) as caught:
            units.discover(root)
        self.assertIn("tests/pkg/loose/test_x.py", str(caught.exception))

    def test_every_unit_module_on_disk_runs(self) -> None:
        """Every ``test_*.py`` of this checkout outside tests/integration is
        one of the discovered modules or inside a discovered package."""
        found = units.discover()
        missed = []
        for path in sorted((ROOT / "tests").rglob("test_*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[1] == "integration":
                continue
            name = ".".join(parts)
            if not any(name == m or name.startswith(m + ".") for m in found):
                missed.append(name)
        self.assertEqual(missed, [])
        self.assertIn("tests.test_units", found)
        self.assertNotIn("tests.integration", found)


class ArgumentTests(SynchronousTestCase):
    """How the runner's arguments become trial's."""

    def test_options_only(self) -> None:
        """Options alone: the discovered modules are added after them."""
        self.assertEqual(
            units.trial_argv(["--temp-directory=/x", "-j2"], ["tests.a", "tests.b"]),
            ["--temp-directory=/x", "-j2", "tests.a", "tests.b"],
        )

    def test_named_tests(self) -> None:
        """Named tests replace the discovered ones."""
        self.assertEqual(
            units.trial_argv(["--temp-directory=/x", "tests.test_http1"], ["tests.a"]),
            ["--temp-directory=/x", "tests.test_http1"],
        )


class ToxTests(SynchronousTestCase):
    """tox's unit environment runs the discovered tier under tmpguard and
    lists no module by hand."""

    def test_unit_env_uses_discovery(self) -> None:
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(ROOT / "tox.ini")
        commands = parser["testenv"]["commands"].strip()
        self.assertEqual(
            commands,
            "python -m tests.tmpguard python -m tests.units --temp-directory={envtmpdir}/_trial_temp {posargs}",
        )
