"""The certificates of ACME sites over time, with a fake clock and a
scripted issuer: at start the listed names are loaded from storage or
ordered; renewal falls at two thirds of the lifetime; a failed renewal
keeps the old certificate serving and retries with backoff; a handshake
for a new name waits for its order at most the bound; names under a
wildcard are ordered only after the ask check says yes (and a no is
remembered, not even storage is read for it); names no site serves never
reach storage or the issuer."""

from __future__ import annotations

import datetime
from typing import Any

from twisted.internet import defer, task
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from prexy.acme.issuer import OrderRefused
from prexy.acme.manager import CertificateManager, Event, InvalidMove, Phase, _Name, ask_url
from prexy.acme.policy import Backoff, NamePolicy, Renewal
from prexy.acme.storage import Storage, StoredCertificate
from tests.acme.certs import make_ca, make_leaf
from tests.cases import tmp_dir

START = datetime.datetime(2026, 6, 1, tzinfo=datetime.UTC)
DAY = 86400.0
SITES = {"shop": ["shop.example", "*.shop.example"], "blog": ["blog.example"]}


class FakeIssuer:
    """Orders wait for the test: :meth:`succeed` stores a 90-day
    certificate starting now, :meth:`fail` fails the order."""

    def __init__(self, storage: Storage, clock: Clock) -> None:
        self.storage = storage
        self.clock = clock
        self.ca = make_ca()
        self.orders: dict[str, defer.Deferred[StoredCertificate]] = {}
        self.placed: list[str] = []

    def issue(self, name: str) -> defer.Deferred[StoredCertificate]:
        assert name not in self.orders, f"two orders for {name}"
        self.placed.append(name)
        d: defer.Deferred[StoredCertificate] = defer.Deferred()
        self.orders[name] = d
        return d

    def store(self, name: str, days: float = 90) -> StoredCertificate:
        start = datetime.datetime.fromtimestamp(self.clock.seconds(), datetime.UTC)
        leaf = make_leaf(self.ca, [name], not_before=start, lifetime=datetime.timedelta(days=days))
        return self.storage.save(name, leaf.key_pem, leaf.cert_pem)

    def succeed(self, name: str) -> StoredCertificate:
        stored = self.store(name)
        self.orders.pop(name).callback(stored)
        return stored

    def fail(self, name: str) -> None:
        self.orders.pop(name).errback(OrderRefused(f"{name}: the CA refused the order: rateLimited"))


class ManagerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(START.timestamp())
        self.storage = Storage(tmp_dir(self))
        self.issuer = FakeIssuer(self.storage, self.clock)
        self.loads: list[str] = []
        load = self.storage.load

        def counting_load(name: str) -> Any:
            self.loads.append(name)
            return load(name)

        self.storage.load = counting_load  # type: ignore[method-assign]
        self.asked: list[str] = []
        self.answers: dict[str, bool] = {}

    def manager(self, *, ask: bool = True) -> CertificateManager:
        def check(name: str) -> defer.Deferred[bool]:
            self.asked.append(name)
            return defer.succeed(self.answers.get(name, False))

        m = CertificateManager(
            self.clock,
            NamePolicy.of(SITES, ask=ask),
            self.storage,
            self.issuer,
            ask=check if ask else None,
            renewal=Renewal(jitter=0.0),
            backoff=Backoff(first=60, most=3600),
            rand=lambda: 1.0,
        )
        self.addCleanup(m.stop)
        return m

    def test_start_orders_missing_loads_stored(self) -> None:
        stored = self.issuer.store("blog.example")
        m = self.manager()
        d = m.start()
        self.assertEqual(self.issuer.placed, ["shop.example"])
        self.assertNoResult(d)
        self.issuer.succeed("shop.example")
        self.successResultOf(d)
        self.assertEqual(m.current("blog.example"), stored)
        self.assertEqual(m.phase("shop.example"), Phase.HELD)
        self.assertIsNotNone(m.current("shop.example"))

    def test_renewal_at_two_thirds(self) -> None:
        self.issuer.store("blog.example")
        self.issuer.store("shop.example")
        m = self.manager()
        self.successResultOf(m.start())
        self.assertEqual(self.issuer.placed, [])
        self.clock.advance(60 * DAY - 1)
        self.assertEqual(self.issuer.placed, [])
        self.clock.advance(1)
        self.assertEqual(sorted(self.issuer.placed), ["blog.example", "shop.example"])
        self.assertEqual(m.phase("shop.example"), Phase.ISSUING)
        new = self.issuer.succeed("shop.example")
        self.assertEqual(m.current("shop.example"), new)
        self.clock.advance(60 * DAY)
        self.assertEqual(self.issuer.placed.count("shop.example"), 2)

    def test_failed_renewal_keeps_serving_and_backs_off(self) -> None:
        old = self.issuer.store("shop.example")
        self.issuer.store("blog.example")
        m = self.manager()
        self.successResultOf(m.start())
        self.clock.advance(60 * DAY)
        self.issuer.fail("shop.example")
        self.assertEqual(m.phase("shop.example"), Phase.RETRYING)
        self.assertEqual(m.current("shop.example"), old)
        self.assertIn("rateLimited", m.health()["failing"]["shop.example"])
        self.assertAlmostEqual(m.health()["earliest_expiry_days"]["shop"], 30.0)
        self.clock.advance(59)
        self.assertEqual(self.issuer.placed.count("shop.example"), 1)
        self.clock.advance(1)
        self.assertEqual(self.issuer.placed.count("shop.example"), 2)
        self.issuer.fail("shop.example")
        self.clock.advance(119)
        self.assertEqual(self.issuer.placed.count("shop.example"), 2)
        self.clock.advance(1)
        self.assertEqual(self.issuer.placed.count("shop.example"), 3)
        self.issuer.succeed("shop.example")
        self.assertEqual(m.health()["failing"], {})
        self.assertEqual(m.phase("shop.example"), Phase.HELD)

    def test_obtain_exact_waits_bounded(self) -> None:
        """A handshake for a listed name with no certificate waits for the
        order at most the bound; the order goes on and serves the next."""
        m = self.manager()
        d = m.obtain("shop.example")
        self.assertEqual(self.issuer.placed, ["shop.example"])
        self.clock.advance(10)
        self.assertIsNone(self.successResultOf(d))
        again = m.obtain("shop.example")
        self.assertEqual(self.issuer.placed, ["shop.example"])
        stored = self.issuer.succeed("shop.example")
        self.assertEqual(self.successResultOf(again), stored)
        self.assertEqual(m.current("shop.example"), stored)

    def test_obtain_within_bound(self) -> None:
        m = self.manager()
        d = m.obtain("shop.example")
        self.clock.advance(3)
        stored = self.issuer.succeed("shop.example")
        self.assertEqual(self.successResultOf(d), stored)
        # The wait's timer is gone; what is left is the renewal, at two
        # thirds of the new certificate's 90 days.
        self.assertEqual([c.getTime() for c in self.clock.getDelayedCalls()], [self.clock.seconds() + 60 * DAY])

    def test_wildcard_ask_yes(self) -> None:
        m = self.manager()
        self.answers["new.shop.example"] = True
        d = m.obtain("New.Shop.Example")
        self.assertEqual(self.asked, ["new.shop.example"])
        self.assertEqual(self.issuer.placed, ["new.shop.example"])
        stored = self.issuer.succeed("new.shop.example")
        self.assertEqual(self.successResultOf(d), stored)

    def test_wildcard_ask_no_remembered(self) -> None:
        """A no: no order; for the next ten minutes neither the ask check
        nor storage is consulted for that name."""
        m = self.manager()
        for _ in range(3):
            self.assertIsNone(self.successResultOf(m.obtain("bot.shop.example")))
        self.assertEqual(self.asked, ["bot.shop.example"])
        self.assertEqual(self.issuer.placed, [])
        self.assertEqual(self.loads, ["bot.shop.example"])
        self.clock.advance(601)
        self.assertIsNone(self.successResultOf(m.obtain("bot.shop.example")))
        self.assertEqual(self.asked, ["bot.shop.example"] * 2)

    def test_ask_once_for_a_name_in_flight(self) -> None:
        """Handshakes in several workers wait for one name while its ask
        check is in flight: one question, one order, every one answered."""
        pending: list[defer.Deferred[bool]] = []

        def slow(name: str) -> defer.Deferred[bool]:
            self.asked.append(name)
            pending.append(defer.Deferred())
            return pending[-1]

        m = self.manager()
        m.ask = slow
        waits = [m.obtain("new.shop.example") for _ in range(3)]
        self.assertEqual(self.asked, ["new.shop.example"])
        pending[0].callback(True)
        self.assertEqual(self.issuer.placed, ["new.shop.example"])
        stored = self.issuer.succeed("new.shop.example")
        for d in waits:
            self.assertEqual(self.successResultOf(d), stored)
        # A failed check answers every waiter with none, and is not remembered.
        waits = [m.obtain("other.shop.example") for _ in range(2)]
        pending[1].errback(ConnectionError("ask server down"))
        for d in waits:
            self.assertIsNone(self.successResultOf(d))
        m.obtain("other.shop.example")
        self.assertEqual(self.asked, ["new.shop.example", "other.shop.example", "other.shop.example"])

    def test_wildcard_without_ask(self) -> None:
        m = self.manager(ask=False)
        self.assertIsNone(self.successResultOf(m.obtain("new.shop.example")))
        self.assertEqual(self.issuer.placed, [])

    def test_unserved_never_reaches_storage(self) -> None:
        m = self.manager()
        for name in ["other.example", "shop.example.evil", "x", b"\xff"]:
            self.assertIsNone(m.current(name))
            self.assertIsNone(self.successResultOf(m.obtain(name)))
        self.assertEqual(self.loads, [])
        self.assertEqual(self.issuer.placed, [])
        self.assertEqual(self.asked, [])

    def test_update_forgets_unserved(self) -> None:
        self.issuer.store("blog.example")
        self.issuer.store("shop.example")
        m = self.manager()
        self.successResultOf(m.start())
        self.successResultOf(m.update(NamePolicy.of({"shop": ["shop.example"]}, ask=False)))
        self.assertIsNone(m.phase("blog.example"))
        self.assertIsNone(m.current("blog.example"))
        self.assertEqual(len(self.clock.getDelayedCalls()), 1)

    def test_stop_cancels_timers(self) -> None:
        self.issuer.store("blog.example")
        self.issuer.store("shop.example")
        m = self.manager()
        self.successResultOf(m.start())
        m.stop()
        self.assertEqual(self.clock.getDelayedCalls(), [])

    def test_moves(self) -> None:
        entry = _Name()
        self.assertRaises(InvalidMove, entry.move, Event.ISSUED)
        entry.move(Event.ORDER)
        self.assertRaises(InvalidMove, entry.move, Event.ORDER)
        entry.move(Event.FAILED)
        self.assertEqual(entry.phase, Phase.RETRYING)

    def test_ask_url(self) -> None:
        self.assertEqual(ask_url("http://ask.test/check", "a.shop.example"), "http://ask.test/check?domain=a.shop.example")
        self.assertEqual(ask_url("http://ask.test/check?k=1", "a.b"), "http://ask.test/check?k=1&domain=a.b")


class LimitRetryTests(SynchronousTestCase):
    def test_retry_when_limit_frees(self) -> None:
        """An order refused by the hourly limit is retried when the limit
        frees a slot, not sooner (the backoff alone would say 60 s)."""
        from prexy.acme.issuer import LimitReached
        from prexy.acme.policy import Refusal

        clock = Clock()
        clock.advance(START.timestamp())
        storage = Storage(tmp_dir(self))
        issuer = FakeIssuer(storage, clock)
        m = CertificateManager(clock, NamePolicy.of(SITES, ask=False), storage, issuer, backoff=Backoff(first=60), rand=lambda: 1.0)
        self.addCleanup(m.stop)
        m.start()
        issuer.orders.pop("blog.example").callback(issuer.store("blog.example"))
        issuer.orders.pop("shop.example").errback(LimitReached("limit", Refusal.DOMAIN_RATE, clock.seconds() + 1800))
        clock.advance(1799)
        self.assertEqual(issuer.placed.count("shop.example"), 1)
        clock.advance(1)
        self.assertEqual(issuer.placed.count("shop.example"), 2)


class WatchTests(SynchronousTestCase):
    def test_watchers_told_of_each_issuance(self) -> None:
        clock = Clock()
        clock.advance(START.timestamp())
        storage = Storage(tmp_dir(self))
        issuer = FakeIssuer(storage, clock)
        m = CertificateManager(clock, NamePolicy.of(SITES, ask=False), storage, issuer, rand=lambda: 0.5)
        self.addCleanup(m.stop)
        seen: list[tuple[str, float]] = []
        m.watch(lambda name, cert: seen.append((name, cert.not_after)))
        m.watch(lambda name, cert: 1 / 0)  # type: ignore[func-returns-value]
        m.start()
        first = issuer.succeed("shop.example")
        self.assertEqual(seen, [("shop.example", first.not_after)])
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)


class CooperativeStartTests(SynchronousTestCase):
    def test_start_between_other_work(self) -> None:
        """With a cooperator, start reads one listed name per turn of the
        clock, and fires once all are read."""
        clock = Clock()
        clock.advance(START.timestamp())
        storage = Storage(tmp_dir(self))
        issuer = FakeIssuer(storage, clock)
        names = [f"n{i}.example" for i in range(5)]
        for name in names:
            issuer.store(name)
        cooperator = task.Cooperator(
            # A turn a second, one step a turn.
            scheduler=lambda step: clock.callLater(1, step),
            terminationPredicateFactory=lambda: lambda: True,
        )
        m = CertificateManager(clock, NamePolicy.of({"s": names}, ask=False), storage, issuer, cooperator=cooperator)
        self.addCleanup(m.stop)
        d = m.start()
        self.assertNoResult(d)
        held = lambda: sum(m.phase(n) is Phase.HELD for n in names)  # noqa: E731
        self.assertEqual(held(), 0)
        clock.advance(1)
        self.assertEqual(held(), 1)
        for _ in names:
            clock.advance(1)
        self.assertEqual(held(), 5)
        self.successResultOf(d)
        self.assertEqual(issuer.placed, [])
