"""What ``twistd prexy`` prints when it cannot start or cannot do what it
was asked: one line naming the endpoint and the reason for a listen that
fails (every endpoint kind, the master of a pool and ``--workers 0``), only
the error (no usage text) for a configuration that does not load, at
start-up, with ``--check`` and with ``--reload``.  Real occupied ports,
``twistd`` in a child process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from prexy.listen import ListenError, clear_stale_unix_socket

from .test_tls import make_pki
from .twistd_support import TWISTD, child_env, free_port


def twistd(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, env=child_env(),
    )


@pytest.fixture
def folder() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="prexy-startup-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def occupied(family: int = socket.AF_INET, host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on a free port: the port a Prexy is told to take."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(8)
    return sock


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


def assert_one_line(result: subprocess.CompletedProcess[str], line: str) -> None:
    """Exit status 1; ``line`` once in the output, on a line of its own
    (after the log's time and source), and no traceback."""
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "Traceback" not in output, output
    assert "Usage" not in output, output
    hits = [x for x in output.splitlines() if x.endswith(line)]
    assert len(hits) == 1, output
    others = [x for x in output.splitlines() if x not in hits and "UnixAppLogger" not in x and "ProxySite" not in x]
    assert others == [], output


KINDS = ["tcp", "tcp6", "unix", "unix-in-use", "ssl", "systemd", "admin"]


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("kind", KINDS)
def test_listen_failure_is_one_line(kind: str, workers: str, folder: str) -> None:
    """A port in use (a missing folder for a UNIX socket, no socket from
    systemd): one line ``cannot listen on ENDPOINT: REASON``, exit 1."""
    held: list[socket.socket] = []
    listen = f"tcp:{free_port()}:interface=127.0.0.1"
    extra: list[str] = []
    if kind == "tcp":
        held.append(occupied())
        listen = f"tcp:{held[0].getsockname()[1]}:interface=127.0.0.1"
        expected = f"cannot listen on {listen}: Address already in use"
    elif kind == "tcp6":
        if not has_ipv6_loopback():
            pytest.skip("no IPv6 loopback")
        held.append(occupied(socket.AF_INET6, "::1"))
        listen = f"tcp6:{held[0].getsockname()[1]}:interface=\\:\\:1"
        expected = f"cannot listen on {listen}: Address already in use"
    elif kind == "unix":
        listen = f"unix:{folder}/missing/prexy.sock"
        expected = f"cannot listen on {listen}: No such file or directory"
    elif kind == "unix-in-use":
        path = os.path.join(folder, "prexy.sock")
        other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        other.bind(path)
        other.listen(8)
        held.append(other)
        listen = f"unix:{path}"
        expected = f"cannot listen on {listen}: Address already in use"
    elif kind == "ssl":
        pki = make_pki(folder)
        held.append(occupied())
        listen = f"ssl:{held[0].getsockname()[1]}:interface=127.0.0.1:privateKey={pki['key']}:certKey={pki['cert']}"
        expected = f"cannot listen on {listen}: Address already in use"
    elif kind == "systemd":
        listen = "systemd:domain=INET:name=http"
        expected = f"{listen}: systemd passed no socket named 'http'"
    else:
        held.append(occupied())
        admin = f"tcp:{held[0].getsockname()[1]}:interface=127.0.0.1"
        extra = ["--admin", admin]
        expected = f"cannot listen on {admin}: Address already in use"
    try:
        result = twistd("--listen", listen, "--upstream", "http://127.0.0.1:1", "--workers", workers, *extra,
                        cwd=folder)
    finally:
        for sock in held:
            sock.close()
    assert_one_line(result, expected)


def write(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write(text)
    return path


BROKEN = "[server]\nadmin = 'tcp:{admin}:interface=127.0.0.1'\n[sites.a]\nupstream = 'http://127.0.0.1:1'\ntimeout = 3\n"


@pytest.mark.parametrize(
    "flag, then", [("--reload", "prexy: reload not requested"), ("--check", "prexy: configuration test failed"),
                   (None, None)],
)
def test_broken_config_prints_only_the_error(flag: Any, then: Any, folder: str) -> None:
    """A configuration that does not load, with --reload, --check or at
    start-up: ``prexy: FILE:LINE: reason`` (and what was not done), no
    usage text, exit 1."""
    config = write(folder, "prexy.toml", BROKEN.format(admin=free_port()))
    result = twistd("--config", config, *([flag] if flag else []), cwd=folder)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [f"prexy: {config}:5: sites.a.timeout: unknown key"]
    if then:
        lines.append(then)
    got = result.stderr.splitlines()
    assert len(got) == len(lines), result.stderr
    assert all(g.startswith(want) for g, want in zip(got, lines, strict=True)), result.stderr
    assert result.stdout == ""


def test_listen_failure_daemonised(folder: str) -> None:
    """Without --nodaemon, twistd's launching process prints the same line
    and exits 1 (it would wait for ever on an exit it is not told about);
    the pid file is gone."""
    held = occupied()
    listen = f"tcp:{held.getsockname()[1]}:interface=127.0.0.1"
    pidfile = os.path.join(folder, "twistd.pid")
    try:
        result = subprocess.run(
            [sys.executable, "-c", TWISTD, f"--pidfile={pidfile}", f"--logfile={folder}/twistd.log", "prexy",
             "--listen", listen, "--upstream", "http://127.0.0.1:1", "--workers", "0"],
            capture_output=True, text=True, timeout=60, cwd=folder, env=child_env(),
        )
    finally:
        held.close()
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"cannot listen on {listen}: Address already in use" in result.stderr
    assert not os.path.exists(pidfile)


def test_unix_socket_path(folder: str) -> None:
    """Before listening on a UNIX socket: a socket nobody listens on any
    more (left by a process that died) is removed; one a process listens
    on, or a file that is not a socket, is refused and left alone."""
    path = os.path.join(folder, "prexy.sock")
    clear_stale_unix_socket("unix:" + path, path)  # nothing there: nothing to do
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)
    stale.close()
    clear_stale_unix_socket("unix:" + path, path)
    assert not os.path.exists(path)
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(path)
    live.listen(1)
    try:
        with pytest.raises(ListenError, match="Address already in use"):
            clear_stale_unix_socket("unix:" + path, path)
        assert os.path.exists(path)
    finally:
        live.close()
    plain = write(folder, "plain", "data")
    with pytest.raises(ListenError, match="exists and is not a socket"):
        clear_stale_unix_socket("unix:" + plain, plain)
    assert os.path.exists(plain)
