"""``prexy.observe.page``: the admin's site page and list of sites, parsed
whole as XML (the pages are XHTML-compatible) and read by their ids and
classes: escaping of every report value, the never-matching rules marked,
a site with no traffic (no division by zero, an empty histogram), number
formats, the histogram's bars, the page's self-containment."""

from __future__ import annotations

import copy
import html.parser
import re
import xml.etree.ElementTree as ET
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.observe import page
from prexy.observe.page import (
    CONTENT_SECURITY_POLICY,
    bound_label,
    count,
    count_axis,
    duration,
    esc,
    site_page,
    sites_index,
    size,
)
from tests.sitereports import BOUNDS, GENERATED, busy_report, quiet_report
from tests.test_imports import import_graph, module_files, reachable, top_level_imports

X = "{http://www.w3.org/1999/xhtml}"
S = "{http://www.w3.org/2000/svg}"


def parse(document: bytes) -> ET.Element:
    """The page as an XML tree (fails on any unbalanced tag, unquoted
    attribute or stray ``&``)."""
    return ET.fromstring(document)


def text(element: ET.Element) -> str:
    return "".join(element.itertext())


def by_id(root: ET.Element, ident: str) -> ET.Element:
    found = [e for e in root.iter() if e.get("id") == ident]
    if len(found) != 1:
        raise AssertionError(f"{len(found)} elements with id {ident!r}")
    return found[0]


def classes(element: ET.Element) -> set[str]:
    return set((element.get("class") or "").split())


def rule_rows(root: ET.Element) -> dict[str, ET.Element]:
    table = by_id(root, "rules")
    return {tr.get("data-number", ""): tr for tr in table.iter(X + "tr") if "rule" in classes(tr)}


def cell(row: ET.Element, cls: str) -> str:
    (td,) = [td for td in row.iter(X + "td") if cls in classes(td)]
    return text(td)


def bars(root: ET.Element) -> list[ET.Element]:
    return [r for r in by_id(root, "latency").iter(S + "rect") if "bar" in classes(r)]


class Balanced(html.parser.HTMLParser):
    """Checks tags balance as an HTML parser sees them (void elements
    aside), a second opinion beside the XML parser."""

    VOID = {"meta", "link", "br", "img", "input", "hr", "col", "area", "base", "wbr", "source"}

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.problems: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        pass

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


class DocumentTests(SynchronousTestCase):
    """A page is one complete, well-formed, self-contained document."""

    def test_well_formed(self) -> None:
        """Each page parses whole as XML and balances as HTML."""
        for document in (
            site_page(busy_report()),
            site_page(quiet_report()),
            sites_index([{"site": "shop", "requests": 3, "hit": 1, "miss": 2, "errors": 0, "bytes_out": 9}]),
            sites_index([]),
        ):
            self.assertTrue(document.startswith(b"<!DOCTYPE html>\n<html"))
            root = parse(document)
            self.assertEqual(root.tag, X + "html")
            checker = Balanced()
            checker.feed(document.decode("utf-8"))
            checker.close()
            self.assertEqual((checker.problems, checker.stack), ([], []))

    def test_utf8(self) -> None:
        """The page is UTF-8 and says so first thing in its head."""
        document = site_page(busy_report())
        document.decode("utf-8")
        head = by_id_tag(parse(document), "head")
        first = list(head)[0]
        self.assertEqual((first.tag, first.get("charset")), (X + "meta", "utf-8"))

    def test_no_external_assets(self) -> None:
        """No script, no stylesheet link, no URL to fetch: the only link is
        the data: icon and the page's own navigation, and the policy the
        page carries allows nothing but its own style sheet."""
        document = site_page(busy_report()).decode("utf-8")
        root = parse(document.encode("utf-8"))
        tags = {e.tag.split("}")[1] for e in root.iter()}
        self.assertNotIn("script", tags)
        self.assertNotIn("img", tags)
        self.assertNotIn("iframe", tags)
        for e in root.iter():
            for name in ("src", "srcset", "xlink:href", "{http://www.w3.org/1999/xlink}href"):
                self.assertIsNone(e.get(name), (e.tag, name))
            if e.tag == X + "link":
                self.assertEqual(e.get("href"), "data:,")
            if e.tag == X + "a":
                self.assertTrue(e.get("href", "").startswith("/sites"), e.get("href"))
        self.assertNotIn("url(", document)
        self.assertNotIn("@import", document)
        (meta,) = [m for m in root.iter(X + "meta") if m.get("http-equiv") == "Content-Security-Policy"]
        policy = meta.get("content", "")
        self.assertIn("default-src 'none'", policy)
        self.assertNotIn("script-src", policy)
        self.assertNotIn("unsafe-inline", policy)
        self.assertTrue(CONTENT_SECURITY_POLICY.startswith(policy))
        self.assertIn("frame-ancestors 'none'", CONTENT_SECURITY_POLICY)

    def test_style_hash(self) -> None:
        """The policy's style hash is the hash of the style element the
        page holds (else a browser would refuse the page's own style)."""
        import base64
        import hashlib

        root = parse(site_page(busy_report()))
        (style,) = root.iter(X + "style")
        digest = base64.b64encode(hashlib.sha256((style.text or "").encode("utf-8")).digest()).decode()
        (meta,) = [m for m in root.iter(X + "meta") if m.get("http-equiv") == "Content-Security-Policy"]
        self.assertIn(f"style-src 'sha256-{digest}'", meta.get("content", ""))
        self.assertEqual([e for e in root.iter() if e.get("style") is not None], [])

    def test_pure(self) -> None:
        """The module imports no Twisted and nothing of the shell."""
        files = module_files()
        for module in reachable(import_graph(), "prexy.observe.page"):
            self.assertFalse(module.startswith("prexy.proxy"), module)
            self.assertNotIn("twisted", top_level_imports(files[module]), module)


def by_id_tag(root: ET.Element, tag: str) -> ET.Element:
    (found,) = root.iter(X + tag)
    return found


class EscapingTests(SynchronousTestCase):
    """Every value of a report is text on the page, never markup."""

    def test_pattern_is_text(self) -> None:
        """Rule 3's pattern ``<script>alert(1)</script>`` shows as those
        characters; the page holds no script element."""
        document = site_page(busy_report())
        root = parse(document)
        self.assertEqual(cell(rule_rows(root)["3"], "pattern"), "<script>alert(1)</script>")
        self.assertNotIn(b"<script>", document)
        self.assertIn(b"&lt;script&gt;alert(1)&lt;/script&gt;", document)

    def test_everything_escaped(self) -> None:
        """Markup in the site name, a file, flags, an error's URL, kind and
        cache, and in a never-matched rule's number, is text wherever it
        shows; the site's links percent-encode its name."""
        evil = '"><b x=\'1\'>&amp;'
        report = busy_report()
        report["site"] = evil
        report["rule_sets"] = [evil]
        report["rules"][0].update(file=evil, flags=evil)
        report["last_errors"][0].update(url=evil, kind=evil, cache=evil)  # the older: shown second
        report["errors_by_class"] = {evil: 1}
        document = site_page(report)
        root = parse(document)
        self.assertEqual([e for e in root.iter() if e.tag == X + "b"], [])
        self.assertEqual(text(by_id(root, "site-name")), evil)
        self.assertEqual(cell(rule_rows(root)["1"], "origin"), f"{evil}:3")
        self.assertEqual(cell(rule_rows(root)["1"], "flags"), evil)
        self.assertEqual(rule_rows(root)["1"].get("data-origin"), f"{evil}:3")
        (_, older) = [tr for tr in by_id(root, "errors").iter(X + "tr") if "error" in classes(tr)]
        self.assertEqual(cell(older, "url"), evil)
        self.assertEqual(cell(older, "kind"), evil)
        self.assertIn(evil, text(by_id(root, "stat-errors")))
        self.assertIn(evil, text(by_id(root, "site-name")))
        (title,) = root.iter(X + "title")
        self.assertTrue((title.text or "").startswith(evil))
        hrefs = [a.get("href", "") for a in root.iter(X + "a")]
        self.assertIn("/sites/%22%3E%3Cb%20x%3D%271%27%3E%26amp%3B.json", hrefs)

    def test_index_escaped(self) -> None:
        """A site name with markup and a slash is text in the list and one
        percent-encoded path segment in its link."""
        root = parse(sites_index([{"site": "a/<b>&", "requests": 1}]))
        (a,) = root.iter(X + "a")
        self.assertEqual((a.text, a.get("href")), ("a/<b>&", "/sites/a%2F%3Cb%3E%26"))
        (row,) = [tr for tr in by_id(root, "sites").iter(X + "tr") if "site" in classes(tr)]
        self.assertEqual(row.get("data-site"), "a/<b>&")

    def test_hidden_characters_shown(self) -> None:
        """Control characters, a bidi override and a lone surrogate are
        shown as escapes: the text reads in order and stays valid
        UTF-8 and XML."""
        self.assertEqual(esc("a\x00b\x1bc\x7f"), "a\\x00b\\x1bc\\x7f")
        self.assertEqual(esc("\u202etxt.exe"), "\\u202etxt.exe")
        self.assertEqual(esc("x\ud800"), "x\\ud800")
        self.assertEqual(esc("tab\tand\nline"), "tab\tand\nline")
        self.assertEqual(esc("é ✓ 中"), "é ✓ 中")
        report = busy_report()
        report["rules"][1]["pattern"] = "a\x00\ud800<"
        root = parse(site_page(report))
        self.assertEqual(cell(rule_rows(root)["2"], "pattern").split("never")[0], "a\\x00\\ud800<")
        self.assertEqual(cell(rule_rows(root)["5"], "pattern").split("never")[0], "\\u202etxt.exe")


class RulesTests(SynchronousTestCase):
    """The rules table: one row a rule, by number, the never-matching ones
    marked."""

    def test_rows(self) -> None:
        """Each rule's number, file:line, pattern, flags and counters."""
        rows = rule_rows(parse(site_page(busy_report())))
        self.assertEqual(list(rows), ["1", "2", "3", "4", "5"])
        one = rows["1"]
        self.assertEqual(cell(one, "number"), "1")
        self.assertEqual(cell(one, "origin"), "/etc/prexy/shop.rules:3")
        self.assertEqual(cell(one, "pattern"), r"old\.example\.com")
        self.assertEqual(cell(one, "flags"), "g")
        self.assertEqual(cell(one, "matches").strip(), "1,234,567")
        self.assertEqual(cell(one, "responses"), "40,210")
        self.assertEqual(cell(one, "bytes-changed"), "18.8 MiB")
        self.assertEqual(cell(rows["4"], "origin"), "/etc/prexy/shared/cdn.rules:1")

    def test_never_matched(self) -> None:
        """The rules the report lists as never matched (2 and 5, though 5
        has matched before the window) have the class and the badge naming
        the window; the others have neither."""
        root = parse(site_page(busy_report()))
        rows = rule_rows(root)
        marked = {n for n, tr in rows.items() if "never-matched" in classes(tr)}
        self.assertEqual(marked, {"2", "5"})
        for n, tr in rows.items():
            badges = [s for s in tr.iter(X + "span") if "badge" in classes(s)]
            if n in marked:
                (badge,) = badges
                self.assertEqual(text(badge), "never matched in the last 1,000")
            else:
                self.assertEqual(badges, [])
        self.assertEqual(text(by_id(root, "never-count")), "2")

    def test_last_fired(self) -> None:
        """Relative to when the report was made, with the absolute time
        (the date too when another day); ``never`` when it never fired."""
        rows = rule_rows(parse(site_page(busy_report())))
        self.assertEqual(cell(rows["1"], "last-fired"), "just now02:51:40 UTC")
        self.assertEqual(cell(rows["4"], "last-fired"), "1 min ago02:50:25 UTC")
        self.assertEqual(cell(rows["3"], "last-fired"), "3 h ago2025-12-04 23:51:28 UTC")
        self.assertEqual(cell(rows["5"], "last-fired"), "3 d ago2025-12-02 02:51:40 UTC")
        self.assertEqual(cell(rows["2"], "last-fired"), "never")
        (when,) = rows["1"].iter(X + "time")
        self.assertEqual(when.get("datetime"), "2025-12-05T02:51:40.100Z")

    def test_time_beyond_calendar(self) -> None:
        """A time no calendar holds shows as its number, not a failure."""
        report = busy_report()
        report["rules"][0]["last_fired"] = 1e300
        report["last_errors"][0]["time"] = -1e20
        root = parse(site_page(report))
        self.assertEqual(cell(rule_rows(root)["1"], "last-fired"), "1e+300")
        report["generated"] = -62135596801  # a second before year 1
        root = parse(site_page(report))
        self.assertEqual(cell(rule_rows(root)["4"], "last-fired"), "2025-12-05 02:50:25 UTC")

    def test_trouble_flagged(self) -> None:
        """Bail-outs and timeouts above zero stand out."""
        rows = rule_rows(parse(site_page(busy_report())))
        (bail,) = [td for td in rows["3"].iter(X + "td") if "bailouts" in classes(td)]
        self.assertEqual((text(bail), "warn" in classes(bail)), ("2", True))
        (calm,) = [td for td in rows["1"].iter(X + "td") if "timeouts" in classes(td)]
        self.assertEqual((text(calm), "warn" in classes(calm)), ("0", False))

    def test_no_rules(self) -> None:
        """A site without rules says so in the table."""
        report = quiet_report()
        report.update(rules=[], never_matched=[], rule_sets=[])
        root = parse(site_page(report))
        self.assertEqual(rule_rows(root), {})
        self.assertIn("No rules.", text(by_id(root, "rules")))


class QuietSiteTests(SynchronousTestCase):
    """A site with no traffic: every ratio absent rather than a division
    by zero, and an empty histogram that says so."""

    def test_summary(self) -> None:
        root = parse(site_page(quiet_report()))
        self.assertEqual(text(by_id(root, "stat-requests")), "Requests0")
        self.assertEqual(text(by_id(root, "stat-hit-rate")), "Cache hit rate—0 hits · 0 misses")
        self.assertEqual(text(by_id(root, "stat-upstream")), "Upstream time0 s")
        self.assertEqual(text(by_id(root, "stat-rewritten")), "Rewritten0")

    def test_empty_histogram(self) -> None:
        """Every bar is there at height zero, and a note says why."""
        root = parse(site_page(quiet_report()))
        drawn = bars(root)
        self.assertEqual(len(drawn), 3 * (len(BOUNDS) + 1))
        self.assertEqual({float(r.get("height", "x")) for r in drawn}, {0.0})
        notes = [t for t in by_id(root, "latency").iter(S + "text") if "empty-note" in classes(t)]
        self.assertEqual([t.text for t in notes], ["no requests yet"])
        summary = by_id(root, "latency-summary")
        self.assertEqual(text(summary).count("—"), 9)

    def test_empty_cache_and_errors(self) -> None:
        root = parse(site_page(quiet_report()))
        self.assertIn("No errors recorded.", text(by_id(root, "errors")))
        self.assertIn("—", text(by_id(root, "cache")))

    def test_sparse_report(self) -> None:
        """A report with only its site renders, its figures absent."""
        root = parse(site_page({"site": "bare"}))
        self.assertEqual(text(by_id(root, "stat-requests")), "Requests—")
        self.assertEqual(len(bars(root)), 3)

    def test_bad_latency(self) -> None:
        """Latency lists that do not fit the bounds are a clear error, not
        a page drawn wrong."""
        for change, words in (
            ({"hit": [1, 2]}, "latency.hit must hold 17 counts"),
            ({"miss": [-1] * 17}, "latency.miss must hold 17 counts"),
            ({"bounds": [0.1, 0.05]}, "latency.bounds do not increase"),
            ({"bounds": ["fast"]}, "not a number"),
        ):
            report = quiet_report()
            report["latency"].update(change)
            with self.assertRaises(ValueError) as caught:
                site_page(report)
            self.assertIn(words, str(caught.exception))


class HistogramTests(SynchronousTestCase):
    """The latency SVG: a bar per bucket and cache class, heights in
    proportion, none lost however small."""

    def test_bars(self) -> None:
        report = busy_report()
        root = parse(site_page(report))
        drawn = bars(root)
        self.assertEqual(len(drawn), 3 * (len(BOUNDS) + 1))
        heights: dict[tuple[str, int], float] = {}
        for r in drawn:
            key = (r.get("data-series", ""), int(r.get("data-bucket", "-1")))
            heights[key] = float(r.get("height", "nan"))
            self.assertEqual(int(r.get("data-count", "-1")), report["latency"][key[0]][key[1]])
        for (series, i), h in heights.items():
            n = report["latency"][series][i]
            self.assertEqual(h > 0, n > 0, (series, i, n, h))
        # Proportional: the tallest bar is 12,000 hits; 6,000 is half as high.
        self.assertAlmostEqual(heights[("hit", 4)] * 2, heights[("hit", 3)], delta=0.2)
        # One request still shows.
        self.assertGreaterEqual(heights[("hit", 12)], 1.0)

    def test_bound_labels(self) -> None:
        """The bucket edges, in ms below a second, from 0 to infinity."""
        root = parse(site_page(busy_report()))
        labels = [t.text for t in by_id(root, "latency").iter(S + "text") if "bound" in classes(t)]
        self.assertEqual(
            labels,
            ["0", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "25", "50", "100", "250", "500", "1 s", "2.5 s", "5 s",
             "10 s", "∞"],
        )

    def test_quantiles(self) -> None:
        root = parse(site_page(busy_report()))
        rows = {tr.get("class"): [text(td) for td in tr] for tr in by_id(root, "latency-summary").iter(X + "tr")}
        self.assertEqual(rows["hit"][1:], ["30,100", "≤ 1 ms", "≤ 5 ms", "≤ 10 ms"])
        self.assertEqual(rows["miss"][1:], ["12,900", "≤ 25 ms", "≤ 50 ms", "≤ 250 ms"])

    def test_count_axis(self) -> None:
        """Whole steps of 1, 2 or 5 times a power of ten, top at or above
        the peak."""
        self.assertEqual(count_axis(0), (1, 1))
        self.assertEqual(count_axis(3), (1, 3))
        self.assertEqual(count_axis(7), (2, 8))
        self.assertEqual(count_axis(12_000), (5_000, 15_000))
        for peak in range(0, 5000, 7):
            step, top = count_axis(peak)
            self.assertGreaterEqual(top, peak)
            self.assertLessEqual(top // step, 5)
            self.assertEqual(top % step, 0)


class FormatTests(SynchronousTestCase):
    """Numbers as an operator reads them."""

    def test_counts(self) -> None:
        self.assertEqual(count(0), "0")
        self.assertEqual(count(1_234_567_890_123), "1,234,567,890,123")
        self.assertEqual(count(12.0), "12")
        self.assertEqual(count(None), "—")
        self.assertEqual(count(float("nan")), "—")
        self.assertEqual(count(True), "—")

    def test_sizes(self) -> None:
        self.assertEqual(size(0), "0 B")
        self.assertEqual(size(1023), "1023 B")
        self.assertEqual(size(1536), "1.5 KiB")
        self.assertEqual(size(2_413_337_112), "2.2 GiB")
        self.assertEqual(size(500 * 1024**3), "500 GiB")
        self.assertEqual(size(3 * 1024**6), "3,072 PiB")

    def test_durations(self) -> None:
        self.assertEqual(duration(0), "0 s")
        self.assertEqual(duration(0.00042), "420 µs")
        self.assertEqual(duration(0.0123), "12.3 ms")
        self.assertEqual(duration(4.25), "4.25 s")
        self.assertEqual(duration(200), "3 min 20 s")
        self.assertEqual(duration(18_120), "5 h 02 min")
        self.assertEqual(duration(None), "—")

    def test_bounds(self) -> None:
        self.assertEqual([bound_label(b) for b in (0.0005, 0.0025, 0.25, 1.0, 2.5)], ["0.5", "2.5", "250", "1 s", "2.5 s"])

    def test_large_report(self) -> None:
        """A site with billions of requests reads in grouped digits and
        binary units on the page."""
        report = busy_report()
        report.update(requests=12_345_678_901, bytes_out=987_654_321_098_765)
        report["rules"][0]["matches"] = 98_765_432_109
        root = parse(site_page(report))
        self.assertEqual(text(by_id(root, "stat-requests")), "Requests12,345,678,901")
        self.assertEqual(text(by_id(root, "stat-bytes-out")), "Bytes out898 TiB2.0 GiB in from upstream")
        self.assertEqual(by_id(root, "stat-bytes-out").get("title"), "987,654,321,098,765 bytes")
        self.assertEqual(cell(rule_rows(root)["1"], "matches").strip(), "98,765,432,109")

    def test_summary(self) -> None:
        root = parse(site_page(busy_report()))
        self.assertEqual(text(by_id(root, "stat-rewritten")), "Rewritten41,73086.6 % of requests")
        self.assertEqual(text(by_id(root, "stat-hit-rate")), "Cache hit rate70.0 %30,100 hits · 12,900 misses")
        self.assertEqual(text(by_id(root, "stat-upstream")), "Upstream time20 min 34 s25.6 ms mean per request")
        self.assertEqual(text(by_id(root, "stat-errors")), "Error answers3284xx 311 · 5xx 17 · upstream 9")


class IndexTests(SynchronousTestCase):
    def test_rows(self) -> None:
        """Each site in the order given, linked, with its counters."""
        sites = [
            {"site": "shop", "requests": 48_211, "hit": 30_100, "miss": 12_900, "errors": 26, "bytes_out": 2_413_337_112},
            {"site": "blog", "requests": 0, "hit": 0, "miss": 0, "errors": 0, "bytes_out": 0},
        ]
        root = parse(sites_index(sites, generated=GENERATED))
        rows = [tr for tr in by_id(root, "sites").iter(X + "tr") if "site" in classes(tr)]
        self.assertEqual([r.get("data-site") for r in rows], ["shop", "blog"])
        self.assertEqual([text(td) for td in rows[0]], ["shop", "48,211", "30,100", "12,900", "70.0 %", "26", "2.2 GiB"])
        self.assertEqual([text(td) for td in rows[1]][4], "—")
        self.assertEqual([a.get("href") for a in root.iter(X + "a")], ["/sites/shop", "/sites/blog"])
        self.assertIn("2025-12-05 02:51:40 UTC", text(root))

    def test_empty(self) -> None:
        root = parse(sites_index([]))
        self.assertIn("No sites have had requests yet.", text(by_id(root, "sites")))


#: Any JSON value (text with every code point, surrogates included).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def report_with(changes: dict[str, Any]) -> dict[str, Any]:
    report = busy_report()
    report.update(changes)
    return report


class ErrorsTests(SynchronousTestCase):
    def test_newest_first(self) -> None:
        """The last errors, kept oldest first, show newest first; one
        without a time goes last."""
        report = busy_report()
        report["last_errors"].append({"status": 500, "url": "/timeless", "cache": "-", "kind": "status"})
        root = parse(site_page(report))
        rows = [tr for tr in by_id(root, "errors").iter(X + "tr") if "error" in classes(tr)]
        self.assertEqual([cell(tr, "status") for tr in rows], ["502", "503", "500"])
        self.assertEqual([cell(tr, "when") for tr in rows], ["5 s ago02:51:35 UTC", "5 min ago02:46:40 UTC", "—"])
        self.assertEqual([classes(tr) for tr in rows], [{"error", "s5xx"}] * 3)


class InputTests(SynchronousTestCase):
    """The report is read, never changed; a report of the wrong shape
    makes a page or a ValueError, nothing else."""

    @given(st.dictionaries(
        st.sampled_from(["site", "generated", "rules", "never_matched", "window", "requests", "rewritten",
                         "bytes_out", "upstream_seconds", "rewrite_seconds", "errors_by_class", "cache",
                         "latency", "last_errors", "rule_sets"]),
        json_values,
    ))
    def test_any_shape(self, changes: dict[str, Any]) -> None:
        try:
            document = site_page(report_with(changes))
        except ValueError:
            self.assertIn("latency", changes)
            return
        parse(document)

    @given(st.lists(st.dictionaries(st.sampled_from(["site", "requests", "hit", "miss", "errors", "bytes_out"]),
                                    json_values), max_size=3))
    def test_any_index(self, sites: list[dict[str, Any]]) -> None:
        parse(sites_index(sites))

    @given(st.sampled_from(["rules", "last_errors"]), st.lists(json_values, max_size=3))
    def test_any_rows(self, key: str, rows: list[Any]) -> None:
        parse(site_page(report_with({key: rows})))

    @given(st.dictionaries(st.sampled_from(["number", "file", "line", "pattern", "flags", "matches",
                                            "responses", "bytes_changed", "last_fired", "bailouts",
                                            "timeouts"]), json_values))
    def test_any_rule(self, rule: dict[str, Any]) -> None:
        parse(site_page(report_with({"rules": [rule], "never_matched": [rule.get("number")]})))

    def test_report_untouched(self) -> None:
        report: dict[str, Any] = busy_report()
        before = copy.deepcopy(report)
        site_page(report)
        self.assertEqual(report, before)

    def test_same_page_twice(self) -> None:
        """The page depends on the report only (no clock read)."""
        self.assertEqual(site_page(busy_report()), site_page(busy_report()))
        self.assertIsNone(re.search(r"\btime\.time\(", open(page.__file__, encoding="utf-8").read()))
