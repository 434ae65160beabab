"""A lean, pooled HTTP/1.1 client for talking to upstream servers.

Twisted's ``Agent`` costs several hundred microseconds of CPU per request
(URI parsing, IDNA, endpoint construction, a Deferred chain per phase).  A
reverse proxy sends every request to a handful of known origins, so this
module keeps one small protocol per connection, a pool of idle keep-alive
connections per origin, and hands the response body to a consumer chunk by
chunk.  The upstream transport is exposed as a push producer so the caller can
pause the upstream socket while its own client is slow (backpressure).

Lifecycle of one request on a connection (an explicit state machine):

    IDLE --send--> WAITING --status+headers--> BODY --complete--> IDLE (pooled)
                      |                           |
                      +--error/timeout-----------> CLOSED

Everything time-related goes through the reactor passed in.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - see below
import enum
from collections.abc import Callable, Sequence
from typing import IO, Any
from typing import Protocol as TypingProtocol

import attrs
from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from prexy import http1
from prexy.config import OriginKey, Timeouts

# HostnameEndpoint encodes the host name with the idna codec, whose module
# (with stringprep) was otherwise imported inside a worker's first request:
# PYTHONPROFILEIMPORTTIME showed it as the only import after start.  It
# takes about 1.5 ms here; importing it with this module moves that to
# start-up.

__all__ = ["OriginKey", "UpstreamPool", "UpstreamResponse"]

log = Logger()

_CONNECTION_DONE = Failure(ConnectionDone())
IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})


class UpstreamError(Exception):
    """Base class: the upstream exchange failed; ``status`` is what to answer."""

    status = 502


class UpstreamConnectError(UpstreamError):
    """The upstream could not be reached (refused, unreachable, DNS)."""


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer in time (connect, first byte, or idle)."""

    status = 504

    def __init__(self, phase: str, seconds: float) -> None:
        super().__init__(f"upstream {phase} timeout after {seconds:g}s")
        self.phase = phase
        self.seconds = seconds


class UpstreamProtocolError(UpstreamError):
    """The upstream sent something that is not valid HTTP/1.x."""


class UpstreamClosed(UpstreamError):
    """The upstream connection closed before the response was complete."""


class BodyConsumer(TypingProtocol):
    """What receives a response body, chunk by chunk."""

    def bodyData(self, data: bytes) -> None: ...

    def bodyDone(self) -> None: ...

    def bodyFailed(self, reason: Failure) -> None: ...


@attrs.define(eq=False)
class UpstreamResponse:
    """Status line and headers of an upstream response; the body follows via
    :meth:`deliverBody`."""

    code: int
    phrase: bytes
    version: bytes
    #: Header fields in order, repeated ones as separate pairs.
    headers: list[tuple[bytes, bytes]]
    #: The lower-cased name of each header, in the same order.
    lnames: list[bytes]
    #: Header names listed in Connection (hop-by-hop for this message).
    connection_names: frozenset[bytes]
    #: Body length from Content-Length when the body is length-delimited,
    #: ``None`` for chunked or close-delimited bodies; 0 for bodiless ones.
    #: For HEAD, the upstream's Content-Length (or None) though no body follows.
    length: int | None
    connect_seconds: float
    first_byte_seconds: float
    _protocol: UpstreamProtocol

    @property
    def producer(self) -> IPushProducer:
        """Push producer that pauses and resumes the upstream socket."""
        return self._protocol.producer

    def end_to_end(self, drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
        """Headers that may be forwarded: without hop-by-hop ones, those named
        in Connection, and ``drop`` (lower-case names)."""
        if self.connection_names:
            drop = drop | self.connection_names
        return [pair for pair, lname in zip(self.headers, self.lnames, strict=True) if lname not in drop]

    @property
    def body_in_hand(self) -> bool:
        """The whole body has already arrived (it came with the head):
        delivering it needs no more reads, so no backpressure either."""
        return self._protocol.body_in_hand()

    def header(self, lname: bytes) -> bytes | None:
        """The first value of an end-to-end header (lower-case name, not a
        hop-by-hop one), or None: one C-level search of ``lnames``."""
        try:
            index = self.lnames.index(lname)
        except ValueError:
            return None
        return None if lname in self.connection_names else self.headers[index][1]

    def values(self, lname: bytes) -> list[bytes]:
        """Every value of one header (lower-case name)."""
        return [pair[1] for pair, n in zip(self.headers, self.lnames, strict=True) if n == lname]

    def deliverBody(self, consumer: BodyConsumer) -> None:
        """Start delivering the body to ``consumer``."""
        self._protocol.deliverBody(consumer)

    def take_body(self) -> bytes | None:
        """The whole body at once, instead of :meth:`deliverBody`, when it
        is length-delimited and has all arrived (the connection is then done
        with this response, back in the pool if reusable); else None, and
        nothing changes."""
        return self._protocol.take_body()

    def abort(self) -> None:
        """Drop the upstream connection (the client went away)."""
        self._protocol.abort()

    def pause_for_work(self) -> None:
        """Stop reading while the consumer works through what it has."""
        self._protocol.pauseBody("work")

    def resume_after_work(self) -> None:
        self._protocol.resumeBody("work")


class _State(enum.Enum):
    CONNECTING = "connecting"
    IDLE = "idle"
    WAITING = "waiting"
    HEADERS_DONE = "headers-done"
    BODY = "body"
    CLOSED = "closed"


@implementer(IPushProducer)
class _TransportProducer:
    """Pauses/resumes the upstream socket on behalf of a slow client."""

    def __init__(self, protocol: UpstreamProtocol) -> None:
        self._protocol = protocol

    def pauseProducing(self) -> None:
        self._protocol.pauseBody()

    def resumeProducing(self) -> None:
        self._protocol.resumeBody()

    def stopProducing(self) -> None:
        self._protocol.abort()


class UpstreamProtocol(Protocol):
    """One HTTP/1.1 connection to an upstream; serves one request at a time.

    The framing is :class:`prexy.http1.ResponseReader`'s; this class turns
    its events into calls on the pending request (the head) and on the body
    consumer, and keeps the timers, the pool and the backpressure."""

    transport: Any  # a TCP or TLS transport: also a push producer with abortConnection

    def __init__(self, pool: UpstreamPool, key: OriginKey) -> None:
        self._pool = pool
        self._key = key
        self._clock = pool.reactor
        self.state = _State.CONNECTING
        self._reader = http1.ResponseReader()
        self._pending: PendingRequest | None = None
        self._consumer: BodyConsumer | None = None
        #: Body events that arrived before a consumer was attached.
        self._queued: list[http1.Event] = []
        #: Why the body cannot be delivered (the connection was lost before
        #: a consumer was attached).
        self._failure: Failure | None = None
        self._keep_alive = True
        self._timeout = 0.0
        self._phase = ""
        self._last_activity = 0.0
        self._paused = False
        self.requests_served = 0
        self.idle_since = 0.0
        self.producer = _TransportProducer(self)
        self._sent_at = 0.0
        self._connect_seconds = 0.0
        self._body_writer: Any = None
        self._pause_reasons: set[str] = set()
        self._lost = False
        self._close_waiters: list[defer.Deferred[None]] = []

    # -- connection lifecycle -------------------------------------------------

    def connectionMade(self) -> None:
        self.state = _State.IDLE
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)

    def connectionLost(self, reason: Failure = _CONNECTION_DONE) -> None:
        previous = self.state
        self.state = _State.CLOSED
        self._lost = True
        waiters, self._close_waiters = self._close_waiters, []
        for waiter in waiters:
            waiter.callback(None)
        self._pool._unwatch(self)
        self._pool._forget(self)
        if previous is _State.WAITING:
            err = UpstreamClosed(f"upstream closed the connection before answering: {reason.getErrorMessage()}")
            self._fail_response(Failure(err))
        elif previous in (_State.BODY, _State.HEADERS_DONE) and not self._reader.done:
            if self._reader.framing is http1.CLOSE and reason.check(ConnectionDone):
                events = self._reader.connection_closed()  # the End of the body
                if previous is _State.BODY:
                    self._deliver(events)
                else:
                    self._queued += events
            else:
                failure = Failure(UpstreamClosed(f"upstream closed mid-body: {reason.getErrorMessage()}"))
                if previous is _State.BODY:
                    self._fail_body(failure)
                else:
                    self._keep_alive = False
                    self._queued = []
                    self._failure = failure

    def closed(self) -> defer.Deferred[None]:
        """Fires when this connection is closed."""
        d: defer.Deferred[None] = defer.Deferred()
        if self.state is _State.CLOSED and self._lost:
            d.callback(None)
        else:
            self._close_waiters.append(d)
        return d

    def abort(self) -> None:
        """Drop the connection at once; it will not be reused."""
        self._keep_alive = False
        if self.state is not _State.CLOSED and self.transport is not None:
            self.transport.abortConnection()

    # -- sending ----------------------------------------------------------------

    def send(
        self,
        pending: PendingRequest,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: IO[bytes] | None,
        body_length: int,
        connect_seconds: float,
    ) -> None:
        """Send one request; ``pending`` hears of the response head or the failure."""
        assert self.state is _State.IDLE, self.state
        self.state = _State.WAITING
        self._reader = http1.ResponseReader(method)
        self._keep_alive = True
        self._consumer = None
        self._queued = []
        self._failure = None
        self._pause_reasons = set()
        self._connect_seconds = connect_seconds
        self._pending = pending
        pending.protocol = self
        if body is None:
            body_length = 0
        head = http1.request_head(method, target, headers, body_length)
        self._sent_at = self._clock.seconds()
        if not body_length:
            self.transport.write(head)
        elif body_length <= 65536:
            assert body is not None
            self.transport.write(head + body.read())
        else:
            assert body is not None
            self.transport.write(head)
            self._stream_request_body(body)
        self._start_timer(self._pool.timeouts.first_byte, "first byte")

    def _stream_request_body(self, body: IO[bytes]) -> None:
        from twisted.protocols.basic import FileSender

        sender = FileSender()
        self._body_writer = sender
        sent = sender.beginFileTransfer(body, self.transport)
        sent.addErrback(lambda f: None)

    # -- timers -------------------------------------------------------------------

    def _start_timer(self, seconds: float, phase: str) -> None:
        """Watch this connection: it times out after ``seconds`` without
        progress (the pool's sweeper checks; no DelayedCall per request)."""
        self._timeout = seconds
        self._phase = phase
        if seconds > 0:
            self._last_activity = self._clock.seconds()
            self._pool._watch(self)
        else:
            self._pool._unwatch(self)

    def _cancel_timer(self) -> None:
        self._timeout = 0.0
        self._pool._unwatch(self)

    def check_timeout(self, now: float) -> None:
        """Called by the pool's sweeper for watched connections."""
        if self._timeout <= 0 or self.state not in (_State.WAITING, _State.BODY):
            self._pool._unwatch(self)
            return
        if self._paused:
            # A slow client paused us: that is not upstream idleness.
            self._last_activity = now
            return
        if now - self._last_activity < self._timeout:
            return
        error = UpstreamTimeout(self._phase, self._timeout)
        self._cancel_timer()
        if self.state is _State.WAITING:
            self._fail_response(Failure(error))
        else:
            self._fail_body(Failure(error))
        self.abort()

    # -- receiving ----------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state is _State.BODY:
            self._last_activity = self._clock.seconds()
            self._deliver(self._reader.receive_data(data))
        elif state is _State.WAITING:
            events = self._reader.receive_data(data)
            if events:
                self._start_body(events)
        elif state is _State.HEADERS_DONE:
            self._queued += self._reader.receive_data(data)
        elif state is _State.IDLE:
            # Bytes nobody asked for: the connection is out of sync.
            self._keep_alive = False
            self.transport.loseConnection()

    def _start_body(self, events: list[http1.Event]) -> None:
        head = events[0]
        if not isinstance(head, http1.Head):
            self._protocol_error(str(head))
            return
        self._cancel_timer()
        self.state = _State.HEADERS_DONE
        response = UpstreamResponse(
            code=head.code,
            phrase=head.phrase,
            version=head.version,
            headers=head.headers,
            lnames=head.lnames,
            connection_names=head.connection_names,
            length=head.length,
            connect_seconds=self._connect_seconds,
            first_byte_seconds=self._clock.seconds() - self._sent_at,
            protocol=self,
        )
        # Body bytes that came with the head wait for a consumer.
        self._queued = events[1:]
        pending, self._pending = self._pending, None
        assert pending is not None
        pending.head(response)
        if self.state is _State.HEADERS_DONE and not self._reader.done and not self._paused:
            # Nobody consumes the body yet: hold the socket until deliverBody.
            # (Usually the consumer attached inside head(): no pause, which
            # saves two epoll_ctl calls per response.)
            self.transport.pauseProducing()
            self._paused = True

    def _deliver(self, events: list[http1.Event]) -> None:
        """Hand body events to the consumer, until it or the body is done."""
        consumer = self._consumer
        assert consumer is not None
        for event in events:
            kind = type(event)
            if kind is http1.Data:
                consumer.bodyData(event.data)  # type: ignore[union-attr]
                if self._consumer is not consumer:
                    return  # it gave up (or the connection went)
            elif kind is http1.End:
                self._finish_body(event.keep_alive and not self._reader.trailing_data)  # type: ignore[union-attr]
                return
            else:
                self._protocol_error_body(str(event))
                return

    def body_in_hand(self) -> bool:
        """See UpstreamResponse.body_in_hand."""
        return self._reader.framing in (http1.NONE, http1.LENGTH) and self._reader.done

    def take_body(self) -> bytes | None:
        """See UpstreamResponse.take_body."""
        if self._reader.framing is not http1.LENGTH or self._consumer is not None or not self._reader.done:
            return None
        queued, self._queued = self._queued, []
        data = [e.data for e in queued if isinstance(e, http1.Data)]
        end = queued[-1]
        assert isinstance(end, http1.End)
        self._finish_body(end.keep_alive and not self._reader.trailing_data)
        return data[0] if len(data) == 1 else b"".join(data)

    def deliverBody(self, consumer: BodyConsumer) -> None:
        """Attach the consumer; data flows from now on."""
        failure, self._failure = self._failure, None
        if failure is None and self.state is _State.CLOSED and not self._reader.done:
            failure = Failure(UpstreamClosed("upstream connection lost"))
        if failure is not None:
            consumer.bodyFailed(failure)
            return
        self._consumer = consumer
        if self.state is not _State.CLOSED:
            self.state = _State.BODY
        queued, self._queued = self._queued, []
        if queued:
            self._deliver(queued)
            if self._consumer is not consumer:
                return
        if self._paused and not self._pause_reasons:
            self._paused = False
            self.transport.resumeProducing()
        self._start_timer(self._pool.timeouts.idle, "idle")

    def pauseBody(self, reason: str = "client") -> None:
        """Stop reading the body: for a slow client ("client") or while the
        consumer works through what it has ("work")."""
        self._pause_reasons.add(reason)
        self._apply_pause()

    def resumeBody(self, reason: str = "client") -> None:
        self._pause_reasons.discard(reason)
        self._apply_pause()

    def _apply_pause(self) -> None:
        if self.state is not _State.BODY:
            return
        want = bool(self._pause_reasons)
        if want and not self._paused:
            self._paused = True
            self.transport.pauseProducing()
        elif not want and self._paused:
            self._paused = False
            self._last_activity = self._clock.seconds()
            self.transport.resumeProducing()

    def _finish_body(self, reuse: bool) -> None:
        self._cancel_timer()
        consumer, self._consumer = self._consumer, None
        self.requests_served += 1
        if self.state is not _State.CLOSED:
            if self._paused:
                self._paused = False
                self.transport.resumeProducing()
            if reuse and self._keep_alive:
                # Back to the pool before the consumer hears of it, so a
                # request it starts at once can reuse this connection.
                self.state = _State.IDLE
                self._pool._release(self)
            else:
                self.state = _State.CLOSED
                self.transport.loseConnection()
        if consumer is not None:
            consumer.bodyDone()

    def _fail_response(self, failure: Failure) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.failed(self, failure)

    def _fail_body(self, failure: Failure) -> None:
        consumer, self._consumer = self._consumer, None
        self._keep_alive = False
        if consumer is not None:
            consumer.bodyFailed(failure)
        else:
            self._queued = []

    def _protocol_error(self, why: str) -> None:
        self._fail_response(Failure(UpstreamProtocolError(why)))
        self.abort()

    def _protocol_error_body(self, why: str) -> None:
        self._fail_body(Failure(UpstreamProtocolError(why)))
        self.abort()

    @property
    def was_reused(self) -> bool:
        return self.requests_served > 0

    @property
    def received_any(self) -> bool:
        return self._reader.received_any


class _ProtocolFactory(Factory):
    noisy = False
    def __init__(self, pool: UpstreamPool, key: OriginKey) -> None:
        self._pool = pool
        self._key = key

    def buildProtocol(self, addr: Any) -> UpstreamProtocol:
        return UpstreamProtocol(self._pool, self._key)


EndpointFactory = Callable[[OriginKey, float], Any]


class PendingRequest:
    """One request on its way to an upstream, until its response head."""

    def __init__(
        self,
        pool: UpstreamPool,
        key: OriginKey,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: IO[bytes] | None,
        body_length: int,
        on_head: Callable[[UpstreamResponse], None],
        on_error: Callable[[Failure], None],
    ) -> None:
        self.pool = pool
        self.key = key
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.body_length = body_length
        self.on_head = on_head
        self.on_error = on_error
        self.protocol: UpstreamProtocol | None = None
        self.connecting: defer.Deferred[UpstreamProtocol] | None = None
        self.reused = False
        self.may_retry = False
        self.cancelled = False

    def attempt(self, allow_retry: bool) -> None:
        pool = self.pool
        protocol = pool._take_idle(self.key)
        if protocol is not None:
            self.reused = True
            self.may_retry = allow_retry
            protocol.send(self, self.method, self.target, self.headers, self.body, self.body_length, 0.0)
            return
        self.reused = False
        started = pool.reactor.seconds()
        d = self.connecting = pool._connect(self.key)

        def connected(p: UpstreamProtocol) -> None:
            self.connecting = None
            if self.cancelled:
                p.transport.loseConnection()
                return
            p.send(self, self.method, self.target, self.headers, self.body, self.body_length,
                   pool.reactor.seconds() - started)

        def failed(f: Failure) -> None:
            self.connecting = None
            if not self.cancelled:
                self.on_error(f)

        d.addCallbacks(connected, failed)

    def head(self, response: UpstreamResponse) -> None:
        if not self.cancelled:
            self.on_head(response)

    def failed(self, protocol: UpstreamProtocol, failure: Failure) -> None:
        if self.cancelled:
            return
        if (
            self.reused
            and self.may_retry
            and failure.check(UpstreamClosed)
            and not protocol.received_any
            and self.method in IDEMPOTENT_METHODS
            and _rewind(self.body)
        ):
            self.attempt(False)
            return
        self.on_error(failure)

    def cancel(self) -> None:
        """The client went away: drop whatever is in progress, report nothing."""
        self.cancelled = True
        if self.connecting is not None:
            self.connecting.cancel()
        elif self.protocol is not None and self.protocol._pending is self:
            self.protocol._pending = None
            self.protocol.abort()


class UpstreamPool:
    """Keep-alive connections per origin, and the request entry point."""

    def __init__(
        self,
        reactor: Any,
        timeouts: Timeouts = Timeouts(),
        max_idle_per_origin: int = 64,
        endpoint_factory: EndpointFactory | None = None,
    ) -> None:
        self.reactor = reactor
        self.timeouts = timeouts
        self.max_idle_per_origin = max_idle_per_origin
        self._idle: dict[OriginKey, list[UpstreamProtocol]] = {}
        self._endpoint_factory = endpoint_factory or self.default_endpoint
        self.connections_opened = 0
        self._watched: dict[UpstreamProtocol, None] = {}
        self._tls_cache: dict[OriginKey, Any] = {}
        self._sweeper: Any = None
        nonzero = [t for t in (timeouts.first_byte, timeouts.idle) if t > 0]
        self._sweep_interval = min([1.0, *(t / 4 for t in nonzero)])

    def _watch(self, protocol: UpstreamProtocol) -> None:
        self._watched[protocol] = None
        if self._sweeper is None:
            from twisted.internet.task import LoopingCall

            self._sweeper = LoopingCall(self._sweep)
            self._sweeper.clock = self.reactor
            self._sweeper.start(self._sweep_interval, now=False)

    def _unwatch(self, protocol: UpstreamProtocol) -> None:
        self._watched.pop(protocol, None)

    def _sweep(self) -> None:
        now = self.reactor.seconds()
        for protocol in list(self._watched):
            protocol.check_timeout(now)

    def stop(self) -> defer.Deferred[None]:
        """Stop the timeout sweeper and close idle connections (shutdown);
        fires once they are closed (TLS closes take a round trip)."""
        if self._sweeper is not None and self._sweeper.running:
            self._sweeper.stop()
        self._sweeper = None
        return self.close_idle()

    def default_endpoint(self, key: OriginKey, timeout: float) -> Any:
        """The endpoint a connection to ``key`` uses when no factory was given."""
        from twisted.internet.abstract import isIPAddress, isIPv6Address
        from twisted.internet.endpoints import (
            HostnameEndpoint,
            TCP4ClientEndpoint,
            TCP6ClientEndpoint,
            wrapClientTLS,
        )

        endpoint: Any
        # An address needs no name resolution (HostnameEndpoint resolves
        # even 127.0.0.1 in the reactor's thread pool, a thread round trip
        # per new connection).
        if isIPAddress(key.host):
            endpoint = TCP4ClientEndpoint(self.reactor, key.host, key.port, timeout=timeout or 30)
        elif isIPv6Address(key.host):
            endpoint = TCP6ClientEndpoint(self.reactor, key.host, key.port, timeout=timeout or 30)
        else:
            endpoint = HostnameEndpoint(self.reactor, key.host, key.port, timeout=timeout or 30)
        if key.scheme == "https":
            endpoint = wrapClientTLS(self._tls_options(key), endpoint)
        return endpoint

    def _tls_options(self, key: OriginKey) -> Any:
        """Client TLS that verifies the upstream's certificate and host name
        (service-identity), against the system CAs or the site's CA file."""
        from twisted.internet.ssl import Certificate, optionsForClientTLS, platformTrust

        options = self._tls_cache.get(key)
        if options is None:
            if key.ca_file:
                with open(key.ca_file, "rb") as f:
                    trust = Certificate.loadPEM(f.read())
            else:
                trust = platformTrust()
            options = self._tls_cache[key] = optionsForClientTLS(key.host, trustRoot=trust)
        return options

    def request(
        self,
        key: OriginKey,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: IO[bytes] | None,
        body_length: int,
        on_head: Callable[[UpstreamResponse], None],
        on_error: Callable[[Failure], None],
    ) -> PendingRequest:
        """Send a request to ``key``: ``on_head`` gets the response head, or
        ``on_error`` the failure (exactly one of them, unless cancelled).

        Plain callbacks rather than Deferreds: this is the per-request hot
        path. A reused connection that the upstream closed while it sat idle
        is retried once on a fresh connection when the method is idempotent.
        """
        pending = PendingRequest(self, key, method, target, headers, body, body_length, on_head, on_error)
        pending.attempt(True)
        return pending

    def _connect(self, key: OriginKey) -> defer.Deferred[UpstreamProtocol]:
        from twisted.internet.error import ConnectingCancelledError, DNSLookupError
        from twisted.internet.error import TimeoutError as TxTimeout

        timeout = self.timeouts.connect
        endpoint = self._endpoint_factory(key, timeout)
        self.connections_opened += 1
        d = endpoint.connect(_ProtocolFactory(self, key))

        def failed(f: Failure) -> Failure:
            if f.check(defer.CancelledError, ConnectingCancelledError):
                return f
            if f.check(TxTimeout):
                return Failure(UpstreamTimeout("connect", timeout))
            if f.check(DNSLookupError):
                return Failure(UpstreamConnectError(f"cannot resolve {key.host}: {f.getErrorMessage()}"))
            return Failure(UpstreamConnectError(f"cannot connect to {key.host}:{key.port}: {f.getErrorMessage()}"))

        d.addErrback(failed)
        return d

    def _take_idle(self, key: OriginKey) -> UpstreamProtocol | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        limit = self.timeouts.pool_idle
        now = self.reactor.seconds() if limit else 0.0
        while idle:
            protocol = idle.pop()
            if protocol.state is not _State.IDLE:
                continue
            if limit and now - protocol.idle_since > limit:
                protocol.transport.loseConnection()
                continue
            return protocol
        return None

    def _release(self, protocol: UpstreamProtocol) -> None:
        idle = self._idle.setdefault(protocol._key, [])
        if len(idle) >= self.max_idle_per_origin:
            protocol.state = _State.CLOSED
            protocol.transport.loseConnection()
            return
        protocol.idle_since = self.reactor.seconds()
        idle.append(protocol)

    def _forget(self, protocol: UpstreamProtocol) -> None:
        idle = self._idle.get(protocol._key)
        if idle and protocol in idle:
            idle.remove(protocol)

    def idle_connections(self) -> int:
        """How many connections sit idle in the pool."""
        return sum(len(v) for v in self._idle.values())

    def close_idle(self) -> defer.Deferred[None]:
        """Close every idle pooled connection; fires when all are closed."""
        waits = []
        for idle in self._idle.values():
            for protocol in list(idle):
                waits.append(protocol.closed())
                protocol.transport.loseConnection()
        self._idle.clear()
        return defer.gatherResults(waits).addCallback(lambda _: None)


def _rewind(body: IO[bytes] | None) -> bool:
    if body is None:
        return True
    try:
        body.seek(0)
    except (OSError, ValueError):
        return False
    return True
