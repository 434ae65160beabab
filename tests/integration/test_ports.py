"""The ports tests hand their servers: never the same twice, and held from
the moment they are chosen until the server has bound them.

A port chosen by binding and closing a probe socket is free only for that
instant: a second choice in the same process could pick it again (seven
``free_port()`` calls for one nginx once gave two equal ports, and nginx
merged the two ``server`` blocks), and so could another process before the
server binds it.  ``free_port`` now keeps a reservation (a bound socket
that never listens) which a server setting SO_REUSEADDR binds beside.
"""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
import types
from typing import Any

import pytest

from . import twistd_support
from .twistd_support import free_port, free_port_block, free_ports, release_ports, reserved_ports

#: What another process (another test run on the machine) does to probe a port.
PROBE = (
    "import socket, sys\n"
    "s = socket.socket()\n"
    "try:\n"
    "    s.bind(('127.0.0.1', int(sys.argv[1])))\n"
    "except OSError as e:\n"
    "    print(e.errno)\n"
    "else:\n"
    "    print(0)\n"
)


def probe_elsewhere(port: int) -> int:
    """The errno another process gets binding ``port`` (0: it could)."""
    done = subprocess.run([sys.executable, "-c", PROBE, str(port)], capture_output=True, text=True, timeout=30)
    return int(done.stdout)


class Repeating:
    """A ``random.Random`` whose ``randrange`` gives one base over and over
    before moving on: the worst luck separate choices can have."""

    def __init__(self, base: int, repeats: int) -> None:
        self.base = base
        self.repeats = repeats

    def randrange(self, low: int, high: int) -> int:
        if self.repeats > 0:
            self.repeats -= 1
            return self.base
        self.base += 1
        return self.base


def test_never_the_same_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seven choices that all draw the same random port still give seven
    different ports, and a released port is not handed out again."""
    base = free_port()
    release_ports([base])
    luck = Repeating(base, repeats=50)
    monkeypatch.setattr(twistd_support, "random", types.SimpleNamespace(Random=lambda: luck))
    ports = [free_port() for _ in range(7)]
    assert len(set(ports)) == 7, ports
    assert base not in ports
    block = free_port_block(3)
    assert not {block, block + 1, block + 2} & set(ports)


def test_free_ports_are_distinct() -> None:
    ports = free_ports(20)
    assert len(set(ports)) == 20
    low, high = twistd_support.PORT_RANGE
    assert all(low <= port < high for port in ports)


def test_reserved_until_released() -> None:
    """Another process cannot take a reserved port; once released it can."""
    port = free_port()
    assert port in reserved_ports()
    assert probe_elsewhere(port) == errno.EADDRINUSE
    release_ports([port])
    assert port not in reserved_ports()
    assert probe_elsewhere(port) == 0


def test_server_binds_beside_the_reservation() -> None:
    """A server that sets SO_REUSEADDR (as Twisted, Prexy, nginx and redis
    do) binds and listens on a reserved port while the reservation is held,
    and gets the connections; the port stays taken for everyone else."""
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind(("127.0.0.1", port))
        server.listen(4)
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            accepted, _ = server.accept()
            accepted.close()
        release_ports([port])
        assert probe_elsewhere(port) == errno.EADDRINUSE
    finally:
        server.close()


def test_reservation_refuses_connections(cleanup: Any) -> None:
    """Until a server listens, a reserved port refuses connections, as a
    port nobody holds does (the reservation never listens)."""
    port = free_port()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
