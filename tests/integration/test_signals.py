"""Every signal the README and the systemd unit send, against the master of
``twistd prexy --workers 2`` (systemd's ``$MAINPID``): SIGUSR1 reopens the
logs and the server keeps answering, SIGHUP reloads, SIGTERM and SIGINT
stop it cleanly."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from .conftest import Cleanups
from .origin import Origin, origin_site
from .test_service import RawClient, connect
from .twistd_support import Twistd, body_of, free_port, when_written


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return ""


class TestMasterSignals:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        self.origin = Origin()
        port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        cleanup(port.stopListening)
        self.upstream = f"http://127.0.0.1:{port.getHost().port}"
        self.dir = tempfile.mkdtemp(prefix="prexy-signals-")
        cleanup(lambda: shutil.rmtree(self.dir, ignore_errors=True))
        self.rules = os.path.join(self.dir, "site.rules")
        self.access_log = os.path.join(self.dir, "access.log")
        self.write_rules(b"replace_filter 'hello' 'HELLO' g;\nreplace_filter_types text/plain;\n")

    def write_rules(self, text: bytes) -> None:
        with open(self.rules, "wb") as f:
            f.write(text)

    @defer.inlineCallbacks
    def start(self, access_log: str | None, twistd_args: tuple[str, ...] = (), workers: int = 2) -> Any:
        """``twistd prexy --config FILE --workers 2``, the access log in
        ``access_log`` (None: off)."""
        self.port = free_port()
        config = os.path.join(self.dir, "prexy.toml")
        with open(config, "w") as f:
            f.write(
                f'[server]\nlisten = ["tcp:{self.port}:interface=127.0.0.1"]\n'
                f'access_log = "{access_log or "off"}"\nshutdown_timeout = 5\n'
                f'[sites.a]\nupstream = "{self.upstream}"\nrules = "{self.rules}"\n'
            )
        child = Twistd("--config", config, "--workers", str(workers), twistd_args=twistd_args)
        self.cleanup(child.stop)
        yield child.ready()
        self.child = child
        return child

    def until(self, condition: Callable[[], bool], what: str) -> defer.Deferred[None]:
        """Fires once ``condition()`` holds, looked at whenever a file changes
        in the test's directory (the access logs, twistd's log file) or the
        child's (its output), or the child exits."""
        return when_written(condition, what, (self.dir, self.child.dir), also=(self.child.exited,))

    @defer.inlineCallbacks
    def get(self, path: str = "/hello") -> Any:
        client = RawClient(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield connect(self.port, client)
        return bytes(client.data)

    @defer.inlineCallbacks
    def answers(self, n: int = 10) -> Any:
        """The bodies of ``n`` requests in parallel (both workers answer)."""
        got = yield defer.gatherResults([self.get() for _ in range(n)])
        return {body_of(a) for a in got}

    @pytest_twisted.inlineCallbacks
    def test_usr1_reopens_the_access_log(self) -> Any:
        """logrotate's sequence: the access log is renamed away, SIGUSR1 goes
        to the master; the master passes it on, the workers write a new
        file at the configured path, the old one gets nothing more, and the
        same processes keep serving."""
        child = yield self.start(self.access_log)
        workers = sorted(child.children())
        answer = yield self.get("/hello?before")
        assert body_of(answer) == b"HELLO world!"
        yield self.until(lambda: "/hello?before" in read(self.access_log), "access log line")
        os.rename(self.access_log, self.access_log + ".1")
        os.kill(child.process.pid, signal.SIGUSR1)
        yield self.until(lambda: child.output().count("access log reopened") == 2, "reopen by both workers")
        for _ in range(4):  # both workers, most likely
            answer = yield self.get("/hello?after")
            assert body_of(answer) == b"HELLO world!", answer[:200]
        yield self.until(lambda: "/hello?after" in read(self.access_log), "line in the new access log")
        assert "/hello?after" not in read(self.access_log + ".1")
        assert child.process.poll() is None
        assert sorted(child.children()) == workers  # nobody died
        assert "died" not in child.output()

    @pytest_twisted.inlineCallbacks
    def test_usr1_with_a_twistd_log_file(self) -> Any:
        """``twistd --logfile FILE``: the master's own log is rotated by
        twistd's handler (FILE.1, then a new FILE), and SIGUSR1 still
        reaches the workers, which keep serving."""
        twistd_log = os.path.join(self.dir, "twistd.log")
        child = yield self.start(self.access_log, twistd_args=(f"--logfile={twistd_log}",))
        workers = sorted(child.children())
        os.kill(child.process.pid, signal.SIGUSR1)
        yield self.until(lambda: os.path.exists(twistd_log + ".1"), "rotated twistd log")
        yield self.until(lambda: "reopen their logs" in read(twistd_log) + read(twistd_log + ".1"), "master's log line")
        yield self.until(lambda: child.output().count("access log reopened") == 2, "reopen by both workers")
        assert (yield self.answers()) == {b"HELLO world!"}
        assert sorted(child.children()) == workers

    @pytest_twisted.inlineCallbacks
    def test_usr1_without_an_access_log(self) -> Any:
        """With the access log off, SIGUSR1 (a logrotate postrotate shared
        with other logs) changes nothing: no process ends."""
        child = yield self.start(None)
        workers = sorted(child.children())
        os.kill(child.process.pid, signal.SIGUSR1)
        yield self.until(lambda: "worker(s) reopen their logs" in child.output(), "SIGUSR1 passed on")
        os.kill(child.process.pid, signal.SIGUSR1)  # twice: the handlers stay
        assert (yield self.answers()) == {b"HELLO world!"}
        assert sorted(child.children()) == workers
        assert "died" not in child.output()

    @pytest_twisted.inlineCallbacks
    def test_usr1_in_process(self) -> Any:
        """``--workers 0`` (one process): SIGUSR1 reopens the access log, and
        with the access log off it ends nothing either."""
        child = yield self.start(self.access_log, workers=0)
        yield self.get("/hello?before")
        yield self.until(lambda: "/hello?before" in read(self.access_log), "access log line")
        os.rename(self.access_log, self.access_log + ".1")
        os.kill(child.process.pid, signal.SIGUSR1)
        yield self.until(lambda: "access log reopened" in child.output(), "reopen")
        yield self.get("/hello?after")
        yield self.until(lambda: "/hello?after" in read(self.access_log), "line in the new access log")
        yield child.stop()
        child = yield self.start(None, workers=0)
        os.kill(child.process.pid, signal.SIGUSR1)
        yield self.until(lambda: "SIGUSR1" in child.output() or child.process.poll() is not None, "SIGUSR1 handled")
        assert child.process.poll() is None
        assert (yield self.answers(2)) == {b"HELLO world!"}

    @pytest_twisted.inlineCallbacks
    def test_hup_reloads_and_the_server_answers(self) -> Any:
        """SIGHUP (``ExecReload``) after the rules changed: the new rules are
        in force in every worker, which kept running; then SIGUSR1 and
        another SIGHUP: still answering."""
        child = yield self.start(self.access_log)
        workers = sorted(child.children())
        self.write_rules(b"replace_filter 'hello' 'BYE' g;\nreplace_filter_types text/plain;\n")
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        assert (yield self.answers()) == {b"BYE world!"}
        os.kill(child.process.pid, signal.SIGUSR1)
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        assert (yield self.answers()) == {b"BYE world!"}
        assert sorted(child.children()) == workers

    @pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
    @pytest_twisted.inlineCallbacks
    def test_term_and_int_stop_cleanly(self, signum: int) -> Any:
        """SIGTERM (systemd's stop) and SIGINT (Ctrl-C): the master forwards
        the stop, the workers drain and exit, the master exits cleanly and
        the port is free."""
        child = yield self.start(self.access_log)
        workers = child.children()
        assert (yield self.answers(4)) == {b"HELLO world!"}
        stopping = child.notified("STOPPING=1")
        os.kill(child.process.pid, signum)
        yield stopping
        code = yield child.wait_exit(20)
        # twistd ends by re-raising the signal it stopped on.
        assert code in (0, -signum), child.output()
        for pid in workers:
            assert not os.path.exists(f"/proc/{pid}") or "zombie" in read(f"/proc/{pid}/status")
        assert "Traceback" not in child.output()
