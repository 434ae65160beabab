"""The decisions of automatic certificates without I/O: which names may be
issued (exact hosts, wildcards only after an ask check, never a name no
site serves), when to renew (two thirds of the lifetime, jittered within
bounds), the retry backoff, the limits per registered domain per hour and
in flight, and registered domains by the Public Suffix List."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.acme.policy import (
    HOUR,
    Backoff,
    BadName,
    Ledger,
    Limits,
    NamePolicy,
    PublicSuffixList,
    Refusal,
    Renewal,
    Verdict,
    last_two_labels,
    normalize_name,
    registered_domain_function,
)

SITES = {
    "shop": ["shop.example", "www.shop.example", "*.shop.example"],
    "fr": ["*.fr.shop.example"],
    "blog": ["blog.test"],
}

labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True)


class NameTests(SynchronousTestCase):
    """Names are normalised once; what is not a DNS name is refused with a reason."""

    def test_normalize(self) -> None:
        self.assertEqual(normalize_name("WWW.Shop.Example."), "www.shop.example")
        self.assertEqual(normalize_name(b"a.b"), "a.b")

    def test_bad(self) -> None:
        for bad in ["", "localhost", "a..b", "-a.b", "a-.b", "a_b.c", "1.2.3.4", "é.example", b"\xff.x", "a." * 127 + "b"]:
            with self.assertRaises(BadName, msg=repr(bad)):
                normalize_name(bad)

    @given(st.lists(labels, min_size=2, max_size=5))
    def test_idempotent(self, parts: list[str]) -> None:
        name = ".".join(parts)
        if parts[-1].isdigit():
            self.assertRaises(BadName, normalize_name, name)
            return
        once = normalize_name(name.upper() + ".")
        self.assertEqual(once, name)
        self.assertEqual(normalize_name(once), once)


class NamePolicyTests(SynchronousTestCase):
    """Exact hosts are issued; names under a wildcard only after the ask
    check; a name no site serves never."""

    def setUp(self) -> None:
        self.policy = NamePolicy.of(SITES, ask=True)

    def test_listed(self) -> None:
        self.assertEqual(self.policy.listed(), ("blog.test", "shop.example", "www.shop.example"))

    def test_exact(self) -> None:
        d = self.policy.decide("WWW.shop.example")
        self.assertEqual((d.verdict, d.name, d.site, d.host), (Verdict.ISSUE, "www.shop.example", "shop", "www.shop.example"))
        self.assertTrue(d.may_issue)

    def test_wildcard_asks(self) -> None:
        d = self.policy.decide("new.shop.example")
        self.assertEqual((d.verdict, d.site, d.host), (Verdict.ASK, "shop", "*.shop.example"))
        self.assertFalse(d.may_issue)
        self.assertTrue(d.served)
        self.assertTrue(NamePolicy.after_ask(d, True).may_issue)
        denied = NamePolicy.after_ask(d, False)
        self.assertEqual(denied.verdict, Verdict.DENIED)
        self.assertFalse(denied.served)

    def test_longest_wildcard(self) -> None:
        d = self.policy.decide("a.b.fr.shop.example")
        self.assertEqual((d.site, d.host), ("fr", "*.fr.shop.example"))

    def test_wildcard_without_ask(self) -> None:
        policy = NamePolicy.of(SITES, ask=False)
        self.assertEqual(policy.decide("new.shop.example").verdict, Verdict.NO_ASK)
        self.assertEqual(policy.decide("shop.example").verdict, Verdict.ISSUE)

    def test_unserved(self) -> None:
        for name in ["example", "other.example", "xshop.example", "fr.shop.example.evil"]:
            d = self.policy.decide(name)
            self.assertIn(d.verdict, (Verdict.UNSERVED, Verdict.BAD_NAME), name)
            self.assertFalse(d.served)
            self.assertIsNone(d.site)
        self.assertEqual(self.policy.decide(b"\xff\xfe").verdict, Verdict.BAD_NAME)

    def test_after_ask_only_for_ask(self) -> None:
        self.assertRaises(ValueError, NamePolicy.after_ask, self.policy.decide("shop.example"), True)

    def test_bad_host_in_config(self) -> None:
        self.assertRaises(BadName, NamePolicy.of, {"s": ["*.x_y.example"]}, ask=False)

    @given(st.lists(labels, min_size=1, max_size=3), st.lists(labels, min_size=2, max_size=3))
    def test_served_only_when_a_host_covers_it(self, head: list[str], tail: list[str]) -> None:
        """Any name: issued or asked only when it is a listed host or ends in
        a wildcard's suffix."""
        name = ".".join(head + tail)
        d = self.policy.decide(name)
        covered = name in ("shop.example", "www.shop.example", "blog.test") or name.endswith(".shop.example")
        self.assertEqual(d.served, covered and d.verdict is not Verdict.BAD_NAME)


class RenewalTests(SynchronousTestCase):
    """Renewal falls at two thirds of the lifetime, within the jitter."""

    def test_middle(self) -> None:
        self.assertAlmostEqual(Renewal().due(1000.0, 1000.0 + 90 * 86400, lambda: 0.5), 1000.0 + 60 * 86400)

    @given(st.floats(0, 1e9), st.floats(1, 1e8), st.floats(0, 1, exclude_max=True))
    def test_bounds(self, start: float, lifetime: float, r: float) -> None:
        due = Renewal().due(start, start + lifetime, lambda: r)
        self.assertGreaterEqual(due, start + lifetime * (2 / 3 - 1 / 30) - 1e-6)
        self.assertLessEqual(due, start + lifetime * (2 / 3 + 1 / 30) + 1e-6)
        self.assertLess(due, start + lifetime)

    def test_invalid(self) -> None:
        self.assertRaises(ValueError, Renewal, fraction=1.0)
        self.assertRaises(ValueError, Renewal, jitter=0.5)


class BackoffTests(SynchronousTestCase):
    """Retries double from the first delay up to the cap, between half and all of it."""

    def test_doubles_to_cap(self) -> None:
        b = Backoff(first=60, most=600)
        self.assertEqual([b.delay(n, lambda: 1.0) for n in range(1, 7)], [60, 120, 240, 480, 600, 600])
        self.assertEqual(b.delay(3, lambda: 0.0), 120)
        self.assertEqual(b.delay(10**6, lambda: 1.0), 600)

    def test_zero(self) -> None:
        self.assertRaises(ValueError, Backoff().delay, 0, lambda: 0.0)

    @given(st.integers(1, 10**4), st.floats(0, 1, exclude_max=True))
    def test_bounds(self, n: int, r: float) -> None:
        d = Backoff().delay(n, lambda: r)
        self.assertGreaterEqual(d, 30)
        self.assertLessEqual(d, 6 * 3600)


class LedgerTests(SynchronousTestCase):
    """Orders are admitted within the limits, counted per registered domain
    over a sliding hour, and never twice at once for a name."""

    def ledger(self, per_hour: int = 2, concurrent: int = 2) -> Ledger:
        return Ledger(Limits(per_domain_per_hour=per_hour, concurrent=concurrent), last_two_labels)

    def test_in_flight(self) -> None:
        ledger = self.ledger()
        self.assertIsNone(ledger.admit("a.shop.example", 0))
        self.assertEqual(ledger.admit("a.shop.example", 1), Refusal.IN_FLIGHT)
        self.assertEqual(ledger.in_flight, {"a.shop.example"})
        ledger.finished("a.shop.example")
        self.assertEqual(ledger.in_flight, frozenset())

    def test_concurrent(self) -> None:
        ledger = self.ledger(per_hour=10, concurrent=2)
        self.assertIsNone(ledger.admit("a.one.example", 0))
        self.assertIsNone(ledger.admit("b.two.example", 0))
        self.assertEqual(ledger.admit("c.three.example", 0), Refusal.CONCURRENT)
        ledger.finished("a.one.example")
        self.assertIsNone(ledger.admit("c.three.example", 0))

    def test_domain_rate_slides(self) -> None:
        ledger = self.ledger(per_hour=2, concurrent=10)
        self.assertIsNone(ledger.admit("a.shop.example", 0))
        self.assertIsNone(ledger.admit("b.shop.example", 100))
        ledger.finished("a.shop.example")
        self.assertEqual(ledger.admit("c.shop.example", 200), Refusal.DOMAIN_RATE)
        self.assertEqual(ledger.admit("a.shop.example", 200), Refusal.DOMAIN_RATE)
        self.assertIsNone(ledger.admit("x.other.example", 200))
        self.assertEqual(ledger.next_slot("c.shop.example", 200), HOUR)
        self.assertEqual(ledger.next_slot("c.other2.example", 200), 200)
        self.assertEqual(ledger.admit("c.shop.example", HOUR - 1), Refusal.DOMAIN_RATE)
        self.assertIsNone(ledger.admit("c.shop.example", HOUR))

    @given(st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["x.example", "y.example"]), st.floats(0, 50), st.booleans()), max_size=60))
    def test_never_over_limits(self, steps: list[tuple[str, str, float, bool]]) -> None:
        """Whatever the sequence of requests and completions, no hour holds
        more orders per domain than the limit, and no more are in flight
        than allowed."""
        limits = Limits(per_domain_per_hour=3, concurrent=2)
        ledger = Ledger(limits, last_two_labels)
        now = 0.0
        admitted: list[tuple[float, str]] = []
        for head, domain, dt, finish in steps:
            now += dt * 60
            name = f"{head}.{domain}"
            if ledger.admit(name, now) is None:
                admitted.append((now, domain))
            self.assertLessEqual(len(ledger.in_flight), limits.concurrent)
            if finish:
                ledger.finished(name)
        for t, domain in admitted:
            in_hour = [u for u, d in admitted if d == domain and t <= u < t + HOUR]
            self.assertLessEqual(len(in_hour), limits.per_domain_per_hour)


PSL_SAMPLE = """// comment
com
uk
co.uk
*.ck
!www.ck
// ===BEGIN PRIVATE DOMAINS===
github.io
食狮.com.cn
"""


class PublicSuffixTests(SynchronousTestCase):
    """Registered domains follow the list's rules: plain, wildcard, exception, default."""

    def setUp(self) -> None:
        self.psl = PublicSuffixList.parse(PSL_SAMPLE.splitlines())

    def test_rules(self) -> None:
        cases = {
            "shop.example.com": "example.com",
            "fr.shop.example.co.uk": "example.co.uk",
            "a.b.c.ck": "b.c.ck",
            "www.ck": "www.ck",
            "x.www.ck": "www.ck",
            "me.github.io": "me.github.io",
            "a.me.github.io": "me.github.io",
            "a.b.unlisted": "b.unlisted",
            "co.uk": "co.uk",
        }
        for name, expected in cases.items():
            self.assertEqual(self.psl.registered_domain(name), expected, name)

    def test_unicode_rule(self) -> None:
        self.assertIn("xn--85x722f.com.cn", self.psl.rules)

    def test_last_two_labels(self) -> None:
        self.assertEqual(last_two_labels("fr.shop.example.co.uk"), "co.uk")

    def test_function_falls_back(self) -> None:
        self.assertIs(registered_domain_function(Path("/nonexistent/psl.dat")), last_two_labels)
        self.assertIs(registered_domain_function(None), last_two_labels)

    def test_debian_list(self) -> None:
        """Debian's list, when installed, knows co.uk."""
        path = Path("/usr/share/publicsuffix/public_suffix_list.dat")
        if not path.exists():
            raise self.skipTest("Debian's publicsuffix is not installed")
        self.assertEqual(registered_domain_function(path)("fr.shop.example.co.uk"), "example.co.uk")
