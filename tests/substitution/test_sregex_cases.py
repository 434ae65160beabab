"""The sregex engine's own test suite, run through Prexy's dialect translation.

Every case of ``sregex_cases.json`` is parsed with Prexy's sregex parser and
run with the ``regex`` package through :class:`RegexScanner` (the scanner the
transducer uses), comparing match offsets, captures, the matching regex in
multi mode, and refusals.
"""

from __future__ import annotations

from typing import Any

import pytest

from prexy.substitution.dialect import DialectError, check_pathological, parse_sregex
from prexy.substitution.scanner import RegexScanner

from .conftest import SKIP_REASON, load_cases

CASES = load_cases("sregex_cases.json")
pytestmark = pytest.mark.skipif(CASES is None, reason=SKIP_REASON)


def _ids() -> list[Any]:
    if CASES is None:
        return [pytest.param(None, id="absent")]
    return [pytest.param(c, id=f"{c['file']}:{c['name']}:{i}") for i, c in enumerate(CASES)]


def _compile(case: dict[str, Any]) -> tuple[RegexScanner, list[Any]]:
    regs = case["regex"] if case["multi"] else [case["regex"]]
    if case["multi"]:
        flags = (case["flags"].split(" ") + [""] * len(regs))[: len(regs)]
    else:
        flags = [case["flags"]]
    parsed = [parse_sregex(r.encode("latin-1"), "i" in f) for r, f in zip(regs, flags, strict=True)]
    return RegexScanner(parsed), parsed


@pytest.mark.parametrize("case", _ids())
def test_sregex_case(case: dict[str, Any]) -> None:
    """Same refusal, or same match offsets, captures and matching regex."""
    expected = case["expected"]
    refused = "error" in expected or "error_like" in expected
    if refused:
        with pytest.raises(DialectError):
            _compile(case)
        return
    try:
        scanner, parsed = _compile(case)
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


def test_safety_check_refuses_few_conformance_patterns() -> None:
    """The load-time safety check is a policy on top of the dialect.

    It refuses only patterns with an unbounded repeat over overlapping
    alternatives or over two repeats sharing bytes; in the sregex suite that
    is a small, known share (34 of 1988 cases at the time of writing).
    """
    assert CASES is not None
    refused = 0
    for case in CASES:
        try:
            _scanner, parsed = _compile(case)
        except DialectError:
            continue
        if any(check_pathological(p.tree) for p in parsed):
            refused += 1
    assert refused <= 40
