"""SendNow: bytes leave at once on plain TCP, in order, and never overtake
bytes that had to be queued."""

from __future__ import annotations

from twisted.internet.interfaces import ISSLTransport, ISystemHandle, ITCPTransport
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import alsoProvides

from prexy.proxy.sendnow import SendNow


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


class SendNowTests(SynchronousTestCase):
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
