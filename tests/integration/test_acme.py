"""Certificates from a real ACME CA: Debian's ``pebble`` on loopback, its
DNS sending every name to 127.0.0.1, validating for real.

The issuer orders a certificate for a name and answers HTTP-01 from the
challenge resource on a real listener (pebble's HTTP-01 port), or
TLS-ALPN-01 from the ALPN callback on a real TLS listener (its TLS-ALPN-01
port); the stored chain verifies against pebble's root and covers the name.
An unreachable directory is one clear error and one log line however often
asked; a refused order and a failed validation are counted, logged once,
and not retried.  Every wait fires on an event (a log line, a Deferred)
and is bounded.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import pytest_twisted
import requests
from cryptography import x509
from OpenSSL import SSL, crypto
from twisted.internet import defer, reactor, ssl
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.threads import deferToThread
from twisted.logger import globalLogPublisher
from twisted.python.threadpool import ThreadPool
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.resource import Resource
from twisted.web.server import Site

from prexy.acme.challenges import ChallengeRegistry
from prexy.acme.issuer import (
    BlockingIssuer,
    DirectoryUnreachable,
    Issuer,
    IssuerSettings,
    OrderRefused,
    ValidationFailed,
)
from prexy.acme.manager import AskClient, CertificateManager
from prexy.acme.policy import Ledger, Limits, NamePolicy, Renewal, last_two_labels
from prexy.acme.service import AcmeService
from prexy.acme.storage import Storage, StoredCertificate, covers
from prexy.acme.web import ChallengeResource, alpn_selector, servername_callback
from tests.acme.certs import throwaway_rsa

from .conftest import Cleanups
from .pebble import CHALLTESTSRV, PEBBLE, Pebble, bounded, start_pebble
from .twistd_support import free_port, scratch_dir

pytestmark = pytest.mark.skipif(
    PEBBLE is None or CHALLTESTSRV is None, reason="needs pebble and pebble-challtestsrv (Debian: apt-get install pebble)"
)


class Setup:
    """An issuer against ``pebble`` with its storage and challenge
    registry in a scratch directory, on a thread pool stopped at cleanup."""

    def __init__(self, cleanup: Cleanups, directory: str, ca_bundle: str | None, challenges: tuple[str, ...]) -> None:
        root = Path(scratch_dir("prexy-acme-"))
        self.storage = Storage(root / "store")
        self.registry = ChallengeRegistry(root / "challenges")
        self.settings = IssuerSettings(directory=directory, email="ops@shop.test", ca_bundle=ca_bundle, challenges=challenges, timeout=5, deadline=20)
        self.blocking = BlockingIssuer(self.settings, self.storage, self.registry)
        pool = ThreadPool(minthreads=0, maxthreads=2, name="acme-test")
        pool.start()
        cleanup(pool.stop)
        self.issuer = Issuer(reactor, pool, self.blocking, Ledger(Limits(per_domain_per_hour=5, concurrent=2), last_two_labels), time.time)
        self.logged: list[dict[str, Any]] = []

        def observe(event: dict[str, Any]) -> None:
            if event.get("log_namespace", "").startswith("prexy.acme"):
                self.logged.append(event)

        globalLogPublisher.addObserver(observe)
        cleanup(lambda: globalLogPublisher.removeObserver(observe))


def serve_http01(cleanup: Cleanups, registry: ChallengeRegistry, port: int) -> None:
    listening = reactor.listenTCP(port, Site(ChallengeResource(registry)), interface="127.0.0.1")
    cleanup(listening.stopListening)


def default_context() -> SSL.Context:
    """A TLS server context with a throw-away RSA certificate of its own
    (what a listener serves when no challenge is asked for; RSA, so that
    the answer's EC certificate would sit beside it if the callback merely
    added it)."""
    cert_pem, key = throwaway_rsa()
    cert = x509.load_pem_x509_certificate(cert_pem)
    ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
    ctx.use_certificate(cert)
    ctx.use_privatekey(key)
    return ctx


class _Contexts(ssl.ContextFactory):
    def __init__(self, ctx: SSL.Context) -> None:
        self.ctx = ctx

    def getContext(self) -> SSL.Context:
        return self.ctx


def serve_tls_alpn01(cleanup: Cleanups, registry: ChallengeRegistry, port: int) -> None:
    ctx = default_context()
    ctx.set_alpn_select_callback(alpn_selector([b"h2", b"http/1.1"]))
    ctx.set_tlsext_servername_callback(servername_callback(registry))
    listening = reactor.listenSSL(port, Factory.forProtocol(Protocol), _Contexts(ctx), interface="127.0.0.1")
    cleanup(listening.stopListening)


@defer.inlineCallbacks
def check_chain(pebble: Pebble, stored: StoredCertificate, name: str) -> Any:
    """The stored chain verifies up to pebble's root and its leaf covers ``name``."""
    response = yield deferToThread(requests.get, pebble.roots_url, verify=pebble.ca_bundle, timeout=5)
    root = crypto.load_certificate(crypto.FILETYPE_PEM, response.content)
    chain = [crypto.load_certificate(crypto.FILETYPE_PEM, pem) for pem in split_pem(stored.chain_pem)]
    store = crypto.X509Store()
    store.add_cert(root)
    crypto.X509StoreContext(store, chain[0], chain=chain[1:]).verify_certificate()
    assert covers(stored.leaf(), name)
    assert stored.not_before <= time.time() < stored.not_after


def split_pem(data: bytes) -> list[bytes]:
    marker = b"-----BEGIN CERTIFICATE-----"
    return [marker + part for part in data.split(marker)[1:]]


@pytest_twisted.inlineCallbacks
def test_http01(cleanup: Cleanups) -> Any:
    """An order answered over HTTP-01 by the challenge resource is issued,
    stored and chains to pebble's root; the answers are gone afterwards,
    and a second order reuses the stored account."""
    http_port = free_port()
    pebble = yield start_pebble(cleanup, http_port=http_port, tls_port=free_port())
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("http-01",))
    serve_http01(cleanup, setup.registry, http_port)
    stored = yield bounded(setup.issuer.issue("Shop.Prexy.Test"), 30, "issuance")
    assert stored.name == "shop.prexy.test"
    yield check_chain(pebble, stored, "shop.prexy.test")
    assert setup.storage.load("shop.prexy.test") == stored
    assert len(setup.registry) == 0
    assert list((setup.registry.directory / "http-01").iterdir()) == []  # type: ignore[operator]
    assert setup.issuer.stats.placed == 1 and setup.issuer.stats.issued == 1
    assert "Attempting to validate w/ HTTP: http://shop.prexy.test:" in pebble.output()
    account = setup.storage.load_account(pebble.directory)
    assert account is not None and account.uri is not None
    # A new issuer on the same storage loads the account instead of
    # registering a new one.
    again = BlockingIssuer(setup.settings, setup.storage, setup.registry)
    second = yield deferToThread(again.issue, "www.prexy.test")
    assert setup.storage.load_account(pebble.directory) == account
    yield check_chain(pebble, second, "www.prexy.test")


@pytest_twisted.inlineCallbacks
def test_tls_alpn01(cleanup: Cleanups) -> Any:
    """An order answered over TLS-ALPN-01 by the ALPN callback on a real
    TLS listener is issued and chains to pebble's root."""
    tls_port = free_port()
    pebble = yield start_pebble(cleanup, http_port=free_port(), tls_port=tls_port)
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("tls-alpn-01",))
    serve_tls_alpn01(cleanup, setup.registry, tls_port)
    stored = yield bounded(setup.issuer.issue("fr.shop.prexy.test"), 30, "issuance")
    yield check_chain(pebble, stored, "fr.shop.prexy.test")
    assert len(setup.registry) == 0


@pytest_twisted.inlineCallbacks
def test_validation_failed(cleanup: Cleanups) -> Any:
    """Nothing answers HTTP-01: the order fails once with the CA's reason,
    counted and logged once, nothing stored."""
    pebble = yield start_pebble(cleanup, http_port=free_port(), tls_port=free_port())
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("http-01",))
    with pytest.raises(ValidationFailed, match="shop.prexy.test: validation failed: http-01: .*connection"):
        yield bounded(setup.issuer.issue("shop.prexy.test"), 30, "failure")
    assert setup.issuer.stats.failed == {"validation": 1}
    assert setup.storage.load("shop.prexy.test") is None
    assert len(setup.logged) == 1


@pytest_twisted.inlineCallbacks
def test_refused(cleanup: Cleanups) -> Any:
    """A name the CA refuses: one OrderRefused with the CA's problem,
    counted; asking again places one more order and logs nothing more."""
    pebble = yield start_pebble(cleanup, http_port=free_port(), tls_port=free_port(), blocked=("blocked.test",))
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("http-01",))
    for _ in range(2):
        with pytest.raises(OrderRefused, match="x.blocked.test: the CA refused the order: .*rejectedIdentifier"):
            yield bounded(setup.issuer.issue("x.blocked.test"), 30, "refusal")
    assert setup.issuer.stats.failed == {"refused": 2}
    assert setup.issuer.stats.placed == 2
    assert len(setup.logged) == 1
    assert "rejectedIdentifier" in setup.issuer.stats.failing["x.blocked.test"]


@pytest_twisted.inlineCallbacks
def test_unreachable_directory(cleanup: Cleanups) -> Any:
    """No CA listening: DirectoryUnreachable saying so, at once, one log
    line for any number of attempts, no order counted as issued."""
    setup = Setup(cleanup, f"https://127.0.0.1:{free_port()}/dir", None, ("http-01",))
    for _ in range(3):
        with pytest.raises(DirectoryUnreachable, match=r"ACME directory https://127\.0\.0\.1:\d+/dir unreachable: .*refused"):
            yield bounded(setup.issuer.issue("shop.prexy.test"), 10, "failure")
    assert setup.issuer.stats.failed == {"unreachable": 3}
    assert setup.issuer.stats.issued == 0
    assert len(setup.logged) == 1


class AskResource(Resource):
    """The ask endpoint: 200 for the allowed names, 404 else; records the questions."""

    isLeaf = True

    def __init__(self, allowed: set[str]) -> None:
        super().__init__()
        self.allowed = allowed
        self.asked: list[str] = []

    def render_GET(self, request: Any) -> bytes:
        name = request.args.get(b"domain", [b""])[0].decode()
        self.asked.append(name)
        request.setResponseCode(200 if name in self.allowed else 404)
        return b""


def manager_for(setup: Setup, sites: dict[str, list[str]], ask: Any = None, **kwargs: Any) -> CertificateManager:
    return CertificateManager(reactor, NamePolicy.of(sites, ask=ask is not None), setup.storage, setup.issuer, ask=ask, **kwargs)


@pytest_twisted.inlineCallbacks
def test_on_demand_after_ask(cleanup: Cleanups) -> Any:
    """A name under a site's wildcard: the ask endpoint is asked over HTTP;
    a yes gets a certificate from pebble within the bound (timed), a no
    places no order; a name no site serves asks nothing."""
    http_port = free_port()
    pebble = yield start_pebble(cleanup, http_port=http_port, tls_port=free_port())
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("http-01",))
    serve_http01(cleanup, setup.registry, http_port)
    endpoint = AskResource({"new.shop.prexy.test"})
    ask_port = reactor.listenTCP(0, Site(endpoint), interface="127.0.0.1")
    cleanup(ask_port.stopListening)
    pool = HTTPConnectionPool(reactor)
    cleanup(pool.closeCachedConnections)
    ask = AskClient(Agent(reactor, pool=pool), f"http://127.0.0.1:{ask_port.getHost().port}/ask", reactor)
    manager = manager_for(setup, {"shop": ["shop.prexy.test", "*.shop.prexy.test"]}, ask=ask, wait=10)
    cleanup(manager.stop)
    started = time.monotonic()
    stored = yield manager.obtain("new.shop.prexy.test")
    took = time.monotonic() - started
    assert stored is not None, setup.issuer.stats
    yield check_chain(pebble, stored, "new.shop.prexy.test")
    assert took < 5, took
    print(f"on-demand issuance took {took:.2f} s")
    assert (yield manager.obtain("bot.shop.prexy.test")) is None
    assert (yield manager.obtain("other.prexy.test")) is None
    assert endpoint.asked == ["new.shop.prexy.test", "bot.shop.prexy.test"]
    assert setup.issuer.stats.placed == 1
    assert manager.current("new.shop.prexy.test") == stored


@pytest_twisted.inlineCallbacks
def test_renewal(cleanup: Cleanups) -> Any:
    """A certificate of pebble's, 10 s long, is renewed at two thirds of
    its life, in the background; the new one chains and replaces it."""
    http_port = free_port()
    pebble = yield start_pebble(cleanup, http_port=http_port, tls_port=free_port(), validity=10)
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("http-01",))
    serve_http01(cleanup, setup.registry, http_port)
    manager = manager_for(setup, {"shop": ["shop.prexy.test"]}, renewal=Renewal(jitter=0.0))
    cleanup(manager.stop)
    issued: list[defer.Deferred[StoredCertificate]] = [defer.Deferred(), defer.Deferred()]
    manager.watch(lambda name, cert: next(d for d in issued if not d.called).callback(cert))
    yield manager.start()
    first = yield bounded(issued[0], 20, "first issuance")
    assert manager.current("shop.prexy.test") == first
    second = yield bounded(issued[1], 20, "renewal")
    assert second.not_after > first.not_after
    assert time.time() < first.not_after, "renewed only after expiry"
    yield check_chain(pebble, second, "shop.prexy.test")
    assert manager.current("shop.prexy.test") == second
    assert setup.storage.load("shop.prexy.test") == second


@pytest_twisted.inlineCallbacks
def test_ca_forgot_account(cleanup: Cleanups) -> Any:
    """pebble restarted forgets every account: the stored account's URL is
    refused, the key is registered again and the order goes through."""
    http_port = free_port()
    pebble = yield start_pebble(cleanup, http_port=http_port, tls_port=free_port())
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("http-01",))
    serve_http01(cleanup, setup.registry, http_port)
    yield bounded(setup.issuer.issue("shop.prexy.test"), 30, "issuance")
    before = setup.storage.load_account(pebble.directory)
    yield pebble.stop()
    yield pebble.start()
    stored = yield bounded(setup.issuer.issue("www.prexy.test"), 30, "issuance after the restart")
    yield check_chain(pebble, stored, "www.prexy.test")
    after = setup.storage.load_account(pebble.directory)
    assert before is not None and after is not None
    assert after.key_pem == before.key_pem
    # The restarted pebble (its output alone is kept) saw the key registered.
    assert "There are now 1 accounts in memory" in pebble.output()
    assert setup.issuer.stats.failed == {}


@pytest_twisted.inlineCallbacks
def test_service_issues_listed_names_answered_by_another_process(cleanup: Cleanups) -> Any:
    """AcmeService at start orders each listed name; the HTTP-01 answers
    are served by a registry of its own over the same storage directory
    (what another worker of the machine does), so validation does not
    depend on the CA's request reaching the issuing process."""
    http_port = free_port()
    pebble = yield start_pebble(cleanup, http_port=http_port, tls_port=free_port())
    root = Path(scratch_dir("prexy-acme-service-"))
    settings = IssuerSettings(directory=pebble.directory, ca_bundle=pebble.ca_bundle, challenges=("http-01",), timeout=5, deadline=20)
    service = AcmeService(reactor, settings, root, {"shop": ["shop.prexy.test", "www.prexy.test", "*.shop.prexy.test"]})
    other_worker = ChallengeRegistry(root / "challenges")
    serve_http01(cleanup, other_worker, http_port)
    names = {"shop.prexy.test", "www.prexy.test"}
    done: defer.Deferred[None] = defer.Deferred()
    issued: dict[str, StoredCertificate] = {}

    def seen(name: str, cert: StoredCertificate) -> None:
        issued[name] = cert
        if set(issued) == names and not done.called:
            done.callback(None)

    service.manager.watch(seen)
    service.startService()
    cleanup(service.stopService)
    yield bounded(done, 30, "both listed names issued")
    for name in sorted(names):
        yield check_chain(pebble, issued[name], name)
        assert service.manager.current(name) == issued[name]
    assert service.issuer.stats.issued == 2
    assert service.manager.current("new.shop.prexy.test") is None


@pytest_twisted.inlineCallbacks
def test_two_issuers_one_order(cleanup: Cleanups) -> Any:
    """Two issuers over one storage directory (two processes of a machine)
    asked for the same name at once: one order reaches pebble, both get the
    certificate it stored."""
    http_port = free_port()
    pebble = yield start_pebble(cleanup, http_port=http_port, tls_port=free_port())
    setup = Setup(cleanup, pebble.directory, pebble.ca_bundle, ("http-01",))
    serve_http01(cleanup, setup.registry, http_port)
    other = BlockingIssuer(setup.settings, setup.storage, ChallengeRegistry(setup.registry.directory))
    results = yield defer.gatherResults(
        [deferToThread(setup.blocking.issue, "shop.prexy.test"), deferToThread(other.issue, "shop.prexy.test")]
    )
    assert results[0] == results[1]
    assert pebble.output().count("Added order") == 1
    yield check_chain(pebble, results[0], "shop.prexy.test")
