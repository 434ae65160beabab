"""``prexy convert nginx FILE -o DIR``: write a Prexy configuration made from
an nginx one (``prexy.nginxconf.convert``) into DIR: ``prexy.toml``, the
rules and map files, and ``REPORT.txt``, every directive not converted."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TextIO


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prexy convert",
        description="Convert an nginx configuration (with its includes) into a Prexy one.",
    )
    parser.add_argument("kind", choices=["nginx"], help="the configuration's kind")
    parser.add_argument("file", help="the nginx configuration file (nginx.conf)")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="write prexy.toml, rules/, maps/ and REPORT.txt here")
    parser.add_argument("--prefix", metavar="DIR",
                        help="what relative include and certificate names are relative to "
                             "(nginx's -p prefix; default: the file's directory)")
    return parser


def main(argv: Sequence[str] | None = None, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run the command; return the exit status (0, 1 for an nginx file nginx
    would refuse or an output that cannot be written, 2 for usage)."""
    from prexy.nginxconf.convert import convert
    from prexy.nginxconf.parser import NginxConfigError, load

    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    prefix = args.prefix or os.path.dirname(os.path.abspath(args.file))
    try:
        directives = load(args.file, args.prefix)
    except NginxConfigError as exc:
        err.write(f"prexy convert: [emerg] {exc}\n")
        return 1
    result = convert(directives, prefix)
    try:
        for path, data in result.files.items():
            target = os.path.join(args.output, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "wb") as f:
                f.write(data)
    except OSError as exc:
        err.write(f"prexy convert: {exc}\n")
        return 1
    skipped = len(result.of_kind("skipped"))
    differs = len(result.of_kind("differs"))
    out.write(f"wrote {os.path.join(args.output, 'prexy.toml')}: {len(result.sites)} site(s); "
              f"{skipped} directive(s) not converted, {differs} converted with a difference: "
              f"see {os.path.join(args.output, 'REPORT.txt')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
