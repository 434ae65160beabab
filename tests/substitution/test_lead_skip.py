"""A rule whose matches all start with fixed bytes skips to their next
occurrence (found by the rarest of them) instead of letting its ``finditer``
cross long stretches without one (rulestream.Lead, _RuleStream.next_from).

The skip must never change a result: the oracle is the same rule set with
the skip switched off, fed whole, without a prefilter.  The hypothesis test
shrinks the skip distance and the probe count so that short bodies take
every branch.
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution import rulestream
from prexy.substitution.ruleset import RuleSet
from tests.cases import expand, parametrize
from tests.substitution import test_literal_split
from tests.substitution.test_literal_split import ENGINES, run

#: Rules with a literal prefix (the skip applies), and others beside them.
LEADING = ["ab+", "ab[0-9]+", "\\bab", "ba(c|a)", "abc*", "a(b)a", "ca[ab]+c", "b\\.a?"]
OTHERS = ["a", "c+", "[ab]c", "b|ab", "a$", "^c", "b*"]


def build(specs: list[tuple[str, str, str]], engine: str, skip: bool = True) -> RuleSet:
    """test_literal_split's rule set, with the prefix skip switched off
    unless ``skip``."""
    rs = test_literal_split.build(specs, engine)
    assert rs.scanner is not None
    if not skip:
        rs.scanner._leads = [None] * len(rs.scanner._leads)
    return rs


rule_specs = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(LEADING), st.sampled_from(LEADING), st.sampled_from(OTHERS)),
        st.sampled_from(["X", "", "[$&]"]),
        st.sampled_from(["g", "g", ""]),
    ),
    min_size=1,
    max_size=4,
)
bodies = st.text(alphabet="aabbc. 0\n", max_size=80).map(str.encode)


@expand
class LeadSkipTests(SynchronousTestCase):
    @settings(max_examples=int(os.environ.get("PREXY_HYPOTHESIS_EXAMPLES", "400")), deadline=None)
    @given(
        rule_specs, bodies, st.lists(st.integers(0, 80), max_size=5), st.sampled_from(ENGINES),
        st.integers(1, 6), st.integers(1, 3),
    )
    def test_skip_equals_plain_scan(
        self,
        specs: list[tuple[str, str, str]], body: bytes, cuts: list[int], engine: str, gap: int, probes: int,
    ) -> None:
        """Whole and in random pieces, with a tiny skip distance and probe
        count: the same bytes as without the skip."""
        expected = run(build(specs, "none", skip=False), [body])
        rs = build(specs, engine)
        saved = rulestream.SKIP_GAP, rulestream.LEAD_PROBES
        rulestream.SKIP_GAP, rulestream.LEAD_PROBES = gap, probes
        try:
            assert run(rs, [body]) == expected
            points = sorted({min(c, len(body)) for c in cuts} | {0, len(body)})
            assert run(rs, [body[a:b] for a, b in zip(points, points[1:], strict=False)]) == expected
        finally:
            rulestream.SKIP_GAP, rulestream.LEAD_PROBES = saved

    @parametrize("engine", ENGINES)
    def test_far_apart_matches_among_decoys(self, engine: str) -> None:
        """Analytics ids far apart, with the rare byte (and near-misses of the
        prefix) many times in between, as a real page has them."""
        filler = b"<p>Use UTF-8. UA- UAx U-A- " * 200  # ~5.4 KB per block, decoys only
        body = b"UA-1-2 " + filler + b"UA-33-4 " + filler * 2 + b"xUA-5-66" + filler + b" end"
        specs = [("www\\.example\\.com", "www.example.org", "g"), ("UA-\\d+-\\d+", "UA-0-0", "g"),
                 ("word[0-9]+token", "W", "g")]
        expected = run(build(specs, "none", skip=False), [body])
        assert expected.count(b"UA-0-0") == 3
        rs = build(specs, engine)
        assert rs.scanner is not None and rs.scanner._leads[1] is not None
        assert run(rs, [body]) == expected
        assert run(rs, [body[i : i + 4096] for i in range(0, len(body), 4096)]) == expected

    def test_lead_picks_the_rarest_byte(self) -> None:
        lead = rulestream.Lead(b"UA-")
        assert lead.byte == ord("U") and lead.offset == 0
        assert rulestream.Lead(b"data-x").byte == ord("x")

    @parametrize(
        ("buf", "pos", "expected"),
        [
            (b"..UA-..UA-", 0, 2),
            (b"..UA-..UA-", 3, 7),
            (b"..UA-..UA-", 8, -1),
            (b"UAUAUA", 0, -1),
            (b"", 0, -1),
        ],
    )
    def test_next_start(self, buf: bytes, pos: int, expected: int) -> None:
        assert rulestream.Lead(b"UA-").next_start(buf, pos) == expected

    def test_next_start_settles_for_a_lower_bound(self) -> None:
        """After LEAD_PROBES occurrences of the rare byte without the prefix it
        returns a position no later than the next occurrence of the prefix."""
        lead = rulestream.Lead(b"UA-")
        buf = b"U." * (rulestream.LEAD_PROBES + 3) + b"UA-1"
        at = lead.next_start(buf, 0)
        assert 0 < at <= buf.index(b"UA-")
        # Asked again from there, it gets closer and finally finds it.
        while buf[at : at + 3] != b"UA-":
            nxt = lead.next_start(buf, at)
            assert at < nxt <= buf.index(b"UA-")
            at = nxt

    def test_lower_bound_is_just_past_the_last_false_hit(self) -> None:
        lead = rulestream.Lead(b"UA-")
        saved = rulestream.LEAD_PROBES
        rulestream.LEAD_PROBES = 1
        try:
            # One false hit at 1: the prefix may start right after it (it does).
            assert lead.next_start(b"xUUA-1", 0) == 2
            assert lead.next_start(b"xU.UA-1", 0) == 2
        finally:
            rulestream.LEAD_PROBES = saved

    @parametrize("gap", [1, 2, 3, 5])
    @parametrize("engine", ENGINES)
    def test_skip_boundaries(self, gap: int, engine: str) -> None:
        """The rare byte of ``ab+`` is ``b``, one byte into the prefix.  After a
        match ending at ``e``, the running scan goes on if a ``b`` is in the
        next ``gap`` bytes from ``e + 1``, and otherwise restarts at the next
        occurrence of ``ab`` from ``e + gap``: matches right at both edges must
        be found."""
        specs = [("ab+", "X", "g"), ("zz", "Y", "g")]
        bodies = [
            b"abab" + b"c" * 10,  # a 'b' exactly at e + 1: the scan goes on
            b"ab" + b"c" * gap + b"ab" + b"c" * 3,  # next match starts exactly at e + gap
            b"ab" + b"c" * (gap - 1) + b"ab" + b"c" * 3,  # one byte inside the window
            b"ab" + b"a" * (gap + 2) + b"bc",  # a's (the common byte) all the way
        ]
        saved = rulestream.SKIP_GAP
        try:
            for body in bodies:
                expected = run(build(specs, "none", skip=False), [body])
                rs = build(specs, engine)
                rulestream.SKIP_GAP = gap
                assert run(rs, [body]) == expected, body
                rulestream.SKIP_GAP = saved
        finally:
            rulestream.SKIP_GAP = saved
