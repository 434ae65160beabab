"""The unit tier, found on disk: every test module under ``tests/`` but
``tests/integration``, run under ``twisted.trial``.

tox runs it (``python -m tests.tmpguard python -m tests.units ...``), so a
new unit-tier module runs without anyone listing it::

    python -m tests.units [TRIAL_OPTION...] [TEST...]
    python -m tests.units --list

The arguments go to trial as given; when none of them names a test
(options only, values attached with ``=``), the discovered modules are
added.  ``--list`` prints what would run, one name a line.

A unit-tier module is a ``test_*.py`` file directly in ``tests/``; a
package under ``tests/`` (a directory with ``__init__.py``) is named
whole, and trial collects the ``test_*.py`` modules inside it.  A
``test_*.py`` file trial could not import as part of a package is an
error, not something skipped in silence.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

#: The tests package.
TESTS = Path(__file__).resolve().parent
#: Directories of tests/ that are not the unit tier.
OTHER_TIERS = frozenset({"integration"})


class Stray(Exception):
    """A test module that trial would not find: outside any package."""


def discover(root: Path = TESTS, exclude: frozenset[str] = OTHER_TIERS) -> list[str]:
    """The dotted names (under ``root``'s package name) of the unit-tier
    modules and packages in ``root``, sorted."""
    package = root.name
    found = []
    for path in sorted(root.glob("test_*.py")):
        found.append(f"{package}.{path.stem}")
    for sub in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in exclude):
        tests = [p for p in sub.rglob("test_*.py") if "__pycache__" not in p.parts]
        if not tests:
            continue
        for test in tests:
            strays = [d for d in test.parents if d != root and root in d.parents and not (d / "__init__.py").exists()]
            if strays:
                raise Stray(f"{test.relative_to(root.parent)} is not in a package ({strays[-1].relative_to(root.parent)} "
                            "has no __init__.py): trial would never run it")
        found.append(f"{package}.{sub.name}")
    return sorted(found)


def trial_argv(argv: Sequence[str], modules: Sequence[str]) -> list[str]:
    """trial's arguments: ``argv``, plus ``modules`` when ``argv`` names no test."""
    names_a_test = any(not arg.startswith("-") for arg in argv)
    return [*argv] if names_a_test else [*argv, *modules]


def main(argv: Sequence[str]) -> int:
    modules = discover()
    if list(argv) == ["--list"]:
        sys.stdout.write("".join(f"{m}\n" for m in modules))
        return 0
    from twisted.scripts.trial import run

    sys.argv = ["trial", *trial_argv(argv, modules)]
    run()  # exits with trial's status
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
