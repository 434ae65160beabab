"""The replace-filter conformance cases, checked against the real nginx module.

Each case of ``replace_filter_cases.json`` is replayed through a
:class:`Transducer`; the expected bodies come from a real build of nginx +
replace-filter-nginx-module + sregex.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.prefilter import ENGINES as FILTER_ENGINES
from prexy.substitution.rules import compile_rule, parse_rules
from prexy.substitution.ruleset import RuleSet
from prexy.substitution.transducer import Transducer
from tests.cases import expand, param, parametrize

from .shared import SKIP_REASON, TRIM_CASES, TRIM_PAGE, load_cases

#: Every prefilter engine available here, and none (each rule scans).
ENGINES = [*FILTER_ENGINES, "none"]

CASES = load_cases("replace_filter_cases.json")


def _cases(*categories: str) -> list[Any]:
    if CASES is None:
        return [param(None, id="absent")]
    return [
        param(c, id=f"{c['file']}:{c['name']}") for c in CASES if c["category"] in categories
    ]


def _b(s: str) -> bytes:
    return s.encode("latin-1")


def _pieces(case: dict[str, Any], feeding: str) -> list[bytes]:
    """The case's body cut as ``feeding`` says: its recorded nginx buffers
    or chunks, whole, or byte by byte."""
    body = _b("".join(case["chunks"]))
    return {
        "bufs": [_b(x) for x in case["bufs"]],
        "chunks": [_b(x) for x in case["chunks"]],
        "whole": [body],
        "bytewise": [body[i : i + 1] for i in range(len(body))],
    }[feeding]


def build(
    case: dict[str, Any], max_buffered_size: int | None, engine: str | None = None
) -> RuleSet:
    """The case's rules as a RuleSet (rules are given already unescaped)."""
    rules = [
        compile_rule(_b(r["pattern"]), _b(r["replacement"]), r["flags"])
        for r in case["rules"]
    ]
    return RuleSet.build(
        rules, types=case["types"], max_buffered_size=max_buffered_size, engine=engine
    )


def run(ruleset: RuleSet, pieces: list[bytes], eof_with_last: bool = False) -> bytes:
    """Feed ``pieces``; the end of body comes with the last piece if asked."""
    t = Transducer(ruleset)
    out = []
    for i, piece in enumerate(pieces):
        if eof_with_last and i == len(pieces) - 1:
            out.append(t.finish(piece))
            return b"".join(out)
        out.append(t.feed(piece))
    out.append(t.finish())
    return b"".join(out)


def body_or_passthrough(
    case: dict[str, Any], ruleset: RuleSet, pieces: list[bytes], eof_with_last: bool = False
) -> bytes:
    """What the proxy sends: rewritten when the filter applies, else as is."""
    if not ruleset.applies_to(case["content_type"]):
        return b"".join(pieces)
    return run(ruleset, pieces, eof_with_last)


def nginx_quote(raw: bytes) -> bytes:
    """Quote ``raw`` so that nginx's tokenizer gives ``raw`` back."""
    return b"'" + raw.replace(b"\\", b"\\\\").replace(b"'", b"\\'") + b"'"


@expand
class ConformanceTests(SynchronousTestCase):
    skip = SKIP_REASON if CASES is None else None

    @parametrize("case", _cases("core", "passthrough", "eof_with_data"))
    @parametrize("feeding", ["bufs", "chunks", "whole", "bytewise"])
    @parametrize("engine", ENGINES)
    def test_case_any_chunking(self, case: dict[str, Any], feeding: str, engine: str) -> None:
        """The expected body comes out however the body is cut into pieces.

        The pieces are fed with the module's default buffer limit: these cases do
        not depend on the limit (see test_core_cases_with_recorded_limit for the
        limits recorded with them).  Every prefilter engine gives the same bytes.
        """
        pieces = _pieces(case, feeding)
        limit = case.get("max_buffered_size") if case["category"] == "eof_with_data" else None
        eof_with_last = feeding in ("bufs", "chunks") and case["last_chunk_has_eof"]
        if case["category"] == "eof_with_data" and not eof_with_last:
            limit = None
        ruleset = build(case, limit, engine)
        assert ruleset.applies_to(case["content_type"]) == case["filter_applies"]
        assert body_or_passthrough(case, ruleset, pieces, eof_with_last) == _b(case["expected_body"])

    @parametrize("case", _cases("max_buffered", "eof_with_data"))
    @parametrize("engine", ENGINES)
    def test_case_with_recorded_limit(self, case: dict[str, Any], engine: str) -> None:
        """With the recorded limit and buffers, the module's bail-out is reproduced."""
        ruleset = build(case, case.get("max_buffered_size"), engine)
        pieces = [_b(x) for x in case["bufs"]]
        assert run(ruleset, pieces, case["last_chunk_has_eof"]) == _b(case["expected_body"])

    @parametrize("case", _cases("core"))
    def test_core_cases_with_recorded_limit(self, case: dict[str, Any]) -> None:
        """With the recorded bufs and (often tiny) limit, the module's output exactly.

        This pins the buffer accounting: only held bytes before the match found
        so far count against the limit, as in the module.
        """
        ruleset = build(case, case.get("max_buffered_size"))
        pieces = [_b(x) for x in case["bufs"]]
        t = Transducer(ruleset)
        out = b"".join(t.feed(p) for p in pieces[:-1])
        if case["last_chunk_has_eof"]:
            out += t.finish(pieces[-1])
        else:
            out += t.feed(pieces[-1]) + t.finish()
        assert out == _b(case["expected_body"])

    @parametrize("case", _cases("sregex_quirk"))
    @parametrize("feeding", ["bufs", "chunks", "whole", "bytewise"])
    @parametrize("engine", ENGINES)
    def test_sregex_quirk(self, case: dict[str, Any], feeding: str, engine: str) -> None:
        """``^\\s+|\\s+$`` inside one rule: the module's bytes, not Perl's.

        On ``baby!\\n     \\nabc`` the module matches the second line's blanks
        as ``^\\s+`` starting after the newline, where Perl takes ``\\s+$``
        starting at the newline itself (sregex tests ``$`` one byte later,
        when the ``^\\s+`` thread has already reached the rule's end).  The
        rule runs on the sregex-order VM (:mod:`prexy.substitution.pikevm`)
        and gives the module's output however the body is cut.
        """
        pieces = _pieces(case, feeding)
        ruleset = build(case, None, engine)
        assert [e for _, e, _ in ruleset.engines()] == ["sregex-vm"]
        eof_with_last = feeding in ("bufs", "chunks") and case["last_chunk_has_eof"]
        assert run(ruleset, pieces, eof_with_last) == _b(case["expected_body"])

    @parametrize("case", _cases("sregex_quirk"))
    def test_sregex_quirk_with_recorded_limit(self, case: dict[str, Any]) -> None:
        """With the recorded buffers and limit, the module's output too."""
        ruleset = build(case, case.get("max_buffered_size"))
        pieces = [_b(x) for x in case["bufs"]]
        assert run(ruleset, pieces, case["last_chunk_has_eof"]) == _b(case["expected_body"])

    @parametrize("case", _cases("core", "passthrough", "eof_with_data"))
    def test_case_through_a_rules_file(self, case: dict[str, Any]) -> None:
        """Written as an nginx rules file and loaded, each case gives the same body.

        Cases run through ``twistd prexy --rules`` reach the transducer this way,
        so this checks the token unescaping against the module's own inputs.
        """
        lines = [b"replace_filter_types " + b" ".join(_b(t) for t in case["types"]) + b";"]
        for r in case["rules"]:
            flags = (b" " + _b(r["flags"])) if r["flags"] else b""
            lines.append(
                b"replace_filter "
                + nginx_quote(_b(r["pattern"]))
                + b" "
                + nginx_quote(_b(r["replacement"]))
                + flags
                + b";"
            )
        ruleset = parse_rules(b"\n".join(lines), "case.rules")
        assert [r.pattern for r in ruleset.rules] == [_b(r["pattern"]) for r in case["rules"]]
        assert [r.replacement for r in ruleset.rules] == [_b(r["replacement"]) for r in case["rules"]]
        pieces = [_b(x) for x in case["chunks"]]
        out = body_or_passthrough(case, ruleset, pieces, case["last_chunk_has_eof"])
        assert out == _b(case["expected_body"])


@expand
class WholeBodyTrimTests(SynchronousTestCase):
    """The module's trim tests on a body that comes whole (``TRIM_CASES``,
    two of them not in the shared cases), at the limit of 0 they were
    written with: given with the end in its last piece, as the module gets a
    static file, each gives the module's bytes and no bail-out, on every
    prefilter engine and through a rules file; the end given apart holds the
    last blanks past the limit, and substitution stops there."""

    @parametrize("case", [param(c, id=c[0]) for c in TRIM_CASES])
    @parametrize("engine", ENGINES)
    def test_with_the_end(self, case: tuple[str, bytes, bytes, bytes], engine: str) -> None:
        _, pattern, replacement, expected = case
        ruleset = RuleSet.build([compile_rule(pattern, replacement, "g")], max_buffered_size=0, engine=engine)
        t = Transducer(ruleset)
        assert t.finish(TRIM_PAGE) == expected
        assert not t.bailed_out
        rules = b"replace_filter_max_buffered_size 0;\nreplace_filter %s %s g;\n" % (
            nginx_quote(pattern), nginx_quote(replacement)
        )
        assert Transducer(parse_rules(rules, "trim.rules")).finish(TRIM_PAGE) == expected

    @parametrize("case", [param(c, id=c[0]) for c in TRIM_CASES])
    def test_end_apart(self, case: tuple[str, bytes, bytes, bytes]) -> None:
        _, pattern, replacement, expected = case
        t = Transducer(RuleSet.build([compile_rule(pattern, replacement, "g")], max_buffered_size=0))
        out = t.feed(TRIM_PAGE) + t.finish()
        assert t.bailed_out
        assert out.endswith(b"abc\n") and not expected.endswith(b"abc\n")
