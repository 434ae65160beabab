"""SendNow: bytes leave at once on plain TCP, in order, and never overtake
bytes that had to be queued."""

from __future__ import annotations

from twisted.internet.interfaces import ISSLTransport, ISystemHandle, ITCPTransport
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import alsoProvides

from prexy.proxy.sendnow import SendNow

from .support import ClosingTransport


class FakeSocket:
    def __init__(self, takes: list[int | Exception]) -> None:
        self.takes = takes
        self.sent = b""

    def send(self, data: bytes) -> int:
        take = self.takes.pop(0) if self.takes else len(data)
        if isinstance(take, Exception):
            raise take
        self.sent += data[:take]
        return min(take, len(data))

    def sendmsg(self, parts: list[bytes]) -> int:
        return self.send(b"".join(parts))


class TCP(StringTransport):
    connected = True

    def __init__(self, sock: FakeSocket, tls: bool = False) -> None:
        super().__init__()
        self.sock = sock
        alsoProvides(self, ITCPTransport, ISystemHandle)
        if tls:
            alsoProvides(self, ISSLTransport)

    def getHandle(self) -> FakeSocket:
        return self.sock


class ClosingTCP(ClosingTransport):
    connected = True

    def __init__(self, sock: FakeSocket) -> None:
        super().__init__()
        self.sock = sock
        alsoProvides(self, ITCPTransport, ISystemHandle)

    def getHandle(self) -> FakeSocket:
        return self.sock

    def setTcpNoDelay(self, enabled: bool) -> None:
        pass


class SendNowTests(SynchronousTestCase):
    def test_parts_sent_at_once_in_order(self) -> None:
        sock = FakeSocket([])
        t = TCP(sock)
        SendNow(t).write_parts([b"head", b"body"])
        self.assertEqual((sock.sent, t.value()), (b"headbody", b""))

    def test_parts_partly_sent_queue_the_rest_in_order(self) -> None:
        """Whatever part a send stops in, the rest is queued behind it,
        and so is everything written after."""
        for take in (0, 2, 4, 6, 7):
            sock = FakeSocket([take])
            t = TCP(sock)
            out = SendNow(t)
            out.write_parts([b"head", b"body"])
            out.write(b"+next")
            self.assertEqual(sock.sent + t.value(), b"headbody+next", take)
            self.assertEqual(sock.sent, b"headbody"[:take])

    def test_sent_at_once(self) -> None:
        sock = FakeSocket([])
        t = TCP(sock)
        out = SendNow(t)
        out.write(b"GET / HTTP/1.1\r\n\r\n")
        out.write(b"more")
        self.assertEqual((sock.sent, t.value()), (b"GET / HTTP/1.1\r\n\r\nmore", b""))

    def test_partial_send_queues_the_rest_and_all_later_bytes(self) -> None:
        sock = FakeSocket([3])
        t = TCP(sock)
        out = SendNow(t)
        out.write(b"abcdef")
        out.write(b"gh")  # the socket would take it, but bytes are queued
        self.assertEqual((sock.sent, t.value()), (b"abc", b"defgh"))
        self.assertTrue(out.queued)

    def test_error_goes_through_the_transport(self) -> None:
        sock = FakeSocket([ConnectionResetError()])
        t = TCP(sock)
        SendNow(t).write(b"abc")
        self.assertEqual(t.value(), b"abc")

    def test_tls_other_transports_and_closing_ones_queue(self) -> None:
        for t in (TCP(FakeSocket([]), tls=True), StringTransport()):
            out = SendNow(t)
            out.write(b"x")
            self.assertEqual(t.value(), b"x")
        closing = TCP(FakeSocket([]))
        closing.disconnecting = True
        SendNow(closing).write(b"y")
        self.assertEqual((closing.sock.sent, closing.value()), (b"", b"y"))

    def test_hand_over(self) -> None:
        sock = FakeSocket([])
        t = TCP(sock)
        out = SendNow(t)
        self.assertIs(out.hand_over(), t)
        out.write(b"after")
        self.assertEqual((sock.sent, t.value()), (b"", b"after"))


class ChannelWriteTests(SynchronousTestCase):
    """ProxyChannel sends every byte it writes through SendNow: answers
    leave at once, in order with what it wrote before."""

    def client(self) -> tuple[object, ClosingTCP, FakeSocket]:
        from twisted.internet.address import IPv4Address

        from .support import Harness  # noqa: PLC0415

        h = Harness()
        self.h = h
        sock = FakeSocket([])
        channel = h.site.buildProtocol(IPv4Address("TCP", "10.1.2.3", 5555))
        transport = ClosingTCP(sock)
        transport.protocol = channel
        channel.makeConnection(transport)
        return channel, transport, sock

    def test_answer_leaves_through_the_socket(self) -> None:
        channel, transport, sock = self.client()
        channel.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # type: ignore[attr-defined]
        self.h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
        self.assertTrue(sock.sent.startswith(b"HTTP/1.1 200 OK\r\n"))
        self.assertTrue(sock.sent.endswith(b"\r\n\r\nhi"))
        self.assertEqual(transport.value(), b"")

    def test_100_continue_then_the_answer_at_once(self) -> None:
        """The 100 Continue goes out through the same writer as the
        answer, so both leave at once and in order."""
        channel, transport, sock = self.client()
        channel.dataReceived(  # type: ignore[attr-defined]
            b"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"
        )
        self.assertEqual(sock.sent, b"HTTP/1.1 100 Continue\r\n\r\n")
        channel.dataReceived(b"abc")  # type: ignore[attr-defined]
        self.h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
        self.assertTrue(sock.sent.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), sock.sent)
        self.assertTrue(sock.sent.endswith(b"hi"))
        self.assertEqual(transport.value(), b"")


class CloseWhileHeldTests(SynchronousTestCase):
    def test_an_answer_that_ends_the_connection_is_sent_before_the_close(self) -> None:
        """A last answer (Connection: close) completes while the exchange
        holds the client's writes; they must reach the transport before it
        is closed, since a closed transport (TLS) takes nothing more."""
        from .support import Harness

        class StrictTransport(ClosingTransport):
            def write(self, data: bytes) -> None:
                if not self.disconnecting:
                    super().write(data)

        from twisted.internet.address import IPv4Address

        h = Harness()
        channel = h.site.buildProtocol(IPv4Address("TCP", "10.1.2.3", 5555))
        transport = StrictTransport()
        transport.protocol = channel
        channel.makeConnection(transport)
        channel.dataReceived(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
        self.assertTrue(transport.disconnecting)
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 200 OK\r\n"), transport.value())
        self.assertTrue(transport.value().endswith(b"\r\n\r\nhi"))
