"""The transducer's per-rule facts: ``rule_counts``, ``rule_bytes``,
``rules_matched``, ``stopped_by`` and ``max_held``.

The counts are held to an oracle that does not share the fast paths: the
same rules with each replacement swapped for a marker carrying the rule's
index and the matched bytes (``\\x01 i $& \\x02``), applied to the whole body
at once.  A template replacement runs every match through ``find`` and
``_replacement``, never through the cursors' runs of fixed replacements,
and what is matched does not depend on the replacement; the markers in the
output then say which rule replaced which bytes.  A fired once-rule's
later matches come out unchanged, unmarked: they are not substitutions.
"""

from __future__ import annotations

import os
import re

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.reach import reach_from, reaches_at
from prexy.substitution.rules import compile_rule, parse_rules
from prexy.substitution.ruleset import Rule, RuleSet
from prexy.substitution.transducer import RulesMatched, Transducer
from tests.cases import expand, parametrize
from tests.substitution.shared import REPO_ROOT, cut
from tests.substitution.test_streaming_properties import (
    ENGINES,
    RuleSpec,
    bodies,
    build,
    rule_specs,
)

_MARKED = re.compile(rb"\x01(.)(.*?)\x02", re.S)


def marked(rules: tuple[Rule, ...]) -> RuleSet:
    """``rules`` with each replacement swapped for the marker of its index
    (no buffer limit, no prefilter)."""
    assert len(rules) < 200
    return RuleSet.build(
        [compile_rule(r.pattern, b"\x01" + bytes([0x30 + i]) + b"$&\x02", r.flags.encode()) for i, r in enumerate(rules)],
        max_buffered_size=10**9,
        engine="none",
    )


def oracle(ruleset: RuleSet, body: bytes) -> tuple[list[int], list[int]]:
    """Per rule: the substitutions and the bytes they replaced, read from
    the marked rules' output on the whole body."""
    out = Transducer(marked(ruleset.rules), timeout=None).finish(body)
    counts = [0] * len(ruleset.rules)
    sizes = [0] * len(ruleset.rules)
    for m in _MARKED.finditer(out):
        rule = m.group(1)[0] - 0x30
        counts[rule] += 1
        sizes[rule] += len(m.group(2))
    return counts, sizes


def counted(ruleset: RuleSet, pieces: list[bytes]) -> Transducer:
    t = Transducer(ruleset, timeout=None)
    for p in pieces:
        t.feed(p)
    t.finish()
    return t


def realistic(count: int) -> tuple[RuleSet, bytes] | None:
    """The bench's realistic rule set and 20 KB page (None without the Debian packages)."""
    import sys

    if str(REPO_ROOT) not in sys.path:
        sys.path.append(str(REPO_ROOT))
    from bench import realistic as corpus

    if not corpus.PAGES["html-20k"].source.exists():
        return None
    return parse_rules(corpus.rules_text(count).encode()), corpus.load_page("html-20k")


@expand
class RuleCountTests(SynchronousTestCase):
    @settings(max_examples=int(os.environ.get("PREXY_HYPOTHESIS_EXAMPLES", "300")), deadline=None)
    @given(rule_specs, bodies, st.lists(st.integers(1, 12), min_size=1, max_size=6), st.sampled_from(ENGINES))
    def test_counts_equal_the_marked_oracle_for_every_chunking(
        self, specs: list[RuleSpec], body: bytes, sizes: list[int], engine: str
    ) -> None:
        """Whole, byte by byte and in random pieces, each rule's count and
        bytes are those the marked oracle finds."""
        ruleset = build(specs, engine)
        expected = oracle(ruleset, body)
        for pieces in ([body], [body[i : i + 1] for i in range(len(body))], cut(body, sizes)):
            t = counted(ruleset, pieces)
            assert (t.rule_counts, t.rule_bytes) == expected, pieces
            assert set(t.rules_matched) == {i for i, c in enumerate(expected[0]) if c}
            assert t.stopped_by is None

    @settings(max_examples=100, deadline=None)
    @given(
        st.lists(st.sampled_from(["foo", "bar", "fo", "o b", "barfoo"]), min_size=1, max_size=4),
        st.lists(st.sampled_from(["foo", "bar", "fo", "o", "b", " ", "x", "xx"]), max_size=30).map(
            lambda parts: "".join(parts).encode()
        ),
        st.lists(st.integers(1, 9), min_size=1, max_size=4),
        st.sampled_from(ENGINES),
    )
    def test_literal_rules_in_runs(self, words: list[str], body: bytes, sizes: list[int], engine: str) -> None:
        """Pure literals with fixed replacements go through the cursors'
        runs (``split_run`` among them); their counts match the oracle."""
        ruleset = build([(re.escape(w).replace("\\ ", " "), f"<{i}>", "g") for i, w in enumerate(words)], engine)
        expected = oracle(ruleset, body)
        for pieces in ([body], cut(body, sizes)):
            t = counted(ruleset, pieces)
            assert (t.rule_counts, t.rule_bytes) == expected

    @parametrize("count", [10, 100])
    def test_realistic_page_in_feeds(self, count: int) -> None:
        """The bench's realistic clone rules on its 20 KB page, fed in 1, 4
        and 16 KiB pieces and whole: the counts are the oracle's, and
        match_count is their sum."""
        got = realistic(count)
        if got is None:
            raise self.skipTest("python3.11-doc is not installed")
        ruleset, page = got
        expected = oracle(ruleset, page)
        assert sum(expected[0]) > 20
        for size in (1024, 4096, 16384, len(page)):
            t = Transducer(ruleset)
            for i in range(0, len(page), size):
                t.feed(page[i : i + size])
            t.finish()
            assert (t.rule_counts, t.rule_bytes) == expected, size
            # The page has one </head> (the once-rule): nothing is left unchanged.
            assert t.match_count == sum(expected[0])

    def test_once_rules(self) -> None:
        """A once-rule counts its one substitution; its later matches, given
        unchanged, count in match_count only."""
        ruleset = build([("ab", "X", ""), ("b", "Y", "g")])
        t = counted(ruleset, [b"abab"])
        assert t.rule_counts == [1, 0]
        assert t.rule_bytes == [2, 0]
        assert t.match_count == 2
        ruleset = build([("a", "X", ""), ("b", "Y", "g")])
        t = counted(ruleset, [b"ab", b"ab"])
        assert (t.rule_counts, t.rule_bytes, t.match_count) == ([1, 2], [1, 2], 4)
        # A single once-rule stops scanning after it fired.
        t = counted(build([("a", "X", "")]), [b"baa", b"a"])
        assert (t.rule_counts, t.match_count) == ([1], 1)

    def test_empty_matches_count_with_no_bytes(self) -> None:
        t = counted(build([("x*", "-", "g")]), [b"axxb"])
        assert t.rule_counts == oracle(build([("x*", "-", "g")]), b"axxb")[0]
        assert t.rule_bytes == [2]

    def test_rules_matched_is_a_view_of_the_counts(self) -> None:
        ruleset = build([("a", "X", "g"), ("b", "Y", "g"), ("z", "Z", "g")])
        t = Transducer(ruleset)
        view = t.rules_matched
        assert isinstance(view, RulesMatched)
        assert len(view) == 0 and 0 not in view
        t.feed(b"aab")
        t.finish()
        assert view == {0, 1} == frozenset(t.rules_matched)
        assert len(view) == 2
        assert list(view) == [0, 1]
        assert 2 not in view and -1 not in view and 7 not in view and "a" not in view

    def test_bail_out_names_the_rule_holding(self) -> None:
        """Over the buffer limit, stopped_by is the rule whose match was in
        progress; the substitutions before it stay counted."""
        ruleset = RuleSet.build(
            [compile_rule(b"a", b"X", b"g"), compile_rule(b"<[^>]*>", b"T", b"g")], max_buffered_size=4
        )
        t = Transducer(ruleset)
        t.feed(b"a<bcdef")
        t.feed(b">a")
        t.finish()
        assert t.bailed_out
        assert t.stopped_by == 1
        assert t.rule_counts == [1, 0]
        # Held since an earlier feed, with a match found so far kept apart.
        t = Transducer(ruleset)
        t.feed(b"x<abc")
        t.feed(b"de")
        assert t.bailed_out and t.stopped_by == 1

    @settings(max_examples=200, deadline=None)
    @given(rule_specs, bodies, st.sampled_from(["auto", "all", "none"]))
    def test_reaches_at_is_reach_from_at_one_position(self, specs: list[RuleSpec], body: bytes, linear: str) -> None:
        """The bail-out's question (reaches_at) is reach_from's at each
        position, on regex, RE2 and the sregex-order VM alike; without the
        probe it never rules out a rule that reaches."""
        ruleset = build(specs, "none", linear)
        assert ruleset.scanner is not None
        for reach in ruleset.scanner.reaches:
            for pos in range(len(body) + 1):
                exact = reach_from(reach, body, pos, None) == pos
                assert reaches_at(reach, body, pos, None) == exact, pos
                assert reaches_at(reach, body, pos, None, probe=False) or not exact, pos

    def test_bail_out_is_named_cheaply_with_many_rules(self) -> None:
        """With the realistic 1000-rule set, the rule that held a long
        ``<title>`` is named; asking every rule costs little (each is
        asked at the hold point only, not searched past it)."""
        got = realistic(1000)
        if got is None:
            raise self.skipTest("python3.11-doc is not installed")
        ruleset, page = got
        body = page[:5000] + b"<title>" + b"x y z " * 5000
        t = Transducer(ruleset)
        for i in range(0, len(body), 4096):
            t.feed(body[i : i + 4096])
        t.finish()
        assert t.bailed_out
        assert t.stopped_by is not None
        assert ruleset.rules[t.stopped_by].pattern == b"(<title>)([^<]*)(</title>)"

    def test_timeout_names_the_rule(self) -> None:
        """A scan past its time limit names its rule in stopped_by: in a
        run of fixed replacements, and in a search of its own.  (Without the
        Hyperscan index, as in test_transducer, so that the rule's search
        crosses the stretch where it explodes.)"""
        body = b"a xy a " + b"x" * 40 + b"z"
        cases = [
            ([("a", "A", "g"), ("(x|x)+y", "X", "g")], 1),
            ([("(x|x)+y", "X", "g")], 0),
            ([("a", "A", "g"), ("b", "$&", "g"), ("(x|x)+y", "<$1>", "g")], 2),
        ]
        for specs, rule in cases:
            rules = [compile_rule(p.encode(), r.encode(), f.encode()) for p, r, f in specs]
            ruleset = RuleSet.build(rules, engine="anchor", linear="none")
            t = Transducer(ruleset, timeout=0.01)
            t.finish(body)
            assert t.timed_out
            assert t.stopped_by == rule, specs

    def test_max_held(self) -> None:
        """max_held is the most bytes held back between calls."""
        ruleset = build([("www\\.example\\.com", "X", "g")])
        t = Transducer(ruleset)
        assert t.feed(b"see www.exam") == b"see "
        assert t.max_held == 8
        assert t.feed(b"ple.com! www") == b"X! "
        assert t.max_held == 8
        t.finish()
        assert t.max_held == 8 and t.held == 0
        # Small feeds gathered while much is held count too.
        ruleset = build([("<[^>]*>", "T", "g")])
        t = Transducer(ruleset)
        t.feed(b"<" + b"a" * 3000)
        for _ in range(10):
            t.feed(b"b")
        assert t.max_held == t.held == 3011
        assert t.finish(b">") == b"T"
        assert t.rule_bytes == [3012]
