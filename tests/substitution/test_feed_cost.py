"""A feed's fixed cost does not depend on rules that have not begun to match.

With a Hyperscan index, the hold-back question (could a match still need
more bytes?) asks the rule-by-rule cursor, and the index's scan of the few
unbounded rules, only about rules whose head (the byte sets every match
starts with) occurs in the buffer or is cut by its end
(``MatchIndex.begun``); a rule's probe runs only where its head is
(``Reach.gate``).  These tests count that work, and check on bodies built
from the heads' pieces, cut everywhere, that the output is the same as with
the whole body and as with the rule-by-rule scanner.
"""

from __future__ import annotations

import regex
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution import holdcursors, hsindex, reach, scanner
from prexy.substitution.rules import compile_rule
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.transducer import Transducer
from tests.substitution.shared import cut as cut_in

#: A clone's once rules on tags a page may not carry, case-insensitive and
#: unbounded (``[^"]*``), more of them than the index's own scan bounds
#: (hsindex.LONG_MAX), then host swaps and an id.
SOCIAL = [
    (b'(<meta property="og:url" content=")([^"]*)"', b"$1https://copy.example/\"", b"i"),
    (b'(<link rel="canonical" href=")([^"]*)"', b"$1https://copy.example/\"", b"i"),
    (b'(<meta property="og:image" content=")([^"]*)"', b"$1/img.png\"", b"i"),
    (b'(<meta name="twitter:url" content=")([^"]*)"', b"$1/\"", b"i"),
    (b"(<title>)([^<]*)(</title>)", b"$1$2 - Copy$3", b""),
    (b'data-price="(\\d+)"', b'data-price="$$$1"', b"g"),
]
HOSTS = [
    (b"www\\.origin\\.com", b"www.copy.example", b"gi"),
    (b"(https?://)cdn\\.origin\\.com", b"${1}cdn.copy.example", b"g"),
    (b"(UA-)\\d+-\\d+", b"${1}1-1", b"g"),
]
OG = 0  # the og:url rule's index


def ruleset(engine: str = "hyperscan") -> RuleSet:
    rules = [compile_rule(p, r, f) for p, r, f in SOCIAL + HOSTS]
    return RuleSet.build(rules, engine=engine)


def page(paragraphs: int) -> bytes:
    """A page without any of the social tags: the once rules never match."""
    body = b"".join(
        b'<p class="x">Text <a href="https://www.origin.com/p/%d">link</a> and <em>more</em> words '
        b'<span data-x="%d">"quoted"</span></p>\n' % (k, k)
        for k in range(paragraphs)
    )
    return b"<html><head><meta charset=\"utf-8\"></head><body>\n" + body + b"</body></html>\n"



def record_hold_cursors(case: SynchronousTestCase) -> list[list[int]]:
    """The rules of each rule-by-rule hold cursor built while ``case``
    runs, one list per cursor."""
    cursor_rules: list[list[int]] = []
    original = holdcursors.RuleHoldCursor.__init__

    def counting_init(self: holdcursors.RuleHoldCursor, *args: object) -> None:
        cursor_rules.append(list(args[4]))  # type: ignore[call-overload]
        original(self, *args)  # type: ignore[arg-type]

    case.patch(holdcursors.RuleHoldCursor, "__init__", counting_init)
    return cursor_rules

class FeedCostTests(SynchronousTestCase):
    skip = None if hsindex.AVAILABLE else "hyperscan is not installed"

    def test_the_social_rules_are_unbounded_and_looked_for_by_head(self) -> None:
        """The premise of the tests below: the og:url rule is one the
        rule-by-rule cursor would take, and the prefilter looks for its head."""
        rs = ruleset()
        assert rs.scanner is not None and rs.scanner.index is not None
        index = rs.scanner.index
        assert OG in index.unbounded
        assert index._cut_heads[OG][0] == 16  # prefilter.MAX_HEAD bytes of '<meta property="'
        assert rs.scanner.reaches[OG].gate is not None

    def test_a_rule_that_never_matches_costs_no_per_feed_work(self) -> None:
        """Fed in pieces, a page without the social tags builds no
        rule-by-rule hold cursor for them and never runs their probes."""
        rs = ruleset()
        assert rs.scanner is not None
        cursor_rules = record_hold_cursors(self)
        probed: list[int] = []
        original_reach = reach.reach_from

        def counting_reach(r: reach.Reach, *args: object) -> int | None:
            probed.append(rs.scanner.reaches.index(r))  # type: ignore[union-attr]
            return original_reach(r, *args)  # type: ignore[arg-type]

        self.patch(holdcursors, "reach_from", counting_reach)
        body = page(400)
        whole = Transducer(rs, timeout=None).finish(body)
        social = set(range(len(SOCIAL)))
        # Feeds cut anywhere: a feed that ends inside a head (a "<") has the
        # rule probed from there, never the rule-by-rule cursor.
        t = Transducer(rs, timeout=None)
        out = b"".join(t.feed(body[i : i + 1024]) for i in range(0, len(body), 1024)) + t.finish()
        assert out == whole
        assert not any(social & set(rules) for rules in cursor_rules), cursor_rules
        # Feeds cut between lines: no probe either.
        lines = body.splitlines(keepends=True)
        probed.clear()
        t = Transducer(rs, timeout=None)
        out = b"".join(t.feed(b"".join(lines[i : i + 8])) for i in range(0, len(lines), 8)) + t.finish()
        assert out == whole
        assert not social & set(probed), probed
        assert not any(social & set(rules) for rules in cursor_rules), cursor_rules

    def test_a_head_cut_by_the_end_of_a_feed_is_asked_about(self) -> None:
        """A feed that ends inside the og:url tag's head holds it back, and
        the rule fires on the next feed."""
        rs = ruleset()
        tag = b'<META PROPERTY="og:url" content="https://www.origin.com/a">'
        for cut in range(1, 40):
            t = Transducer(rs, timeout=None)
            out = t.feed(b"<head>" + tag[:cut])
            assert len(out) <= len(b"<head>")
            out += t.finish(tag[cut:])
            assert out == b'<head><META PROPERTY="og:url" content="https://copy.example/">', (cut, out)

    def test_probes_run_only_where_the_head_is(self) -> None:
        """A rule's probe runs at the places of its head, not at each of its
        first bytes (a case-insensitive rule's literal prefix is one byte)."""
        rs = ruleset()
        assert rs.scanner is not None
        r = rs.scanner.reaches[OG]
        calls = []
        probe = r.probe

        class Counting:
            def match(self, *args: object, **kwargs: object) -> object:
                calls.append(args[1])
                return probe.match(*args, **kwargs)  # type: ignore[arg-type]

        r._probe = Counting()  # type: ignore[assignment]
        try:
            body = b"<p>" * 200 + b'<meta property="og:url" content="x'
            assert reach.reach_from(r, body, 0, None) == 600
            assert calls == [600]
        finally:
            r._probe = probe

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.one_of(
                st.sampled_from(
                    [b'<meta property="og:url" content="', b'<META PROPERTY="OG:URL" CONTENT="', b"<meta ",
                     b'<link rel="canonical" href="', b'<meta name="twitter:url" content="', b"<title>",
                     b"</title>", b'data-price="', b"12", b'"', b"<", b"https://cdn.origin.com", b"www.ORIGIN.com",
                     b"UA-1-2", b"x"]
                ),
                st.binary(max_size=3),
            ),
            max_size=14,
        ),
        st.lists(st.integers(1, 40), min_size=1, max_size=6),
    )
    def test_feeds_give_the_whole_body_and_the_rule_by_rule_output(self, parts: list[bytes], sizes: list[int]) -> None:
        """Bodies made of the rules' heads, whole, cut and mixed, fed in
        pieces: the same bytes as the whole body, and as the scanner
        without an index."""
        body = b"".join(parts)
        pieces = cut_in(body, sizes)
        outs = []
        for rs in (ruleset(), ruleset("none")):
            t = Transducer(rs, timeout=None)
            outs.append(b"".join(t.feed(p) for p in pieces) + t.finish())
        assert outs[0] == outs[1] == Transducer(ruleset("none"), timeout=None).finish(body)

    @settings(max_examples=300, deadline=None)
    @given(st.binary(max_size=40).map(lambda b: b.replace(b"\x00", b"<")), st.integers(0, 40))
    def test_gate_gives_the_probe_scan_answer(self, tail: bytes, start: int) -> None:
        """reach_from through the head gate answers as the scan by literal
        prefix does."""
        r = reach.Reach(compile_rule(SOCIAL[OG][0], b"X", b"i").parsed)
        plain = reach.Reach(compile_rule(SOCIAL[OG][0], b"X", b"i").parsed)
        plain.gate = None
        for head in (b"", b'<meta property="og:url" content="', b'<MeTa PrOpErTy="', b"<meta"):
            buf = head + tail
            s = min(start, len(buf))
            assert reach.reach_from(r, buf, s, None) == reach.reach_from(plain, buf, s, None), buf


PRICE = 5  # the data-price rule's index


def priced_page(paragraphs: int) -> bytes:
    """A page whose every paragraph carries ``data-price="..."``: the rule
    begins in every feed."""
    body = b"".join(
        b'<p class="item" data-price="%d">Item %d, see <a href="https://www.origin.com/i/%d">it</a>.</p>\n'
        % (100 + k, k, k)
        for k in range(paragraphs)
    )
    return b"<html><head></head><body>\n" + body + b"</body></html>\n"


class BelowFloorTests(SynchronousTestCase):
    skip = None if hsindex.AVAILABLE else "hyperscan is not installed"

    def test_a_rule_begun_far_from_the_end_builds_no_rule_by_rule_cursor(self) -> None:
        """A page with data-price="..." in every paragraph, fed in pieces cut
        between lines: the rule's last start in each feed lies below its
        floor, so no feed builds a rule-by-rule hold cursor for it; the
        output is the whole body's."""
        rs = ruleset()
        assert rs.scanner is not None and rs.scanner.index is not None
        assert PRICE in rs.scanner.index.unbounded
        cursor_rules = record_hold_cursors(self)
        body = priced_page(300)
        whole = Transducer(rs, timeout=None).finish(body)
        assert whole.count(b'data-price="$') == 300
        lines = body.splitlines(keepends=True)
        t = Transducer(rs, timeout=None)
        out = b"".join(t.feed(b"".join(lines[i : i + 7])) for i in range(0, len(lines), 7)) + t.finish()
        assert out == whole
        assert not any(PRICE in rules for rules in cursor_rules), cursor_rules

    def test_a_rule_begun_near_the_end_is_asked(self) -> None:
        """Cut inside the price, the match is held back and completed by
        the next feed."""
        rs = ruleset()
        item = b'<p data-price="1234">x</p>\n'
        for cut in range(1, len(item)):
            t = Transducer(rs, timeout=None)
            out = t.feed(b"<p>a</p>\n" + item[:cut])
            out += t.finish(item[cut:])
            assert out == b'<p>a</p>\n<p data-price="$1234">x</p>\n', (cut, out)

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.one_of(
                st.sampled_from([b'data-price="', b"12", b'"', b"<title>", b"x</title>", b"<", b" ", b"\n",
                                 b'<meta property="og:url" content="', b"https://a/"]),
                st.binary(max_size=3),
            ),
            max_size=16,
        ),
        st.integers(0, 40),
    )
    def test_a_dropped_rule_has_no_path_from_its_starts(self, parts: list[bytes], pos: int) -> None:
        """When below_floor drops a rule, the rule-by-rule cursor finds no
        path that reaches the end from any of its starts (at or before its
        last one)."""
        rs = ruleset()
        scanner = rs.scanner
        assert scanner is not None and scanner.index is not None
        buf = b"".join(parts)
        pos = min(pos, len(buf))
        events = scanner.index.events(buf, pos, None)
        rules = scanner.index.unbounded + scanner.index.long_rules
        kept = holdcursors.below_floor(buf, pos, events.candidates, events.lasts, rules, scanner.reaches)
        for rule in set(events.candidates) - set(kept):
            hold = holdcursors.RuleHoldCursor(buf, pos, None, scanner, [rule]).hold_point(pos, None)
            assert hold is None or hold > events.lasts[rule], (rule, hold, events.lasts[rule])

    def test_the_body_plan_is_made_once_per_rule_subset(self) -> None:
        """What a feed's cursors need of the active rules (mask, the
        index's rule lists) is made once per rule subset, not per feed."""
        rs = ruleset()
        assert rs.scanner is not None
        made: list[object] = []
        original = holdcursors.IndexPlan.__init__

        def counting(self: holdcursors.IndexPlan, *args: object) -> None:
            made.append(args)
            original(self, *args)  # type: ignore[arg-type]

        self.patch(holdcursors.IndexPlan, "__init__", counting)
        body = priced_page(60)
        for only in (None, None, [0, 5, 6, 7], [0, 5, 6, 7]):
            t = Transducer(rs, timeout=None, only=only)
            out = b"".join(t.feed(body[i : i + 512]) for i in range(0, len(body), 512)) + t.finish()
            assert out == Transducer(rs, timeout=None, only=only).finish(body)
        assert len(made) == 2, made


class EndTests(SynchronousTestCase):
    """What the end of a feed or of the body asks: nothing when nothing can
    match there, one search when no head is cut by it."""

    skip = None if hsindex.AVAILABLE else "hyperscan is not installed"

    def test_finish_with_nothing_held_scans_nothing(self) -> None:
        """With no rule that can match the empty string, a body fed in
        pieces that ends with nothing held finishes without building a
        cursor; with one that can (``$``), the end is still scanned."""
        rs = ruleset()
        assert rs.scanner is not None
        body = page(20)
        whole = Transducer(rs, timeout=None).finish(body)
        t = Transducer(rs, timeout=None)
        out = t.feed(body)
        assert t.held == 0
        built: list[object] = []
        original = scanner.BodyScan.cursors

        def counting(body_scan: scanner.BodyScan, *args: object) -> object:
            built.append(args)
            return original(body_scan, *args)  # type: ignore[arg-type]

        self.patch(scanner.BodyScan, "cursors", counting)
        assert out + t.finish() == whole
        assert built == []
        end = RuleSet.build([compile_rule(b"x", b"Y", b"g"), compile_rule(b"\\z", b"<end>", b"")], engine="hyperscan")
        t = Transducer(end, timeout=None)
        out = t.feed(b"ab\n")
        assert t.held == 0
        assert out + t.finish() == Transducer(end, timeout=None).finish(b"ab\n") == b"ab\n<end>"
        assert built

    @settings(max_examples=300, deadline=None)
    @given(
        st.lists(
            st.one_of(
                st.sampled_from([b"<", b"<me", b"<META PROP", b'<link rel="can', b"<ti", b"d", b"data-pr", b"U",
                                 b"UA-", b'data-price="', b"x"]),
                st.binary(max_size=3),
            ),
            max_size=8,
        ),
        st.integers(0, 30),
    )
    def test_one_search_for_cut_heads_answers_as_each_rule(self, parts: list[bytes], pos: int) -> None:
        """MatchIndex.begun with its one search for any head cut by the end
        gives what it gives asking rule by rule."""
        rs = ruleset()
        assert rs.scanner is not None and rs.scanner.index is not None
        index = rs.scanner.index
        one = index._any_cut
        assert one is not None
        buf = b"".join(parts)
        pos = min(pos, len(buf))
        rules = index.unbounded + index.long_rules
        for candidates in ({}, index.events(buf, pos, None).candidates):
            fast = index.begun(buf, pos, candidates, rules)
            index._any_cut = regex.compile(b"")  # always "some head may be cut": rule by rule
            try:
                slow = index.begun(buf, pos, candidates, rules)
            finally:
                index._any_cut = one
            assert fast == slow, (buf, pos, fast, slow)

    @settings(max_examples=300, deadline=None)
    @given(
        st.sampled_from([SOCIAL[0][0], b'data-price="(\\d+)"', b"<a [^<>]*>", b"(<title>)([^<]*)(</title>)",
                         b"x[a-c]*y[0-9]*z"]),
        st.lists(st.sampled_from([b'"', b"<", b">", b"1", b"a", b"xyz", b"b" * 300, b'"' * 40]), max_size=30),
        st.integers(0, 400),
    )
    def test_floor_mark_is_the_walk_to_the_floor(self, pattern: bytes, parts: list[bytes], lo: int) -> None:
        """Reach.floor_mark finds the bounded+2-th byte from the end that the
        rule's repeats do not eat, as a backward walk byte by byte does."""
        r = reach.Reach(compile_rule(pattern, b"X", b"g").parsed)
        assert r.other is not None
        buf = b"".join(parts)
        lo = min(lo, len(buf))
        want = [m.start() for m in r.other.finditer(buf, lo, len(buf))]
        k = r.bounded + 1
        assert r.floor_mark(buf, lo, len(buf)) == (want[k] if k < len(want) else -1)

    @settings(max_examples=300, deadline=None)
    @given(
        st.sampled_from([SOCIAL[0][0], b'data-price="(\\d+)"', b"<a [^<>]*>", b"x[a-c]*y[0-9]*z"]),
        st.lists(st.sampled_from([b'"', b"<", b">", b"1", b"a", b"xyz", b"b" * 300, b'"' * 40]), max_size=30),
        st.integers(0, 400),
        st.integers(1, 60),
    )
    def test_marks_are_the_backward_walk(self, pattern: bytes, parts: list[bytes], lo: int, need: int) -> None:
        """Reach.marks gives the places a backward search byte by byte gives."""
        r = reach.Reach(compile_rule(pattern, b"X", b"g").parsed)
        assert r.other is not None
        buf = b"".join(parts)
        lo = min(lo, len(buf))
        want = [m.start() for m in r.other.finditer(buf, lo, len(buf))][:need]
        assert r.marks(buf, lo, len(buf), need) == want
