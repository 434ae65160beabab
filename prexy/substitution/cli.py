"""``python -m prexy rewrite``: apply rules files to stdin as the proxy would.

Operators test rules before deploying them::

    python -m prexy rewrite --rules site.rules [--rules more.rules] \\
        [--chunk-size N] [--end-apart] < page.html > out.html
    python -m prexy rewrite --rules site.rules --explain [--json]
    python -m prexy rewrite --rules site.rules --explain [--json] PAGE [PAGE ...]

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

``--explain``
-------------

Rules are numbered 1, 2, ... in the rule set's order (files in the order
given, lines in file order), the numbers every view of a running Prexy
uses (``/metrics``, the admin API, ``prexy log --rule N``).  Without a
page, one line per rule names its number, where it was written, its
pattern and flags (``-`` for none), the engine it runs on (``regex``,
``re2`` for the shapes a backtracking engine cannot bound, ``sregex-vm``)
and why::

    1 site.rules:3: 'www\\.example\\.com' g: regex: runs in bounded time on regex

With pages (``PAGE`` arguments, ``-`` for stdin; or, with no ``PAGE``,
stdin when it is not a terminal and not empty), each page is rewritten
exactly as without ``--explain`` (same transducer, same chunking and
options; the output is discarded), and the counts are the transducer's own
``rule_counts``: one line per rule, then one per rule that matched nothing,
then the totals::

    1 site.rules:3 matches=120 pages=3 bytes=1320 'www\\.example\\.com' g
    2 site.rules:4 matches=0 pages=0 bytes=0 'old-cdn\\.net' g
    never 2 site.rules:4 'old-cdn\\.net' g
    total pages=3 matches=120 bytes=1320

``matches`` are the rule's substitutions (a once-rule's later matches,
given unchanged, are not), ``pages`` the pages where it made one,
``bytes`` the input bytes they replaced.  Fields are separated by single
spaces and the pattern comes last (it may hold spaces): ``grep '^3 '``
gives rule 3, ``grep '^never '`` the rules that matched nothing.  A page
whose rewrite bailed out or timed out is named on stderr.

``--json`` prints one object instead: ``{"rules": [{"number", "file",
"line", "pattern", "flags", "engine", "why"}]}`` without pages; with
pages each rule also has ``"matches"``, ``"pages"`` and
``"bytes_changed"``, and the object ``"never_matched"`` (rule numbers) and
``"pages"`` (how many were read).  Patterns and file names are decoded as
latin-1; ``line`` is null where unknown.  A page that cannot be read exits
with status 1 and the reason on stderr, before anything is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, BinaryIO

from prexy.substitution.rules import RulesError, load_rules
from prexy.substitution.transducer import Transducer

if TYPE_CHECKING:
    from prexy.substitution.ruleset import RuleSet

__all__ = ["Tally", "main", "rewrite_stream"]

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
        help="print the rules, numbered, with the engine each runs on and why; with pages,"
        " each rule's substitutions on them, then exit",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="with --explain: print one JSON object instead of lines",
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
    parser.add_argument(
        "pages",
        nargs="*",
        metavar="PAGE",
        help="with --explain: pages to rewrite and count the rules' substitutions on (- for stdin)",
    )
    return parser


def rewrite_stream(
    ruleset: RuleSet,
    read: Callable[[int], bytes],
    write: Callable[[bytes], object],
    chunk_size: int = CHUNK,
    end_apart: bool = False,
    first: bytes | None = None,
) -> Transducer:
    """Rewrite the body ``read(chunk_size)`` gives (``first``: its first
    chunk, already read) into ``write``, as ``rewrite`` does; return the
    finished transducer (its flags and per-rule counts)."""
    transducer = Transducer(ruleset)
    # One chunk read ahead, so the last one is known when it is fed.
    data = read(chunk_size) if first is None else first
    while data:
        ahead = read(chunk_size)
        if not ahead and not end_apart:
            break
        write(transducer.feed(data))
        data = ahead
    write(transducer.finish(data))
    return transducer


@dataclass
class Tally:
    """Per rule index, over the pages counted: substitutions, pages where
    the rule made one, and the input bytes replaced."""

    matches: list[int]
    pages: list[int]
    bytes_changed: list[int]
    page_count: int = 0
    #: Names of the pages whose rewrite bailed out or timed out.
    stopped: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, ruleset: RuleSet) -> Tally:
        n = len(ruleset.rules)
        return cls([0] * n, [0] * n, [0] * n)

    def add(self, name: str, transducer: Transducer) -> None:
        """Count one finished page."""
        self.page_count += 1
        for k in transducer.rules_matched:
            self.matches[k] += transducer.rule_counts[k]
            self.pages[k] += 1
            self.bytes_changed[k] += transducer.rule_bytes[k]
        if transducer.bailed_out or transducer.timed_out:
            self.stopped.append(name)

    @property
    def never_matched(self) -> list[int]:
        """Rule numbers (index + 1) with no substitution on any page."""
        return [k + 1 for k, count in enumerate(self.matches) if not count]


def _pattern(ruleset: RuleSet, k: int) -> str:
    rule = ruleset.rules[k]
    return f"'{rule.pattern.decode('latin-1')}' {rule.flags or '-'}"


def _count_lines(ruleset: RuleSet, tally: Tally) -> list[str]:
    lines = [
        f"{k + 1} {rule.origin or '<rules>'} matches={tally.matches[k]} pages={tally.pages[k]}"
        f" bytes={tally.bytes_changed[k]} {_pattern(ruleset, k)}"
        for k, rule in enumerate(ruleset.rules)
    ]
    lines += [
        f"never {number} {ruleset.rules[number - 1].origin or '<rules>'} {_pattern(ruleset, number - 1)}"
        for number in tally.never_matched
    ]
    lines.append(
        f"total pages={tally.page_count} matches={sum(tally.matches)} bytes={sum(tally.bytes_changed)}"
    )
    return lines


def _json(ruleset: RuleSet, tally: Tally | None) -> dict[str, object]:
    rules = []
    for k, (rule, engine, why) in enumerate(ruleset.engines()):
        entry: dict[str, object] = {
            "number": k + 1,
            "file": rule.file,
            "line": rule.line,
            "pattern": rule.pattern.decode("latin-1"),
            "flags": rule.flags,
            "engine": engine,
            "why": why,
        }
        if tally is not None:
            entry["matches"] = tally.matches[k]
            entry["pages"] = tally.pages[k]
            entry["bytes_changed"] = tally.bytes_changed[k]
        rules.append(entry)
    report: dict[str, object] = {"rules": rules}
    if tally is not None:
        report["never_matched"] = tally.never_matched
        report["pages"] = tally.page_count
    return report


def _explain(
    args: argparse.Namespace, ruleset: RuleSet, source: BinaryIO, sink: BinaryIO
) -> int:
    names: list[str] = list(args.pages)
    first: bytes | None = None
    if not names and not _is_terminal(source):
        # Stdin as the page, unless it is empty (then, the plain listing).
        first = source.read(args.chunk_size)
        if first:
            names = ["-"]
    if not names:
        if args.json:
            sink.write(json.dumps(_json(ruleset, None), indent=1).encode() + b"\n")
        else:
            sink.write(b"".join(line.encode("latin-1") + b"\n" for line in ruleset.explain()))
        sink.flush()
        return 0
    # Nothing is printed before every page was read: one that cannot be
    # read is an error, not a page with no matches.
    tally = Tally.empty(ruleset)
    for name in names:
        try:
            if name == "-":
                t = rewrite_stream(ruleset, source.read, _discard, args.chunk_size, args.end_apart, first)
            else:
                with open(name, "rb") as fh:
                    t = rewrite_stream(ruleset, fh.read, _discard, args.chunk_size, args.end_apart)
        except OSError as exc:
            sys.stderr.write(f"prexy rewrite: cannot read page {name}: {exc.strerror}\n")
            return 1
        tally.add(name, t)
    for name in tally.stopped:
        sys.stderr.write(
            f"prexy rewrite: {name}: the buffer limit or a scan timeout stopped substitution;"
            " the rest of the page passed through unchanged, as in the proxy\n"
        )
    if args.json:
        sink.write(json.dumps(_json(ruleset, tally), indent=1).encode() + b"\n")
    else:
        sink.write(b"".join(line.encode("latin-1") + b"\n" for line in _count_lines(ruleset, tally)))
    sink.flush()
    return 0


def _discard(data: bytes) -> None:
    return None


def _is_terminal(stream: BinaryIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty()) if isatty is not None else False


def main(
    argv: Sequence[str] | None = None,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
) -> int:
    """Run the ``rewrite`` command; return the exit status."""
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.chunk_size <= 0:
        sys.stderr.write("prexy rewrite: --chunk-size must be positive\n")
        return 2
    if not args.explain and (args.pages or args.json):
        sys.stderr.write("prexy rewrite: PAGE arguments and --json go with --explain\n")
        return 2
    try:
        ruleset = load_rules(args.rules)
    except RulesError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    sink = stdout if stdout is not None else sys.stdout.buffer
    source = stdin if stdin is not None else sys.stdin.buffer
    if args.explain:
        return _explain(args, ruleset, source, sink)
    transducer = rewrite_stream(ruleset, source.read, sink.write, args.chunk_size, args.end_apart)
    sink.flush()
    if transducer.bailed_out:
        sys.stderr.write(
            "prexy rewrite: replace_filter_max_buffered_size "
            f"({ruleset.max_buffered_size}) exceeded; the rest was passed through unchanged\n"
        )
    if transducer.timed_out:
        sys.stderr.write("prexy rewrite: scan timed out; the rest was passed through unchanged\n")
    return 0
