"""Run ``twistd -n prexy ...`` as a child process for end-to-end tests.

The child is started with the interpreter running the tests, so it sees the
same installed Prexy; its output goes to a file that tests read; it is
always terminated at cleanup.

Waits fire on events, never on polling: the child's ``sd_notify`` messages
(``READY=1`` once it listens, and again after each reload or worker
restart) arrive on a datagram socket given as ``NOTIFY_SOCKET``, as
systemd's would, its exit is reported by a thread blocked in ``wait()``,
and what it writes to files (its output, logs) is watched with inotify
(:func:`when_written`).

The ports servers listen on come from :func:`free_port`: never the same
twice in a process, and held from their choice until after the server has
bound them (see :func:`_reserve`).  The files of a test go in a
:func:`scratch_dir`, removed when the test ends.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from twisted.internet import defer, endpoints, error, inotify, reactor, task
from twisted.internet.protocol import DatagramProtocol, Factory, Protocol
from twisted.python.filepath import FilePath

TWISTD = "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()"

#: The checkout these tests belong to (holds ``prexy/`` and ``twisted/plugins``).
REPO_ROOT = Path(__file__).resolve().parents[2]


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process: ours, with this checkout first on
    ``PYTHONPATH``.  Children run in temporary directories, where a bare
    ``import prexy`` would find the copy installed in the environment (and
    the workers a master spawns inherit this environment too)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


#: Ports handed out for tests: below the kernel's ephemeral range (32768 up
#: on Linux), so no outgoing connection is given one of them meanwhile.
PORT_RANGE = (20000, 32000)
#: Every port this process handed out: never handed out twice.
_handed_out: set[int] = set()
#: The reservations held now, by port (see :func:`free_port_block`).
_reserved: dict[int, socket.socket] = {}


def _reserve(port: int) -> socket.socket | None:
    """A socket holding ``port`` on 127.0.0.1, or None when it is taken.

    The bind is made without SO_REUSEADDR, so it fails on any socket bound
    to the port (listening, reserved by another test process, or a
    connection of the port in TIME-WAIT).  SO_REUSEADDR is set after the
    bind: Linux then lets a server that sets it too (Twisted, Prexy, nginx
    and redis all do) bind and listen beside the reservation, which never
    listens, while every later probe like this one still sees the port
    taken.  So the port is held from the moment it is chosen until after
    the server holds it, with no gap in between."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    except OSError:
        sock.close()
        return None
    return sock


def free_port_block(n: int = 1) -> int:
    """A base port with ``n`` consecutive ports reserved for this test.

    The ports are held (:func:`_reserve`) until :func:`release_ports`, which
    the test tier's conftest calls after each test; a server started on them
    meanwhile binds beside the reservation.  No port is handed out twice in
    one process, and another process probing this way sees them taken."""
    rng = random.Random()
    low, high = PORT_RANGE
    for _ in range(500):
        base = rng.randrange(low, high - n)
        block = range(base, base + n)
        if _handed_out.intersection(block):
            continue
        held: list[socket.socket] = []
        for port in block:
            sock = _reserve(port)
            if sock is None:
                break
            held.append(sock)
        if len(held) < n:
            for sock in held:
                sock.close()
            continue
        for port, sock in zip(block, held, strict=True):
            _handed_out.add(port)
            _reserved[port] = sock
        return base
    raise RuntimeError(f"no block of {n} free port(s) in {low}-{high}")


def free_port() -> int:
    """One reserved port (see :func:`free_port_block`)."""
    return free_port_block(1)


def free_ports(n: int) -> list[int]:
    """``n`` distinct reserved ports, not necessarily consecutive."""
    return [free_port() for _ in range(n)]


def reserved_ports() -> set[int]:
    """The ports whose reservation is held now."""
    return set(_reserved)


def release_ports(ports: Any = None) -> None:
    """Close the reservations of ``ports`` (all of them by default).  A
    server already listening on one keeps it; the port is never handed out
    again by this process."""
    for port in list(_reserved) if ports is None else list(ports):
        sock = _reserved.pop(port, None)
        if sock is not None:
            sock.close()


#: Directories made by :func:`scratch_dir` and not yet removed.
_scratch: list[str] = []


def scratch_dir(prefix: str = "prexy-test-") -> str:
    """A new directory for one test, removed by :func:`remove_scratch`
    (which the tier's conftest calls after each test)."""
    path = tempfile.mkdtemp(prefix=prefix)
    _scratch.append(path)
    return path


def scratch_dirs() -> list[str]:
    """The directories made by :func:`scratch_dir` not yet removed."""
    return list(_scratch)


def remove_scratch(paths: Any = None) -> None:
    """Remove the scratch directories ``paths`` (all by default)."""
    for path in list(_scratch) if paths is None else list(paths):
        if path in _scratch:
            _scratch.remove(path)
        shutil.rmtree(path, ignore_errors=True)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s; returns once it has exited."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


#: What makes :func:`when_written` look again: a file in a watched
#: directory created, written, closed, renamed or removed.
_WRITES = (
    inotify.IN_CREATE | inotify.IN_MODIFY | inotify.IN_CLOSE_WRITE
    | inotify.IN_MOVED_FROM | inotify.IN_MOVED_TO | inotify.IN_DELETE
)


def when_written(
    condition: Callable[[], bool], what: str, directories: Iterable[str], seconds: float = 10,
    also: Iterable[defer.Deferred[Any]] = (),
) -> defer.Deferred[None]:
    """Fires once ``condition()`` (about files in ``directories``: a log
    line, a file renamed) holds: checked now and again at every change
    inotify reports in those directories, and when one of ``also`` fires (a
    child's exit); fails after ``seconds``."""
    done: defer.Deferred[None] = defer.Deferred()
    watcher = inotify.INotify()

    def look(*_: Any) -> None:
        if not done.called and condition():
            done.callback(None)

    def late() -> None:
        if not done.called:
            done.errback(AssertionError(f"no {what} after {seconds} s"))

    watcher.startReading()
    for directory in directories:
        watcher.watch(FilePath(directory), mask=_WRITES, callbacks=[look])
    for d in also:
        d.addBoth(lambda result: (look(), result)[1])
    timer = reactor.callLater(seconds, late)
    look()  # after the watches are set: no change falls between

    def stop(result: Any) -> Any:
        if timer.active():
            timer.cancel()
        watcher.loseConnection()
        return result

    return done.addBoth(stop)


@defer.inlineCallbacks
def listening(port: int, seconds: float = 10.0) -> Any:
    """Fires once a connection to ``port`` on 127.0.0.1 is accepted, for a
    server that gives no readiness notice (nginx, pebble; Prexy's children
    send READY=1).  Only a refusal (nothing bound yet) is retried, 10 ms
    later, for ``seconds`` at most; any other failure is the test's."""
    give_up = reactor.seconds() + seconds
    endpoint = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", port)
    while True:
        try:
            connected = yield endpoint.connect(Factory.forProtocol(Protocol))
        except error.ConnectionRefusedError:
            if reactor.seconds() > give_up:
                raise AssertionError(f"nothing listens on {port} after {seconds} s") from None
            yield task.deferLater(reactor, 0.01, lambda: None)
        else:
            connected.transport.loseConnection()
            return


class Notifications(DatagramProtocol):
    """The receiving end of a child's ``NOTIFY_SOCKET``: one message a datagram."""

    def __init__(self) -> None:
        self.messages: list[str] = []
        self._waiters: list[tuple[str, defer.Deferred[None]]] = []

    def datagramReceived(self, data: bytes, addr: Any) -> None:
        message = data.decode("utf-8", "replace")
        self.messages.append(message)
        waiting, self._waiters = self._waiters, []
        for wanted, d in waiting:
            if wanted in message.split("\n"):
                d.callback(None)
            else:
                self._waiters.append((wanted, d))

    def next(self, message: str) -> defer.Deferred[None]:
        """Fires on the next datagram, from now on, that holds ``message``."""
        d: defer.Deferred[None] = defer.Deferred()
        self._waiters.append((message, d))
        return d


def listen_notify(directory: str) -> tuple[str, Notifications, Any]:
    """A NOTIFY_SOCKET path in ``directory``, its protocol and its port."""
    path = os.path.join(directory, "notify")
    notifications = Notifications()
    port = reactor.listenUNIXDatagram(path, notifications)
    return path, notifications, port


def exited(process: subprocess.Popen[bytes]) -> defer.Deferred[int]:
    """Fires with the exit code when ``process`` ends (a daemon thread waits,
    so a child left running never holds up the test run's exit)."""
    d: defer.Deferred[int] = defer.Deferred()

    def wait() -> None:
        code = process.wait()
        reactor.callFromThread(d.callback, code)

    threading.Thread(target=wait, daemon=True).start()
    return d


class Twistd:
    """One ``twistd -n prexy`` child process."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, twistd_args: tuple[str, ...] = ()) -> None:
        self.dir = scratch_dir("prexy-test-")
        self.log_path = os.path.join(self.dir, "out.log")
        self._log = open(self.log_path, "wb")
        notify_path, self.notifications, self._notify_port = listen_notify(self.dir)
        environ = child_env({"NOTIFY_SOCKET": notify_path, **(env or {})})
        self.process = subprocess.Popen(
            [sys.executable, "-c", TWISTD, "-n", "--pidfile=", *twistd_args, "prexy", *args],
            cwd=self.dir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environ,
        )
        # Even if a test's cleanup never runs (a broken reactor), the child
        # and its workers must not outlive the test run holding ports.
        atexit.register(self._kill)
        self.exited = exited(self.process)
        self._ready = self.notifications.next("READY=1")

    def _wait(self, d: defer.Deferred[Any], what: str, seconds: float) -> defer.Deferred[Any]:
        """``d``, failing with the output if the child exits first or after
        ``seconds``."""
        result: defer.Deferred[Any] = defer.Deferred()

        def done(value: Any) -> Any:
            if not result.called:
                result.callback(value)
            return value

        def died(code: int) -> int:
            if not result.called:
                result.errback(AssertionError(f"twistd exited {code} before {what}:\n{self.output()}"))
            return code

        def late() -> None:
            if not result.called:
                result.errback(AssertionError(f"no {what} after {seconds} s; output:\n{self.output()}"))

        d.addBoth(done)
        self.exited.addCallback(died)
        timer = reactor.callLater(seconds, late)
        result.addBoth(lambda value: (timer.active() and timer.cancel(), value)[1])
        return result

    def ready(self, seconds: float = 20) -> defer.Deferred[None]:
        """Fires when the child says READY=1 the first time: it listens (all
        its workers are up)."""
        return self._wait(self._ready, "READY=1", seconds)

    def notified(self, message: str = "READY=1", seconds: float = 20) -> Any:
        """Call before the action; yield the result after it: fires on the
        child's next ``message`` (READY=1 after a reload, refused or not, and
        after a dead worker is replaced)."""
        return self._wait(self.notifications.next(message), message, seconds)

    def _kill(self) -> None:
        if self.process.poll() is None:
            for pid in self.children():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.process.kill()

    def output(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def children(self, pid: int | None = None) -> list[int]:
        """Direct children of the twistd process (its workers)."""
        pid = pid or self.process.pid
        out: list[int] = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
        except OSError:
            pass
        return out

    def rss_kib(self) -> int:
        """Resident memory of twistd and all its workers, in KiB."""
        total = 0
        for pid in [self.process.pid, *self.children()]:
            try:
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
            except OSError:
                pass
        return total

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()
        return self._notify_port.stopListening()

    def wait_exit(self, seconds: float = 20) -> defer.Deferred[int]:
        """Fires with the exit code (fails after ``seconds``)."""
        d: defer.Deferred[int] = defer.Deferred()
        self.exited.addCallback(lambda code: (d.called or d.callback(code), code)[1])
        timer = reactor.callLater(
            seconds, lambda: d.called or d.errback(AssertionError(f"twistd did not exit; output:\n{self.output()}"))
        )
        d.addBoth(lambda value: (timer.active() and timer.cancel(), value)[1])
        return d


def body_of(raw: bytes) -> bytes:
    """The body of one raw HTTP/1.1 response, de-chunked (trailers dropped)."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out, rest = b"", body
    while rest:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2 :]
    return out
