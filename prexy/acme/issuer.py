"""Ordering certificates from an ACME CA with certbot's ``acme`` library.

:class:`BlockingIssuer` does one issuance from start to end with the
library's ``ClientV2`` (which blocks on ``requests``): load or register the
account, place the order, answer each authorization's challenge through a
:class:`~prexy.acme.challenges.ChallengeRegistry`, poll, finalise, store
the chain and its key.  It never runs on the reactor: :class:`Issuer`, the
Twisted side, runs it on a thread pool, admits orders through the
:class:`~prexy.acme.policy.Ledger`'s limits, joins concurrent requests for
one name into one order, and counts and logs the outcomes (a failure once
per name until that name succeeds again).

Every failure is an :class:`AcmeError` whose message says what failed and
why, in one line: :class:`DirectoryUnreachable` (no CA to talk to: the
stored certificates keep serving, retry later), :class:`OrderRefused` (the
CA answered with a problem document), :class:`ValidationFailed` (the CA
could not validate the challenge) and :class:`LimitReached` (the order was
not placed).  None of them is retried here: retrying, with backoff, is the
caller's decision (:class:`~prexy.acme.policy.Backoff`).
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import josepy as jose
import requests
from acme import client as acme_client
from acme import crypto_util, messages
from acme import errors as acme_errors
from acme.challenges import HTTP01
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from twisted.internet import defer
from twisted.internet.interfaces import IReactorFromThreads
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.python.threadpool import ThreadPool

from prexy.acme.challenges import TLSALPN01, ChallengeRegistry
from prexy.acme.policy import Ledger, Refusal, normalize_name
from prexy.acme.storage import Account, Storage, StorageError, StoredCertificate

#: The challenge types Prexy answers, in its default order of preference:
#: HTTP-01 first, because while a TLS-ALPN-01 answer is registered every
#: handshake for its name gets the answer (see prexy.acme.web).
CHALLENGE_TYPES = ("http-01", "tls-alpn-01")


class AcmeError(Exception):
    """An issuance that did not end in a stored certificate."""

    #: A short word for counters and /health ("unreachable", "refused", ...).
    kind = "error"


class DirectoryUnreachable(AcmeError):
    kind = "unreachable"


class OrderRefused(AcmeError):
    kind = "refused"


class ValidationFailed(AcmeError):
    kind = "validation"


class LimitReached(AcmeError):
    """Not ordered: a limit said no; ``retry_at`` is the earliest time the
    limit allows one more (POSIX seconds; for the concurrency limit, now)."""

    kind = "limit"

    def __init__(self, message: str, refusal: Refusal, retry_at: float) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.retry_at = retry_at


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def new_key_pem() -> bytes:
    """A new EC P-256 private key, PEM (for accounts and certificates)."""
    return _pem_key(ec.generate_private_key(ec.SECP256R1()))


@attrs.frozen
class IssuerSettings:
    """What the issuer needs to know of ``[acme]``.

    ``directory``: the CA's directory URL; ``email``: the account's contact
    (none when None); ``ca_bundle``: a PEM file of CAs to trust for the
    directory's HTTPS (the system's when None); ``challenges``: the types to
    answer, in order of preference; ``timeout``: seconds for one HTTP
    exchange with the CA; ``deadline``: seconds for a whole order."""

    directory: str
    email: str | None = None
    ca_bundle: str | None = None
    challenges: tuple[str, ...] = attrs.field(default=CHALLENGE_TYPES, converter=tuple)
    timeout: float = 30.0
    deadline: float = 90.0
    user_agent: str = "prexy"

    @challenges.validator
    def _check_challenges(self, attribute: object, value: tuple[str, ...]) -> None:
        unknown = [c for c in value if c not in CHALLENGE_TYPES]
        if unknown or not value:
            raise ValueError(f"challenges must be some of {', '.join(CHALLENGE_TYPES)}, not {', '.join(value) or 'none'}")


def _problem(error: messages.Error) -> str:
    return " ".join(str(error).split())


class BlockingIssuer:
    """One CA account and its orders, blocking: call from a thread.

    ``key_pem`` makes private keys (new EC P-256 keys by default).  The
    account is loaded from ``storage`` (registered and stored the first
    time) once, then kept; calls to :meth:`issue` for different names may
    run at once on different threads."""

    def __init__(
        self,
        settings: IssuerSettings,
        storage: Storage,
        registry: ChallengeRegistry,
        key_pem: Callable[[], bytes] = new_key_pem,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.registry = registry
        self._key_pem = key_pem
        self._lock = threading.Lock()
        #: The CA's directory, the account key and URL, once known.
        self._account: tuple[messages.Directory, jose.JWK, str] | None = None
        self._generation = 0
        #: Each thread's own client: requests sessions and the library's
        #: nonce pool are not made to be shared between threads.
        self._local = threading.local()

    def _network(self, jwk: jose.JWK | None) -> acme_client.ClientNetwork:
        # requests takes a CA bundle path where the library's signature says bool.
        verify: Any = self.settings.ca_bundle if self.settings.ca_bundle else True
        return acme_client.ClientNetwork(
            jwk, alg=jose.ES256, verify_ssl=verify, user_agent=self.settings.user_agent, timeout=int(self.settings.timeout)
        )

    def client(self) -> tuple[acme_client.ClientV2, jose.JWK]:
        """This thread's client, its account ready (loaded, or registered
        and stored, on first use by any thread)."""
        with self._lock:
            if self._account is None:
                self._account = self._open()
            directory, jwk, uri = self._account
            generation = self._generation
        mine = getattr(self._local, "client", None)
        if mine is not None and mine[2] == generation:
            return mine[0], jwk
        net = self._network(jwk)
        net.account = messages.RegistrationResource(uri=uri, body=messages.Registration())
        acme = acme_client.ClientV2(directory, net)
        self._local.client = (acme, jwk, generation)
        return acme, jwk

    def _open(self) -> tuple[messages.Directory, jose.JWK, str]:
        url = self.settings.directory
        try:
            account = self.storage.load_account(url)
            if account is None:
                account = Account(directory=url, key_pem=self._key_pem())
                self.storage.save_account(account)
        except (StorageError, OSError) as e:
            raise AcmeError(f"ACME account for {url}: {e}") from None
        key = serialization.load_pem_private_key(account.key_pem, password=None)
        jwk = jose.JWKEC(key=key)
        net = self._network(jwk)
        try:
            directory = acme_client.ClientV2.get_directory(url, net)
        except requests.RequestException as e:
            raise DirectoryUnreachable(f"ACME directory {url} unreachable: {_reason(e)}") from None
        except (messages.Error, acme_errors.Error, ValueError) as e:
            raise DirectoryUnreachable(f"ACME directory {url} gave no directory: {e}") from None
        if account.uri is not None:
            return directory, jwk, account.uri
        registration = messages.NewRegistration.from_data(email=self.settings.email, terms_of_service_agreed=True)
        try:
            uri = acme_client.ClientV2(directory, net).new_account(registration).uri
        except acme_errors.ConflictError as e:
            # The key is registered already: the CA answered its URL.
            uri = str(e)
        except requests.RequestException as e:
            raise DirectoryUnreachable(f"ACME directory {url} unreachable: {_reason(e)}") from None
        except messages.Error as e:
            raise OrderRefused(f"ACME account refused by {url}: {_problem(e)}") from None
        self.storage.save_account(attrs.evolve(account, uri=uri))
        return directory, jwk, uri

    def forget_account(self) -> None:
        """Drop the account's URL (the CA no longer knows it): the next
        order registers the key again."""
        with self._lock:
            self._account = None
            self._generation += 1
            account = self.storage.load_account(self.settings.directory)
            if account is not None:
                self.storage.save_account(attrs.evolve(account, uri=None))

    def issue(self, name: str) -> StoredCertificate:
        """Order, validate, finalise and store a certificate for ``name``.
        Raises :class:`AcmeError`.

        The order is placed under the name's lock in storage: a process of
        the machine that waited for the lock while another ordered the
        same name takes the certificate that one stored instead of
        ordering again."""
        name = normalize_name(name)
        asked = time.time()
        with self.storage.name_lock(name):
            modified = self.storage.modified(name)
            if modified is not None and modified >= asked:
                stored = self.storage.load(name)
                if stored is not None:
                    return stored
            return self._issue_once(name)

    def _issue_once(self, name: str) -> StoredCertificate:
        try:
            return self._issue(name)
        except messages.Error as e:
            if e.code == "accountDoesNotExist":
                self.forget_account()
                try:
                    return self._issue(name)
                except messages.Error as again:
                    e = again
            raise OrderRefused(f"{name}: the CA refused the order: {_problem(e)}") from None

    def _issue(self, name: str) -> StoredCertificate:
        acme, jwk = self.client()
        key_pem = self._key_pem()
        csr_pem = crypto_util.make_csr(key_pem, [name])
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=self.settings.deadline)
        cleanups: list[Callable[[], None]] = []
        try:
            try:
                order = acme.new_order(csr_pem)
                for authz in order.authorizations:
                    if authz.body.status == messages.STATUS_VALID:
                        continue
                    cleanups.append(self._answer(acme, jwk, name, authz))
                order = self._poll_authorizations(acme, order, deadline)
                order = acme.finalize_order(order, deadline)
            except acme_errors.ValidationError as e:
                raise ValidationFailed(f"{name}: validation failed: {_validation_problems(e.failed_authzrs)}") from None
            except acme_errors.IssuanceError as e:
                raise OrderRefused(f"{name}: the CA refused to issue: {_problem(e.error)}") from None
            except acme_errors.TimeoutError:
                raise AcmeError(f"{name}: the order was not done within {self.settings.deadline:g} s") from None
            except requests.RequestException as e:
                raise DirectoryUnreachable(f"{name}: ACME server {self.settings.directory} unreachable: {_reason(e)}") from None
        finally:
            for cleanup in cleanups:
                cleanup()
        return self.storage.save(name, key_pem, order.fullchain_pem.encode("ascii"))

    def _poll_authorizations(
        self, acme: acme_client.ClientV2, order: messages.OrderResource, deadline: datetime.datetime
    ) -> messages.OrderResource:
        """Wait for every authorization to leave "pending", asking again
        after 50 ms, then twice as long each time up to 1 s (the library's
        own loop waits a whole second from the first time: half the
        latency of an on-demand issuance)."""
        done = []
        for authz in order.authorizations:
            pause = 0.05
            while authz.body.status == messages.STATUS_PENDING:
                if datetime.datetime.now() >= deadline:
                    raise acme_errors.TimeoutError()
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
                authz, _ = acme.poll(authz)
            done.append(authz)
        failed = [a for a in done if a.body.status != messages.STATUS_VALID]
        if failed:
            raise acme_errors.ValidationError(failed)
        return order.update(authorizations=done)

    def _answer(
        self, acme: acme_client.ClientV2, jwk: jose.JWK, name: str, authz: messages.AuthorizationResource
    ) -> Callable[[], None]:
        """Answer one authorization with the preferred challenge on offer;
        returns what takes the answer away again."""
        offered = {c.chall.typ: c for c in authz.body.challenges if isinstance(c.chall, (HTTP01, TLSALPN01))}
        for typ in self.settings.challenges:
            challb = offered.get(typ)
            if challb is None:
                continue
            chall = challb.chall
            response = chall.response(jwk)
            if isinstance(chall, TLSALPN01):
                cert_pem, cert_key = chall.validation(jwk, domain=name)
                self.registry.add_tls_alpn01(name, cert_pem, cert_key)
                acme.answer_challenge(challb, response)
                return lambda: self.registry.remove_tls_alpn01(name)
            token = chall.encode("token")
            self.registry.add_http01(token, chall.validation(jwk))
            acme.answer_challenge(challb, response)
            return lambda: self.registry.remove_http01(token)
        kinds = ", ".join(sorted(c.chall.typ for c in authz.body.challenges)) or "none"
        raise OrderRefused(f"{name}: the CA offers no challenge Prexy answers (offered: {kinds})")


def _reason(e: BaseException) -> str:
    """The innermost cause of a requests error, in a few words."""
    seen = e
    while seen.__context__ is not None and seen.__context__ is not seen:
        seen = seen.__context__
    text = str(seen) or type(seen).__name__
    return text.split("] ")[-1] if "] " in text else text


def _validation_problems(authzrs: Sequence[messages.AuthorizationResource]) -> str:
    out = []
    for authzr in authzrs:
        for chall in authzr.body.challenges:
            if chall.error is not None:
                out.append(f"{chall.chall.typ}: {_problem(chall.error)}")
    return "; ".join(out) or "no reason given"


@attrs.define
class IssuerStats:
    """Counters for /metrics and /health: orders placed, certificates
    issued, failures by kind, requests not admitted by the limits."""

    placed: int = 0
    issued: int = 0
    failed: dict[str, int] = attrs.Factory(dict)
    limited: dict[str, int] = attrs.Factory(dict)
    #: The last failure's message per name, until the name succeeds.
    failing: dict[str, str] = attrs.Factory(dict)


class Issuer:
    """The Twisted side of issuance: :meth:`issue` returns a Deferred that
    fires with the stored certificate or fails with :class:`AcmeError`.

    Orders run on ``pool`` (a started :class:`ThreadPool`; its threads
    bound the orders that can be in flight), are admitted by ``ledger``
    (its clock is ``now``), and one order serves every request for a name
    made while it is in flight.  A failure is logged once per name until
    that name succeeds; an unreachable CA once until any order succeeds."""

    log = Logger()

    def __init__(
        self,
        reactor: IReactorFromThreads,
        pool: ThreadPool,
        blocking: BlockingIssuer,
        ledger: Ledger,
        now: Callable[[], float],
    ) -> None:
        self._reactor = reactor
        self._pool = pool
        self.blocking = blocking
        self.ledger = ledger
        self._now = now
        self._waiting: dict[str, list[defer.Deferred[StoredCertificate]]] = {}
        self._unreachable = False
        self.stats = IssuerStats()

    def issue(self, name: str) -> defer.Deferred[StoredCertificate]:
        name = normalize_name(name)
        mine: defer.Deferred[StoredCertificate] = defer.Deferred()
        waiting = self._waiting.get(name)
        if waiting is not None:
            waiting.append(mine)
            return mine
        now = self._now()
        refusal = self.ledger.admit(name, now)
        if refusal is not None:
            self.stats.limited[refusal.value] = self.stats.limited.get(refusal.value, 0) + 1
            retry_at = self.ledger.next_slot(name, now)
            return defer.fail(LimitReached(f"{name}: not ordered now ({refusal.value} limit)", refusal, retry_at))
        self._waiting[name] = [mine]
        self.stats.placed += 1
        d = defer.Deferred.fromCoroutine(self._run(name))
        d.addErrback(lambda f: self.log.failure("ACME issuance for {name} broke", f, name=name))
        return mine

    async def _run(self, name: str) -> None:
        outcome: StoredCertificate | Failure
        try:
            outcome = await deferToThreadPool(self._reactor, self._pool, self.blocking.issue, name)
        except Exception:
            outcome = Failure()
        finally:
            self.ledger.finished(name)
        waiters = self._waiting.pop(name, [])
        if isinstance(outcome, Failure):
            self._failed(name, outcome)
        else:
            self.stats.issued += 1
            if self._unreachable:
                self._unreachable = False
                self.log.info("ACME: the CA answers again")
            if self.stats.failing.pop(name, None) is not None:
                self.log.info("ACME: {name} issued after failures", name=name)
        for d in waiters:
            if isinstance(outcome, Failure):
                d.errback(outcome)
            else:
                d.callback(outcome)

    def _failed(self, name: str, failure: Failure) -> None:
        error = failure.value
        kind = error.kind if isinstance(error, AcmeError) else "error"
        self.stats.failed[kind] = self.stats.failed.get(kind, 0) + 1
        message = str(error) if isinstance(error, AcmeError) else f"{name}: {failure.getErrorMessage()}"
        first = name not in self.stats.failing
        self.stats.failing[name] = message
        if isinstance(error, DirectoryUnreachable):
            # One line for the CA, not one per name: every name fails
            # alike until the CA answers again.
            first, self._unreachable = not self._unreachable, True
        if first:
            if isinstance(error, AcmeError):
                self.log.error("ACME: {reason}", reason=message)
            else:
                self.log.failure("ACME: issuance for {name} failed", failure, name=name)
