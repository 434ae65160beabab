"""``prexy --version`` and ``twistd prexy --version`` say Prexy's version; ``prexy convert``
reaches the converter."""

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


class ConvertCommandTests(SynchronousTestCase):
    def test_prexy_convert_nginx(self) -> None:
        """``prexy convert nginx FILE -o DIR`` reaches the converter."""
        import os

        from tests.cases import tmp_dir

        directory = tmp_dir(self)
        source = os.path.join(directory, "nginx.conf")
        with open(source, "w") as f:
            f.write("http { server { listen 8080; server_name a.test;"
                    " location / { proxy_pass http://127.0.0.1:9; } } }\n")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["convert", "nginx", source, "-o", os.path.join(directory, "out")]), 0)
        with open(os.path.join(directory, "out", "prexy.toml")) as f:
            self.assertIn('upstream = "http://127.0.0.1:9"', f.read())
