"""HTTP/2 to clients (issue 20, first part): which protocol a TLS
connection speaks, and twisted.web's HTTP/2 connection set up for the
proxy's site.

With ``[server] http2 = true`` the TLS listeners offer ``h2`` and
``http/1.1`` by ALPN (``prexy.listen.adopt``) and every connection starts
as a :class:`Negotiated`.  The HTTP/2 connection serves the same
``ProxyRequest`` through its streams; twisted.web offers no public API
for it, so ``twisted.web._http2`` is used, as the issue names it.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure

__all__ = ["Negotiated", "http2_connection"]

_CONNECTION_DONE = Failure(ConnectionDone())


def http2_connection(site: Any) -> Any:
    """twisted.web's HTTP/2 connection, serving ``site``'s requests (the
    attributes twisted.web's own protocol switch sets)."""
    from twisted.web._http2 import H2Connection

    connection: Any = H2Connection(site.reactor)
    connection.site = site
    connection.requestFactory = site.requestFactory
    connection.factory = site
    connection.timeOut = site.timeOut
    connection.callLater = site.reactor.callLater
    return connection


class Negotiated(Protocol):
    """A connection whose protocol the TLS handshake chooses: on its first
    bytes (the handshake is done by then), an HTTP/2 connection when ALPN
    said ``h2``, else the HTTP/1.1 ``ProxyChannel``; every later byte and
    the loss of the connection go to it.  Until then the site's
    ``client_header`` deadline runs."""

    def __init__(self, site: Any, addr: Any) -> None:
        self.site = site
        self.addr = addr
        self.chosen: Any = None
        self._timer: Any = None

    def connectionMade(self) -> None:
        seconds = self.site.timeouts.client_header
        if seconds > 0:
            self._timer = self.site.reactor.callLater(seconds, self._quiet)

    def _quiet(self) -> None:
        self._timer = None
        transport: Any = self.transport
        transport.loseConnection()

    def dataReceived(self, data: bytes) -> None:
        chosen = self.chosen
        if chosen is None:
            timer, self._timer = self._timer, None
            if timer is not None and timer.active():
                timer.cancel()
            if getattr(self.transport, "negotiatedProtocol", None) == b"h2":
                chosen = self.site.http2_connection()
            else:
                chosen = self.site.http1_channel(self.addr)
            self.chosen = chosen
            chosen.makeConnection(self.transport)
        chosen.dataReceived(data)

    def connectionLost(self, reason: Failure = _CONNECTION_DONE) -> None:
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        if self.chosen is not None:
            self.chosen.connectionLost(reason)
