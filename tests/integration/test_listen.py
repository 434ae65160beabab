"""Adopted listening sockets share a burst of connections between workers."""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import defer, protocol, reactor
from twisted.trial import unittest

from prexy.listen import ListenSpec, adopt


class _Held(protocol.Protocol):
    def __init__(self) -> None:
        self.lost: defer.Deferred[None] = defer.Deferred()

    def connectionLost(self, reason: Any = None) -> None:
        self.lost.callback(None)


class _Counting(protocol.ServerFactory):
    def __init__(self) -> None:
        self.built: list[_Held] = []

    def buildProtocol(self, addr: Any) -> Any:
        held = _Held()
        held.factory = self
        self.built.append(held)
        return held


class AdoptTests(unittest.TestCase):
    def test_one_accept_per_wakeup(self) -> None:
        """Three pending connections: one readable event takes one of them,
        the next takes the next (Twisted alone would take all three)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        address = listener.getsockname()
        factory = _Counting()
        spec = ListenSpec(description=f"tcp:{address[1]}:interface=127.0.0.1", family="INET")
        port = adopt(reactor, spec, listener.detach(), factory)

        def close() -> defer.Deferred[Any]:
            for held in factory.built:
                held.transport.abortConnection()
            lost = [held.lost for held in factory.built]
            return defer.gatherResults([*lost, defer.maybeDeferred(port.stopListening)])

        self.addCleanup(close)
        clients = [socket.create_connection(address) for _ in range(3)]
        for client in clients:
            self.addCleanup(client.close)
        port.doRead()
        self.assertEqual(len(factory.built), 1)
        port.doRead()
        self.assertEqual(len(factory.built), 2)


class SendNowTests(unittest.TestCase):
    """send_now: bytes leave at once on a plain TCP connection."""

    def test_sent_before_the_reactor_turns(self) -> defer.Deferred[Any]:
        from twisted.internet.protocol import ClientFactory
        from twisted.internet.testing import StringTransport

        from prexy.proxy.upstream import send_now

        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        self.addCleanup(listener.close)
        connected: defer.Deferred[Any] = defer.Deferred()

        class Client(protocol.Protocol):
            def connectionMade(self) -> None:
                connected.callback(self)

            def connectionLost(self, reason: Any = None) -> None:
                lost.callback(None)

        lost: defer.Deferred[None] = defer.Deferred()
        reactor.connectTCP("127.0.0.1", listener.getsockname()[1], ClientFactory.forProtocol(Client))

        def check(client: Any) -> defer.Deferred[None]:
            server, _ = listener.accept()
            self.addCleanup(server.close)
            server.settimeout(0)
            send_now(client.transport, b"GET / HTTP/1.1\r\n\r\n")
            # No reactor turn in between: the bytes are already there.
            self.assertEqual(server.recv(100), b"GET / HTTP/1.1\r\n\r\n")
            # A write queued before keeps its place: send_now queues after it.
            client.transport.write(b"first ")
            send_now(client.transport, b"second")
            self.assertRaises(BlockingIOError, server.recv, 100)
            client.transport.loseConnection()

            def flushed(_: None) -> None:
                server.settimeout(5)
                received = b""
                while chunk := server.recv(100):
                    received += chunk
                self.assertEqual(received, b"first second")

            return lost.addCallback(flushed)

        connected.addCallback(check)
        fake = StringTransport()
        send_now(fake, b"queued")  # not a plain TCP transport: write()
        self.assertEqual(fake.value(), b"queued")
        return connected
