"""The transducer's semantics: the examples of docs/substitution.md and the flags."""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.rules import compile_rule, parse_rules
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.template import TemplateError, compile_template
from prexy.substitution.transducer import HOLD_SLACK, MEMO_SIZE, Transducer, warm
from tests.cases import expand, parametrize


def rules(
    *specs: tuple[str, str, str],
    limit: int | None = None,
    engine: str | None = None,
    linear: str = "auto",
) -> RuleSet:
    return RuleSet.build(
        [
            compile_rule(p.encode("latin-1"), r.encode("latin-1"), f)
            for p, r, f in specs
        ],
        max_buffered_size=limit,
        engine=engine,
        linear=linear,
    )


def rewrite(rs: RuleSet, *pieces: bytes) -> bytes:
    t = Transducer(rs)
    return b"".join(t.feed(p) for p in pieces) + t.finish()


@expand
class TransducerTests(SynchronousTestCase):
    @parametrize(
        ("specs", "pieces", "expected"),
        [
            ([("abcabd", "X", "")], [b"abcabcabde\n"], b"abcXe\n"),
            ([("ab|abc", "X", "")], [b"abc\n"], b"Xc\n"),
            ([("a", "X", "")], [b"abcabcabde\n"], b"Xbcabcabde\n"),
            ([("b", "X", "g")], [b"bbc\n"], b"XXc\n"),
            ([("[0-9]*", "X", "g")], [b"abcabcabde"], b"XaXbXcXaXbXcXaXbXdXeX"),
            ([("[0-9]*", "X", "g")], [b"a1b"], b"XaXXbX"),
            ([("^\\s+", "", "g")], [b"  hi  \n   yo\n"], b"hi  \nyo\n"),
            ([("\\bb|a", "X", "g")], [b"a", b"b\n"], b"Xb\n"),
            ([("a.+a", "X", "ig")], [b"ABCabcABCabc\n"], b"Xbc\n"),
            ([("c", "X", "g"), ("ab", "Y", "g")], [b"abc"], b"YX"),
            ([("a", "[a]", ""), ("ab", "<ab>", "")], [b"ab"], b"[a]b"),
            ([("ab", "X", ""), ("b", "Y", "g")], [b"abab"], b"Xab"),
            ([("ab", "X", ""), ("b", "Y", "")], [b"abab"], b"Xab"),
            ([("b", "Y", ""), ("a", "X", "")], [b"abab"], b"XYab"),
        ],
    )
    def test_documented_examples(
        self,
        specs: list[tuple[str, str, str]], pieces: list[bytes], expected: bytes
    ) -> None:
        """The examples checked against the real module, in one piece and bytewise."""
        rs = rules(*specs)
        assert rewrite(rs, *pieces) == expected
        body = b"".join(pieces)
        assert rewrite(rs, *(body[i : i + 1] for i in range(len(body)))) == expected

    def test_templates(self) -> None:
        """$& $N ${N} $0 $$ and missing groups; no reference means verbatim."""
        rs = rules(("(a)(b)?(c)", "<$&|$1|${2}|$3|$0|$$|$9>", "g"))
        assert rewrite(rs, b"acabc") == b"<ac|a||c|ac|$|><abc|a|b|c|abc|$|>"
        assert rewrite(rules(("a", "$$", "g")), b"a") == b"$$"
        assert rewrite(rules(("a", "\\1\\n", "g")), b"a") == b"\\1\\n"
        assert rewrite(rules(("(a)", "${1}1", "g")), b"a") == b"a1"
        assert rewrite(rules(("(a)", "$11", "g")), b"a") == b""

    @parametrize("bad", ["$", "x$", "$host", "${1", "$-", "${}", "${&}", "${1a}"])
    def test_template_refusals(self, bad: str) -> None:
        """Unknown variables and malformed references are load errors."""
        with self.assertRaises(TemplateError):
            compile_template(bad.encode())

    def test_anchor_waits_for_next_byte(self) -> None:
        """``a$`` at a chunk edge is decided by the next byte, not the edge."""
        rs = rules(("a$", "X", "g"))
        t = Transducer(rs)
        assert t.feed(b"xa") == b"x"
        assert t.held == 1
        assert t.feed(b"b") == b"ab"
        assert t.feed(b"a") == b""
        assert t.feed(b"\n") == b"X\n"
        assert t.finish() == b""
        t = Transducer(rs)
        assert t.feed(b"xa") + t.finish() == b"xX"

    def test_only_possible_match_bytes_are_held(self) -> None:
        """Bytes that no rule can still match are written at once."""
        rs = rules(("www\\.example\\.com", "X", "g"))
        t = Transducer(rs)
        assert t.feed(b"hello world, see www.exam") == b"hello world, see "
        assert t.feed(b"ple.com!") == b"X!"
        assert t.held == 0

    def test_stats(self) -> None:
        """match_count, rules_matched and scan_seconds are kept."""
        rs = rules(("a", "X", "g"), ("b", "Y", "g"), ("z", "Z", "g"))
        t = Transducer(rs)
        t.feed(b"aab")
        t.finish()
        assert t.match_count == 3
        assert t.rules_matched == {0, 1}
        assert t.scan_seconds > 0

    def test_once_single_rule_passes_rest_through(self) -> None:
        """A single once-rule stops scanning after it fired."""
        rs = rules(("a", "X", ""))
        t = Transducer(rs)
        assert t.feed(b"bab") == b"bXb"
        assert t.passing_through
        assert t.feed(b"aaa") == b"aaa"

    def test_all_once_rules_fired_passes_through(self) -> None:
        """When every rule is once and all fired, the rest passes through."""
        rs = rules(("a", "X", ""), ("b", "Y", ""))
        t = Transducer(rs)
        assert t.feed(b"ab") == b"XY"
        assert t.passing_through
        rs = rules(("a", "X", ""), ("b", "Y", "g"))
        t = Transducer(rs)
        t.feed(b"ab")
        assert not t.passing_through

    def test_bail_out_flushes_and_stops(self) -> None:
        """Over the limit: held bytes go out unchanged, no more substitution."""
        rs = rules(("a", "X", "g"), ("<[^>]*>", "T", "g"), limit=4)
        t = Transducer(rs)
        out = t.feed(b"a<bcdef")
        assert t.bailed_out
        assert out == b"X<bcdef"
        assert t.feed(b">a") == b">a"
        assert t.finish() == b""

    def test_limit_counts_held_bytes_less_the_match_found_so_far(self) -> None:
        """As in the module (without captures), the held bytes less the match
        found so far count against the limit, and only over it does it bail.

        ``<a`` holds (a tag may still close), but ``a`` already matched inside
        it.  At the bail-out that match takes rule 0's replacement.  Everything
        held still has a hard bound.
        """
        rs = rules(("a", "X", "g"), ("<[^>]*>", "T", "g"), limit=4)
        t = Transducer(rs)
        assert t.feed(b"x<abc") == b"x"  # 4 held, 3 count
        assert t.feed(b"d") == b""  # 4 count: at the limit
        assert not t.bailed_out
        assert t.feed(b">") == b"T"
        t = Transducer(rs)
        assert t.feed(b"x<abc") + t.feed(b"de") == b"x<Xbcde"
        assert t.bailed_out
        t = Transducer(rs)
        t.feed(b"<" + b"a" * (HOLD_SLACK + 10))
        assert t.bailed_out
        assert t.held == 0

    def test_timeout_passes_rest_through(self) -> None:
        """A scan that exceeds its time limit stops substitution for the body.

        The pattern is one ``regex`` cannot bound; it is forced onto ``regex``
        (``linear="none"``) so that the guard itself is what is tested."""
        rs = rules(("(x|x)+y", "X", "g"), linear="none")
        t = Transducer(rs, timeout=0.01)
        out = t.feed(b"ab" + b"x" * 40 + b"z") + t.feed(b"ab") + t.finish()
        assert t.timed_out
        assert out.startswith(b"ab")
        assert out == b"ab" + b"x" * 40 + b"zab"

    def test_timeout_inside_a_run_of_replacements_duplicates_nothing(self) -> None:
        """A scan that times out while a run of fixed replacements is under way
        (one rule's next search explodes) leaves the output of that call
        unchanged from where the call began: nothing is emitted twice.

        Run without the Hyperscan match index: with it, the rule's own search
        never starts on the stretch where it has no match, so it cannot time
        out there."""
        body = b"a xy a " + b"x" * 40 + b"z"
        for specs in ((("a", "A", "g"), ("(x|x)+y", "X", "g")), (("(x|x)+y", "X", "g"),)):
            rs = rules(*specs, engine="anchor", linear="none")
            t = Transducer(rs, timeout=0.01)
            out = t.finish(body)
            assert t.timed_out
            assert out == body

    def test_large_body_in_slices_keeps_state_small(self) -> None:
        """Fed in 64 KB slices, nothing beyond a possible match is held."""
        rs = parse_rules(b"replace_filter 'word[0-9]+token' X g; replace_filter foo.com bar.nl g;")
        chunk = b"<p>some text with foo.com and word123token inside</p>\n" * 2000
        t = Transducer(rs)
        out = []
        for i in range(0, len(chunk), 65536):
            out.append(t.feed(chunk[i : i + 65536]))
            assert t.held < 64
        out.append(t.finish())
        assert b"".join(out) == chunk.replace(b"foo.com", b"bar.nl").replace(b"word123token", b"X")

    def test_feed_after_finish_is_an_error(self) -> None:
        """The transducer's life cycle is feed* then finish once."""
        t = Transducer(rules(("a", "b", "g")))
        t.finish()
        with self.assertRaises(RuntimeError):
            t.feed(b"a")
        with self.assertRaises(RuntimeError):
            t.finish()

    def test_caseless_is_ascii_only(self) -> None:
        """The i flag folds ASCII letters only, never other bytes."""
        rs = rules(("\xe9a", "X", "gi"))
        assert rewrite(rs, "\xe9A \xc9a".encode("latin-1")) == b"X \xc9a"

    def test_dot_matches_newline_and_s_excludes_vt(self) -> None:
        """``.`` matches a newline; ``\\s`` does not match vertical tab."""
        assert rewrite(rules(("a.b", "X", "g")), b"a\nb") == b"X"
        assert rewrite(rules(("\\s", "_", "g")), b"a\x0b\tb") == b"a\x0b_b"
        assert rewrite(rules(("\\h+", "_", "g")), b"a \t\xa0b") == b"a_b"
        assert rewrite(rules(("\\N+", "_", "g")), b"ab\ncd") == b"_\n_"

    def test_stream_anchors(self) -> None:
        r"""``\A`` and ``\z`` are the start and end of the body, not of a chunk."""
        rs = rules(("\\Aa|a\\z", "X", "g"))
        assert rewrite(rs, b"a", b"a", b"a") == b"XaX"
        assert rewrite(rs, b"aaa") == b"XaX"

    def test_lazy_match_is_released_without_waiting(self) -> None:
        """A lazy match that is complete does not wait for longer, lower-priority ones."""
        rs = rules(("<s>.*?</s>", "S", "g"))
        t = Transducer(rs)
        assert t.feed(b"a<s>x</s>b<s>y</s>") == b"aSbS"
        assert t.held == 0
        t = Transducer(rules(("<s>.*</s>", "S", "g")))
        assert t.feed(b"a<s>x</s>b") == b"a"  # greedy: a later </s> could extend it
        assert t.finish() == b"Sb"

    def test_feed_slices_bounds_each_step(self) -> None:
        """feed_slices yields one output per slice and adds up to feed()."""
        rs = rules(("ab", "X", "g"))
        body = b"xxab" * 1000
        t = Transducer(rs)
        steps = list(t.feed_slices(body, 333))
        assert len(steps) == -(-len(body) // 333)
        assert b"".join(steps) + t.finish() == body.replace(b"ab", b"X")

    def test_state_machine(self) -> None:
        """SCANNING until a once-rule, a bail-out or a timeout; FINISHED at the end."""
        from prexy.substitution.transducer import State

        t = Transducer(rules(("a", "X", "")))
        assert t.state is State.SCANNING
        t.feed(b"a")
        assert t.state is State.PASSING_THROUGH
        t.finish()
        assert t.state is State.FINISHED and t.finished

    def test_many_rules(self) -> None:
        """Hundreds of rules compile once and keep leftmost-then-rule-order semantics."""
        text = b"".join(b"replace_filter 'w%d[0-9]+t' 'R%d' g;\n" % (i, i) for i in range(300))
        rs = parse_rules(text + b"replace_filter 'w1' 'first' g;")
        t = Transducer(rs)
        # Rule 1 (w1[0-9]+t) is earlier than rule 15 and 17; w2995t goes to rule 2.
        assert t.feed(b"w17t w15t w1 w2995t x29t") + t.finish() == b"R1 R1 first R2 x29t"

    def test_only_some_rules(self) -> None:
        """``only`` runs a subset of rules, keeping their indexes and order.

        When the skipped rules cannot match the body, the output is the full
        rule set's; with no rule at all the body passes through untouched.
        """
        rs = rules(("foo", "F", "g"), ("bar", "B", "g"), ("baz", "Z", "g"))
        body = b"foo bar foo"
        full = Transducer(rs)
        some = Transducer(rs, only=[1, 0])
        assert full.feed(body) + full.finish() == some.feed(body) + some.finish() == b"F B F"
        assert some.rules_matched == {0, 1}
        one = Transducer(rs, only=[1])
        assert one.feed(body) + one.finish() == b"foo B foo"
        assert one.rules_matched == {1}
        none = Transducer(rs, only=[])
        assert none.passing_through
        assert none.feed(body) + none.finish() == body
        with self.assertRaises(ValueError):
            Transducer(rs, only=[3])

    def test_captures_of_an_empty_last_iteration(self) -> None:
        """As in Perl and sregex, a last loop iteration that matched empty is dropped."""
        assert rewrite(rules(("(a*)*", "<$1>", "")), b"aab") == b"<aa>b"
        assert rewrite(rules(("(a|)*\\d", "<$1>", "g")), b"aa1") == b"<a>"
        assert rewrite(rules(("(a*)+b", "<$1>", "g")), b"b") == b"<>"

    def test_remembered_expansions_follow_the_matched_bytes_and_the_rule(self) -> None:
        """An exact rule's expansion is remembered per matched bytes and rule:
        each form of the match gets its own groups, and a later rule set or
        another rule with the same bytes never reuses it."""
        rs = rules(("(https?://)a\\.com", "${1}b.nl", "g"), ("x(y|z)", "<$1>", "g"))
        body = b"http://a.com https://a.com http://a.com xy xz xy"
        want = b"http://b.nl https://b.nl http://b.nl <y> <z> <y>"
        assert rewrite(rs, body) == want
        assert rewrite(rs, body) == want  # second time from the memo
        exact, memo = rs.expansions
        assert exact == [True, True]
        assert memo[(0, b"https://a.com")] == b"https://b.nl"
        other = rules(("(https?://)a\\.com", "[$1]", "g"))
        assert rewrite(other, b"http://a.com") == b"[http://]"
        # Rules with assertions are not remembered: their groups may depend on context.
        ctx = rules(("\\b(a)", "<$1>", "g"), ("b", "B", "g"))
        assert ctx.expansions[0] == [False, True]
        assert rewrite(ctx, b"a ba a") == b"<a> Ba <a>"

    def test_built_rule_sets_are_warm(self) -> None:
        """Building a rule set computes what every transducer reads, so the
        first response does not pay for it (RuleSet.warm)."""
        rs = rules(("(https?://)a\\.com", "${1}b.nl", "g"), ("x[0-9]+", "N", "g"))
        for name in ("rule_facts", "global_literals", "expansions"):
            assert name in rs.__dict__, name
        assert rewrite(rs, b"https://a.com x12") == b"https://b.nl N"

    def test_match_strings_are_the_few_string_rules_strings(self) -> None:
        """RuleSet.match_strings lists what each rule with a few literal
        strings can match (a caseless one in lower case), in rule order and
        up to the limit; rules with assertions, unbounded repeats or many
        strings give none."""
        rs = rules(
            ("(https?://)www\\.a\\.com", "${1}www.b.nl", "g"),
            ("\\bx\\b", "y", "g"),
            ("CDN\\.A\\.COM", "cdn.b.nl", "gi"),
            ("z[0-9]+", "Z", "g"),
            ("[a-h]q", "Q", "g"),
            ("literal", "LIT", ""),
        )
        assert rs.match_strings(100) == [
            b"http://www.a.com", b"https://www.a.com", b"cdn.a.com", b"literal",
        ]
        assert rs.match_strings(3) == [b"http://www.a.com", b"https://www.a.com", b"cdn.a.com"]
        assert rs.match_strings(1) == [b"http://www.a.com"]
        assert rs.match_strings(100, [5, 2, 1]) == [b"literal", b"cdn.a.com"]

    def test_thorough_warm_up_remembers_expansions_and_changes_no_output(self) -> None:
        """warm(thorough=True) remembers the expansion of every few-string
        rule's strings before any response, and the bytes a response gets
        are those of a set that was not warmed so (every chunking)."""
        specs = (
            ("(https?://)www\\.a\\.com", "${1}www.b.nl", "g"),
            ("(https?://)cdn\\.a\\.com", "${1}cdn.b.nl", "g"),
            ("www\\.a\\.com", "www.b.nl", "gi"),
            ("(<title>)([^<]*)(</title>)", "$1$2 | B$3", ""),
        )
        warmed = warm(rules(*specs), thorough=True)
        plain = rules(*specs)
        memo = warmed.expansions[1]
        assert memo[(0, b"https://www.a.com")] == b"https://www.b.nl"
        assert memo[(1, b"http://cdn.a.com")] == b"http://cdn.b.nl"
        assert plain.expansions[1] == {}
        body = b"<title>A</title> <a href=https://www.a.com/x>WWW.A.COM</a> http://cdn.a.com " * 3
        want = rewrite(plain, body)
        assert want.count(b"b.nl") == 9 and want.count(b"A | B") == 1
        for size in (1, 5, 64, len(body)):
            pieces = [body[i : i + size] for i in range(0, len(body), size)]
            assert rewrite(warmed, *pieces) == want

    def test_thorough_warm_up_stays_within_the_memo_bound(self) -> None:
        """Thousands of few-string rules remember at most half the memo's
        size at warm-up."""
        rs = rules(*((f"(https?://)h{k}\\.a\\.com", f"${{1}}h{k}.b.nl", "g") for k in range(MEMO_SIZE)))
        warm(rs, thorough=True)
        memo = rs.expansions[1]
        assert 0 < len(memo) <= MEMO_SIZE // 2

    def test_remembered_expansions_replace_in_the_fast_run_and_once_rules_still_fire(self) -> None:
        """Once an exact rule's expansion is remembered, later matches are
        replaced by the fast run; a once-rule is never remembered, so it still
        fires once, and every chunking gives the same bytes."""
        rs = rules(
            ("(https?://)a\\.com", "${1}b.nl", "g"), ("(<t>)x", "$1y", ""), ("c[0-9]", "C", "g"),
        )
        body = b"<t>x http://a.com c1 <t>x https://a.com http://a.com c2 " * 3
        want = rewrite(rs, body)
        assert want.count(b"<t>y") == 1 and want.count(b"<t>x") == 5
        assert want.count(b"b.nl") == 9 and b"a.com" not in want
        for size in (1, 3, 7, 64):
            pieces = [body[i : i + size] for i in range(0, len(body), size)]
            assert rewrite(rs, *pieces) == want
        assert (1, b"<t>x") not in rs.expansions[1]
