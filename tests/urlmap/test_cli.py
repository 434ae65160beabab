"""``python -m prexy map-lookup``: one line per key, and exit 1 with the error for a bad map."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

from twisted.trial.unittest import SynchronousTestCase

from prexy.urlmap.cli import main
from tests.cases import tmp_dir
from tests.urlmap.helpers import REPO_ROOT


class CliTests(SynchronousTestCase):
    def test_one_line_per_key(self) -> None:
        """Each key prints its value; no value prints an empty line."""
        tmp_path = tmp_dir(self)
        path = tmp_path / "m.map"
        path.write_text("/a /b;\n~^/x/(\\d+)$ /y/$1;\n", encoding="latin-1")
        out = io.BytesIO()
        assert main(["--map", str(path), "/a", "/nope", "/x/7"], stdout=out) == 0
        assert out.getvalue() == b"/b\n\n/y/7\n"

    def test_variables_option(self) -> None:
        """``--var NAME=VALUE`` supplies variables used in values."""
        tmp_path = tmp_dir(self)
        path = tmp_path / "m.map"
        path.write_text("default https://$host/;\n", encoding="latin-1")
        out = io.BytesIO()
        assert main(["--map", str(path), "--var", "host=example.org", "/k"], stdout=out) == 0
        assert out.getvalue() == b"https://example.org/\n"

    def test_bad_map_exits_1_with_error(self) -> None:
        """A map that does not load prints file:line and the reason on stderr and exits 1."""
        tmp_path = tmp_dir(self)
        path = tmp_path / "bad.map"
        path.write_text("/a /b;\n~^/(a /c;\n", encoding="latin-1")
        out = io.BytesIO()
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            assert main(["--map", str(path), "/a"], stdout=out) == 1
        assert out.getvalue() == b""
        assert f'{path}:2: invalid regex "~^/(a"' in stderr.getvalue()

    def test_python_m_prexy_dispatch(self) -> None:
        """``python -m prexy map-lookup`` reaches this command."""
        tmp_path = tmp_dir(self)
        path = tmp_path / "m.map"
        path.write_text("/a /b;\n", encoding="latin-1")
        proc = subprocess.run(
            [sys.executable, "-m", "prexy", "map-lookup", "--map", str(path), "/a", "/z"],
            cwd=REPO_ROOT, capture_output=True, check=False,
        )
        assert (proc.returncode, proc.stdout) == (0, b"/b\n\n")
