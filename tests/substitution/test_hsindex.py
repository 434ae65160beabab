"""The Hyperscan match index reports exactly what the rules' own scans find.

Three things make the index safe to put in front of the transducer:

* for an *exact* rule, its reports are every match at every start, with
  the end the rule's own ``regex`` match has there;
* for any other rule, the bound it gives from a position is never past the
  rule's next match, and "none" means the rule has no match from there;
* the hold-back cursor built on it (tail trie plus prefix-closure scan,
  then the rule's probe) names the same hold point as the rule-by-rule
  cursor, so bail-outs happen where they did.

Rule sets come from the prefilter tests' strategies (shared literal
prefixes, ties, assertions, repeats) and the streaming tests' random
patterns.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution import hsindex
from prexy.substitution.rules import compile_rule
from prexy.substitution.scanner import RegexScanner
from prexy.substitution.transducer import Transducer
from tests.cases import expand, parametrize
from tests.substitution.shared import cut
from tests.substitution.test_prefilter import bodies, compile_all, specs

#: Host names sharing a base domain, and the forms a clone's rules swap
#: them in (``%s``: the escaped host), as in bench/realistic.py.
hosts = [b"www\\.shop\\.com", b"m\\.shop\\.com", b"img1\\.shop\\.com", b"WWW\\.Sh0p\\.com"]
host_forms = [b"%s", b"(https?://)%s", b"\\/\\/%s", b"https:\\\\\\/\\\\\\/%s"]
pieces = [b"www.shop.com", b"WWW.SHOP.COM", b"https://", b"http://", b"//", b"https:\\/\\/",
          b"m.shop.com", b"img1.shop.com", b"www.sh0p.com", b"mg1.shop.co", b".com", b"w"]
#: Host names in every form, each possibly with one byte dropped: a key's
#: window without the key around it.
texts = [scheme + host for scheme in (b"", b"https://", b"http://", b"//", b"https:\\/\\/")
         for host in (b"www.shop.com", b"m.shop.com", b"img1.shop.com", b"WWW.Sh0p.com")]
near_keys = st.builds(
    lambda text, cut: text if cut >= len(text) else text[:cut] + text[cut + 1 :],
    st.sampled_from(texts), st.integers(0, 40),
)


@expand
class HsindexTests(SynchronousTestCase):
    skip = None if hsindex.AVAILABLE else "hyperscan is not installed"

    @parametrize(
        ("pattern", "flags", "widths"),
        [
            (b"www\\.a\\.com", b"g", {9: None}),
            (b"host", b"gi", {4: None}),
            (b"G-[A-Z0-9]{10}", b"g", {12: None}),
            (b"(https?://)a", b"g", {8: 1, 9: 1}),
            (b"ab|cde", b"g", {2: 1, 3: 1}),
        ],
    )
    def test_exact_rules(self, pattern: bytes, flags: bytes, widths: dict[int, int | None]) -> None:
        """Fixed widths, and finite expansions with no prefix or suffix clash."""
        got = hsindex.exact_widths(compile_rule(pattern, b"X", flags).parsed)
        assert got is not None
        assert {w: (None if seqs is None else len(seqs)) for w, seqs in got.items()} == widths

    @parametrize(
        "pattern",
        [b"a|ab", b"ab|b", b"\\bhost", b"a+", b"x$", b"(a|b)c*", b"<t>[^<]*</t>"],
    )
    def test_not_exact_rules(self, pattern: bytes) -> None:
        """Two ends for one start, two starts for one end, assertions, repeats."""
        assert hsindex.exact_widths(compile_rule(pattern, b"X", b"g").parsed) is None

    @settings(max_examples=300, deadline=None)
    @given(specs, bodies)
    def test_reports_and_candidates_match_regex(self, rule_specs: list[tuple[str, str, str]], body: bytes) -> None:
        """Exact rules: every (start, end) of a real match, and nothing else.
        Other rules: from every scan position, each that has a match is a
        candidate, with a hint at or before that match."""
        rules = compile_all(rule_specs)
        parsed = [r.parsed for r in rules]
        plain = RegexScanner(parsed, "none")
        index = hsindex.MatchIndex(parsed)
        others = set(index.others)
        for pos in {0, 1, len(body) // 2}:
            if pos > len(body):
                continue
            events = index.events(body, pos, None)
            reported = set(index.matches(body, events))
            want = set()
            for r in set(range(len(parsed))) - others:
                assert hsindex.exact_widths(parsed[r]) is not None
                for s in range(pos, len(body) + 1):
                    m = plain.patterns[r].match(body, s)
                    if m is not None:
                        want.add((s, r, m.end()))
            assert reported == want
            for r in others:
                m = plain.patterns[r].search(body, pos)
                if m is not None:
                    assert r in events.candidates, (r, pos)
                    assert pos <= events.candidates[r] <= m.start()

    def test_only_active_rules_are_reported(self) -> None:
        """With a mask, reports and candidates name active rules only."""
        rules = [compile_rule(b"ab", b"X", b"g"), compile_rule(b"a[0-9]+", b"Y", b"g"), compile_rule(b"b", b"Z", b"g")]
        index = hsindex.MatchIndex([r.parsed for r in rules])
        body = b"ab a12 b"
        everything = index.events(body, 0, None)
        assert {r for _, r, _ in index.matches(body, everything)} == {0, 2} and set(everything.candidates) == {1}
        some = index.events(body, 0, [False, True, True])
        assert {r for _, r, _ in index.matches(body, some)} == {2} and set(some.candidates) == {1}

    @settings(max_examples=300, deadline=None)
    @given(specs, bodies, st.integers(0, 40))
    def test_hold_point_same_as_rule_by_rule(
        self,
        rule_specs: list[tuple[str, str, str]], body: bytes, lo: int
    ) -> None:
        """The index's hold cursor and the per-rule one hold from the same place."""
        rules = compile_all(rule_specs)
        parsed = [r.parsed for r in rules]
        lo = min(lo, len(body))
        fast = RegexScanner(parsed, "hyperscan")
        slow = RegexScanner(parsed, "none")
        active = range(len(parsed))
        assert fast.index is not None
        a = fast.hold_cursor(body, lo, None, active).hold_point(lo, None)
        b = slow.hold_cursor(body, lo, None, active).hold_point(lo, None)
        assert a == b or (a == len(body) and b is None) or (b == len(body) and a is None)

    def test_tail_trie_names_rules_cut_by_the_end(self) -> None:
        """A host name cut by the end of the buffer, in any case, is alive."""
        rules = [compile_rule(b"www\\.abc\\.com", b"X", b"gi"), compile_rule(b"(https?://)abc", b"X", b"g")]
        index = hsindex.MatchIndex([r.parsed for r in rules])
        places = index.tail.places(b"see WWW.AB", 0)
        alive = {at: index.tail.below[node] for at, node, ended in places if ended}
        assert alive[4] == [0]
        places = index.tail.places(b"see https:/", 0)
        assert any(at == 4 and 1 in index.tail.below[node] for at, node, ended in places if ended)
        assert index.tail.places(b"nothing here", 0) == []

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(st.tuples(st.sampled_from(host_forms), st.sampled_from(hosts)), min_size=1, max_size=8),
        st.lists(st.one_of(near_keys, st.sampled_from(pieces), st.binary(max_size=3)), max_size=8),
        st.integers(0, 60),
    )
    def test_tail_places_by_hyperscan_heads_as_by_first_bytes(
        self, rule_parts: list[tuple[bytes, bytes]], parts: list[bytes], pos: int
    ) -> None:
        """The tail trie's places found with Hyperscan (the paths' first
        three bytes, for large tries) are the places found by first bytes."""
        parsed = {r: compile_rule(form % host, b"X", b"gi").parsed for r, (form, host) in enumerate(rule_parts)}
        self.patch(hsindex, "PREFIX_SCAN_MIN", 0)
        heads = hsindex.TailTrie(parsed)
        self.patch(hsindex, "PREFIX_SCAN_MIN", 10**9)
        firsts = hsindex.TailTrie(parsed)
        assert heads._heads is not None and firsts._heads is None
        body = b"".join(parts)
        pos = min(pos, len(body))
        assert heads.places(body, pos) == firsts.places(body, pos)

    def test_literal_keys(self) -> None:
        """Literal bytes, or literal bytes with letters of both cases (folded to
        lower case); a letter of one case among folded ones, or a larger set,
        is not a literal key."""
        def keys(pattern: bytes, flags: bytes = b"g") -> list[tuple[bytes, bool]] | None:
            seqs = hsindex.expand(compile_rule(pattern, b"X", flags).parsed.tree)
            assert seqs is not None
            return hsindex.literal_keys(seqs)

        assert keys(b"(https?://)a\\.com") == [(b"http://a.com", False), (b"https://a.com", False)]
        assert keys(b"WWW\\.A-1\\.com", b"gi") == [(b"www.a-1.com", True)]
        assert keys(b"[Aa]b") is None
        assert keys(b"G-[A-Z0-9]{3}") is None

    def test_windows_avoid_what_many_keys_share(self) -> None:
        """Each key is looked for by the window its fellow keys share least,
        not by the base domain every host name has."""
        hosts = [b"www.shop.com", b"img1.shop.com", b"img2.shop.com", b"cdn.shop.com"]
        keys = [b"https://" + h for h in hosts] + hosts
        for key, at in zip(keys, hsindex._windows(keys), strict=True):
            window = key[at : at + hsindex.WINDOW]
            assert b"shop.com" not in window or window.startswith((b"www.", b"img", b"cdn")), (key, window)
            assert sum(window in k for k in keys) <= 3, (key, window)

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(st.sampled_from(host_forms), st.sampled_from(hosts), st.sampled_from([b"g", b"gi"])),
            min_size=1, max_size=8,
        ),
        st.lists(st.one_of(st.sampled_from(pieces), st.binary(max_size=3)), max_size=12),
        st.integers(0, 30),
        st.lists(st.booleans(), min_size=8, max_size=8) | st.none(),
    )
    def test_whole_keys_and_windows_report_the_same(
        self, rule_parts: list[tuple[bytes, bytes, bytes]], parts: list[bytes], pos: int, mask: list[bool] | None
    ) -> None:
        """Literal rules looked for whole (few keys) and by their windows
        (many keys) report the same matches, those of the rules' own
        patterns: at every start from the scan position (either case for an
        ``i`` rule, overlaps included), of the active rules only."""
        rules = [compile_rule(form % host, b"X", flags) for form, host, flags in rule_parts]
        parsed = [r.parsed for r in rules]
        body = b"".join(parts)
        pos = min(pos, len(body))
        active = None if mask is None else mask[: len(parsed)]
        got = []
        for whole_keys in (0, 1000):
            self.patch(hsindex, "WHOLE_KEYS", whole_keys)
            index = hsindex.MatchIndex(parsed)
            assert index.others == ()
            got.append(index.matches(body, index.events(body, pos, active)))
        plain = RegexScanner(parsed, "none")
        want = []
        for start in range(pos, len(body)):
            for r, pattern in enumerate(plain.patterns):
                m = pattern.match(body, start)
                if m is not None and (active is None or active[r]):
                    want.append((start, r, m.end()))
        assert got[0] == got[1] == want

    @settings(max_examples=200, deadline=None)
    @given(
        st.lists(
            st.tuples(
                st.sampled_from(host_forms),
                st.sampled_from(hosts),
                st.sampled_from([b"g", b"gi", b"", b"i"]),
                st.sampled_from([b"X", b"${1}Y", b"$&"]),
            ),
            min_size=2, max_size=8,
        ),
        st.lists(st.one_of(near_keys, st.sampled_from(pieces), st.binary(max_size=3)), max_size=12),
        st.lists(st.integers(1, 16), min_size=1, max_size=6),
        st.booleans(),
        st.lists(st.booleans(), min_size=9, max_size=9),
    )
    def test_window_reports_rewrite_as_the_rule_by_rule_scanner(
        self,
        rule_parts: list[tuple[bytes, bytes, bytes, bytes]],
        parts: list[bytes],
        sizes: list[int],
        word_rule: bool,
        only: list[bool],
    ) -> None:
        """With every literal key looked for by its window (reports confirmed
        only where the scan takes them), the transducer writes the same bytes
        as with the rules' own scans: whole and in chunks, with all rules or
        some (``only``), beside a rule the index does not report."""
        from prexy.substitution.ruleset import RuleSet

        self.patch(hsindex, "WHOLE_KEYS", 0)
        rules = [
            compile_rule(form % host, repl if b"(" in form or repl != b"${1}Y" else b"Y", flags)
            for form, host, flags, repl in rule_parts
        ]
        if word_rule:
            rules.append(compile_rule(b"\\bshop[0-9]*", b"Z", b"g"))
        body = b"".join(parts)
        pieces = cut(body, sizes)
        chosen = [r for r in range(len(rules)) if only[r]] or [0]
        fast = RuleSet.build(rules, engine="hyperscan")
        slow = RuleSet.build(rules, engine="none")
        assert fast.scanner is not None and fast.scanner.index is not None
        for subset in (None, chosen):
            outs = []
            for rs in (fast, slow):
                whole = Transducer(rs, timeout=None, only=subset).finish(body)
                t = Transducer(rs, timeout=None, only=subset)
                outs.append((whole, b"".join(t.feed(p) for p in pieces) + t.finish()))
            assert outs[0] == outs[1]

    def test_window_report_in_the_held_bytes_is_confirmed(self) -> None:
        """A window hit in bytes held back for a longer rule is no match of
        its key: the other rule's match there is taken."""
        from prexy.substitution.ruleset import RuleSet

        self.patch(hsindex, "WHOLE_KEYS", 0)
        # The key's window is its last 8 bytes; "abc.shop.com" has them.
        rules = [compile_rule(b"www\\.shop\\.com", b"KEY", b"g"), compile_rule(b"\\w+\\.shop[a-z.]*", b"LONG", b"g")]
        ruleset = RuleSet.build(rules, engine="hyperscan")
        assert ruleset.scanner is not None and ruleset.scanner.index is not None
        t = Transducer(ruleset, timeout=None)
        assert t.feed(b"abc.shop.com") + t.finish(b"x!") == b"LONG!"

    @settings(max_examples=300, deadline=None)
    @given(specs, bodies, st.lists(st.integers(1, 12), min_size=1, max_size=8), st.integers(0, 12))
    def test_bail_outs_where_the_rule_by_rule_scanner_bails_out(
        self,
        rule_specs: list[tuple[str, str, str]], body: bytes, sizes: list[int], limit: int
    ) -> None:
        """With a small buffer limit, the index's scanner holds back exactly as
        much as the rule-by-rule one: the same bytes come out of every chunking,
        bail-outs included."""
        from prexy.substitution.ruleset import RuleSet

        rules = compile_all(rule_specs)
        fast = RuleSet.build(rules, max_buffered_size=limit, engine="hyperscan")
        slow = RuleSet.build(rules, max_buffered_size=limit, engine="none")
        assert fast.scanner is not None and fast.scanner.index is not None
        pieces = []
        at = 0
        k = 0
        while at < len(body):
            step = sizes[k % len(sizes)]
            pieces.append(body[at : at + step])
            at += step
            k += 1
        outs = []
        for rs in (fast, slow):
            t = Transducer(rs, timeout=None)
            outs.append((b"".join(t.feed(p) for p in pieces) + t.finish(), t.bailed_out))
        assert outs[0] == outs[1]


@expand
class OneScanTests(SynchronousTestCase):
    """The index scans a buffer once: the literal windows, the exact rules
    and the prefilter of the other rules are one Hyperscan database, whose
    reports are those of the three scanned apart."""

    skip = None if hsindex.AVAILABLE else "hyperscan is not installed"

    @settings(max_examples=300, deadline=None)
    @given(
        specs,
        bodies,
        st.integers(0, 80),
        st.integers(0, 100),
        st.lists(st.booleans(), min_size=16, max_size=16) | st.none(),
    )
    def test_one_scan_reports_as_the_three_apart(
        self, rule_specs: list[tuple[str, str, str]], body: bytes, pad: int, pos: int, mask: list[bool] | None
    ) -> None:
        """Every report of the exact rules, confirmed or not, is the same;
        every rule the prefilter names apart is named, from the same place,
        with the same last start.  (Only a rule it looks for whole may be
        named as well, from a scan start within WHOLE_SCAN_POS.)"""
        rules = compile_all(rule_specs)
        parsed = [r.parsed for r in rules]
        body = b"x-" * pad + body
        pos = min(pos, len(body))
        active = None if mask is None else mask[: len(parsed)] + [True] * max(0, len(parsed) - len(mask))
        united = hsindex.MatchIndex(parsed)

        def apart_only(index: hsindex.MatchIndex) -> None:
            index._window.compile()
            if index._filter is not None:
                index._filter.settle()

        self.patch(hsindex.MatchIndex, "_unite", apart_only)
        apart = hsindex.MatchIndex(parsed)
        assert apart._united is None
        assert (apart._window.db is not None) == bool(apart._window.exprs)
        one = united.events(body, pos, active)
        three = apart.events(body, pos, active)
        assert one.exact == three.exact
        whole = set()
        if united._filter is not None:
            whole = {united.others[local] for local, length in united._filter.db.facts if length is None}
        for rule, first in three.candidates.items():
            assert one.candidates.get(rule) == first, (rule, one.candidates, three.candidates)
            assert one.lasts[rule] == three.lasts[rule]
        extra = set(one.candidates) - set(three.candidates)
        assert extra <= whole and (not extra or pos <= hsindex.WHOLE_SCAN_POS), extra

    def test_a_buffer_costs_one_scan(self) -> None:
        """With literal keys, exact rules and others, events() makes one
        Hyperscan scan call."""
        rules = [
            compile_rule(b"www\\.shop\\.com", b"X", b"gi"),
            compile_rule(b"(https?://)m\\.shop\\.com", b"${1}m", b"g"),
            compile_rule(b"(UA-)\\d+-\\d+", b"${1}1", b"g"),
            compile_rule(b'data-price="(\\d+)"', b"$1", b"g"),
        ]
        index = hsindex.MatchIndex([r.parsed for r in rules])
        scans = []
        original = hsindex.HyperscanDatabase.scan

        def counting(db: hsindex.HyperscanDatabase, data: bytes, handler: object) -> None:
            scans.append(db)
            original(db, data, handler)

        self.patch(hsindex.HyperscanDatabase, "scan", counting)
        body = b'x www.SHOP.com https://m.shop.com UA-1-2 data-price="3" ' * 4
        for pos in (0, 1, 100):
            scans.clear()
            events = index.events(body, pos, None)
            assert len(scans) == 1, scans
            assert {r for _, r, _ in index.matches(body, events)} == {0, 1}
            assert set(events.candidates) == {2, 3}

    def test_parts_compile_apart_when_hyperscan_refuses_them_together(self) -> None:
        """When the one database does not compile, the three parts compile
        and scan apart, reporting the same; when it does, the windows and
        the prefilter are never compiled apart."""
        rules = [
            compile_rule(b"www\\.shop\\.com", b"X", b"gi"),
            compile_rule(b"(https?://)m\\.shop\\.com", b"${1}m", b"g"),
            compile_rule(b"(UA-)\\d+-\\d+", b"${1}1", b"g"),
            compile_rule(b"<t>[^<]*</t>", b"T", b"g"),
        ]
        parsed = [r.parsed for r in rules]
        compiled: list[int] = []
        # (A staticmethod: put back the descriptor itself, not the function.)
        original = hsindex.HyperscanDatabase.__dict__["_compile"]

        def counting(exprs: list[bytes], flags: list[int]) -> object:
            compiled.append(len(exprs))
            return original.__func__(exprs, flags)

        hsindex.HyperscanDatabase._compile = staticmethod(counting)  # type: ignore[method-assign]
        self.addCleanup(setattr, hsindex.HyperscanDatabase, "_compile", original)
        united = hsindex.MatchIndex(parsed)
        assert united._united is not None
        # The one database (three literal keys, the two others' heads),
        # then the tail scan of the two unbounded rules: nothing else.
        assert compiled == [len(united._united.exprs), 2] == [5, 2], compiled

        class Refusing(hsindex.HyperscanDatabase):
            def __init__(self, *args: object, strict: bool = False, **kwargs: object) -> None:
                if strict:
                    raise hsindex._hs.error("too big together")
                super().__init__(*args, **kwargs)  # type: ignore[arg-type]

        self.patch(hsindex, "HyperscanDatabase", Refusing)
        apart = hsindex.MatchIndex(parsed)
        assert apart._united is None
        body = b"<t>x</t> https://m.shop.com WWW.shop.com UA-12-3 <t>y" * 3
        for pos in (0, 1, 70):
            one, three = united.events(body, pos, None), apart.events(body, pos, None)
            assert one.exact == three.exact and one.candidates == three.candidates and one.lasts == three.lasts
