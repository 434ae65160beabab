"""``prexy`` (``python -m prexy``): the operator's tools.

Offline: ``rewrite --rules FILE`` applies a rules file to stdin exactly as
the proxy would (``--explain`` numbers the rules and counts them on pages);
``map-lookup --map FILE KEY...`` prints what a URL map gives for each key.
Against a running Prexy (its admin endpoint, ``prexy.observe.cli``):
``log``, ``top``, ``hist`` and ``rules diff``.  The proxy itself runs as
``twistd prexy``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

USAGE = """usage: prexy COMMAND [ARGS]  (or python -m prexy COMMAND [ARGS])

commands:
  rewrite      apply a rules file to stdin, write the result to stdout
               (--explain: the rules numbered, and counted on pages)
  map-lookup   print what a map file gives for each key
  log          print each request as a running Prexy completes it
  top          live counters: rates, hit rate, errors, top sites and rules
  hist         latency histogram, hits against misses
  rules diff   what a draft rules file would change on a site's pages
  convert      nginx FILE -o DIR: a Prexy configuration (and REPORT.txt) from an nginx one

log, top, hist and rules find the running Prexy with --config FILE or --admin URL.
--version prints Prexy's version.

The proxy itself runs as: twistd -n prexy --help
"""


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch to a subcommand; return the process exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from prexy import __version__

        sys.stdout.write(f"prexy {__version__}\n")
        return 0
    command, rest = args[0], args[1:]
    if command == "rewrite":
        from prexy.substitution.cli import main as rewrite_main

        return rewrite_main(rest)
    if command == "map-lookup":
        from prexy.urlmap.cli import main as map_main

        return map_main(rest)
    if command == "convert":
        from prexy.nginxconf.cli import main as convert_main

        return convert_main(rest)
    if command in ("log", "top", "hist", "rules"):
        from prexy.observe import cli

        run = {"log": cli.log_main, "top": cli.top_main, "hist": cli.hist_main, "rules": cli.rules_main}[command]
        return run(rest)
    sys.stderr.write(f"prexy: unknown command {command!r}\n\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
