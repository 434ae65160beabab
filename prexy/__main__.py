"""``python -m prexy``: offline tools for operators.

``python -m prexy rewrite --rules FILE`` applies a rules file to stdin exactly
as the proxy would; ``python -m prexy map-lookup --map FILE KEY...`` prints
what a URL map gives for each key.  The proxy itself runs as ``twistd prexy``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: python -m prexy COMMAND [ARGS]

commands:
  rewrite      apply a rules file to stdin, write the result to stdout
  map-lookup   print what a map file gives for each key

The proxy itself runs as: twistd -n prexy --help
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; return the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "rewrite":
        from prexy.substitution.cli import main as rewrite_main

        return rewrite_main(rest)
    if command == "map-lookup":
        from prexy.urlmap.cli import main as map_main

        return map_main(rest)
    sys.stderr.write(f"prexy: unknown command {command!r}\n\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
