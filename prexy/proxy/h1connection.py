"""Prexy's HTTP/1.x client connection: ``prexy.h1server`` (llhttp and
Prexy's head rules) wired to a transport and to the proxy's requests.

``ProxyChannel`` feeds the client's bytes to a ``RequestReader`` and turns
what it reads into ``ProxyRequest`` calls, as the HTTP/2 connection does
(``gotLength``, ``handleContentChunk``, ``requestReceived``,
``connectionLost``); the request talks back to it as its
``IClientChannel``.  One request is answered at a time; requests a client
pipelines behind it are parsed as they come and wait, and the connection
stops reading while one waits.

Deadlines, one timer each:

- a head must arrive whole within ``timeouts.client_header``, from the
  accept for a connection's first request, from the head's first byte
  after that (only a head that spans reads arms it); else a 408, or a
  close without an answer when nothing of a head came;
- a request body may pause at most ``timeouts.client_body`` between two
  reads (408);
- a keep-alive connection with nothing to do is closed after the site's
  idle timeout.  That timer is reset by each read and is not stopped while
  a request is answered: when it runs out then, it is armed again.

A refused head gets its whole answer with ``Connection: close``, one log
line at most (``ProxySite.refused``), and the connection closes; nothing
of it reaches the proxy.  Every byte the connection writes goes through
``SendNow``, so an answer leaves in the turn that produced it.
"""

from __future__ import annotations

import typing
from collections import deque
from collections.abc import Iterable
from typing import Any

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPushProducer, ISSLTransport, ITCPTransport
from twisted.internet.protocol import Protocol
from twisted.protocols.policies import TimeoutMixin
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from prexy.config import Limits, Timeouts
from prexy.errorpages import ErrorPages, error_answer, phrase
from prexy.h1server import END, Request, RequestReader
from prexy.metrics import Metrics
from prexy.proxy.client import (
    HTTP11,
    NONE,
    Capabilities,
    IClientChannel,
    IClientConnection,
    ITunnelClient,
)
from prexy.proxy.headers import RequestHeaders, ResponseHeaders
from prexy.proxy.sendnow import SendNow
from prexy.requesthead import CHUNKED, LENGTH, Refusal

__all__ = ["ProxyChannel", "head_bytes", "refusal_answer"]

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: After a deadline or a refusal closed a connection, how long the client
#: has to read what was written before it is cut off (twisted.web's
#: ``abortTimeout``).
ABORT_AFTER = 15.0
_DONE = Failure(ConnectionDone())


def head_bytes(version: bytes, code: bytes, reason: bytes, fields: list[tuple[bytes, bytes]]) -> bytes:
    """An HTTP/1.x response head: status line, fields, empty line."""
    lines = [version, b" ", code, b" ", reason, b"\r\n"]
    for name, value in fields:
        lines += (name, b": ", value, b"\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


def refusal_answer(refusal: Refusal, pages: ErrorPages | None = None) -> bytes:
    """The whole response to a refused head, and close: the page ``pages``
    give for its status, else a generic body (the reason goes to the log,
    ``ProxySite.refused``)."""
    content_type, body = error_answer(refusal.status, pages)
    return (
        b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (refusal.status, phrase(refusal.status), content_type, len(body), body)
    )


class SiteOfChannel(typing.Protocol):
    """What a ``ProxyChannel`` reads of its site (``prexy.proxy.site.ProxySite``)."""

    limits: Limits
    timeouts: Timeouts
    metrics: Metrics
    #: Answers fresh cache hits as their heads come (``prexy.proxy.hitpath.HitPath``), or None.
    hits: Any

    def error_pages(self) -> ErrorPages: ...

    def refused(self, channel: Any, refusal: Refusal) -> None: ...


@implementer(IClientChannel, ITunnelClient, IClientConnection, IPushProducer)
class ProxyChannel(Protocol, TimeoutMixin):
    """One client connection speaking HTTP/1.0 or 1.1 (see the module
    docstring).  ``ProxySite.buildProtocol`` makes it and sets ``site``,
    ``factory``, ``requestFactory``, ``callLater`` and ``timeOut``."""

    site: SiteOfChannel
    factory: Any
    requestFactory: Any
    callLater: Any
    transport: Any = None

    #: The connection stays open after the current answer.
    persistent = True
    #: The request being read or answered, or None.
    request: Any = None
    #: Its body is complete and it is being answered.
    _handling = False
    #: Its body is being read.
    _in_body = False
    #: It was answered as its head came (a hit): its end is all that is left.
    _answered = False
    #: Its answer says ``Connection: close`` (``answer_head``).
    _say_close = False
    #: Has answered a request (graceful shutdown closes it once idle;
    #: one that has not may still be sending its first).
    served = False
    _reader: RequestReader | None = None
    _out: SendNow | None = None
    _head_timer: Any = None
    _abort_call: Any = None
    #: Refused or closing: nothing more is read.
    _closing = False
    #: After a 101, the tunnel every byte goes to (``prexy.proxy.tunnel``).
    _tunnel: Any = None
    #: The request's producer (registered through the request).
    _producer: Any = None
    #: The transport asked us to stop producing (its buffer is full).
    _blocked = False
    #: ``_run`` is carrying out events.
    _running = False
    #: Registered as the transport's producer.
    _registered = False
    #: We asked the transport to stop reading.
    _reads_paused = False
    #: The idle timeout while no body is read.
    _idle: float | None = None
    _host: Any = None
    _peer: Any = None
    _secure: bool | None = None
    #: Writes held to go out as one (``hold_writes``), or None.
    _held: list[bytes] | None = None
    _holds = 0

    def __init__(self) -> None:
        #: What was read behind the request being answered.
        self._queue: deque[Any] = deque()

    # -- the connection ----------------------------------------------------------------

    def connectionMade(self) -> None:
        transport = self.transport
        if ITCPTransport.providedBy(transport):
            # An answer's head and body may leave in two sends: without
            # this, the second waits for the client's delayed ACK (40 ms).
            transport.setTcpNoDelay(True)
        self._out = SendNow(transport)
        self._reader = RequestReader(self.site.limits)
        transport.registerProducer(self, True)
        self._registered = True
        self._idle = self.timeOut
        self.setTimeout(self.timeOut)
        self._arm_head_timer()

    def dataReceived(self, data: bytes) -> None:
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.from_client(data)
            return
        if self._closing:
            return
        self.resetTimeout()
        reader = self._reader
        assert reader is not None
        events = reader.feed(data)
        if events:
            self._queue.extend(events)
            self._run()
        if reader.in_head and self._head_timer is None and not self._closing and not self._handling:
            self._arm_head_timer()

    def _run(self) -> None:
        """Carry out what was read, in order, until a request is being
        answered.  An answer completed meanwhile (``requestDone``) lets this
        loop go on rather than starting another one, so many pipelined
        requests answered at once do not nest."""
        if self._running:
            return
        self._running = True
        queue = self._queue
        try:
            while queue and not self._handling and not self._closing:
                self._event(queue.popleft())
        finally:
            self._running = False
        self._flow()

    def _event(self, event: Any) -> None:
        kind = type(event)
        if kind is bytes:
            request = self.request
            if request is not None:
                request.handleContentChunk(event)
        elif kind is Request:
            self._head(event)
        elif event is END:
            self._complete()
        else:
            assert isinstance(event, Refusal)
            self.refuse(event)

    def _head(self, event: Request) -> None:
        """A head passed: the request starts (or is answered at once, a
        fresh cache hit: ``prexy.proxy.hitpath``)."""
        self._cancel_head_timer()
        self.persistent = event.persistent
        # An HTTP/1.1 request that asked to close is told so in its answer.
        self._say_close = not event.persistent and event.head.version == b"HTTP/1.1"
        headers = RequestHeaders.of(event.fields)
        hits = self.site.hits
        looked = None
        if hits is not None:
            looked = hits.answer(self, event, headers)
            if looked is True:
                self._answered = self.served = True
                return
        request = self.request = self.requestFactory(self)
        if looked:
            request.looked = looked  # the store is read once per request
        request.requestHeaders = headers
        head = request.head = event.head
        framing = head.framing
        if framing is LENGTH:
            request.gotLength(head.length)
        else:
            request.gotLength(None if framing is CHUNKED else 0)
        if self._closing:
            return  # refused as too large
        if head.has_body:
            if event.expect_continue:
                self.write(_CONTINUE)
            seconds = self.site.timeouts.client_body
            if seconds > 0:
                self._in_body = True
                self.setTimeout(seconds)

    def _complete(self) -> None:
        """The request's body is complete: answer it."""
        if self._answered:
            self._answered = False
            if not self.persistent:
                self._closing = True
                self.loseConnection()
            return
        if self._in_body:
            self._in_body = False
            self.setTimeout(self._idle)
        self._handling = True
        request = self.request
        head = request.head
        request.requestReceived(head.method, head.target, head.version)

    def requestDone(self, request: Any) -> None:
        """The answer is complete (``Request.finish``)."""
        self.request = None
        self.served = True
        self._handling = False
        if self._tunnel is not None:
            return
        if not self.persistent:
            self.loseConnection()
            return
        reader = self._reader
        assert reader is not None
        if self.transport is None or self.transport.disconnecting:
            return
        held = reader.resume()  # after an upgrade request that was not tunnelled
        if held:
            self._queue.extend(held)
        self._run()
        if reader.in_head and self._head_timer is None and not self._closing and not self._handling:
            self._arm_head_timer()

    def _flow(self) -> None:
        """Read from the client unless a request waits behind the one being
        answered, or the client does not read its answers."""
        pause = (self._handling and bool(self._queue)) or (self._blocked and not self._handling)
        if pause != self._reads_paused and not self._closing and self.transport is not None:
            self._reads_paused = pause
            if pause:
                self.transport.pauseProducing()
            else:
                self.transport.resumeProducing()

    # -- deadlines and refusals -------------------------------------------------------

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
        reader = self._reader
        if self._handling or self._closing or self.request is not None:
            return
        if reader is not None and reader.in_head:
            self.refuse(Refusal(408, "request head not received in time (client_header timeout)"))
        elif not self._queue:
            # Nothing of a request came: close without an answer, as nginx does.
            self._closing = True
            self.loseConnection()

    def timeoutConnection(self) -> None:
        if self._in_body:
            self.refuse(Refusal(408, "request body stalled (client_body timeout)"))
        elif self._handling:
            self.setTimeout(self._idle)  # idle only once the answer is complete
        else:
            self._closing = True
            self._close_then_abort()

    def _close_then_abort(self) -> None:
        """Close, and reset the connection if the client has not read what
        is written within ``ABORT_AFTER`` seconds."""
        self.loseConnection()
        if self.transport is not None and self._abort_call is None:
            self._abort_call = self.callLater(ABORT_AFTER, self.abortConnection)

    def refuse(self, refusal: Refusal) -> None:
        """Answer a head (or a stalled body) that will not be served, and
        close the connection."""
        self._closing = True
        self._queue.clear()
        self._cancel_head_timer()
        self.setTimeout(None)
        if self.transport is None:
            return
        self.write(refusal_answer(refusal, self.site.error_pages()))
        self.site.refused(self, refusal)
        self._close_then_abort()

    def body_too_large(self, request: Any) -> None:
        """A 413 straight away, before the request is answered, and close:
        the rest of the body is never read."""
        content_type, body = error_answer(413, request.site_pages())
        self._closing = True
        self._queue.clear()
        self.write(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: %s\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (content_type, len(body), body)
        )
        self.site.metrics.count("prexyrequests_total", status="413")
        self.loseConnection()

    def loseConnection(self) -> None:
        # Held writes go first: a transport takes nothing after its close
        # (TLS drops it; plain TCP happens to send it).
        self.flush_writes()
        transport = self.transport
        if transport is not None:
            if self._registered:
                self._registered = False
                transport.unregisterProducer()
            transport.loseConnection()

    def abortConnection(self) -> None:
        """Reset the connection (the request hears of it as a lost one)."""
        transport = self.transport
        if transport is not None:
            transport.abortConnection()

    def connectionLost(self, reason: Failure = _DONE) -> None:
        self._closing = True
        self._cancel_head_timer()
        abort, self._abort_call = self._abort_call, None
        if abort is not None and abort.active():
            abort.cancel()
        self.setTimeout(None)
        self._queue.clear()
        if self._reader is not None:
            self._reader.close()
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.client_lost(reason)
        request, self.request = self.request, None
        if request is not None and not request.finished:
            request.connectionLost(reason)
        self._producer = None

    def drain(self, fresh: bool = False) -> None:
        """Graceful stop: a connection busy with a request closes after its
        answer, an idle keep-alive one now, a ``fresh`` one is left for its
        first request (the site closes it later)."""
        if self.request is not None:
            self.persistent = False
        elif not fresh:
            self._closing = True
            self.loseConnection()

    # -- producers -----------------------------------------------------------------------

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        if not streaming:
            raise ValueError("the proxy's producers are streaming ones")
        self._producer = producer
        if self._blocked:
            producer.pauseProducing()

    def unregisterProducer(self) -> None:
        self._producer = None

    def pauseProducing(self) -> None:
        """The client does not read fast enough: hold the answer's producer
        (and stop reading, unless a request is being answered)."""
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.client_blocked(True)  # hold the upstream
            return
        self._blocked = True
        producer = self._producer
        if producer is not None:
            producer.pauseProducing()
        self._flow()

    def resumeProducing(self) -> None:
        tunnel = self._tunnel
        if tunnel is not None:
            tunnel.client_blocked(False)
            return
        self._blocked = False
        producer = self._producer
        if producer is not None:
            producer.resumeProducing()
        self._flow()

    def stopProducing(self) -> None:
        producer = self._producer
        if producer is not None:
            producer.stopProducing()

    # -- what the request asks beyond twisted.web -----------------------------------------

    def capabilities(self, version: bytes) -> Capabilities:
        """An HTTP/1.1 request can be sent trailers (its body chunked),
        1xx heads and a tunnel; an HTTP/1.0 one none of them."""
        return HTTP11 if version == b"HTTP/1.1" else NONE

    def send_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        """Nothing: a chunked body's trailer section is written by the
        request with its last chunk (``ProxyRequest.finish``), and a body
        with a Content-Length has no place for trailers."""

    def write_interim(self, code: int, phrase: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """An informational head (103 Early Hints) before the response's
        own, in order with everything the connection writes."""
        self.write(head_bytes(b"HTTP/1.1", b"%d" % code, phrase, list(headers)))

    # -- tunnels -------------------------------------------------------------------

    def start_tunnel(self, tunnel: Any, head: bytes) -> bytes:
        """The upstream switched protocols: send its 101 ``head``, and from
        now on every byte read goes to ``tunnel`` (``prexy.proxy.tunnel``).
        Returns the bytes the client sent after its request, for the tunnel."""
        self._tunnel = tunnel
        self._cancel_head_timer()
        self.setTimeout(None)  # the tunnel keeps its own idle time
        self.write(head)
        if self._reads_paused:
            self._reads_paused = False
            self.transport.resumeProducing()
        reader = self._reader
        assert reader is not None
        return reader.tunnel()

    # -- writes ----------------------------------------------------------------------

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Headers) -> None:
        if type(headers) is ResponseHeaders:
            fields = headers.pairs
        else:
            fields = [(name, value) for name, values in headers.getAllRawHeaders() for value in values]
        self.write(self.answer_head(version, code, reason, fields))

    @property
    def says_close(self) -> bool:
        """Whether the current request's answer says ``Connection: close``."""
        return self._say_close

    def answer_head(self, version: bytes, code: bytes, reason: bytes, fields: list[tuple[bytes, bytes]]) -> bytes:
        """The current request's answer head as this connection sends it
        (every way of answering goes through here): ``Connection: close``
        first where the request asked to close."""
        if self._say_close:
            fields = [(b"connection", b"close"), *fields]
        return head_bytes(version, code, reason, fields)

    def hold_writes(self) -> None:
        """Keep what is written until the matching ``release_writes``: a
        head and the body that follows it at once leave in one send.  Holds
        nest; the outermost release sends."""
        self._holds += 1
        if self._held is None:
            self._held = []

    def release_writes(self) -> None:
        self._holds -= 1
        if self._holds > 0:
            return
        held, self._held = self._held, None
        if held:
            self.write(b"".join(held))

    def flush_writes(self) -> None:
        held = self._held
        if held:
            self._held = None
            self.write(b"".join(held))
            self._held = []

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            held.append(data)
            return
        out = self._out
        if out is not None:
            out.write(data)

    def writeSequence(self, iovec: Any) -> None:
        self.write(b"".join(iovec))

    def write_parts(self, parts: list[bytes]) -> None:
        """Write ``parts`` in order, in one send where nothing is held or
        queued (a hit's head and its stored body, without joining them)."""
        if self._held is not None:
            self._held.extend(parts)
            return
        out = self._out
        if out is not None:
            out.write_parts(parts)

    def getHost(self) -> Any:
        if self._host is None:
            self._host = self.transport.getHost()
        return self._host

    def getPeer(self) -> Any:
        if self._peer is None:
            self._peer = self.transport.getPeer()
        return self._peer

    def isSecure(self) -> bool:
        if self._secure is None:
            self._secure = ISSLTransport.providedBy(self.transport)
        return self._secure
