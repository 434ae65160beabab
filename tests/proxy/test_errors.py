"""The answers Prexy makes itself, in memory, over HTTP/1.1 and HTTP/2:

- an upstream that fails before any byte of the answer went out (the head
  held while the body is rewritten) gets a 502, on a connection that goes
  on serving; once the head went out the client is still reset;
- no generated answer, head or body, names the upstream's host or port
  (the reason is logged, one line);
- a site's error pages are served for those answers only (exact status,
  then class), never for an error the upstream sends itself.
"""

from __future__ import annotations

from typing import Any

import h2.events
from twisted.internet.error import ConnectionLost
from twisted.internet.error import TimeoutError as TxTimeout
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import CachePolicy
from prexy.cache.store import Store
from prexy.config import Config, SiteConfig, Timeouts, UpstreamURL
from prexy.errorpages import NO_PAGES, ErrorPage, ErrorPages
from prexy.proxy import forward
from prexy.proxy.caching import CacheLayer
from prexy.substitution import parse_rules
from tests.cases import tmp_dir

from .support import Harness, Logged, header, parse_response, site_runtime
from .test_http2 import H2Client, body

#: A distinctive upstream: neither its host nor its port may reach a client.
UPSTREAM = "http://10.9.8.7:8123"
SECRETS = (b"10.9.8.7", b"8123")

RULES = b"replace_filter 'www\\.origin\\.example' 'www.clone.example' g;\nreplace_filter_types text/html;\n"
#: A rule whose match, once begun, may go on for a long time: the
#: transducer holds what it has read until the match ends or fails.
HOLDING_RULES = b"replace_filter '<!--[^>]*-->' '' g;\nreplace_filter_types text/html;\n"

HEAD_1000 = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nETag: \"v1\"\r\nContent-Length: 1000\r\n\r\n"
GET = b"GET /page HTTP/1.1\r\nHost: shop.test\r\n\r\n"

PAGE_5XX = ErrorPage("/etc/prexy/errors/5xx.html", b"<h1>We'll be back</h1>", b"text/html; charset=utf-8")
PAGE_504 = ErrorPage("/etc/prexy/errors/504.html", b"<h1>Slow</h1>", b"text/html; charset=utf-8")
PAGE_4XX = ErrorPage("/etc/prexy/errors/4xx.txt", b"not here\n", b"text/plain; charset=utf-8")
PAGES = ErrorPages((("5xx", PAGE_5XX), ("504", PAGE_504), ("4xx", PAGE_4XX)))


def harness(rules: bytes | None = None, pages: ErrorPages = NO_PAGES, max_request_body: int = 1024) -> Harness:
    config = Config(
        listen=("tcp:0",),
        sites=(SiteConfig("s", UpstreamURL.parse(UPSTREAM), hosts=("shop.test",), error_pages=pages),),
        default_site="s",
        timeouts=Timeouts(connect=5, first_byte=10, idle=7, pool_idle=30),
        max_request_body=max_request_body,
    )
    ruleset = parse_rules(rules, "test.rules") if rules is not None else None
    return Harness(config, site_runtime(config, s={"rules": ruleset}))


class HeadHeldTests(SynchronousTestCase):
    """The upstream fails while nothing of the answer has been sent."""

    def assert_502(self, raw: bytes) -> None:
        status, headers, out = parse_response(raw)
        self.assertEqual((status, out), (502, b"502 Bad Gateway\n"), raw)
        # Nothing of the upstream's head that was being prepared.
        for name in (b"etag", b"trailer", b"server-timing", b"via", b"cache-status", b"transfer-encoding"):
            self.assertEqual(header(headers, name), [], name)
        self.assertEqual(header(headers, b"content-length"), [b"16"])

    def test_upstream_dies_before_the_rewrite_ran(self) -> None:
        """The body's first bytes arrive with the end of the upstream's
        connection, before the rewrite's turn: a 502, not a closed
        connection (which a keep-alive client takes for an idle close and
        retries silently), and the connection serves the next request."""
        logged = Logged(self)
        h = harness(RULES)
        channel, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(HEAD_1000 + b"<p>www.origin.example</p>" * 4)
        conn.close(Failure(ConnectionLost("origin died")))
        h.settle()
        self.assertFalse(client.disconnecting)
        self.assert_502(client.value())
        self.assertEqual(h.metrics.counters[("prexy_upstream_errors_total", (("kind", "mid-body"),))], 1)
        [line] = [x for x in logged.lines if "failed mid-body" in x]
        self.assertIn("answering 502", line)
        self.assertIn("10.9.8.7:8123", line)  # the log names the upstream
        client.clear()
        channel.dataReceived(GET)
        h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 2\r\n\r\nok")
        h.settle()
        self.assertEqual(parse_response(client.value())[::2], (200, b"ok"))

    def test_a_held_match_holds_the_head(self) -> None:
        """A match under way holds the rewritten bytes, and so the head:
        the upstream dying then still gets a 502."""
        h = harness(HOLDING_RULES)
        _, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(HEAD_1000 + b"<!-- a long comment " + b"x" * 300)
        h.settle()
        self.assertEqual(client.value(), b"")  # held
        conn.close(Failure(ConnectionLost("origin died")))
        h.settle()
        self.assert_502(client.value())
        self.assertFalse(client.aborted)

    def test_http10_client(self) -> None:
        """An HTTP/1.0 client (no chunked framing, no trailers) too."""
        h = harness(RULES)
        _, client = h.send(b"GET /page HTTP/1.0\r\nHost: shop.test\r\n\r\n")
        conn = h.conns[0]
        conn.reply(HEAD_1000 + b"<p>x</p>")
        conn.close(Failure(ConnectionLost("origin died")))
        h.settle()
        self.assertTrue(client.value().startswith(b"HTTP/1.0 502 Bad Gateway\r\n"), client.value())
        self.assertTrue(client.value().endswith(b"\r\n\r\n502 Bad Gateway\n"))

    def test_after_the_head_the_client_is_reset(self) -> None:
        """Once rewritten bytes went out, the answer cannot turn into a
        502: the client is reset, never given a clean short answer."""
        h = harness(RULES)
        _, client = h.send(GET)
        conn = h.conns[0]
        conn.reply(HEAD_1000 + b"<p>www.origin.example</p>")
        h.settle()
        self.assertTrue(client.value().startswith(b"HTTP/1.1 200 OK\r\n"))
        conn.close(Failure(ConnectionLost("origin died")))
        h.settle()
        self.assertTrue(client.aborted)
        self.assertNotIn(b"502", client.value())

    def test_a_site_page_for_it(self) -> None:
        """The 502 gets the site's page for its class."""
        h = harness(RULES, PAGES)
        _, client = h.send(GET)
        h.conns[0].reply(HEAD_1000 + b"<p>x</p>")
        h.conns[0].close(Failure(ConnectionLost("origin died")))
        h.settle()
        status, headers, out = parse_response(client.value())
        self.assertEqual((status, out), (502, PAGE_5XX.body))
        self.assertEqual(header(headers, b"content-type"), [PAGE_5XX.content_type])

    def test_failed_rewrite_before_the_head_is_500(self) -> None:
        """A rewrite that fails before anything went out (an HTTP/1.0
        client's body is rewritten before its head) is Prexy's own failure:
        a 500, logged with its traceback."""

        class Broken:
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                self.bailed_out = self.timed_out = False
                self.scan_seconds = 0.0
                self.rules_matched: list[Any] = []

            def feed(self, data: bytes) -> bytes:
                raise RuntimeError("broken rule")

            finish = feed

        self.patch(forward, "Transducer", Broken)
        h = harness(RULES)
        _, client = h.send(b"GET /page HTTP/1.0\r\nHost: shop.test\r\n\r\n")
        h.conns[0].reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 8\r\n\r\n<p>x</p>")
        h.settle()
        raw = client.value()
        self.assertTrue(raw.startswith(b"HTTP/1.0 500 Internal Server Error\r\n"), raw)
        self.assertTrue(raw.endswith(b"\r\n\r\n500 Internal Server Error\n"), raw)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_stale_copy_instead(self) -> None:
        """A cached object whose stale-if-error window is open is served
        instead of the 502 (RFC 5861), and kept."""
        site = SiteConfig("s", UpstreamURL.parse(UPSTREAM), cache=CachePolicy(grace=0))
        config = Config(listen=("tcp:0",), sites=(site,), default_site="s")
        h = Harness(config, site_runtime(config, s={"rules": parse_rules(HOLDING_RULES, "test.rules")}))
        store = Store.open(str(tmp_dir(self)), 64 << 20, clock=h.clock.seconds)
        self.addCleanup(store.close)
        h.resource.cache = CacheLayer(h.clock, store, h.metrics)
        page = b"<p>page</p>"
        _, client = h.send(GET)
        h.conns[-1].reply(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nCache-Control: max-age=10, stale-if-error=300\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(page), page)
        )
        h.settle()
        self.assertEqual(parse_response(client.value())[::2], (200, page))
        h.clock.advance(20)
        for _ in range(2):
            _, client = h.send(GET)
            h.conns[-1].reply(HEAD_1000 + b"<!-- held")
            h.settle()
            h.conns[-1].close(Failure(ConnectionLost("origin died")))
            h.settle()
            status, headers, out = parse_response(client.value())
            self.assertEqual((status, out), (200, page))
            self.assertIn(b"stale-if-error", b" ".join(header(headers, b"cache-status")))
            self.assertEqual(header(headers, b"etag"), [])  # nothing of the failed answer's head

    def test_http2_stream_gets_502(self) -> None:
        """Over HTTP/2: a 502 on the stream, not RST_STREAM; the connection
        goes on."""
        h = harness(RULES)
        c = H2Client(h)
        c.get(1, b"/page")
        conn = h.conns[-1]
        conn.sent()
        conn.reply(HEAD_1000 + b"<p>www.origin.example</p>")
        conn.close(Failure(ConnectionLost("origin died")))
        events = c.flush()
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        fields = dict(head.headers)
        self.assertEqual(fields[b":status"], b"502")
        self.assertNotIn(b"etag", fields)
        self.assertEqual(body(events, 1), b"502 Bad Gateway\n")
        self.assertFalse(any(isinstance(e, h2.events.StreamReset) for e in events), events)
        self.assertTrue(any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 1 for e in events))
        c.get(3, b"/next")
        self.assertIn(b"GET /next ", h.conns[-1].sent())

    def test_http2_after_the_head_resets_the_stream(self) -> None:
        h = harness(RULES)
        c = H2Client(h)
        c.get(1, b"/page")
        conn = h.conns[-1]
        conn.sent()
        conn.reply(HEAD_1000 + b"<p>www.origin.example</p>")
        c.flush()
        conn.close(Failure(ConnectionLost("origin died")))
        events = c.flush()
        self.assertTrue(any(isinstance(e, h2.events.StreamReset) for e in events), events)


class NoLeakTests(SynchronousTestCase):
    """Every answer Prexy makes itself, over HTTP/1.1 and HTTP/2: a generic
    body and no header naming the upstream."""

    def answers(self, h: Harness | None = None) -> dict[str, bytes]:
        """Each generated answer over HTTP/1.1, raw, by what caused it."""
        out: dict[str, bytes] = {}
        h = h or harness()
        h.refuse = True
        out["refused"] = h.send(GET)[1].value()
        h.refuse = False
        h.hold_connect = True
        _, client = h.send(GET)
        h.held[-1][0].errback(Failure(TxTimeout()))
        out["connect timeout"] = client.value()
        h.hold_connect = False
        _, client = h.send(GET)
        h.clock.advance(10.1)
        out["first byte timeout"] = client.value()
        _, client = h.send(GET)
        h.conns[-1].reply(b"SSH-2.0-OpenSSH\r\n\r\n")
        out["garbage"] = client.value()
        _, client = h.send(GET)
        h.conns[-1].reply(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX: a\x00b\r\n\r\nhello")
        out["bad header"] = client.value()
        _, client = h.send(GET)
        h.conns[-1].close(Failure(ConnectionLost("closed")))
        out["closed before answering"] = client.value()
        out["413"] = h.send(b"POST / HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 5000\r\n\r\n")[1].value()
        out["400 target"] = h.send(b"GET foo HTTP/1.1\r\nHost: shop.test\r\n\r\n")[1].value()
        out["405 trace"] = h.send(b"TRACE / HTTP/1.1\r\nHost: shop.test\r\n\r\n")[1].value()
        out["405 purge"] = h.send(b"PURGE / HTTP/1.1\r\nHost: shop.test\r\n\r\n")[1].value()
        out["400 head"] = h.send(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")[1].value()
        _, client = h.send(b"GET / HTTP/1.1\r\nHost: shop.test\r\n")
        h.clock.advance(61)
        out["408"] = client.value()
        return out

    def test_http1(self) -> None:
        logged = Logged(self)
        expected = {
            "refused": 502, "connect timeout": 504, "first byte timeout": 504, "garbage": 502, "bad header": 502,
            "closed before answering": 502, "413": 413, "400 target": 400, "405 trace": 405, "405 purge": 405,
            "400 head": 400, "408": 408,
        }
        answers = self.answers()
        self.assertEqual(set(answers), set(expected))
        for what, raw in answers.items():
            with self.subTest(what=what):
                status, headers, out = parse_response(raw)
                self.assertEqual(status, expected[what], raw)
                for secret in SECRETS:
                    self.assertNotIn(secret, raw)
                self.assertEqual(out, b"%d %s\n" % (status, raw.split(b" ", 2)[2].split(b"\r\n")[0]))
                self.assertEqual(header(headers, b"content-type"), [b"text/plain; charset=utf-8"])
        # The upstream's reasons, with its address, are in the log.
        self.assertIn("cannot connect to 10.9.8.7:8123", logged.text)

    def test_site_pages(self) -> None:
        """With pages: each answer gets its exact status's page, else its
        class's, with the page's type and length."""
        answers = self.answers(harness(pages=PAGES))
        for what, raw in answers.items():
            with self.subTest(what=what):
                status, headers, out = parse_response(raw)
                page = PAGE_504 if status == 504 else PAGE_5XX if status >= 500 else PAGE_4XX
                self.assertEqual(out, page.body, raw)
                self.assertEqual(header(headers, b"content-type"), [page.content_type])
                self.assertEqual(header(headers, b"content-length"), [b"%d" % len(page.body)])

    def test_head_request_gets_the_length_only(self) -> None:
        h = harness(pages=PAGES)
        h.refuse = True
        raw = h.send(b"HEAD / HTTP/1.1\r\nHost: shop.test\r\n\r\n")[1].value()
        self.assertTrue(raw.startswith(b"HTTP/1.1 502 Bad Gateway\r\n"))
        self.assertIn(b"Content-Length: %d\r\n" % len(PAGE_5XX.body), raw)
        self.assertTrue(raw.endswith(b"\r\n\r\n"))

    def test_proxied_answer_headers(self) -> None:
        """What Prexy adds to a proxied answer (Via, Server-Timing,
        Cache-Status) and the redirect it rewrites (proxy_redirect default)
        do not name the upstream, over HTTP/1.1 and HTTP/2."""
        redirect = b"HTTP/1.1 302 Found\r\nLocation: http://10.9.8.7:8123/next\r\nContent-Length: 0\r\n\r\n"
        h = harness(RULES)
        _, client = h.send(GET)
        h.conns[-1].reply(redirect)
        raw = client.value()
        self.assertIn(b"Location: http://shop.test:8080/next\r\n", raw)  # (the listener's port)
        for secret in SECRETS:
            self.assertNotIn(secret, raw)
        c = H2Client(h)
        c.get(1, b"/page")
        h.conns[-1].reply(redirect)
        events = c.flush()
        [head] = [e for e in events if isinstance(e, h2.events.ResponseReceived)]
        self.assertEqual(dict(head.headers)[b"location"], b"http://a:8443/next")  # (a cleartext stream here)
        for name, value in head.headers:
            for secret in SECRETS:
                self.assertNotIn(secret, name + value)

    def test_exception_while_routing(self) -> None:
        """An exception in the resource: a 500 with the site's page (never
        twisted.web's page or a traceback), the traceback in the log."""
        for pages, expected in ((NO_PAGES, b"500 Internal Server Error\n"), (PAGES, PAGE_5XX.body)):
            h = harness(pages=pages)

            def boom(request: Any) -> Any:
                raise RuntimeError("at 10.9.8.7:8123")

            h.resource.render = boom  # type: ignore[method-assign]
            raw = h.send(GET)[1].value()
            status, _, out = parse_response(raw)
            self.assertEqual((status, out), (500, expected), raw)
            for secret in SECRETS:
                self.assertNotIn(secret, raw)
            self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)

    def test_upstream_errors_pass_through(self) -> None:
        """An error the upstream answers itself is its own answer: it
        passes untouched, never replaced by a page."""
        h = harness(pages=PAGES)
        _, client = h.send(GET)
        h.conns[-1].reply(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 4\r\n\r\nbusy")
        status, headers, out = parse_response(client.value())
        self.assertEqual((status, out), (503, b"busy"))
        self.assertEqual(header(headers, b"content-type"), [b"text/plain"])

    def test_http2(self) -> None:
        """Over HTTP/2: an upstream that refuses, a 413, a refused head."""
        for pages in (NO_PAGES, PAGES):
            h = harness(pages=pages)
            c = H2Client(h)
            h.refuse = True
            events: list[Any] = c.get(1, b"/x")
            events += c.get(3, b"/y", body=b"x" * 5000)
            events += c.get(5, b"/a b")
            heads = {e.stream_id: dict(e.headers) for e in events if isinstance(e, h2.events.ResponseReceived)}
            for sid, status in ((1, 502), (3, 413), (5, 400)):
                with self.subTest(sid=sid, pages=bool(pages)):
                    fields = heads[sid]
                    self.assertEqual(fields[b":status"], b"%d" % status)
                    page = pages.page_for(status)
                    expected = page.body if page else b"%d %s\n" % (status, {502: b"Bad Gateway", 413: b"Payload Too Large", 400: b"Bad Request"}[status])
                    self.assertEqual(body(events, sid), expected)
                    for name, value in fields.items():
                        for secret in SECRETS:
                            self.assertNotIn(secret, name + value)
