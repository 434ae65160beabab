"""``prexy log``, ``prexy top``, ``prexy hist`` and ``prexy rules diff``:
the operator's views of a running Prexy, through its admin endpoint.

Each finds the endpoint with ``--admin URL`` or ``--config FILE`` (its
``[server] admin`` and ``admin_token``; ``--token`` or ``PREXY_ADMIN_TOKEN``
overrides the token) and talks to it with blocking standard-library HTTP
(:mod:`prexy.observe.client`); the text comes from the pure renderers of
:mod:`prexy.observe.terminal`.

- ``prexy log [--site NAME] [--status 5xx] [--slower 200ms] [--miss]
  [--rule N] [--url REGEX] [--json]``: one line per request as it
  completes, filtered by the server, each line flushed (it is piped into
  grep); the stream's ``{"dropped": N}`` notes go to stderr.
- ``prexy top [--interval 1] [--once]`` and ``prexy hist``: the counters
  and the latency histogram of ``/stats.json``, redrawn each interval on a
  terminal (the alternate screen, plain ANSI: tmux and any xterm-like
  terminal); ``--once`` prints one frame, made from two polls an interval
  apart, without escape codes.  On a stdout that is no terminal, frames
  follow each other, a blank line apart.
- ``prexy rules diff --site NAME DRAFT [--count 50] [--json]``: the dry run
  of a draft rules file against the site's most requested pages.

Exit status: 0 when done (Ctrl-C included, and the server ending the
log's stream), 1 when the admin endpoint refused what was asked (a draft
that does not load: its ``file:line:column: reason``), 2 when it could not
be asked (no endpoint given or found, connection refused, a bad option).
Each entry point takes ``argv`` without the command's name and returns the
exit status; ``python -m prexy.observe.cli COMMAND ...`` runs them too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import quote, urlencode

from prexy.observe.client import TOKEN_ENV, AdminClient, AdminError, AdminTarget, find_target
from prexy.observe.terminal import (
    FilterError,
    check_regex,
    cut,
    dropped_note,
    duration_param,
    format_record,
    parse_duration,
    parse_status,
    render_hist,
    render_report,
    render_top,
)

__all__ = ["hist_main", "log_main", "main", "rules_main", "top_main"]

ClientFactory = Callable[[AdminTarget, "float | None"], Any]


def _client(target: AdminTarget, timeout: float | None) -> AdminClient:
    return AdminClient(target, timeout)


class Console:
    """What a view writes to and waits with; tests give their own."""

    def __init__(
        self, stdout: TextIO | None = None, stderr: TextIO | None = None, client: ClientFactory = _client,
        sleep: Callable[[float], None] = time.sleep, monotonic: Callable[[], float] = time.monotonic,
        size: Callable[[], os.terminal_size] = shutil.get_terminal_size, tty: bool | None = None,
    ) -> None:
        self.stdout = stdout if stdout is not None else sys.stdout
        self.stderr = stderr if stderr is not None else sys.stderr
        self.client = client
        self.sleep = sleep
        self.monotonic = monotonic
        self.size = size
        self.tty = tty if tty is not None else _isatty(self.stdout)


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _argument_type(check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` from a check raising FilterError."""

    def convert(text: str) -> Any:
        try:
            return check(text)
        except FilterError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = check.__name__
    return convert


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise FilterError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise FilterError(f"{text!r}: must be 1 or more")
    return value


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise FilterError(f"{text!r} is not a number of seconds") from None
    if not 0.1 <= value <= 3600:
        raise FilterError(f"{text!r}: must be from 0.1 to 3600 seconds")
    return value


def _parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    where = parser.add_argument_group("where Prexy is (one of --admin, --config)")
    where.add_argument("--admin", metavar="URL",
                       help="the admin endpoint: http://127.0.0.1:9080, tcp:9080, unix:/run/prexy/admin.sock")
    where.add_argument("--config", metavar="FILE", help="Prexy's configuration file: its [server] admin and admin_token")
    where.add_argument("--token", metavar="TOKEN",
                       help=f"the admin token (default: ${TOKEN_ENV}, else the configuration's admin_token)")
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | int:
    """The options, or the exit status argparse asked for (--help: 0, a bad
    option: 2, its message printed)."""
    try:
        return parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2


def _target(args: argparse.Namespace) -> AdminTarget:
    return find_target(args.admin, args.config, args.token)


def _fail(console: Console, prog: str, exc: AdminError) -> int:
    console.stderr.write(f"{prog}: {exc}\n")
    console.stderr.flush()
    return exc.status


def _quiet_pipe(console: Console) -> None:
    """After a reader went away (``prexy log | head``): later writes, the
    interpreter's last flush included, go nowhere instead of failing."""
    try:
        fd = console.stdout.fileno()
    except (AttributeError, ValueError, OSError):
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


# -- prexy log -----------------------------------------------------------------


def log_parser() -> argparse.ArgumentParser:
    parser = _parser("prexy log", "Print one line per request as a running Prexy completes it.")
    parser.add_argument("--site", metavar="NAME", help="only this site's requests")
    parser.add_argument("--status", type=_argument_type(parse_status), metavar="5xx|404",
                        help="only answers of this class (5xx, 4xx...) or status (404)")
    parser.add_argument("--slower", type=_argument_type(parse_duration), metavar="DURATION",
                        help="only requests that took longer than this (200ms, 1.5s)")
    parser.add_argument("--miss", action="store_true", help="only cache misses")
    parser.add_argument("--rule", type=_argument_type(_positive_int), metavar="N",
                        help="only responses where rule number N fired")
    parser.add_argument("--url", type=_argument_type(check_regex), metavar="REGEX",
                        help="only URLs (path and query) this regular expression finds")
    parser.add_argument("--json", action="store_true", help="print the records as JSON lines, as they come")
    return parser


def log_query(args: argparse.Namespace) -> str:
    """``/log``'s query for the options (filters given only)."""
    params: list[tuple[str, str]] = []
    if args.site is not None:
        params.append(("site", args.site))
    if args.status is not None:
        params.append(("status", args.status))
    if args.slower is not None:
        params.append(("slower", duration_param(args.slower)))
    if args.miss:
        params.append(("miss", "1"))
    if args.rule is not None:
        params.append(("rule", str(args.rule)))
    if args.url is not None:
        params.append(("url", args.url))
    return "/log" + ("?" + urlencode(params) if params else "")


def log_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``prexy log``: print the live request log until Ctrl-C or the end of
    the stream."""
    console = console or Console()
    args = _parse(log_parser(), argv)
    if isinstance(args, int):
        return args
    out, err = console.stdout, console.stderr
    try:
        target = _target(args)
        client = console.client(target, 10.0)

        def following() -> None:
            # On stderr, so that stdout is the records alone: from here on
            # no request the filters pass is missed.
            err.write(f"prexy log: following {target.describe()}\n")
            err.flush()

        for value in client.records(log_query(args), opened=following):
            note = dropped_note(value) if isinstance(value, Mapping) else None
            if note is not None:
                err.write(f"prexy log: {note}\n")
                err.flush()
                continue
            if args.json:
                out.write(json.dumps(value, separators=(",", ":")) + "\n")
            elif isinstance(value, Mapping):
                out.write(format_record(value) + "\n")
            else:
                continue
            out.flush()
    except AdminError as exc:
        return _fail(console, "prexy log", exc)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _quiet_pipe(console)
        return 0
    return 0


# -- prexy top, prexy hist -------------------------------------------------------

#: The alternate screen and a hidden cursor while a view runs, and back.
ENTER = "\x1b[?1049h\x1b[?25l"
LEAVE = "\x1b[?25h\x1b[?1049l"


def frame(lines: Sequence[str]) -> str:
    """A screen's worth of ``lines`` drawn over the last one: home, each
    line then the rest of its row cleared, the rows below cleared; no
    newline after the last row, so the screen never scrolls."""
    return "\x1b[H" + "\x1b[K\r\n".join(lines) + "\x1b[K\x1b[J"


Render = Callable[..., list[str]]


def _view_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = _parser(prog, description)
    parser.add_argument("--interval", type=_argument_type(_interval), default=1.0, metavar="SECONDS",
                        help="seconds between polls (default 1)")
    parser.add_argument("--once", action="store_true",
                        help="print one frame (two polls an interval apart) without escape codes, and exit")
    return parser


def _view(
    prog: str, render: Render, argv: Sequence[str] | None, console: Console, description: str,
    piped_rows: int | None = None,
) -> int:
    """Poll ``/stats.json`` and draw ``render``'s frames; ``piped_rows``:
    the rows a ``--once`` frame may have when stdout is no terminal (its
    lists whole for a script), instead of the terminal's height."""
    args = _parse(_view_parser(prog, description), argv)
    if isinstance(args, int):
        return args
    out = console.stdout
    try:
        target = _target(args)
        client = console.client(target, 10.0)
        source = target.describe()
        prev = client.get_json("/stats.json")
        if args.once:
            console.sleep(args.interval)
            cur = client.get_json("/stats.json")
            size = console.size()
            rows = piped_rows if piped_rows is not None and not console.tty else size.lines
            out.write("\n".join(render(prev, cur, size.columns, rows, source=source)) + "\n")
            out.flush()
            return 0
    except AdminError as exc:
        return _fail(console, prog, exc)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _quiet_pipe(console)
        return 0
    return _loop(prog, render, client, source, prev, args.interval, console)


def _loop(
    prog: str, render: Render, client: Any, source: str, first: Any, interval: float, console: Console
) -> int:
    """Redraw every ``interval`` until Ctrl-C; an endpoint gone away is
    shown on the screen and asked again at the next tick."""
    out = console.stdout
    prev: Any = None
    cur: Any = first
    problem = ""
    tick = console.monotonic()
    if console.tty:
        out.write(ENTER)
    try:
        while True:
            size = console.size()
            if cur is not None:
                lines = render(prev, cur, size.columns, size.lines, source=source)
            else:
                lines = [cut(f"{prog}  {source}", size.columns), "", cut(problem, size.columns),
                         f"(asking again every {interval:g}s)"]
            if console.tty:
                out.write(frame(lines[: size.lines]))
            else:
                out.write("\n".join(lines) + "\n\n")
            out.flush()
            tick += interval
            console.sleep(max(0.0, tick - console.monotonic()))
            tick = max(tick, console.monotonic() - interval)  # a late tick: no burst to catch up
            try:
                prev, cur = cur, client.get_json("/stats.json")
            except AdminError as exc:
                prev, cur, problem = None, None, str(exc)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        _quiet_pipe(console)
        return 0
    finally:
        if console.tty:
            try:
                out.write(LEAVE)
                out.flush()
            except OSError:
                pass


def top_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``prexy top``: requests per second, hit rate, errors, and the busiest
    sites and rules, refreshed every interval."""
    return _view("prexy top", render_top, argv, console or Console(),
                 "Live counters of a running Prexy: rates, hit rate, errors, top sites and rules.", piped_rows=1000)


def hist_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``prexy hist``: the latency histogram of the last interval, hits
    against misses."""
    return _view("prexy hist", render_hist, argv, console or Console(),
                 "Latency histogram of a running Prexy's requests: hits (|) against misses and passes (#).")


# -- prexy rules diff ---------------------------------------------------------------


def rules_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prexy rules", description="Rules of a running Prexy's sites.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    diff = actions.add_parser(
        "diff", help="what a draft rules file would change on a site's most requested pages",
        description="Dry run of a draft rules file: the site's most requested pages fetched from its upstream,"
        " rewritten with the current rules and with the draft, and compared.",
    )
    diff.prog = "prexy rules diff"
    where = diff.add_argument_group("where Prexy is (one of --admin, --config)")
    where.add_argument("--admin", metavar="URL", help="the admin endpoint: http://127.0.0.1:9080, unix:/path")
    where.add_argument("--config", metavar="FILE", help="Prexy's configuration file")
    where.add_argument("--token", metavar="TOKEN", help=f"the admin token (default: ${TOKEN_ENV}, else the config's)")
    diff.add_argument("--site", required=True, metavar="NAME", help="the site whose rules the draft would replace")
    diff.add_argument("draft", metavar="DRAFT_FILE", help="the draft rules file")
    diff.add_argument("--count", type=_argument_type(_positive_int), default=50, metavar="N",
                      help="how many of the most requested pages to try (default 50)")
    diff.add_argument("--timeout", type=_argument_type(_interval), default=300.0, metavar="SECONDS",
                      help="how long to wait for the report (default 300)")
    diff.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


def rules_main(argv: Sequence[str] | None = None, console: Console | None = None) -> int:
    """``prexy rules diff``: the dry run's report of a draft."""
    console = console or Console()
    args = _parse(rules_parser(), argv)
    if isinstance(args, int):
        return args
    prog = "prexy rules diff"
    try:
        with open(args.draft, "rb") as f:
            draft = f.read()
    except OSError as exc:
        console.stderr.write(f"{prog}: {args.draft}: cannot read: {exc.strerror or exc}\n")
        return 2
    path = (f"/sites/{quote(args.site, safe='')}/dry-run?"
            + urlencode({"count": args.count, "file": os.path.basename(args.draft)}))
    try:
        client = console.client(_target(args), args.timeout)
        status, report = client.call("POST", path, draft, {"Content-Type": "text/plain; charset=utf-8"})
    except AdminError as exc:
        return _fail(console, prog, exc)
    except KeyboardInterrupt:
        return 130
    if status != 200 or not isinstance(report, dict):
        message = report.get("error") if isinstance(report, dict) else None
        console.stderr.write(f"{prog}: {message or f'unexpected answer {status}'}\n")
        return 1
    try:
        console.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else render_report(report))
        console.stdout.flush()
    except BrokenPipeError:
        _quiet_pipe(console)
    return 0


COMMANDS: dict[str, Callable[..., int]] = {"log": log_main, "top": top_main, "hist": hist_main, "rules": rules_main}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m prexy.observe.cli COMMAND [ARGS]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in COMMANDS:
        sys.stderr.write(f"usage: python -m prexy.observe.cli {{{','.join(COMMANDS)}}} [ARGS]\n")
        return 2
    return COMMANDS[args[0]](args[1:])


if __name__ == "__main__":
    sys.exit(main())
