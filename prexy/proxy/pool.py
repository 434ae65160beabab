"""The pool of keep-alive upstream connections, and the request entry point.

:class:`UpstreamPool` keeps idle connections (:class:`~prexy.proxy.upstream.
UpstreamProtocol`) per origin, opens new ones through an endpoint (plain TCP,
or TLS that verifies the upstream's certificate), sweeps their timers with
one ``LoopingCall`` instead of a ``DelayedCall`` per request, and retries a
request once when a reused connection turns out to have been closed by the
upstream while it sat idle.  :class:`PendingRequest` is one request until its
response head.  The connections see this pool only as an
:class:`~prexy.proxy.upstream.IConnectionOwner`; the resource sees it as an
:class:`IUpstreamPool`.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 - see below
from collections.abc import Callable, Sequence
from typing import IO, Any

from twisted.internet import defer
from twisted.internet.protocol import Factory
from twisted.python.failure import Failure
from zope.interface import Interface, implementer

from prexy.config import Limits, OriginKey, Timeouts
from prexy.proxy.upstream import (
    IConnectionOwner,
    IPendingRequest,
    UpstreamClosed,
    UpstreamConnectError,
    UpstreamProtocol,
    UpstreamResponse,
    UpstreamTimeout,
)

# HostnameEndpoint encodes the host name with the idna codec, whose module
# (with stringprep) was otherwise imported inside a worker's first request:
# PYTHONPROFILEIMPORTTIME showed it as the only import after start.  It
# takes about 1.5 ms here; importing it with this module moves that to
# start-up.

__all__ = ["EndpointFactory", "IUpstreamPool", "PendingRequest", "UpstreamPool"]

IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"PUT", b"DELETE", b"TRACE"})

#: Makes the client endpoint for an origin, given the connect timeout.
EndpointFactory = Callable[[OriginKey, float], Any]


class IUpstreamPool(Interface):
    """What the proxy resource and the service need of the upstream client."""

    def request(
        key: OriginKey,
        method: bytes,
        target: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: IO[bytes] | None,
        body_length: int,
        on_head: Callable[[UpstreamResponse], None],
        on_error: Callable[[Failure], None],
        on_interim: Callable[[Any], None] | None = None,
    ) -> PendingRequest:
        """Send a request to ``key``: ``on_head`` gets the response head, or
        ``on_error`` the failure (exactly one of them, unless cancelled);
        ``on_interim`` each 1xx head before it (``http1.Interim``)."""

    def stop() -> defer.Deferred[None]:
        """Stop the timers and close idle connections; fires once closed."""

    def close_idle() -> defer.Deferred[None]:
        """Close every idle connection; fires once they are closed."""

    def idle_connections() -> int:
        """How many connections sit idle in the pool."""


class _ProtocolFactory(Factory):
    """Builds the connections to one origin for ``pool``."""

    noisy = False

    def __init__(self, pool: UpstreamPool, key: OriginKey) -> None:
        self._pool = pool
        self._key = key

    def buildProtocol(self, addr: Any) -> UpstreamProtocol:
        return UpstreamProtocol(self._pool, self._key)


@implementer(IPendingRequest)
class PendingRequest:
    """One request on its way to an upstream, until its response head."""

    protocol: UpstreamProtocol | None = None
    connecting: defer.Deferred[UpstreamProtocol] | None = None
    reused = False
    may_retry = False
    cancelled = False

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
        on_interim: Callable[[Any], None] | None = None,
    ) -> None:
        self.pool = pool
        self.on_interim = on_interim
        self.key = key
        self.method = method
        self.target = target
        self.headers = headers
        self.body = body
        self.body_length = body_length
        self.on_head = on_head
        self.on_error = on_error

    def attempt(self, allow_retry: bool) -> None:
        pool = self.pool
        protocol = pool._take_idle(self.key)
        if protocol is not None:
            self.reused = True
            self.may_retry = allow_retry
            self.protocol = protocol
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
            self.protocol = p
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

    def interim(self, response: Any) -> None:
        if not self.cancelled and self.on_interim is not None:
            self.on_interim(response)

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
        elif self.protocol is not None:
            self.protocol.detach(self)


@implementer(IUpstreamPool, IConnectionOwner)
class UpstreamPool:
    """Keep-alive connections per origin, and the request entry point."""

    def __init__(
        self,
        reactor: Any,
        timeouts: Timeouts = Timeouts(),
        max_idle_per_origin: int = 64,
        endpoint_factory: EndpointFactory | None = None,
        limits: Limits = Limits(),
    ) -> None:
        self.reactor = reactor
        self.timeouts = timeouts
        #: Read at each request (``max_response_head``): a reload may swap it.
        self.limits = limits
        self.max_idle_per_origin = max_idle_per_origin
        self._idle: dict[OriginKey, list[UpstreamProtocol]] = {}
        self._endpoint_factory = endpoint_factory or self.default_endpoint
        self.connections_opened = 0
        self._watched: dict[UpstreamProtocol, None] = {}
        self._tls_cache: dict[OriginKey, Any] = {}
        self._sweeper: Any = None
        nonzero = [t for t in (timeouts.first_byte, timeouts.idle) if t > 0]
        self._sweep_interval = min([1.0, *(t / 4 for t in nonzero)])

    def watch(self, protocol: UpstreamProtocol) -> None:
        """See IConnectionOwner.watch."""
        self._watched[protocol] = None
        if self._sweeper is None:
            from twisted.internet.task import LoopingCall

            self._sweeper = LoopingCall(self._sweep)
            self._sweeper.clock = self.reactor
            self._sweeper.start(self._sweep_interval, now=False)

    def unwatch(self, protocol: UpstreamProtocol) -> None:
        """See IConnectionOwner.unwatch."""
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
            if key.ca_pem is not None:
                trust = Certificate.loadPEM(key.ca_pem)
            elif key.ca_file:
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
        on_interim: Callable[[Any], None] | None = None,
    ) -> PendingRequest:
        """Send a request to ``key``: ``on_head`` gets the response head, or
        ``on_error`` the failure (exactly one of them, unless cancelled);
        ``on_interim`` each 1xx head before it.

        Plain callbacks rather than Deferreds: this is the per-request hot
        path. A reused connection that the upstream closed while it sat idle
        is retried once on a fresh connection when the method is idempotent.
        """
        pending = PendingRequest(self, key, method, target, headers, body, body_length, on_head, on_error, on_interim)
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
            if not protocol.idle:
                continue
            if limit and now - protocol.idle_since > limit:
                protocol.transport.loseConnection()
                continue
            return protocol
        return None

    def release(self, protocol: UpstreamProtocol) -> None:
        """See IConnectionOwner.release."""
        idle = self._idle.setdefault(protocol.key, [])
        if len(idle) >= self.max_idle_per_origin:
            protocol.close()
            return
        protocol.idle_since = self.reactor.seconds()
        idle.append(protocol)

    def forget(self, protocol: UpstreamProtocol) -> None:
        """See IConnectionOwner.forget."""
        idle = self._idle.get(protocol.key)
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
