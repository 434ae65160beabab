"""A minimal Redis client for Twisted: commands in, replies out, in order.

Replies are parsed by ``hiredis.Reader`` (the C RESP parser redis-py uses
too: bytes fed in, replies taken out, no I/O of its own) and commands are
encoded by ``hiredis.pack_command``, so this module holds no protocol code,
only the bookkeeping of a pipelined connection: one Deferred per command,
fired in the order the replies arrive.  A connection in subscribe mode
hands the channel messages (``[b"message", channel, payload]``) to a
callback instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import hiredis
from twisted.internet import defer
from twisted.internet.endpoints import HostnameEndpoint, UNIXClientEndpoint
from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from prexy.cluster.settings import RedisAddress

log = Logger()

#: Seconds to open a connection to Redis.
CONNECT_TIMEOUT = 5.0


class RedisError(Exception):
    """An error reply (``-ERR ...``) to one command."""


class RedisConnection(Protocol):
    """One connection to Redis, commands pipelined.

    ``command(*args)`` returns a Deferred firing with the reply (bytes, int,
    list, None) or failing with :class:`RedisError`; a command cancelled
    (a timeout) aborts the connection, since the replies that follow could
    no longer be matched to their commands.  ``closed`` fires when the
    connection is gone; pending commands fail with its reason.
    """

    def __init__(self, on_message: Callable[[bytes, bytes], None] | None = None) -> None:
        self._reader = hiredis.Reader()
        self._waiting: deque[defer.Deferred[Any]] = deque()
        self.on_message = on_message
        self.closed: defer.Deferred[None] = defer.Deferred()
        self._gone = False

    def command(self, *args: bytes | str | int | float) -> defer.Deferred[Any]:
        if self._gone or self.transport is None:
            return defer.fail(ConnectionDone("not connected to Redis"))
        d: defer.Deferred[Any] = defer.Deferred(lambda _: self.abort())
        self._waiting.append(d)
        self.transport.write(hiredis.pack_command(args))  # type: ignore[arg-type]
        return d

    def abort(self) -> None:
        transport: Any = self.transport  # an ITCPTransport: abortConnection
        if not self._gone and transport is not None:
            transport.abortConnection()

    def dataReceived(self, data: bytes) -> None:
        self._reader.feed(data)
        while not self._gone:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as exc:
                log.error("Redis sent something that is not RESP: {error}; dropping the connection", error=exc)
                self.abort()
                return
            if reply is False:
                return
            if (
                self.on_message is not None and isinstance(reply, list) and len(reply) == 3
                and reply[0] == b"message"
            ):
                self.on_message(reply[1], reply[2])
                continue
            if not self._waiting:
                log.error("Redis answered a command never sent; dropping the connection")
                self.abort()
                return
            d = self._waiting.popleft()
            if d.called:
                continue  # cancelled: the connection is going away
            if isinstance(reply, hiredis.ReplyError):
                d.errback(RedisError(str(reply)))
            else:
                d.callback(reply)

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:  # noqa: B008
        self._gone = True
        waiting, self._waiting = self._waiting, deque()
        for d in waiting:
            if not d.called:
                d.errback(reason)
        self.closed.callback(None)


def endpoint_for(reactor: Any, address: RedisAddress) -> Any:
    """The client endpoint of a Redis address."""
    if address.path:
        return UNIXClientEndpoint(reactor, address.path, timeout=CONNECT_TIMEOUT)
    return HostnameEndpoint(reactor, address.host, address.port, timeout=CONNECT_TIMEOUT)


def prepare(connection: RedisConnection, address: RedisAddress) -> defer.Deferred[RedisConnection]:
    """AUTH and SELECT as the address asks; fires with the connection."""
    steps: list[defer.Deferred[Any]] = []
    if address.password is not None:
        if address.username:
            steps.append(connection.command("AUTH", address.username, address.password))
        else:
            steps.append(connection.command("AUTH", address.password))
    if address.db:
        steps.append(connection.command("SELECT", address.db))
    d: defer.Deferred[Any] = defer.gatherResults(steps, consumeErrors=True)
    d.addErrback(lambda f: f.value.subFailure if isinstance(f.value, defer.FirstError) else f)
    d.addCallback(lambda _: connection)
    return d


def connect(
    reactor: Any, address: RedisAddress, on_message: Callable[[bytes, bytes], None] | None = None,
) -> defer.Deferred[RedisConnection]:
    """Open and prepare a connection (``on_message`` for subscribers)."""
    connection = RedisConnection(on_message)
    factory = Factory.forProtocol(lambda: connection)
    factory.noisy = False  # no "Starting factory" line per attempt while Redis is away
    d: defer.Deferred[Any] = endpoint_for(reactor, address).connect(factory)
    d.addCallback(lambda _: prepare(connection, address))
    return d
