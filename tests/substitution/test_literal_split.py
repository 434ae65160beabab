"""Pure-literal rules are replaced with ``bytes.split`` (rulestream.split_run)
and, without groups, found with ``bytes.find`` (rulestream.RuleStream).

These paths must give exactly what the per-match regex path gives, for
any mix with other rules (ties, overlaps, once-rules, templates), any
prefilter engine and any chunking.  The oracle is the same rule set with
both switched off, fed whole.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.analysis import pure_literal
from prexy.substitution.dialect import parse_sregex
from prexy.substitution.prefilter import ENGINES as FILTER_ENGINES
from prexy.substitution.rules import compile_rule
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.transducer import Transducer
from tests.cases import expand, parametrize

ENGINES = [*FILTER_ENGINES, "none"]

LITERALS = ["a", "b", "aa", "ab", "ba", "aba", "bab", "abab", "a(b)", "(?:ab)a", "\\.", "a\\.b"]
OTHERS = ["a+", "b|ab", "[ab]b", "\\ba", "a$", "^b", "(a)b", "b*"]


def build(specs: list[tuple[str, str, str]], engine: str, split: bool = True) -> RuleSet:
    rs = RuleSet.build(
        [compile_rule(p.encode(), r.encode(), f) for p, r, f in specs],
        max_buffered_size=10**9,
        engine=engine,
    )
    if not split:
        assert rs.scanner is not None
        rs.scanner.words = [None] * len(rs.scanner.words)
        rs.scanner._finds = [None] * len(rs.scanner._finds)
    return rs


def run(rs: RuleSet, pieces: list[bytes]) -> bytes:
    t = Transducer(rs, timeout=None)
    return b"".join(t.feed(p) for p in pieces) + t.finish()


rule_specs = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(LITERALS), st.sampled_from(LITERALS), st.sampled_from(OTHERS)),
        st.sampled_from(["X", "", "YY", "[$&]"]),
        st.sampled_from(["g", "g", "g", ""]),
    ),
    min_size=1,
    max_size=5,
)
bodies = st.text(alphabet="aab.b c\n", max_size=60).map(str.encode)


@expand
class LiteralSplitTests(SynchronousTestCase):
    @settings(max_examples=int(os.environ.get("PREXY_HYPOTHESIS_EXAMPLES", "400")), deadline=None)
    @given(rule_specs, bodies, st.lists(st.integers(0, 60), max_size=6), st.sampled_from(ENGINES))
    def test_split_path_equals_match_path(
        self,
        specs: list[tuple[str, str, str]], body: bytes, cuts: list[int], engine: str
    ) -> None:
        """Whole, in random pieces and bytewise: the same bytes as the regex path."""
        expected = run(build(specs, "none", split=False), [body])
        rs = build(specs, engine)
        assert run(rs, [body]) == expected
        assert run(rs, [body[i : i + 1] for i in range(len(body))]) == expected
        points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
        assert run(rs, [body[a:b] for a, b in zip(points, points[1:], strict=False)]) == expected

    @parametrize(
        ("specs", "body", "expected"),
        [
            # A tie at the same start: the earlier rule wins, split or not.
            ([("b", "1", "g"), ("ab", "2", "g")], b"abab", b"22"),
            ([("ab", "2", "g"), ("b", "1", "g")], b"abbab", b"212"),
            # A later rule matching at the very same place: one match is taken
            # (this looped forever when the split had nothing before the tie).
            ([("ab", "1", "g"), ("a+", "2", "g")], b"abab", b"11"),
            ([("ab", "1", "g"), ("a", "2", "g"), ("b", "3", "g")], b"abbaab", b"1321"),
            # Overlapping occurrences: leftmost, non-overlapping.
            ([("aa", "X", "g")], b"aaaaa", b"XXa"),
            ([("aba", "X", "g"), ("b", "Y", "g")], b"ababa", b"XYa"),
            # A match that starts before another rule's and runs over it.
            ([("abab", "X", "g"), ("ba", "Y", "g")], b"ababab.baba", b"Xab.YY"),
        ],
    )
    def test_examples(self, specs: list[tuple[str, str, str]], body: bytes, expected: bytes) -> None:
        for engine in ENGINES:
            assert run(build(specs, engine), [body]) == expected
            assert run(build(specs, engine, split=False), [body]) == expected

    def test_pure_literal(self) -> None:
        """Only a sequence of literal bytes (groups allowed) counts."""
        assert pure_literal(parse_sregex(b"www\\.example\\.com").tree) == b"www.example.com"
        assert pure_literal(parse_sregex(b"a(b)(?:c)").tree) == b"abc"
        assert pure_literal(parse_sregex(b"1-2", caseless=True).tree) == b"1-2"
        for pattern in (b"a|b", b"a+", b"\\ba", b"a$", b"[a]", b".", b"()", b"a?"):
            assert pure_literal(parse_sregex(pattern).tree) is None, pattern
        assert pure_literal(parse_sregex(b"ab", caseless=True).tree) is None

    def test_caseless_literal_of_non_letters(self) -> None:
        """A caseless rule with no ASCII letter is a pure literal, and neither
        path folds bytes above 0x7f: \\xc0 does not match \\xe0."""
        for engine in ENGINES:
            for split in (True, False):
                rs = RuleSet.build([compile_rule(b"\xc01", b"X", b"gi")], engine=engine)
                if not split:
                    assert rs.scanner is not None
                    rs.scanner.words = [None]
                    rs.scanner._finds = [None]
                t = Transducer(rs, timeout=None)
                assert t.finish(b"\xc01 \xe01 \xc01") == b"X \xe01 X"
