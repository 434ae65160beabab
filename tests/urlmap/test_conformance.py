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

from twisted.trial.unittest import SynchronousTestCase

from prexy.urlmap import UrlMap, load_map
from prexy.urlmap.values import compile_value, render
from tests.cases import expand, parametrize, tmp_dir
from tests.urlmap.helpers import shared_dir, write_case_map

SHARED = shared_dir()
CASES: list[dict[str, Any]] = (
    json.loads((SHARED / "conformance" / "map_cases.json").read_text(encoding="utf-8"))
    if SHARED is not None
    else []
)

SKIP_REASON = "shared/conformance/map_cases.json not found (set PREXY_SHARED or put shared/ beside the repo)"


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


@expand
class ConformanceTests(SynchronousTestCase):
    skip = SKIP_REASON if SHARED is None else None

    @parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
    def test_map_case(self, case: dict[str, Any]) -> None:
        """The map gives nginx's observed value for the case's input."""
        tmp_path = tmp_dir(self)
        value = _evaluate(case, tmp_path)
        template = case.get("return_template")
        if template is not None:
            assert value == case["expected_map_value"]
            variable = case["map"]["variable"].lstrip("$")
            value = render(compile_value(template), None, frozenset(), {variable: value}.get)
        assert value == case["expected"]

    def test_all_cases_present(self) -> None:
        """The shared file holds the 45 cases this suite is meant to run."""
        assert len(CASES) == 45
