"""One HTTP/1.1 connection to an upstream server, and its response.

Twisted's ``Agent`` costs several hundred microseconds of CPU per request
(URI parsing, IDNA, endpoint construction, a Deferred chain per phase).  A
reverse proxy sends every request to a handful of known origins, so this
module keeps one small protocol per connection and hands the response body
to a consumer chunk by chunk.  The upstream transport is exposed as a push
producer so the caller can pause the upstream socket while its own client is
slow (backpressure).  The pool of keep-alive connections and the request
entry point are :mod:`prexy.proxy.pool`'s; a connection knows its pool and
its request only through :class:`IConnectionOwner` and
:class:`IPendingRequest`, so this module imports nothing from there.  Those
interfaces, the errors and :class:`UpstreamResponse` are
:mod:`prexy.proxy.upstream_api`'s (re-exported here).

Lifecycle of one request on a connection (an explicit state machine):

    IDLE --send--> WAITING --status+headers--> BODY --complete--> IDLE (pooled)
                      |                           |
                      +--error/timeout-----------> CLOSED

Everything time-related goes through the owner's reactor.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import IO, Any

from twisted.internet import defer
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IPushProducer
from twisted.internet.protocol import Protocol
from twisted.python.failure import Failure
from zope.interface import implementer

from prexy import http1
from prexy.config import OriginKey
from prexy.proxy.sendnow import SendNow
from prexy.proxy.upstream_api import (
    IBodyConsumer,
    IConnectionOwner,
    IPendingRequest,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamError,
    UpstreamProtocolError,
    UpstreamResponse,
    UpstreamTimeout,
)

__all__ = [
    "IBodyConsumer",
    "IConnectionOwner",
    "IPendingRequest",
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamProtocol",
    "UpstreamProtocolError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

_CONNECTION_DONE = Failure(ConnectionDone())
#: The framings whose body is known whole once read: no body, or a length.
_WHOLE = (http1.NONE, http1.LENGTH)


class _State(enum.Enum):
    CONNECTING = "connecting"
    IDLE = "idle"
    WAITING = "waiting"
    HEADERS_DONE = "headers-done"
    BODY = "body"
    #: Spliced to a client after a 101 (``prexy.proxy.tunnel``).
    TUNNEL = "tunnel"
    CLOSED = "closed"


# The states as globals, which is how this module reads them: Python 3.11
# reads a member off an Enum class through EnumType's __getattr__ hook,
# about 100 ns a read against 10 for a global (timeit), and a request
# reads a dozen.
_CONNECTING = _State.CONNECTING
_IDLE = _State.IDLE
_WAITING = _State.WAITING
_HEADERS_DONE = _State.HEADERS_DONE
_BODY = _State.BODY
_TUNNEL = _State.TUNNEL
_CLOSED = _State.CLOSED


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
    consumer, and keeps the timers and the backpressure; its owner (the
    pool) sweeps the timers and keeps it while idle."""

    transport: Any  # a TCP or TLS transport: also a push producer with abortConnection

    def __init__(self, owner: IConnectionOwner, key: OriginKey) -> None:
        self._owner = owner
        self.key = key
        self._clock = owner.reactor
        self.state = _CONNECTING
        self._reader = http1.ResponseReader()
        self._pending: IPendingRequest | None = None
        self._consumer: IBodyConsumer | None = None
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
        self._tunnel: Any = None

    # -- connection lifecycle -------------------------------------------------

    def connectionMade(self) -> None:
        self.state = _IDLE
        self._out = SendNow(self.transport)
        set_no_delay = getattr(self.transport, "setTcpNoDelay", None)
        if set_no_delay is not None:
            set_no_delay(True)

    def connectionLost(self, reason: Failure = _CONNECTION_DONE) -> None:
        previous = self.state
        self.state = _CLOSED
        self._lost = True
        waiters, self._close_waiters = self._close_waiters, []
        for waiter in waiters:
            waiter.callback(None)
        self._owner.unwatch(self)
        self._owner.forget(self)
        if previous is _TUNNEL:
            assert self._tunnel is not None
            self._tunnel.upstream_lost(reason)
        elif previous is _WAITING:
            err = UpstreamClosed(f"upstream closed the connection before answering: {reason.getErrorMessage()}")
            self._fail_response(Failure(err))
        elif previous in (_BODY, _HEADERS_DONE) and not self._reader.done:
            if self._reader.framing is http1.CLOSE and reason.check(ConnectionDone):
                events = self._reader.connection_closed()  # the End of the body
                if previous is _BODY:
                    self._deliver(events)
                else:
                    self._queued += events
            else:
                failure = Failure(UpstreamClosed(f"upstream closed mid-body: {reason.getErrorMessage()}"))
                if previous is _BODY:
                    self._fail_body(failure)
                else:
                    self._keep_alive = False
                    self._queued = []
                    self._failure = failure

    def closed(self) -> defer.Deferred[None]:
        """Fires when this connection is closed."""
        d: defer.Deferred[None] = defer.Deferred()
        if self.state is _CLOSED and self._lost:
            d.callback(None)
        else:
            self._close_waiters.append(d)
        return d

    @property
    def idle(self) -> bool:
        """Connected, and not serving a request."""
        return self.state is _IDLE

    def close(self) -> None:
        """Close the connection cleanly; it will not be reused."""
        self.state = _CLOSED
        self.transport.loseConnection()

    def detach(self, pending: IPendingRequest) -> None:
        """``pending`` gave up (its client went away): if it is still waiting
        for its head here, tell it nothing more and drop the connection."""
        if self._pending is pending:
            self._pending = None
            self.abort()

    def abort(self) -> None:
        """Drop the connection at once; it will not be reused."""
        self._keep_alive = False
        if self.state is not _CLOSED and self.transport is not None:
            self.transport.abortConnection()

    # -- sending ----------------------------------------------------------------

    def send(
        self,
        pending: IPendingRequest,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: IO[bytes] | None,
        body_length: int,
        connect_seconds: float,
    ) -> None:
        """Send one request; ``pending`` hears of the response head or the failure."""
        assert self.state is _IDLE, self.state
        self.state = _WAITING
        # A 101 answers only a request that asked to upgrade (else a 502):
        # one whose last header is Upgrade, where prexy.upgrade.upgrade_headers
        # puts it (a client's own Upgrade never goes up: hop-by-hop).
        upgrade = bool(headers) and headers[-1][0] == b"Upgrade"
        self._reader = http1.ResponseReader(
            method, self._owner.limits.max_response_head, upgrade=upgrade, interim=True
        )
        self._keep_alive = True
        self._consumer = None
        self._queued = []
        self._failure = None
        if self._pause_reasons:
            self._pause_reasons = set()
        self._connect_seconds = connect_seconds
        self._pending = pending
        if body is None:
            body_length = 0
        head = http1.request_head(method, target, headers, body_length)
        self._sent_at = self._clock.seconds()
        out = self._out
        if not body_length:
            out.write(head)
        elif body_length <= 65536:
            assert body is not None
            out.write(head + body.read())
        else:
            assert body is not None
            out.write(head)
            self._stream_request_body(body)
        self._start_timer(self._owner.timeouts.first_byte, "first byte")

    def _stream_request_body(self, body: IO[bytes]) -> None:
        from twisted.protocols.basic import FileSender

        sender = FileSender()
        self._body_writer = sender
        sent = sender.beginFileTransfer(body, self._out.hand_over())
        sent.addErrback(lambda f: None)

    # -- timers -------------------------------------------------------------------

    def _start_timer(self, seconds: float, phase: str) -> None:
        """Watch this connection: it times out after ``seconds`` without
        progress (the pool's sweeper checks; no DelayedCall per request)."""
        self._timeout = seconds
        self._phase = phase
        if seconds > 0:
            self._last_activity = self._clock.seconds()
            self._owner.watch(self)

    def _cancel_timer(self) -> None:
        # The sweeper drops a connection without a timer the next time it
        # looks (``check_timeout``): a request's phases start and stop the
        # timer three times, and its next one starts it again.
        self._timeout = 0.0

    def check_timeout(self, now: float) -> None:
        """Called by the pool's sweeper for watched connections."""
        if self._timeout <= 0 or self.state not in (_WAITING, _BODY):
            self._owner.unwatch(self)
            return
        if self._paused:
            # A slow client paused us: that is not upstream idleness.
            self._last_activity = now
            return
        if now - self._last_activity < self._timeout:
            return
        error = UpstreamTimeout(self._phase, self._timeout)
        self._cancel_timer()
        if self.state is _WAITING:
            self._fail_response(Failure(error))
        else:
            self._fail_body(Failure(error))
        self.abort()

    # -- receiving ----------------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        state = self.state
        if state is _BODY:
            self._last_activity = self._clock.seconds()
            self._deliver(self._reader.receive_data(data))
        elif state is _WAITING:
            events = self._reader.receive_data(data)
            if events and type(events[0]) is http1.Interim:
                events = self._interims(events)
            if events:
                self._start_body(events)
        elif state is _HEADERS_DONE:
            self._queued += self._reader.receive_data(data)
        elif state is _TUNNEL:
            assert self._tunnel is not None
            self._tunnel.from_upstream(data)
        elif state is _IDLE:
            # Bytes nobody asked for: the connection is out of sync.
            self._keep_alive = False
            self.transport.loseConnection()

    def _interims(self, events: list[http1.Event]) -> list[http1.Event]:
        """Pass on the 1xx heads (103 Early Hints...) that lead ``events``;
        the rest of them."""
        self._last_activity = self._clock.seconds()  # an answer is coming
        while events and type(events[0]) is http1.Interim:
            if self._pending is not None:
                self._pending.interim(events[0])
            events = events[1:]
        return events

    def _start_body(self, events: list[http1.Event]) -> None:
        last = events[-1]  # an error is always the last event
        if isinstance(last, http1.ResponseError):
            # A bad head, or a body broken in the read that brought its head:
            # nothing reached the client yet, so a 502 rather than a reset.
            self._protocol_error(str(last))
            return
        head = events[0]
        assert isinstance(head, http1.Head)
        self._cancel_timer()
        self.state = _HEADERS_DONE
        # Positional, in the class's field order: half the cost of keywords.
        response = UpstreamResponse(
            head.code, head.phrase, head.version, head.headers, head.lnames, head.connection_names, head.length,
            self._connect_seconds, self._clock.seconds() - self._sent_at, self,
        )
        # Body bytes that came with the head wait for a consumer.
        self._queued = events[1:]
        pending, self._pending = self._pending, None
        assert pending is not None
        pending.head(response)
        if self.state is _HEADERS_DONE and not self._reader.done and not self._paused:
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
        return self._reader.framing in _WHOLE and self._reader.done

    def take_body(self) -> bytes | None:
        """See UpstreamResponse.take_body."""
        reader = self._reader
        if reader.framing not in _WHOLE or self._consumer is not None or not reader.done:
            return None
        queued, self._queued = self._queued, []
        data = [e.data for e in queued if isinstance(e, http1.Data)]
        end = queued[-1]
        assert isinstance(end, http1.End)
        self._finish_body(end.keep_alive and not reader.trailing_data)
        return data[0] if len(data) == 1 else b"".join(data)

    def deliverBody(self, consumer: IBodyConsumer) -> None:
        """Attach the consumer; data flows from now on."""
        failure, self._failure = self._failure, None
        if failure is None and self.state is _CLOSED and not self._reader.done:
            failure = Failure(UpstreamClosed("upstream connection lost"))
        if failure is not None:
            consumer.bodyFailed(failure)
            return
        self._consumer = consumer
        if self.state is not _CLOSED:
            self.state = _BODY
        queued, self._queued = self._queued, []
        if queued:
            self._deliver(queued)
            if self._consumer is not consumer:
                return
        if self._paused and not self._pause_reasons:
            self._paused = False
            self.transport.resumeProducing()
        self._start_timer(self._owner.timeouts.idle, "idle")

    def start_tunnel(self, tunnel: Any) -> bytes:
        """After a 101: the connection is ``tunnel``'s from now on (never
        pooled again).  Returns the bytes that came after the 101's head."""
        self._cancel_timer()
        self.state = _TUNNEL
        self._tunnel = tunnel
        self._keep_alive = False
        self._queued = []
        if self._paused:
            self._paused = False
            self.transport.resumeProducing()
        return self._reader.trailing_data

    def tunnel_write(self, data: bytes) -> None:
        self._out.write(data)

    def pauseBody(self, reason: str = "client") -> None:
        """Stop reading the body: for a slow client ("client") or while the
        consumer works through what it has ("work")."""
        self._pause_reasons.add(reason)
        self._apply_pause()

    def resumeBody(self, reason: str = "client") -> None:
        self._pause_reasons.discard(reason)
        self._apply_pause()

    def _apply_pause(self) -> None:
        if self.state is not _BODY:
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
        if self.state is not _CLOSED:
            if self._paused:
                self._paused = False
                self.transport.resumeProducing()
            if reuse and self._keep_alive:
                # Back to the pool before the consumer hears of it, so a
                # request it starts at once can reuse this connection.
                self.state = _IDLE
                self._owner.release(self)
            else:
                self.close()
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
