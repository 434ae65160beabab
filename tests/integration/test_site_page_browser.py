"""The admin's site page in a real browser: a page that
``prexy.observe.page.site_page`` made from a busy site's report, served by
a Twisted web server on loopback with the headers the admin endpoint
sends, loaded by headless Chromium (``browser.py``).  What Chromium shows
is checked: the rules table's rows with their numbers and counts, the
never-matching rules marked, rule 3's ``<script>`` pattern as text, the
histogram's bars (non-zero heights exactly for the non-empty buckets),
the bars and the marked rows painted in the screenshot in their colours,
no console message (a refused style sheet or asset would write one), and
nothing fetched but the page itself.

Chromium starts twice for the whole module (the site page with its
screenshot, then the list of sites).  Without a Chromium binary the module
is skipped; ``.ci/run`` installs Debian's, so CI runs it.  Set
``PREXY_BROWSER_SHOTS`` to a directory to keep the screenshot there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.web import resource, server

from prexy.observe.page import CONTENT_SECURITY_POLICY, site_page, sites_index
from tests.sitereports import busy_report

from .browser import Node, Rendered, find_chromium, parse_dom, read_png, rendered, site_view

SITES = [
    {"site": "shop", "requests": 48_211, "hit": 30_100, "miss": 12_900, "errors": 328, "bytes_out": 2_413_337_112},
    {"site": "blog", "requests": 12, "hit": 0, "miss": 12, "errors": 0, "bytes_out": 40_960},
]


class Pages(resource.Resource):
    """``/sites`` and ``/sites/shop`` as the admin endpoint answers them;
    404 for anything else.  Every path asked for is kept."""

    isLeaf = True

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[str] = []

    def render_GET(self, request: server.Request) -> bytes:
        path = request.path.decode("ascii", "replace")
        self.asked.append(path)
        if path == "/sites/shop":
            body = site_page(busy_report())
        elif path == "/sites":
            body = sites_index(SITES)
        else:
            request.setResponseCode(404)
            request.setHeader(b"content-type", b"text/plain; charset=utf-8")
            return b"404 Not Found\n"
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"content-security-policy", CONTENT_SECURITY_POLICY.encode("ascii"))
        request.setHeader(b"cache-control", b"no-store")
        return body


@dataclass
class Shown:
    site: Rendered
    index: Rendered
    asked: list[str]
    url: str
    dom: Node = field(init=False)

    def __post_init__(self) -> None:
        self.dom = parse_dom(self.site.dom)


@pytest.fixture(scope="module")
def shown() -> Shown:
    """The site page and the list of sites, each loaded once."""
    if find_chromium() is None:
        pytest.skip("no chromium binary (Debian's chromium, or $PREXY_CHROMIUM)")
    pages = Pages()
    port = reactor.listenTCP(0, server.Site(pages), interface="127.0.0.1")
    base = f"http://127.0.0.1:{port.getHost().port}"
    try:
        site = pytest_twisted.blockon(rendered(f"{base}/sites/shop", screenshot=True))
        index = pytest_twisted.blockon(rendered(f"{base}/sites"))
    finally:
        pytest_twisted.blockon(port.stopListening())
    keep = os.environ.get("PREXY_BROWSER_SHOTS")
    if keep and site.screenshot:
        os.makedirs(keep, exist_ok=True)
        with open(os.path.join(keep, "site-page.png"), "wb") as f:
            f.write(site.screenshot)
    return Shown(site, index, pages.asked, f"{base}/sites/shop")


def rule_rows(dom: Node) -> dict[str, Node]:
    return {row.attrs["data-number"]: row for row in dom.one("table", id="rules").select("tr", cls="rule")}


def cell(row: Node, cls: str) -> str:
    return row.one("td", cls).text().strip()


def test_rules_table(shown: Shown) -> None:
    """One row a rule, by number, with its file:line, pattern and counts."""
    rows = rule_rows(shown.dom)
    assert list(rows) == ["1", "2", "3", "4", "5"]
    report = busy_report()
    for rule in report["rules"]:
        row = rows[str(rule["number"])]
        assert cell(row, "number") == str(rule["number"])
        assert cell(row, "origin") == f"{rule['file']}:{rule['line']}"
        assert cell(row, "matches") == f"{rule['matches']:,}"
        assert cell(row, "responses") == f"{rule['responses']:,}"
    assert cell(rows["1"], "matches") == "1,234,567"
    assert cell(rows["3"], "bailouts") == "2"


def test_site_view(shown: Shown) -> None:
    """The harness's reading of the page (what a test through the admin
    endpoint compares with its own counts) agrees with the report."""
    view = site_view(shown.dom)
    report = busy_report()
    assert view.site == "shop"
    assert {n: (r.origin, r.pattern, r.matches, r.responses, r.never_matched) for n, r in view.rules.items()} == {
        rule["number"]: (
            f"{rule['file']}:{rule['line']}", rule["pattern"].replace("\u202e", "\\u202e"),
            rule["matches"], rule["responses"], rule["number"] in report["never_matched"],
        )
        for rule in report["rules"]
    }
    assert sorted((b.series, b.bucket, b.count) for b in view.bars) == sorted(
        (series, i, n) for series in ("hit", "miss", "pass") for i, n in enumerate(report["latency"][series])
    )
    assert [row[1:4] for row in view.errors] == [["502", "upstream", "miss"], ["503", "status", "pass"]]
    assert view.errors[0][4] == '/cart?id=<b>1</b>&x="y"'


def test_never_matched_marked(shown: Shown) -> None:
    """Rules 2 and 5 are marked, with the badge naming the window."""
    rows = rule_rows(shown.dom)
    marked = sorted(n for n, row in rows.items() if "never-matched" in row.classes)
    assert marked == ["2", "5"]
    assert [b.text() for b in shown.dom.select("span", cls="badge")] == ["never matched in the last 1,000"] * 2
    assert shown.dom.select("tr", cls="never-matched") == [rows["2"], rows["5"]]


def test_pattern_is_text(shown: Shown) -> None:
    """Rule 3's pattern ``<script>alert(1)</script>`` is text: the DOM
    holds no script element."""
    assert rule_rows(shown.dom)["3"].one("code").text() == "<script>alert(1)</script>"
    assert shown.dom.select("script") == []


def test_histogram(shown: Shown) -> None:
    """A bar per bucket and cache class; a bar has height exactly when its
    bucket has requests; the bucket bounds are labelled."""
    svg = shown.dom.one("svg", id="latency")
    latency = busy_report()["latency"]
    bars = svg.select("rect", cls="bar")
    assert len(bars) == 3 * (len(latency["bounds"]) + 1)
    for bar in bars:
        series, bucket = bar.attrs["data-series"], int(bar.attrs["data-bucket"])
        n = latency[series][bucket]
        assert int(bar.attrs["data-count"]) == n
        assert (float(bar.attrs["height"]) > 0) == (n > 0), (series, bucket, n, bar.attrs)
    labels = [t.text() for t in svg.select("text", cls="bound")]
    assert labels[:5] == ["0", "0.1", "0.25", "0.5", "1"] and labels[-1] == "∞"


def test_no_console_messages(shown: Shown) -> None:
    """Nothing on the console: the style sheet passed the page's policy
    and nothing else was tried."""
    assert shown.site.console == [], shown.site.console
    assert shown.index.console == [], shown.index.console


def test_nothing_fetched_but_the_pages(shown: Shown) -> None:
    """The browser asked for the two pages and nothing else (no asset,
    no icon)."""
    assert shown.asked == ["/sites/shop", "/sites"]


def test_screenshot_painted(shown: Shown) -> None:
    """The screenshot shows the page styled: the hit and miss bars in
    their colours, the never-matched rows on their background."""
    assert shown.site.screenshot is not None
    image = read_png(shown.site.screenshot)
    assert (image.width, image.height) == (1200, 1600)
    assert image.colours() > 100  # not a blank or an error page
    hit, miss, never = image.count((0x1F, 0x77, 0xB4)), image.count((0xFF, 0x7F, 0x0E)), image.count((0xFF, 0xF4, 0xD6))
    assert hit > 2000, hit
    assert miss > 1000, miss
    assert never > 10_000, never


def test_index(shown: Shown) -> None:
    """The list of sites links each one to its page."""
    dom = parse_dom(shown.index.dom)
    rows = dom.one("table", id="sites").select("tr", cls="site")
    assert [r.attrs["data-site"] for r in rows] == ["shop", "blog"]
    links = [(a.text(), a.attrs["href"]) for a in dom.select("a")]
    assert links == [("shop", "/sites/shop"), ("blog", "/sites/blog")]
    assert rows[0].one("td", "requests").text() == "48,211"


def test_loaded_what_was_served(shown: Shown) -> None:
    """The DOM is the page served (its title and sections all there)."""
    assert shown.dom.one("head").one("title").text() == "shop — Prexy"
    for ident in ("summary", "rules", "latency", "cache", "errors"):
        assert len(shown.dom.select(id=ident)) == 1, ident
