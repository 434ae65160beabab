"""``python -m prexy map-lookup --map FILE KEY...``: what a map gives for keys.

Prints one line per key: the value nginx's ``map`` would give, or an empty
line for none.  A map that does not load prints its error (file:line: ...)
on stderr and exits 1.  Keys and values are handled as bytes (latin-1), the
way nginx sees them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import BinaryIO

from prexy.urlmap.errors import MapError
from prexy.urlmap.loader import load_map


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prexy map-lookup",
        description="Print the value a map file gives for each KEY (empty line: no value).",
    )
    parser.add_argument("--map", required=True, metavar="FILE", help="the map file")
    parser.add_argument(
        "--var", action="append", default=[], metavar="NAME=VALUE",
        help="a variable values may refer to (repeatable)",
    )
    parser.add_argument("keys", nargs="*", metavar="KEY", help="keys to look up, e.g. request URIs")
    return parser


def main(argv: Sequence[str] | None = None, stdout: BinaryIO | None = None) -> int:
    """Run the command; return the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    out = stdout if stdout is not None else sys.stdout.buffer
    variables: dict[str, str] = {}
    for item in args.var:
        name, sep, value = item.partition("=")
        if not sep:
            sys.stderr.write(f"map-lookup: --var needs NAME=VALUE, got {item!r}\n")
            return 2
        variables[name] = _latin1(value)
    try:
        urlmap = load_map(args.map)
    except MapError as exc:
        sys.stderr.write(f"map-lookup: {exc}\n")
        return 1
    for key in args.keys:
        out.write(urlmap.lookup(_latin1(key), variables).encode("latin-1", "replace") + b"\n")
    out.flush()
    return 0


def _latin1(arg: str) -> str:
    """The command-line argument's bytes, one character per byte."""
    return os.fsencode(arg).decode("latin-1")


if __name__ == "__main__":
    sys.exit(main())
