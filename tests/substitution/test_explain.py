"""``python -m prexy rewrite --explain``: the rules numbered, and with pages
each rule's substitutions, pages and bytes as the transducer counts them.

The pages are bench/content.py's deterministic news pages (the domain, the
analytics id, a few ``word<digits>token`` strings); the rules file is a
clone's, with a once-rule and a rule that matches nothing.  Every count is
checked against the transducers' own ``rule_counts`` page by page.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from bench import content
from prexy.substitution.rules import load_rules
from prexy.substitution.transducer import Transducer
from tests.cases import tmp_dir

from .test_cli import run_main

REPO_ROOT = Path(__file__).resolve().parents[2]


RULES = (
    b"# a clone of www.example.com\n"
    b"replace_filter_types text/html;\n"
    b"replace_filter 'https://www\\.example\\.com' 'https://www.example.org' g;\n"
    b"replace_filter '(UA-)\\d+-\\d+' '${1}00000000-0' g;\n"
    b"replace_filter '</head>' '<script src=\"/clone.js\"></script></head>' ;\n"
    b"\n"
    b"replace_filter 'old-cdn\\.example\\.net' 'cdn.example.org' gi;\n"
)
MORE = b"replace_filter 'word(\\d+)token' 'W$1' g;\nreplace_filter 'never here' 'x' g;\n"


def pages(tmp: Path, count: int = 4) -> list[Path]:
    out = []
    for seed in range(1, count + 1):
        path = tmp / f"page{seed}.html"
        path.write_bytes(content.html_page(20000 + 997 * seed, seed=seed))
        out.append(path)
    # A page none of the rules touch.
    plain = tmp / "plain.txt"
    plain.write_bytes(b"nothing to see\n" * 100)
    out.append(plain)
    return out


class ExplainTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.tmp = tmp_dir(self)
        # (load_rules shares a compiled set among files of the same
        # content, origins and all: each test's files differ by a comment.)
        unique = f"# {self.tmp}\n".encode()
        self.rules = self.tmp / "clone.rules"
        self.rules.write_bytes(RULES + unique)
        self.more = self.tmp / "more.rules"
        self.more.write_bytes(MORE + unique)
        self.argv = ["--rules", str(self.rules), "--rules", str(self.more), "--explain"]
        self.pages = pages(self.tmp)

    def expected(self) -> tuple[list[int], list[int], list[int]]:
        """Per rule index: substitutions, pages, bytes, from one
        transducer per page fed the whole page with its end."""
        ruleset = load_rules([self.rules, self.more])
        n = len(ruleset.rules)
        matches, on_pages, sizes = [0] * n, [0] * n, [0] * n
        for page in self.pages:
            t = Transducer(ruleset)
            t.finish(page.read_bytes())
            for k in range(n):
                matches[k] += t.rule_counts[k]
                on_pages[k] += t.rule_counts[k] > 0
                sizes[k] += t.rule_bytes[k]
        return matches, on_pages, sizes

    def test_listing_is_numbered_across_files(self) -> None:
        """Without pages (stdin empty): one line per rule, numbered 1, 2, ...
        over the files in order, each with its file:line."""
        status, out = run_main(self.argv, b"")
        assert status == 0
        lines = out.decode().splitlines()
        assert [line.split(" ", 1)[0] for line in lines] == ["1", "2", "3", "4", "5", "6"]
        assert lines[0].startswith(f"1 {self.rules}:3: 'https://www\\.example\\.com' g: regex: ")
        assert lines[2].startswith(f"3 {self.rules}:5: '</head>' -: ")
        assert lines[3].startswith(f"4 {self.rules}:7: 'old-cdn\\.example\\.net' gi: ")
        assert lines[4].startswith(f"5 {self.more}:1: 'word(\\d+)token' g: ")

    def test_counts_on_pages_are_the_transducers(self) -> None:
        """With pages: per rule its substitutions, pages and bytes, equal to
        the transducers' own counts; then the rules that matched nothing;
        then the totals."""
        status, out = run_main([*self.argv, *map(str, self.pages)], b"")
        assert status == 0
        lines = out.decode().splitlines()
        matches, on_pages, sizes = self.expected()
        assert matches[0] > 20 and matches[1] == 2 * 4 and matches[2] == 4 and matches[4] > 0
        for k in range(6):
            origin = f"{self.rules if k < 4 else self.more}:{[3, 4, 5, 7, 1, 2][k]}"
            assert lines[k].startswith(
                f"{k + 1} {origin} matches={matches[k]} pages={on_pages[k]} bytes={sizes[k]} '"
            ), lines[k]
        assert lines[6:] == [
            f"never 4 {self.rules}:7 'old-cdn\\.example\\.net' gi",
            f"never 6 {self.more}:2 'never here' g",
            f"total pages=5 matches={sum(matches)} bytes={sum(sizes)}",
        ]

    def test_every_chunk_size_counts_the_same(self) -> None:
        """The pages go through the same chunked feeding as ``rewrite``;
        whatever the chunk size, the counts are the same."""
        argv = [*self.argv, *map(str, self.pages)]
        status, expected = run_main(argv, b"")
        for size in ("1", "100", "4096"):
            assert run_main([*argv, "--chunk-size", size], b"") == (status, expected)
            assert run_main([*argv, "--chunk-size", size, "--end-apart"], b"") == (status, expected)

    def test_stdin_is_a_page(self) -> None:
        """No PAGE, stdin not a terminal and not empty: stdin is the page;
        ``-`` names it among files."""
        page = self.pages[0].read_bytes()
        status, from_stdin = run_main(self.argv, page)
        assert status == 0
        assert run_main([*self.argv, str(self.pages[0])], b"") == (0, from_stdin)
        status, mixed = run_main([*self.argv, "-", str(self.pages[1])], page)
        assert status == 0
        assert run_main([*self.argv, str(self.pages[0]), str(self.pages[1])], b"") == (0, mixed)
        assert b"total pages=1 " in from_stdin and b"total pages=2 " in mixed

    def test_json(self) -> None:
        """--json: the rules with number, file, line, pattern, flags, engine;
        with pages also matches, pages, bytes_changed, never_matched and
        the page count."""
        status, out = run_main([*self.argv, "--json", *map(str, self.pages)], b"")
        assert status == 0
        report = json.loads(out)
        matches, on_pages, sizes = self.expected()
        assert report["pages"] == 5
        assert report["never_matched"] == [4, 6]
        assert [r["number"] for r in report["rules"]] == [1, 2, 3, 4, 5, 6]
        first = report["rules"][0]
        assert first["file"] == str(self.rules) and first["line"] == 3
        assert first["pattern"] == "https://www\\.example\\.com" and first["flags"] == "g"
        assert first["engine"] == "regex"
        assert report["rules"][2]["flags"] == "" and report["rules"][3]["flags"] == "gi"
        assert [r["matches"] for r in report["rules"]] == matches
        assert [r["pages"] for r in report["rules"]] == on_pages
        assert [r["bytes_changed"] for r in report["rules"]] == sizes
        status, out = run_main([*self.argv, "--json"], b"")
        listing = json.loads(out)
        assert set(listing) == {"rules"}
        assert [(r["number"], r["line"]) for r in listing["rules"]] == [(1, 3), (2, 4), (3, 5), (4, 7), (5, 1), (6, 2)]
        assert "matches" not in listing["rules"][0]

    def test_a_page_that_cannot_be_read(self) -> None:
        """A missing page exits 1, names it, and prints no counts."""
        stderr = io.StringIO()
        status, out = run_main([*self.argv, str(self.pages[0]), str(self.tmp / "missing.html")], b"", stderr)
        assert (status, out) == (1, b"")
        assert f"cannot read page {self.tmp / 'missing.html'}" in stderr.getvalue()

    def test_pages_without_explain_are_refused(self) -> None:
        stderr = io.StringIO()
        assert run_main(["--rules", str(self.rules), str(self.pages[0])], b"", stderr) == (2, b"")
        assert run_main(["--rules", str(self.rules), "--json"], b"", stderr) == (2, b"")
        assert "go with --explain" in stderr.getvalue()

    def test_a_page_that_bails_out_is_named(self) -> None:
        """A page whose rewrite hit the buffer limit is named on stderr;
        its counts are what the transducer made before it (as live)."""
        small = self.tmp / "small.rules"
        small.write_bytes(b"replace_filter_max_buffered_size 8;\nreplace_filter 'a' 'A' g;\nreplace_filter '<[^>]*>' 'T' g;\n")
        page = self.tmp / "long-tag.html"
        page.write_bytes(b"a a <" + b"x" * 100 + b"> a")
        stderr = io.StringIO()
        status, out = run_main(["--rules", str(small), "--explain", "--chunk-size", "16", str(page)], b"", stderr)
        assert status == 0
        assert f"{page}: the buffer limit or a scan timeout stopped substitution" in stderr.getvalue()
        assert out.decode().splitlines()[0].startswith(f"1 {small}:2 matches=2 pages=1 bytes=2 ")

    def test_through_the_process(self) -> None:
        """``python -m prexy rewrite --explain PAGE`` as a real process; with
        stdin empty and no PAGE, the plain listing."""

        def run(*pages: str) -> str:
            proc = subprocess.run(
                [sys.executable, "-m", "prexy", "rewrite", *self.argv, *pages],
                stdin=subprocess.DEVNULL, capture_output=True, cwd=REPO_ROOT, check=False, timeout=60,
            )
            assert proc.returncode == 0, proc.stderr
            return proc.stdout.decode()

        assert run(str(self.pages[0])).splitlines()[-1].startswith("total pages=1 matches=")
        assert run().splitlines()[0].startswith(f"1 {self.rules}:3: ")
