"""On-demand certificates: a handshake for a new name waits for its certificate.

OpenSSL's server-name callback cannot pause a handshake, and a worker must
not block its reactor, so the waiting happens before TLS sees a byte: the
``ssl:`` listener's TLS protocol sits behind :class:`PeekingProtocol`,
which reads the ClientHello (:mod:`prexy.clienthello`) from the first
bytes and, only for an on-demand candidate (:meth:`OnDemand.candidate`: a
name under a wildcard host of a ``tls = "acme"`` site, not listed exactly,
with no certificate stored), asks for one (:meth:`OnDemand.wait`) and
holds the bytes until the answer, or the bound (``[acme]
on_demand_timeout``), comes; then the TLS protocol gets every byte
unchanged and its server-name callback serves what is stored by then (or
the default certificate).  Anything else (no SNI, an exact host, a site
not on ACME, a name with a certificate, a TLS-ALPN-01 validation, bytes
that are not a ClientHello) goes on as soon as the hello is whole.

The question goes to the issuing process (:attr:`OnDemand.request`: the
control pipe in a worker, the certificate manager in a single process),
once per name however many handshakes wait for it; the answer comes back
through :meth:`OnDemand.answered`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol, connectionDone
from twisted.logger import Logger
from twisted.protocols.tls import TLSMemoryBIOFactory
from twisted.python.failure import Failure

from prexy.acme.policy import BadName, normalize_name
from prexy.clienthello import ClientHelloReader, Hello
from prexy.hostnames import normalise

log = Logger()

#: The ALPN protocol of a TLS-ALPN-01 validation handshake (RFC 8737).
ACME_TLS_ALPN = b"acme-tls/1"

#: How long a worker takes a refusal for a name as final (seconds), and for
#: how many names at most: a bot probing names under a wildcard host costs
#: the issuing process one question per name, not one per handshake.
REFUSED_FOR = 60.0
REFUSED_KEPT = 10_000


class OnDemand:
    """Which handshakes wait for a certificate, and their waits.

    ``certificates`` (:class:`prexy.sni.ServerCertificates`) knows the
    sites and the stored certificates; ``clock`` times the bound of
    ``timeout`` seconds.  :attr:`request` is called with a name to ask the
    issuing process for its certificate (None: on-demand is off).
    ``count`` (``Metrics.count``) counts the handshakes held, by outcome."""

    def __init__(self, clock: IReactorTime, certificates: Any, timeout: float = 10.0,
                 count: Callable[..., None] | None = None) -> None:
        self.clock = clock
        self._count = count
        self.certificates = certificates
        self.timeout = timeout
        self.request: Callable[[str], None] | None = None
        #: The handshakes waiting, by name, and the timer of each name's bound.
        self._waiting: dict[str, tuple[list[defer.Deferred[bool]], IDelayedCall]] = {}
        #: What happened to the names asked for: requested, issued,
        #: refused (or failed) and timed out.
        self.counts = {"requested": 0, "issued": 0, "refused": 0, "timed_out": 0}
        #: Names refused lately, with the time until which they stay so.
        self._refused: dict[str, float] = {}

    def candidate(self, hello: Hello) -> str | None:
        """The name ``hello`` should wait for (normalised), or None."""
        raw = hello.server_name
        if raw is None or self.request is None or ACME_TLS_ALPN in hello.alpn:
            return None
        runtime = self.certificates.runtime
        acme = self.certificates.acme
        if runtime is None or acme is None:
            return None
        text = raw.decode("ascii", "replace")
        site = runtime.serving(text)
        if site is None or not site.config.acme or normalise(text) in runtime.hosts.exact:
            return None
        try:
            name = normalize_name(raw)
        except BadName:
            return None
        if acme.context(name) is not None:
            return None
        until = self._refused.get(name)
        if until is not None:
            if until > self.clock.seconds():
                return None
            del self._refused[name]
        return name

    def wait(self, name: str) -> defer.Deferred[bool]:
        """Fires with True once ``name``'s certificate is stored, False
        when it was refused or the bound passed first; never fails.  One
        request per name, however many wait."""
        d: defer.Deferred[bool] = defer.Deferred()
        waiting = self._waiting.get(name)
        if waiting is not None:
            waiting[0].append(d)
            return d
        timer = self.clock.callLater(self.timeout, self._expired, name)
        self._waiting[name] = ([d], timer)
        self.counts["requested"] += 1
        request = self.request
        try:
            if request is not None:
                request(name)
        except Exception:
            log.failure("on-demand request for {name} failed", name=name)
            self.answered(name, False)
        return d

    def answered(self, name: str, issued: bool) -> None:
        """The issuing process's answer for ``name``: a certificate stored
        (True) or none to come (False)."""
        waiting = self._waiting.pop(name, None)
        if waiting is None:
            return
        waiters, timer = waiting
        if timer.active():
            timer.cancel()
        outcome = "issued" if issued else "refused"
        self.counts[outcome] += 1
        if not issued:
            self._refused.pop(name, None)
            self._refused[name] = self.clock.seconds() + REFUSED_FOR
            if len(self._refused) > REFUSED_KEPT:
                del self._refused[next(iter(self._refused))]
        self._held(outcome, len(waiters))
        for d in waiters:
            d.callback(issued)

    def _expired(self, name: str) -> None:
        waiting = self._waiting.pop(name, None)
        if waiting is None:
            return
        self.counts["timed_out"] += 1
        self._held("timed_out", len(waiting[0]))
        log.info("on-demand certificate for {name}: none within {timeout} s, the default serves",
                 name=name, timeout=self.timeout)
        for d in waiting[0]:
            d.callback(False)

    def _held(self, outcome: str, handshakes: int) -> None:
        if self._count is not None:
            self._count("prexy_tls_on_demand_total", handshakes, outcome=outcome)

    def factory(self, context_factory: Any, wrapped: Any) -> OnDemandTLSFactory:
        """A listener's TLS factory whose connections peek first."""
        return OnDemandTLSFactory(self, context_factory, wrapped)


class OnDemandTLSFactory(TLSMemoryBIOFactory):
    """A server ``TLSMemoryBIOFactory`` whose protocols sit behind a
    :class:`PeekingProtocol` (while on-demand is on)."""

    def __init__(self, on_demand: OnDemand, context_factory: Any, wrapped: Any) -> None:
        super().__init__(context_factory, False, wrapped)
        self.on_demand = on_demand

    def buildProtocol(self, addr: Any) -> Any:
        tls = super().buildProtocol(addr)
        if tls is None or self.on_demand.request is None:
            return tls
        return PeekingProtocol(tls, self.on_demand)


class PeekingProtocol(Protocol):
    """Holds a connection's first bytes until its ClientHello is whole and,
    for an on-demand candidate, until its certificate is stored or the
    bound passes; then ``inner`` (the TLS protocol) gets them all, and
    every byte after goes straight to it."""

    def __init__(self, inner: Any, on_demand: OnDemand) -> None:
        self.inner = inner
        self.on_demand = on_demand
        self._reader: ClientHelloReader | None = ClientHelloReader()
        self._held: list[bytes] | None = []
        self._paused = False
        #: The name this connection waits for (None: it does not).
        self.waiting_for: str | None = None

    def makeConnection(self, transport: Any) -> None:
        self.transport = transport
        self.connected = True
        self.inner.makeConnection(transport)

    def dataReceived(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self.inner.dataReceived(data)
            return
        held.append(data)
        reader = self._reader
        if reader is None:  # waiting (the transport is paused; a last read may come)
            return
        outcome = reader.feed(data)
        if outcome is None:
            return
        self._reader = None
        name = self.on_demand.candidate(outcome) if isinstance(outcome, Hello) else None
        if name is None:
            self._release()
            return
        self.waiting_for = name
        transport: Any = self.transport
        transport.pauseProducing()
        self._paused = True
        self.on_demand.wait(name).addCallback(lambda _: self._release())

    def _release(self) -> None:
        held = self._held
        if held is None or not self.connected:
            return
        self._held = None
        if self._paused:
            self._paused = False
            transport: Any = self.transport
            transport.resumeProducing()
        self.inner.dataReceived(b"".join(held))

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.connected = False
        self._held = None
        self.inner.connectionLost(reason)
