"""Cache notices between workers over real UNIX datagram sockets."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor

from prexy.proxy.events import KeyEvents

from .twistd_support import scratch_dir


class Pair:
    def __init__(self) -> None:
        self.dir = scratch_dir("prexy-events-")
        self.a = KeyEvents(reactor, self.dir, "a")
        self.b = KeyEvents(reactor, self.dir, "b")


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    p.a.start()
    p.b.start()
    yield p
    p.b.stop()
    p.a.stop()


@pytest_twisted.inlineCallbacks
def test_notice_reaches_the_waiter_once(pair: Pair) -> Any:
    """A key announced by one worker wakes the other worker's waiter for
    that key, once; waiters for other keys, and forgotten ones, stay."""
    woke: defer.Deferred[str] = defer.Deferred()
    other: list[str] = []
    pair.b.wait(b"k1", lambda: woke.callback("k1"))
    pair.b.wait(b"k2", lambda: other.append("k2"))
    forget = pair.b.wait(b"k1", lambda: other.append("forgotten"))
    forget()
    pair.a.announce(b"k1")
    got = yield woke
    assert got == "k1"
    assert other == []
    assert list(pair.b.waiters) == [b"k2"]


def test_dead_socket_is_removed(pair: Pair) -> None:
    """A socket file nobody listens on any more (a worker that died) is
    removed by the next announcement."""
    dead = os.path.join(pair.dir, "dead.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(dead)
    s.close()
    pair.a.announce(b"k")
    assert not os.path.exists(dead)
    assert os.path.exists(pair.b.path)


def test_stop_removes_own_socket(pair: Pair) -> None:
    path = pair.a.path
    pair.a.stop()
    assert not os.path.exists(path)
    pair.a.announce(b"k")  # stopped: nothing sent, no error
