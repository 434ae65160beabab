"""The site's header rules (``prexy.headerrules``) through the proxy, in
memory: nginx's default redirect on every site, directives from the rules
file, ``replace_filter_headers`` with the body rules, the cache storing the
rewritten headers, and a rules file that holds header directives only."""

from __future__ import annotations

import os
import tempfile

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import CachePolicy
from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.proxy.caching import CacheLayer
from prexy.runtime import build_runtime
from tests.cases import unlinked_store

from .support import Harness, header, parse_response

REDIRECT = (
    b"HTTP/1.1 302 Found\r\nLocation: https://www.origin.test/login\r\n"
    b"Set-Cookie: sid=1; Domain=www.origin.test; Path=/app/\r\n"
    b"Link: <https://www.origin.test/style.css>; rel=preload\r\n"
    b"Cache-Control: max-age=60\r\nContent-Length: 0\r\n\r\n"
)


def harness(rules: bytes | None = None, cache: bool = False) -> Harness:
    files: tuple[str, ...] = ()
    if rules is not None:
        with tempfile.NamedTemporaryFile("wb", suffix=".rules", delete=False) as f:
            f.write(rules)
        files = (f.name,)
    site = SiteConfig("s", UpstreamURL.parse("https://www.origin.test"), host_header="upstream", rules=files,
                      cache=CachePolicy() if cache else None)
    config = Config(listen=("tcp:0",), sites=(site,), default_site="s")
    try:
        runtime = build_runtime(config)
    finally:
        for path in files:  # compiled now: nothing reads the file again
            os.unlink(path)
    h = Harness(config, runtime)
    if cache:
        store = unlinked_store("prexy-headers-", 64 << 20, h.clock.seconds)
        h.resource.cache = CacheLayer(h.clock, store, h.metrics)
    return h


def get(h: Harness, reply: bytes | None = REDIRECT, method: bytes = b"GET") -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    _, client = h.send(method + b" /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
    if reply is not None:
        conn = h.conns[-1]
        conn.sent()
        conn.reply(reply)
    h.settle()
    return parse_response(client.value())


class HeaderRulesTests(SynchronousTestCase):
    def test_default_redirect_on_every_site(self) -> None:
        """No rules file: nginx's proxy_redirect default sends the upstream's
        own URL to the clone's scheme, host and port; cookies untouched."""
        _, headers, _ = get(harness())
        self.assertEqual(header(headers, b"location"), [b"http://clone.test:8080/login"])
        self.assertEqual(header(headers, b"set-cookie"), [b"sid=1; Domain=www.origin.test; Path=/app/"])

    def test_directives_from_the_rules_file(self) -> None:
        """A rules file with header directives only: bodies are not
        rewritten (no rule set), the headers are."""
        h = harness(b"proxy_redirect https://www.origin.test/ https://$host/;\n"
                    b"proxy_cookie_domain www.origin.test $host; proxy_cookie_path /app/ /;\n")
        self.assertIsNone(h.runtime.default.rules)
        _, headers, _ = get(h)
        self.assertEqual(header(headers, b"location"), [b"https://clone.test/login"])
        self.assertEqual(header(headers, b"set-cookie"), [b"sid=1; Domain=clone.test; Path=/"])

    def test_replace_filter_headers(self) -> None:
        """replace_filter_headers runs the body rules on the named headers."""
        h = harness(b"replace_filter 'www\\.origin\\.test' 'clone.test' g;\nreplace_filter_headers Link;\n")
        _, headers, _ = get(h)
        self.assertEqual(header(headers, b"link"), [b"<https://clone.test/style.css>; rel=preload"])

    def test_head_rewritten_too(self) -> None:
        _, headers, _ = get(harness(), method=b"HEAD")
        self.assertEqual(header(headers, b"location"), [b"http://clone.test:8080/login"])

    def test_cache_stores_the_rewritten_headers(self) -> None:
        """A hit carries the rewritten Location, with no new fetch (an
        answer with Set-Cookie is not stored at all)."""
        h = harness(b"proxy_redirect https://www.origin.test/ https://$host/shop/;\n", cache=True)
        _, headers, _ = get(h, reply=REDIRECT.replace(b"Set-Cookie: sid=1; Domain=www.origin.test; Path=/app/\r\n", b""))
        self.assertIn(b"stored", b" ".join(header(headers, b"cache-status")))
        status, headers, _ = get(h, reply=None)
        self.assertEqual(status, 302)
        self.assertIn(b"hit", b" ".join(header(headers, b"cache-status")))
        self.assertEqual(header(headers, b"location"), [b"https://clone.test/shop/login"])

    def test_header_rules_change_the_cache_key(self) -> None:
        """Two header-rule sets never share cache entries (rules_version)."""
        one = harness(b"proxy_cookie_path / /a/;\n").runtime.default
        two = harness(b"proxy_cookie_path / /b/;\n").runtime.default
        plain = harness().runtime.default
        self.assertNotEqual(one.rules_version, two.rules_version)
        self.assertEqual(plain.rules_version, "")

    def test_untouched_response_skips_the_rules(self) -> None:
        """A response without the headers the rules touch passes as it is."""
        _, headers, _ = get(harness(), reply=b"HTTP/1.1 200 OK\r\nX-Location: https://www.origin.test/\r\nContent-Length: 0\r\n\r\n")
        self.assertEqual(header(headers, b"x-location"), [b"https://www.origin.test/"])

    def test_bad_directive_refused_with_file_and_line(self) -> None:
        """A bad header directive refuses the whole config: file, line, reason."""
        from prexy.config import ConfigError

        with tempfile.NamedTemporaryFile("wb", suffix=".rules", delete=False) as f:
            f.write(b"replace_filter a b;\n\nproxy_cookie_domain ~(broken x;\n")
        self.addCleanup(os.unlink, f.name)
        site = SiteConfig("s", UpstreamURL.parse("http://o.test"), rules=(f.name,))
        with self.assertRaises(ConfigError) as caught:
            build_runtime(Config(listen=("tcp:0",), sites=(site,), default_site="s"))
        self.assertIn(f"{f.name}:3", str(caught.exception))
        self.assertIn("bad regex", str(caught.exception))


class EarlyHintsTests(SynchronousTestCase):
    """103 Early Hints from the upstream, passed on before the answer."""

    def test_forwarded_before_the_answer(self) -> None:
        """The 103 (after the header rules) reaches an HTTP/1.1 client
        before the final head; a 100 Continue does not."""
        h = harness(b"replace_filter 'www\\.origin\\.test' 'clone.test' g;\nreplace_filter_headers Link;\n")
        _, client = h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n"
                   b"Link: <https://www.origin.test/a.css>; rel=preload\r\n\r\n")
        self.assertEqual(client.value(), b"HTTP/1.1 103 Early Hints\r\nLink: <https://clone.test/a.css>; rel=preload\r\n\r\n")
        conn.reply(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
        h.settle()
        interim, _, final = client.value().partition(b"\r\n\r\n")
        self.assertEqual(parse_response(final)[::2], (200, b"ok"))
        self.assertEqual(h.metrics.counters[("prexy_interim_responses_total", (("status", "103"),))], 1)

    def test_not_to_http10_clients(self) -> None:
        """HTTP/1.0 has no 1xx: the client gets the answer alone."""
        h = harness()
        _, client = h.send(b"GET /x HTTP/1.0\r\nHost: clone.test\r\n\r\n")
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
                   b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        h.settle()
        self.assertNotIn(b"103", client.value())
        self.assertEqual(parse_response(client.value())[::2], (200, b"ok"))

    def test_never_cached(self) -> None:
        """A hit does not repeat the 103 the miss passed on."""
        h = harness(cache=True)
        _, client = h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
        conn = h.conns[-1]
        conn.sent()
        conn.reply(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
                   b"HTTP/1.1 200 OK\r\nCache-Control: max-age=60\r\nContent-Length: 2\r\n\r\nok")
        h.settle()
        self.assertTrue(client.value().startswith(b"HTTP/1.1 103"))
        _, again = h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
        h.settle()
        self.assertTrue(again.value().startswith(b"HTTP/1.1 200"))


EDITS = (b"add_header X-Frame-Options DENY;\nadd_header Strict-Transport-Security max-age=99 always;\n"
         b"add_header X-Seen '$remote_addr $request_uri';\nproxy_hide_header X-Powered-By;\n")
PAGE = (b"HTTP/1.1 200 OK\r\nX-Powered-By: PHP\r\nETag: \"v1\"\r\nCache-Control: max-age=60\r\n"
        b"Content-Length: 2\r\n\r\nok")


def edited(headers: list[tuple[bytes, bytes]]) -> tuple[list[bytes], ...]:
    """What EDITS decide on an answer's head."""
    return tuple(header(headers, n) for n in (b"x-frame-options", b"strict-transport-security", b"x-seen",
                                                b"x-powered-by"))


ADDED = ([b"DENY"], [b"max-age=99"], [b"10.1.2.3 /x"], [])
ALWAYS = ([], [b"max-age=99"], [], [])


class HeaderEditsTests(SynchronousTestCase):
    """add_header, proxy_hide_header and proxy_set_header
    (``prexy.headeredits``) on every way an answer leaves: a miss, a hit,
    a 304 from the cache, a follower of a miss, a refreshed stale copy and
    Prexy's own errors; and on the request sent upstream."""

    def test_miss(self) -> None:
        """Added on a 200 (hidden removed); on a 404 the always one only."""
        h = harness(EDITS)
        self.assertEqual(edited(get(h, reply=PAGE)[1]), ADDED)
        status, headers, _ = get(h, reply=PAGE.replace(b"200 OK", b"404 Not Found"))
        self.assertEqual((status, edited(headers)), (404, ALWAYS))

    def test_hit_and_304_from_the_cache(self) -> None:
        """A hit and a 304 from the stored object get what the miss got;
        the hidden header, stored, stays hidden."""
        h = harness(EDITS, cache=True)
        self.assertEqual(edited(get(h, reply=PAGE)[1]), ADDED)
        status, headers, _ = get(h, reply=None)
        self.assertIn(b"hit", b" ".join(header(headers, b"cache-status")))
        self.assertEqual((status, edited(headers)), (200, ADDED))
        _, client = h.send(b'GET /x HTTP/1.1\r\nHost: clone.test\r\nIf-None-Match: "v1"\r\n\r\n')
        h.settle()
        status, headers, _ = parse_response(client.value())
        self.assertEqual((status, edited(headers)), (304, ADDED))

    def test_follower(self) -> None:
        """A request that follows a miss in flight gets the edits too."""
        h = harness(EDITS, cache=True)
        _, first = h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
        _, second = h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
        self.assertEqual(len(h.conns), 1)
        h.conns[0].sent()
        h.conns[0].reply(PAGE)
        h.settle()
        for client in (first, second):
            self.assertEqual(edited(parse_response(client.value())[1]), ADDED)
        self.assertIn(b"collapsed", b" ".join(header(parse_response(second.value())[1], b"cache-status")))

    def test_refreshed_stale_copy(self) -> None:
        """A stale copy the upstream confirms with a 304 is served with the edits."""
        h = harness(EDITS, cache=True)
        get(h, reply=PAGE)
        h.clock.advance(120)
        _, client = h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")
        conn = h.conns[-1]
        self.assertIn(b'If-None-Match: "v1"', conn.sent())
        conn.reply(b'HTTP/1.1 304 Not Modified\r\nETag: "v1"\r\nCache-Control: max-age=60\r\n\r\n')
        h.settle()
        status, headers, body = parse_response(client.value())
        self.assertEqual((status, body, edited(headers)), (200, b"ok", ADDED))

    def test_own_error(self) -> None:
        """Prexy's own 502 carries the always headers only."""
        h = harness(EDITS)
        h.refuse = True
        status, headers, _ = get(h, reply=None)
        self.assertEqual((status, edited(headers)), (502, ALWAYS))

    def test_proxy_set_header(self) -> None:
        """The request upstream: set, replaced (any case), removed, Prexy's
        own X-Forwarded-For replaced by nginx's idiom."""
        h = harness(b"proxy_set_header Host $host; proxy_set_header x-real-ip $remote_addr;\n"
                    b"proxy_set_header Accept ''; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n")
        h.send(b"GET /x HTTP/1.1\r\nHost: clone.test\r\nAccept: */*\r\nX-Real-IP: 1.1.1.1\r\n"
               b"X-Forwarded-For: 192.0.2.1\r\n\r\n")
        sent = h.conns[-1].sent().split(b"\r\n\r\n")[0].split(b"\r\n")[1:]
        pairs = [(n.lower(), v) for n, _, v in (line.partition(b": ") for line in sent)]
        self.assertEqual(header(pairs, b"host"), [b"clone.test"])
        self.assertEqual(header(pairs, b"x-real-ip"), [b"10.1.2.3"])
        self.assertEqual(header(pairs, b"accept"), [])
        self.assertEqual(header(pairs, b"x-forwarded-for"), [b"192.0.2.1, 10.1.2.3"])

    def test_own_errors_of_the_site(self) -> None:
        """Own answers for a request routed to the site carry the always
        headers: a 405 (TRACE) and a 500 (an exception while routing)."""
        h = harness(EDITS)
        status, headers, _ = parse_response(h.send(b"TRACE /x HTTP/1.1\r\nHost: clone.test\r\n\r\n")[1].value())
        self.assertEqual((status, edited(headers)), (405, ALWAYS))

        def boom(request: object) -> object:
            raise RuntimeError("boom")

        h.resource.render = boom  # type: ignore[method-assign]
        status, headers, _ = get(h, reply=None)
        self.assertEqual((status, edited(headers)), (500, ALWAYS))
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
