"""The operator's views (``prexy log``, ``top``, ``hist``, ``rules diff``) run
as real child processes against a small fake admin endpoint on loopback.

The fake serves canned JSON in the shapes of the admin routes: a
``/stats.json`` whose counters grow with the reactor's clock at a known
rate (250 requests a second, the snapshot's time quantised to whole
fours of requests, so every rate the client computes is exactly that and
the hit rate exactly 3 in 4), a ``/log`` stream whose records the test
releases one by one, and a dry run.  It listens on TCP and on a Unix
socket, and wants a token.  Every wait fires on an event: a child's output
(a ``ProcessProtocol``), its exit, a file inotify sees written, or, for
``prexy top`` inside tmux, the pane's text asked for through the reactor
until a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor, task, utils
from twisted.web import resource, server

from .twistd_support import child_env, free_port, scratch_dir, when_written

#: How the views are started: ``python -m prexy.observe.cli COMMAND``
#: (``python -m prexy COMMAND`` dispatches to the same functions).
CLI = ("-m", "prexy")

TOKEN = "sekrit-token"
RATE = 250
BOUNDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]


def record(n: int, **over: Any) -> dict[str, Any]:
    base = {
        "time": 1764900000.123 + n, "site": "shop", "method": "GET", "url": f"/page/{n}?q=1", "status": 200,
        "protocol": "HTTP/1.1", "client": "127.0.0.1", "cache": "miss", "upstream_first_byte": 0.0123,
        "rewrite": 0.0021, "total": 0.0201, "bytes_in": 20480, "bytes_out": 20511, "rules": [1, 3], "held": 0,
        "bailout": False, "timeout": False,
    }
    base.update(over)
    return base


REPORT = {
    "site": "x", "pages": 50, "fetched": 48, "failed": [{"url": "/gone", "error": "502"}], "changed": 12,
    "rules": {
        "current": [{"number": 1, "file": "x.rules", "line": 1, "pattern": "old\\.example", "occurrences": 40,
                     "pages": 12}],
        "draft": [{"number": 1, "file": "draft.rules", "line": 1, "pattern": "new\\.example", "occurrences": 0,
                   "pages": 0}],
    },
    "never_matching": {"current": [], "draft": [1]},
    "diffs": [{"url": "/a", "lines": ["- <a href=\"https://old.example/\">", "+ <a href=\"https://new.example/\">"]}],
}


class FakeAdmin(resource.Resource):
    """The admin routes the views use, in their JSON shapes (API35)."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.start = reactor.seconds()
        self.log_queries: list[dict[str, list[str]]] = []
        self.log_requests: list[server.Request] = []
        self.log_opened: defer.Deferred[server.Request] = defer.Deferred()
        self.dry_runs: list[tuple[dict[str, list[str]], bytes]] = []

    def stats(self) -> dict[str, Any]:
        n = int((reactor.seconds() - self.start) * RATE) // 4 * 4 + 1000  # whole fours: hits are 3 in 4 exactly
        hits, misses = n * 3 // 4, n - n * 3 // 4
        return {
            "time": 1764900000 + n / RATE,
            "requests": n,
            "by_class": {"2xx": n - n // 50, "3xx": 0, "4xx": n // 50, "5xx": 0},
            "cache": {"hit": hits, "miss": misses, "pass": 0},
            "bytes_out": n * 1000, "upstream_errors": 0,
            "latency": {
                "bounds": BOUNDS,
                "hit": [0, hits // 2, hits - hits // 2, 0, 0, 0, 0, 0, 0, 0, 0],
                "miss": [0, 0, 0, 0, misses // 2, misses - misses // 2, 0, 0, 0, 0, 0],
                "pass": [0] * 11,
            },
            "sites": [{"site": "shop", "requests": n, "hit": hits, "miss": misses, "errors": n // 50,
                       "bytes_out": n * 1000}],
            "rules": [{"site": "shop", "number": 3, "file": "/etc/prexy/shop.rules", "line": 7, "matches": 2 * n,
                       "responses": n}],
        }

    def render(self, request: server.Request) -> bytes | int:
        if request.getHeader(b"authorization") != f"Bearer {TOKEN}".encode():
            request.setResponseCode(401)
            return b'{"error": "a token is wanted"}'
        query = parse_qs(request.uri.partition(b"?")[2].decode())
        request.setHeader(b"content-type", b"application/json")
        if request.path == b"/stats.json" and request.method == b"GET":
            return json.dumps(self.stats()).encode()
        if request.path == b"/log" and request.method == b"GET":
            request.setHeader(b"content-type", b"application/x-ndjson")
            self.log_queries.append(query)
            self.log_requests.append(request)
            request.write(b"")  # the head goes now; records follow when the test sends them
            opened, self.log_opened = self.log_opened, defer.Deferred()
            opened.callback(request)
            return server.NOT_DONE_YET
        if request.path == b"/sites/x/dry-run" and request.method == b"POST":
            body = request.content.read()
            self.dry_runs.append((query, body))
            if b"bad" in body:
                request.setResponseCode(400)
                return json.dumps({"error": f"{query['file'][0]}:3:7: unbalanced parenthesis"}).encode()
            return json.dumps(REPORT).encode()
        request.setResponseCode(404)
        return b'{"error": "no such route"}'


class AdminServer:
    def __init__(self) -> None:
        self.dir = scratch_dir("prexy-observe-")
        self.fake = FakeAdmin()
        site = server.Site(self.fake)
        self.port = reactor.listenTCP(0, site, interface="127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port.getHost().port}"
        self.socket = os.path.join(self.dir, "admin.sock")
        self.unix = reactor.listenUNIX(self.socket, site)

    def config(self, admin: str) -> str:
        path = os.path.join(self.dir, "prexy.toml")
        with open(path, "w") as f:
            f.write(f'[server]\nlisten = ["tcp:8080"]\nadmin = "{admin}"\nadmin_token = "{TOKEN}"\n')
        return path

    def stop(self) -> Any:
        for request in self.fake.log_requests:
            if not request.finished and not request._disconnected:
                request.finish()
        return defer.gatherResults([defer.maybeDeferred(self.port.stopListening),
                                    defer.maybeDeferred(self.unix.stopListening)])


@pytest.fixture
def admin(cleanup: Any) -> AdminServer:
    server_ = AdminServer()
    cleanup(server_.stop)
    return server_


class Child(protocol.ProcessProtocol):
    """A view as a child process; its stdout and stderr are watched."""

    def __init__(self, *args: str) -> None:
        self.out = b""
        self.err = b""
        self.exited: defer.Deferred[int] = defer.Deferred()
        self._waits: list[tuple[str, Callable[[bytes], bool], defer.Deferred[None]]] = []
        argv = [sys.executable, *CLI, *args]
        self.transport = reactor.spawnProcess(self, argv[0], argv, env=child_env(), childFDs={0: "w", 1: "r", 2: "r"})

    def _check(self) -> None:
        waiting, self._waits = self._waits, []
        for stream, condition, d in waiting:
            if condition(getattr(self, stream)):
                d.callback(None)
            else:
                self._waits.append((stream, condition, d))

    def outReceived(self, data: bytes) -> None:
        self.out += data
        self._check()

    def errReceived(self, data: bytes) -> None:
        self.err += data
        self._check()

    def processEnded(self, reason: Any) -> None:
        code = reason.value.exitCode
        self.exited.callback(code if code is not None else -(reason.value.signal or 0))
        for _, _, d in self._waits:
            d.errback(AssertionError(f"the child exited; out={self.out!r} err={self.err!r}"))
        self._waits = []

    def printed(self, condition: Callable[[bytes], bool], seconds: float = 20, stream: str = "out") -> Any:
        """Fires once ``condition`` holds for what the child wrote on
        ``stream`` ("out" or "err")."""
        d: defer.Deferred[None] = defer.Deferred()
        if condition(getattr(self, stream)):
            d.callback(None)
        else:
            self._waits.append((stream, condition, d))
        return d.addTimeout(seconds, reactor)

    def stop(self) -> None:
        if not self.exited.called:
            self.transport.signalProcess("KILL")


def run(cleanup: Any, *args: str) -> defer.Deferred[tuple[int, str, str]]:
    child = Child(*args)
    cleanup(child.stop)
    d = child.exited.addTimeout(60, reactor)
    return d.addCallback(lambda code: (code, child.out.decode(), child.err.decode()))


def send(request: server.Request, value: Any) -> None:
    request.write(json.dumps(value).encode() + b"\n")


@pytest_twisted.inlineCallbacks
def test_log_prints_each_record_as_it_comes(admin: AdminServer, cleanup: Any) -> Any:
    """``prexy log`` asks ``/log`` with its filters and prints each record
    as soon as its line arrives, a record cut in two writes included; a
    ``dropped`` note goes to stderr; the end of the stream exits 0."""
    child = Child("log", "--admin", admin.url, "--token", TOKEN, "--site", "shop", "--status", "5xx",
                  "--slower", "1.5s", "--miss", "--rule", "3", "--url", "^/page/")
    cleanup(child.stop)
    request = yield admin.fake.log_opened
    assert admin.fake.log_queries == [{"site": ["shop"], "status": ["5xx"], "slower": ["1500ms"], "miss": ["1"],
                                       "rule": ["3"], "url": ["^/page/"]}]
    send(request, record(1, status=502, rules=[3]))
    yield child.printed(lambda out: b"/page/1?q=1 502 miss" in out)
    line = json.dumps(record(2, rules=[3], bailout=True)).encode() + b"\n"
    request.write(line[:40])
    yield task.deferLater(reactor, 0.05, lambda: None)  # the first half alone on the wire
    assert b"/page/2" not in child.out
    request.write(line[40:])
    yield child.printed(lambda out: b"/page/2" in out)
    send(request, {"dropped": 7})
    send(request, record(3, rules=[1, 3], held=512, timeout=True))
    request.finish()
    code = yield child.exited.addTimeout(20, reactor)
    assert code == 0, child.err
    lines = child.out.decode().splitlines()
    assert len(lines) == 3
    assert "rules=3 held=0" in lines[0]
    assert lines[1].endswith("BAILOUT")
    assert "rules=1,3 held=512" in lines[2] and lines[2].endswith("TIMEOUT")
    assert "upstream=12.3ms rewrite=2.10ms total=20.1ms in=20480 out=20511" in lines[0]
    assert child.err.decode() == (
        f"prexy log: following {admin.url}\nprexy log: 7 records dropped: this reader fell behind\n"
    )


@pytest_twisted.inlineCallbacks
def test_log_json_and_ctrl_c(admin: AdminServer, cleanup: Any) -> Any:
    """``--json`` prints the records as they come; Ctrl-C (SIGINT) exits 0
    while the stream is still open."""
    config = admin.config(f"unix:{admin.socket}")
    child = Child("log", "--config", config, "--json")
    cleanup(child.stop)
    request = yield admin.fake.log_opened
    assert admin.fake.log_queries == [{}]
    send(request, record(1))
    yield child.printed(lambda out: out.endswith(b"\n"))
    assert json.loads(child.out) == record(1)
    child.transport.signalProcess(signal.SIGINT)
    code = yield child.exited.addTimeout(20, reactor)
    assert code == 0
    assert b"Traceback" not in child.err


@pytest_twisted.inlineCallbacks
def test_unreachable_and_bad_filters(admin: AdminServer, cleanup: Any) -> Any:
    """Nothing listening, no endpoint given, a bad duration or regex, a
    config without an admin endpoint, a missing token: one line each."""
    port = free_port()  # reserved, bound, not listening: refused
    code, out, err = yield run(cleanup, "log", "--admin", f"http://127.0.0.1:{port}")
    assert (code, out) == (2, "")
    assert err == f"prexy log: cannot reach the admin endpoint at http://127.0.0.1:{port}: connection refused\n"
    code, _, err = yield run(cleanup, "top", "--once")
    assert (code, err) == (2, "prexy top: say where Prexy's admin endpoint is: --admin URL or --config FILE\n")
    code, _, err = yield run(cleanup, "log", "--admin", admin.url, "--slower", "fast")
    assert code == 2 and "'fast' is not a duration" in err
    code, _, err = yield run(cleanup, "log", "--admin", admin.url, "--url", "(")
    assert code == 2 and "is not a regular expression" in err
    bare = os.path.join(admin.dir, "bare.toml")
    with open(bare, "w") as f:
        f.write('[server]\nlisten = ["tcp:8080"]\n')
    code, _, err = yield run(cleanup, "hist", "--config", bare)
    assert (code, err) == (2, f"prexy hist: {bare}: [server] admin is not set: this Prexy has no admin endpoint\n")
    code, _, err = yield run(cleanup, "top", "--once", "--admin", admin.url)
    assert code == 1 and "wants a token" in err


@pytest_twisted.inlineCallbacks
def test_top_and_hist_once(admin: AdminServer, cleanup: Any) -> Any:
    """``--once`` prints one frame, from two polls an interval apart,
    without escape codes: the request rate, the site and the rule."""
    code, out, err = yield run(cleanup, "top", "--once", "--interval", "0.3", "--admin", admin.url,
                               "--token", TOKEN)
    assert code == 0, err
    assert "\x1b" not in out
    assert f"requests  {RATE}/s" in out
    assert "hit rate 75.0% (since start 75.0%)" in out
    assert "/etc/prexy/shop.rules:7" in out
    assert any(line.startswith("shop ") for line in out.splitlines())
    config = admin.config(f"unix:{admin.socket}")
    code, out, err = yield run(cleanup, "hist", "--once", "--interval", "0.3", "--config", config)
    assert code == 0, err
    assert "|" in out and "#" in out and "2.5" in out and "ms" in out
    assert "\x1b" not in out


@pytest_twisted.inlineCallbacks
def test_rules_diff(admin: AdminServer, cleanup: Any) -> Any:
    """The draft's bytes are posted with its name and the count; the report
    prints as text or JSON; a draft that does not load prints its error
    and exits 1."""
    draft = os.path.join(admin.dir, "draft.rules")
    with open(draft, "wb") as f:
        f.write(b"replace_filter 'new\\.example' 'x' g;\n")
    code, out, err = yield run(cleanup, "rules", "diff", "--site", "x", "--count", "20", draft,
                               "--admin", admin.url, "--token", TOKEN)
    assert code == 0, err
    assert admin.fake.dry_runs[-1] == ({"count": ["20"], "file": ["draft.rules"]},
                                      b"replace_filter 'new\\.example' 'x' g;\n")
    assert "50 pages asked, 48 fetched, 12 changed" in out
    assert "+ <a href=\"https://new.example/\">" in out
    code, out, err = yield run(cleanup, "rules", "diff", "--site", "x", "--json", draft,
                               "--admin", admin.url, "--token", TOKEN)
    assert code == 0 and json.loads(out) == REPORT
    with open(draft, "wb") as f:
        f.write(b"replace_filter 'bad(' 'x' g;\n")
    code, out, err = yield run(cleanup, "rules", "diff", "--site", "x", draft, "--admin", admin.url,
                               "--token", TOKEN)
    assert (code, out, err) == (1, "", "prexy rules diff: draft.rules:3:7: unbalanced parenthesis\n")


@defer.inlineCallbacks
def pane_shows(tmux: list[str], text: str, seconds: float = 30) -> Any:
    """The pane's text once it holds ``text`` (asked through the reactor
    every 50 ms until ``seconds`` have passed)."""
    give_up = reactor.seconds() + seconds
    while True:
        shown = yield utils.getProcessOutput(tmux[0], [*tmux[1:], "capture-pane", "-p", "-t", "view"],
                                             env=dict(os.environ), errortoo=True)
        if text in shown.decode():
            return shown.decode()
        if reactor.seconds() > give_up:
            raise AssertionError(f"no {text!r} in the pane after {seconds} s:\n{shown.decode()}")
        yield task.deferLater(reactor, 0.05, lambda: None)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest_twisted.inlineCallbacks
def test_top_in_tmux(admin: AdminServer, cleanup: Any) -> Any:
    """``prexy top`` on a real terminal (a tmux pane, 120x40) shows the
    request rate, redrawn in place; Ctrl-C leaves the alternate screen and
    exits 0."""
    tmux = [shutil.which("tmux") or "tmux", "-S", os.path.join(admin.dir, "tmux.sock")]
    status = os.path.join(admin.dir, "status")
    env = child_env()
    inner = " ".join([
        "env", f"PYTHONPATH={env['PYTHONPATH']}", sys.executable, *CLI, "top", "--interval", "0.2",
        "--admin", admin.url, "--token", TOKEN,
    ])
    command = f"{inner}; echo exit=$? > {status}; sleep 600"
    yield utils.getProcessOutput(tmux[0], [*tmux[1:], "-f", "/dev/null", "new-session", "-d", "-s", "view",
                                           "-x", "120", "-y", "40", command], env=dict(os.environ), errortoo=True)
    cleanup(lambda: utils.getProcessOutput(tmux[0], [*tmux[1:], "kill-server"], env=dict(os.environ),
                                           errortoo=True))
    shown = yield pane_shows(tmux, f"requests  {RATE}/s")
    assert "SITE" in shown and "/etc/prexy/shop.rules:7" in shown
    assert shown.splitlines()[0].startswith("prexy top")
    yield utils.getProcessOutput(tmux[0], [*tmux[1:], "send-keys", "-t", "view", "C-c"], env=dict(os.environ),
                                 errortoo=True)

    def exited() -> bool:
        with contextlib.suppress(OSError), open(status) as f:
            return f.read().endswith("\n")
        return False

    yield when_written(exited, "exit status of prexy top after Ctrl-C", [admin.dir], 20)
    with open(status) as f:
        assert f.read().strip() == "exit=0"
    shown = yield pane_shows(tmux, "")
    assert "requests" not in shown  # the alternate screen is gone, the shell's screen is back
