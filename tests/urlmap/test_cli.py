"""``python -m prexy map-lookup``: one line per key, and exit 1 with the error for a bad map."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest

from prexy.urlmap.cli import main
from tests.urlmap.helpers import REPO_ROOT


def test_one_line_per_key(tmp_path: Path) -> None:
    """Each key prints its value; no value prints an empty line."""
    path = tmp_path / "m.map"
    path.write_text("/a /b;\n~^/x/(\\d+)$ /y/$1;\n", encoding="latin-1")
    out = io.BytesIO()
    assert main(["--map", str(path), "/a", "/nope", "/x/7"], stdout=out) == 0
    assert out.getvalue() == b"/b\n\n/y/7\n"


def test_variables_option(tmp_path: Path) -> None:
    """``--var NAME=VALUE`` supplies variables used in values."""
    path = tmp_path / "m.map"
    path.write_text("default https://$host/;\n", encoding="latin-1")
    out = io.BytesIO()
    assert main(["--map", str(path), "--var", "host=example.org", "/k"], stdout=out) == 0
    assert out.getvalue() == b"https://example.org/\n"


def test_bad_map_exits_1_with_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A map that does not load prints file:line and the reason on stderr and exits 1."""
    path = tmp_path / "bad.map"
    path.write_text("/a /b;\n~^/(a /c;\n", encoding="latin-1")
    out = io.BytesIO()
    assert main(["--map", str(path), "/a"], stdout=out) == 1
    assert out.getvalue() == b""
    assert f'{path}:2: invalid regex "~^/(a"' in capsys.readouterr().err


def test_python_m_prexy_dispatch(tmp_path: Path) -> None:
    """``python -m prexy map-lookup`` reaches this command."""
    path = tmp_path / "m.map"
    path.write_text("/a /b;\n", encoding="latin-1")
    proc = subprocess.run(
        [sys.executable, "-m", "prexy", "map-lookup", "--map", str(path), "/a", "/z"],
        cwd=REPO_ROOT, capture_output=True, check=False,
    )
    assert (proc.returncode, proc.stdout) == (0, b"/b\n\n")
