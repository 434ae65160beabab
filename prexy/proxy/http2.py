"""HTTP/2 to clients: which protocol a connection speaks.

With ``[server] http2 = true`` the TLS listeners offer ``h2`` and
``http/1.1`` by ALPN (``prexy.listen.adopt``) and every TLS connection
starts as a :class:`Negotiated`; a listener named in ``[server]
h2c_listen`` takes cleartext HTTP/2 with prior knowledge beside HTTP/1.1,
each connection starting as a :class:`PriorKnowledge`.  Either becomes
Prexy's own HTTP/2 connection (``prexy.proxy.h2connection``) or the
HTTP/1.1 ``ProxyChannel``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.error import ConnectionDone
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from prexy.h2server import PREFACE

__all__ = ["Negotiated", "PriorKnowledge", "PriorKnowledgeFactory", "http2_connection"]

_CONNECTION_DONE = Failure(ConnectionDone())


def http2_connection(site: Any) -> Any:
    """Prexy's HTTP/2 connection serving ``site``'s requests, with the
    site's ``[http2]`` limits."""
    from prexy.proxy.h2connection import H2ServerProtocol

    return H2ServerProtocol(site, site.h2_settings)


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


class PriorKnowledge(Negotiated):
    """A cleartext connection that speaks HTTP/2 when it begins with the
    connection preface (h2c with prior knowledge, RFC 9113 3.3), else
    HTTP/1.1.  No ``Upgrade: h2c``."""

    _held = b""

    def dataReceived(self, data: bytes) -> None:
        if self.chosen is not None:
            self.chosen.dataReceived(data)
            return
        held = self._held + data
        if PREFACE.startswith(held[: len(PREFACE)]) and len(held) < len(PREFACE):
            self._held = held  # still a prefix of the preface
            return
        self._held = b""
        timer, self._timer = self._timer, None
        if timer is not None and timer.active():
            timer.cancel()
        if held.startswith(PREFACE):
            chosen = self.site.http2_connection()
        else:
            chosen = self.site.http1_channel(self.addr)
        self.chosen = chosen
        chosen.makeConnection(self.transport)
        chosen.dataReceived(held)


class NegotiatedFactory(Factory):
    """The factory behind a TLS listener that offers HTTP/2: ALPN offers
    ``h2`` and ``http/1.1`` (``alpn``, read by ``prexy.listen.tls_factory``)
    and each connection starts as a :class:`Negotiated`."""

    noisy = False
    alpn = True

    def __init__(self, site: Any) -> None:
        self.site = site

    def buildProtocol(self, addr: Any) -> Any:
        return Negotiated(self.site, addr)


class PriorKnowledgeFactory(Factory):
    """The factory of an ``h2c_listen`` listener: the site's connections,
    each starting as a :class:`PriorKnowledge`."""

    noisy = False

    def __init__(self, site: Any) -> None:
        self.site = site

    def buildProtocol(self, addr: Any) -> Any:
        return PriorKnowledge(self.site, addr)
