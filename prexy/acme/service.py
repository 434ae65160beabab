"""Automatic certificates as one twistd service: the seam for the config.

:class:`AcmeService` builds the parts from their settings (storage
directory, CA settings, the ACME sites' hosts, the ask URL, the limits) and
runs them between ``startService`` and ``stopService``: a thread pool for
the blocking ACME client, the issuer, and the certificate manager, which
loads or orders the listed names at start and renews in the background.
Listeners reach it through :attr:`AcmeService.manager` (``current`` and
``obtain`` by SNI name, ``watch`` for renewals) and
:attr:`AcmeService.registry` (the challenge answers).

The challenge answers are written under the storage directory
(``challenges/``) as well as kept in memory, so that a process that does
not issue (another worker of the machine) answers the CA's validation
requests that reach it through the shared port.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorFromThreads, IReactorTCP, IReactorTime
from twisted.logger import Logger
from twisted.python.threadpool import ThreadPool

from prexy.acme.challenges import ChallengeRegistry
from prexy.acme.issuer import BlockingIssuer, Issuer, IssuerSettings
from prexy.acme.manager import AskClient, CertificateManager
from prexy.acme.policy import (
    Backoff,
    Ledger,
    Limits,
    NamePolicy,
    Renewal,
    Verdict,
    registered_domain_function,
)
from prexy.acme.storage import Storage


class AcmeService(Service):
    """Certificates for ``sites`` (site name -> hosts) from the CA of
    ``settings``, stored in ``storage``; ``ask_url`` (optional) is the ask
    check for names under wildcard hosts; ``wait`` bounds a handshake's
    wait for a new certificate.  ``reactor`` gives time, threads and the
    ask check's connections."""

    log = Logger()

    def __init__(
        self,
        reactor: Any,
        settings: IssuerSettings,
        storage: Path | str,
        sites: Mapping[str, Iterable[str]],
        *,
        ask_url: str | None = None,
        limits: Limits = Limits(),  # noqa: B008 - frozen value
        renewal: Renewal = Renewal(),  # noqa: B008 - frozen value
        backoff: Backoff = Backoff(),  # noqa: B008 - frozen value
        wait: float = 10.0,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.reactor = reactor
        self.storage = Storage(storage)
        self.registry = ChallengeRegistry(self.storage.root / "challenges")
        self.pool = ThreadPool(minthreads=0, maxthreads=limits.concurrent, name="prexy-acme")
        self.blocking = BlockingIssuer(settings, self.storage, self.registry)
        clock: IReactorTime = reactor
        threads: IReactorFromThreads = reactor
        self.issuer = Issuer(threads, self.pool, self.blocking, Ledger(limits, registered_domain_function()), clock.seconds)
        ask = None
        if ask_url is not None:
            from twisted.web.client import Agent

            tcp: IReactorTCP = reactor
            ask = AskClient(Agent(tcp), ask_url, clock)
        self.manager = CertificateManager(
            clock,
            NamePolicy.of(sites, ask=ask is not None),
            self.storage,
            self.issuer,
            ask=ask,
            renewal=renewal,
            backoff=backoff,
            rand=rand,
            wait=wait,
            cooperator=task.Cooperator(scheduler=lambda step: clock.callLater(0, step)),
        )

    def startService(self) -> None:
        super().startService()
        self.pool.start()
        self.manager.start()

    def stopService(self) -> None:
        super().stopService()
        self.manager.stop()
        self.pool.stop()

    def share_through(self, cluster: Any, serving: defer.Deferred[Any] | None = None) -> None:
        """Coordinate orders with the other nodes of ``cluster``
        (:class:`prexy.cluster.node.ClusterService`) and share the
        challenge answers with them: see prexy.acme.fleet.  ``serving``
        fires once this node answers requests (a master's first workers
        are ready); by default once ``cluster`` is ready."""
        serving = cluster.ready if serving is None else serving
        from twisted.internet.threads import deferToThreadPool

        from prexy.acme.fleet import FleetIssuer, SharedChallenges, challenge_listener

        self.manager.issuer = FleetIssuer(
            self.reactor, self.issuer, self.storage, cluster.settings.key, lambda: cluster.writer,
            ready=serving, renewal=self.manager.renewal,
            save=lambda name, key, chain: deferToThreadPool(self.reactor, self.pool, self.storage.save, name, key, chain),
        )
        settings = cluster.settings
        link = lambda: cluster.writer  # noqa: E731
        shared: Any = SharedChallenges(self.reactor, self.registry, settings.key, settings.channel, settings.node, link)
        self.blocking.registry = shared
        listener = challenge_listener(self.reactor, self.registry, settings.key, settings.node, link, serving)
        cluster.listeners.append(listener)
        # The answers published before this node subscribed, before its
        # workers start (see prexy.acme.fleet).
        cluster.on_live.append(listener.load)

    def update(self, sites: Mapping[str, Iterable[str]]) -> None:
        """A reload: the ACME sites' hosts now."""
        self.manager.update(NamePolicy.of(sites, ask=self.manager.ask is not None))

    def on_demand(self, name: str) -> defer.Deferred[bool]:
        """A handshake's request for ``name``'s certificate: True once one
        is stored, False when there is none to serve (no site's wildcard
        host matches the name, the ask check said no or failed, a limit,
        a failed order, or the wait's bound passed first).  A name no
        wildcard host matches is refused before anything else: no storage
        look-up, no ask, no order."""
        decision = self.manager.decide(name)
        if decision.verdict is not Verdict.ASK:
            return defer.succeed(False)
        return self.manager.obtain(decision.name).addCallback(lambda stored: stored is not None)

    def metric_lines(self) -> list[str]:
        """Prometheus text lines: the issuer's counters and, per site, the
        days to the earliest expiry among its certificates."""
        return metric_lines(self.manager.health())

    def health_lines(self) -> list[str]:
        """One line per name whose last order failed (empty: all well)."""
        return health_lines(self.manager.health())


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_lines(health: Mapping[str, Any]) -> list[str]:
    """:meth:`CertificateManager.health` as Prometheus text lines."""
    issuer = health.get("issuer") or {}
    lines = [
        "# HELP prexy_acme_orders_total ACME orders placed.",
        "# TYPE prexy_acme_orders_total counter",
        f"prexy_acme_orders_total {issuer.get('placed', 0)}",
        "# HELP prexy_acme_issued_total Certificates issued (first issue and renewals).",
        "# TYPE prexy_acme_issued_total counter",
        f"prexy_acme_issued_total {issuer.get('issued', 0)}",
        "# HELP prexy_acme_failures_total ACME orders that failed, by kind"
        " (unreachable, refused, validation, error).",
        "# TYPE prexy_acme_failures_total counter",
    ]
    lines += [f'prexy_acme_failures_total{{kind="{_label(k)}"}} {v}' for k, v in sorted(issuer.get("failed", {}).items())]
    lines += [
        "# HELP prexy_acme_limited_total ACME orders not placed because a limit said no, by limit.",
        "# TYPE prexy_acme_limited_total counter",
    ]
    lines += [f'prexy_acme_limited_total{{limit="{_label(k)}"}} {v}' for k, v in sorted(issuer.get("limited", {}).items())]
    lines += [
        "# HELP prexy_acme_expiry_days Days to the earliest expiry among a site's ACME certificates.",
        "# TYPE prexy_acme_expiry_days gauge",
    ]
    lines += [
        f'prexy_acme_expiry_days{{site="{_label(site)}"}} {days:.3f}'
        for site, days in sorted(health.get("earliest_expiry_days", {}).items())
    ]
    lines += ["# HELP prexy_acme_failing Names whose last ACME order failed.", "# TYPE prexy_acme_failing gauge",
              f"prexy_acme_failing {len(health.get('failing', {}))}"]
    return lines


def health_lines(health: Mapping[str, Any]) -> list[str]:
    """One ``acme: NAME failing: REASON`` line per failing name."""
    return [f"acme: {name} failing: {reason}" for name, reason in sorted(health.get("failing", {}).items())]


def acme_service(reactor: Any, acme: Any, sites: Mapping[str, Iterable[str]]) -> AcmeService:
    """The service of an ``[acme]`` table (:class:`prexy.config.AcmeConfig`)
    for these sites' hosts."""
    from prexy.acme.policy import Limits

    settings = IssuerSettings(acme.directory, email=acme.email, ca_bundle=acme.ca_bundle, challenges=acme.challenges)
    limits = Limits(per_domain_per_hour=acme.per_domain_per_hour, concurrent=acme.concurrent)
    return AcmeService(reactor, settings, acme.storage, sites, limits=limits, ask_url=acme.ask,
                       wait=acme.on_demand_timeout)


def stored_line(name: str, stored: Any, notify: Callable[[str], None]) -> None:
    """The issuing process's log line, and systemd status (``notify``:
    ``prexy.workers.sd_notify``), for a certificate stored: what an
    operator, and a test, waits for."""
    days = (stored.not_after - time.time()) / 86400
    AcmeService.log.info("ACME: certificate for {name} stored, valid {days:.1f} more day(s)", name=name, days=days)
    notify(f"STATUS=ACME certificate stored: {name}")


def challenge_registry(acme: Any) -> ChallengeRegistry:
    """The answers as a process that does not issue reads them: the files
    the issuing process writes under the storage directory."""
    return ChallengeRegistry(Path(acme.storage) / "challenges")
