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
  in the storage file; it expires with the certificate.
- ``KEY:acme:failed:NAME``: why the last order for NAME failed, for
  :data:`FAILED_TTL` seconds: a node that waited for the lock then fails
  too instead of placing one more order the CA would refuse alike (each
  node retries after its backoff).
- ``KEY:acme:seen:ID``: the nodes that hold challenge answer ID (a set,
  for a minute).
- ``KEY:acme:challenges``: the challenge answers pending in the fleet (a
  hash): field ``KIND SUBJECT`` (``http-01 TOKEN``, ``tls-alpn-01
  NAME``), value ``EXPIRES MESSAGE``: when it stops counting (Unix
  milliseconds, :data:`CHALLENGE_TTL` after it was written; the hash
  itself expires as long after its last write) and the message sent on
  the channel.  Written by the ordering node, deleted when the answer is
  taken back.  The TLS-ALPN-01 answers in it and on the channel are key
  material: Redis must be private to the fleet (it already holds the
  fleet's invalidations and reloads).

The CA's validation request may reach any node (a load balancer, DNS
with several addresses), so the ordering node hands each challenge answer
to the others (:class:`SharedChallenges`, on the fleet's channel
``KEY:events``) and waits until they hold it before asking the CA to
validate; each node's master keeps it where its workers read it
(:func:`challenge_listener`).  A node says it holds an answer only once
its workers are up (until then the CA's request would wait in its
listening socket's backlog, maybe longer than the CA waits), and a node
orders only once its own are.

A node that is not subscribed when the answer is published (it is
starting, restarting, or reconnecting to Redis) would never hear it, and
the CA's request may still reach it.  So the ordering node writes each
answer to ``KEY:acme:challenges`` before it publishes it (both on its one
command connection, which Redis serves in order), and a node going live
on the fleet loads that hash once its subscriber is subscribed, before
its ``ready`` fires and its workers start (the cluster's ``on_live``
hook, :meth:`ChallengeListener.load`).  The HSET precedes the PUBLISH and
the SUBSCRIBE precedes the HGETALL, so either the PUBLISH comes after the
SUBSCRIBE and the node hears the message, or it came before it and the
HSET came before the HGETALL, which finds the answer.  Taking an answer
back deletes it from the hash before publishing that, alike; a load that
overlaps a message saying an answer is gone leaves that answer out.

Each node keeps its own ACME account (in its own storage): a CA allows
many accounts, and an account key never needs to leave the machine.

Without Redis (not configured, unreachable, a command that fails) the node
orders alone, as a node outside a fleet does: certificates keep coming,
and two nodes may then order the same name once each.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet import defer, task
from twisted.internet.interfaces import IReactorTime
from twisted.logger import Logger

from prexy.acme.issuer import AcmeError, LimitReached
from prexy.acme.policy import Renewal, normalize_name
from prexy.acme.storage import Storage, StorageError, StoredCertificate

#: Seconds a lock lives: an order gives up after 90 s (IssuerSettings.deadline).
LOCK_TTL = 150.0
#: Seconds an order's failure keeps the other nodes from ordering the name
#: (less than the first retry's wait, prexy.acme.policy.Backoff).
FAILED_TTL = 30.0
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
        failed_ttl: float = FAILED_TTL,
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
        self.failed_ttl = failed_ttl
        #: Certificates taken from another node instead of ordered.
        self.loaded = 0

    @property
    def stats(self) -> Any:
        """The local issuer's counters (orders this node placed)."""
        return getattr(self.local, "stats", None)

    def lock_key(self, name: str) -> str:
        return f"{self.key}:acme:lock:{name}"

    def failed_key(self, name: str) -> str:
        return f"{self.key}:acme:failed:{name}"

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
        try:
            failed = await self._timed(redis.command("GET", self.failed_key(name)))
        except Exception:
            failed = None
        if failed:
            raise AcmeError(f"{name}: not ordered: another node's order failed just now: "
                            f"{failed.decode('utf-8', 'replace')}")
        try:
            stored = await self.local.issue(name)
        except AcmeError as e:
            if not isinstance(e, LimitReached):  # a limit is this node's own
                self._timed(
                    redis.command("SET", self.failed_key(name), str(e), "PX", int(self.failed_ttl * 1000))
                ).addErrback(lambda f: None)
            raise
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


#: Seconds the ordering node waits for the other nodes to hold a challenge
#: answer before the CA is told to validate.
SHARE_WAIT = 10.0
#: What starts a challenge message on the fleet's channel.
ADD, GONE = b"acme-challenge", b"acme-challenge-gone"
#: Seconds a pending challenge answer counts in ``KEY:acme:challenges``
#: (longer than an order may take, IssuerSettings.deadline).
CHALLENGE_TTL = 300.0
#: Deletes a hash field only if it still holds this value (an expired
#: answer, never one written again meanwhile).
HDEL_IF = ("if redis.call('hget', KEYS[1], ARGV[1]) == ARGV[2] then "
           "return redis.call('hdel', KEYS[1], ARGV[1]) else return 0 end")


def challenges_key(key: str) -> str:
    return f"{key}:acme:challenges"


class SharedChallenges:
    """The ordering node's challenge registry: each answer is kept here
    (``local``, a :class:`prexy.acme.challenges.ChallengeRegistry`) and
    handed to the other nodes of the fleet on ``channel``, since the CA's
    validation request may reach any node (a load balancer, DNS with
    several addresses).  Called from the issuer's thread: an answer added
    returns once every node that received it said it holds it (a set in
    Redis, ``KEY:acme:seen:ID``), at most :data:`SHARE_WAIT` seconds.
    Each answer is also kept in ``KEY:acme:challenges`` until it is taken
    back, for the nodes that join meanwhile.

    The message carries the answer itself: an HTTP-01 key authorization is
    public (it is what the CA fetches), a TLS-ALPN-01 certificate's key
    serves only that validation."""

    def __init__(
        self, reactor: Any, local: Any, key: str, channel: str, node: str, link: Callable[[], RedisLink | None],
        wait: float = SHARE_WAIT, poll: float = 0.02, ttl: float = CHALLENGE_TTL,
    ) -> None:
        self.reactor = reactor
        self.local = local
        self.key = key
        self.channel = channel
        self.node = node
        self.link = link
        self.wait = wait
        self.poll = poll
        self.ttl = ttl

    def add_http01(self, token: str, key_authorization: str) -> None:
        self.local.add_http01(token, key_authorization)
        self._share(ADD, b"http-01", token.encode("ascii"), key_authorization.encode("ascii"))

    def remove_http01(self, token: str) -> None:
        self.local.remove_http01(token)
        self._share(GONE, b"http-01", token.encode("ascii"))

    def add_tls_alpn01(self, name: str, cert_pem: bytes, key_pem: bytes) -> None:
        self.local.add_tls_alpn01(name, cert_pem, key_pem)
        self._share(ADD, b"tls-alpn-01", name.encode("ascii"), base64.b64encode(key_pem + cert_pem))

    def remove_tls_alpn01(self, name: str) -> None:
        self.local.remove_tls_alpn01(name)
        self._share(GONE, b"tls-alpn-01", name.encode("ascii"))

    def _share(self, verb: bytes, *words: bytes) -> None:
        from twisted.internet.threads import blockingCallFromThread

        try:
            blockingCallFromThread(self.reactor, self._announce, verb, words)
        except Exception as e:
            FleetIssuer.log.warn("ACME: a challenge answer not shared with the fleet ({reason})", reason=str(e))

    @defer.inlineCallbacks
    def _announce(self, verb: bytes, words: tuple[bytes, ...]) -> Any:
        redis = self.link()
        if redis is None:
            return
        ident = secrets.token_hex(8)
        payload = b" ".join((verb, ident.encode(), self.node.encode(), *words))
        # Kept for a node not subscribed yet, before it is published (see the
        # module docstring); a failure here still lets the message go.
        field = b" ".join(words[:2])
        try:
            if verb == ADD:
                expires = int((self.reactor.seconds() + self.ttl) * 1000)
                yield redis.command("HSET", challenges_key(self.key), field, b"%d %s" % (expires, payload)).addTimeout(
                    COMMAND_TIMEOUT, self.reactor)
                redis.command("PEXPIRE", challenges_key(self.key), int(self.ttl * 1000)).addErrback(lambda f: None)
            else:
                yield redis.command("HDEL", challenges_key(self.key), field).addTimeout(COMMAND_TIMEOUT, self.reactor)
        except Exception as e:
            FleetIssuer.log.warn("ACME: a challenge answer not kept in Redis for the nodes that join ({reason})",
                                 reason=str(e) or type(e).__name__)
        receivers = yield redis.command("PUBLISH", self.channel, payload).addTimeout(COMMAND_TIMEOUT, self.reactor)
        if verb != ADD:
            return
        # Every node's subscriber got it, this node's own among them.
        others = int(receivers) - 1
        give_up = self.reactor.seconds() + self.wait
        seen = f"{self.key}:acme:seen:{ident}"
        while others > 0:
            have = yield redis.command("SCARD", seen).addTimeout(COMMAND_TIMEOUT, self.reactor)
            if int(have) >= others:
                return
            if self.reactor.seconds() >= give_up:
                FleetIssuer.log.warn("ACME: {n} of {m} other node(s) confirmed a challenge answer within {s:g} s",
                                     n=int(have), m=others, s=self.wait)
                return
            yield task.deferLater(self.reactor, self.poll, lambda: None)


class ChallengeListener:
    """What a node does with the fleet's challenge answers (the others'
    :class:`SharedChallenges`): called with each message on the fleet's
    channel, it keeps the answer in ``registry`` (which the node's workers
    read), says so in ``KEY:acme:seen:ID`` and returns True; False for any
    other message.  :meth:`load` takes the answers pending in
    ``KEY:acme:challenges`` (the cluster's ``on_live`` hook)."""

    def __init__(
        self, reactor: Any, registry: Any, key: str, node: str, link: Callable[[], RedisLink | None],
        serving: defer.Deferred[Any] | None = None,
    ) -> None:
        self.reactor = reactor
        self.registry = registry
        self.key = key
        self.node = node
        self.link = link
        #: Fires once this node answers requests (its workers are up):
        #: until then it holds answers but does not say so.
        self.serving = serving
        #: For each load in progress, the answers heard gone meanwhile.
        self._gone_during: list[set[bytes]] = []

    def __call__(self, payload: bytes) -> bool:
        words = payload.split(b" ")
        if words[0] not in (ADD, GONE):
            return False
        try:
            verb, ident, sender, kind, subject = words[:5]
            if sender.decode() == self.node:
                return True
            if verb == GONE:
                for gone in self._gone_during:
                    gone.add(kind + b" " + subject)
            self._apply(words)
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            FleetIssuer.log.warn("ACME: a challenge message from the fleet unusable ({reason})", reason=str(e))
            return True
        if verb == ADD:
            if self.serving is None or self.serving.called:
                self._confirm(ident)
            else:
                self.serving.addBoth(self._confirm_later, ident)
        return True

    def _confirm_later(self, result: Any, ident: bytes) -> Any:
        self._confirm(ident)
        return result

    def _confirm(self, ident: bytes) -> None:
        """Says in ``KEY:acme:seen:ID`` that this node holds answer ID and
        answers requests."""
        redis = self.link()
        if redis is not None:
            seen = f"{self.key}:acme:seen:{ident.decode()}"
            redis.command("SADD", seen, self.node).addErrback(lambda f: None)
            redis.command("EXPIRE", seen, 60).addErrback(lambda f: None)

    def _apply(self, words: list[bytes]) -> None:
        """Adds or removes the answer of a message (split in words);
        raises ValueError, IndexError or UnicodeDecodeError for a bad one."""
        verb, _ident, _sender, kind, subject = words[:5]
        text = subject.decode("ascii")
        if verb == ADD and kind == b"http-01":
            self.registry.add_http01(text, words[5].decode("ascii"))
        elif verb == ADD and kind == b"tls-alpn-01":
            pem = base64.b64decode(words[5], validate=True)
            marker = pem.find(b"-----BEGIN CERTIFICATE-----")
            self.registry.add_tls_alpn01(text, pem[marker:], pem[:marker])
        elif kind == b"http-01":
            self.registry.remove_http01(text)
        elif kind == b"tls-alpn-01":
            self.registry.remove_tls_alpn01(text)

    def load(self) -> defer.Deferred[int]:
        """Takes the answers other nodes keep pending in Redis into
        ``registry``; fires with how many.  An expired one is left out
        (and deleted, unless written again meanwhile); so is one heard
        gone while the load was under way."""
        redis = self.link()
        if redis is None:
            return defer.succeed(0)
        gone: set[bytes] = set()
        self._gone_during.append(gone)
        hkey = challenges_key(self.key)

        def loaded(flat: list[bytes] | None) -> int:
            flat = flat or []
            now_ms = self.reactor.seconds() * 1000
            count = 0
            for field, value in zip(flat[::2], flat[1::2], strict=True):
                expires, _, payload = value.partition(b" ")
                words = payload.split(b" ")
                try:
                    if int(expires) <= now_ms:
                        redis.command("EVAL", HDEL_IF, 1, hkey, field, value).addErrback(lambda f: None)
                        continue
                    if words[0] != ADD or len(words) < 6 or words[2].decode() == self.node or field in gone:
                        continue
                    self._apply(words)
                except (ValueError, IndexError, UnicodeDecodeError) as e:
                    FleetIssuer.log.warn("ACME: a challenge answer kept in Redis unusable ({reason})", reason=str(e))
                    continue
                count += 1
            if count:
                FleetIssuer.log.info("ACME: {n} pending challenge answer(s) taken from the fleet", n=count)
            return count

        def done(result: Any) -> Any:
            self._gone_during.remove(gone)
            return result

        d = redis.command("HGETALL", hkey).addTimeout(COMMAND_TIMEOUT, self.reactor)
        return d.addCallback(loaded).addBoth(done)


def challenge_listener(
    reactor: Any, registry: Any, key: str, node: str, link: Callable[[], RedisLink | None],
    serving: defer.Deferred[Any] | None = None,
) -> ChallengeListener:
    """The node's :class:`ChallengeListener`."""
    return ChallengeListener(reactor, registry, key, node, link, serving)
