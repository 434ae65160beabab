"""Prexy's HTTP/2 server connection: ``prexy.h2server`` wired to a
transport and to the proxy's requests.

:class:`H2ServerProtocol` feeds the client's bytes to a
:class:`~prexy.h2server.ServerConnection` and turns its events into
``ProxyRequest`` calls, as ``HTTPChannel`` does for HTTP/1.1 (``gotLength``,
``handleContentChunk``, ``requestReceived``, ``connectionLost``).  Each
stream's request talks to a :class:`StreamChannel`, its
``prexy.proxy.client.IClientChannel``: the part of a channel that
twisted.web's ``Request`` calls, and Prexy's additions (trailers, 1xx
heads, the stream's reset, a body over the limit).

Backpressure, both ways down to the upstream:

* a stream with more than ``HIGH_WATER`` bytes waiting (its window is
  closed, or the connection's) pauses its producer; when its queue
  empties, the producer resumes.  Nothing waits on a timer: a stalled
  stream is simply left out of the send round until a WINDOW_UPDATE.
* the connection is the transport's streaming producer: when the
  transport's buffer fills, every stream's producer pauses and nothing
  more is framed; when it drains, sending goes on.  What the client still
  makes us write meanwhile (acks, resets) is capped (``unread_budget``).

Writes are framed and handed to the transport once per reactor turn: at
the end of the client's bytes being handled, else in one ``callLater(0)``
made by the first write of the turn (only when something was written, so
never a loop).  The answers of several streams that complete in one turn
go out in one TLS write; each ``transport.write`` on TLS is a record and
an ``SSL_write``.
"""

from __future__ import annotations

from typing import Any

from twisted.internet.error import ConnectionDone, ConnectionLost
from twisted.internet.interfaces import IPushProducer, ISSLTransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web.http_headers import Headers
from zope.interface import implementer

from prexy.errorpages import error_answer
from prexy.h2server import (
    CONNECTION_SPECIFIC,
    HIGH_WATER,
    Body,
    Close,
    End,
    H2Settings,
    Head,
    Reset,
    ServerConnection,
    check_request,
    request_fields,
    response_fields,
)
from prexy.proxy.client import HTTP2, Capabilities, IClientChannel, IClientConnection
from prexy.requesthead import Refusal

__all__ = ["H2ServerProtocol", "StreamChannel"]

log = Logger("prexy")

#: After the last bytes of a closing connection are handed to the
#: transport, how long the client has to read them before it is cut off.
CLOSE_GRACE = 5.0

_DONE = Failure(ConnectionDone())


@implementer(IClientChannel)
class StreamChannel:
    """The channel of one stream's ``ProxyRequest``."""

    producer: Any = None
    request: Any = None
    #: The request's method and target (None: a CONNECT).
    method = b"GET"
    path: bytes | None = None
    _paused = False

    def __init__(self, connection: H2ServerProtocol, stream_id: int) -> None:
        self.connection = connection
        self.stream_id = stream_id
        self.site = connection.site
        self.factory = connection.site
        self.transport = connection.transport
        self.trailers: list[tuple[bytes, bytes]] = []

    # -- what the request calls --------------------------------------------------------

    def getPeer(self) -> Any:
        return self.connection.peer

    def getHost(self) -> Any:
        return self.connection.host

    def isSecure(self) -> bool:
        return self.connection.secure

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Headers) -> None:
        self.connection.send_head(self.stream_id, response_fields(code, headers.getAllRawHeaders()))

    def write(self, data: bytes) -> None:
        connection = self.connection
        connection.send_data(self.stream_id, data)
        if self.producer is not None and not self._paused and connection.queued(self.stream_id) > HIGH_WATER:
            self.pause()

    def writeSequence(self, iovec: Any) -> None:
        self.write(b"".join(iovec))

    def write_interim(self, code: int, phrase: bytes, headers: Any) -> None:
        """An informational head (103 Early Hints) before the answer's own."""
        fields = response_fields(b"%d" % code, ((name, [value]) for name, value in headers))
        self.connection.send_head(self.stream_id, fields)

    def capabilities(self, version: bytes) -> Capabilities:
        """A stream can end with trailers and carry 1xx heads; it is never
        tunnelled (HTTP/2 has no Upgrade)."""
        return HTTP2

    def hold_writes(self) -> None:
        """Nothing: the connection frames and sends once per turn anyway."""

    def release_writes(self) -> None:
        pass

    def flush_writes(self) -> None:
        pass

    def body_too_large(self, request: Any) -> None:
        """A 413 through the request in the next turn (the length may come
        before the stream is set up), then RST_STREAM: the rest of the body
        is not read, and the connection's other streams go on."""
        self.connection.reactor.callLater(0, self._too_large, request)

    def _too_large(self, request: Any) -> None:
        if request.finished or request.channel is None:
            return
        request.proxy_site.metrics.count("prexy_requests_total", status="413")
        content_type, body = error_answer(413, request.site_pages())
        request.setResponseCode(413)
        request.setHeader(b"Content-Type", content_type)
        request.setHeader(b"Content-Length", b"%d" % len(body))
        request.write(body)
        self.abortConnection()

    def send_trailers(self, fields: list[tuple[bytes, bytes]]) -> None:
        """Trailer fields to end the stream with (after the last data)."""
        self.trailers = [(name.lower(), value) for name, value in fields if name.lower() not in CONNECTION_SPECIFIC]

    def requestDone(self, request: Any) -> None:
        self.connection.end(self, self.trailers)

    def loseConnection(self) -> None:
        self.connection.end(self, self.trailers)

    def abortConnection(self) -> None:
        """RST_STREAM; the request hears of it as a lost connection (in the
        next turn, as from an aborted TCP connection)."""
        self.connection.reset(self)

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        if not streaming:
            raise ValueError("an HTTP/2 stream takes streaming producers only")
        self.producer = producer
        self._paused = False
        if self.connection.paused or self.connection.queued(self.stream_id) > HIGH_WATER:
            self.pause()

    def unregisterProducer(self) -> None:
        self.producer = None
        self._paused = False

    # -- what the connection calls -------------------------------------------------------

    def pause(self) -> None:
        producer = self.producer
        if producer is not None and not self._paused:
            self._paused = True
            producer.pauseProducing()

    def resume(self) -> None:
        producer = self.producer
        if producer is not None and self._paused:
            self._paused = False
            producer.resumeProducing()

    def lost(self, reason: Failure) -> None:
        """The stream is over without its answer (reset, or the connection
        went)."""
        request, self.request = self.request, None
        self.producer = None
        if request is not None and not request.finished:
            request.connectionLost(reason)


@implementer(IPushProducer, IClientConnection)
class H2ServerProtocol(Protocol):
    """One client connection speaking HTTP/2 (after ALPN ``h2``, or a
    cleartext connection that began with the preface)."""

    #: (``IClientConnection``: no first request to wait for when draining.)
    served = True
    paused = False
    _closing = False
    _handling = False
    _timer: Any = None
    _close_timer: Any = None
    _flush_call: Any = None
    #: One timer for the request bodies of every stream (``_body_check``).
    _body_timer: Any = None
    #: Bytes written while the transport is paused (the client reads nothing).
    _unread = 0
    #: How many of those before the connection is cut.
    unread_budget = 1024 * 1024

    def __init__(self, site: Any, settings: H2Settings) -> None:
        self.site = site
        self.reactor = site.reactor
        self.settings = settings
        self.core = ServerConnection(settings)
        self.streams: dict[int, StreamChannel] = {}
        #: Streams whose request body is still coming -> when it last moved.
        self._bodies: dict[int, float] = {}
        self._last = 0.0
        self.peer: Any = None
        self.host: Any = None
        self.secure = False

    # -- the transport's side ---------------------------------------------------------------

    def connectionMade(self) -> None:
        transport: Any = self.transport
        self.peer = transport.getPeer()
        self.host = transport.getHost()
        self.secure = ISSLTransport.providedBy(transport)
        transport.registerProducer(self, True)
        self._last = self.reactor.seconds()
        idle = self.settings.idle_timeout
        if idle > 0:
            self._timer = self.reactor.callLater(idle, self._idle_check)
        self._flush()

    def dataReceived(self, data: bytes) -> None:
        self._last = self.reactor.seconds()
        events = self.core.receive(data, self._last)
        self._handling = True
        try:
            for event in events:
                if isinstance(event, Head):
                    self._head(event)
                elif isinstance(event, Body):
                    stream = self.streams.get(event.stream_id)
                    if stream is not None and stream.request is not None:
                        if event.stream_id in self._bodies:
                            self._bodies[event.stream_id] = self._last
                        stream.request.handleContentChunk(event.data)
                elif isinstance(event, End):
                    self._body_done(event.stream_id)
                    stream = self.streams.get(event.stream_id)
                    if stream is not None:
                        self._received(stream)
                elif isinstance(event, Reset):
                    self._body_done(event.stream_id)
                    stream = self.streams.pop(event.stream_id, None)
                    if stream is not None:
                        stream.lost(Failure(ConnectionLost("the client reset the stream")))
                elif isinstance(event, Close) and not event.graceful:
                    log.info("HTTP/2 connection from {peer} closed: {reason}",
                             peer=getattr(self.peer, "host", "?"), reason=event.reason)
        finally:
            self._handling = False
        self._flush()

    def _head(self, event: Head) -> None:
        sid = event.stream_id
        limits = self.site.limits
        refusal = check_request(event.fields, limits.max_request_line, limits.max_header_lines)
        if refusal is not None:
            self.core.refuse(sid, refusal[0], *error_answer(refusal[0], self.site.error_pages()))
            self.site.refused(self, Refusal(*refusal))
            return
        stream = StreamChannel(self, sid)
        self.streams[sid] = stream
        method, path, fields = request_fields(event.fields)
        stream.method, stream.path = method, path
        request = stream.request = self.site.requestFactory(stream)
        add = request.requestHeaders.addRawHeader
        length: int | None = None
        expect = False
        for name, value in fields:
            add(name, value)
            if name == b"content-length":
                length = int(value)
            elif name == b"expect" and value.lower() == b"100-continue":
                expect = True
        if length is None and event.ended:
            length = 0
        request.gotLength(length)
        request.parseCookies()
        if event.ended:
            self._received(stream)
            return
        self._bodies[sid] = self._last
        self._arm_body_check()
        if expect:
            self.core.send_head(sid, [(b":status", b"100")])

    def _arm_body_check(self) -> None:
        """Run ``_body_check`` when the oldest pause of a request body
        reaches ``timeouts.client_body`` (one timer per connection, armed
        only while a body is coming)."""
        limit = self.site.timeouts.client_body
        if self._body_timer is not None or not self._bodies or limit <= 0:
            return
        due = min(self._bodies.values()) + limit - self.reactor.seconds()
        self._body_timer = self.reactor.callLater(max(0.0, due), self._body_check)

    def _body_done(self, sid: int) -> None:
        """Stream ``sid``'s request body is over (or the stream is): the
        timer goes once no body is coming."""
        if self._bodies.pop(sid, None) is not None and not self._bodies and self._body_timer is not None:
            if self._body_timer.active():
                self._body_timer.cancel()
            self._body_timer = None

    def _body_check(self) -> None:
        """A request body that paused longer than ``client_body`` (nginx's
        ``client_body_timeout``, as over HTTP/1.1): its stream gets a 408
        and the rest of the body is refused (RST_STREAM NO_ERROR); the
        connection's other streams go on."""
        self._body_timer = None
        limit = self.site.timeouts.client_body
        now = self.reactor.seconds()
        for sid, moved in list(self._bodies.items()):
            if now - moved < limit:
                continue
            del self._bodies[sid]
            stream = self.streams.pop(sid, None)
            if stream is not None:
                stream.lost(Failure(ConnectionLost("the request body timed out")))
            refusal = Refusal(408, "request body stalled (client_body timeout)")
            self.core.refuse(sid, refusal.status, *error_answer(refusal.status, self.site.error_pages()))
            self.site.refused(self, refusal)
        self._arm_body_check()
        self._flush()

    def _received(self, stream: StreamChannel) -> None:
        """The whole request is in: process it."""
        request = stream.request
        path = stream.path
        if request is None:
            return
        if path is None:  # CONNECT: no tunnel over HTTP/2
            self.reset(stream)
            return
        request.requestReceived(stream.method, path, b"HTTP/2")

    def getPeer(self) -> Any:
        return self.peer

    def pauseProducing(self) -> None:
        """The transport's buffer is full: every stream waits."""
        if self.paused:
            return
        self.paused = True
        for stream in list(self.streams.values()):
            stream.pause()

    def resumeProducing(self) -> None:
        if not self.paused:
            return
        self.paused = False
        self._unread = 0
        self._flush()
        core = self.core
        for sid, stream in list(self.streams.items()):
            if self.paused:
                break
            if core.queued(sid) <= HIGH_WATER:
                stream.resume()

    def stopProducing(self) -> None:
        pass

    def connectionLost(self, reason: Failure = _DONE) -> None:
        for timer in (self._timer, self._close_timer, self._flush_call, self._body_timer):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._close_timer = self._flush_call = self._body_timer = None
        self._bodies.clear()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.lost(reason)

    # -- what the streams call --------------------------------------------------------------

    def send_head(self, sid: int, fields: list[tuple[bytes, bytes]]) -> None:
        self.core.send_head(sid, fields)
        self._soon()

    def send_data(self, sid: int, data: bytes) -> None:
        self.core.send_data(sid, data)
        self._soon()

    def queued(self, sid: int) -> int:
        return self.core.queued(sid)

    def end(self, stream: StreamChannel, trailers: list[tuple[bytes, bytes]]) -> None:
        self._body_done(stream.stream_id)
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
        stream.request = None
        stream.producer = None
        self.core.end(stream.stream_id, trailers)
        self._soon()

    def reset(self, stream: StreamChannel) -> None:
        self._body_done(stream.stream_id)
        if self.streams.get(stream.stream_id) is stream:
            del self.streams[stream.stream_id]
        self.core.reset(stream.stream_id)
        self.reactor.callLater(0, stream.lost, Failure(ConnectionLost("the stream was reset")))
        self._soon()

    # -- sending ----------------------------------------------------------------------------------

    def _soon(self) -> None:
        """Flush at the end of this turn."""
        if self._handling or self._flush_call is not None:
            return
        self._flush_call = self.reactor.callLater(0, self._flush)

    def _flush(self) -> None:
        """Frame what the streams queued and write it (once the client's
        bytes being handled are all handled)."""
        if self._handling:
            return
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        transport: Any = self.transport
        if transport is None:
            return
        core = self.core
        while True:
            more = False if self.paused else core.pump()
            data = core.data_to_send()
            if data:
                if self.paused:
                    # Frames the client makes us send (acks, resets) while
                    # it reads nothing: bounded, or a client could fill our
                    # memory with them (CVE-2019-9512/9514/9515).
                    self._unread += len(data)
                    if self._unread > self.unread_budget:
                        log.info("HTTP/2 connection from {peer} closed: it reads nothing and makes us write",
                                 peer=getattr(self.peer, "host", "?"))
                        self._closing = True
                        transport.abortConnection()
                        return
                transport.write(data)
                self._last = self.reactor.seconds()
            if not more or self.paused:
                break
        drained = core.take_drained()
        if drained and not self.paused:
            streams = self.streams
            for sid in drained:
                stream = streams.get(sid)
                if stream is not None and core.queued(sid) == 0:
                    stream.resume()
        if core.closed is not None and not self._closing:
            self._close()

    def _close(self) -> None:
        self._closing = True
        transport: Any = self.transport
        self._close_timer = self.reactor.callLater(CLOSE_GRACE, transport.abortConnection)
        transport.loseConnection()

    def _idle_check(self) -> None:
        self._timer = None
        idle = self.settings.idle_timeout
        left = self._last + idle - self.reactor.seconds()
        if left > 0:
            self._timer = self.reactor.callLater(left, self._idle_check)
            return
        if not self._closing:
            self.core.idle()
            self._flush()

    def drain(self, fresh: bool = False) -> None:
        """Graceful GOAWAY (a worker stops): the streams open now finish,
        newer ones are refused, then the connection closes; ``fresh`` or
        not (GOAWAY sends the client's next streams elsewhere)."""
        if self.transport is None or self._closing:
            return
        self.core.drain()
        self._flush()
