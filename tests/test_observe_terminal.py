"""The operator's views as text (prexy.observe.terminal): the admin JSON
in, lines out; rates from two snapshots; terminals of 80 and 200 columns."""

from __future__ import annotations

import copy
from datetime import UTC
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.observe.terminal import (
    FilterError,
    check_regex,
    clean,
    cut,
    dropped_note,
    duration_param,
    format_record,
    parse_duration,
    parse_status,
    rates,
    render_hist,
    render_report,
    render_top,
)
from tests.cases import expand, parametrize

BOUNDS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
LONG_FILE = "/etc/prexy/sites.d/a-very-long-directory-name-for-the-shop-site/shop-rules-2026.rules"
LONG_SITE = "a-site-with-a-very-long-name-indeed.example.org"


def record(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "time": 1764900000.123, "site": "shop", "method": "GET", "url": "/a?b=1", "status": 200,
        "protocol": "HTTP/1.1", "client": "127.0.0.1", "cache": "miss", "upstream_first_byte": 0.0123,
        "rewrite": 0.0021, "total": 0.0201, "bytes_in": 20480, "bytes_out": 20511, "rules": [1, 3], "held": 0,
        "bailout": False, "timeout": False,
    }
    base.update(over)
    return base


def snapshot(k: int, sites: int = 2, rules: int = 30) -> dict[str, Any]:
    """The k-th of snapshots one second apart: per second 120 requests (90
    hits, 27 misses, 3 passes), 2 4xx, 1.5 MB out."""
    hits = [100, 800, 1500, 400, 100, 50, 10, 5, 0, 0, 0, 0, 0, 0]
    misses = [0, 0, 0, 10, 100, 300, 200, 150, 80, 40, 10, 5, 3, 2]
    return {
        "time": 1764900000.5 + k,
        "requests": 5000 + 120 * k,
        "by_class": {"2xx": 4900 + 118 * k, "3xx": 50, "4xx": 40 + 2 * k, "5xx": 10},
        "cache": {"hit": 3000 + 90 * k, "miss": 900 + 27 * k, "pass": 100 + 3 * k},
        "bytes_out": 123_000_000 + 1_500_000 * k,
        "upstream_errors": 2,
        "latency": {
            "bounds": BOUNDS,
            "hit": [h * (1 + k) for h in hits],
            "miss": [m * (1 + k) for m in misses],
            "pass": [0] * 14,
        },
        "sites": [
            {"site": "shop", "requests": 4000 + 100 * k, "hit": 2500 + 80 * k, "miss": 800 + 20 * k,
             "errors": 30 + 2 * k, "bytes_out": 100_000_000 + 1_200_000 * k},
            {"site": LONG_SITE, "requests": 1000 + 20 * k, "hit": 500 + 10 * k, "miss": 100, "errors": 20,
             "bytes_out": 23_000_000 + 300_000 * k},
        ][:sites],
        "rules": [
            {"site": "shop", "number": i, "file": LONG_FILE, "line": 2 * i + 1, "matches": 1000 * i + 10 * i * k,
             "responses": 40 * i + k}
            for i in range(1, rules + 1)
        ],
    }


class RecordLineTests(SynchronousTestCase):
    """``prexy log``'s line: every field of a request record, in order."""

    def test_every_field(self) -> None:
        """Time (ms), site, method, URL, status, cache, the three times in
        ms, bytes in and out, the rules that fired and the bytes held."""
        self.assertEqual(
            format_record(record(), tz=UTC),
            "02:00:00.123 shop GET /a?b=1 200 miss upstream=12.3ms rewrite=2.10ms total=20.1ms"
            " in=20480 out=20511 rules=1,3 held=0",
        )

    def test_marks_and_held(self) -> None:
        """A bail-out and a timeout are marked at the end; held bytes shown."""
        line = format_record(record(held=4096, bailout=True, timeout=True), tz=UTC)
        self.assertTrue(line.endswith(" held=4096 BAILOUT TIMEOUT"), line)
        self.assertTrue(format_record(record(bailout=True), tz=UTC).endswith(" held=0 BAILOUT"))

    def test_unknowns(self) -> None:
        """A request that never reached an upstream, rewrote nothing and was
        refused before routing: ``-`` where nothing is known."""
        line = format_record(record(site="-", cache="-", upstream_first_byte=None, rewrite=None, rules=[],
                                    status=400, total=0.25), tz=UTC)
        self.assertIn(" - GET /a?b=1 400 - upstream=-ms rewrite=-ms total=250.0ms ", line)
        self.assertIn(" rules=- ", line)

    def test_slow_total(self) -> None:
        """Seconds-long times are whole milliseconds."""
        self.assertIn("total=2501ms", format_record(record(total=2.5011), tz=UTC))

    def test_missing_keys(self) -> None:
        """A record with fields missing (another version of Prexy) still
        prints, ``-`` in their place."""
        self.assertIn(" rules=- ", format_record(record(rules=None), tz=UTC))
        self.assertIn(" rules=- ", format_record(record(rules=3), tz=UTC))
        line = format_record({"url": "/x"}, tz=UTC)
        self.assertEqual(line, "--:--:--.--- - - /x - - upstream=-ms rewrite=-ms total=-ms in=- out=- rules=- held=0")

    def test_control_characters_escaped(self) -> None:
        """A URL holding an escape sequence or a newline cannot drive the
        terminal nor split the line."""
        line = format_record(record(url="/a\x1b[2J\nb\x9b"), tz=UTC)
        self.assertIn(" /a\\x1b[2J\\x0ab\\x9b ", line)
        self.assertNotIn("\x1b", line)
        self.assertNotIn("\n", line)

    def test_long_url_whole(self) -> None:
        """The log's lines are for grep: a long URL is printed whole."""
        url = "/" + "x" * 3000
        self.assertIn(url, format_record(record(url=url), tz=UTC))

    def test_dropped(self) -> None:
        """A ``dropped`` line is a note; a record is not."""
        self.assertEqual(dropped_note({"dropped": 7}), "7 records dropped: this reader fell behind")
        self.assertEqual(dropped_note({"dropped": 1}), "1 record dropped: this reader fell behind")
        self.assertIsNone(dropped_note(record()))


@expand
class FilterTests(SynchronousTestCase):
    """The filters of ``prexy log``, checked before anything is asked."""

    @parametrize("text,seconds", {
        "ms": ("200ms", 0.2), "s": ("1.5s", 1.5), "us": ("500us", 0.0005), "m": ("2m", 120.0),
        "upper": ("3MS", 0.003), "spaced": (" 20 ms ", 0.02), "dot": (".5s", 0.5),
    })
    def test_durations(self, text: str, seconds: float) -> None:
        self.assertAlmostEqual(parse_duration(text), seconds)

    @parametrize("text", {"bare": "200", "unit": "2h", "empty": "", "word": "fast", "negative": "-1s"})
    def test_bad_durations(self, text: str) -> None:
        with self.assertRaises(FilterError) as caught:
            parse_duration(text)
        self.assertIn("is not a duration", str(caught.exception))

    def test_duration_param(self) -> None:
        """Sent to the admin endpoint in ms, without float noise."""
        self.assertEqual(duration_param(parse_duration("1.5s")), "1500ms")
        self.assertEqual(duration_param(parse_duration("200ms")), "200ms")
        self.assertEqual(duration_param(parse_duration("500us")), "0.5ms")
        self.assertEqual(duration_param(parse_duration("0.05us")), "0.00005ms")  # never 5e-05ms
        self.assertEqual(duration_param(parse_duration("2m")), "120000ms")

    def test_statuses(self) -> None:
        self.assertEqual([parse_status(t) for t in ("5xx", "4XX", "404", " 200 ")], ["5xx", "4xx", "404", "200"])
        for bad in ("6xx", "xx", "99", "600", "5x", "2000", ""):
            self.assertRaises(FilterError, parse_status, bad)

    def test_regex(self) -> None:
        self.assertEqual(check_regex("^/a/(b|c)"), "^/a/(b|c)")
        with self.assertRaises(FilterError) as caught:
            check_regex("(")
        self.assertIn("is not a regular expression", str(caught.exception))

    def test_cut_and_clean(self) -> None:
        self.assertEqual(cut("abcdef", 4), "abc~")
        self.assertEqual(cut("abc", 4), "abc")
        self.assertEqual(cut("abc", 0), "")
        self.assertEqual(clean("a\tb\x7f"), "a\\x09b\\x7f")


class RatesTests(SynchronousTestCase):
    """Rates are differences over the time between two snapshots."""

    def test_rates(self) -> None:
        r = rates(snapshot(0), snapshot(2))
        self.assertEqual(r.elapsed, 2.0)
        self.assertEqual(r.requests, 120.0)
        self.assertEqual(r.by_class, {"2xx": 118.0, "3xx": 0.0, "4xx": 2.0, "5xx": 0.0})
        self.assertEqual(r.cache, {"hit": 90.0, "miss": 27.0, "pass": 3.0})
        self.assertEqual(r.bytes_out, 1_500_000.0)
        self.assertEqual(r.upstream_errors, 0.0)
        self.assertEqual(r.hit_rate, 90 / 117)  # hits among lookups (hits and misses); passes are none

    def test_no_lookups(self) -> None:
        """Only passes and requests with no cache: no hit rate, not 0%."""
        prev, cur = snapshot(0), snapshot(1)
        for snap in (prev, cur):
            snap["cache"] = {"hit": 0, "miss": 0, "pass": snap["requests"]}
        self.assertIsNone(rates(prev, cur).hit_rate)
        self.assertIn("hit rate - (since start -)", render_top(prev, cur, 80, 24)[1])

    def test_no_previous(self) -> None:
        r = rates(None, snapshot(0))
        self.assertIsNone(r.requests)
        self.assertIsNone(r.hit_rate)

    def test_restart(self) -> None:
        """Counters that went back (another process answers): no rates."""
        self.assertIsNone(rates(snapshot(5), snapshot(6) | {"requests": 3}).requests)
        self.assertIsNone(rates(snapshot(1), snapshot(0)).requests)

    def test_idle(self) -> None:
        """No traffic between the polls: zero rates, no hit rate."""
        r = rates(snapshot(1), snapshot(1) | {"time": snapshot(2)["time"]})
        self.assertEqual(r.requests, 0.0)
        self.assertIsNone(r.hit_rate)


@expand
class TopTests(SynchronousTestCase):
    """``prexy top``'s screen."""

    @parametrize("width,height", [(80, 24), (200, 40), (80, 60), (200, 12)])
    def test_fits(self, width: int, height: int) -> None:
        """No line wider than the terminal, no more lines than its rows."""
        lines = render_top(snapshot(0), snapshot(1), width, height, source="http://127.0.0.1:9080", interval=1)
        self.assertLessEqual(len(lines), height)
        self.assertLessEqual(max(len(line) for line in lines), width)

    def test_figures(self) -> None:
        lines = render_top(snapshot(0), snapshot(1), 80, 24, source="http://127.0.0.1:9080", interval=1, tz=UTC)
        self.assertEqual(lines[0], "prexy top  http://127.0.0.1:9080  02:00:01  every 1s")
        self.assertEqual(lines[1], "requests  120/s  total 5.1k   hit rate 76.9% (since start 76.9%)")
        self.assertEqual(lines[2], "cache/s   hit 90  miss 27  pass 3")
        self.assertEqual(lines[3], "status/s  2xx 118  3xx 0  4xx 2  5xx 0  upstream errors 0")
        self.assertEqual(lines[4], "bytes out 1.5MB/s  total 124.5MB")
        shop = next(line for line in lines if line.startswith("shop "))
        self.assertEqual(shop.split(), ["shop", "100", "80.0%", "2", "1.2M", "4.1k"])

    def test_uptime(self) -> None:
        """A snapshot that says when the server started gives the uptime."""
        cur = snapshot(1) | {"started": snapshot(1)["time"] - 2 * 86400 - 3723}
        self.assertEqual(render_top(snapshot(0), cur, 80, 24, tz=UTC)[0], "prexy top    02:00:01  up 2d 01:02:03")
        cur = snapshot(1) | {"started": snapshot(1)["time"] - 59}
        self.assertIn("  up 00:00:59", render_top(snapshot(0), cur, 80, 24, tz=UTC)[0])

    def test_busiest_first(self) -> None:
        """Rules by matches per second: rule 30 (300/s) first; all 30 do
        not fit 24 rows, so the slowest are left out."""
        lines = render_top(snapshot(0), snapshot(1), 80, 24)
        rules = [line for line in lines if line[:4].strip().isdigit()]
        self.assertEqual(rules[0].split()[:3], ["30", "shop", "300"])
        numbers = [int(line.split()[0]) for line in rules]
        self.assertEqual(numbers, sorted(numbers, reverse=True))
        self.assertLess(len(rules), 30)
        self.assertGreater(len(rules), 5)

    def test_long_names(self) -> None:
        """At 80 columns a long site name is cut (``~``) and a rule's file
        loses its start, keeping the name and line; at 200, both whole."""
        narrow = "\n".join(render_top(snapshot(0), snapshot(1), 80, 40))
        self.assertNotIn(LONG_SITE, narrow)
        self.assertIn(LONG_SITE[:10], narrow)
        self.assertIn("shop-rules-2026.rules:61", narrow)
        self.assertNotIn(LONG_FILE, narrow)
        wide = "\n".join(render_top(snapshot(0), snapshot(1), 200, 40))
        self.assertIn(LONG_SITE, wide)
        self.assertIn(LONG_FILE + ":61", wide)

    def test_new_site_has_no_rate(self) -> None:
        """A site missing from the older snapshot has no rate yet (``-``),
        not its whole count as if made in one interval."""
        lines = render_top(snapshot(0, sites=1), snapshot(1, sites=2), 200, 40)
        row = next(line for line in lines if line.startswith(LONG_SITE))
        self.assertEqual(row.split()[1:4], ["-", "-", "-"])

    def test_first_frame_and_empty(self) -> None:
        """Without an older snapshot, or with a Prexy that has served
        nothing, the screen says so instead of failing."""
        lines = render_top(None, snapshot(0), 80, 24)
        self.assertIn("requests  -/s  total 5.0k", lines[1])
        self.assertIn("(rates after the next poll)", lines)
        empty = render_top({"time": 1.0}, {"time": 2.0}, 80, 24)
        self.assertIn("(no site has answered yet)", empty)
        self.assertIn("(no rule has matched yet)", empty)
        self.assertEqual(render_top(None, {}, 80, 24)[1], "requests  -/s  total 0   hit rate - (since start -)")

    def test_tiny_terminal(self) -> None:
        """A terminal too short for the tables shows the totals alone."""
        lines = render_top(snapshot(0), snapshot(1), 40, 5)
        self.assertEqual(len(lines), 5)
        self.assertLessEqual(max(map(len, lines)), 40)

    def test_site_names_escaped(self) -> None:
        cur = copy.deepcopy(snapshot(1))
        cur["sites"][0]["site"] = "evil\x1b]0;x\x07"
        prev = copy.deepcopy(snapshot(0))
        prev["sites"][0]["site"] = cur["sites"][0]["site"]
        self.assertNotIn("\x1b", "".join(render_top(prev, cur, 200, 40)))


@expand
class HistTests(SynchronousTestCase):
    """``prexy hist``'s screen."""

    @parametrize("width,height", [(80, 24), (200, 40), (60, 10)])
    def test_fits(self, width: int, height: int) -> None:
        lines = render_hist(snapshot(0), snapshot(1), width, height)
        self.assertLessEqual(len(lines), height)
        self.assertLessEqual(max(len(line) for line in lines), width)

    def test_interval_counts(self) -> None:
        """The histogram is of the interval (bucket counts differenced):
        one snapshot's counts again make the same picture; hits ``|`` fill
        the fast buckets, misses ``#`` the slow ones."""
        lines = render_hist(snapshot(0), snapshot(1), 80, 24, tz=UTC)
        self.assertEqual(lines[0], "prexy hist    02:00:01  last 1.0s: 3865 requests")
        self.assertEqual(lines[1], "| 2965 hits   # 900 misses and passes")
        self.assertEqual(lines[2], "one row = 100 requests   p50 <=5ms p90 <=100ms p99 <=1000ms")
        self.assertEqual(lines[3:], render_hist(None, snapshot(0), 80, 24, tz=UTC)[3:])
        bars = lines[3:-2]
        column = 5  # (80 - gutter 5 - 1) // 14 buckets
        start = 5
        fast = "".join(row[start + 2 * column] if len(row) > start + 2 * column else " " for row in bars)
        slow = "".join(row[start + 5 * column] if len(row) > start + 5 * column else " " for row in bars)
        self.assertEqual(set(fast.strip()), {"|"})  # 2.5-5 ms: 1500 hits, no miss
        self.assertEqual(fast.count("|"), 15)  # 1500 / 100
        self.assertEqual(set(slow.strip()), {"|", "#"})  # 25-50 ms: 50 hits over 300 misses
        self.assertEqual(slow.count("#"), 3)
        self.assertTrue(slow.strip().startswith("|"))

    def test_axis(self) -> None:
        """Buckets labelled by their upper bound in ms, log-spaced as the
        bounds are; the last is open."""
        labels = render_hist(snapshot(0), snapshot(1), 80, 24)[-1]
        self.assertEqual(labels.split(), ["1", "2.5", "5", "10", "25", "50", "100", "250", "500", "1000",
                                          "2500", "5000", "10k", ">10k", "ms"])

    def test_scale_fits_the_height(self) -> None:
        """The tallest bar is more than 40% of the rows (the scale steps 1,
        2, 5, 10...), and no taller than them, whatever the height."""
        for height in (10, 24, 50):
            lines = render_hist(snapshot(0), snapshot(1), 80, height)
            bars = lines[3:-2]
            self.assertEqual(len(bars), height - 5)
            tallest = max(sum(1 for row in bars if len(row) > 5 + i and row[5 + i] != " ") for i in range(70))
            self.assertGreater(tallest, 0.4 * len(bars), height)

    def test_empty(self) -> None:
        self.assertEqual(render_hist(None, {}, 80, 24)[2], "(no latency histogram to show)")
        quiet = render_hist(snapshot(1), snapshot(1) | {"time": snapshot(2)["time"]}, 80, 24)
        self.assertIn("0 requests", quiet[0])
        self.assertIn("one row = 1 request ", quiet[2])

    def test_restart(self) -> None:
        """Counts that went back: the new process's counts since its start."""
        lines = render_hist(snapshot(3), snapshot(0) | {"time": snapshot(4)["time"]}, 80, 24)
        self.assertIn("since start", lines[0])


class ReportTests(SynchronousTestCase):
    """The dry run's report as text."""

    REPORT: dict[str, Any] = {
        "site": "shop", "pages": 50, "fetched": 48, "failed": [{"url": "/x", "error": "502"}], "changed": 12,
        "rules": {
            "current": [{"number": 1, "file": "shop.rules", "line": 3, "pattern": "old\\.example",
                         "occurrences": 120, "pages": 40},
                        {"number": 2, "file": "shop.rules", "line": 4, "pattern": "never", "occurrences": 0,
                         "pages": 0}],
            "draft": [{"number": 1, "file": "draft.rules", "line": 3, "pattern": "new\\.example",
                       "occurrences": 118, "pages": 39}],
        },
        "never_matching": {"current": [2], "draft": []},
        "diffs": [{"url": "/a", "lines": ["- <a href=old>", "+ <a href=new>"]}],
    }

    def test_text(self) -> None:
        text = render_report(self.REPORT)
        self.assertTrue(text.startswith("dry run on site shop: 50 pages asked, 48 fetched, 12 changed by the draft\n"))
        self.assertIn("not fetched: /x (502)\n", text)
        self.assertIn("current rules:\n", text)
        self.assertIn("       1         120    40  shop.rules:3  old\\.example\n", text)
        self.assertIn("    matching nothing: 2\n", text)
        self.assertIn("draft rules:\n", text)
        self.assertIn("    matching nothing: none\n", text)
        self.assertIn("first differences:\n  /a\n    - <a href=old>\n    + <a href=new>\n", text)

    def test_sparse(self) -> None:
        """A report with parts missing still prints."""
        text = render_report({"site": "shop"})
        self.assertIn("0 pages asked", text)
        self.assertIn("(no rules)", text)
