"""nginx's own map tests (shared/conformance/map_cases.json) give ``expected``.

Each case's map (and the maps its values refer to) is written as nginx map
files, loaded with :func:`prexy.urlmap.load_map` and looked up; variables
that are other maps are looked up with the same input, as nginx evaluates
them, and ``vars`` supplies plain request variables.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prexy.urlmap import UrlMap, load_map
from prexy.urlmap.values import compile_value, render
from tests.urlmap.helpers import shared_dir, write_case_map

SHARED = shared_dir()
CASES: list[dict[str, Any]] = (
    json.loads((SHARED / "conformance" / "map_cases.json").read_text(encoding="utf-8"))
    if SHARED is not None
    else []
)

pytestmark = pytest.mark.skipif(
    SHARED is None,
    reason="shared/conformance/map_cases.json not found (set PREXY_SHARED or put shared/ beside the repo)",
)


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['file']}:{case['name']}:{case['map']['variable']}:{case['input']}"


def _evaluate(case: dict[str, Any], tmp_path: Path) -> str:
    """Look the case's input up in its map, resolving other maps and vars."""
    maps: dict[str, UrlMap] = {}
    for index, (variable, spec) in enumerate(
        [(case["map"]["variable"], case["map"]), *case["other_maps"].items()]
    ):
        directory = tmp_path / f"m{index}"
        directory.mkdir()
        maps[variable] = load_map(write_case_map(spec, directory, "main.map"))
    key = case["input"]

    def resolve(name: str) -> str | None:
        other = maps.get("$" + name)
        if other is not None:
            return other.lookup(key, resolve)
        vars_: dict[str, str] = case["vars"]
        return vars_.get(name)

    return maps[case["map"]["variable"]].lookup(key, resolve)


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_map_case(case: dict[str, Any], tmp_path: Path) -> None:
    """The map gives nginx's observed value for the case's input."""
    value = _evaluate(case, tmp_path)
    template = case.get("return_template")
    if template is not None:
        assert value == case["expected_map_value"]
        variable = case["map"]["variable"].lstrip("$")
        value = render(compile_value(template), None, frozenset(), {variable: value}.get)
    assert value == case["expected"]


def test_all_cases_present() -> None:
    """The shared file holds the 45 cases this suite is meant to run."""
    assert len(CASES) == 45
