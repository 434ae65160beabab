"""Shared test helpers: where ``shared/`` is, and writing map files from case data."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_dir() -> Path | None:
    """The project's shared/ directory: $PREXY_SHARED, else ../shared beside the repo."""
    env = os.environ.get("PREXY_SHARED")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared")
    candidates.append(REPO_ROOT / "tests" / "shared")  # the copies kept in the checkout
    for path in candidates:
        if (path / "conformance" / "map_cases.json").is_file():
            return path
    return None


_SPECIAL = set(" \t\r\n;{}\"'#\\")


def quote_value(value: str) -> str:
    """Write a value as an nginx token that unescapes back to ``value``."""
    if value and not _SPECIAL.intersection(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_case_map(spec: dict[str, Any], directory: Path, name: str) -> Path:
    """Write a map described like ``map_cases.json``'s ``map`` as nginx files.

    Entries marked ``from_include`` go to that file, spliced by an
    ``include`` at the position of the first of them.
    """
    lines: list[str] = []
    if spec.get("hostnames"):
        lines.append("hostnames;")
    if spec.get("volatile"):
        lines.append("volatile;")
    if spec.get("default") is not None:
        lines.append(f"default {quote_value(spec['default'])};")
    included: dict[str, list[str]] = {}
    for entry in spec["entries"]:
        line = f"{entry['raw_key']} {quote_value(entry['value'])};"
        target = entry.get("from_include")
        if target:
            if target not in included:
                included[target] = []
                lines.append(f"include {target};")
            included[target].append(line)
        else:
            lines.append(line)
    for target, body in included.items():
        (directory / target).write_text("\n".join(body) + "\n", encoding="latin-1")
    path = directory / name
    path.write_text("\n".join(lines) + "\n", encoding="latin-1")
    return path
