"""Cache notices between workers over real UNIX datagram sockets."""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from prexy.proxy.events import KeyEvents


class KeyEventsTests(TestCase):
    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="prexy-events-")
        self.a = KeyEvents(reactor, self.dir, "a")
        self.b = KeyEvents(reactor, self.dir, "b")
        self.a.start()
        self.b.start()
        self.addCleanup(self.a.stop)
        self.addCleanup(self.b.stop)

    @defer.inlineCallbacks
    def test_notice_reaches_the_waiter_once(self) -> Any:
        """A key announced by one worker wakes the other worker's waiter for
        that key, once; waiters for other keys, and forgotten ones, stay."""
        woke: defer.Deferred[str] = defer.Deferred()
        other: list[str] = []
        self.b.wait(b"k1", lambda: woke.callback("k1"))
        self.b.wait(b"k2", lambda: other.append("k2"))
        forget = self.b.wait(b"k1", lambda: other.append("forgotten"))
        forget()
        self.a.announce(b"k1")
        got = yield woke
        self.assertEqual(got, "k1")
        self.assertEqual(other, [])
        self.assertEqual(list(self.b.waiters), [b"k2"])

    def test_dead_socket_is_removed(self) -> None:
        """A socket file nobody listens on any more (a worker that died) is
        removed by the next announcement."""
        dead = os.path.join(self.dir, "dead.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(dead)
        s.close()
        self.a.announce(b"k")
        self.assertFalse(os.path.exists(dead))
        self.assertTrue(os.path.exists(self.b.path))

    def test_stop_removes_own_socket(self) -> None:
        path = self.a.path
        self.a.stop()
        self.assertFalse(os.path.exists(path))
        self.a.announce(b"k")  # stopped: nothing sent, no error
