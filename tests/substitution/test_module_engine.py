"""Two more places where replace-filter's engine is not Perl, found by the
differential against a real nginx + replace-filter build
(``bench/replace_filter_diff.py``).

* No empty match at the end of the body right after a non-empty match that
  ends there (``a*`` on ``a`` gives one replacement, not two).  An empty
  match at the end after anything else is still made (``[0-9]*`` on
  ``...de`` ends ``...XdXeX``).
* The bail-out count: a match that needs a look-ahead assertion (``$``,
  ``\\z``, ``\\b``, ``\\B``) right at the end of a buffer is not a match
  found so far, since sregex tests those with the byte after them; so the
  held bytes all count, less the rule's first match there that needs no such
  assertion.

Every expected body here is what the real module returned, at buffers of 1,
2 and 3 bytes and whole.  The first rule's cases give the same bytes at
every chunking; the bail-out cases are fed in the module's buffers, since it
checks its limit at the end of each.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.rules import compile_rule
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.transducer import Transducer
from tests.cases import expand, param, parametrize

Spec = tuple[str, str, str]


def build(specs: list[Spec], limit: int | None = None) -> RuleSet:
    return RuleSet.build(
        [compile_rule(p.encode("latin-1"), r.encode("latin-1"), f) for p, r, f in specs],
        max_buffered_size=limit,
    )


def feed(ruleset: RuleSet, pieces: list[bytes], eof_with_last: bool = False) -> bytes:
    t = Transducer(ruleset, timeout=None)
    if eof_with_last:
        return b"".join(t.feed(p) for p in pieces[:-1]) + t.finish(pieces[-1])
    return b"".join(t.feed(p) for p in pieces) + t.finish()


def chunkings(body: bytes) -> list[list[bytes]]:
    """Whole, byte by byte, and cut in two anywhere."""
    ways = [[body], [body[i : i + 1] for i in range(len(body))]]
    ways += [[body[:i], body[i:]] for i in range(1, len(body))]
    return ways


def cut(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)] or [b""]


#: (name, rules, body, the module's output)
END_CASES: list[tuple[str, list[Spec], str, str]] = [
    ("a match that ends the body", [("a*", "<$&>", "g")], "a", "<a>"),
    ("a longer one", [("a*", "<$&>", "g")], "aa", "<aa>"),
    ("after a copied byte", [("a*", "<$&>", "g")], "ba", "<>b<a>"),
    ("not when the body ends otherwise", [("a*", "<$&>", "g")], "ab", "<a><>b<>"),
    ("after an empty match, as before", [("[0-9]*", "X", "g")], "abcabcabde", "XaXbXcXaXbXcXaXbXdXeX"),
    ("a fixed replacement", [("[0-9]*", "X", "g")], "ab12", "XaXbX"),
    ("another rule's match", [("a", "A", "g"), (".|a*", "X", "g")], "1", "X"),
    ("another rule before", [("b", "B", "g"), ("x*", "X", "g")], "ab", "XaB"),
    ("a match decided before the end", [("ab|c*", "X", "g")], "ab", "X"),
    ("an optional group", [("(?:ab)?", "<$&>", "g")], "abab", "<ab><ab>"),
    ("a line anchor at the end", [("[^\n]*$", "#", "g")], "ab\ncd\n", "##\n##\n#"),
    ("a lazy start", [("(.*?)(\\d*)", "<$&>", "g")], "I 2: 53",
     "<>I<> <2><>:<> <53>"),
    ("a once-rule", [("a*", "X", "")], "aa", "X"),
]


def _end_cases() -> list[object]:
    return [param(rules, body, want, id=name) for name, rules, body, want in END_CASES]


TRIM = "  hello, world  \nblah yeah\nhello  \n   baby!\n     \nabc\n"

#: (name, rules, limit, body, {buffer size: the module's output}); 0: whole,
#: with the end of the body in the same buffer (as nginx serves a file).
LIMIT_CASES: list[tuple[str, list[Spec], int, str, dict[int, str]]] = [
    (
        "$ at a buffer's end is not a match yet",
        [("\\s+$", "", "g")], 0, TRIM,
        {1: TRIM, 2: TRIM, 3: TRIM, 0: "  hello, world\nblah yeah\nhello\n   baby!\nabc"},
    ),
    (
        "but the rule's match without it is",
        [("ab$|a", "Z", "g")], 1, "xab\nab",
        {1: "xZ\nZ", 2: "xZ\nZ", 3: "xZ\nZ", 0: "xZ\nZ"},
    ),
    (
        "$ under the limit",
        [("ab$", "Z", "g")], 3, "xab\nab",
        {1: "xZ\nZ", 2: "xZ\nZ", 3: "xZ\nZ", 0: "xZ\nZ"},
    ),
    (
        "\\b at a buffer's end",
        [("\\bfoo\\b", "F", "g")], 2, "a foo foox foo",
        {1: "a foo foox foo", 2: "a F foox F", 0: "a F foox F"},
    ),
    (
        "\\b with room",
        [("\\bfoo\\b", "F", "g")], 3, "a foo foox foo",
        {1: "a F foox F", 2: "a F foox F", 3: "a F foox F", 0: "a F foox F"},
    ),
]


def _limit_cases() -> list[object]:
    out = []
    for name, rules, limit, body, wants in LIMIT_CASES:
        for size, want in wants.items():
            out.append(param(rules, limit, body, size, want, id=f"{name} @{size or 'whole'}"))
    return out


@expand
class ModuleEngineTests(SynchronousTestCase):
    @parametrize("rules,body,want", _end_cases())
    def test_no_empty_match_after_a_match_that_ends_the_body(
        self, rules: list[Spec], body: str, want: str
    ) -> None:
        """The module's output at every chunking (whole, bytewise, any cut in
        two), with the end of the body alone and with the last bytes."""
        ruleset = build(rules)
        data = body.encode("latin-1")
        for pieces in chunkings(data):
            assert feed(ruleset, pieces) == want.encode("latin-1"), pieces
            assert feed(ruleset, pieces, eof_with_last=True) == want.encode("latin-1"), pieces

    @parametrize("rules,limit,body,size,want", _limit_cases())
    def test_lookahead_at_a_buffers_end_counts_as_held(
        self, rules: list[Spec], limit: int, body: str, size: int, want: str
    ) -> None:
        """The module's output at its buffer size, the end of the body coming
        with the last buffer."""
        ruleset = build(rules, limit)
        data = body.encode("latin-1")
        pieces = cut(data, size) if size else [data]
        t = Transducer(ruleset, timeout=None)
        out = b"".join(t.feed(p) for p in pieces[:-1]) + t.finish(pieces[-1])
        assert out == want.encode("latin-1")

    def test_whole_match_counts_when_no_lookahead_is_left(self) -> None:
        """``^\\s+|\\s+$`` at a buffer's end: the ``^\\s+`` match of the same
        spaces counts (the module does not bail out at 4 bytes here)."""
        ruleset = build([("^\\s+|\\s+$", "", "g")], 4)
        body = TRIM.encode("latin-1")
        t = Transducer(ruleset, timeout=None)
        out = b"".join(t.feed(body[i : i + 1]) for i in range(len(body))) + t.finish()
        assert not t.bailed_out
        assert out == b"hello, world\nblah yeah\nhello\nbaby!\nabc"
