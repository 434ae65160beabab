"""The operator's view through ``twistd prexy --workers 2``: a site with a
realistic rules file behind a loopback origin; per-rule counts in the
admin JSON and ``/metrics`` against ``prexy rewrite --explain`` on the same
pages, the never-matching rule listed, the live log filtered by rule, the
dry run of a draft against a direct comparison, and the admin token."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task
from twisted.internet.protocol import ClientFactory, Protocol
from twisted.web import resource, server

from .conftest import Cleanups
from .test_service import RawClient, connect
from .twistd_support import Twistd, body_of, child_env, free_port, scratch_dir

RULES = """\
# the clone's domain, its analytics id, its API key, a checkout version, and one that never matches
replace_filter 'www\\.original\\.example' 'www.clone.test' g;
replace_filter 'UA-11111-1' 'UA-99999-9' g;
replace_filter 'api_key=[0-9a-f]{8}' 'api_key=cafebabe' gi;
replace_filter 'checkout-v1' 'checkout-v2' g;
replace_filter 'legacy\\.original\\.example' 'legacy.clone.test' g;
replace_filter_types text/html application/javascript;
"""


def page(n: int) -> bytes:
    """A page of the original site: links, scripts, an analytics snippet;
    every third one has the checkout widget, every fourth an API key."""
    links = "".join(
        f'<li><a href="https://www.original.example/p/{n}-{k}">item {k}</a></li>\n' for k in range(n % 5 + 2)
    )
    checkout = '<div class="checkout-v1">buy</div>\n' if n % 3 == 0 else ""
    key = f'<script src="/api.js?api_key={n:08x}"></script>\n' if n % 4 == 0 else ""
    return (
        "<!doctype html><html><head><title>page {n}</title>\n"
        '<link rel="stylesheet" href="https://www.original.example/s.css">\n'
        "<script>ga('create', 'UA-11111-1', 'auto');</script>\n"
        "</head><body><ul>\n{links}</ul>\n{checkout}{key}"
        "<p>{filler}</p></body></html>\n"
    ).format(n=n, links=links, checkout=checkout, key=key, filler="lorem ipsum " * (40 + n)).encode()


PAGES = {f"/p/{n}.html": page(n) for n in range(12)}


class Pages(resource.Resource):
    isLeaf = True

    def render_GET(self, request: server.Request) -> bytes:  # noqa: N802
        body = PAGES.get(request.path.decode())
        if body is None:
            request.setResponseCode(404)
            return b"not here"
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        return body


class Site:
    """``twistd prexy --workers 2`` with one rewriting site and an admin endpoint."""

    def __init__(self, cleanup: Cleanups, token: str | None = None) -> None:
        self.cleanup = cleanup
        self.dir = scratch_dir()
        self.token = token
        origin_port = reactor.listenTCP(0, server.Site(Pages()), interface="127.0.0.1")
        cleanup(origin_port.stopListening)
        self.port, self.admin = free_port(), free_port()
        self.rules = os.path.join(self.dir, "shop.rules")
        with open(self.rules, "w") as f:
            f.write(RULES)
        token_line = f'admin_token = "{token}"\n' if token else ""
        with open(os.path.join(self.dir, "prexy.toml"), "w") as f:
            f.write(
                f'[server]\nlisten = ["tcp:{self.port}:interface=127.0.0.1"]\n'
                f'admin = "tcp:{self.admin}:interface=127.0.0.1"\n{token_line}workers = 2\naccess_log = "off"\n'
                f'[sites.shop]\nhosts = ["shop.test"]\nupstream = "http://127.0.0.1:{origin_port.getHost().port}"\n'
                f'rules = ["shop.rules"]\n'
            )

    @defer.inlineCallbacks
    def start(self) -> Any:
        self.child = Twistd("--config", os.path.join(self.dir, "prexy.toml"))
        self.cleanup(self.child.stop)
        yield self.child.ready()

    @defer.inlineCallbacks
    def get(self, path: str) -> Any:
        client = RawClient(f"GET {path} HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n".encode())
        yield connect(self.port, client)
        return body_of(bytes(client.data))

    @defer.inlineCallbacks
    def admin_get(self, path: str, headers: str = "") -> Any:
        auth = f"Authorization: Bearer {self.token}\r\n" if self.token else ""
        client = RawClient(
            f"GET {path} HTTP/1.1\r\nHost: a\r\n{auth}{headers}Connection: close\r\n\r\n".encode()
        )
        yield connect(self.admin, client)
        raw = bytes(client.data)
        return int(raw.split(b" ", 2)[1]), raw.partition(b"\r\n\r\n")[0], body_of(raw)

    @defer.inlineCallbacks
    def report_with(self, requests: int, seconds: float = 10) -> Any:
        """The site's JSON once the workers reported ``requests`` requests
        (they report on their own one-second timer)."""
        from prexy.worker import METRICS_INTERVAL

        give_up = reactor.seconds() + seconds
        while True:
            _, _, body = yield self.admin_get("/sites/shop.json")
            report = json.loads(body)
            if report["requests"] >= requests:
                return report
            if reactor.seconds() > give_up:
                raise AssertionError(f"the workers reported {report['requests']} of {requests} requests")
            yield task.deferLater(reactor, METRICS_INTERVAL / 4, lambda: None)


def explain(rules: str, pages: list[bytes], directory: str) -> dict[str, Any]:
    """``prexy rewrite --explain --json`` on ``pages`` (one file each)."""
    paths = []
    for i, body in enumerate(pages):
        path = os.path.join(directory, f"page{i}.html")
        with open(path, "wb") as f:
            f.write(body)
        paths.append(path)
    out = subprocess.run(
        [sys.executable, "-m", "prexy", "rewrite", "--rules", rules, "--explain", "--json", *paths],
        capture_output=True, check=True, env=child_env(), timeout=60,
    )
    result: dict[str, Any] = json.loads(out.stdout)
    return result


class LogStream(Protocol):
    """A ``GET /log`` reader: ``attached`` fires when the head came (every
    worker records for it), ``lines`` are the records so far."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.buffer = b""
        self.head_seen = False
        self.attached: defer.Deferred[None] = defer.Deferred()
        self.lines: list[dict[str, Any]] = []

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.buffer += data
        if not self.head_seen and b"\r\n\r\n" in self.buffer:
            self.head_seen = True
            self.buffer = self.buffer.partition(b"\r\n\r\n")[2]
            self.attached.callback(None)
        while self.head_seen:
            size_line, sep, rest = self.buffer.partition(b"\r\n")
            if not sep:
                return
            size = int(size_line, 16)
            if len(rest) < size + 2:
                return
            chunk, self.buffer = rest[:size], rest[size + 2 :]
            self.lines += [json.loads(line) for line in chunk.splitlines() if line]


@pytest.fixture
def shop(cleanup: Cleanups) -> Site:
    return Site(cleanup)


@pytest_twisted.inlineCallbacks
def test_rule_counts_match_explain(shop: Site) -> Any:
    """After traffic, each rule's match count in /sites/shop.json and in
    /metrics equals what ``rewrite --explain`` counts on the same pages; the
    never-matching rule is listed; each rule names its file and line."""
    yield shop.start()
    sent = [path for path in PAGES for _ in range(1 + len(path) % 2)]
    bodies = yield defer.gatherResults([shop.get(path) for path in sent])
    assert all(b"www.clone.test" in body for body in bodies)
    report = yield shop.report_with(len(sent))
    expected = explain(shop.rules, [PAGES[path] for path in sent], shop.dir)
    by_number = {r["number"]: r for r in expected["rules"]}
    assert [r["number"] for r in report["rules"]] == [1, 2, 3, 4, 5]
    for rule in report["rules"]:
        assert (rule["file"], rule["line"]) == (shop.rules, rule["number"] + 1)
        assert rule["matches"] == by_number[rule["number"]]["matches"], rule
        assert rule["responses"] == by_number[rule["number"]]["pages"], rule
        assert rule["bytes_changed"] == by_number[rule["number"]]["bytes_changed"], rule
    assert report["never_matched"] == expected["never_matched"] == [5]
    assert report["rewritten"] == len(sent)
    _, _, text = yield shop.admin_get("/metrics")
    from prometheus_client.parser import text_string_to_metric_families

    matches = {
        int(s.labels["rule"]): s.value
        for f in text_string_to_metric_families(text.decode()) if f.name == "prexy_rule_matches"
        for s in f.samples if s.labels["site"] == "shop"
    }
    assert matches == {n: float(r["matches"]) for n, r in by_number.items()}


@pytest_twisted.inlineCallbacks
def test_live_log_by_rule(shop: Site) -> Any:
    """``/log?rule=4`` gives exactly the requests in which rule 4 fired
    (every third page has the checkout widget), across both workers."""
    yield shop.start()
    stream = LogStream(b"GET /log?rule=4 HTTP/1.1\r\nHost: a\r\n\r\n")
    factory = ClientFactory.forProtocol(lambda: stream)
    connector = reactor.connectTCP("127.0.0.1", shop.admin, factory)
    yield stream.attached
    everything = LogStream(b"GET /log HTTP/1.1\r\nHost: a\r\n\r\n")
    other = reactor.connectTCP("127.0.0.1", shop.admin, ClientFactory.forProtocol(lambda: everything))
    yield everything.attached
    paths = list(PAGES) * 2
    yield defer.gatherResults([shop.get(path) for path in paths])
    wanted = sorted(p for p in paths if b"checkout-v1" in PAGES[p])
    # Every request is in the unfiltered stream once it has all of them.
    yield until(lambda: len(everything.lines) >= len(paths))
    yield until(lambda: len(stream.lines) >= len(wanted))
    assert sorted(r["url"] for r in stream.lines) == wanted
    assert all(4 in r["rules"] and r["site"] == "shop" and r["status"] == 200 for r in stream.lines)
    assert sorted(r["url"] for r in everything.lines) == sorted(paths)
    connector.disconnect()
    other.disconnect()


@defer.inlineCallbacks
def until(condition: Any, seconds: float = 10) -> Any:
    """Waits, a tenth of a second at a time (the workers hand records over
    every tenth), for ``condition()``."""
    from prexy.observing import PUMP_INTERVAL

    give_up = reactor.seconds() + seconds
    while not condition():
        if reactor.seconds() > give_up:
            raise AssertionError("the condition did not come true in time")
        yield task.deferLater(reactor, PUMP_INTERVAL, lambda: None)


@pytest_twisted.inlineCallbacks
def test_dry_run_of_a_draft(shop: Site) -> Any:
    """A draft that changes one host: the dry run fetches the most
    requested pages and reports what a direct comparison finds."""
    yield shop.start()
    sent = list(PAGES)[:8]
    yield defer.gatherResults([shop.get(path) for path in sent])
    draft = RULES.replace("'www.clone.test'", "'www2.clone.test'").encode()
    client = RawClient(
        b"POST /sites/shop/dry-run?count=50&file=draft.rules HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (len(draft), draft)
    )
    yield connect(shop.admin, client)
    report = json.loads(body_of(bytes(client.data)))
    assert report["fetched"] == len(sent) and report["failed"] == []
    from prexy.substitution.rules import parse_rules
    from prexy.substitution.transducer import Transducer

    current, changed = parse_rules(RULES.encode(), shop.rules), parse_rules(draft, "draft.rules")
    differ = [p for p in sent if Transducer(current).finish(PAGES[p]) != Transducer(changed).finish(PAGES[p])]
    assert report["changed"] == len(differ) == len(sent)
    occurrences = sum(PAGES[p].count(b"www.original.example") for p in sent)
    assert report["rules"]["draft"][0]["occurrences"] == occurrences
    assert report["rules"]["draft"][0]["file"] == "draft.rules"
    assert report["never_matching"] == {"current": [5], "draft": [5]}
    assert any("www2.clone.test" in line for line in report["diffs"][0]["lines"])
    broken = b"replace_filter 'a(' 'b' g;\n"
    client = RawClient(
        b"POST /sites/shop/dry-run?file=broken.rules HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n"
        b"Connection: close\r\n\r\n%s" % (len(broken), broken)
    )
    yield connect(shop.admin, client)
    assert bytes(client.data).startswith(b"HTTP/1.1 400")
    assert json.loads(body_of(bytes(client.data)))["error"].startswith("broken.rules:1:")


@pytest_twisted.inlineCallbacks
def test_admin_token_and_refusals(cleanup: Cleanups) -> Any:
    """With ``admin_token``, every route wants it; routes refuse methods,
    parameters and names they do not expect."""
    site = Site(cleanup, token="t0ken-for-tests")
    yield site.start()
    status, head, _ = yield site.admin_get("/stats.json")
    assert status == 200
    site.token = None
    for path in ("/stats.json", "/metrics", "/sites/shop", "/log", "/health"):
        status, head, _ = yield site.admin_get(path)
        assert status == 401, path
        assert b"WWW-Authenticate: Bearer" in head
    status, _, _ = yield site.admin_get("/stats.json", "Authorization: Bearer wrong\r\n")
    assert status == 401
    site.token = "t0ken-for-tests"
    for path, code in (("/sites/nowhere", 404), ("/stats.json?x=1", 400), ("/log?status=9xx", 400),
                       ("/log?site=nowhere", 404), ("/sites/shop/dry-run", 405)):
        status, _, _ = yield site.admin_get(path)
        assert status == code, path
    status, head, body = yield site.admin_get("/sites/shop", "Accept: application/json\r\n")
    assert status == 200 and json.loads(body)["site"] == "shop"
    status, head, body = yield site.admin_get("/sites/shop")
    assert status == 200 and b"text/html" in head and b"<table" in body


@pytest_twisted.inlineCallbacks
def test_site_page_in_chromium(shop: Site) -> Any:
    """The admin's ``/sites/shop`` through ``twistd prexy --workers 2``,
    loaded by headless Chromium: its rules table with the counts the JSON
    gives, the never-matching rule marked, and the histogram's bars."""
    from .browser import find_chromium, parse_dom, rendered, site_view

    if find_chromium() is None:
        pytest.skip("no chromium binary (.ci/run installs Debian's; PREXY_CHROMIUM names another)")
    yield shop.start()
    sent = list(PAGES) * 2
    yield defer.gatherResults([shop.get(path) for path in sent])
    report = yield shop.report_with(len(sent))
    page = yield rendered(f"http://127.0.0.1:{shop.admin}/sites/shop")
    assert page.console == [], page.console
    view = site_view(parse_dom(page.dom))
    assert view.site == "shop"
    assert {n: (r.matches, r.responses) for n, r in view.rules.items()} == {
        r["number"]: (r["matches"], r["responses"]) for r in report["rules"]
    }
    assert [n for n, r in view.rules.items() if r.never_matched] == [5]
    assert view.rules[1].origin == f"{shop.rules}:2"
    shown = sum(bar.count for bar in view.bars if bar.series == "pass")
    assert shown == len(sent)
    assert all((bar.height > 0) == (bar.count > 0) for bar in view.bars)


@pytest_twisted.inlineCallbacks
def test_prexy_log_by_rule(shop: Site, cleanup: Cleanups) -> Any:
    """``prexy log --rule 4`` prints exactly the requests in which rule 4
    fired, from both workers, once it says it follows the server."""
    from .test_observe_cli import Child

    yield shop.start()
    child = Child("log", "--config", os.path.join(shop.dir, "prexy.toml"), "--rule", "4")
    cleanup(child.stop)
    yield child.printed(lambda err: b"following" in err, stream="err")
    paths = list(PAGES) * 2
    yield defer.gatherResults([shop.get(path) for path in paths])
    wanted = sorted(p for p in paths if b"checkout-v1" in PAGES[p])
    yield child.printed(lambda out: out.count(b"\n") >= len(wanted))
    lines = child.out.decode().splitlines()
    assert sorted(line.split()[3] for line in lines) == wanted, lines
    assert all(" shop GET " in line and " 200 " in line and "rules=" in line for line in lines)
    assert all("4" in line.split("rules=")[1].split()[0].split(",") for line in lines)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
@pytest_twisted.inlineCallbacks
def test_prexy_top_in_tmux(shop: Site, cleanup: Cleanups) -> Any:
    """``prexy top`` in a terminal (tmux) shows the request rate of a
    running ``twistd prexy --workers 2`` and its site and rules."""
    from twisted.internet import utils

    from .test_observe_cli import CLI, pane_shows

    yield shop.start()
    tmux = [shutil.which("tmux") or "tmux", "-S", os.path.join(shop.dir, "tmux.sock")]
    env = child_env()
    inner = " ".join([
        "env", f"PYTHONPATH={env['PYTHONPATH']}", sys.executable, *CLI, "top", "--interval", "0.5",
        "--config", os.path.join(shop.dir, "prexy.toml"),
    ])
    yield utils.getProcessOutput(tmux[0], [*tmux[1:], "-f", "/dev/null", "new-session", "-d", "-s", "view",
                                           "-x", "140", "-y", "40", f"{inner}; sleep 600"],
                                 env=dict(os.environ), errortoo=True)
    cleanup(lambda: utils.getProcessOutput(tmux[0], [*tmux[1:], "kill-server"], env=dict(os.environ),
                                           errortoo=True))
    traffic = task.LoopingCall(lambda: shop.get("/p/3.html"))
    traffic.start(0.02)
    cleanup(lambda: traffic.running and traffic.stop())
    shown = yield pane_shows(tmux, "shop.rules:5")
    traffic.stop()
    rate = next(line for line in shown.splitlines() if line.lstrip().startswith("requests"))
    assert float(rate.split()[1].rstrip("/s")) > 0, shown
    assert "shop" in shown


@pytest_twisted.inlineCallbacks
def test_a_reload_that_changes_the_rules_starts_their_counters_again(shop: Site) -> Any:
    """After a reload with a changed rules file, /sites/shop.json lists the
    new rules (numbers, lines, patterns) with the counts of the traffic
    since, summed over both workers."""
    yield shop.start()
    yield defer.gatherResults([shop.get(path) for path in PAGES])
    yield shop.report_with(len(PAGES))
    with open(shop.rules, "w") as f:
        f.write("replace_filter 'UA-11111-1' 'UA-22222-2' g;\nreplace_filter 'nowhere-at-all' 'x' g;\n")
    client = RawClient(b"POST /reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
    yield connect(shop.admin, client)
    assert b" 200 " in bytes(client.data).split(b"\r\n", 1)[0], bytes(client.data)
    sent = list(PAGES)[:5]
    bodies = yield defer.gatherResults([shop.get(path) for path in sent])
    assert all(b"UA-22222-2" in body for body in bodies)
    report = yield shop.report_with(len(PAGES) + len(sent))

    from prexy.worker import METRICS_INTERVAL

    # Both workers report on their own timers: wait until the new rules'
    # counts hold every request since the reload.
    for _ in range(40):
        if report["rules"] and report["rules"][0]["pattern"] == "UA-11111-1" and report["rules"][0]["responses"] == len(sent):
            break
        yield task.deferLater(reactor, METRICS_INTERVAL / 4, lambda: None)
        report = yield shop.report_with(len(PAGES) + len(sent))
    assert [(r["number"], r["line"], r["pattern"]) for r in report["rules"]] == [
        (1, 1, "UA-11111-1"), (2, 2, "nowhere-at-all"),
    ]
    assert report["rules"][0]["matches"] == len(sent)
    assert report["never_matched"] == [2]
