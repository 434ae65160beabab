"""The dry run's pure core: a draft rules file against the current rules on
a site's pages (``prexy.substitution.dryrun``).

The pages are bench/content.py's deterministic news pages and, where
python3.11-doc is installed, the realistic corpus of bench/realistic.py
with its clone rules.  The draft changes one host; the report's counts are
held to a direct comparison that does not go through the report: the
host's occurrences counted with ``bytes.count`` and the pages' outputs
compared one by one.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from bench import content, realistic
from prexy.substitution.dryrun import (
    LINE_WIDTH,
    compare,
    first_differences,
    load_draft,
)
from prexy.substitution.rules import RulesError, parse_rules
from prexy.substitution.ruleset import CompileError, RuleSet
from prexy.substitution.transducer import Transducer

CURRENT = (
    b"# a clone of www.example.com\n"
    b"replace_filter_types text/html;\n"
    b"replace_filter 'https://www\\.example\\.com' 'https://www.example.org' g;\n"
    b"replace_filter '(UA-)\\d+-\\d+' '${1}00000000-0' g;\n"
    b"replace_filter '</head>' '<script src=\"/clone.js\"></script></head>';\n"
    b"replace_filter 'old-cdn\\.example\\.net' 'cdn.example.org' gi;\n"
)
# One host changed: the clone moves from example.org to example.net.
DRAFT = CURRENT.replace(b"'https://www.example.org'", b"'https://www.example.net'")
HOST = b"https://www.example.com"


def news_pages(count: int = 8) -> list[tuple[str, bytes]]:
    pages = [(f"/news/{seed}", content.html_page(12000 + 1500 * seed, seed=seed)) for seed in range(1, count + 1)]
    pages.append(("/robots.txt", b"User-agent: *\nDisallow:\n"))
    return pages


def direct(current: RuleSet, draft: RuleSet, pages: list[tuple[str, bytes]]) -> list[str]:
    """The URLs whose outputs differ, each page rewritten whole by each set."""
    return [url for url, body in pages if Transducer(current).finish(body) != Transducer(draft).finish(body)]


class DryRunTests(SynchronousTestCase):
    def test_a_draft_that_changes_one_host(self) -> None:
        """Pages changed and occurrences per rule are those found directly:
        the changed pages are those that carry the host, its rule's
        occurrences its count on them, on both sides."""
        current, draft = load_draft(CURRENT, "shop.rules"), load_draft(DRAFT)
        pages = news_pages()
        report = compare(current, draft, pages)
        carrying = [url for url, body in pages if HOST in body]
        assert len(carrying) == 8
        assert direct(current, draft, pages) == carrying
        assert report["changed"] == len(carrying)
        host_count = sum(body.count(HOST) for _, body in pages)
        for side, name in (("current", "shop.rules"), ("draft", "draft.rules")):
            rules = report["rules"][side]
            assert [r["number"] for r in rules] == [1, 2, 3, 4]
            assert [(r["file"], r["line"]) for r in rules] == [(name, 3), (name, 4), (name, 5), (name, 6)]
            assert rules[0]["pattern"] == "https://www\\.example\\.com" and rules[0]["flags"] == "g"
            assert rules[0]["occurrences"] == host_count
            assert rules[0]["pages"] == len(carrying)
            # Each news page has the analytics id twice, and one </head>.
            assert (rules[1]["occurrences"], rules[1]["pages"]) == (16, 8)
            assert (rules[2]["occurrences"], rules[2]["pages"]) == (8, 8)
            assert report["never_matching"][side] == [4]
        assert report["timed_out"] == {"current": [], "draft": []}
        # The first five changed pages, their first differing lines.
        assert [d["url"] for d in report["diffs"]] == carrying[:5]
        for diff in report["diffs"]:
            lines = diff["lines"]
            assert 2 <= len(lines) <= 6
            assert lines[0].startswith("- ") and "https://www.example.org" in lines[0]
            assert lines[1].startswith("+ ") and "https://www.example.net" in lines[1]
            assert lines[0].replace("example.org", "example.net")[2:] == lines[1][2:]

    def test_counts_are_the_transducers(self) -> None:
        """Per rule, the occurrences and pages are the sums of the
        transducers' rule_counts over the pages; a current set of None
        (a site without rules) leaves every page as it is."""
        draft = load_draft(CURRENT)
        pages = news_pages(4)
        report = compare(None, draft, pages)
        counts = [Transducer(draft) for _ in pages]
        for t, (_, body) in zip(counts, pages, strict=True):
            t.finish(body)
        assert [r["occurrences"] for r in report["rules"]["draft"]] == [
            sum(t.rule_counts[k] for t in counts) for k in range(4)
        ]
        assert [r["pages"] for r in report["rules"]["draft"]] == [
            sum(1 for t in counts if t.rule_counts[k]) for k in range(4)
        ]
        assert report["rules"]["current"] == [] and report["never_matching"]["current"] == []
        assert report["changed"] == 4  # robots.txt has nothing to change

    def test_realistic_clone_rules(self) -> None:
        """The realistic 100-rule clone set, one host's replacement changed
        in the draft: pages changed and occurrences as found directly."""
        sources = [p for p in realistic.PAGES.values() if p.source.exists() and p.name != "html-1.7m"]
        if not sources:
            raise self.skipTest("the realistic corpus's Debian packages are not installed")
        text = realistic.rules_text(100).encode()
        host = b"static.origin-shop.com"
        assert text.count(b"static.clone-shop.nl") == 4
        draft_text = text.replace(b"static.clone-shop.nl", b"static.clone-shop.be")
        current, draft = parse_rules(text, "clone.rules"), load_draft(draft_text, "clone-draft.rules")
        pages = [(f"/{p.name}", realistic.load_page(p.name)) for p in sources]
        report = compare(current, draft, pages, content_types=[p.content_type for p in sources])
        assert report["changed"] == len(direct(current, draft, pages)) > 0
        assert report["changed"] == sum(1 for _, body in pages if host in body.lower())
        cur, dra = report["rules"]["current"], report["rules"]["draft"]
        assert [(r["occurrences"], r["pages"]) for r in cur] == [(r["occurrences"], r["pages"]) for r in dra]
        assert report["never_matching"]["current"] == report["never_matching"]["draft"]
        assert any(r["occurrences"] for r in cur) and report["never_matching"]["current"]
        for diff in report["diffs"]:
            assert "static.clone-shop.nl" in "".join(diff["lines"])
            assert "static.clone-shop.be" in "".join(diff["lines"])

    def test_content_types(self) -> None:
        """With content types, a set rewrites only the pages its types take."""
        rules = load_draft(b"replace_filter a A g;\n")
        css = load_draft(b"replace_filter_types text/css;\nreplace_filter a A g;\n")
        pages = [("/x.html", b"a"), ("/x.css", b"a"), ("/x.js", b"a")]
        report = compare(rules, css, pages, content_types=["text/html; charset=utf-8", "text/css", None])
        assert report["changed"] == 1
        assert report["diffs"] == [{"url": "/x.css", "lines": ["- a", "+ A"]}]
        assert [r["occurrences"] for r in report["rules"]["current"]] == [2]
        assert [r["occurrences"] for r in report["rules"]["draft"]] == [3]
        with self.assertRaises(ValueError):
            compare(rules, css, pages, content_types=[None])

    def test_diff_limits(self) -> None:
        """At most diff_pages pages get diffs, each with at most diff_lines
        lines; long lines are cut around their change."""
        current, draft = load_draft(b"replace_filter x y g;\n"), load_draft(b"replace_filter x z g;\n")
        pages = [(f"/{k}", b"a\nx\nb\nx\nx\nx\nx\n") for k in range(7)]
        report = compare(current, draft, pages, diff_pages=2, diff_lines=3)
        assert report["changed"] == 7
        assert report["diffs"] == [{"url": "/0", "lines": ["- y", "+ z", "- y"]}, {"url": "/1", "lines": ["- y", "+ z", "- y"]}]
        long_line = b"<p>" + b"w" * 1000 + b" x " + b"w" * 1000 + b"</p>"
        lines = first_differences(Transducer(current).finish(long_line), Transducer(draft).finish(long_line))
        assert len(lines) == 2
        for line, new in zip(lines, ("y", "z"), strict=True):
            assert line.startswith(("- ...", "+ ...")) and line.endswith("...")
            assert len(line) == 2 + 3 + LINE_WIDTH + 3
            assert f" {new} " in line

    def test_diff_lines_inserted_and_not_utf8(self) -> None:
        """Lines a draft inserts show as "+" alone; bytes that are not UTF-8
        are written \\xNN."""
        assert first_differences(b"a\nb\n", b"a\nnew\nb\n") == ["+ new"]
        assert first_differences(b"a\nb\n", b"a\n") == ["- b"]
        assert first_differences(b"caf\xe9\n", b"caf\xc3\xa9\n") == ["- caf\\xe9", "+ café"]

    def test_load_draft_refuses_as_check_does(self) -> None:
        """A broken draft is a RulesError naming the draft, line and column,
        the same as the loader's; the draft's rules name it as their file."""
        broken = CURRENT + b"replace_filter 'a(' b g;\n"
        with self.assertRaises(RulesError) as caught:
            load_draft(broken, "draft.rules")
        assert str(caught.exception).startswith("draft.rules:7:18: bad regex")
        with self.assertRaises(RulesError) as same:
            parse_rules(broken, "draft.rules")
        assert str(same.exception) == str(caught.exception)
        with self.assertRaises(RulesError) as caught:
            load_draft(b"replace_filter a b;\nreplace_filter_typo x;\n")
        assert str(caught.exception) == 'draft.rules:2:1: unknown directive "replace_filter_typo"'
        assert load_draft(CURRENT, "mine.rules").rules[2].origin == "mine.rules:5"

    def test_load_draft_refuses_what_its_engine_will_not_compile(self) -> None:
        """A pattern the dialect takes but its engine refuses (as --check
        finds with check_compiles) is refused with its line and the
        column of the pattern."""

        def refusing(ruleset: RuleSet) -> None:
            raise CompileError(ruleset.rules[1], "pattern too large")

        self.patch(RuleSet, "check_compiles", refusing)
        with self.assertRaises(RulesError) as caught:
            load_draft(CURRENT, "draft.rules")
        assert str(caught.exception) == "draft.rules:4:17: pattern '(UA-)\\d+-\\d+': pattern too large"
