"""The Redis connection against a fake transport: commands go out as RESP
arrays, replies (whole, byte by byte, several in one read) fire the
commands' Deferreds in order, error replies fail only their command,
channel messages go to the subscriber callback, and a cancelled command,
a protocol error or a lost connection end everything pending."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.cluster.redis import RedisConnection, RedisError, connect, endpoint_for, prepare
from prexy.cluster.settings import RedisAddress
from tests.cluster.fakeredis import Error, resp


def connected(on_message: Any = None) -> tuple[RedisConnection, StringTransport]:
    connection = RedisConnection(on_message)
    transport = StringTransport()
    connection.makeConnection(transport)
    return connection, transport


REPLIES = [b"OK", 5, None, [b"a", [b"1-0", [b"k", b"v"]]], b"", [], b"x" * 300]


class CommandTests(SynchronousTestCase):
    def test_encoding(self) -> None:
        """Arguments go out as one RESP array of bulk strings."""
        c, t = connected()
        c.command("XADD", b"k", "*", 3, 1.5)
        self.assertEqual(t.value(), b"*5\r\n$4\r\nXADD\r\n$1\r\nk\r\n$1\r\n*\r\n$1\r\n3\r\n$3\r\n1.5\r\n")

    def test_replies_in_order(self) -> None:
        """Pipelined commands get their replies in order, the whole reply stream in one read."""
        c, t = connected()
        ds = [c.command("PING") for _ in REPLIES]
        c.dataReceived(b"".join(resp(r) for r in REPLIES))
        self.assertEqual([self.successResultOf(d) for d in ds], REPLIES)

    @given(st.integers(1, 40))
    def test_any_chunking(self, size: int) -> None:
        """Replies split anywhere (down to one byte) are reassembled."""
        c, t = connected()
        ds = [c.command("PING") for _ in REPLIES]
        data = b"".join(resp(r) for r in REPLIES)
        for i in range(0, len(data), size):
            c.dataReceived(data[i : i + size])
        self.assertEqual([self.successResultOf(d) for d in ds], REPLIES)

    def test_error_reply(self) -> None:
        """An error reply fails its command only."""
        c, t = connected()
        d1, d2 = c.command("XINFO", "STREAM", "k"), c.command("PING")
        c.dataReceived(resp(Error("ERR no such key")) + resp("PONG"))
        self.assertEqual(str(self.failureResultOf(d1, RedisError).value), "ERR no such key")
        self.assertEqual(self.successResultOf(d2), b"PONG")

    def test_messages_go_to_the_subscriber(self) -> None:
        """[message, channel, payload] arrays are channel messages, not replies."""
        seen: list[tuple[bytes, bytes]] = []
        c, t = connected(lambda ch, p: seen.append((ch, p)))
        d = c.command("SUBSCRIBE", "ch")
        c.dataReceived(resp([b"subscribe", b"ch", 1]) + resp([b"message", b"ch", b"entry 1-0"]))
        self.assertEqual(self.successResultOf(d), [b"subscribe", b"ch", 1])
        d = c.command("PING")
        c.dataReceived(resp([b"message", b"ch", b"ack a 1-0"]) + resp([b"pong", b""]))
        self.assertEqual(self.successResultOf(d), [b"pong", b""])
        self.assertEqual(seen, [(b"ch", b"entry 1-0"), (b"ch", b"ack a 1-0")])

    def test_cancel_aborts(self) -> None:
        """A cancelled command (a timeout) aborts the connection: later
        replies could not be matched any more."""
        c, t = connected()
        d = c.command("XREAD")
        d.cancel()
        self.failureResultOf(d)
        self.assertTrue(t.disconnecting)

    def test_timeout_on_a_clock(self) -> None:
        clock = Clock()
        c, t = connected()
        d = c.command("PING").addTimeout(5, clock)
        clock.advance(5)
        self.failureResultOf(d)
        self.assertTrue(t.disconnecting)

    def test_connection_lost_fails_pending(self) -> None:
        c, t = connected()
        d1, d2 = c.command("A"), c.command("B")
        c.dataReceived(resp("OK"))
        c.connectionLost(Failure(ConnectionLost()))
        self.successResultOf(d1)
        self.failureResultOf(d2, ConnectionLost)
        self.successResultOf(c.closed)
        self.failureResultOf(c.command("C"), ConnectionDone)

    def test_protocol_error_aborts(self) -> None:
        """Bytes that are not RESP drop the connection."""
        c, t = connected()
        c.command("PING")
        c.dataReceived(b"?garbage\r\n")
        self.assertTrue(t.disconnecting)
        self.flushLoggedErrors()

    def test_unexpected_reply_aborts(self) -> None:
        """A reply to no command drops the connection."""
        c, t = connected()
        c.dataReceived(resp("OK"))
        self.assertTrue(t.disconnecting)

    def test_not_connected(self) -> None:
        self.failureResultOf(RedisConnection().command("PING"), ConnectionDone)


class ConnectTests(SynchronousTestCase):
    def test_prepare_auth_select(self) -> None:
        """AUTH (with user when given) and SELECT go first, as the URL says."""
        c, t = connected()
        d = prepare(c, RedisAddress.parse("redis://u:p@h/3"))
        self.assertEqual(t.value(), b"*3\r\n$4\r\nAUTH\r\n$1\r\nu\r\n$1\r\np\r\n*2\r\n$6\r\nSELECT\r\n$1\r\n3\r\n")
        c.dataReceived(resp("OK") + resp("OK"))
        self.assertIs(self.successResultOf(d), c)
        c, t = connected()
        self.assertIs(self.successResultOf(prepare(c, RedisAddress.parse("redis://h"))), c)
        self.assertEqual(t.value(), b"")

    def test_prepare_refused(self) -> None:
        c, t = connected()
        d = prepare(c, RedisAddress.parse("redis://:bad@h"))
        c.dataReceived(resp(Error("WRONGPASS invalid password")))
        self.assertIn("WRONGPASS", str(self.failureResultOf(d, RedisError).value))

    def test_endpoints(self) -> None:
        """TCP (by host name or address) and UNIX sockets, through the reactor passed in."""
        reactor = MemoryReactorClock()
        connect(reactor, RedisAddress.parse("unix:///run/r.sock"))
        self.assertEqual(reactor.unixClients[0][0], "/run/r.sock")
        self.assertEqual(type(endpoint_for(reactor, RedisAddress.parse("redis://127.0.0.1:7"))).__name__,
                         "HostnameEndpoint")
