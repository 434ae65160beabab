"""``python -m prexy rewrite``: rules files applied to stdin, load errors exit 1."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.cli import main
from tests.cases import tmp_dir

from .shared import TRIM_CASES, TRIM_PAGE

PAGE = b'<a href="http://www.example.com/x">UA-1234-5</a>\n' * 50


def write_rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "site.rules"
    path.write_bytes(
        b"replace_filter 'www\\.example\\.com' 'www.example.nl' g;\n"
        b"replace_filter '(UA-)\\d+-\\d+' '${1}99999-9' gi;\n"
    )
    return path


def run_main(argv: list[str], data: bytes, stderr: io.StringIO | None = None) -> tuple[int, bytes]:
    out = io.BytesIO()
    with contextlib.redirect_stderr(stderr if stderr is not None else sys.stderr):
        status = main(argv, stdin=io.BytesIO(data), stdout=out)
    return status, out.getvalue()


class CliTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.tmp_path = tmp_dir(self)
        self.rules_file = write_rules_file(self.tmp_path)

    def test_rewrite_whole_and_chunked_agree(self) -> None:
        """Any --chunk-size gives the same bytes as the whole input."""
        expected = PAGE.replace(b"www.example.com", b"www.example.nl").replace(
            b"UA-1234-5", b"UA-99999-9"
        )
        for size in ([], ["--chunk-size", "1"], ["--chunk-size", "7"], ["--chunk-size", "4096"]):
            assert run_main(["--rules", str(self.rules_file), *size], PAGE) == (0, expected)

    def test_several_rules_files(self) -> None:
        """--rules may be repeated; files apply in order."""
        tmp_path = self.tmp_path
        more = tmp_path / "more.rules"
        more.write_bytes(b"replace_filter href HREF g;")
        status, out = run_main(["--rules", str(self.rules_file), "--rules", str(more)], PAGE)
        assert status == 0
        assert out.count(b"HREF=") == 50

    def test_bad_rules_file_exits_1_with_position(self) -> None:
        """A load error is printed as file:line:col: reason and exits 1."""
        tmp_path = self.tmp_path
        bad = tmp_path / "bad.rules"
        bad.write_bytes(b"# header\nreplace_filter 'a(' b g;\n")
        stderr = io.StringIO()
        status, out = run_main(["--rules", str(bad)], b"abc", stderr)
        assert status == 1
        assert out == b""
        err = stderr.getvalue()
        assert err.startswith(f"{bad}:2:")
        assert "bad regex" in err

    def test_module_entry_point(self) -> None:
        """``python -m prexy rewrite`` works as a real process."""
        proc = subprocess.run(
            [sys.executable, "-m", "prexy", "rewrite", "--rules", str(self.rules_file), "--chunk-size", "3"],
            input=b"see www.example.com",
            capture_output=True,
            cwd=Path(__file__).resolve().parents[2],
            check=False,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == b"see www.example.nl"

    def test_module_entry_point_bad_file(self) -> None:
        """The process exits non-zero with the load error on stderr."""
        tmp_path = self.tmp_path
        bad = tmp_path / "bad.rules"
        bad.write_bytes(b"replace_filter a b gx;")
        proc = subprocess.run(
            [sys.executable, "-m", "prexy", "rewrite", "--rules", str(bad)],
            input=b"a",
            capture_output=True,
            cwd=Path(__file__).resolve().parents[2],
            check=False,
            timeout=60,
        )
        assert proc.returncode == 1
        assert proc.stderr.decode().strip() == f"{bad}:1:20: unknown flag 'x' in \"gx\""

    def test_core_imports_no_twisted(self) -> None:
        """The substitution core is pure: importing it loads no Twisted module."""
        code = (
            "import sys, prexy.substitution, prexy.substitution.cli; "
            "sys.exit(any(m == 'twisted' or m.startswith('twisted.') for m in sys.modules))"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=Path(__file__).resolve().parents[2],
            check=False,
            timeout=60,
        )
        assert proc.returncode == 0

    def test_explain_names_each_rules_engine(self) -> None:
        """--explain prints, per rule, its number, file:line, the engine and why; a rule
        ``regex`` cannot bound is on RE2, not refused."""
        tmp_path = self.tmp_path
        path = tmp_path / "mixed.rules"
        path.write_bytes(
            b"replace_filter 'www\\.example\\.com' 'www.example.nl' g;\n"
            b"replace_filter '\"(\\\\\\\\.|[^\"])*\"' 'S' g;\n"
        )
        status, out = run_main(["--rules", str(path), "--explain"], b"")
        assert status == 0
        lines = out.decode().splitlines()
        assert len(lines) == 2
        assert lines[0].startswith(f"1 {path}:1: 'www\\.example\\.com' g: regex: ")
        assert lines[1].startswith(f"2 {path}:2: '\"(\\\\.|[^\"])*\"' g: re2: regex could backtrack: ")
        status, out = run_main(["--rules", str(path)], b'a "x\\"y" b')
        assert (status, out) == (0, b"a S b")

    def test_explain_names_the_sregex_order_vm(self) -> None:
        """A rule whose matches depend on sregex's thread order is on the
        sregex-order VM, says why, and rewrites as the module does."""
        path = self.tmp_path / "trim.rules"
        path.write_bytes(b"replace_filter '^\\s+|\\s+$' '[$&]' g;\n")
        status, out = run_main(["--rules", str(path), "--explain"], b"")
        assert status == 0
        assert out.decode().startswith(f"1 {path}:1: '^\\s+|\\s+$' g: sregex-vm: sregex's thread order: ")
        status, out = run_main(["--rules", str(path)], b"baby!\n     \nabc\n")
        assert (status, out) == (0, b"baby!\n[     \n]abc[\n]")

    def test_bad_chunk_size_exits_2(self) -> None:
        """A chunk size of zero or less is refused."""
        stderr = io.StringIO()
        assert run_main(["--rules", str(self.rules_file), "--chunk-size", "0"], b"x", stderr) == (2, b"")
        assert "--chunk-size" in stderr.getvalue()


class EndWithLastChunkTests(SynchronousTestCase):
    """The last chunk of stdin is fed with the end of the body, as nginx
    gives the module a file: the module's own trim tests come out exactly,
    without a bail-out, at the limit of 0 they were written with."""

    def setUp(self) -> None:
        self.tmp_path = tmp_dir(self)

    def _rules(self, pattern: bytes, replacement: bytes) -> str:
        path = self.tmp_path / "trim.rules"
        path.write_bytes(
            b"replace_filter_max_buffered_size 0;\nreplace_filter '%s' '%s' g;\n" % (pattern, replacement)
        )
        return str(path)

    def test_module_trim_cases(self) -> None:
        """Read in one chunk (the default) or in chunks of which the last
        holds all the trailing blanks: the module's bytes, no bail-out."""
        for name, pattern, replacement, expected in TRIM_CASES:
            rules = self._rules(pattern, replacement)
            for size in ([], ["--chunk-size", str(len(TRIM_PAGE))], ["--chunk-size", str(len(TRIM_PAGE) - 1)]):
                stderr = io.StringIO()
                assert run_main(["--rules", rules, *size], TRIM_PAGE, stderr) == (0, expected), (name, size)
                assert stderr.getvalue() == "", (name, size)

    def test_end_apart_is_the_proxied_delivery(self) -> None:
        """``--end-apart`` gives the end on its own after the last chunk: the
        trailing blanks are held past the limit of 0 and pass unchanged
        (the module's bail-out on a proxied body), and it says so."""
        rules = self._rules(b"\\s+$", b"")
        stderr = io.StringIO()
        assert run_main(["--rules", rules, "--end-apart"], TRIM_PAGE, stderr) == (0, TRIM_CASES[0][3] + b"\n")
        assert "replace_filter_max_buffered_size (0) exceeded" in stderr.getvalue()

    def test_end_apart_same_bytes_when_nothing_bails_out(self) -> None:
        """Under the default limit, where the end comes makes no difference."""
        expected = PAGE.replace(b"www.example.com", b"www.example.nl").replace(b"UA-1234-5", b"UA-99999-9")
        rules = str(write_rules_file(self.tmp_path))
        for size in ([], ["--chunk-size", "1"], ["--chunk-size", "7"]):
            assert run_main(["--rules", rules, "--end-apart", *size], PAGE) == (0, expected)
            assert run_main(["--rules", rules, *size], PAGE) == (0, expected)
        assert run_main(["--rules", rules], b"") == (0, b"")
        assert run_main(["--rules", rules, "--end-apart"], b"") == (0, b"")

    def test_through_the_process(self) -> None:
        """``python -m prexy rewrite`` as a real process, stdin a pipe."""
        proc = subprocess.run(
            [sys.executable, "-m", "prexy", "rewrite", "--rules", self._rules(b"\\s+$", b"[$&]")],
            input=TRIM_PAGE,
            capture_output=True,
            cwd=Path(__file__).resolve().parents[2],
            check=False,
            timeout=60,
        )
        assert (proc.returncode, proc.stdout, proc.stderr) == (0, TRIM_CASES[2][3], b"")
