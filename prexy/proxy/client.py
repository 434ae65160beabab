"""The client side of an exchange, declared: what the exchange, the cache
layer and the resource may read and call on a client's request
(:class:`IClient`), and what that request asks of the connection, or HTTP/2
stream, it came on (:class:`IClientChannel`; :class:`ITunnelClient` for a
connection a tunnel can take over after a 101); and what the site asks of
each client connection it holds (:class:`IClientConnection`).

Implementations:

- ``prexy.proxy.request.ProxyRequest`` is the :class:`IClient` of every
  client connection, over HTTP/1.x (its channel is
  ``prexy.proxy.site.ProxyChannel``) and HTTP/2 (one
  ``prexy.proxy.h2connection.StreamChannel`` per stream);
- ``prexy.proxy.request.DetachedRequest`` is the client of a fetch with
  nobody to answer: a background refresh, or a miss that goes on for the
  cache and its followers after its own client left.

What a client can be sent is declared, never probed: :class:`Capabilities`
(trailer fields, 1xx heads, a tunnel) comes from the channel once the
request line is in, and the request carries it as three booleans.  A third
protocol (HTTP/3, a leaner HTTP/1.1 connection) is one more
:class:`IClientChannel` under ``ProxyRequest``, or one more :class:`IClient`.

Imports no Twisted at run time: the interfaces are zope's, the value is attrs'.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs
from zope.interface import Attribute, Interface

if TYPE_CHECKING:
    from twisted.web.http_headers import Headers

__all__ = [
    "HTTP2",
    "HTTP11",
    "NONE",
    "Capabilities",
    "IClient",
    "IClientChannel",
    "IClientConnection",
    "ITunnelClient",
]


@attrs.frozen
class Capabilities:
    """What a client's protocol can carry besides a head and a body."""

    #: Trailer fields after the body: an HTTP/1.1 chunked body's trailer
    #: section, an HTTP/2 stream's last HEADERS frame.
    trailers: bool = False
    #: Informational (1xx) heads before the answer's own (103 Early
    #: Hints); never to an HTTP/1.0 client (RFC 9110 15.2).
    interim: bool = False
    #: The connection can be handed to a tunnel after a 101 Switching
    #: Protocols: HTTP/1.1 only (HTTP/2 has no Upgrade).
    tunnel: bool = False


#: An HTTP/1.0 client, and one not yet known (the request line is not in).
NONE = Capabilities()
#: An HTTP/1.1 client.
HTTP11 = Capabilities(trailers=True, interim=True, tunnel=True)
#: An HTTP/2 stream.
HTTP2 = Capabilities(trailers=True, interim=True, tunnel=False)


class IClient(Interface):
    """One client's request and the answer to it, as the exchange
    (``prexy.proxy.forward``, ``prexy.proxy.storing``), the cache layer
    (``prexy.proxy.caching``, ``prexy.proxy.flight``) and the resource use
    it.  The answer's calls are twisted.web's request API (the head through
    ``setResponseCode`` and ``responseHeaders``, then ``write``,
    ``registerProducer``, ``finish``) plus what twisted.web has no API for:
    trailers, 1xx heads, a reset, a head and body in one send."""

    # -- the request ------------------------------------------------------------

    method = Attribute("The request method (bytes).")
    uri = Attribute("The request target as forwarded, in origin-form (bytes).")
    clientproto = Attribute(
        "The protocol as the request says it: b'HTTP/1.0', b'HTTP/1.1', b'HTTP/2'; for the access log "
        "and the upgrade check. What the client can be sent is the capabilities, never this string."
    )
    requestHeaders = Attribute("The request's header fields (twisted.web.http_headers.Headers).")
    content = Attribute("The request body, a file read from its start; None when there is none.")
    has_body = Attribute(
        "bool: the request came with a body: a length above 0, or one not known in advance (HTTP/1.1 "
        "chunked framing, an HTTP/2 stream without content-length that its HEADERS did not end)."
    )

    def getClientAddress() -> object:
        """The client's address (an IAddress; ``host`` for an IP)."""

    def getHost() -> object:
        """The local address the request came in on."""

    def isSecure() -> bool:
        """Whether the request came over TLS."""

    def getHeader(key: bytes) -> bytes | None:
        """The last value of request header ``key``, or None."""

    # -- what the client can be sent --------------------------------------------

    trailers = Attribute("bool: the answer can end with trailer fields (add_trailer). Capabilities.trailers.")
    interim = Attribute("bool: 1xx heads can precede the answer (write_interim). Capabilities.interim.")
    tunnel = Attribute(
        "bool: after a 101, ``channel`` is an ITunnelClient that a tunnel can take over. Capabilities.tunnel."
    )
    detached = Attribute(
        "bool: there is no client to answer (a background refresh, or a fetch whose client left): "
        "everything sent goes nowhere, the fetched body only into the cache."
    )

    # -- where the answer stands ----------------------------------------------------

    startedWriting = Attribute("bool: the answer's head went out; its status can no longer change.")
    finished = Attribute("bool: finish() was called.")
    gone = Attribute("bool: the client went away before its answer was complete.")
    exchange = Attribute(
        "Who is told when the client goes (``client_gone(reason)``): the exchange forwarding the request, "
        "or the flight's follower it is; None when nobody is."
    )
    channel = Attribute(
        "The connection (HTTP/1.x) or stream (HTTP/2) the request came on, an IClientChannel; None for a "
        "detached client and once the connection is lost. Where ``tunnel`` is true, an ITunnelClient too."
    )
    proxy_site = Attribute("The site the request came through (timeouts, access log, served answers).")
    looked = Attribute(
        "The cache's lookup for this request made before it was routed (``prexy.proxy.caching.Looked``: "
        "the HTTP/1.x hit path found no fresh hit), for the cache layer to use instead of looking again; "
        "None when none was made."
    )
    sentLength = Attribute("int: body bytes sent, for the access log (a tunnel sets the bytes it carried).")

    # -- what the request did, for the operator's view (prexy.observe) ----------------

    site_name = Attribute('str: the name of the site the request was routed to ("-" until then).')
    cache_status = Attribute('str: what the cache did ("hit", "miss", "pass"...; "-": no cache).')
    upstream_seconds = Attribute("float: time to the upstream's answer head (connect and first byte); None: none.")
    bytes_in = Attribute("int: upstream body bytes received for the answer.")
    rewrite = Attribute("The transducer that rewrote the answer's body once it ended; None when none ran.")

    # -- the answer ------------------------------------------------------------------

    responseHeaders = Attribute("The answer's header fields so far (Headers), sent with the first write.")

    def setResponseCode(code: int, message: bytes | None = None) -> None:
        """The answer's status (and reason phrase)."""

    def setHeader(name: bytes, value: bytes) -> None:
        """Set one answer header field, replacing any of that name."""

    def reset_head() -> None:
        """Forget the head set so far (status, fields, trailers): another
        answer replaces it before anything was sent."""

    def write_interim(code: int, phrase: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """A 1xx head (``headers``: (name, value) pairs) before the answer's
        own; only where ``interim``, and before ``startedWriting``."""

    def write(data: bytes) -> None:
        """Body bytes (the head goes out with the first write)."""

    def write_whole(body: bytes) -> None:
        """All of the body, right after the head: in one send where the
        connection can (HTTP/1.1), by ``write`` elsewhere."""

    def add_trailer(name: bytes, value: bytes) -> None:
        """A trailer field sent after the body; only where ``trailers``
        (announce it with a ``Trailer`` header)."""

    def registerProducer(producer: object, streaming: bool) -> None:
        """What the client's connection pauses and resumes while the body
        streams (a push producer)."""

    def unregisterProducer() -> None:
        """The body no longer comes from the registered producer."""

    def finish(last: bytes = b"") -> None:
        """End the answer; ``last``: its last body bytes, sent with the end."""

    def abort() -> None:
        """Reset the client's connection, or its HTTP/2 stream: the answer
        cannot be completed (never a clean end of a broken body)."""


class IClientChannel(Interface):
    """What ``ProxyRequest`` calls on the connection, or HTTP/2 stream, it
    came on: the part of a channel twisted.web's request calls, and
    Prexy's additions."""

    site = Attribute("The ProxySite the connection serves.")

    # -- twisted.web's request -> channel calls ----------------------------------------

    def getPeer() -> object:
        """The client's address."""

    def getHost() -> object:
        """The local address."""

    def isSecure() -> bool:
        """Whether the connection is TLS."""

    def writeHeaders(version: bytes, code: bytes, reason: bytes, headers: Headers) -> None:
        """Send the answer's head (``headers``: Headers)."""

    def write(data: bytes) -> None:
        """Send body bytes (HTTP/1.1: framed by the request already)."""

    def writeSequence(iovec: object) -> None:
        """Send a list of byte strings."""

    def registerProducer(producer: object, streaming: bool) -> None:
        """The producer to pause while the client reads slowly."""

    def unregisterProducer() -> None:
        """No producer any more."""

    def requestDone(request: object) -> None:
        """The answer to ``request`` is complete."""

    def loseConnection() -> None:
        """Close cleanly after what is queued (an HTTP/2 stream: end it)."""

    # -- Prexy's ---------------------------------------------------------------------------

    def capabilities(version: bytes) -> Capabilities:
        """What a request of protocol ``version`` on this channel can be
        sent (read once, when its request line is in)."""

    def write_interim(code: int, phrase: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Send a 1xx head, in order with everything else written."""

    def send_trailers(fields: list[tuple[bytes, bytes]]) -> None:
        """Trailer fields for the end of the answer, where the channel
        itself frames that end (an HTTP/2 stream); HTTP/1.1's chunked
        trailer section is written by the request."""

    def hold_writes() -> None:
        """Keep what is written until ``release_writes`` (a head and its
        body in one send); a no-op where writes batch anyway.  The exchange
        holds while it carries out an upstream head, so the head, the body
        bytes that came with it and the end of a short answer leave in one
        send instead of two or three.  A send saved is 6-9 µs of CPU on
        loopback (a bare Twisted protocol on httptools under wrk: 14-15 µs
        per answer sent in one send, 21-24 µs in two)."""

    def release_writes() -> None:
        """Send what was held (at the outermost release: holds nest)."""

    def flush_writes() -> None:
        """Send what is held now, and go on holding (a head that must reach
        the client before a long step)."""

    def abortConnection() -> None:
        """Reset: the connection (HTTP/1.x), or the stream (HTTP/2
        RST_STREAM); the request hears of it as a lost connection."""

    def body_too_large(request: object) -> None:
        """``request``'s body is over the site's limit: answer 413 and
        read no more of it (the request has not been processed)."""


class ITunnelClient(Interface):
    """A client connection a tunnel (``prexy.proxy.tunnel.Tunnel``) takes
    over after a 101: every later byte read goes to the tunnel."""

    transport = Attribute("The connection's transport (paused, resumed and closed by the tunnel).")

    def write(data: bytes) -> None:
        """Bytes from the upstream, for the client."""

    def start_tunnel(tunnel: object, head: bytes) -> bytes:
        """Send the 101 ``head`` and hand every later byte read to
        ``tunnel``; returns what the client sent after its request."""


class IClientConnection(Interface):
    """A client connection as its site (``ProxySite``) holds it: the
    HTTP/1.x ``ProxyChannel``, the HTTP/2 ``H2ServerProtocol``."""

    transport = Attribute("The connection's transport; None before it is made.")
    served = Attribute(
        "Whether it has answered a request (an HTTP/2 connection counts as served from the start: "
        "it has no first request to wait for when draining)."
    )

    def drain(fresh: bool) -> None:
        """Graceful stop: what is in flight finishes, then the connection
        closes; ``fresh``: accepted moments ago and nothing served yet, so
        its first request may still be on the way."""
