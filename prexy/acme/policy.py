"""The decisions of automatic certificates, with no I/O and no clock of their own.

Which names may be issued (:class:`NamePolicy`), when a certificate is
renewed (:class:`Renewal`), how long to wait after a failure
(:class:`Backoff`), and the limits on issuance (:class:`Ledger`, counting
orders per registered domain per hour and orders in flight).  Time comes in
as a number of seconds (``now``) and randomness as a callable returning a
float in [0, 1), so every decision is reproducible in a test.

The registered domain (the name a customer registered, under which a CA
counts its own rate limits) is found with the Public Suffix List when one
is at hand (:func:`registered_domain_function` reads Debian's
``publicsuffix`` package), else approximated by the last two labels.
"""

from __future__ import annotations

import enum
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs

#: Where Debian's ``publicsuffix`` package keeps the list.
PUBLIC_SUFFIX_LIST = Path("/usr/share/publicsuffix/public_suffix_list.dat")

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")


class BadName(ValueError):
    """A name no certificate can be issued for; the message says why."""


def normalize_name(name: str | bytes) -> str:
    """``name`` as a certificate would carry it: lower case, no trailing dot,
    LDH labels of at most 63 characters, at least two labels, at most 253
    characters, not an IP address.  Raises :class:`BadName`."""
    if isinstance(name, bytes):
        try:
            name = name.decode("ascii")
        except UnicodeDecodeError:
            raise BadName(f"{name!r} is not ASCII (use its A-label, xn--, form)") from None
    if not name.isascii():
        raise BadName(f"{name!r} is not ASCII (use its A-label, xn--, form)")
    text = name.lower()
    if text.endswith("."):
        text = text[:-1]
    if not text or len(text) > 253:
        raise BadName(f"{name!r} is empty or longer than 253 characters")
    labels = text.split(".")
    if len(labels) < 2:
        raise BadName(f"{name!r} has a single label")
    for label in labels:
        if not _LABEL.match(label):
            raise BadName(f"{name!r} has a label that is not letters, digits and inner hyphens: {label!r}")
    if labels[-1].isdigit():
        raise BadName(f"{name!r} is an IP address, not a DNS name")
    return text


# -- which names ------------------------------------------------------------


class Verdict(enum.Enum):
    """What to do about a name asked for (at start, or at a handshake)."""

    #: Listed exactly in a site's hosts: issue.
    ISSUE = "issue"
    #: Under one of a site's wildcard hosts: issue only if the ask check
    #: answers yes (see :meth:`NamePolicy.after_ask`).
    ASK = "ask"
    #: Under a wildcard host, but no ask check is configured: never issued.
    NO_ASK = "no-ask"
    #: No site serves the name: never issued, never looked up in storage.
    UNSERVED = "unserved"
    #: Not a name a certificate can carry.
    BAD_NAME = "bad-name"
    #: The ask check answered no.
    DENIED = "denied"


@attrs.frozen
class NameDecision:
    """The verdict on one name: ``name`` normalised (as asked when it is
    not a valid name), ``site`` the site that serves it and ``host`` the
    entry of its hosts that matched (None when no site does)."""

    verdict: Verdict
    name: str
    site: str | None = None
    host: str | None = None

    @property
    def may_issue(self) -> bool:
        """True when an order may be placed now, with no question left."""
        return self.verdict is Verdict.ISSUE

    @property
    def served(self) -> bool:
        """True when some site serves the name (storage may be consulted)."""
        return self.site is not None and self.verdict is not Verdict.DENIED


@attrs.frozen
class NamePolicy:
    """The names certificates may be issued for, from the sites' hosts.

    ``sites`` maps a site's name to its hosts: exact names, and wildcards
    ``*.example.com`` that match every name ending in ``.example.com`` (at
    any depth, as nginx's ``server_name`` does; not ``example.com``
    itself).  An exact host wins over a wildcard; among wildcards, the
    longest.  ``ask`` says whether an ask check is configured; without one,
    only exact names are issued."""

    exact: Mapping[str, str]
    wildcards: tuple[tuple[str, str, str], ...]
    ask: bool

    @classmethod
    def of(cls, sites: Mapping[str, Iterable[str]], *, ask: bool) -> NamePolicy:
        """Build from site name -> hosts.  Raises :class:`BadName` for a host
        that is neither a valid name nor ``*.`` and a valid name."""
        exact: dict[str, str] = {}
        wildcards: list[tuple[str, str, str]] = []
        for site, hosts in sites.items():
            for host in hosts:
                if host.startswith("*."):
                    base = normalize_name(host[2:])
                    wildcards.append(("." + base, site, "*." + base))
                else:
                    exact.setdefault(normalize_name(host), site)
        wildcards.sort(key=lambda w: -len(w[0]))
        return cls(exact=exact, wildcards=tuple(wildcards), ask=ask)

    def listed(self) -> tuple[str, ...]:
        """The names to issue without being asked (at start and reload),
        sorted."""
        return tuple(sorted(self.exact))

    def decide(self, name: str | bytes) -> NameDecision:
        """The verdict on ``name`` (an SNI name, or one from the config)."""
        try:
            text = normalize_name(name)
        except BadName:
            shown = name.decode("latin-1") if isinstance(name, bytes) else name
            return NameDecision(Verdict.BAD_NAME, shown)
        site = self.exact.get(text)
        if site is not None:
            return NameDecision(Verdict.ISSUE, text, site, text)
        for suffix, site, host in self.wildcards:
            if text.endswith(suffix):
                return NameDecision(Verdict.ASK if self.ask else Verdict.NO_ASK, text, site, host)
        return NameDecision(Verdict.UNSERVED, text)

    @staticmethod
    def after_ask(decision: NameDecision, allowed: bool) -> NameDecision:
        """The verdict once the ask check has answered for a name that
        needed it (``allowed``: it answered 200)."""
        if decision.verdict is not Verdict.ASK:
            raise ValueError(f"{decision.name} needed no ask check ({decision.verdict.value})")
        return attrs.evolve(decision, verdict=Verdict.ISSUE if allowed else Verdict.DENIED)


# -- when to renew, when to retry -------------------------------------------


@attrs.frozen
class Renewal:
    """Renew at ``fraction`` of a certificate's lifetime, moved by up to
    ``jitter`` of the lifetime either way so that certificates issued
    together are not renewed together."""

    fraction: float = attrs.field(default=2 / 3)
    jitter: float = attrs.field(default=1 / 30)

    @fraction.validator
    def _check_fraction(self, attribute: object, value: float) -> None:
        if not 0 < value < 1:
            raise ValueError(f"fraction must be between 0 and 1, not {value}")

    @jitter.validator
    def _check_jitter(self, attribute: object, value: float) -> None:
        if not 0 <= value < min(self.fraction, 1 - self.fraction):
            raise ValueError(f"jitter must be at least 0 and less than the fraction's distance to 0 and 1, not {value}")

    def due(self, not_before: float, not_after: float, rand: Callable[[], float]) -> float:
        """When to renew a certificate valid from ``not_before`` to
        ``not_after`` (seconds); ``rand()`` is in [0, 1)."""
        lifetime = max(0.0, not_after - not_before)
        offset = (2 * rand() - 1) * self.jitter
        return not_before + lifetime * (self.fraction + offset)


@attrs.frozen
class Backoff:
    """The wait before retry number ``failures`` (1 after the first
    failure): ``first`` doubled (``factor``) each time up to ``most``, then
    drawn between half of that and all of it."""

    first: float = 60.0
    factor: float = 2.0
    most: float = 6 * 3600.0

    def delay(self, failures: int, rand: Callable[[], float]) -> float:
        if failures < 1:
            raise ValueError(f"failures counts from 1, not {failures}")
        # Capped in the exponent too, so a long run of failures cannot overflow.
        steps = min(failures - 1, 64)
        base = min(self.most, self.first * self.factor**steps)
        return base * (0.5 + 0.5 * rand())


# -- limits ----------------------------------------------------------------


class Refusal(enum.Enum):
    """Why the ledger did not admit an order now."""

    #: An order for this name is in flight: wait for that one.
    IN_FLIGHT = "in-flight"
    #: As many orders as allowed are in flight.
    CONCURRENT = "concurrent"
    #: The registered domain had its orders for this hour.
    DOMAIN_RATE = "domain-rate"


@attrs.frozen
class Limits:
    """At most ``per_domain_per_hour`` orders per registered domain in any
    hour, and ``concurrent`` orders in flight at once."""

    per_domain_per_hour: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    concurrent: int = attrs.field(default=2, validator=attrs.validators.ge(1))


HOUR = 3600.0


class Ledger:
    """The orders placed and in flight, against :class:`Limits`.

    :meth:`admit` answers None and counts the order when it may be placed
    now, else the :class:`Refusal`; :meth:`finished` ends an admitted order,
    whatever its outcome (a failed order still counts against its hour)."""

    def __init__(self, limits: Limits, registered_domain: Callable[[str], str]) -> None:
        self.limits = limits
        self._registered = registered_domain
        self._in_flight: set[str] = set()
        self._placed: dict[str, deque[float]] = {}

    @property
    def in_flight(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    def _window(self, domain: str, now: float) -> deque[float]:
        times = self._placed.get(domain)
        if times is None:
            return deque()
        while times and times[0] <= now - HOUR:
            times.popleft()
        if not times:
            del self._placed[domain]
        return times

    def admit(self, name: str, now: float) -> Refusal | None:
        if name in self._in_flight:
            return Refusal.IN_FLIGHT
        if len(self._in_flight) >= self.limits.concurrent:
            return Refusal.CONCURRENT
        domain = self._registered(name)
        if len(self._window(domain, now)) >= self.limits.per_domain_per_hour:
            return Refusal.DOMAIN_RATE
        self._placed.setdefault(domain, deque()).append(now)
        self._in_flight.add(name)
        return None

    def finished(self, name: str) -> None:
        self._in_flight.discard(name)

    def next_slot(self, name: str, now: float) -> float:
        """The earliest time the registered domain of ``name`` has an order
        left in its hour (``now`` when it has one now)."""
        times = self._window(self._registered(name), now)
        if len(times) < self.limits.per_domain_per_hour:
            return now
        return times[len(times) - self.limits.per_domain_per_hour] + HOUR


# -- registered domains -----------------------------------------------------


def last_two_labels(name: str) -> str:
    """The approximation of a registered domain used without a Public
    Suffix List: ``shop.example.co.uk`` gives ``co.uk``, so every customer
    under such a suffix shares one budget (cautious, never too generous)."""
    return ".".join(name.split(".")[-2:])


@attrs.frozen
class PublicSuffixList:
    """The rules of the Public Suffix List (publicsuffix.org): plain rules,
    wildcard rules (``*.ck``, kept as ``ck``) and exceptions (``!www.ck``)."""

    rules: frozenset[str]
    wildcards: frozenset[str]
    exceptions: frozenset[str]

    @classmethod
    def parse(cls, lines: Iterable[str]) -> PublicSuffixList:
        rules: set[str] = set()
        wildcards: set[str] = set()
        exceptions: set[str] = set()
        for line in lines:
            text = line.strip().split()[0] if line.strip() else ""
            if not text or text.startswith("//"):
                continue
            try:
                rule = text.encode("idna").decode("ascii").lower() if not text.isascii() else text.lower()
            except UnicodeError:
                continue
            if rule.startswith("!"):
                exceptions.add(rule[1:])
            elif rule.startswith("*."):
                wildcards.add(rule[2:])
            else:
                rules.add(rule)
        return cls(frozenset(rules), frozenset(wildcards), frozenset(exceptions))

    def public_suffix(self, name: str) -> str:
        """The public suffix of a normalised name (its last label when no
        rule matches, as the list's default rule ``*`` says)."""
        labels = name.split(".")
        for i in range(len(labels)):
            candidate = ".".join(labels[i:])
            if candidate in self.exceptions:
                return ".".join(labels[i + 1 :])
            if candidate in self.rules or ".".join(labels[i + 1 :]) in self.wildcards:
                return candidate
        return labels[-1]

    def registered_domain(self, name: str) -> str:
        """The public suffix and one label more; the name itself when it is
        a public suffix."""
        suffix = self.public_suffix(name)
        if suffix == name:
            return name
        head = name[: -len(suffix) - 1]
        return head.rsplit(".", 1)[-1] + "." + suffix


def registered_domain_function(path: Path | None = PUBLIC_SUFFIX_LIST) -> Callable[[str], str]:
    """The registered-domain function to count limits by: from the Public
    Suffix List at ``path`` when it can be read, else
    :func:`last_two_labels`."""
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return last_two_labels
        return PublicSuffixList.parse(text.splitlines()).registered_domain
    return last_two_labels
