"""The worker pool through ``twistd prexy --workers 2``: shared accept queue,
supervision, reload without loss, graceful stop, systemd socket activation,
and metrics summed by the master."""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from .conftest import Cleanups
from .origin import Origin, origin_site
from .test_service import RawClient, connect, metrics_showing
from .twistd_support import (
    TWISTD,
    Twistd,
    body_of,
    child_env,
    free_port,
    free_port_block,
    listen_notify,
    scratch_dir,
)


def socket_owners(pids: list[int]) -> dict[int, int]:
    """Local TCP port -> pid, for the sockets these processes hold."""
    inode_pid: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inode_pid[link[8:-1]] = pid
        except OSError:
            continue
    owners = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                port = int(fields[1].rsplit(":", 1)[1], 16)
                inode = fields[9]
                if inode in inode_pid:
                    owners[port] = inode_pid[inode]
    return owners


class TestWorkerPool:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        self.origin = Origin()
        self.origin_port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        cleanup(self.origin_port.stopListening)
        self.upstream = f"http://127.0.0.1:{self.origin_port.getHost().port}"
        self.dir = scratch_dir("prexy-workers-")
        self.rules = os.path.join(self.dir, "site.rules")
        self.write_rules(b"replace_filter 'hello' 'HELLO' g;\nreplace_filter_types text/plain;\n")

    def write_rules(self, text: bytes) -> None:
        with open(self.rules, "wb") as f:
            f.write(text)

    @defer.inlineCallbacks
    def start(self, *extra: str) -> Any:
        self.port = free_port()
        self.admin = free_port()
        child = Twistd(
            "--listen", f"tcp:{self.port}:interface=127.0.0.1", "--upstream", self.upstream,
            "--rules", self.rules, "--workers", "2", "--admin", f"tcp:{self.admin}:interface=127.0.0.1", *extra,
        )
        self.cleanup(child.stop)
        yield child.ready()  # READY=1 once both workers are ready
        self.child = child
        return child

    @defer.inlineCallbacks
    def get(self, path: str = "/hello", port: int | None = None) -> Any:
        client = RawClient(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield connect(port or self.port, client)
        return bytes(client.data)

    @pytest_twisted.inlineCallbacks
    def test_both_workers_serve(self) -> Any:
        """Connections are spread over both workers by the shared queue; the
        workers are ``python -m prexy.worker`` processes."""
        child = yield self.start()
        workers = child.children()
        assert len(workers) == 2
        for pid in workers:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                assert f.read().split(b"\0")[1:3] == [b"-m", b"prexy.worker"]
        seen: set[int] = set()
        for _ in range(20):
            answers = yield defer.gatherResults([self.get() for _ in range(20)])
            assert all(body_of(a) == b"HELLO world!" for a in answers)
            owners = socket_owners(workers)
            seen |= {owners[p] for p in self.origin.peer_ports if p in owners}
            if len(seen) == 2:
                break
        assert seen == set(workers)

    @pytest_twisted.inlineCallbacks
    def test_killed_worker_comes_back(self) -> Any:
        """SIGKILL of a worker: new requests keep succeeding on the other one,
        and the master starts a replacement."""
        child = yield self.start()
        victim, survivor = child.children()
        replaced = child.notified("READY=1")  # the pool is whole again
        os.kill(victim, signal.SIGKILL)
        for _ in range(10):
            answer = yield self.get()
            assert body_of(answer) == b"HELLO world!", answer[:200]
        yield replaced
        now = child.children()
        assert len(now) == 2
        assert victim not in now
        assert survivor in now
        assert "restarting" in child.output()

    @pytest_twisted.inlineCallbacks
    def test_reload_with_broken_rules_keeps_old(self) -> Any:
        """SIGHUP with a broken rules file: logged with file and line, the old
        rules keep serving, the workers are not replaced."""
        child = yield self.start()
        before = child.children()
        self.write_rules(b"replace_filter 'hello' 'BYE' gx;\n")
        refused = child.notified("READY=1")  # sent after the refusal is logged
        os.kill(child.process.pid, signal.SIGHUP)
        yield refused
        assert f"reload refused, keeping the running configuration: {self.rules}:1:" in child.output()
        answer = yield self.get()
        assert body_of(answer) == b"HELLO world!"
        assert sorted(child.children()) == sorted(before)

    @defer.inlineCallbacks
    def replace_every_worker(self, child: Twistd) -> Any:
        """SIGKILL each worker in turn and wait until the master has a whole
        pool again: afterwards only replacements serve."""
        for victim in child.children():
            replaced = child.notified("READY=1", seconds=15)  # the pool is whole again
            os.kill(victim, signal.SIGKILL)
            yield replaced
        assert len(child.children()) == 2

    @defer.inlineCallbacks
    def bodies(self, n: int = 30) -> Any:
        answers = yield defer.gatherResults([self.get() for _ in range(n)])
        return {body_of(a) for a in answers}

    @pytest_twisted.inlineCallbacks
    def test_restarted_workers_serve_the_configuration_in_force(self) -> Any:
        """A rules file changed without a reload: workers that replace dead
        ones serve the rules the master validated, not the file's new
        text, so the site never serves two rule sets at once; the next
        SIGHUP puts the new rules in force everywhere."""
        child = yield self.start()
        self.write_rules(b"replace_filter 'hello' 'HOWDY' g;\nreplace_filter_types text/plain;\n")
        yield self.replace_every_worker(child)
        assert (yield self.bodies()) == {b"HELLO world!"}
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        assert (yield self.bodies()) == {b"HOWDY world!"}

    @pytest_twisted.inlineCallbacks
    def test_reload_in_place_with_a_relative_config_path(self) -> Any:
        """``--config`` named relative to the master's working directory:
        the workers reload in place from the master's snapshot (they look
        the file up by its absolute name) and serve the new rules."""
        self.port = free_port()
        config = os.path.join(self.dir, "prexy.toml")
        with open(config, "w") as f:
            f.write(
                f"[server]\nlisten = ['tcp:{self.port}:interface=127.0.0.1']\nworkers = 2\naccess_log = 'off'\n"
                f"[sites.t]\nupstream = '{self.upstream}'\nrules = ['site.rules']\n"
            )
        # The child runs in a scratch directory beside ours (same parent).
        child = Twistd("--config", os.path.join("..", os.path.basename(self.dir), "prexy.toml"))
        self.cleanup(child.stop)
        yield child.ready()
        assert os.path.dirname(child.dir) == os.path.dirname(self.dir)
        assert (yield self.bodies()) == {b"HELLO world!"}
        self.write_rules(b"replace_filter 'hello' 'HOWDY' g;\nreplace_filter_types text/plain;\n")
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        assert "reload refused" not in child.output()
        assert (yield self.bodies()) == {b"HOWDY world!"}

    @pytest_twisted.inlineCallbacks
    def test_broken_rules_on_disk_never_take_the_site_down(self) -> Any:
        """A broken rules file, refused by SIGHUP as documented, then every
        worker killed: the replacements start with the running rules (they
        never read the broken file) and the site keeps answering."""
        child = yield self.start()
        self.write_rules(b"replace_filter 'hello' 'BYE' gx;\n")
        refused = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield refused
        assert "reload refused" in child.output()
        yield self.replace_every_worker(child)
        assert (yield self.bodies()) == {b"HELLO world!"}
        assert "usage" not in child.output().lower()

    @pytest_twisted.inlineCallbacks
    def test_reload_under_load_loses_nothing(self) -> Any:
        """SIGHUP with good rules while requests keep coming: every request
        succeeds, the workers reload in place (only a site's rules changed:
        the same processes serve on), and afterwards the new rules are in
        force."""
        child = yield self.start()
        before = set(child.children())
        failures: list[bytes] = []
        counts = [0]
        stop = [False]
        #: (count, fired when that many answers have come back)
        milestones: list[tuple[int, defer.Deferred[None]]] = []

        def answered(n: int) -> defer.Deferred[None]:
            d: defer.Deferred[None] = defer.Deferred()
            milestones.append((counts[0] + n, d))
            return d.addTimeout(20, reactor)

        @defer.inlineCallbacks
        def load() -> Any:
            while not stop[0]:
                answer = yield self.get()
                counts[0] += 1
                if not (answer.startswith(b"HTTP/1.1 200") and body_of(answer) in (b"HELLO world!", b"BYE world!")):
                    failures.append(answer[:200])
                for milestone in [m for m in milestones if m[0] <= counts[0]]:
                    milestones.remove(milestone)
                    milestone[1].callback(None)

        loops = [load() for _ in range(4)]
        yield answered(12)  # the load is on
        self.write_rules(b"replace_filter 'hello' 'BYE' g;\nreplace_filter_types text/plain;\n")
        reloaded = child.notified("READY=1")  # every worker has reloaded
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        yield answered(12)  # and goes on after the reload
        stop[0] = True
        yield defer.gatherResults(loops)
        assert failures == []
        assert counts[0] > 20
        assert set(child.children()) == before
        answer = yield self.get()
        assert body_of(answer) == b"BYE world!"

    @pytest_twisted.inlineCallbacks
    def test_reload_does_not_wait_for_a_starting_worker(self) -> Any:
        """A reload while a killed worker's replacement is still starting
        (held stopped here, as a long start on a busy machine holds it)
        answers at once, once the serving worker took it; every answer
        after it has the new rules.  The starting worker is kept: when it
        has loaded it is handed the new configuration before it serves, so
        its answers have the new rules too, and the pool is whole again."""
        child = yield self.start()
        victim, survivor = child.children()
        os.kill(victim, signal.SIGKILL)
        starting = 0
        deadline = reactor.seconds() + 20
        def running_worker(pid: int) -> bool:  # (stopped before its exec, it would hold the master)
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    return b"prexy.worker" in f.read()
            except OSError:
                return False

        while not starting and reactor.seconds() < deadline:  # the replacement, as soon as it runs
            started = [pid for pid in child.children() if pid not in (victim, survivor) and running_worker(pid)]
            if started:
                starting = started[0]
                os.kill(starting, signal.SIGSTOP)
            else:
                yield deferLater(reactor, 0.002, lambda: None)
        assert starting, "no replacement was started"

        def resume() -> None:
            try:
                os.kill(starting, signal.SIGCONT)
            except ProcessLookupError:
                pass

        self.cleanup(resume)
        self.write_rules(b"replace_filter 'hello' 'BYE' g;\nreplace_filter_types text/plain;\n")
        client = RawClient(b"POST /reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        yield connect(self.admin, client).addTimeout(10, reactor)
        assert bytes(client.data).startswith(b"HTTP/1.1 200"), bytes(client.data)[:200]
        assert b"reloaded" in bytes(client.data)
        assert "is still starting; it takes this configuration before it serves" in child.output()
        for _ in range(10):
            answer = yield self.get()
            assert body_of(answer) == b"BYE world!"
        resume()
        while f"worker {starting} (generation 1) ready" not in child.output() and reactor.seconds() < deadline:
            yield deferLater(reactor, 0.05, lambda: None)
        assert starting in child.children() and len(child.children()) == 2
        assert f"worker {starting} started with an earlier configuration" in child.output()
        answers = yield defer.gatherResults([self.get() for _ in range(20)])
        assert all(body_of(a) == b"BYE world!" for a in answers)

    @pytest_twisted.inlineCallbacks
    def test_reload_command_through_admin(self) -> Any:
        """``twistd prexy ... --reload`` asks the running master over its admin
        endpoint; a refused reload says why (409)."""
        yield self.start()
        args = [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy",
                "--listen", f"tcp:{self.port}:interface=127.0.0.1", "--upstream", self.upstream,
                "--rules", self.rules, "--admin", f"tcp:{self.admin}:interface=127.0.0.1", "--reload"]
        self.write_rules(b"replace_filter 'hello' 'BYE' g;\nreplace_filter_types text/plain;\n")
        result = yield deferToThread(
            subprocess.run, args, capture_output=True, text=True, timeout=60, env=child_env()
        )
        assert result.returncode == 0, result.stderr
        assert "reloaded" in result.stdout
        answer = yield self.get()
        assert body_of(answer) == b"BYE world!"
        # A broken rules file: the master refuses, with the file and line.
        client = RawClient(b"POST /reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        self.write_rules(b"replace_filter 'x' 'y' q;\n")
        yield connect(self.admin, client)
        assert bytes(client.data).startswith(b"HTTP/1.1 409"), bytes(client.data)[:200]
        assert self.rules.encode() + b":1:" in bytes(client.data)

    @pytest_twisted.inlineCallbacks
    def test_sigterm_drains(self) -> Any:
        """SIGTERM lets a request in flight finish, then everything exits and
        no worker is left holding the port."""
        child = yield self.start()
        workers = child.children()
        slow = self.get("/slow?s=1")
        # The request is in flight once the origin has it.
        yield self.origin.when(lambda: any(r.path == b"/slow" for r in self.origin.requests)).addTimeout(20, reactor)
        child.process.send_signal(signal.SIGTERM)
        answer = yield slow
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
        assert body_of(answer) == b"slow answer"
        code = yield child.wait_exit(20)
        # twistd ends by re-raising the signal it stopped on (systemd reads
        # that as a clean stop).
        assert code in (0, -signal.SIGTERM)
        for pid in workers:
            assert not (os.path.exists(f"/proc/{pid}/status") and "zombie" not in open(f"/proc/{pid}/status").read())

    @pytest_twisted.inlineCallbacks
    def test_sigterm_stops_listening_at_once(self) -> Any:
        """While a request drains, new connections are refused at once (a
        load balancer tries another node) instead of being accepted into a
        backlog nobody reads and reset seconds later."""
        child = yield self.start()
        slow = self.get("/slow?s=3")
        yield self.origin.when(lambda: any(r.path == b"/slow" for r in self.origin.requests)).addTimeout(20, reactor)
        stopping = child.notified("STOPPING=1")
        child.process.send_signal(signal.SIGTERM)
        yield stopping
        signalled = reactor.seconds()

        def attempt() -> str:
            with socket.socket() as s:
                s.settimeout(1)
                try:
                    s.connect(("127.0.0.1", self.port))
                    s.sendall(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
                    return "answered" if s.recv(100) else "closed"
                except ConnectionRefusedError:
                    return "refused"
                except OSError as e:
                    return f"error {e}"

        # The workers close their copies when the master's SIGTERM reaches
        # them; each attempt blocks at most 1 s, so this takes a few tries.
        outcomes = []
        while reactor.seconds() - signalled < 2.5:
            outcome = yield deferToThread(attempt)
            outcomes.append(outcome)
            if outcome == "refused":
                break
        assert outcomes[-1] == "refused", outcomes
        assert reactor.seconds() - signalled < 2.5
        answer = yield slow  # the request in flight still completes
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
        yield child.wait_exit(20)

    @pytest_twisted.inlineCallbacks
    def test_metrics_summed_over_workers(self) -> Any:
        """The master's /metrics counts the requests of both workers."""
        yield self.start()
        yield defer.gatherResults([self.get() for _ in range(30)])
        # The workers report on their own timer: the master's page shows the
        # sum once both have reported since.
        text = yield metrics_showing(self.admin, 'prexy_requests_total{status="200"} 30')
        assert "prexy_workers 2.0" in text


class TestSocketActivation:
    """A systemd-like launcher: bind, pass fd 3 with LISTEN_FDS/LISTEN_PID, exec."""

    @pytest.fixture(autouse=True)
    def _cleanup(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup

    @pytest_twisted.inlineCallbacks
    def test_systemd_socket(self) -> Any:
        origin = Origin()
        origin_port = reactor.listenTCP(0, origin_site(origin), interface="127.0.0.1")
        self.cleanup(origin_port.stopListening)
        port = free_port_block(1)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
        launcher = (
            "import os, sys\n"
            "fd = int(sys.argv[1])\n"
            "os.dup2(fd, 3)\n"
            "os.environ['LISTEN_FDS'] = '1'\n"
            "os.environ['LISTEN_PID'] = str(os.getpid())\n"
            "os.environ['LISTEN_FDNAMES'] = 'http'\n"
            "os.execv(sys.executable, [sys.executable, '-c', sys.argv[2], *sys.argv[3:]])\n"
        )
        log_dir = scratch_dir("prexy-sd-")
        log = open(os.path.join(log_dir, "out.log"), "wb")
        notify_path, notifications, notify_port = listen_notify(log_dir)
        self.cleanup(notify_port.stopListening)
        ready = notifications.next("READY=1")
        proc = subprocess.Popen(
            [sys.executable, "-c", launcher, str(sock.fileno()), TWISTD, "-n", "--pidfile=", "prexy",
             "--listen", "systemd:domain=INET:index=0", "--workers", "2",
             "--upstream", f"http://127.0.0.1:{origin_port.getHost().port}"],
            pass_fds=(sock.fileno(),), stdout=log, stderr=subprocess.STDOUT, cwd=log_dir,
            env=child_env({"NOTIFY_SOCKET": notify_path}),
        )
        sock.close()  # only the launched process holds it now

        def cleanup() -> None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()

        atexit.register(lambda: proc.poll() is None and proc.kill())
        self.cleanup(cleanup)
        # As systemd would: READY=1 on NOTIFY_SOCKET once the workers serve.
        yield ready.addTimeout(30, reactor)
        client = RawClient(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield connect(port, client)
        answer = bytes(client.data)
        assert answer.endswith(b"hello world!"), open(os.path.join(log_dir, "out.log")).read()[-2000:]


class TestSharedCache:
    """The cache store is one per machine: with two workers an object
    fetched by one is a hit in the other, and PURGE or a ban through the
    master's admin endpoint reach both."""

    @pytest.fixture(autouse=True)
    def _cleanup(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup

    @pytest_twisted.inlineCallbacks
    def test_cache_shared_by_workers(self) -> Any:
        origin = Origin()
        origin_port = reactor.listenTCP(0, origin_site(origin), interface="127.0.0.1")
        self.cleanup(origin_port.stopListening)
        port, admin = free_port(), free_port()
        store = os.path.join(scratch_dir("prexy-shared-"), "store")
        config = os.path.join(scratch_dir("prexy-shared-"), "prexy.toml")
        with open(config, "w") as f:
            f.write(
                f"[server]\nlisten = ['tcp:{port}:interface=127.0.0.1']\nadmin = 'tcp:{admin}:interface=127.0.0.1'\n"
                f"workers = 2\naccess_log = 'off'\n[cache]\nsize = '32M'\npath = {store!r}\n"
                f"[sites.t]\nupstream = 'http://127.0.0.1:{origin_port.getHost().port}'\n"
            )
        child = Twistd("--config", config)
        self.cleanup(child.stop)
        yield child.ready()  # both workers are ready
        workers = child.children()
        assert len(workers) == 2

        @defer.inlineCallbacks
        def get(path: bytes, method: bytes = b"GET") -> Any:
            client = RawClient(method + b" " + path + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            yield connect(port, client)
            return bytes(client.data)

        # Many new connections: both workers answer, the origin is asked once.
        answers = []
        for _ in range(10):
            batch = yield defer.gatherResults([get(b"/c/shared") for _ in range(10)])
            answers += batch
        assert all(body_of(a) == b"page /c/shared #1 lang=-" for a in answers)
        assert origin.hits[b"/c/shared"] == 1
        hits = sum(1 for a in answers if b"Cache-Status: prexy; hit" in a)
        assert hits >= 90

        purged = yield get(b"/c/shared", b"PURGE")
        assert b"purged 1" in purged
        for _ in range(4):
            yield get(b"/c/shared")
        assert origin.hits[b"/c/shared"] == 2

        ban = RawClient(
            b"POST /ban?regex=%5E.*/c/shared HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        yield connect(admin, ban)
        assert b"banned 1" in bytes(ban.data)
        for _ in range(4):
            yield get(b"/c/shared")
        assert origin.hits[b"/c/shared"] == 3
