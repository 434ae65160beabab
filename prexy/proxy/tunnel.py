"""A tunnel: a client connection and an upstream connection spliced after
a ``101 Switching Protocols`` (``prexy.upgrade`` decides which requests).

Bytes go both ways as they come, untouched.  Backpressure goes both ways
too: when the client's send buffer is full, the upstream connection stops
being read, and the other way round.  The tunnel closes after
``idle`` seconds with no byte either way (0: never).  A clean close of
either side closes the other after what is still queued for it; a reset
resets the other.  The tunnel reports once, when it ends, to
``on_closed`` (duration, bytes each way and which side ended it).

The client side is an ``ITunnelClient`` (``prexy.proxy.client``; the
HTTP/1.1 ``ProxyChannel``) and the upstream side ``UpstreamProtocol``;
each gives the tunnel its bytes (``from_client``,
``from_upstream``), its losses (``client_lost``, ``upstream_lost``) and
the client's write-buffer state (``client_blocked``,
``client_unblocked``).  The upstream's write-buffer state arrives through
the producer registered on its transport here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from zope.interface import implementer

__all__ = ["Tunnel"]


class _Side(Protocol):
    transport: Any


class _ClientSide(_Side, Protocol):
    """The part of ``ITunnelClient`` the tunnel calls."""

    def write(self, data: bytes) -> None: ...


class _UpstreamSide(_Side, Protocol):
    def tunnel_write(self, data: bytes) -> None: ...


@implementer(IPushProducer)
class _ClientReader:
    """Registered on the upstream's transport: while it cannot take more,
    the client is not read."""

    def __init__(self, tunnel: Tunnel) -> None:
        self.tunnel = tunnel

    def pauseProducing(self) -> None:
        self.tunnel.upstream_blocked(True)

    def resumeProducing(self) -> None:
        self.tunnel.upstream_blocked(False)

    def stopProducing(self) -> None:
        pass


class Tunnel:
    """Two connections joined; see the module docstring."""

    def __init__(self, clock: Any, idle: float, on_closed: Callable[[Tunnel], None]) -> None:
        self.clock = clock
        self.idle = idle
        self.on_closed = on_closed
        self.client: _ClientSide | None = None
        self.upstream: _UpstreamSide | None = None
        self.opened = clock.seconds()
        self.last_activity = self.opened
        self.bytes_up = 0  # client -> upstream
        self.bytes_down = 0  # upstream -> client
        #: Who ended the tunnel: "client", "upstream" or "idle" (None: open).
        self.ended_by: str | None = None
        self.clean = True
        self._timer: Any = None
        self._client_paused = False

    def attach(self, client: _ClientSide, upstream: _UpstreamSide, first: bytes = b"", early: bytes = b"") -> None:
        """Start: ``first`` is what the upstream sent after its 101 head,
        ``early`` what the client sent after its request, before the 101."""
        self.client = client
        self.upstream = upstream
        upstream.transport.registerProducer(_ClientReader(self), True)
        if self.idle > 0:
            self._timer = self.clock.callLater(self.idle, self._check_idle)
        if early:
            self.from_client(early)
        if first:
            self.from_upstream(first)

    @property
    def open(self) -> bool:
        return self.ended_by is None

    @property
    def seconds(self) -> float:
        return self.clock.seconds() - self.opened

    # -- bytes ---------------------------------------------------------------------

    def from_client(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is None or self.ended_by is not None:
            return
        self.bytes_up += len(data)
        self.last_activity = self.clock.seconds()
        upstream.tunnel_write(data)

    def from_upstream(self, data: bytes) -> None:
        client = self.client
        if client is None or self.ended_by is not None:
            return
        self.bytes_down += len(data)
        self.last_activity = self.clock.seconds()
        client.write(data)

    # -- backpressure ----------------------------------------------------------------

    def client_blocked(self, blocked: bool) -> None:
        """The client's send buffer filled up (or drained): stop (or go on)
        reading the upstream."""
        upstream = self.upstream
        if upstream is None or self.ended_by is not None:
            return
        if blocked:
            upstream.transport.pauseProducing()
        else:
            upstream.transport.resumeProducing()

    def upstream_blocked(self, blocked: bool) -> None:
        client = self.client
        if client is None or self.ended_by is not None or blocked == self._client_paused:
            return
        self._client_paused = blocked
        if blocked:
            client.transport.pauseProducing()
        else:
            client.transport.resumeProducing()

    # -- the end -------------------------------------------------------------------------

    def client_lost(self, reason: Failure) -> None:
        self._end("client", reason, self.upstream)

    def upstream_lost(self, reason: Failure) -> None:
        self._end("upstream", reason, self.client)

    def _check_idle(self) -> None:
        self._timer = None
        if self.ended_by is not None:
            return
        quiet = self.clock.seconds() - self.last_activity
        if quiet < self.idle:
            self._timer = self.clock.callLater(self.idle - quiet, self._check_idle)
            return
        self.ended_by = "idle"
        for side in (self.client, self.upstream):
            if side is not None and side.transport is not None:
                side.transport.loseConnection()
        self._report()

    def _end(self, by: str, reason: Failure, other: _Side | None) -> None:
        if self.ended_by is not None:
            return
        self.ended_by = by
        self.clean = reason.check(ConnectionDone) is not None
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        transport = other.transport if other is not None else None
        if transport is not None:
            if self._client_paused and by == "upstream":
                transport.resumeProducing()
            if self.clean:
                transport.loseConnection()
            else:
                transport.abortConnection()
        self._report()

    def _report(self) -> None:
        on_closed, self.on_closed = self.on_closed, _nothing
        on_closed(self)


def _nothing(tunnel: Tunnel) -> None:
    pass
