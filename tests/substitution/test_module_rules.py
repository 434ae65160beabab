"""Where replace-filter's engine is not Perl: the restart rule and the bail-out count.

Each case is the module's output (examples run through the module itself,
and their neighbours worked out from sregex's and the module's sources; see
``shared/docs/substitution.md``).  The restart rule's cases must give the
same bytes at every chunking: whole, byte by byte, and cut in two anywhere.
The bail-out cases are fed in the buffers they name, since the module
checks its limit at the end of each buffer.
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


def feed(ruleset: RuleSet, pieces: list[bytes]) -> bytes:
    t = Transducer(ruleset, timeout=None)
    return b"".join(t.feed(p) for p in pieces) + t.finish()


RESTART_CASES: list[tuple[str, list[Spec], str, str]] = [
    # The examples.
    ("later rule ends a line", [("^b", "X", "g"), ("\n", "N\n", "g")], "a\nb", "aN\nb"),
    ("\\b after a later rule", [("\\bc", "C", "g"), ("b", "B", "g")], "bc", "BC"),
    ("\\B after a later rule", [("\\Bx", "Y", "g"), ("b", "B", "g")], "bx", "Bx"),
    (
        "blank-line squeezer after a leading-space rule",
        [("^[ \t]+", "", "g"), ("\\s*\n\\s*\n", "\n", "g")],
        "\n\n ",
        "\n ",
    ),
    (
        "^ after an earlier rule that did not end a line",
        [("\\s*\n\\s*\n", "\n", "g"), ("<!--.*?-->", "", "g"), ("^[ \t]+", "", "g")],
        "\n\n<!----> ",
        "\n",
    ),
    # Neighbours: only a match of rule 0 sets what the assertions see.
    ("rule 0 gives the real byte", [("b", "B", "g"), ("\\bc", "C", "g")], "bc", "Bc"),
    ("an earlier rule that is not rule 0", [("x", "X", "g"), ("b", "B", "g"), ("\\bc", "C", "g")], "bc", "BC"),
    ("the latest rule-0 match counts", [("[\nq]", "_", "g"), ("x", "X", "g"), ("^b", "B", "g")], "\nxb qxb", "_XB _Xb"),
    ("a fired once-rule 0 still sets it", [("\n", "N", ""), ("x", "Y", "g"), ("^b", "B", "g")], "\nxb\nxb", "NYB\nYB"),
    ("other rules' newlines never do", [("a", "A", ""), ("\n", "N", "g"), ("^b", "B", "g")], "\nb a\nb", "Nb ANb"),
    ("the real byte elsewhere", [("a", "A", "g"), ("\\bb", "B", "g")], "a b", "A B"),
    ("rule 0 with a trailing \\b", [("\\w+\\b", "W", "g"), ("\\B ", "_", "g")], "ab cd", "W W"),
    ("a beaten rule 0 does not count", [("b\n", "[b]", "g"), ("ab\nc", "[abc]", "g"), ("^d", "D", "g")], "ab\ncd", "[abc]d"),
    ("^ after a real newline", [("q", "Q", "g"), ("^b", "X", "g")], "q\nb", "Q\nX"),
    ("the stream start is a line start", [("a", "A", "g"), ("^b", "B", "g")], "ba", "BA"),
]


def _chunkings(body: bytes) -> list[list[bytes]]:
    ways = [[body], [body[i : i + 1] for i in range(len(body))]]
    ways += [[body[:i], body[i:]] for i in range(1, len(body))]
    return ways


BODY_3A = b"<t>" + b"a\n " * 3400 + b"</t>\n q"


BODY_3B = b"x//" + b"a" * 10000 + b"\ny"


BODY_9 = b"x//" + b"a" * 8191 + b"\ny" + b"z" * 8


def _keep_space_at_5(body: bytes) -> bytes:
    return body[:5] + body[6:]


BAIL_CASES = [
    # (rules, body, buffer size, limit, expected output, bailed)
    ("3a: the kept-apart match takes rule 0's replacement",
     [("^ +", "", "g"), ("<t>.*?</t>", "T", "g")], BODY_3A, 1024, None, _keep_space_at_5(BODY_3A), True),
    ("3a, limit 1000: overflow in the first buffer, nothing replaced",
     [("^ +", "", "g"), ("<t>.*?</t>", "T", "g")], BODY_3A, 1024, 1000, BODY_3A, True),
    ("3a, rules swapped: the last rule to complete is rule 0 (T)",
     [("<t>.*?</t>", "T", "g"), ("^ +", "", "g")], BODY_3A, 1024, None, BODY_3A[:5] + b"T" + BODY_3A[6:], True),
    ("3a with captures: the match counts, nothing replaced",
     [("^ +", "[$&]", "g"), ("<t>.*?</t>", "T", "g")], BODY_3A, 1024, None, BODY_3A, True),
    ("3b without captures: the match is not counted",
     [("//[^\n]*", "", "g")], BODY_3B, 1024, None, b"x\ny", False),
    ("3b with captures, 1 KB buffers: bails",
     [("//[^\n]*", "[$&]", "g")], BODY_3B, 1024, None, BODY_3B, True),
    ("3b with captures, 4 KB buffers: no buffer ends past the limit",
     [("//[^\n]*", "[$&]", "g")], BODY_3B, 4096, None, b"x[" + BODY_3B[1:-2] + b"]\ny", False),
    ("8193 held bytes in one buffer: over the limit",
     [("//[^\n]*", "[$&]", "g")], BODY_9, 8194, None, BODY_9, True),
    ("8192 held bytes: at the limit, not over",
     [("//[^\n]*", "[$&]", "g")], BODY_9, 8195, None, b"x[" + BODY_9[1:8194] + b"]\ny" + b"z" * 8, False),
]


@expand
class ModuleRulesTests(SynchronousTestCase):
    @parametrize(
        ("specs", "body", "expected"),
        [param(s, b, e, id=name) for name, s, b, e in RESTART_CASES],
    )
    def test_restart_rule(self, specs: list[Spec], body: str, expected: str) -> None:
        """``^ \\b \\B`` right after a match see the class of rule 0's last
        matched byte, at every chunking."""
        ruleset = build(specs)
        for pieces in _chunkings(body.encode("latin-1")):
            assert feed(ruleset, pieces) == expected.encode("latin-1"), pieces

    def test_restart_rule_on_a_long_body(self) -> None:
        """The rule holds across slices of a long body (matches right at the
        ends of slices, restarts decided with the next slice)."""
        specs = [("^[ \t]+", "", "g"), ("\\s*\n\\s*\n", "\n", "g")]
        unit = "\n\n x\n  y\n"
        body = (unit * 2000).encode()
        ruleset = build(specs)
        whole = feed(ruleset, [body])
        # Rule 1 squeezes each blank line and the next line's space survives;
        # rule 0 strips the space after a plain newline.
        assert whole == ("\n x\ny" * 2000 + "\n").encode()
        for size in (1, 7, 64, 4096):
            assert feed(ruleset, [body[i : i + size] for i in range(0, len(body), size)]) == whole

    @parametrize(
        ("specs", "body", "size", "limit", "expected", "bailed"),
        [param(*c[1:], id=c[0]) for c in BAIL_CASES],
    )
    def test_bail_out_count(
        self,
        specs: list[Spec], body: bytes, size: int, limit: int | None, expected: bytes, bailed: bool
    ) -> None:
        """The module's count of held bytes, at the end of each buffer."""
        ruleset = build(specs, limit)
        t = Transducer(ruleset, timeout=None)
        out = b"".join(t.feed(body[i : i + size]) for i in range(0, len(body), size)) + t.finish()
        assert t.bailed_out is bailed
        assert out == expected
