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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from twisted.application.service import Service
from twisted.internet import task
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

    def update(self, sites: Mapping[str, Iterable[str]]) -> None:
        """A reload: the ACME sites' hosts now."""
        self.manager.update(NamePolicy.of(sites, ask=self.manager.ask is not None))
