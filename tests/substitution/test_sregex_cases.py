"""The sregex engine's own test suite, run through Prexy's dialect translation.

Every case of ``sregex_cases.json`` is parsed with Prexy's sregex parser and
run through :class:`RegexScanner` (the scanner the transducer uses), comparing
match offsets, captures, the matching regex in multi mode, and refusals: with
each rule on the engine the scanner picks (``regex``, or RE2 for the shapes
``regex`` cannot bound) and with every rule on RE2.  No case is skipped for
being unsafe.
"""

from __future__ import annotations

from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution.dialect import DialectError, parse_sregex
from prexy.substitution.scanner import RegexScanner
from tests.cases import expand, param, parametrize

from .shared import SKIP_REASON, load_cases

CASES = load_cases("sregex_cases.json")


def _ids() -> list[Any]:
    if CASES is None:
        return [param(None, id="absent")]
    return [param(c, id=f"{c['file']}:{c['name']}:{i}") for i, c in enumerate(CASES)]


def _compile(case: dict[str, Any], linear: str = "auto") -> tuple[RegexScanner, list[Any]]:
    regs = case["regex"] if case["multi"] else [case["regex"]]
    if case["multi"]:
        flags = (case["flags"].split(" ") + [""] * len(regs))[: len(regs)]
    else:
        flags = [case["flags"]]
    parsed = [parse_sregex(r.encode("latin-1"), "i" in f) for r, f in zip(regs, flags, strict=True)]
    return RegexScanner(parsed, linear=linear), parsed


@expand
class SregexCasesTests(SynchronousTestCase):
    skip = SKIP_REASON if CASES is None else None

    @parametrize("linear", ["auto", "all"])
    @parametrize("case", _ids())
    def test_sregex_case(self, case: dict[str, Any], linear: str) -> None:
        """Same refusal, or same match offsets, captures and matching regex."""
        expected = case["expected"]
        refused = "error" in expected or "error_like" in expected
        if refused:
            with self.assertRaises(DialectError):
                _compile(case, linear)
            return
        try:
            scanner, parsed = _compile(case, linear)
        except DialectError:
            assert expected.get("fatal_allowed"), "refused a pattern sregex accepts"
            return
        found = scanner.find(case["input"].encode("latin-1"), 0, timeout=5.0)
        if not expected["match"]:
            assert found is None
            return
        assert found is not None
        spans = [list(found.span(k)) for k in range(found.ngroups + 1)]
        while spans and spans[-1] == [-1, -1]:
            spans.pop()
        if "match_id" in expected:
            assert found.rule == expected["match_id"]
        if "captures" in expected:
            assert spans == expected["captures"]
        elif "captures_like" in expected:
            assert spans[0] == [0, 2]
