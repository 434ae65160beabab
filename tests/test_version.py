"""``prexy --version`` and ``twistd prexy --version`` say Prexy's version."""

from __future__ import annotations

import contextlib
import io

from twisted.trial.unittest import SynchronousTestCase

from prexy import __version__
from prexy.__main__ import main
from prexy.service import Options


class VersionTests(SynchronousTestCase):
    def test_command(self) -> None:
        for flag in ("--version", "-V"):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(main([flag]), 0)
            self.assertEqual(out.getvalue(), f"prexy {__version__}\n")

    def test_twistd_plugin(self) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), self.assertRaises(SystemExit) as exited:
            Options().parseOptions(["--version"])
        self.assertEqual(exited.exception.code, 0)
        self.assertEqual(out.getvalue(), f"prexy {__version__}\n")

    def test_help_names_it(self) -> None:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            main(["--help"])
        self.assertIn("--version", out.getvalue())
