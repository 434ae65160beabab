"""The Twisted side of issuance, with the blocking issuer scripted: one
order serves every request for a name made while it is in flight; the
limits refuse before any order is placed; outcomes are counted, and a
failing name is logged once until it succeeds again."""

from __future__ import annotations

from typing import Any

from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from prexy.acme.issuer import (
    AcmeError,
    DirectoryUnreachable,
    Issuer,
    IssuerSettings,
    LimitReached,
    OrderRefused,
)
from prexy.acme.policy import Ledger, Limits, Refusal, last_two_labels
from prexy.acme.storage import StoredCertificate
from tests.acme.fakes import ImmediateReactor, QueuedPool, ScriptedIssuer


def cert(name: str) -> StoredCertificate:
    return StoredCertificate(name=name, key_pem=b"k", chain_pem=b"c", not_before=0.0, not_after=90 * 86400.0)


class IssuerTests(SynchronousTestCase):
    def make(self, outcomes: dict[str, list[Any]], limits: Limits | None = None) -> tuple[Issuer, QueuedPool, ScriptedIssuer]:
        self.clock = Clock()
        pool = QueuedPool()
        blocking = ScriptedIssuer(outcomes)
        issuer = Issuer(
            ImmediateReactor(),  # type: ignore[arg-type]
            pool,  # type: ignore[arg-type]
            blocking,  # type: ignore[arg-type]
            Ledger(limits or Limits(), last_two_labels),
            self.clock.seconds,
        )
        self.logged: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.logged.append)
        return issuer, pool, blocking

    def errors_logged(self) -> list[dict[str, Any]]:
        return [e for e in self.logged if e.get("log_namespace", "").startswith("prexy.acme") and e["log_level"].name in ("error", "critical")]

    def test_one_order_per_name(self) -> None:
        """Three requests while an order is in flight: one order, three answers."""
        issuer, pool, blocking = self.make({"a.shop.example": [cert("a.shop.example")]})
        ds = [issuer.issue("a.shop.example") for _ in range(3)]
        self.assertEqual(len(pool.jobs), 1)
        for d in ds:
            self.assertNoResult(d)
        pool.run_one()
        for d in ds:
            self.assertEqual(self.successResultOf(d).name, "a.shop.example")
        self.assertEqual(blocking.calls, ["a.shop.example"])
        self.assertEqual((issuer.stats.placed, issuer.stats.issued), (1, 1))
        self.assertEqual(issuer.ledger.in_flight, frozenset())

    def test_limits(self) -> None:
        """Past the concurrency limit the request fails at once, counted, no order placed."""
        issuer, pool, blocking = self.make(
            {"a.one.example": [cert("a.one.example")], "b.two.example": [cert("b.two.example")]},
            Limits(per_domain_per_hour=5, concurrent=1),
        )
        first = issuer.issue("a.one.example")
        refused = self.failureResultOf(issuer.issue("b.two.example"), LimitReached)
        self.assertEqual(refused.value.refusal, Refusal.CONCURRENT)
        self.assertEqual(refused.value.retry_at, self.clock.seconds())
        self.assertEqual(issuer.stats.limited, {"concurrent": 1})
        pool.run_one()
        self.successResultOf(first)
        self.assertEqual(blocking.calls, ["a.one.example"])
        self.assertEqual(issuer.stats.placed, 1)

    def test_domain_rate_retry_at(self) -> None:
        """Past the hourly limit of a registered domain: refused with the
        time its hour frees a slot."""
        names = ["a.shop.example", "b.shop.example"]
        issuer, pool, _ = self.make({n: [cert(n)] for n in names}, Limits(per_domain_per_hour=1))
        first = issuer.issue(names[0])
        pool.run_one()
        self.successResultOf(first)
        self.clock.advance(600)
        refused = self.failureResultOf(issuer.issue(names[1]), LimitReached)
        self.assertEqual(refused.value.refusal, Refusal.DOMAIN_RATE)
        self.assertEqual(refused.value.retry_at, self.clock.seconds() + 3000)

    def test_failure_logged_once(self) -> None:
        """A name failing again and again: every request gets the error,
        the counters count each, the log says it once; after a success it
        may be said again."""
        issuer, pool, _ = self.make(
            {
                "a.shop.example": [
                    DirectoryUnreachable("ACME directory https://ca.test/dir unreachable: Connection refused"),
                    OrderRefused("a.shop.example: the CA refused the order: rateLimited"),
                    cert("a.shop.example"),
                    OrderRefused("a.shop.example: the CA refused the order: rateLimited"),
                ]
            },
            Limits(per_domain_per_hour=10),
        )
        for expected in (DirectoryUnreachable, OrderRefused):
            d = issuer.issue("a.shop.example")
            pool.run_one()
            self.failureResultOf(d, expected)
        self.assertEqual(len(self.errors_logged()), 1)
        self.assertIn("unreachable", self.errors_logged()[0]["reason"])
        self.assertEqual(issuer.stats.failed, {"unreachable": 1, "refused": 1})
        self.assertIn("rateLimited", issuer.stats.failing["a.shop.example"])
        d = issuer.issue("a.shop.example")
        pool.run_one()
        self.successResultOf(d)
        self.assertEqual(issuer.stats.failing, {})
        d = issuer.issue("a.shop.example")
        pool.run_one()
        self.failureResultOf(d, AcmeError)
        self.assertEqual(len(self.errors_logged()), 2)

    def test_unreachable_logged_once_for_all_names(self) -> None:
        """An unreachable CA: one log line whatever the number of names,
        each name's failure kept for /health; a success ends it."""
        down = DirectoryUnreachable("ACME directory https://ca.test/dir unreachable: Connection refused")
        names = [f"n{i}.shop{i}.example" for i in range(5)]
        issuer, pool, _ = self.make({n: [down, cert(n)] for n in names}, Limits(concurrent=5))
        ds = [issuer.issue(n) for n in names]
        for _ in names:
            pool.run_one()
        for d in ds:
            self.failureResultOf(d, DirectoryUnreachable)
        self.assertEqual(len(self.errors_logged()), 1)
        self.assertEqual(sorted(issuer.stats.failing), sorted(names))
        d = issuer.issue(names[0])
        pool.run_one()
        self.successResultOf(d)
        self.assertTrue(any("answers again" in str(e.get("log_format")) for e in self.logged))

    def test_unexpected_error(self) -> None:
        """An error that is not an AcmeError reaches the caller and the log (with its traceback)."""
        issuer, pool, _ = self.make({"a.shop.example": [RuntimeError("boom")]})
        d = issuer.issue("a.shop.example")
        pool.run_one()
        self.failureResultOf(d, RuntimeError)
        self.assertEqual(issuer.stats.failed, {"error": 1})
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_bad_name(self) -> None:
        issuer, _, _ = self.make({})
        from prexy.acme.policy import BadName

        self.assertRaises(BadName, issuer.issue, "../x")

    def test_settings(self) -> None:
        self.assertRaises(ValueError, IssuerSettings, directory="https://ca.test/dir", challenges=("dns-01",))
        self.assertRaises(ValueError, IssuerSettings, directory="https://ca.test/dir", challenges=())
        self.assertEqual(IssuerSettings(directory="x", challenges=["tls-alpn-01"]).challenges, ("tls-alpn-01",))
