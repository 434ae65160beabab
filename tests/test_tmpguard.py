"""tests.tmpguard: a run gets a temporary directory of its own, and what the
run leaves there fails it."""

from __future__ import annotations

import io
import os
import sys
import tempfile
from contextlib import redirect_stderr

from twisted.trial.unittest import SynchronousTestCase

from tests import tmpguard


def run(code: str) -> tuple[int, str]:
    """tmpguard's status and report for ``python -c code``."""
    err = io.StringIO()
    with redirect_stderr(err):
        status = tmpguard.main([sys.executable, "-c", code])
    return status, err.getvalue()


class GuardTests(SynchronousTestCase):
    def test_clean_run_passes(self) -> None:
        """A command that removes what it makes passes, with no report."""
        status, report = run("import shutil, tempfile; shutil.rmtree(tempfile.mkdtemp())")
        self.assertEqual((status, report), (0, ""))

    def test_leftover_fails_and_is_named(self) -> None:
        """A passing command that leaves a directory fails the run with
        LEFT_FILES, the directory is named, and nothing stays behind."""
        status, report = run(
            "import os, tempfile\n"
            "d = tempfile.mkdtemp(prefix='left-')\n"
            "open(os.path.join(d, 'f'), 'w').close()\n"
            "print(os.path.dirname(d))"
        )
        self.assertEqual(status, tmpguard.LEFT_FILES)
        self.assertIn("left 1 entry", report)
        self.assertIn("  left-", report)
        private = report.split("temporary directory ", 1)[1].split(" ", 1)[0]
        self.assertFalse(os.path.exists(private))

    def test_failing_command_keeps_its_status(self) -> None:
        """A failing command's status wins; its leftovers are still reported."""
        status, report = run("import sys, tempfile; tempfile.mkdtemp(); sys.exit(5)")
        self.assertEqual(status, 5)
        self.assertIn("left 1 entry", report)

    def test_children_use_the_private_directory(self) -> None:
        """The command (and what it starts) sees TMPDIR set to the private
        directory, not the machine's."""
        status, report = run(
            "import os, sys, tempfile\n"
            "sys.exit(0 if os.path.basename(tempfile.gettempdir()).startswith('prexy-tests-') else 7)"
        )
        self.assertEqual(status, 0, report)

    def test_private_tmp_restores(self) -> None:
        """PrivateTmp points tempfile at its directory until closed, then
        removes it and restores the previous settings."""
        before = (os.environ.get("TMPDIR"), tempfile.tempdir)
        private = tmpguard.PrivateTmp()
        try:
            self.assertEqual(tempfile.gettempdir(), private.path)
            tempfile.mkdtemp(prefix="x-")
            self.assertEqual(len(private.leftovers()), 1)
            self.assertEqual(private.leftovers(ignore=lambda name: name.startswith("x-")), [])
        finally:
            private.close()
        self.assertEqual((os.environ.get("TMPDIR"), tempfile.tempdir), before)
        self.assertFalse(os.path.exists(private.path))
