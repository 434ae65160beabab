"""Issuance shared by the nodes of a fleet: one node orders, the others load.

With ``[cluster]``, each node's master wraps its issuer in a
:class:`FleetIssuer`.  Before ordering a name it takes the name's lock in
Redis; the node holding it first looks for a certificate another node
shared, and orders only when there is none that is still good; it then
shares what it got and lets go of the lock.  A node that finds the lock
taken asks again every :data:`POLL` seconds, and once it holds the lock it
finds the certificate the other node shared and stores it in its own
storage (where its workers read it, as they read one it ordered) without
placing an order.

Redis keys (``KEY`` is ``[cluster] key``):

- ``KEY:acme:lock:NAME``: a random token of the node ordering NAME, set
  with ``SET NX PX`` and expiring after :data:`LOCK_TTL` seconds (longer
  than an order may take), so the lock of a node that died frees itself;
  let go by a compare-and-delete script, so a node never deletes a lock
  that expired and was taken by another.
- ``KEY:acme:cert:NAME``: the private key and certificate chain, PEM, as
  in the storage file; it expires with the certificate.  This is key
  material: Redis must be private to the fleet (it already holds the
  fleet's invalidations and reloads).

Each node keeps its own ACME account (in its own storage): a CA allows
many accounts, and an account key never needs to leave the machine.

Without Redis (not configured, unreachable, a command that fails) the node
orders alone, as a node outside a fleet does: certificates keep coming,
and two nodes may then order the same name once each.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from prexy.acme.policy import Renewal, normalize_name
from prexy.acme.storage import Storage, StorageError, StoredCertificate

#: Seconds a lock lives: an order gives up after 90 s (IssuerSettings.deadline).
LOCK_TTL = 150.0
#: Seconds between two tries for a lock another node holds.
POLL = 0.25
#: Seconds one Redis command may take.
COMMAND_TIMEOUT = 5.0
#: Deletes the lock only if it still holds this node's token.
RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"


class RedisLink(Protocol):
    """What is needed of :class:`prexy.cluster.redis.RedisConnection`."""

    def command(self, *args: bytes | str | int | float) -> defer.Deferred[Any]: ...


class Issues(Protocol):
    def issue(self, name: str) -> defer.Deferred[StoredCertificate]: ...


def split_pem(name: str, data: bytes) -> StoredCertificate:
    """A shared (or stored) ``key + chain`` PEM checked and parsed; raises
    :class:`StorageError`."""
    marker = data.find(b"-----BEGIN CERTIFICATE-----")
    if marker < 0:
        raise StorageError(f"{name}: no certificate")
    return StoredCertificate.parse(name, data[:marker], data[marker:])


def joined_pem(stored: StoredCertificate) -> bytes:
    key = stored.key_pem if stored.key_pem.endswith(b"\n") else stored.key_pem + b"\n"
    return key + stored.chain_pem


def still_good(stored: StoredCertificate, now: float, renewal: Renewal) -> bool:
    """True when a shared certificate may be taken instead of ordering: it
    is not yet at the earliest time renewal could pick for it."""
    lifetime = max(0.0, stored.not_after - stored.not_before)
    return now < stored.not_before + lifetime * (renewal.fraction - renewal.jitter)


class FleetIssuer:
    """An issuer (``local``) whose orders are coordinated with the other
    nodes through Redis (see the module docstring).

    ``link()`` is the node's Redis connection now, None while there is
    none; ``ready`` (optional) fires once the node's link had its chance
    to connect at start.  ``save`` stores a certificate in this node's
    storage (blocking: the service runs it on a thread)."""

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        local: Issues,
        storage: Storage,
        key: str,
        link: Callable[[], RedisLink | None],
        *,
        ready: defer.Deferred[Any] | None = None,
        save: Callable[[str, bytes, bytes], defer.Deferred[StoredCertificate]] | None = None,
        renewal: Renewal = Renewal(),  # noqa: B008 - frozen value
        token: Callable[[], str] = lambda: secrets.token_hex(16),
        poll: float = POLL,
        lock_ttl: float = LOCK_TTL,
    ) -> None:
        self.clock = clock
        self.local = local
        self.storage = storage
        self.key = key
        self.link = link
        self._ready = ready
        self._save = save or (lambda name, k, c: defer.maybeDeferred(storage.save, name, k, c))
        self.renewal = renewal
        self.token = token
        self.poll = poll
        self.lock_ttl = lock_ttl
        #: Certificates taken from another node instead of ordered.
        self.loaded = 0

    @property
    def stats(self) -> Any:
        """The local issuer's counters (orders this node placed)."""
        return getattr(self.local, "stats", None)

    def lock_key(self, name: str) -> str:
        return f"{self.key}:acme:lock:{name}"

    def cert_key(self, name: str) -> str:
        return f"{self.key}:acme:cert:{name}"

    def issue(self, name: str) -> defer.Deferred[StoredCertificate]:
        try:
            name = normalize_name(name)
        except ValueError:
            return defer.fail()
        return defer.Deferred.fromCoroutine(self._issue(name))

    async def _issue(self, name: str) -> StoredCertificate:
        if self._ready is not None and not self._ready.called:
            started: defer.Deferred[None] = defer.Deferred()

            def go(result: object) -> object:
                started.callback(None)
                return result

            self._ready.addBoth(go)
            await started
        token = self.token()
        while True:
            redis = self.link()
            if redis is None:
                return await self.local.issue(name)
            try:
                got = await self._timed(
                    redis.command("SET", self.lock_key(name), token, "NX", "PX", int(self.lock_ttl * 1000))
                )
            except Exception as e:
                self.log.warn("ACME: no fleet lock for {name} ({reason}); ordering here", name=name, reason=str(e))
                return await self.local.issue(name)
            if got is not None:
                try:
                    return await self._holding(redis, name)
                finally:
                    self._timed(redis.command("EVAL", RELEASE, 1, self.lock_key(name), token)).addErrback(
                        lambda f: None
                    )
            await task.deferLater(self.clock, self.poll, lambda: None)

    async def _holding(self, redis: RedisLink, name: str) -> StoredCertificate:
        """With the name's lock: the shared certificate if still good,
        else a new one, ordered and shared."""
        try:
            data = await self._timed(redis.command("GET", self.cert_key(name)))
        except Exception:
            data = None
        if data:
            try:
                shared = split_pem(name, data)
            except StorageError as e:
                self.log.warn("ACME: the certificate shared for {name} is unusable ({reason})", name=name, reason=str(e))
            else:
                if still_good(shared, self.clock.seconds(), self.renewal):
                    stored = await self._save(name, shared.key_pem, shared.chain_pem)
                    self.loaded += 1
                    self.log.info("ACME: certificate for {name} taken from the fleet", name=name)
                    return stored
        stored = await self.local.issue(name)
        ttl = int((stored.not_after - self.clock.seconds()) * 1000)
        if ttl > 0:
            try:
                await self._timed(redis.command("SET", self.cert_key(name), joined_pem(stored), "PX", ttl))
            except Exception as e:
                self.log.warn("ACME: the certificate for {name} not shared with the fleet ({reason})",
                              name=name, reason=str(e))
        return stored

    def _timed(self, d: defer.Deferred[Any]) -> defer.Deferred[Any]:
        return d.addTimeout(COMMAND_TIMEOUT, self.clock)
