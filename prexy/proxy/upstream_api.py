"""What the rest of the shell sees of an upstream exchange: the errors it
fails with (each carrying the status to answer), the interfaces a
connection talks through (:class:`IBodyConsumer`, :class:`IPendingRequest`,
:class:`IConnectionOwner`) and the response head (:class:`UpstreamResponse`).

The connection itself is :mod:`prexy.proxy.upstream`'s; a response reaches
it only through :class:`ResponseSource`, so this module imports nothing
from there (and the pool, the forwarder and the tests can name these types
without the protocol).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Protocol

import attrs
from twisted.internet.interfaces import IPushProducer, IReactorTime
from twisted.python.failure import Failure
from zope.interface import Attribute, Interface

from prexy import http1
from prexy.config import Limits, Timeouts

__all__ = [
    "IBodyConsumer",
    "IConnectionOwner",
    "IPendingRequest",
    "ResponseSource",
    "UpstreamClosed",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamResponse",
    "UpstreamTimeout",
]


class ResponseSource(Protocol):
    """What an :class:`UpstreamResponse` asks of the connection it came on
    (``prexy.proxy.upstream.UpstreamProtocol``)."""

    @property
    def producer(self) -> IPushProducer: ...

    def body_in_hand(self) -> bool: ...

    def deliverBody(self, consumer: IBodyConsumer) -> None: ...

    def take_body(self) -> bytes | None: ...

    def abort(self) -> None: ...

    def start_tunnel(self, tunnel: Any) -> bytes: ...

    def pauseBody(self, reason: str = "client") -> None: ...

    def resumeBody(self, reason: str = "client") -> None: ...


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


class IBodyConsumer(Interface):
    """What receives a response body, chunk by chunk: exactly one of
    ``bodyDone`` or ``bodyFailed`` ends it."""

    def bodyData(data: bytes) -> None:
        """The next piece of the body."""

    def bodyDone() -> None:
        """The body is complete."""

    def bodyFailed(reason: Failure) -> None:
        """The body cannot be completed (the upstream broke, timed out or
        sent garbage)."""


class IPendingRequest(Interface):
    """The request a connection is sending: it hears of the response head
    or of the failure before one, exactly once."""

    def head(response: UpstreamResponse) -> None:
        """The response head arrived; the body follows via ``deliverBody``."""

    def interim(response: http1.Interim) -> None:
        """A 1xx head (not 100 nor 101) came before the response head."""

    def failed(protocol: Any, failure: Failure) -> None:
        """No response head will come on ``protocol``."""


class IConnectionOwner(Interface):
    """What a connection needs of the pool that made it: a clock, timeouts
    and limits, a sweeper that checks its timer, a place to go back to."""

    reactor: IReactorTime = Attribute("The clock every timer reads.")
    timeouts: Timeouts = Attribute("The first-byte and idle timeouts.")
    limits: Limits = Attribute("Sizes; a response head over max_response_head is a 502.")

    def watch(protocol: Any) -> None:
        """Call ``protocol.check_timeout(now)`` now and then, until unwatched."""

    def unwatch(protocol: Any) -> None:
        """Stop checking ``protocol``'s timer (it need not be watched)."""

    def release(protocol: Any) -> None:
        """``protocol`` finished a response and may be reused: keep it idle,
        or close it with ``protocol.close()``."""

    def forget(protocol: Any) -> None:
        """``protocol`` lost its connection: never hand it out again."""


#: Head shapes whose passing positions are remembered (``end_to_end``):
#: a site's origin sends a few dozen, a process fronting many sites more;
#: past this many the memo starts afresh (an origin inventing shapes costs
#: a scan each, never memory: about 300 bytes an entry).
SHAPES = 1024
_PICKS: dict[tuple[frozenset[bytes], frozenset[bytes], tuple[bytes, ...]], tuple[Any, bool]] = {}


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
    _protocol: ResponseSource

    @property
    def producer(self) -> IPushProducer:
        """Push producer that pauses and resumes the upstream socket."""
        return self._protocol.producer

    def end_to_end(self, drop: frozenset[bytes]) -> list[tuple[bytes, bytes]]:
        """Headers that may be forwarded: without hop-by-hop ones, those named
        in Connection, and ``drop`` (lower-case names).

        Which positions pass depends only on the head's shape (``drop``,
        Connection's names, the names in order), and an origin sends the
        same few shapes on every answer: the positions are worked out once
        per shape (at most ``SHAPES`` remembered) and picked in C."""
        key = (drop, self.connection_names, tuple(self.lnames))
        pick = _PICKS.get(key)
        if pick is None:
            named = self.connection_names
            kept = [i for i, lname in enumerate(self.lnames) if lname not in drop and lname not in named]
            pick = (itemgetter(*kept), len(kept) > 1) if kept else (None, False)
            if len(_PICKS) >= SHAPES:
                _PICKS.clear()
            _PICKS[key] = pick
        getter, several = pick
        if getter is None:
            return []
        return list(getter(self.headers)) if several else [getter(self.headers)]

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

    def deliverBody(self, consumer: IBodyConsumer) -> None:
        """Start delivering the body to ``consumer``."""
        self._protocol.deliverBody(consumer)

    def take_body(self) -> bytes | None:
        """The whole body at once, instead of :meth:`deliverBody`, when it
        is length-delimited and has all arrived, or there is none (then
        ``b""``): the connection is then done with this response, back in
        the pool if reusable.  Else None, and nothing changes."""
        return self._protocol.take_body()

    def abort(self) -> None:
        """Drop the upstream connection (the client went away)."""
        self._protocol.abort()

    def tunnel(self, tunnel: Any) -> bytes:
        """A 101: hand the connection to ``tunnel``; returns the bytes that
        followed the head (see ``UpstreamProtocol.start_tunnel``)."""
        return self._protocol.start_tunnel(tunnel)

    def tunnel_side(self) -> Any:
        """The connection, as the tunnel's upstream side."""
        return self._protocol

    def pause_for_work(self) -> None:
        """Stop reading while the consumer works through what it has."""
        self._protocol.pauseBody("work")

    def resume_after_work(self) -> None:
        self._protocol.resumeBody("work")
