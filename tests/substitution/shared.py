"""Shared data for the substitution tests: the conformance cases.

The conformance cases live in ``shared/conformance`` beside the checkout
(``../shared`` from the repository root) or wherever ``PREXY_SHARED`` points;
copies are kept in ``tests/shared/conformance`` for a fresh clone (CI).
Tests that need them are skipped, with the reason, when none is found.
Hypothesis settings are given per test (``PREXY_HYPOTHESIS_EXAMPLES`` raises
the example count of the chunking property); the profiles are in
``tests/__init__.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def shared_dir() -> Path | None:
    """The shared/ directory holding docs and conformance cases, if present."""
    candidates = []
    env = os.environ.get("PREXY_SHARED")
    if env:
        candidates.append(Path(env))
    candidates.append(REPO_ROOT.parent / "shared")
    candidates.append(REPO_ROOT / "tests" / "shared")  # the copies kept in the checkout
    for c in candidates:
        if (c / "conformance").is_dir():
            return c
    return None


def load_cases(name: str) -> list[dict[str, Any]] | None:
    """Load ``conformance/<name>``; None when shared/ is not available."""
    base = shared_dir()
    if base is None:
        return None
    path = base / "conformance" / name
    if not path.exists():
        return None
    with open(path, encoding="utf-8") as fh:
        data: list[dict[str, Any]] = json.load(fh)
    return data


SKIP_REASON = "conformance cases not found: set PREXY_SHARED or put shared/ beside the checkout"


#: The module's tests whose body comes whole (a static file: the end is in
#: its last buffer) and ends in blanks that ``\s+$`` removes, with
#: ``replace_filter_max_buffered_size 0``: (test, pattern, replacement,
#: expected body).  Copied from replace-filter-nginx-module's t/01-sanity.t
#: and t/04-capturing.t (the body is the ``a.html`` user file).
TRIM_PAGE = b"  hello, world  \nblah yeah\nhello  \n   baby!\n     \nabc\n"
TRIM_CASES = [
    ("01-sanity.t TEST 21", b"\\s+$", b"", b"  hello, world\nblah yeah\nhello\n   baby!\nabc"),
    ("01-sanity.t TEST 22", b"^\\s+|\\s+$", b"", b"hello, world\nblah yeah\nhello\nbaby!\nabc"),
    ("04-capturing.t TEST 21", b"\\s+$", b"[$&]", b"  hello, world[  ]\nblah yeah\nhello[  ]\n   baby![\n     ]\nabc[\n]"),
    (
        "04-capturing.t TEST 22", b"^\\s+|\\s+$", b"[$&]",
        b"[  ]hello, world[  ]\nblah yeah\nhello[  ]\n[   ]baby!\n[     \n]abc[\n]",
    ),
]


def cut(body: bytes, sizes: list[int]) -> list[bytes]:
    """``body`` in pieces of ``sizes``, taken in turn, the last cut short."""
    pieces = []
    at = k = 0
    while at < len(body):
        pieces.append(body[at : at + sizes[k % len(sizes)]])
        at += sizes[k % len(sizes)]
        k += 1
    return pieces
