"""``python -m prexy rewrite``: apply rules files to stdin as the proxy would.

Operators test rules before deploying them::

    python -m prexy rewrite --rules site.rules [--rules more.rules] \\
        [--chunk-size N] [--end-apart] < page.html > out.html
    python -m prexy rewrite --rules site.rules --explain

``--explain`` prints each rule with the engine it runs on (``regex``, or
RE2 for the shapes a backtracking engine cannot bound) and why.

The body is read from stdin and fed to the same transducer the proxy uses,
in ``N``-byte chunks (default 64 KiB), each chunk's output written as soon
as the next chunk is read, so memory stays flat whatever the size of the
body.  The last chunk is fed with the end of the body
(``Transducer.finish(data)``), as nginx hands the replace-filter module a
static file (its last buffer carries the end) and as the proxy does once it
knows a body is complete: a match at the very end is decided with its data,
and nothing there counts against ``replace_filter_max_buffered_size``.
``--end-apart`` gives the end in a buffer of its own after the last chunk,
as nginx does for a proxied body (with a small limit, a match that needs
the end, such as ``\\s+$`` on the last blanks, then bails out).  A rules
file that does not load exits with status 1 and the error
(``file:line:column: reason``) on stderr.  The bail-out and timeout flags
are reported on stderr, since they change the output.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import BinaryIO

from prexy.substitution.rules import RulesError, load_rules
from prexy.substitution.transducer import Transducer

__all__ = ["main"]

#: Bytes read from stdin and fed at a time by default.
CHUNK = 64 * 1024


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prexy rewrite",
        description="Apply replace_filter rules files to stdin, write the result to stdout.",
    )
    parser.add_argument(
        "--rules",
        action="append",
        required=True,
        metavar="FILE",
        help="rules file (repeat for several; applied in order)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="print, per rule, the engine it runs on and why, then exit",
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=CHUNK,
        metavar="N",
        help=f"read and feed the input in N-byte chunks (default {CHUNK})",
    )
    parser.add_argument(
        "--end-apart",
        action="store_true",
        help="give the end of the body after the last chunk, on its own (as nginx does for a proxied body),"
        " instead of with the last chunk (as for a file)",
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
) -> int:
    """Run the ``rewrite`` command; return the exit status."""
    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.chunk_size <= 0:
        sys.stderr.write("prexy rewrite: --chunk-size must be positive\n")
        return 2
    try:
        ruleset = load_rules(args.rules)
    except RulesError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    sink = stdout if stdout is not None else sys.stdout.buffer
    if args.explain:
        sink.write(b"".join(line.encode("latin-1") + b"\n" for line in ruleset.explain()))
        sink.flush()
        return 0
    source = stdin if stdin is not None else sys.stdin.buffer
    transducer = Transducer(ruleset)
    # One chunk read ahead, so the last one is known when it is fed.
    data = source.read(args.chunk_size)
    while data:
        ahead = source.read(args.chunk_size)
        if not ahead and not args.end_apart:
            break
        sink.write(transducer.feed(data))
        data = ahead
    sink.write(transducer.finish(data))
    sink.flush()
    if transducer.bailed_out:
        sys.stderr.write(
            "prexy rewrite: replace_filter_max_buffered_size "
            f"({ruleset.max_buffered_size}) exceeded; the rest was passed through unchanged\n"
        )
    if transducer.timed_out:
        sys.stderr.write("prexy rewrite: scan timed out; the rest was passed through unchanged\n")
    return 0
