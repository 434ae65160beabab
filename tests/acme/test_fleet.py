"""prexy.acme.fleet: nodes of a fleet order each name once through a lock in
Redis and take the certificate the ordering node shared; a dead node's lock
expires; without Redis a node orders alone; the ordering node's challenge
answers reach the other nodes' registries, and a node that joins while
one is pending loads it from Redis before its workers start.  A fake
Redis (the commands used, with expiry on a Clock) stands in for the
server."""

from __future__ import annotations

import datetime
import tempfile
import time
from typing import Any

from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from prexy.acme.challenges import ChallengeRegistry, tls_alpn01_certificate
from prexy.acme.fleet import (
    CHALLENGE_TTL,
    HDEL_IF,
    RELEASE,
    SHARE_WAIT,
    FleetIssuer,
    SharedChallenges,
    challenge_listener,
    joined_pem,
    split_pem,
    still_good,
)
from prexy.acme.issuer import AcmeError, OrderRefused
from prexy.acme.policy import Renewal
from prexy.acme.storage import Storage, StoredCertificate
from prexy.cluster.redis import RedisError
from tests.acme.certs import make_ca, make_leaf

CA = make_ca()


def leaf(name: str, age: datetime.timedelta = datetime.timedelta(minutes=1)) -> tuple[bytes, bytes]:
    issued = make_leaf(CA, [name], not_before=datetime.datetime.now(datetime.UTC) - age)
    return issued.key_pem, issued.cert_pem + CA.cert_pem


class FakeRedis:
    """SET (NX, PX), GET and the release script, keys expiring on ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.data: dict[str, tuple[bytes, float | None]] = {}
        self.commands: list[tuple[Any, ...]] = []
        self.broken = False
        self.subscribers: list[Any] = []
        self.sets: dict[str, set[str]] = {}
        self.hashes: dict[str, dict[bytes, bytes]] = {}
        #: Commands by name whose answer waits: (Deferred, its answer).
        self.hold: set[str] = set()
        self.held: list[tuple[defer.Deferred[Any], Any]] = []

    def get(self, key: str) -> bytes | None:
        value = self.data.get(key)
        if value is None:
            return None
        if value[1] is not None and value[1] <= self.clock.seconds():
            del self.data[key]
            return None
        return value[0]

    def command(self, *args: Any) -> defer.Deferred[Any]:
        self.commands.append(args)
        if self.broken:
            return defer.fail(RedisError("ERR broken"))
        if args[0] in self.hold:
            d: defer.Deferred[Any] = defer.Deferred()
            self.held.append((d, args))
            return d
        return self.run(*args)

    def release(self) -> None:
        """The held commands run and answer now."""
        held, self.held = self.held, []
        for d, args in held:
            self.run(*args).chainDeferred(d)

    def run(self, *args: Any) -> defer.Deferred[Any]:
        name = args[0]
        b = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
        if name == "HSET":
            self.hashes.setdefault(args[1], {})[b(args[2])] = b(args[3])
            return defer.succeed(1)
        if name == "HDEL":
            return defer.succeed(1 if self.hashes.get(args[1], {}).pop(b(args[2]), None) is not None else 0)
        if name == "HGETALL":
            return defer.succeed([x for kv in self.hashes.get(args[1], {}).items() for x in kv])
        if name == "PEXPIRE":
            return defer.succeed(1)
        if name == "EVAL" and args[1] == HDEL_IF:
            key, field, value = args[3], b(args[4]), b(args[5])
            if self.hashes.get(key, {}).get(field) == value:
                del self.hashes[key][field]
                return defer.succeed(1)
            return defer.succeed(0)
        if name == "SET":
            key, value, rest = args[1], args[2], list(args[3:])
            if "NX" in rest and self.get(key) is not None:
                return defer.succeed(None)
            expiry = self.clock.seconds() + rest[rest.index("PX") + 1] / 1000 if "PX" in rest else None
            self.data[key] = (value.encode() if isinstance(value, str) else value, expiry)
            return defer.succeed(b"OK")
        if name == "GET":
            return defer.succeed(self.get(args[1]))
        if name == "PUBLISH":
            for hear in self.subscribers:
                hear(args[2])
            return defer.succeed(len(self.subscribers))
        if name == "SADD":
            self.sets.setdefault(args[1], set()).add(args[2])
            return defer.succeed(1)
        if name == "SCARD":
            return defer.succeed(len(self.sets.get(args[1], ())))
        if name == "EXPIRE":
            return defer.succeed(1)
        if name == "EVAL" and args[1] == RELEASE:
            key, token = args[3], args[4]
            if self.get(key) == token.encode():
                del self.data[key]
                return defer.succeed(1)
            return defer.succeed(0)
        return defer.fail(RedisError(f"ERR unknown command {name}"))


class LocalIssuer:
    """Orders answered by the test: ``finish(name)`` stores a new certificate."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.orders: list[str] = []
        self.pending: dict[str, defer.Deferred[StoredCertificate]] = {}

    def issue(self, name: str) -> defer.Deferred[StoredCertificate]:
        self.orders.append(name)
        d: defer.Deferred[StoredCertificate] = defer.Deferred()
        self.pending[name] = d
        return d

    def finish(self, name: str) -> StoredCertificate:
        stored = self.storage.save(name, *leaf(name))
        self.pending.pop(name).callback(stored)
        return stored


class FleetTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(time.time())
        self.redis = FakeRedis(self.clock)
        self.tokens = iter(f"t{i}" for i in range(100))

    def node(self, link: Any = None, **kw: Any) -> tuple[FleetIssuer, LocalIssuer, Storage]:
        storage = Storage(tempfile.mkdtemp(dir=self.mktemp_dir()))
        local = LocalIssuer(storage)
        redis = self.redis if link is None else link
        fleet = FleetIssuer(self.clock, local, storage, "fleet", lambda: redis, token=lambda: next(self.tokens), **kw)
        return fleet, local, storage

    def mktemp_dir(self) -> str:
        path = self.mktemp()
        import os

        os.makedirs(path)
        return path

    def test_one_order_for_two_nodes(self) -> None:
        """Two nodes ask for one name: one order; the other node waits for
        the lock, then stores and serves the certificate the first shared;
        no lock is left behind."""
        a, local_a, storage_a = self.node()
        b, local_b, storage_b = self.node()
        got_a = a.issue("www.shop.example")
        got_b = b.issue("WWW.shop.example.")
        self.assertEqual((local_a.orders, local_b.orders), (["www.shop.example"], []))
        self.clock.advance(1.0)
        self.assertNoResult(got_b)
        issued = local_a.finish("www.shop.example")
        self.assertEqual(self.successResultOf(got_a), issued)
        self.clock.advance(0.25)
        from_b = self.successResultOf(got_b)
        self.assertEqual(from_b.chain_pem, issued.chain_pem)
        self.assertEqual(storage_b.load("www.shop.example"), from_b)
        self.assertEqual(local_b.orders, [])
        self.assertEqual((a.loaded, b.loaded), (0, 1))
        self.assertNotIn("fleet:acme:lock:www.shop.example", self.redis.data)
        self.assertEqual(split_pem("www.shop.example", self.redis.get("fleet:acme:cert:www.shop.example") or b""), issued)

    def test_a_failed_order_is_not_repeated_by_the_waiting_node(self) -> None:
        """The ordering node's failure is the waiting node's too for a
        while (one failed order for the fleet, not one per node); after
        that the name is ordered again."""
        a, local_a, _ = self.node()
        b, local_b, _ = self.node()
        got_a, got_b = a.issue("a.example"), b.issue("a.example")
        local_a.pending.pop("a.example").errback(OrderRefused("a.example: the CA refused the order: no"))
        self.failureResultOf(got_a, OrderRefused)
        self.clock.advance(0.25)
        failure = self.failureResultOf(got_b, AcmeError)
        self.assertIn("another node's order failed just now: a.example: the CA refused the order: no", str(failure.value))
        self.assertEqual(local_b.orders, [])
        self.clock.advance(30.0)
        b.issue("a.example")
        self.assertEqual(local_b.orders, ["a.example"])

    def test_dead_nodes_lock_expires(self) -> None:
        """A lock whose holder died (never let go) frees itself after its
        time to live; the waiting node then orders."""
        self.redis.data["fleet:acme:lock:a.example"] = (b"dead", self.clock.seconds() + 150)
        b, local_b, _ = self.node()
        got = b.issue("a.example")
        self.clock.advance(149.0)
        self.assertEqual(local_b.orders, [])
        self.clock.advance(1.25)
        self.assertEqual(local_b.orders, ["a.example"])
        local_b.finish("a.example")
        self.successResultOf(got)

    def test_release_keeps_anothers_lock(self) -> None:
        """The release deletes the lock only while it holds this node's token."""
        a, local_a, _ = self.node(lock_ttl=10.0)
        got = a.issue("a.example")
        self.clock.advance(10.0)  # the lock expired during a long order
        self.redis.data["fleet:acme:lock:a.example"] = (b"other", None)
        local_a.finish("a.example")
        self.successResultOf(got)
        self.assertEqual(self.redis.get("fleet:acme:lock:a.example"), b"other")

    def test_shared_due_for_renewal_is_ordered_again(self) -> None:
        """A renewal does not take back the shared certificate it renews:
        one past the earliest renewal time means a new order."""
        key, chain = leaf("a.example", age=datetime.timedelta(days=61))
        self.redis.data["fleet:acme:cert:a.example"] = (key + chain, None)
        a, local_a, _ = self.node()
        got = a.issue("a.example")
        self.assertEqual(local_a.orders, ["a.example"])
        fresh = local_a.finish("a.example")
        self.assertEqual(self.successResultOf(got), fresh)
        self.assertEqual(self.redis.get("fleet:acme:cert:a.example"), joined_pem(fresh))

    def test_unusable_shared_certificate_is_ordered(self) -> None:
        """Something in the certificate's key that is not one (or not the
        name's) is logged and an order placed."""
        key, chain = leaf("b.example")
        self.redis.data["fleet:acme:cert:a.example"] = (key + chain, None)
        a, local_a, _ = self.node()
        a.issue("a.example")
        self.assertEqual(local_a.orders, ["a.example"])
        self.assertEqual(len(self.flushLoggedErrors()), 0)

    def test_without_redis_orders_alone(self) -> None:
        """No connection, or a command that fails: the node orders itself."""
        a, local_a, _ = self.node(link=False)
        a.link = lambda: None
        a.issue("a.example")
        self.assertEqual(local_a.orders, ["a.example"])
        self.redis.broken = True
        b, local_b, _ = self.node()
        b.issue("a.example")
        self.assertEqual(local_b.orders, ["a.example"])

    def test_waits_for_the_link_at_start(self) -> None:
        """Nothing is ordered before the node's link had its chance to
        connect (else every node would order at start)."""
        ready: defer.Deferred[None] = defer.Deferred()
        a, local_a, _ = self.node(ready=ready)
        a.issue("a.example")
        self.assertEqual((local_a.orders, self.redis.commands), ([], []))
        ready.callback(None)
        self.assertEqual(local_a.orders, ["a.example"])

    def test_bad_name_fails(self) -> None:
        a, local_a, _ = self.node()
        self.failureResultOf(a.issue("no_such..name"), ValueError)
        self.assertEqual(local_a.orders, [])


class StillGoodTests(SynchronousTestCase):
    def test_before_the_earliest_renewal(self) -> None:
        stored = StoredCertificate("a.example", b"k", b"c", not_before=0.0, not_after=90.0)
        renewal = Renewal(fraction=2 / 3, jitter=1 / 30)
        self.assertTrue(still_good(stored, 56.9, renewal))
        self.assertFalse(still_good(stored, 57.0, renewal))


class ChallengeSharingTests(SynchronousTestCase):
    """The ordering node's answers reach the other nodes' registries (the
    files their workers read) before the CA is told to validate."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.redis = FakeRedis(self.clock)
        self.registries = {n: ChallengeRegistry(self.mktemp()) for n in ("a", "b", "c")}
        for n, registry in self.registries.items():
            self.redis.subscribers.append(challenge_listener(self.clock, registry, "fleet", n, lambda: self.redis))
        self.shared = SharedChallenges(self.clock, self.registries["a"], "fleet", "fleet:events", "a", lambda: self.redis)

    def test_http01_reaches_every_node(self) -> None:
        d = self.shared._announce(b"acme-challenge", (b"http-01", b"tok_1", b"tok_1.thumb"))
        self.registries["a"].add_http01("tok_1", "tok_1.thumb")
        self.successResultOf(d)
        for registry in self.registries.values():
            self.assertEqual(registry.http01("tok_1"), "tok_1.thumb")
        # b and c said so: the wait ended without the clock moving.
        self.assertEqual(sum(len(v) for v in self.redis.sets.values()), 2)

    def test_add_and_remove_by_the_registry_methods(self) -> None:
        self.shared._share = lambda verb, *words: self.shared._announce(verb, words)  # type: ignore[method-assign]
        self.shared.add_http01("tok_2", "tok_2.thumb")
        self.assertEqual(self.registries["c"].http01("tok_2"), "tok_2.thumb")
        self.shared.remove_http01("tok_2")
        self.assertIsNone(self.registries["c"].http01("tok_2"))
        cert_pem, key_pem = tls_alpn01_certificate("a.example", "auth")
        self.shared.add_tls_alpn01("a.example", cert_pem, key_pem)
        answer = self.registries["b"].tls_alpn01("a.example")
        assert answer is not None
        self.assertEqual((answer.cert_pem, answer.key_pem), (cert_pem, key_pem))
        self.shared.remove_tls_alpn01("a.example")
        self.assertIsNone(self.registries["b"].tls_alpn01("a.example"))

    def test_waits_a_bounded_time_for_a_silent_node(self) -> None:
        self.redis.subscribers.append(lambda payload: True)  # a node that never confirms
        d = self.shared._announce(b"acme-challenge", (b"http-01", b"tok_3", b"tok_3.thumb"))
        self.assertNoResult(d)
        self.clock.advance(SHARE_WAIT - 1.0)
        self.assertNoResult(d)
        self.clock.pump([0.02] * 60)
        self.successResultOf(d)

    def test_other_messages_and_bad_ones(self) -> None:
        hear = challenge_listener(self.clock, self.registries["b"], "fleet", "b", lambda: self.redis)
        self.assertFalse(hear(b"entry 1-0"))
        self.assertTrue(hear(b"acme-challenge x a http-01"))
        self.assertTrue(hear(b"acme-challenge x a http-01 bad/token v"))
        self.assertIsNone(self.registries["b"].http01("bad/token"))
        self.assertTrue(hear(b"acme-challenge x b http-01 tok_4 own"))
        self.assertIsNone(self.registries["b"].http01("tok_4"))


class JoiningNodeTests(SynchronousTestCase):
    """A node not subscribed when an answer was published (starting,
    restarting, reconnecting) takes it from ``KEY:acme:challenges`` when it
    goes live: the answer is kept there before it is published and until
    it is taken back."""

    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.redis = FakeRedis(self.clock)
        self.a = ChallengeRegistry(self.mktemp())
        self.redis.subscribers.append(challenge_listener(self.clock, self.a, "fleet", "a", lambda: self.redis))
        self.shared = SharedChallenges(self.clock, self.a, "fleet", "fleet:events", "a", lambda: self.redis)
        self.shared._share = lambda verb, *words: self.shared._announce(verb, words)  # type: ignore[method-assign]
        self.b = ChallengeRegistry(self.mktemp())
        self.joining = challenge_listener(self.clock, self.b, "fleet", "b", lambda: self.redis)

    def kept(self) -> dict[bytes, bytes]:
        return self.redis.hashes.get("fleet:acme:challenges", {})

    def test_kept_before_published(self) -> None:
        """When the message goes out, the answer is in the hash already."""
        at_publish: list[dict[bytes, bytes]] = []
        self.redis.subscribers.append(lambda payload: at_publish.append(dict(self.kept())) or True)
        self.shared.add_http01("tok_1", "tok_1.thumb")
        self.assertEqual(len(at_publish), 1)
        self.assertIn(b"http-01 tok_1", at_publish[0])
        names = [c[0] for c in self.redis.commands]
        self.assertLess(names.index("HSET"), names.index("PUBLISH"))
        expires, _, message = at_publish[0][b"http-01 tok_1"].partition(b" ")
        self.assertEqual(int(expires), int((self.clock.seconds() + CHALLENGE_TTL) * 1000))
        self.assertTrue(message.startswith(b"acme-challenge "))

    def test_joining_node_loads_pending_answers(self) -> None:
        self.shared.add_http01("tok_2", "tok_2.thumb")
        cert_pem, key_pem = tls_alpn01_certificate("a.example", "auth")
        self.shared.add_tls_alpn01("a.example", cert_pem, key_pem)
        self.assertIsNone(self.b.http01("tok_2"))  # b was not listening
        self.assertEqual(self.successResultOf(self.joining.load()), 2)
        self.assertEqual(self.b.http01("tok_2"), "tok_2.thumb")
        answer = self.b.tls_alpn01("a.example")
        assert answer is not None
        self.assertEqual((answer.cert_pem, answer.key_pem), (cert_pem, key_pem))

    def test_taken_back_is_gone_from_redis(self) -> None:
        self.shared.add_http01("tok_3", "tok_3.thumb")
        cert_pem, key_pem = tls_alpn01_certificate("a.example", "auth")
        self.shared.add_tls_alpn01("a.example", cert_pem, key_pem)
        self.shared.remove_http01("tok_3")
        self.shared.remove_tls_alpn01("a.example")
        self.assertEqual(self.kept(), {})
        names = [c[0] for c in self.redis.commands]
        self.assertLess(len(names) - 1 - names[::-1].index("HDEL"), len(names) - 1 - names[::-1].index("PUBLISH"))
        self.assertEqual(self.successResultOf(self.joining.load()), 0)
        self.assertIsNone(self.b.http01("tok_3"))
        self.assertIsNone(self.b.tls_alpn01("a.example"))

    def test_expired_own_and_bad_entries_left_out(self) -> None:
        self.shared.add_http01("tok_4", "tok_4.thumb")
        self.clock.advance(CHALLENGE_TTL)
        self.shared.add_http01("tok_5", "tok_5.thumb")
        self.kept()[b"http-01 bad"] = b"nonsense"
        self.assertEqual(self.successResultOf(self.joining.load()), 1)
        self.assertIsNone(self.b.http01("tok_4"))
        self.assertEqual(self.b.http01("tok_5"), "tok_5.thumb")
        self.assertNotIn(b"http-01 tok_4", self.kept(), "an expired answer is deleted")
        own = challenge_listener(self.clock, ChallengeRegistry(self.mktemp()), "fleet", "a", lambda: self.redis)
        self.assertEqual(self.successResultOf(own.load()), 0, "a node's own answers are not taken back in")

    def test_gone_while_loading_is_left_out(self) -> None:
        """The load's HGETALL answered before the removal, its reply read
        after the removal's message: the answer is not put back."""
        self.shared.add_http01("tok_6", "tok_6.thumb")
        self.redis.subscribers.append(self.joining)  # b subscribed, now loading
        self.redis.hold.add("HGETALL")
        loading = self.joining.load()
        snapshot = dict(self.kept())
        self.shared.remove_http01("tok_6")
        self.redis.hashes["fleet:acme:challenges"] = snapshot  # the reply as of before
        self.redis.release()
        self.assertEqual(self.successResultOf(loading), 0)
        self.assertIsNone(self.b.http01("tok_6"))

    def test_confirmed_once_serving(self) -> None:
        """A node whose workers are not up yet holds the answer at once but
        says so (and so lets the CA validate) only once they are."""
        serving: defer.Deferred[None] = defer.Deferred()
        starting = challenge_listener(self.clock, self.b, "fleet", "b", lambda: self.redis, serving)
        self.redis.subscribers.append(starting)
        d = self.shared._announce(b"acme-challenge", (b"http-01", b"tok_10", b"tok_10.thumb"))
        self.assertEqual(self.b.http01("tok_10"), "tok_10.thumb")
        self.assertNoResult(d)
        self.assertEqual(sum(len(v) for v in self.redis.sets.values()), 0)
        serving.callback(None)
        self.clock.advance(0.02)
        self.successResultOf(d)
        self.assertEqual(sum(len(v) for v in self.redis.sets.values()), 1)

    def test_redis_failure_fails_the_load(self) -> None:
        """The cluster logs it and goes live anyway (tests.cluster.test_node's
        OnLiveTests); without a link there is nothing to load."""
        self.shared.add_http01("tok_7", "tok_7.thumb")
        self.redis.broken = True
        self.failureResultOf(self.joining.load(), RedisError)
        alone = challenge_listener(self.clock, self.b, "fleet", "b", lambda: None)
        self.assertEqual(self.successResultOf(alone.load()), 0)

    def test_answer_published_anyway_when_it_cannot_be_kept(self) -> None:
        self.redis.subscribers.append(self.joining)
        real = self.redis.run

        def no_hset(*args: Any) -> defer.Deferred[Any]:
            return defer.fail(RedisError("OOM")) if args[0] == "HSET" else real(*args)

        self.redis.run = no_hset  # type: ignore[method-assign]
        self.shared.add_http01("tok_8", "tok_8.thumb")
        self.assertEqual(self.b.http01("tok_8"), "tok_8.thumb")


class JoiningClusterNodeTests(SynchronousTestCase):
    """Through two ClusterServices on the cluster's in-memory Redis: b
    starts after a published an answer, and holds it when its ready fires
    (when its master spawns its workers)."""

    def test_ready_fires_with_the_pending_answers(self) -> None:
        from prexy.cluster.node import ClusterService, PositionFile
        from prexy.cluster.settings import ClusterConfig, RedisAddress
        from prexy.metrics import Metrics
        from tests.cluster import fakeredis
        from tests.cluster.test_node import Target

        clock = Clock()
        clock.advance(1_700_000_000)
        server = fakeredis.FakeRedis(clock)
        nets, services, registries = {}, {}, {}
        for name in "ab":
            nets[name] = fakeredis.FakeNet(server)
            settings = ClusterConfig(RedisAddress(host="fake"), name)
            service = ClusterService(clock, settings, Target(), Metrics(), PositionFile(None),
                                     connect_to=nets[name].connect)
            registries[name] = ChallengeRegistry(self.mktemp())
            listener = challenge_listener(clock, registries[name], settings.key, name, lambda s=service: s.writer)
            service.listeners.append(listener)
            service.on_live.append(listener.load)
            services[name] = service
            self.addCleanup(lambda s=service: s.running and s.stopService())

        def flush() -> None:
            for _ in range(20):
                for net in nets.values():
                    net.flush()

        a = services["a"]
        a.startService()
        flush()
        self.successResultOf(a.ready)
        shared = SharedChallenges(clock, registries["a"], a.settings.key, a.settings.channel, "a", lambda: a.writer)
        announced = shared._announce(b"acme-challenge", (b"http-01", b"tok_9", b"tok_9.thumb"))
        flush()
        self.successResultOf(announced)  # nobody else listening: no wait
        b = services["b"]
        at_ready: list[str | None] = []
        b.ready.addCallback(lambda _: at_ready.append(registries["b"].http01("tok_9")))
        b.startService()
        flush()
        self.assertEqual(at_ready, ["tok_9.thumb"])


class WiringTests(SynchronousTestCase):
    def test_single_process_with_cluster_shares(self) -> None:
        """With [acme] and [cluster], the issuing process (here --workers 0:
        the master is prexy.workers' twin of this) orders through the fleet
        and hears the fleet's challenge answers."""
        from twisted.internet.testing import MemoryReactorClock

        from prexy.config import parse_config
        from prexy.runtime import build_runtime
        from prexy.service import ProxyService

        storage = self.mktemp()
        text = (
            "[server]\nlisten = ['tcp:0:interface=127.0.0.1']\n"
            f"[acme]\ndirectory = 'https://127.0.0.1:9/dir'\nstorage = '{storage}'\n"
            "[cluster]\nredis = 'redis://127.0.0.1:9/0'\nnode = 'x'\n"
            "[sites.s]\nupstream = 'http://127.0.0.1:9'\nhosts = ['s.test']\ntls = 'acme'\n"
        )
        config = parse_config(text, "/nowhere/prexy.toml")
        service = ProxyService(MemoryReactorClock(), config, build_runtime(config))
        self.assertIsInstance(service.acme.manager.issuer, FleetIssuer)
        self.assertIsInstance(service.acme.blocking.registry, SharedChallenges)
        self.assertEqual(len(service.cluster.listeners), 1)
        self.assertEqual(service.cluster.on_live, [service.cluster.listeners[0].load])
        self.assertIs(service.acme.manager.issuer._ready, service.cluster.ready)
        self.assertIs(service.cluster.listeners[0].serving, service.cluster.ready)
