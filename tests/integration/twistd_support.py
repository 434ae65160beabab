"""Run ``twistd -n prexy ...`` as a child process for end-to-end tests.

The child is started with the interpreter running the tests and with this
checkout first on ``PYTHONPATH`` (see :func:`child_env`), so it runs the code
under test, not a copy of Prexy installed in the environment; its output
goes to a file that tests read; it is always terminated at cleanup.
"""

from __future__ import annotations

import atexit
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from twisted.internet import defer, reactor, task
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol

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


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(n: int = 1) -> int:
    """A base port with ``n`` consecutive bindable ports, below the ephemeral
    range (a port that an outgoing connection used recently, even in
    TIME-WAIT, can refuse a listener)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - n)
        if all(_bindable(base + i) for i in range(n)):
            return base
    raise RuntimeError("no block of free ports")


def free_port() -> int:
    return free_port_block(1)


class Twistd:
    """One ``twistd -n prexy`` child process."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.dir = tempfile.mkdtemp(prefix="prexy-test-")
        self.log_path = os.path.join(self.dir, "out.log")
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy", *args],
            cwd=self.dir,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env(env),
        )
        # Even if a test's cleanup never runs (a broken reactor), the child
        # and its workers must not outlive the test run holding ports.
        atexit.register(self._kill)

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
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    @defer.inlineCallbacks
    def wait_exit(self, seconds: float = 20) -> Any:
        for _ in range(int(seconds / 0.05)):
            if self.process.poll() is not None:
                return self.process.returncode
            yield task.deferLater(reactor, 0.05, lambda: None)
        raise AssertionError(f"twistd did not exit; output:\n{self.output()}")


@defer.inlineCallbacks
def wait_listening(port: int, child: Twistd, seconds: float = 20) -> Any:
    """Wait until something accepts on 127.0.0.1:port (or the child died)."""
    endpoint = TCP4ClientEndpoint(reactor, "127.0.0.1", port, timeout=1)
    for _ in range(int(seconds / 0.1)):
        if child.process.poll() is not None:
            raise AssertionError(f"twistd exited {child.process.returncode}:\n{child.output()}")
        try:
            proto = yield endpoint.connect(Factory.forProtocol(Protocol))
        except Exception:
            yield task.deferLater(reactor, 0.1, lambda: None)
            continue
        proto.transport.loseConnection()
        return None
    raise AssertionError(f"nothing listens on {port}; output:\n{child.output()}")


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
