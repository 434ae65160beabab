"""The sregex-order Pike VM (prexy.substitution.pikevm).

Proves that the VM matches as sregex does: the engine's own suite (every
case of ``sregex_cases.json``, single and multi-regex, with and without the
RE2 start finder), examples recorded from the real sregex build where its
order differs from Perl's, and a differential against ``regex`` on random
patterns of the dialect that are not flagged (there a faithful Pike VM and a
backtracker agree).  Also which rules are flagged, the compiled layout where
it matters, and the calling conventions the scanner relies on.
"""

from __future__ import annotations

from typing import Any

import regex
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution import pikevm
from prexy.substitution.analysis import has_empty_loop
from prexy.substitution.dialect import DialectError, parse_sregex
from prexy.substitution.emit import to_regex_source
from prexy.substitution.pikevm import (
    CONSUME,
    JMP,
    SPLIT,
    PikePattern,
    compile_program,
    order_reason,
)
from prexy.substitution.rules import compile_rule
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.transducer import Transducer
from tests.cases import expand, param, parametrize

from .shared import SKIP_REASON, load_cases
from .test_streaming_properties import patterns

CASES = load_cases("sregex_cases.json")

#: Where sregex's order differs from Perl's: (pattern, input, the span the
#: real sregex build returned, Perl's span).  Found by a random differential
#: of this VM against that build (the VM agreed on all 1466 such patterns).
RECORDED = [
    (rb"^\s+|\s+$", b"baby!\n     \nabc\n", (6, 12), (5, 11)),
    (rb"a?\B|.?", b" ", (0, 1), (0, 0)),
    (rb".+?$|x?", b"x\na", (0, 3), (0, 1)),
    (rb".?\b|\w?", b"ab", (0, 1), (0, 0)),
    (rb"^.*?$|x*", b"\nb", (0, 2), (0, 0)),
    (rb" ?$|.*", b"\nb x", (0, 4), (0, 0)),
    (rb".\W\B|\s+", b"a ", (1, 2), (0, 2)),
    (rb"\b\w?$|.+", b"a\n", (0, 2), (0, 1)),
    (rb"a+|.*?$", b"   a", (3, 4), (0, 4)),
    (rb"^a*.*?$|a", b" a", (1, 2), (0, 2)),
    (rb".+\B| b*", b"x\nx ", (3, 4), (0, 4)),
    (rb".+?\b|\W", b" xbb", (0, 4), (0, 1)),
    (rb".*\z|\w+?", b"\n\nb", (2, 3), (0, 3)),
    (rb"^\sb$|\b\w?", b" b", (1, 2), (0, 2)),
    (rb"[ab].\B| +", b"xa ", (2, 3), (1, 3)),
    (rb"x|\b.*?x+\b", b" bx", (2, 3), (1, 3)),
    (rb"a+?\B|[ab]+", b"ab\n", (0, 2), (0, 1)),
    (rb"\W*?.\B|\W", b"  \n ", (0, 2), (0, 1)),
]


def _ids() -> list[Any]:
    if CASES is None:
        return [param(None, id="absent")]
    return [param(c, id=f"{c['file']}:{c['name']}:{i}") for i, c in enumerate(CASES)]


def _perl(pattern: bytes) -> regex.Pattern[bytes]:
    p = parse_sregex(pattern)
    return regex.compile(to_regex_source(p.tree).encode("latin-1"), regex.DOTALL | regex.MULTILINE)


def _replace_all(pattern: bytes, body: bytes) -> bytes:
    """``[$&]`` around each match, searching again from each match's end."""
    pat = PikePattern(parse_sregex(pattern))
    out = []
    pos = 0
    for m in pat.finditer(body):
        out += [body[pos : m.start()], b"[", m.group() or b"", b"]"]
        pos = m.end()
    return b"".join(out) + body[pos:]


@expand
class SregexSuiteTests(SynchronousTestCase):
    skip = SKIP_REASON if CASES is None else None

    @parametrize("case", _ids())
    def test_sregex_case(self, case: dict[str, Any]) -> None:
        """Match, captures and matching regex as sregex's suite expects,
        with RE2 finding the starts and with the VM on every byte."""
        expected = case["expected"]
        if "error" in expected or "error_like" in expected:
            return  # refusals are the parser's (test_sregex_cases)
        regs = case["regex"] if case["multi"] else [case["regex"]]
        if case["multi"]:
            flags = (case["flags"].split(" ") + [""] * len(regs))[: len(regs)]
        else:
            flags = [case["flags"]]
        try:
            parsed = [parse_sregex(r.encode("latin-1"), "i" in f) for r, f in zip(regs, flags, strict=True)]
        except DialectError:
            assert expected.get("fatal_allowed")
            return
        for starts in (True, False):
            pattern = PikePattern(*parsed)
            if not starts:
                pattern._starts = None
            m = pattern.search(case["input"].encode("latin-1"))
            if not expected["match"]:
                assert m is None
                continue
            assert m is not None
            spans = [list(m.span(k)) for k in range(parsed[m.rule].ngroups + 1)]
            while spans and spans[-1] == [-1, -1]:
                spans.pop()
            if "match_id" in expected:
                assert m.rule == expected["match_id"]
            if "captures" in expected:
                assert spans == expected["captures"]


@expand
class OrderTests(SynchronousTestCase):
    def test_trim_rule_as_the_module(self) -> None:
        """``^\\s+|\\s+$`` gives the module's bytes (conformance TEST 22)."""
        body = b"  hello, world  \nblah yeah\nhello  \n   baby!\n     \nabc\n"
        assert _replace_all(rb"^\s+|\s+$", body) == (
            b"[  ]hello, world[  ]\nblah yeah\nhello[  ]\n[   ]baby!\n[     \n]abc[\n]"
        )

    @parametrize("case", [param(c, id=repr(c[0])[2:-1]) for c in RECORDED])
    def test_recorded_from_sregex(self, case: tuple[bytes, bytes, tuple[int, int], tuple[int, int]]) -> None:
        """The real sregex's span where it differs from Perl's; each such
        pattern is flagged for the VM."""
        pattern, body, module, perl = case
        assert order_reason(parse_sregex(pattern)) is not None
        m = PikePattern(parse_sregex(pattern)).search(body)
        assert m is not None and m.span() == module
        p = _perl(pattern).search(body)
        assert p is not None and p.span() == perl

    @parametrize("feeding", ["whole", "bytewise", "pairs"])
    def test_rule_set_as_one_program(self, feeding: str) -> None:
        """Beside ``\\n``, the trim rule gives what the module's one program
        for both gives (checked with the real sregex: rule 0 at [5, 11)):
        the newline rule's match clears the threads that would have dropped
        the trim rule's, so here it is Perl's ``\\n     ``."""
        rules = [compile_rule(rb"^\s+|\s+$", b"[$&]", "g"), compile_rule(rb"\n", b"N", "g")]
        ruleset = RuleSet.build(rules, max_buffered_size=10**9)
        assert [e for _, e, _ in ruleset.engines()] == ["sregex-vm", "sregex-vm"]
        body = b"baby!\n     \nabc"
        step = {"whole": len(body), "bytewise": 1, "pairs": 2}[feeding]
        t = Transducer(ruleset, timeout=None)
        out = b"".join(t.feed(body[i : i + step]) for i in range(0, len(body), step)) + t.finish()
        assert out == b"baby![\n     ]Nabc"
        found = ruleset.scanner.find(body, 0, None)  # type: ignore[union-attr]
        assert found is not None and (found.rule, found.start, found.end) == (0, 5, 11)

    @parametrize(
        "pattern",
        [rb"^\s+|\s+$", rb"(?:a\b|c)d", rb"x{1,}$|y", rb"(\w+)$\n?", rb"(.*)\b(\d+)$", rb"a\b|a\b"],
    )
    def test_flagged(self, pattern: bytes) -> None:
        """A path after a look-ahead assertion meets another path."""
        why = order_reason(parse_sregex(pattern))
        assert why is not None and "sregex's thread order" in why

    @parametrize(
        "pattern",
        [rb"\s+$", rb"foo\b", rb"\bfoo|\bbar", rb"^\s+", rb"a+|b", rb"\bword\b", rb"x$", rb"<!--.*?-->"],
    )
    def test_not_flagged(self, pattern: bytes) -> None:
        """No other path reaches what follows the assertion: Perl's order."""
        assert order_reason(parse_sregex(pattern)) is None

    def test_layout(self) -> None:
        """sregex's layout: ``x+`` loops back over x, ``x{1,}`` is ``x x*``;
        ``a|b|c`` nests to the left; a lazy repeat swaps its SPLIT."""
        plus = compile_program(parse_sregex(b"x+"))
        counted = compile_program(parse_sregex(b"x{1,}"))
        body = 3 + 1  # start loop, SAVE 0
        assert plus.ops[body:-2] == (CONSUME, SPLIT)
        assert counted.ops[body:-2] == (CONSUME, SPLIT, CONSUME, JMP)
        alt = compile_program(parse_sregex(b"a|b|c"))
        assert alt.ops[body:-2] == (SPLIT, SPLIT, CONSUME, JMP, CONSUME, JMP, CONSUME)
        assert alt.ys[body] == body + 6 and alt.xs[body + 3] == body + 5 and alt.xs[body + 5] == body + 7
        lazy = compile_program(parse_sregex(b"x*?"))
        assert lazy.xs[body] == body + 3 and lazy.ys[body] == body + 1

    def test_real_previous_byte(self) -> None:
        """``^`` and ``\\b`` see the byte before ``pos``, as with ``regex``."""
        bol = PikePattern(parse_sregex(b"^a"))
        assert bol.search(b"xa", 1) is None
        m = bol.search(b"\na", 1)
        assert m is not None and m.span() == (1, 2)
        word = PikePattern(parse_sregex(rb"\ba"))
        assert word.search(b"ba", 1) is None
        assert word.search(b" a", 1) is not None

    def test_calling_conventions(self) -> None:
        """``endpos`` ends the text; ``match`` is anchored; groups read as
        ``regex``'s (None when unset)."""
        pat = PikePattern(parse_sregex(rb"(a)|(b)$"))
        m = pat.search(b"xbz", 0, 2)
        assert m is not None and m.span() == (1, 2) and m.span(2) == (1, 2)
        assert m.group(1) is None and m.spans(1) == [] and m.group(2) == b"b"
        assert m.start(1) == -1 and m.end(2) == 2 and not m.marked()
        assert pat.search(b"xbz") is None
        assert pat.match(b"xa", 0) is None
        found = pat.match(b"xa", 1)
        assert found is not None and found.span() == (1, 2)
        assert [x.span() for x in pat.finditer(b"aab", 1)] == [(1, 2), (2, 3)]

    def test_linear_on_long_input(self) -> None:
        """A long run the VM must cross thread by thread still ends (one
        thread per instruction per byte): 200 KB of blanks before a word."""
        body = b" " * 200_000 + b"x"
        m = PikePattern(parse_sregex(rb"^\s+|\s+$")).search(body)
        assert m is not None and m.span() == (0, 200_000)

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(patterns(), st.booleans(), st.text(alphabet="aabbc \n\nA-x1", max_size=30), st.integers(0, 5))
    def test_unflagged_agree_with_regex(self, pattern: str, caseless: bool, text: str, pos: int) -> None:
        """On patterns that are not flagged (and have no repeat whose body can
        match empty, where Pike VMs and backtrackers part ways anyway), the
        VM finds ``regex``'s leftmost match and captures: it is a faithful
        Pike VM."""
        try:
            parsed = parse_sregex(pattern.encode(), caseless)
        except DialectError:
            assume(False)
            return
        assume(order_reason(parsed) is None and not has_empty_loop(parsed.tree))
        body = text.encode()
        pos = min(pos, len(body))
        perl = regex.compile(
            to_regex_source(parsed.tree, caseless=parsed.caseless).encode("latin-1"), regex.DOTALL | regex.MULTILINE
        ).search(body, pos)
        ours = PikePattern(parsed).search(body, pos)
        if perl is None:
            assert ours is None
            return
        assert ours is not None
        groups = range(parsed.ngroups + 1)
        assert [ours.span(k) for k in groups] == [perl.span(k) for k in groups]

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(
        patterns(), st.text(alphabet="aabbc \n\nA-x1", max_size=30), st.integers(0, 5), st.sampled_from([2, 4096])
    )
    def test_lazy_dfa_is_the_vm(self, pattern: str, text: str, pos: int, states: int) -> None:
        """The lazy DFA that finds the span replays the VM's steps exactly
        (also when its state cache starts over every few states)."""
        try:
            parsed = parse_sregex(pattern.encode())
        except DialectError:
            assume(False)
            return
        self.patch(pikevm, "MAX_STATES", states)
        body = text.encode()
        pos = min(pos, len(body))
        vm = PikePattern(parsed)
        found = vm._exec(body, pos, len(body), True)[0]
        scanned = vm._lazy.scan(body, pos, len(body))
        if found is None:
            assert scanned is None
        else:
            assert scanned == (found[0][0], found[0][1], 0)

    @settings(max_examples=200, deadline=None)
    @given(st.sampled_from(RECORDED), st.text(alphabet="ab \nx", max_size=12), st.text(alphabet="ab \nx", max_size=12))
    def test_flagged_rule_any_chunking(
        self, case: tuple[bytes, bytes, tuple[int, int], tuple[int, int]], before: str, after: str
    ) -> None:
        """A flagged rule through the transducer: the same bytes however the
        body is cut, and the module's match where the recorded example
        stands alone."""
        pattern, example, module, _ = case
        rules = [compile_rule(pattern, b"[$&]", "g")]
        ruleset = RuleSet.build(rules, max_buffered_size=10**9)
        assert [e for _, e, _ in ruleset.engines()] == ["sregex-vm"]
        body = before.encode() + b"\x00" + example + b"\x00" + after.encode()
        whole = Transducer(ruleset, timeout=None).finish(body)
        t = Transducer(ruleset, timeout=None)
        assert b"".join(t.feed(body[i : i + 1]) for i in range(len(body))) + t.finish() == whole
        alone = Transducer(ruleset, timeout=None).finish(example)
        s, e = module
        assert alone.startswith(example[:s] + b"[" + example[s:e] + b"]")
