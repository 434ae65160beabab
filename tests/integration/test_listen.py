"""Adopted listening sockets share a burst of connections between workers."""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet import defer, protocol, reactor

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


def test_one_accept_per_wakeup(cleanup: Any) -> None:
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

    cleanup(close)
    clients = [socket.create_connection(address) for _ in range(3)]
    for client in clients:
        cleanup(client.close)
    port.doRead()
    assert len(factory.built) == 1
    port.doRead()
    assert len(factory.built) == 2
