"""The certificates of the ACME sites: found, obtained and renewed.

:class:`CertificateManager` is what a listener's SNI selection asks:
:meth:`~CertificateManager.current` answers at once (memory, else the one
stored file of the name, never for a name no site serves), and
:meth:`~CertificateManager.obtain` gets a certificate for a name that has
none, after the ask check when the name is only under a wildcard host,
waiting at most a bound (the handshake then goes on with the default
certificate while the order continues).  It renews each certificate it
knows at two thirds of its lifetime with jitter, retries failures with
backoff, and says for /health and /metrics what it holds and what fails.

Each name it knows is in one :class:`Phase`: ``HELD`` (a certificate,
renewal timer set), ``ISSUING`` (an order in flight), ``RETRYING`` (the
last order failed, a retry timer set; any certificate held keeps
serving).  The moves are in :data:`MOVES`.
"""

from __future__ import annotations

import enum
import random
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Protocol
from urllib.parse import quote

import attrs
from twisted.internet import defer, protocol, task
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from prexy.acme.issuer import AcmeError, LimitReached
from prexy.acme.policy import Backoff, NameDecision, NamePolicy, Renewal, Verdict
from prexy.acme.storage import Storage, StorageError, StoredCertificate

_RENEWAL = Renewal()
_BACKOFF = Backoff()


class Issues(Protocol):
    """What the manager needs of :class:`prexy.acme.issuer.Issuer`."""

    def issue(self, name: str) -> defer.Deferred[StoredCertificate]: ...


class Phase(enum.Enum):
    HELD = "held"
    ISSUING = "issuing"
    RETRYING = "retrying"


class Event(enum.Enum):
    ORDER = "order"
    ISSUED = "issued"
    FAILED = "failed"


#: (phase, event) -> phase; None stands for a name not yet known.
MOVES: dict[tuple[Phase | None, Event], Phase] = {
    (None, Event.ORDER): Phase.ISSUING,
    (Phase.HELD, Event.ORDER): Phase.ISSUING,
    (Phase.RETRYING, Event.ORDER): Phase.ISSUING,
    (Phase.ISSUING, Event.ISSUED): Phase.HELD,
    (Phase.ISSUING, Event.FAILED): Phase.RETRYING,
}


class InvalidMove(Exception):
    pass


@attrs.define
class _Name:
    """What the manager knows of one name."""

    phase: Phase | None = None
    certificate: StoredCertificate | None = None
    timer: IDelayedCall | None = None
    failures: int = 0
    last_error: str | None = None
    #: Who waits for the order in flight.
    waiters: list[defer.Deferred[StoredCertificate]] = attrs.Factory(list)

    def move(self, event: Event) -> None:
        new = MOVES.get((self.phase, event))
        if new is None:
            raise InvalidMove(f"{event.value} in phase {self.phase.value if self.phase else 'unknown'}")
        self.phase = new

    def cancel_timer(self) -> None:
        if self.timer is not None and self.timer.active():
            self.timer.cancel()
        self.timer = None


class CertificateManager:
    """The certificates for the names ``policy`` allows, kept in
    ``storage``, ordered through ``issuer``; time and timers from
    ``clock``, randomness from ``rand``.

    ``ask`` (a name -> Deferred of bool) is the ask check for names under
    a wildcard host; its answer is remembered for ``ask_ttl`` seconds, so a
    bot probing names costs one question per name per period.  ``cached``
    bounds the certificates kept in memory (the most recently used).  With
    ``cooperator``, :meth:`start` reads the listed names' certificates a
    few at a time between the reactor's other work (10,000 take about 2 s
    of CPU), else all at once."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        policy: NamePolicy,
        storage: Storage,
        issuer: Issues,
        *,
        ask: Callable[[str], defer.Deferred[bool]] | None = None,
        renewal: Renewal = _RENEWAL,
        backoff: Backoff = _BACKOFF,
        rand: Callable[[], float] = random.random,
        wait: float = 10.0,
        ask_ttl: float = 600.0,
        cached: int = 1000,
        cooperator: task.Cooperator | None = None,
    ) -> None:
        self.clock = clock
        self.policy = policy
        self.storage = storage
        self.issuer = issuer
        self.ask = ask
        self.renewal = renewal
        self.backoff = backoff
        self.rand = rand
        self.wait = wait
        self.ask_ttl = ask_ttl
        self._cached = cached
        self.cooperator = cooperator
        self._names: OrderedDict[str, _Name] = OrderedDict()
        self._asked: dict[str, tuple[bool, float]] = {}
        #: Who waits for the ask check's answer, by name.
        self._asking: dict[str, list[defer.Deferred[bool]]] = {}
        self._stopped = False
        self._watchers: list[Callable[[str, StoredCertificate], None]] = []

    def watch(self, callback: Callable[[str, StoredCertificate], None]) -> None:
        """Call ``callback(name, certificate)`` whenever a certificate is
        issued (first time or renewal): a listener drops what it built
        from the old one."""
        self._watchers.append(callback)

    # -- the SNI side

    def decide(self, name: str | bytes) -> NameDecision:
        return self.policy.decide(name)

    def current(self, name: str | bytes) -> StoredCertificate | None:
        """The certificate to serve for ``name`` now, None when there is
        none (or no site serves the name: then storage is not consulted)."""
        decision = self.policy.decide(name)
        if not decision.served or self._denied(decision):
            return None
        entry = self._names.get(decision.name)
        if entry is not None and entry.certificate is not None:
            self._names.move_to_end(decision.name)
            return entry.certificate
        stored = self._load(decision.name)
        if stored is not None:
            self._hold(decision.name, stored)
        return stored

    def obtain(self, name: str | bytes) -> defer.Deferred[StoredCertificate | None]:
        """A certificate for ``name``: the one held, else one ordered now
        (after the ask check where needed), waiting at most ``wait``
        seconds; None when there is none by then or the name may not have
        one.  Never fails."""
        held = self.current(name)
        if held is not None:
            return defer.succeed(held)
        decision = self.policy.decide(name)
        d: defer.Deferred[Any]
        if decision.verdict is Verdict.ISSUE:
            d = self._order(decision.name)
        elif decision.verdict is Verdict.ASK:
            d = self._ask_then_order(decision)
        else:
            return defer.succeed(None)
        waited: defer.Deferred[StoredCertificate | None] = defer.Deferred()

        def done(result: object) -> None:
            if timer.active():
                timer.cancel()
            if not waited.called:
                waited.callback(result if isinstance(result, StoredCertificate) else None)

        timer = self.clock.callLater(self.wait, done, None)
        d.addBoth(done)
        return waited

    # -- start, reload, stop

    def start(self) -> defer.Deferred[None]:
        """Load or order the certificate of every name listed exactly; fires
        when each is held or has failed (failures are logged, not raised)."""
        waits: list[defer.Deferred[StoredCertificate]] = []

        def steps() -> Iterator[None]:
            for name in self.policy.listed():
                if self._stopped:
                    return
                if self.current(name) is None:
                    waits.append(self._order(name))
                yield None

        if self.cooperator is None:
            for _ in steps():
                pass
            loaded: defer.Deferred[Any] = defer.succeed(None)
        else:
            loaded = self.cooperator.coiterate(steps())
        return loaded.addCallback(lambda _: defer.DeferredList(waits, consumeErrors=True)).addCallback(lambda _: None)

    def update(self, policy: NamePolicy) -> defer.Deferred[None]:
        """A reload: forget the names no site serves any more, start on the
        new ones."""
        self.policy = policy
        for name in list(self._names):
            if not policy.decide(name).served:
                self._names.pop(name).cancel_timer()
        return self.start()

    def stop(self) -> None:
        self._stopped = True
        for entry in self._names.values():
            entry.cancel_timer()

    # -- health and metrics

    def health(self) -> dict[str, Any]:
        """Per site: the days to its earliest expiry among the certificates
        held; the names failing with their last error; the issuer's
        counters (when it has them)."""
        now = self.clock.seconds()
        sites: dict[str, float] = {}
        failing: dict[str, str] = {}
        for name, entry in self._names.items():
            if entry.certificate is not None:
                site = self.policy.decide(name).site
                if site is not None:
                    days = (entry.certificate.not_after - now) / 86400
                    sites[site] = min(days, sites.get(site, days))
            if entry.last_error is not None:
                failing[name] = entry.last_error
        out: dict[str, Any] = {"earliest_expiry_days": sites, "failing": failing}
        stats = getattr(self.issuer, "stats", None)
        if stats is not None:
            out["issuer"] = attrs.asdict(stats)
        return out

    def phase(self, name: str) -> Phase | None:
        entry = self._names.get(name)
        return entry.phase if entry is not None else None

    # -- inside

    def _entry(self, name: str) -> _Name:
        entry = self._names.get(name)
        if entry is None:
            entry = self._names[name] = _Name()
            self._trim()
        return entry

    def _trim(self) -> None:
        """Forget the least recently used certificates past the bound,
        never one with an order or a timer pending (its file stays)."""
        excess = len(self._names) - self._cached
        for name in list(self._names):
            if excess <= 0:
                break
            entry = self._names[name]
            if entry.phase is Phase.HELD and self.policy.decide(name).verdict is not Verdict.ISSUE:
                entry.cancel_timer()
                del self._names[name]
                excess -= 1

    def _denied(self, decision: NameDecision) -> bool:
        """True for a name under a wildcard that the ask check refused
        lately: not even storage is consulted for it."""
        if decision.verdict is not Verdict.ASK:
            return False
        remembered = self._asked.get(decision.name)
        return remembered is not None and not remembered[0] and remembered[1] > self.clock.seconds()

    def _load(self, name: str) -> StoredCertificate | None:
        try:
            return self.storage.load(name)
        except StorageError as e:
            self.log.error("ACME storage: {reason}", reason=str(e))
            return None

    def _hold(self, name: str, stored: StoredCertificate) -> None:
        entry = self._entry(name)
        entry.certificate = stored
        if entry.phase is None:
            entry.phase = Phase.HELD
        if entry.phase is Phase.HELD:
            self._schedule_renewal(name, entry)

    def _schedule_renewal(self, name: str, entry: _Name) -> None:
        assert entry.certificate is not None
        entry.cancel_timer()
        due = self.renewal.due(entry.certificate.not_before, entry.certificate.not_after, self.rand)
        delay = max(0.0, due - self.clock.seconds())
        entry.timer = self.clock.callLater(delay, self._renew, name)

    def _renew(self, name: str) -> None:
        entry = self._names.get(name)
        if entry is None or self._stopped:
            return
        entry.timer = None
        self._order(name).addErrback(lambda _: None)

    def _order(self, name: str) -> defer.Deferred[StoredCertificate]:
        """The outcome of an order for ``name``: the one in flight, else a
        new one."""
        entry = self._entry(name)
        mine: defer.Deferred[StoredCertificate] = defer.Deferred()
        entry.waiters.append(mine)
        if entry.phase is Phase.ISSUING:
            return mine
        entry.cancel_timer()
        entry.move(Event.ORDER)
        order = self.issuer.issue(name)
        order.addCallbacks(self._issued, self._failed, callbackArgs=(name,), errbackArgs=(name,))
        order.addErrback(lambda f: self.log.failure("ACME: handling the order for {name} broke", f, name=name))
        return mine

    def _tell(self, entry: _Name, outcome: StoredCertificate | Failure) -> None:
        waiters, entry.waiters = entry.waiters, []
        for d in waiters:
            if isinstance(outcome, Failure):
                d.errback(outcome)
            else:
                d.callback(outcome)

    def _issued(self, stored: StoredCertificate, name: str) -> None:
        entry = self._entry(name)
        entry.move(Event.ISSUED)
        entry.failures = 0
        entry.last_error = None
        entry.certificate = stored
        if not self._stopped:
            self._schedule_renewal(name, entry)
        for watcher in list(self._watchers):
            try:
                watcher(name, stored)
            except Exception:
                self.log.failure("ACME: a watcher of {name} broke", name=name)
        self._tell(entry, stored)

    def _failed(self, failure: Failure, name: str) -> None:
        entry = self._entry(name)
        entry.move(Event.FAILED)
        entry.failures += 1
        error = failure.value
        entry.last_error = str(error) if isinstance(error, AcmeError) else failure.getErrorMessage()
        delay = self.backoff.delay(entry.failures, self.rand)
        if isinstance(error, LimitReached):
            delay = max(delay, error.retry_at - self.clock.seconds())
        if entry.certificate is not None:
            # Never wait past the expiry of what is served now.
            left = entry.certificate.not_after - self.clock.seconds()
            delay = min(delay, max(left / 2, 1.0))
        if not self._stopped:
            entry.cancel_timer()
            entry.timer = self.clock.callLater(delay, self._renew, name)
        self._tell(entry, failure)

    def _ask_then_order(self, decision: NameDecision) -> defer.Deferred[StoredCertificate | None]:
        name = decision.name
        now = self.clock.seconds()
        remembered = self._asked.get(name)
        if remembered is not None and remembered[1] > now:
            return self._after_ask(decision, remembered[0])
        if self.ask is None:
            return defer.succeed(None)
        d = self._ask_once(name)

        def answered(allowed: bool) -> defer.Deferred[StoredCertificate | None]:
            self._asked[name] = (bool(allowed), self.clock.seconds() + self.ask_ttl)
            return self._after_ask(decision, bool(allowed))

        def broke(failure: Failure) -> None:
            self.log.error("ACME ask check for {name} failed: {reason}", name=name, reason=failure.getErrorMessage())
            return None

        return d.addCallbacks(answered, broke)

    def _ask_once(self, name: str) -> defer.Deferred[bool]:
        """The ask check's answer for ``name``: the question in flight, else
        a new one (handshakes in several workers ask once)."""
        mine: defer.Deferred[bool] = defer.Deferred()
        waiting = self._asking.get(name)
        if waiting is not None:
            waiting.append(mine)
            return mine
        self._asking[name] = [mine]

        def settled(result: object) -> None:
            for d in self._asking.pop(name, []):
                if isinstance(result, Failure):
                    d.errback(result)
                else:
                    d.callback(bool(result))

        assert self.ask is not None
        defer.maybeDeferred(self.ask, name).addBoth(settled)
        return mine

    def _after_ask(self, decision: NameDecision, allowed: bool) -> defer.Deferred[StoredCertificate | None]:
        if not NamePolicy.after_ask(decision, allowed).may_issue:
            return defer.succeed(None)
        stored = self.current(decision.name)
        if stored is not None:
            return defer.succeed(stored)
        d: defer.Deferred[StoredCertificate | None] = self._order(decision.name)  # type: ignore[assignment]
        return d


def ask_url(base: str, name: str) -> str:
    """The ask check's URL for ``name`` (``GET base?domain=NAME``)."""
    return f"{base}{'&' if '?' in base else '?'}domain={quote(name, safe='')}"


class AskClient:
    """The ask check over HTTP with a twisted.web ``agent``: 200 means yes,
    anything else no; no answer within ``timeout`` seconds is an error."""

    def __init__(self, agent: Any, url: str, clock: IReactorTime, timeout: float = 5.0) -> None:
        self.agent = agent
        self.url = url
        self.clock = clock
        self.timeout = timeout

    def __call__(self, name: str) -> defer.Deferred[bool]:
        d = self.agent.request(b"GET", ask_url(self.url, name).encode("ascii"))
        d.addTimeout(self.timeout, self.clock)

        def got(response: Any) -> defer.Deferred[bool]:
            # The body says nothing; read it to its end so the connection
            # can serve the next question.
            ended: defer.Deferred[None] = defer.Deferred()
            response.deliverBody(_Discard(ended))
            return ended.addCallback(lambda _: bool(response.code == 200))

        return d.addCallback(got)


class _Discard(protocol.Protocol):
    """Reads a response body to its end, keeping nothing."""

    def __init__(self, ended: defer.Deferred[None]) -> None:
        self.ended = ended

    def dataReceived(self, data: bytes) -> None:
        pass

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.ended.callback(None)
