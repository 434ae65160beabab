"""The operator's commands (prexy.observe.cli): options checked before
anything is asked, the requests they make, what they print and their exit
status, with a fake client, clock and terminal (no socket, no sleep)."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from twisted.trial.unittest import SynchronousTestCase

from prexy.observe import cli
from prexy.observe.client import AdminError, AdminTarget
from tests.cases import expand, parametrize, tmp_dir

from .test_observe_terminal import record, snapshot


class FakeClient:
    """Canned answers for one view: snapshots in turn, a stream's values,
    a dry run's answer; a value that is an exception is raised."""

    def __init__(self, snapshots: list[Any] = (), stream: list[Any] = (), answer: Any = None) -> None:
        self.snapshots = list(snapshots)
        self.stream = list(stream)
        self.answer = answer
        self.asked: list[tuple[str, Any]] = []

    def get_json(self, path: str) -> Any:
        self.asked.append(("GET", path))
        value = self.snapshots.pop(0)
        if isinstance(value, BaseException):
            raise value
        return value

    def records(self, path: str, opened: Any = None) -> Iterator[Any]:
        self.asked.append(("GET", path))
        refused = bool(self.stream) and isinstance(self.stream[0], BaseException)
        if opened is not None and not refused:  # the answer's head came
            opened()
        for value in self.stream:
            if isinstance(value, BaseException):
                raise value
            yield value

    def call(self, method: str, path: str, body: bytes, headers: Any) -> Any:
        self.asked.append((method, path, body, headers))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


class FakeTerminal:
    """A console whose time advances only when the view sleeps."""

    def __init__(self, client: FakeClient, tty: bool = False, columns: int = 80, lines: int = 24,
                 interrupt_after: int | None = None) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.targets: list[tuple[AdminTarget, float | None]] = []
        self.interrupt_after = interrupt_after
        self.out = io.StringIO()
        self.err = io.StringIO()

        def make(target: AdminTarget, timeout: float | None) -> FakeClient:
            self.targets.append((target, timeout))
            return client

        self.console = cli.Console(self.out, self.err, make, self.sleep, lambda: self.now,
                                   lambda: os.terminal_size((columns, lines)), tty)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.interrupt_after is not None and len(self.sleeps) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.now += seconds


ADMIN = ("--admin", "http://127.0.0.1:9080")


def query(path: str) -> list[tuple[str, str]]:
    return parse_qsl(urlsplit(path).query)


@expand
class LogTests(SynchronousTestCase):
    """``prexy log``."""

    def run_log(self, *args: str, stream: list[Any] = ()) -> tuple[int, FakeClient, FakeTerminal]:
        client = FakeClient(stream=stream)
        term = FakeTerminal(client)
        with contextlib.redirect_stderr(term.err):
            status = cli.log_main([*ADMIN, *args], term.console)
        return status, client, term

    def test_filters_sent(self) -> None:
        """Each filter goes to /log, checked and normalised."""
        status, client, _ = self.run_log("--site", "shop", "--status", "5XX", "--slower", "1.5s", "--miss",
                                         "--rule", "3", "--url", "^/a b&c")
        self.assertEqual(status, 0)
        self.assertEqual(query(client.asked[0][1]), [("site", "shop"), ("status", "5xx"), ("slower", "1500ms"),
                                                     ("miss", "1"), ("rule", "3"), ("url", "^/a b&c")])
        self.assertEqual(urlsplit(client.asked[0][1]).path, "/log")

    def test_no_filter(self) -> None:
        _, client, _ = self.run_log()
        self.assertEqual(client.asked, [("GET", "/log")])

    @parametrize("args,message", {
        "status": (("--status", "7xx"), "not a status filter"),
        "slower": (("--slower", "200"), "is not a duration"),
        "rule": (("--rule", "0"), "must be 1 or more"),
        "rule_word": (("--rule", "three"), "is not a whole number"),
        "url": (("--url", "a(b"), "is not a regular expression"),
    })
    def test_bad_filters(self, args: tuple[str, ...], message: str) -> None:
        """A bad filter: exit 2 and why, before anything is asked."""
        status, client, term = self.run_log(*args)
        self.assertEqual(status, 2)
        self.assertIn(message, term.err.getvalue())
        self.assertEqual(client.asked, [])
        self.assertEqual(term.targets, [])

    def test_lines_and_notes(self) -> None:
        """One line per record; a dropped note on stderr; the end of the
        stream exits 0."""
        status, _, term = self.run_log(stream=[record(), {"dropped": 3}, record(url="/b", rules=[])])
        self.assertEqual(status, 0)
        lines = term.out.getvalue().splitlines()
        self.assertEqual(len(lines), 2)
        self.assertIn(" shop GET /a?b=1 200 miss ", lines[0])
        self.assertIn(" /b ", lines[1])
        self.assertEqual(
            term.err.getvalue(),
            "prexy log: following http://127.0.0.1:9080\nprexy log: 3 records dropped: this reader fell behind\n",
        )

    def test_json(self) -> None:
        status, _, term = self.run_log("--json", stream=[record(), {"dropped": 3}])
        self.assertEqual(status, 0)
        self.assertEqual(term.out.getvalue(), cli.json.dumps(record(), separators=(",", ":")) + "\n")

    def test_ctrl_c(self) -> None:
        status, _, term = self.run_log(stream=[record(), KeyboardInterrupt()])
        self.assertEqual(status, 0)
        self.assertEqual(len(term.out.getvalue().splitlines()), 1)

    def test_failure(self) -> None:
        """The endpoint's failure: its line on stderr, its status."""
        status, _, term = self.run_log(stream=[AdminError("cannot reach the admin endpoint at x: connection refused")])
        self.assertEqual(status, 2)
        self.assertEqual(term.err.getvalue(), "prexy log: cannot reach the admin endpoint at x: connection refused\n")

    def test_no_endpoint(self) -> None:
        client = FakeClient()
        term = FakeTerminal(client)
        self.assertEqual(cli.log_main([], term.console), 2)
        self.assertEqual(term.err.getvalue(),
                         "prexy log: say where Prexy's admin endpoint is: --admin URL or --config FILE\n")

    def test_token(self) -> None:
        _, _, term = self.run_log("--token", "t0k")
        self.assertEqual(term.targets, [(AdminTarget("http", "127.0.0.1", 9080, token="t0k"), 10.0)])


class ViewTests(SynchronousTestCase):
    """``prexy top`` and ``prexy hist``: polls, frames, the screen."""

    def test_once(self) -> None:
        """Two polls an interval apart, one frame without escape codes."""
        client = FakeClient([snapshot(0), snapshot(1)])
        term = FakeTerminal(client, columns=100, lines=30)
        self.assertEqual(cli.top_main([*ADMIN, "--once", "--interval", "1"], term.console), 0)
        self.assertEqual(term.sleeps, [1.0])
        self.assertEqual(client.asked, [("GET", "/stats.json")] * 2)
        out = term.out.getvalue()
        self.assertNotIn("\x1b", out)
        self.assertIn("requests  120/s", out)
        self.assertLessEqual(max(map(len, out.splitlines())), 100)

    def test_once_piped_lists_whole(self) -> None:
        """``top --once`` into a pipe lists every site and rule, whatever
        the terminal's height; on a terminal it fits it."""
        for tty in (False, True):
            client = FakeClient([snapshot(0), snapshot(1)])
            term = FakeTerminal(client, tty=tty, columns=100, lines=24)
            self.assertEqual(cli.top_main([*ADMIN, "--once"], term.console), 0)
            lines = term.out.getvalue().splitlines()
            shown = [line for line in lines if line[:4].strip().isdigit()]
            if tty:
                self.assertEqual(len(lines), 24)
                self.assertLess(len(shown), 30)
            else:
                self.assertEqual(len(shown), 30)

    def test_hist_once(self) -> None:
        client = FakeClient([snapshot(0), snapshot(1)])
        term = FakeTerminal(client)
        self.assertEqual(cli.hist_main([*ADMIN, "--once"], term.console), 0)
        self.assertIn("last 1.0s: 3865 requests", term.out.getvalue())

    def test_screen(self) -> None:
        """On a terminal: the alternate screen, each frame drawn from home
        with every row cleared to its end, rates from the second frame on,
        polls on the interval's ticks; Ctrl-C restores the screen, exit 0."""
        client = FakeClient([snapshot(k) for k in range(5)])
        term = FakeTerminal(client, tty=True, interrupt_after=3)
        self.assertEqual(cli.top_main([*ADMIN, "--interval", "0.5"], term.console), 0)
        out = term.out.getvalue()
        self.assertTrue(out.startswith(cli.ENTER + "\x1b[H"))
        self.assertTrue(out.endswith(cli.LEAVE))
        frames = out[len(cli.ENTER):-len(cli.LEAVE)].split("\x1b[H")[1:]
        self.assertEqual(len(frames), 3)
        self.assertIn("(rates after the next poll)", frames[0])
        self.assertIn("requests  120/s", frames[1])  # the snapshots' own times are 1 s apart
        for f in frames:
            self.assertTrue(f.endswith("\x1b[K\x1b[J"))
            self.assertFalse(f.endswith("\n"))
            self.assertLessEqual(f.count("\r\n") + 1, 24)
        self.assertEqual(term.sleeps, [0.5, 0.5, 0.5])

    def test_screen_size_followed(self) -> None:
        """Each frame fits the terminal's size of the moment."""
        client = FakeClient([snapshot(k) for k in range(3)])
        term = FakeTerminal(client, tty=True, columns=50, lines=12, interrupt_after=2)
        cli.top_main([*ADMIN], term.console)
        frames = term.out.getvalue().replace(cli.ENTER, "").replace(cli.LEAVE, "").split("\x1b[H")[1:]
        self.assertEqual(len(frames), 2)
        for f in frames:
            rows = f.removesuffix("\x1b[K\x1b[J").split("\x1b[K\r\n")
            self.assertLessEqual(len(rows), 12)
            self.assertLessEqual(max(map(len, rows)), 50)

    def test_endpoint_lost_and_back(self) -> None:
        """An endpoint that stops answering mid-way is shown and asked
        again; the view does not exit."""
        lost = AdminError("cannot reach the admin endpoint at http://127.0.0.1:9080: connection refused")
        client = FakeClient([snapshot(0), lost, snapshot(2), snapshot(3)])
        term = FakeTerminal(client, interrupt_after=3)
        self.assertEqual(cli.top_main([*ADMIN], term.console), 0)
        frames = term.out.getvalue().split("prexy top  ")[1:]
        self.assertIn("connection refused\n(asking again every 1s)", frames[1])
        self.assertIn("(rates after the next poll)", frames[2])

    def test_first_poll_fails(self) -> None:
        client = FakeClient([AdminError("cannot reach the admin endpoint at x: connection refused")])
        term = FakeTerminal(client)
        self.assertEqual(cli.hist_main([*ADMIN], term.console), 2)
        self.assertEqual(term.err.getvalue(), "prexy hist: cannot reach the admin endpoint at x: connection refused\n")

    def test_bad_interval(self) -> None:
        term = FakeTerminal(FakeClient())
        with contextlib.redirect_stderr(term.err):
            self.assertEqual(cli.top_main([*ADMIN, "--interval", "0"], term.console), 2)
        self.assertIn("must be from 0.1 to 3600 seconds", term.err.getvalue())


class RulesDiffTests(SynchronousTestCase):
    """``prexy rules diff``."""

    REPORT = {"site": "shop", "pages": 20, "fetched": 20, "changed": 3, "failed": [],
              "rules": {"current": [], "draft": []}, "never_matching": {"current": [], "draft": []}, "diffs": []}

    def setUp(self) -> None:
        self.draft = tmp_dir(self) / "my draft.rules"
        self.draft.write_bytes(b"replace_filter 'a' 'b' g;\n")

    def run_diff(self, answer: Any, *args: str) -> tuple[int, FakeClient, FakeTerminal]:
        client = FakeClient(answer=answer)
        term = FakeTerminal(client)
        with contextlib.redirect_stderr(term.err):
            status = cli.rules_main(["diff", *ADMIN, *args], term.console)
        return status, client, term

    def test_posted(self) -> None:
        """The draft's bytes, its name and the count go to the site's dry
        run; the site's name is quoted into the path."""
        status, client, term = self.run_diff((200, self.REPORT), "--site", "my site", "--count", "20",
                                             str(self.draft))
        self.assertEqual(status, 0, term.err.getvalue())
        method, path, body, headers = client.asked[0]
        self.assertEqual((method, urlsplit(path).path, body), ("POST", "/sites/my%20site/dry-run",
                                                               b"replace_filter 'a' 'b' g;\n"))
        self.assertEqual(query(path), [("count", "20"), ("file", "my draft.rules")])
        self.assertTrue(term.out.getvalue().startswith("dry run on site shop: 20 pages asked, 20 fetched, 3 changed"))
        self.assertEqual(term.targets[0][1], 300.0)

    def test_json(self) -> None:
        status, _, term = self.run_diff((200, self.REPORT), "--site", "shop", "--json", str(self.draft))
        self.assertEqual(status, 0)
        self.assertEqual(cli.json.loads(term.out.getvalue()), self.REPORT)

    def test_draft_error(self) -> None:
        """A draft that does not load: its file:line:column: reason, exit 1."""
        status, _, term = self.run_diff((400, {"error": "my draft.rules:3:7: unbalanced parenthesis"}),
                                        "--site", "shop", str(self.draft))
        self.assertEqual(status, 1)
        self.assertEqual(term.out.getvalue(), "")
        self.assertEqual(term.err.getvalue(), "prexy rules diff: my draft.rules:3:7: unbalanced parenthesis\n")

    def test_unreadable_draft(self) -> None:
        status, client, term = self.run_diff((200, {}), "--site", "shop", str(self.draft) + ".nope")
        self.assertEqual(status, 2)
        self.assertIn("cannot read: No such file or directory", term.err.getvalue())
        self.assertEqual(client.asked, [])

    def test_usage(self) -> None:
        """Without --site, or without the diff action: argparse's exit 2."""
        status, client, term = self.run_diff((200, {}), str(self.draft))
        self.assertEqual(status, 2)
        self.assertIn("--site", term.err.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            self.assertEqual(cli.rules_main([], FakeTerminal(FakeClient()).console), 2)

    def test_unreachable(self) -> None:
        status, _, term = self.run_diff(AdminError("cannot reach the admin endpoint at x: connection refused"),
                                        "--site", "shop", str(self.draft))
        self.assertEqual(status, 2)
        self.assertEqual(term.err.getvalue(),
                         "prexy rules diff: cannot reach the admin endpoint at x: connection refused\n")


class PureTests(SynchronousTestCase):
    """The commands run outside Twisted: none of their modules imports it."""

    def test_no_twisted(self) -> None:
        from tests.test_imports import import_graph, module_files, reachable, top_level_imports

        files = module_files()
        graph = import_graph()
        for module in ("prexy.observe.cli", "prexy.observe.client", "prexy.observe.terminal"):
            for reached in sorted(reachable(graph, module)):
                self.assertNotIn("twisted", top_level_imports(files[reached]), f"{module} -> {reached}")
