"""Per-site and per-rule counters: one process's ``Observer`` and the sum
over processes (``Aggregate``), and their Prometheus exposition."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from twisted.trial.unittest import SynchronousTestCase

from prexy.metrics import Metrics, render
from prexy.observe.stats import (
    LAST_ERRORS,
    LATENCY_BOUNDS,
    TOP_URLS,
    Aggregate,
    Observer,
    rule_labels,
)
from prexy.substitution.rules import parse_rules


def ruleset(text: str = "replace_filter 'old' 'new' g;\nreplace_filter 'x+' 'y';\nreplace_filter 'zz' 'q' g;\n"):
    return parse_rules(text.encode(), "/etc/prexy/site.rules")


class Request:
    """What ``Observer.answered`` reads of a finished request."""

    def __init__(self, site: str = "shop", code: int = 200, sent: int = 100, cache: str = "miss",
                 started: float = 0.0, upstream: float | None = 0.01, bytes_in: int = 90, rewrite: Any = None,
                 method: bytes = b"GET", uri: bytes = b"/page") -> None:
        self.site_name = site
        self.code = code
        self.sentLength = sent
        self.cache_status = cache
        self.started = started
        self.upstream_seconds = upstream
        self.bytes_in = bytes_in
        self.rewrite = rewrite
        self.method = method
        self.uri = uri


class Transducer:
    """What the counters read of a finished rewrite."""

    def __init__(self, rules: Any, counts: dict[int, int], changed: dict[int, int] | None = None,
                 stopped_by: int | None = None, bailed_out: bool = False, timed_out: bool = False) -> None:
        n = len(rules.rules)
        self.ruleset = rules
        self.rule_counts = [counts.get(i, 0) for i in range(n)]
        self.rule_bytes = [(changed or {}).get(i, 0) for i in range(n)]
        self.rules_matched = {i for i, c in counts.items() if c}
        self.stopped_by = stopped_by
        self.bailed_out = bailed_out
        self.timed_out = timed_out
        self.scan_seconds = 0.002
        self.max_held = 0


class ObserverTests(SynchronousTestCase):
    def test_answered_counts_a_site(self) -> None:
        o = Observer()
        o.answered(Request(code=200, sent=100, cache="hit", started=1.0), 1.0003)
        o.answered(Request(code=404, sent=10, cache="miss", started=1.0), 1.02)
        o.answered(Request(code=502, sent=5, cache="-", started=1.0, upstream=None, uri=b"/x"), 1.5)
        s = o.sites["shop"]
        self.assertEqual((sum(s.classes), s.bytes_out, s.bytes_in), (3, 115, 270))
        self.assertEqual(s.classes, [0, 0, 1, 0, 1, 1])
        self.assertEqual(s.as_list()[8], {"hit": 1, "miss": 1, "pass": 1})
        # 0.3 ms -> the 0.5 ms bucket of hits; 20 ms -> 25 ms of misses; 0.5 s -> pass.
        self.assertEqual(s.latency[0][LATENCY_BOUNDS.index(0.0005)], 1)
        self.assertEqual(s.latency[1][LATENCY_BOUNDS.index(0.025)], 1)
        self.assertEqual(s.latency[2][LATENCY_BOUNDS.index(0.5)], 1)
        self.assertEqual([e["status"] for e in s.errors], [502])
        self.assertEqual(s.errors[0]["kind"], "upstream")
        self.assertEqual(s.upstream_errors, 1)
        self.assertEqual(set(o.report()["sites"]), {"shop"})
        self.assertEqual(o.report(), {"sites": {}, "rules": {}})

    def test_last_errors_are_bounded(self) -> None:
        o = Observer()
        for i in range(LAST_ERRORS + 5):
            o.answered(Request(code=500, uri=b"/e%d" % i), float(i))
        errors = o.sites["shop"].errors
        self.assertEqual(len(errors), LAST_ERRORS)
        self.assertEqual(errors[-1]["url"], f"/e{LAST_ERRORS + 4}")

    def test_rewritten_counts_per_rule_once_per_response(self) -> None:
        rules = ruleset()
        o = Observer()
        o.rewritten("shop", rules, Transducer(rules, {0: 3, 2: 1}, {0: 9, 2: 2}), 10.0)
        o.rewritten("shop", rules, Transducer(rules, {0: 1}, {0: 3}), 11.0)
        o.rewritten("shop", rules, None, 12.0)  # skipped: no rule can match
        r = o.rules["shop"]
        self.assertEqual(r.rewritten, 3)
        self.assertEqual(r.matches, [4, 0, 1])
        self.assertEqual(r.responses, [2, 0, 1])
        self.assertEqual(r.bytes, [12, 0, 2])
        self.assertEqual(r.last, [11.0, 0.0, 10.0])
        self.assertEqual(r.fired_at, [2, 0, 1])
        self.assertEqual(o.sites["shop"].rewritten, 3)

    def test_bailouts_and_timeouts_by_rule(self) -> None:
        rules = ruleset()
        o = Observer()
        o.rewritten("shop", rules, Transducer(rules, {}, stopped_by=1, bailed_out=True), 1.0)
        o.rewritten("shop", rules, Transducer(rules, {}, stopped_by=2, timed_out=True), 1.0)
        o.rewritten("shop", rules, Transducer(rules, {}, stopped_by=None, timed_out=True), 1.0)
        r = o.rules["shop"]
        self.assertEqual((r.bailouts, r.timeouts), ([0, 1, 0], [0, 0, 1]))

    def test_a_new_rule_set_starts_again(self) -> None:
        o = Observer()
        first = ruleset()
        o.rewritten("shop", first, Transducer(first, {0: 1}), 1.0)
        second = ruleset("replace_filter 'a' 'b' g;\n")
        o.rewritten("shop", second, Transducer(second, {0: 2}), 2.0)
        self.assertEqual(o.rules["shop"].matches, [2])
        self.assertEqual(o.rules["shop"].labels, [["/etc/prexy/site.rules", 1, "a", "g"]])

    def test_report_says_the_sites_that_changed_and_labels_once(self) -> None:
        rules = ruleset()
        o = Observer()
        o.answered(Request(site="a"), 1.0)
        o.rewritten("a", rules, Transducer(rules, {0: 1}), 1.0)
        first = o.report()
        self.assertEqual(set(first["sites"]), {"a"})
        self.assertIn("labels", first["rules"]["a"])
        self.assertEqual(o.report(), {"sites": {}, "rules": {}})
        o.answered(Request(site="b"), 2.0)
        o.rewritten("a", rules, Transducer(rules, {}), 2.0)
        second = o.report()
        self.assertEqual(set(second["sites"]), {"a", "b"})
        self.assertNotIn("labels", second["rules"]["a"])
        self.assertEqual(second["sites"]["a"][0], 1)  # cumulative: a lost report loses nothing

    def test_top_urls_are_bounded(self) -> None:
        o = Observer()
        rules = ruleset()
        for i in range(TOP_URLS * 3):
            o.answered(Request(uri=b"/p%d" % i, rewrite=Transducer(rules, {})), 1.0)
        for _ in range(5):
            o.answered(Request(uri=b"/hot", rewrite=Transducer(rules, {})), 1.0)
        o.answered(Request(uri=b"/post", method=b"POST", rewrite=Transducer(rules, {})), 1.0)
        o.answered(Request(uri=b"/plain"), 1.0)  # not rewritten: not a page for the dry run
        self.assertLessEqual(len(o.sites["shop"].urls), TOP_URLS)
        top = o.top_urls("shop", 3)
        self.assertEqual(top[0], ("/hot", 5))
        self.assertNotIn("/post", dict(o.top_urls("shop", TOP_URLS)))
        self.assertEqual(o.top_urls("nowhere", 3), [])

    def test_labels(self) -> None:
        self.assertEqual(rule_labels(ruleset()), [
            ["/etc/prexy/site.rules", 1, "old", "g"],
            ["/etc/prexy/site.rules", 2, "x+", ""],
            ["/etc/prexy/site.rules", 3, "zz", "g"],
        ])


def traffic(o: Observer, rules: Any, site: str, fired: list[dict[int, int]], start: float = 0.0) -> None:
    for k, counts in enumerate(fired):
        t = Transducer(rules, counts)
        o.rewritten(site, rules, t, start + k)
        o.answered(Request(site=site, rewrite=t), start + k)


class AggregateTests(SynchronousTestCase):
    def test_sum_of_processes_and_of_the_ended(self) -> None:
        rules = ruleset()
        a, b = Observer(), Observer()
        traffic(a, rules, "shop", [{0: 2}, {2: 1}])
        traffic(b, rules, "shop", [{0: 1}])
        agg = Aggregate()
        agg.update(1, a.report())
        agg.update(2, b.report())
        report = agg.site_report("shop", 5.0, ["/etc/prexy/site.rules"])
        self.assertEqual(report["requests"], 3)
        self.assertEqual([r["matches"] for r in report["rules"]], [3, 0, 1])
        self.assertEqual([r["responses"] for r in report["rules"]], [2, 0, 1])
        self.assertEqual(report["rules"][0]["file"], "/etc/prexy/site.rules")
        self.assertEqual(report["rules"][1]["line"], 2)
        self.assertEqual(report["never_matched"], [2])
        agg.retire(1)
        again = agg.site_report("shop", 5.0)
        self.assertEqual(again["requests"], 3)
        self.assertEqual([r["matches"] for r in again["rules"]], [3, 0, 1])
        traffic(b, rules, "shop", [{1: 1}], start=10)
        agg.update(2, b.report())
        self.assertEqual([r["matches"] for r in agg.site_report("shop", 5.0)["rules"]], [3, 1, 1])

    def test_never_matched_in_the_window(self) -> None:
        rules = ruleset()
        for window, expected in ((3, [2, 3]), (8, [2, 3]), (9, [2]), (1000, [2])):
            o = Observer()
            # Rule 3 fires in the 2nd of 10 responses; rule 1 in the last.
            traffic(o, rules, "shop", [{}, {2: 1}] + [{}] * 7 + [{0: 1}])
            agg = Aggregate(window)
            agg.update("self", o.report())
            self.assertEqual(agg.site_report("shop", 0.0)["never_matched"], expected, window)

    def test_a_reload_with_new_rules_starts_the_rules_again(self) -> None:
        old, new = ruleset(), ruleset("replace_filter 'a' 'b' g;\nreplace_filter 'c' 'd' g;\n")
        a, b = Observer(), Observer()
        traffic(a, old, "shop", [{0: 1}])
        traffic(b, old, "shop", [{0: 1}])
        agg = Aggregate()
        agg.update(1, a.report())
        agg.update(2, b.report())
        traffic(a, new, "shop", [{1: 4}])
        agg.update(1, a.report())
        report = agg.site_report("shop", 0.0)
        self.assertEqual([(r["pattern"], r["matches"]) for r in report["rules"]], [("a", 0), ("c", 4)])
        traffic(b, new, "shop", [{0: 1}])
        agg.update(2, b.report())
        self.assertEqual(list(agg.views["shop"]), [new.digest])  # the old version went with its last process

    def test_top_sites_bound_the_label_sets(self) -> None:
        o = Observer()
        for i in range(10_000):
            o.answered(Request(site=f"site{i}", sent=1), 1.0)
        for _ in range(3):
            o.answered(Request(site="big", sent=1), 1.0)
        agg = Aggregate()
        agg.update("self", o.report())
        head, other = agg.top_sites(5)
        self.assertEqual(len(head), 5)
        self.assertEqual(head[0][0], "big")
        assert other is not None
        self.assertEqual(other[0], 10_003 - 3 - 4)
        text = render([Metrics()], observed=agg, top_sites=5).decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        sites = {s.labels["site"] for s in families["prexy_site_requests"].samples}
        self.assertEqual(len(sites), 6)
        self.assertIn("other", sites)
        total = sum(s.value for s in families["prexy_site_requests"].samples)
        self.assertEqual(total, 10_003)

    def test_exposition(self) -> None:
        rules = ruleset()
        o = Observer()
        traffic(o, rules, 'sh"op', [{0: 2}, {2: 1}])
        agg = Aggregate()
        agg.update("self", o.report())
        m = Metrics()
        m.count_answer(200, b"HTTP/1.1")
        m.observe_upstream(0.02)
        m.gauges["prexy_open_connections"] = 3
        text = render([m], {"prexy_workers": 2.0}, observed=agg, processes=[("self", __import__("os").getpid())])
        families = {f.name: f for f in text_string_to_metric_families(text.decode())}
        self.assertEqual(families["prexy_build_info"].samples[0].value, 1)
        matches = {(s.labels["site"], s.labels["rule"]): s.value for s in families["prexy_rule_matches"].samples
                   if s.name.endswith("_total")}
        self.assertEqual(matches, {('sh"op', "1"): 2, ('sh"op', "2"): 0, ('sh"op', "3"): 1})
        self.assertEqual(families["prexy_open_connections"].samples[0].value, 3)
        self.assertIn("prexy_request_seconds", families)
        self.assertIn("prexy_rewrite_seconds", families)
        self.assertGreater(families["prexy_process_resident_memory_bytes"].samples[0].value, 0)
        for family in families.values():
            self.assertNotEqual(family.documentation, family.name, f"{family.name} has no HELP text")
