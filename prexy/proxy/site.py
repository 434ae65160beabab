"""The client's connection and the site on twisted.web: ``ProxyChannel``
(HTTP/1.1, with the request-head gate in front of twisted.web's parser)
and ``ProxySite`` (the factory every listener serves, HTTP/2 included
through ``prexy.proxy.http2``).  The request they make is
``prexy.proxy.request.ProxyRequest``.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

from twisted.internet.error import ConnectionDone
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.http import HTTPChannel
from twisted.web.http_headers import Headers
from zope.interface import implementer

from prexy.accesslog import LogBudget
from prexy.config import Limits, Timeouts
from prexy.errorpages import ErrorPages, error_answer, phrase
from prexy.h2settings import H2Settings
from prexy.metrics import Metrics
from prexy.proxy.client import (
    HTTP11,
    NONE,
    Capabilities,
    IClientChannel,
    IClientConnection,
    ITunnelClient,
)
from prexy.proxy.request import ProxyRequest
from prexy.proxy.sendnow import SendNow
from prexy.requesthead import CHUNKED, PENDING, ChunkedCheck, Head, HeadGate, Passed, Refusal

__all__ = ["ProxyChannel", "ProxySite", "refusal_answer"]

_log = Logger("prexy")


@implementer(IClientChannel, ITunnelClient, IClientConnection)
class ProxyChannel(HTTPChannel):
    """twisted.web's HTTP/1.1 channel, a request's ``IClientChannel`` (and
    a tunnel's client side after a 101), with a gate in front of its parser
    and two measured changes, all through public methods:

    - Each request head is held and checked by ``prexy.requesthead`` before
      twisted.web parses it: a head that breaks the rules gets its 4xx/5xx
      with ``Connection: close`` and nothing of it reaches twisted.web.  A
      head must arrive whole within ``timeouts.client_header`` (from the
      accept for a connection's first request, from the head's first byte
      after that), and a request body may pause at most
      ``timeouts.client_body`` between two reads; either way the client
      gets a 408.  One timer per connection, armed only while a head is
      incomplete, and the channel's own idle timer for the body.
    - It remembers its transport's addresses and whether it is TLS, which
      twisted.web asks for on every request (a new request reads
      ``getPeer()`` and ``getHost()``; ``isSecure()`` is an interface
      lookup): a ``getsockname`` call, a copy and an interface lookup,
      about 1 to 3 µs each, per request, saved.
    - Its writes (``writeHeaders``, ``write``, ``writeSequence``: every
      byte a response sends) go through ``SendNow``, so an answer leaves in
      the turn that produced it instead of the next one.  The channel's
      other writes to its transport are a 100 Continue (a request that
      expects one makes the connection queue from then on) and the answer
      to a refused head (the connection is closing, which queues too), so
      bytes never overtake queued ones.  bench/README.md has the figures
      with and without it.
    """

    _host: Any = None
    _peer: Any = None
    _secure: bool | None = None
    _out: SendNow | None = None
    _gate: HeadGate | None = None
    _head: Head | None = None
    _head_timer: Any = None
    _refused = False
    _in_body = False
    #: After a 101, the tunnel every byte goes to (``prexy.proxy.tunnel``).
    _tunnel: Any = None
    #: After an upgrade request, what the client sent since, held.
    _holding = False
    _early = b""
    #: The framing check of a chunked request body being received.
    _chunks: ChunkedCheck | None = None
    site: ProxySite

    def connectionMade(self) -> None:
        super().connectionMade()
        self._out = SendNow(self.transport)
        site = self.site
        limits = site.limits
        self._gate = HeadGate(limits)
        # twisted.web's own limits stay above the gate's, so the gate
        # answers first (and with the right status).
        self.MAX_LENGTH = limits.max_request_head + 4
        self.totalHeadersSize = limits.max_request_head + 4
        self.maxHeaders = limits.max_request_head
        self._arm_head_timer()

    # -- the head gate -----------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._refused or self._tunnel is not None:
            if self._tunnel is not None:
                self._tunnel.from_client(data)
            return  # answered and closing: read nothing more
        if self._holding:
            self._early += data  # after an upgrade request: the tunnel's, or the next request's
            return
        gate = self._gate
        if gate is None or gate.open:
            chunks = self._chunks
            if chunks is not None and self._check_chunks(chunks, data):
                return
            super().dataReceived(data)
            return
        result = gate.feed(data)
        if result is PENDING:
            self.resetTimeout()
            if self._head_timer is None:
                self._arm_head_timer()
            return
        if isinstance(result, Refusal):
            self.refuse(result)
            return
        assert isinstance(result, Passed)
        self._cancel_head_timer()
        head = self._head = result.head
        data = result.data
        if head.framing == CHUNKED:
            chunks = self._chunks = ChunkedCheck()
            if self._check_chunks(chunks, data[data.find(b"\r\n\r\n") + 4 :]):
                return
        elif head.method == b"GET" and not head.has_body:
            end = data.find(b"\r\n\r\n") + 4
            if data.find(b"pgrade:", 0, end) >= 0 or data.find(b"PGRADE:", 0, end) >= 0:
                # A request that may switch protocols: what follows its head
                # is held, for the tunnel or for twisted.web after the answer.
                self._holding = True
                self._early = data[end:]
                data = data[:end]
        super().dataReceived(data)

    def _check_chunks(self, chunks: ChunkedCheck, data: bytes) -> bool:
        """Whether a chunked body's framing made the channel refuse it."""
        refusal = chunks.feed(data)
        if chunks.done:
            self._chunks = None
        if refusal is None:
            return False
        self._chunks = None
        self.refuse(refusal)
        return True

    def _arm_head_timer(self) -> None:
        seconds = self.site.timeouts.client_header
        if seconds > 0:
            self._head_timer = self.callLater(seconds, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        timer, self._head_timer = self._head_timer, None
        if timer is not None and timer.active():
            timer.cancel()

    def _head_timed_out(self) -> None:
        self._head_timer = None
        gate = self._gate
        if gate is not None and gate.started:
            self.refuse(Refusal(408, "request head not received in time (client_header timeout)"))
        else:
            # Nothing of a request came: close without an answer, as nginx does.
            self._refused = True
            self.loseConnection()

    def refuse(self, refusal: Refusal) -> None:
        """Answer a head (or a stalled body) that will not be served, and
        close the connection."""
        self._refused = True
        self._cancel_head_timer()
        self.setTimeout(None)
        transport: Any = self.transport
        if transport is None:
            return
        transport.write(refusal_answer(refusal, self.site.error_pages()))
        self.site.refused(self, refusal)
        self.loseConnection()

    def allHeadersReceived(self) -> None:
        request = self.requests[-1]
        head = self._head
        request.head = head
        out = self._out
        if out is not None and request.requestHeaders.hasHeader(b"expect"):
            out.queued = True  # twisted.web writes its 100 Continue to the transport
        if head is not None and head.has_body:
            body_timeout = self.site.timeouts.client_body
            if body_timeout > 0:
                self._in_body = True
                self._idle = self.timeOut
                self.setTimeout(body_timeout)
        super().allHeadersReceived()

    def allContentReceived(self) -> None:
        if self._in_body:
            # twisted.web saves the timeout in force now and restores it
            # after the request: make that the keep-alive idle one again.
            self._in_body = False
            self.timeOut = self._idle
        super().allContentReceived()

    def timeoutConnection(self) -> None:
        if self._in_body:
            self.refuse(Refusal(408, "request body stalled (client_body timeout)"))
            return
        super().timeoutConnection()

    def requestDone(self, request: Any) -> None:
        gate = self._gate
        if gate is not None:
            gate.reset()  # the next head (perhaps buffered already) is checked anew
        self._head = None
        self._chunks = None
        held, self._early, self._holding = self._early, b"", False
        super().requestDone(request)
        transport: Any = self.transport
        if held and transport is not None and not transport.disconnecting:
            self.dataReceived(held)  # no upgrade after all: the next request

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._cancel_head_timer()
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.client_lost(reason or Failure(ConnectionDone()))
        super().connectionLost(reason)

    def drain(self, fresh: bool = False) -> None:
        """Graceful stop: a connection busy with a request closes after its
        answer, an idle keep-alive one now, a ``fresh`` one is left for its
        first request (the site closes it later)."""
        if self.requests:
            self.persistent = False
        elif not fresh:
            transport: Any = self.transport
            transport.loseConnection()

    # -- what the request asks beyond twisted.web -----------------------------------------

    def capabilities(self, version: bytes) -> Capabilities:
        """An HTTP/1.1 request can be sent trailers (its body chunked),
        1xx heads and a tunnel; an HTTP/1.0 one none of them."""
        return HTTP11 if version == b"HTTP/1.1" else NONE

    def send_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        """Nothing: a chunked body's trailer section is written by the
        request with its last chunk (``ProxyRequest.finish``), and a body
        with a Content-Length has no place for trailers."""

    def abortConnection(self) -> None:
        """Reset the connection (the request hears of it as a lost one)."""
        transport: Any = self.transport
        if transport is not None:
            transport.abortConnection()

    def body_too_large(self, request: Any) -> None:
        """A 413 straight away, before twisted.web has the request, and
        close: the rest of the body is never read."""
        content_type, body = error_answer(413, request.site_pages())
        self.write(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: %s\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (content_type, len(body), body)
        )
        self.site.metrics.count("prexy_requests_total", status="413")
        self.loseConnection()

    def write_interim(self, code: int, phrase: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """An informational head (103 Early Hints) before the response's
        own: twisted.web has no API for one, so the channel writes it, in
        order with everything it writes."""
        lines = [b"HTTP/1.1 %d " % code, phrase, b"\r\n"]
        for name, value in headers:
            lines += (name, b": ", value, b"\r\n")
        lines.append(b"\r\n")
        self.write(b"".join(lines))

    # -- tunnels -------------------------------------------------------------------

    def start_tunnel(self, tunnel: Any, head: bytes) -> bytes:
        """The upstream switched protocols: send its 101 ``head``, and from
        now on every byte read goes to ``tunnel`` (``prexy.proxy.tunnel``).
        Returns the bytes the client sent after its request, for the tunnel."""
        self._tunnel = tunnel
        self._cancel_head_timer()
        self.setTimeout(None)  # the tunnel keeps its own idle time
        self.write(head)
        early, self._early, self._holding = self._early, b"", False
        return early

    def pauseProducing(self) -> None:
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.client_blocked(True)  # the client reads slowly: hold the upstream
            return
        super().pauseProducing()

    def resumeProducing(self) -> None:
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.client_blocked(False)
            return
        super().resumeProducing()

    # -- writes ----------------------------------------------------------------------

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Headers) -> None:
        seq = [version, b" ", code, b" ", reason, b"\r\n"]
        for name, values in headers.getAllRawHeaders():
            for value in values:
                seq += (name, b": ", value, b"\r\n")
        seq.append(b"\r\n")
        self.writeSequence(seq)

    #: Writes held to go out as one (``hold_writes``), or None.
    _held: list[bytes] | None = None

    def hold_writes(self) -> None:
        """Keep what is written until ``release_writes``: a head and the
        body that follows it at once leave in one send."""
        if self._held is None:
            self._held = []

    def release_writes(self) -> None:
        held, self._held = self._held, None
        if held:
            self.write(b"".join(held))

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            held.append(data)
            return
        out = self._out
        if out is None:
            transport: Any = self.transport
            transport.write(data)
        else:
            out.write(data)

    def writeSequence(self, iovec: Any) -> None:
        self.write(b"".join(iovec))

    def getHost(self) -> Any:
        if self._host is None:
            self._host = super().getHost()
        return self._host

    def getPeer(self) -> Any:
        if self._peer is None:
            self._peer = super().getPeer()
        return self._peer

    def isSecure(self) -> bool:
        if self._secure is None:
            self._secure = super().isSecure()
        return self._secure


def refusal_answer(refusal: Refusal, pages: ErrorPages | None = None) -> bytes:
    """The whole response to a refused head, and close: the page ``pages``
    give for its status, else a generic body (the reason goes to the log,
    ``ProxySite.refused``)."""
    content_type, body = error_answer(refusal.status, pages)
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (refusal.status, phrase(refusal.status), content_type, len(body), body)
    )


class ProxySite(server.Site):
    """The HTTP factory for the proxy: our request class, access log in
    combined log format, request body limit, and the open connections for
    a graceful stop."""

    requestFactory = ProxyRequest  # type: ignore[assignment]
    #: HTTP/1.1 only for now: twisted.web's default wraps the channel to
    #: offer HTTP/2 when h2 is installed, which the proxy does not use yet.
    protocol = ProxyChannel  # type: ignore[assignment]
    noisy = False

    def __init__(
        self,
        resource: Any,
        max_request_body: int,
        metrics: Metrics,
        log_path: str | None = None,
        reactor: Any = None,
        timeout: float = 75.0,
        limits: Limits = Limits(),
        timeouts: Timeouts = Timeouts(),
    ) -> None:
        super().__init__(resource, logPath=log_path, timeout=timeout, reactor=reactor)
        self.max_request_body = max_request_body
        self.metrics = metrics
        #: Head sizes and client deadlines for new connections (a reload
        #: replaces them).
        self.limits = limits
        self.timeouts = timeouts
        self._refusals_log = LogBudget()
        self.active_requests = 0
        #: channel -> [accepted at, has answered a request]
        self._channels: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()

    #: The limits of HTTP/2 connections (``[http2]``; a reload replaces them).
    h2_settings = H2Settings()

    def buildProtocol(self, addr: Any) -> Any:
        # (A TLS listener that offers HTTP/2 builds its connections through
        # prexy.proxy.http2.NegotiatedFactory instead.)
        return self.http1_channel(addr)

    def http1_channel(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        self._channels[protocol] = [self.reactor.seconds(), False]
        return protocol

    def http2_connection(self) -> Any:
        """An HTTP/2 connection serving this site (``prexy.proxy.http2``)."""
        from prexy.proxy.http2 import http2_connection

        connection = http2_connection(self)
        self._channels[connection] = [self.reactor.seconds(), True]
        return connection

    def refused(self, channel: Any, refusal: Refusal) -> None:
        """A head was refused: count it, and log one line (at most ten a
        second; the rest are counted in the next line)."""
        self.metrics.count_status(refusal.status)
        left_out = self._refusals_log.take(self.reactor.seconds())
        if left_out is None:
            return
        peer = getattr(channel.getPeer(), "host", "unix")
        more = f" ({left_out} more not logged)" if left_out else ""
        _log.info(
            "refused a request from {peer}: {status} {reason}{more}",
            peer=peer, status=refusal.status, reason=refusal.reason, more=more,
        )

    def error_pages(self) -> ErrorPages:
        """The pages of answers made before a site is chosen (a refused
        request head): the default site's, as nginx's default server
        answers a request it cannot route."""
        pages: ErrorPages = self.resource.runtime.default.config.error_pages
        return pages

    def served(self, channel: Any) -> None:
        """A response on ``channel`` is complete."""
        entry = self._channels.get(channel)
        if entry is not None:
            entry[1] = True

    def open_connections(self) -> int:
        """Client connections still open."""
        return sum(1 for channel in list(self._channels) if getattr(channel.transport, "connected", False))

    def close_idle_connections(self, fresh_grace: float = 2.0) -> None:
        """Graceful shutdown: make busy connections close after their
        response, close idle keep-alive ones, and give connections accepted
        moments ago ``fresh_grace`` seconds to send their first request."""
        now = self.reactor.seconds()
        for channel, (created, served) in list(self._channels.items()):
            transport = channel.transport
            if transport is None:
                continue
            channel.drain(not served and now - created < fresh_grace)
