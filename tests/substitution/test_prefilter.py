"""The multi-pattern prefilters never drop a rule that can match.

A prefilter only narrows which rules the scanner runs on a buffer, so two
things prove it safe: every rule that ``regex`` finds a match for from a
position is among the prefilter's candidates from there (checked directly,
for every engine and every position), and the transducer's output with any
engine, fed whole, in random pieces or byte by byte, is the output without
a prefilter.  Rule sets here are larger than in the other property tests
and built from shared literal prefixes, so that the anchor tables, the
literal trie of the hold-back check and ties between rules are exercised.
"""

from __future__ import annotations

from unittest import skipIf

import regex
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

import prexy.substitution.holdcursors as holdcursors_module
from prexy.substitution import prefilter
from prexy.substitution.rules import compile_rule, parse_rules
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.scanner import RegexScanner
from prexy.substitution.transducer import Transducer
from tests.substitution.test_streaming_properties import patterns

ENGINES = list(prefilter.ENGINES)
WORDS = ["ab", "abc", "ba", "cab", "a-b", "bb", "x1", "abab"]
TAILS = ["", "", "[0-9]+", "\\d", "c*", "[ab]{2}", "(?:c|1)", " ?x", "\\b", "$", "+"]
HEADS = ["", "", "", "^", "\\b", "\\s", "[bc]", "(?:a|1)"]


@st.composite
def literal_rules(draw: st.DrawFn) -> str:
    """A rule with a literal part, as most real rules have."""
    head = draw(st.sampled_from(HEADS))
    word = draw(st.sampled_from(WORDS))
    tail = draw(st.sampled_from(TAILS))
    if tail == "+":
        return head + word + "+"
    return head + word + tail


rule_pattern = st.one_of(literal_rules(), literal_rules(), patterns())
specs = st.lists(
    st.tuples(
        rule_pattern, st.sampled_from(["X", "<$&>", "", "$1"]), st.sampled_from(["g", "gi", ""])
    ),
    min_size=2,
    max_size=14,
)
bodies = st.text(alphabet="aabbc AB1-x\n", max_size=60).map(lambda s: s.encode())


def compile_all(rule_specs: list[tuple[str, str, str]]) -> list:
    rules = []
    for pattern, replacement, flags in rule_specs:
        try:
            rules.append(compile_rule(pattern.encode(), replacement.encode(), flags))
        except ValueError:
            continue
    if len(rules) < 2:
        rules += [compile_rule(b"ab", b"X", b"g"), compile_rule(b"b[0-9]", b"Y", b"g")]
    return rules


def feed(ruleset: RuleSet, pieces: list[bytes]) -> bytes:
    t = Transducer(ruleset, timeout=None)
    out = b"".join(t.feed(p) for p in pieces) + t.finish()
    assert not t.bailed_out and not t.timed_out
    return out


class PrefilterTests(SynchronousTestCase):
    @settings(max_examples=200, deadline=None)
    @given(specs, bodies)
    def test_candidates_include_every_rule_that_matches(
        self,
        rule_specs: list[tuple[str, str, str]], body: bytes
    ) -> None:
        """From every position, each rule regex can match from is a candidate.

        Its hint (where it may start) is never past its first match.
        """
        rules = compile_all(rule_specs)
        parsed = [r.parsed for r in rules]
        plain = RegexScanner(parsed, "none")
        for engine in ENGINES:
            filt = prefilter.make_filter(parsed, engine)
            for pos in range(len(body) + 1):
                found = filt.candidates(body, pos, None)
                for index, pattern in enumerate(plain.patterns):
                    m = pattern.search(body, pos)
                    if m is not None:
                        assert index in found, (engine, pos, rules[index].pattern)
                        # No match starts before the rule's hint.
                        assert pos <= found[index] <= m.start(), (engine, pos, rules[index].pattern)

    @skipIf(not prefilter.HAVE_HYPERSCAN, "hyperscan is not installed")
    @settings(max_examples=200, deadline=None)
    @given(specs, bodies)
    def test_hyperscan_spans_hold_every_match_start(
        self,
        rule_specs: list[tuple[str, str, str]], body: bytes
    ) -> None:
        """From every position, every start of a rule's match lies within the
        span the Hyperscan filter gives it (a rule looked for by its head is
        bounded by the head's last occurrence)."""
        rules = compile_all(rule_specs)
        parsed = [r.parsed for r in rules]
        plain = RegexScanner(parsed, "none")
        filt = prefilter.HyperscanFilter(parsed)
        for pos in range(len(body) + 1):
            spans = filt.spans(body, pos)
            assert {r: first for r, (first, _) in spans.items()} == filt.candidates(body, pos, None)
            for index, pattern in enumerate(plain.patterns):
                for start in range(pos, len(body) + 1):
                    if pattern.match(body, start) is not None:
                        first, last = spans[index]
                        assert first <= start <= last, (pos, rules[index].pattern, start, spans[index])

    @skipIf(not prefilter.HAVE_HYPERSCAN, "hyperscan is not installed")
    def test_hyperscan_span_ends_at_the_last_head(self) -> None:
        """A rule looked for by its head may start from the head's first
        occurrence to its last; a whole rule, from the scan position to the
        end."""
        rules = [compile_rule(b"(<title>)([^<]*)(</title>)", b"$1$2$3", b""), compile_rule(b"x[0-9]*y", b"Z", b"g")]
        parsed = [r.parsed for r in rules]
        assert prefilter._hs_pattern(parsed[0])[1] == 7 and prefilter._hs_pattern(parsed[1])[1] is None
        body = b"a <title>A</title> b <title>B c x1y"
        filt = prefilter.HyperscanFilter(parsed)
        assert filt.spans(body, 0) == {0: (2, 21), 1: (0, len(body))}
        assert filt.spans(body, 5) == {0: (21, 21), 1: (5, len(body))}

    @settings(max_examples=200, deadline=None)
    @given(specs, bodies, st.lists(st.integers(0, 60), max_size=6))
    def test_every_engine_same_output(
        self,
        rule_specs: list[tuple[str, str, str]], body: bytes, cuts: list[int]
    ) -> None:
        """Each engine, fed any way, gives the output of no prefilter fed whole."""
        rules = compile_all(rule_specs)
        expected = RuleSet.build(rules, max_buffered_size=10**9, engine="none")
        want = Transducer(expected, timeout=None).finish(body)
        points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
        ways = [
            [body],
            [body[i : i + 1] for i in range(len(body))],
            [body[a:b] for a, b in zip(points, points[1:], strict=False)],
        ]
        for engine in [*ENGINES, "none"]:
            ruleset = RuleSet.build(rules, max_buffered_size=10**9, engine=engine)
            for pieces in ways:
                assert feed(ruleset, pieces) == want, engine

    def test_only_some_rules_run_per_buffer(self) -> None:
        """With many rules, a buffer only runs the few whose prefix it holds."""
        lines = [f"replace_filter 'w{i}[0-9]+t' 'R{i}' g;" for i in range(200)]
        ruleset = parse_rules("\n".join(lines).encode(), "many.rules")
        body = b"text w17 w1234t more w5x9t"
        for engine in ENGINES:
            scanner = RegexScanner([r.parsed for r in ruleset.rules], engine)
            if scanner.index is not None:  # hyperscan: the match index's prefilter
                found = list(scanner.index.events(body, 0, None).candidates)
            else:
                assert scanner.filter is not None
                found = list(scanner.filter.candidates(body, 0, None))
            assert 12 in found
            assert len(found) <= 3, engine

    def test_empty_matching_rules_always_run(self) -> None:
        """A rule that can match empty is never filtered out."""
        rules = [compile_rule(b"[0-9]*", b"N", b"g"), compile_rule(b"ab", b"X", b"g")]
        for engine in ENGINES:
            filt = prefilter.make_filter([r.parsed for r in rules], engine)
            assert 0 in filt.always
            assert filt.candidates(b"zzz", 0, None) == {0: 0}

    def test_hyperscan_source_drops_assertions(self) -> None:
        """The Hyperscan form has no assertions and matches at least as much."""
        rule = compile_rule(b"^\\bfoo(?:bar)??$", b"X", b"g")
        source = prefilter.hyperscan_source(rule.parsed)
        assert not any(a in source for a in (b"^", b"$", b"\\b"))
        assert regex.search(source, b"xfoo y") is not None

    @skipIf(not prefilter.HAVE_HYPERSCAN, "hyperscan is not installed")
    def test_hyperscan_refusals_fall_back(self) -> None:
        """A pattern Hyperscan refuses makes just that rule run on every buffer."""
        rules = [compile_rule(b"ab", b"X", b"g"), compile_rule(b"cd", b"Y", b"g")]
        refused = prefilter.hyperscan_source(rules[1].parsed)
        real = prefilter.HyperscanDatabase._compile

        def picky(exprs: list[bytes], flags: list[int]) -> object:
            if any(refused in e for e in exprs):
                raise prefilter._hs.error("refused for the test")
            return real(exprs, flags)

        # Not self.patch: it would put back the bare function, not the
        # staticmethod, and break every later HyperscanDatabase.
        saved = vars(prefilter.HyperscanDatabase)["_compile"]
        self.addCleanup(setattr, prefilter.HyperscanDatabase, "_compile", saved)
        prefilter.HyperscanDatabase._compile = staticmethod(picky)  # type: ignore[method-assign]
        filt = prefilter.HyperscanFilter([r.parsed for r in rules])
        assert filt.always == {1}
        assert filt.candidates(b"zz ab", 0, None).keys() == {0, 1}
        assert filt.candidates(b"zz", 0, None).keys() == {1}

    def test_unknown_engine_refused(self) -> None:
        """A misspelt engine name is an error, not a silent fallback."""
        with self.assertRaises(ValueError):
            prefilter.make_filter([compile_rule(b"a", b"b", b"g").parsed], "hyperscam")

    @skipIf(not prefilter.HAVE_HYPERSCAN, "hyperscan is not installed")
    def test_hyperscan_filter_shared_between_threads(self) -> None:
        """Threads scanning with one filter at once all get the right answer."""
        import threading

        rules = [compile_rule(f"w{i}[0-9]+t".encode(), b"R", b"g") for i in range(50)]
        filt = prefilter.HyperscanFilter([r.parsed for r in rules])
        body = b"text w7 " * 20000 + b"w17123t"
        errors: list[object] = []

        def work() -> None:
            for _ in range(20):
                got = filt.candidates(body, 0, None)
                if got.keys() != {17, 1}:
                    errors.append(got)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []

    def test_hold_back_far_from_the_floor(self) -> None:
        """A prefix cut at the end is held even when another rule's floor is far back.

        A rule whose repeats eat almost any byte (``<p[^>]*>``) can put the
        lowest floor far from the end; the literal prefixes are then not
        looked up near the end in one pass, and every literal rule must still
        be probed from its own floor.
        """
        ruleset = RuleSet.build(
            [compile_rule(b"<p[^>]*>", b"T", b"g"), compile_rule(b"cab", b"X", b"g")]
        )
        for engine in [*ENGINES, "none"]:
            rs = RuleSet.build(ruleset.rules, engine=engine)
            body = b"x" * 600 + b"ca"
            assert feed(rs, [body, b"b"]) == b"x" * 600 + b"X"

    @settings(max_examples=200, deadline=None)
    @given(specs, bodies, st.lists(st.integers(0, 60), max_size=6), st.sampled_from([0, 3]))
    def test_hold_back_without_the_prefix_trie(
        self,
        rule_specs: list[tuple[str, str, str]], body: bytes, cuts: list[int], span: int
    ) -> None:
        """With the near-the-end prefix pass cut short, chunking still changes nothing."""
        saved = holdcursors_module.TRIE_SPAN
        holdcursors_module.TRIE_SPAN = span
        try:
            rules = compile_all(rule_specs)
            ruleset = RuleSet.build(rules, max_buffered_size=10**9)
            want = Transducer(ruleset, timeout=None).finish(body)
            points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
            assert feed(ruleset, [body[i : i + 1] for i in range(len(body))]) == want
            assert feed(ruleset, [body[a:b] for a, b in zip(points, points[1:], strict=False)]) == want
        finally:
            holdcursors_module.TRIE_SPAN = saved
