"""The client side's strictness through the proxy, in memory: refused heads,
header and body deadlines, absolute-form routing, TRACE, GET with a body,
and the log that an attacker cannot fill.

Every refusal must reach the client as a whole HTTP answer with
``Connection: close``, close the connection, send nothing upstream, and log
one line at most.  Time is a MemoryReactorClock.
"""

from __future__ import annotations

import attrs
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Config, Limits, SiteConfig, Timeouts, UpstreamURL
from prexy.errorpages import ErrorPage, ErrorPages, phrase
from prexy.proxy.site import refusal_answer
from prexy.requesthead import Refusal

from .support import Harness, header, parse_response

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
GET = b"GET / HTTP/1.1\r\nHost: www.example.test\r\n\r\n"


def sites(*configs: SiteConfig, **kw: object) -> Config:
    return Config(listen=("tcp:0",), sites=configs, default_site=configs[0].name, **kw)  # type: ignore[arg-type]


class LogLines:
    """Collects the 'refused' lines the proxy logs during a test."""

    def __init__(self, case: SynchronousTestCase) -> None:
        self.lines: list[str] = []
        globalLogPublisher.addObserver(self)
        case.addCleanup(globalLogPublisher.removeObserver, self)

    def __call__(self, event: dict[str, object]) -> None:
        fmt = event.get("log_format")
        if isinstance(fmt, str) and fmt.startswith("refused a request"):
            assert event.get("log_level") == LogLevel.info
            self.lines.append(fmt.format(**{k: v for k, v in event.items() if isinstance(k, str)}))


class RefusedHeadTests(SynchronousTestCase):
    """Heads the gate refuses, through the channel."""

    #: The line ``refused`` saw logged.
    log_line = ""

    def refused(self, raw: bytes, status: int) -> bytes:
        h = Harness()
        log = LogLines(self)
        _, client = h.send(raw)
        answer = client.value()
        code, headers, body = parse_response(answer)
        self.assertEqual(code, status, answer)
        self.assertEqual(header(headers, b"connection"), [b"close"])
        self.assertEqual(int(header(headers, b"content-length")[0]), len(body))
        self.assertTrue(client.disconnecting)
        self.assertEqual(h.conns, [])  # nothing went upstream
        self.assertEqual(len(log.lines), 1)
        self.assertEqual(h.metrics.counters[("prexy_requests_total", (("status", str(status)),))], 1)
        self.assertEqual(self.flushLoggedErrors(), [])
        # The reason is in the log line, never in the body.
        self.assertEqual(body, b"%d %s\n" % (status, phrase(status)))
        self.log_line = log.lines[0]
        return body

    def test_obs_fold_hiding_transfer_encoding(self) -> None:
        self.refused(
            b"POST / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", 400)
        self.assertIn("obs-fold", self.log_line)

    def test_too_many_header_lines(self) -> None:
        """101 header lines: 431, counted and logged like the other head
        limits; 100 go upstream."""
        lines = b"".join(b"X-%d: v\r\n" % i for i in range(99))
        self.refused(b"GET / HTTP/1.1\r\nHost: a\r\n" + lines + b"X-99: v\r\n\r\n", 431)
        self.assertIn("431 too many header lines", self.log_line)
        h = Harness()
        h.send(b"GET / HTTP/1.1\r\nHost: a\r\n" + lines + b"\r\n")
        self.assertIn(b"x-98: v", h.conns[0].sent().lower())

    def test_chunked_and_identity_in_two_headers(self) -> None:
        self.refused(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n", 400)

    def test_transfer_encoding_on_http10(self) -> None:
        self.refused(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 400)

    def test_unknown_transfer_coding_is_501(self) -> None:
        self.refused(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501)

    def test_two_hosts(self) -> None:
        self.refused(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400)

    def test_missing_host_on_http11(self) -> None:
        self.refused(b"GET / HTTP/1.1\r\n\r\n", 400)

    def test_bad_hosts(self) -> None:
        for host in (b"a, b", b"a/b", b"a..b", b"a\x01b"):
            self.refused(b"GET / HTTP/1.1\r\nHost: " + host + b"\r\n\r\n", 400)

    def test_asterisk_and_control_bytes_in_target(self) -> None:
        self.refused(b"GET * HTTP/1.1\r\nHost: a\r\n\r\n", 400)
        self.refused(b"GET /a\x7fb HTTP/1.1\r\nHost: a\r\n\r\n", 400)

    def test_non_ascii_target_is_one_line_not_a_traceback(self) -> None:
        """36 bytes used to write 4 KB of traceback into the log."""
        self.refused(b"HEAD /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", 400)
        self.refused(b"GET /\xa9\x80 HTTP/1.1\r\nHost: a\r\n\r\n", 400)

    def test_long_request_line_is_414(self) -> None:
        self.refused(b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414)

    def test_long_header_is_431(self) -> None:
        self.refused(b"GET / HTTP/1.1\r\nHost: a\r\nX-A: " + b"a" * 40000 + b"\r\n\r\n", 431)

    def test_big_head_is_431(self) -> None:
        fields = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(70))
        self.refused(b"GET / HTTP/1.1\r\nHost: a\r\n" + fields + b"\r\n", 431)

    def test_lf_only_is_answered_not_left_waiting(self) -> None:
        self.refused(b"GET / HTTP/1.1\nHost: a\n\n", 400)

    def test_lf_only_chunked_body_is_answered_at_once(self) -> None:
        """twisted.web's decoder waits for a CRLF that never comes."""
        self.refused(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n", 400)

    def test_chunked_body_byte_by_byte_is_forwarded(self) -> None:
        h = Harness()
        channel, client = h.client()
        raw = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
        for i in range(len(raw)):
            channel.dataReceived(raw[i : i + 1])
        self.assertEqual(len(h.conns), 1)
        sent = h.conns[0].sent()
        self.assertTrue(sent.endswith(b"\r\n\r\nabcde") or b"abc" in sent, sent)
        h.conns[0].reply(OK)
        self.assertTrue(client.value().startswith(b"HTTP/1.1 200 OK"))

    def test_http2_preface_is_505(self) -> None:
        self.refused(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505)

    def test_refusal_after_a_served_request(self) -> None:
        """A bad head pipelined behind a good one: the good one is answered
        in full, then the refusal, then the close."""
        h = Harness()
        _, client = h.send(GET + b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
        self.assertEqual(len(h.conns), 1)
        h.conns[0].reply(OK)
        out = client.value()
        self.assertTrue(out.startswith(b"HTTP/1.1 200 OK\r\n"), out)
        self.assertIn(b"\r\n\r\nokHTTP/1.1 400 Bad Request\r\n", out)
        self.assertTrue(client.disconnecting)
        self.assertEqual(len(h.conns), 1)

    def test_good_heads_keep_twisted_limits_out_of_the_way(self) -> None:
        """A 30 KB head (nginx takes it; twisted.web's own 16 KB limit would
        answer 400) goes upstream."""
        h = Harness()
        fields = b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(30))
        h.send(b"GET / HTTP/1.1\r\nHost: a\r\n" + fields + b"\r\n")
        self.assertEqual(len(h.conns), 1)
        self.assertIn(b"x-29: ", h.conns[0].sent())

    def test_limits_come_from_the_site(self) -> None:
        h = Harness()
        h.site.limits = Limits(max_request_line=512, max_header_line=512, max_request_head=2048)
        _, client = h.send(b"GET /" + b"a" * 600 + b" HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertTrue(client.value().startswith(b"HTTP/1.1 414 URI Too Long\r\n"))

    def test_log_is_rate_limited(self) -> None:
        """Refusals log at most ten lines a second; the next line says how
        many were left out."""
        h = Harness()
        log = LogLines(self)
        for _ in range(50):
            h.send(b"GET * HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertEqual(len(log.lines), 10)
        h.clock.advance(1.0)
        h.send(b"GET * HTTP/1.1\r\nHost: a\r\n\r\n")
        self.assertEqual(len(log.lines), 11)
        self.assertIn("(40 more not logged)", log.lines[-1])
        self.assertEqual(h.metrics.counters[("prexy_requests_total", (("status", "400"),))], 51)

    def test_refusal_answer(self) -> None:
        """A generic body (the reason is logged), or the page given for the status."""
        raw = refusal_answer(Refusal(431, "header line too long"))
        self.assertEqual(
            raw,
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
            b"Content-Length: 36\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large\n",
        )
        pages = ErrorPages((("4xx", ErrorPage("4xx.html", b"<p>no</p>", b"text/html; charset=utf-8")),))
        self.assertEqual(
            refusal_answer(Refusal(400, "two Host headers"), pages),
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html; charset=utf-8\r\n"
            b"Content-Length: 9\r\nConnection: close\r\n\r\n<p>no</p>",
        )


class HeaderDeadlineTests(SynchronousTestCase):
    """``timeouts.client_header``: a head must arrive whole in time, however
    its bytes trickle in."""

    def test_trickled_head_gets_408(self) -> None:
        h = Harness()
        channel, client = h.client()
        head = b"GET / HTTP/1.1\r\nHost: a\r\n"
        for i in range(59):
            channel.dataReceived(head[i % len(head) : i % len(head) + 1] if i < len(head) else b"X")
            h.clock.advance(1)
        self.assertFalse(client.disconnecting)
        h.clock.advance(1)
        self.assertTrue(client.value().startswith(b"HTTP/1.1 408 Request Timeout\r\n"))
        self.assertTrue(client.disconnecting)
        self.assertEqual(h.conns, [])

    def test_client_that_does_not_read_its_refusal_is_cut_off(self) -> None:
        """A closed connection whose client does not read what was
        written is reset after ABORT_AFTER seconds, not left open."""
        from twisted.internet.address import IPv4Address
        from twisted.internet.testing import StringTransport

        from prexy.proxy.h1connection import ABORT_AFTER

        h = Harness()
        channel = h.site.buildProtocol(IPv4Address("TCP", "10.1.2.3", 5555))
        transport = StringTransport()  # loseConnection only marks it
        channel.makeConnection(transport)
        channel.dataReceived(b"GET / HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n")
        self.assertTrue(transport.value().startswith(b"HTTP/1.1 400 "))
        self.assertTrue(transport.disconnecting)
        self.assertFalse(transport.disconnected)
        h.clock.advance(ABORT_AFTER)
        self.assertTrue(transport.disconnected)  # abortConnection

    def test_silent_connection_closed_without_answer(self) -> None:
        h = Harness()
        _, client = h.client()
        h.clock.advance(59.9)
        self.assertFalse(client.disconnecting)
        h.clock.advance(0.2)
        self.assertTrue(client.disconnecting)
        self.assertEqual(client.value(), b"")

    def test_deadline_is_a_setting(self) -> None:
        h = Harness()
        h.site.timeouts = attrs.evolve(h.site.timeouts, client_header=5.0)
        channel, client = h.client()
        channel.dataReceived(b"GET / HTTP/1.1\r\n")
        h.clock.advance(5)
        self.assertTrue(client.value().startswith(b"HTTP/1.1 408 "))

    def test_zero_turns_it_off(self) -> None:
        h = Harness()
        h.site.timeouts = attrs.evolve(h.site.timeouts, client_header=0.0)
        channel, client = h.client()
        channel.dataReceived(b"GET / HTTP/1.1\r\n")
        h.clock.advance(70)  # the idle timeout (75 s) still applies
        self.assertFalse(client.disconnecting)
        h.clock.advance(10)
        self.assertTrue(client.disconnecting)

    def test_keep_alive_head_deadline_runs_from_its_first_byte(self) -> None:
        """After a request, the connection may idle (the keep-alive
        timeout); the next head's deadline starts with its first byte."""
        h = Harness()
        channel, client = h.send(GET)
        h.conns[0].reply(OK)
        h.clock.advance(50)
        channel.dataReceived(b"GET / HT")
        h.clock.advance(59)
        self.assertFalse(client.disconnecting)
        h.clock.advance(1)
        self.assertIn(b"HTTP/1.1 408 ", client.value())

    def test_whole_heads_arm_no_timer(self) -> None:
        """A head that comes in one read costs no timer at all (one timer
        per connection, for its first request)."""
        h = Harness()
        channel, client = h.send(GET)
        h.conns[0].reply(OK)
        before = len(h.clock.getDelayedCalls())
        for _ in range(5):
            channel.dataReceived(GET)
            h.conns[0].reply(OK)
        self.assertEqual(len(h.clock.getDelayedCalls()), before)
        self.assertEqual(client.value().count(b"HTTP/1.1 200 OK"), 6)

    def test_deadline_met_is_cancelled(self) -> None:
        h = Harness(timeouts=Timeouts(first_byte=100))
        channel, client = h.client()
        channel.dataReceived(b"GET / HTTP/1.1\r\n")
        h.clock.advance(30)
        channel.dataReceived(b"Host: a\r\n\r\n")
        h.clock.advance(40)  # past the head deadline, the upstream still thinking
        self.assertFalse(client.disconnecting)
        h.conns[0].reply(OK)
        self.assertTrue(client.value().startswith(b"HTTP/1.1 200 OK"))


class BodyDeadlineTests(SynchronousTestCase):
    """``timeouts.client_body``: the longest silence between two reads of a
    request body (nginx's meaning)."""

    POST = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n"

    def test_stalled_body_gets_408(self) -> None:
        h = Harness()
        channel, client = h.send(self.POST + b"abc")
        h.clock.advance(59)
        self.assertFalse(client.disconnecting)
        h.clock.advance(1)
        self.assertTrue(client.value().startswith(b"HTTP/1.1 408 Request Timeout\r\n"), client.value())
        self.assertTrue(client.disconnecting)
        self.assertEqual(h.conns, [])

    def test_slow_body_that_keeps_coming_is_served(self) -> None:
        h = Harness()
        channel, client = h.send(self.POST)
        for byte in b"abcdefghij":
            h.clock.advance(30)
            channel.dataReceived(bytes([byte]))
        self.assertEqual(len(h.conns), 1)
        h.conns[0].reply(OK)
        self.assertTrue(client.value().startswith(b"HTTP/1.1 200 OK"))

    def test_keep_alive_timeout_comes_back_after_a_body(self) -> None:
        h = Harness()
        h.site.timeouts = attrs.evolve(h.site.timeouts, client_body=10.0)
        channel, client = h.send(self.POST + b"abcdefghij")
        h.conns[0].reply(OK)
        h.clock.advance(70)  # past client_body, before the 75 s keep-alive timeout
        self.assertFalse(client.disconnecting)
        h.clock.advance(6)
        self.assertTrue(client.disconnecting)
        self.assertNotIn(b"408", client.value())


class RoutingTests(SynchronousTestCase):
    """What the proxy does with the heads that pass."""

    def config(self) -> Config:
        return sites(
            SiteConfig("a", UpstreamURL.parse("http://a.origin"), hosts=("a.test",)),
            SiteConfig("b", UpstreamURL.parse("http://b.origin"), hosts=("b.test",), host_header="upstream"),
        )

    def test_absolute_form_authority_wins_over_host(self) -> None:
        h = Harness(self.config())
        h.send(b"GET http://b.test/x?y HTTP/1.1\r\nHost: a.test\r\n\r\n")
        sent = h.conns[0].sent()
        self.assertTrue(sent.startswith(b"GET /x?y HTTP/1.1\r\n"), sent)
        self.assertIn(b"\r\nHost: b.origin\r\n", sent)  # site b's upstream Host
        self.assertIn(b"\r\nX-Forwarded-Host: b.test\r\n", sent)
        self.assertNotIn(b"a.test", sent)

    def test_trace_is_405_unless_allowed(self) -> None:
        h = Harness(self.config())
        _, client = h.send(b"TRACE / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        self.assertTrue(client.value().startswith(b"HTTP/1.1 405 "))
        self.assertEqual(h.conns, [])
        allowed = sites(SiteConfig("a", UpstreamURL.parse("http://a.origin"), hosts=("a.test",), allow_trace=True))
        h2 = Harness(allowed)
        h2.send(b"TRACE / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        self.assertTrue(h2.conns[0].sent().startswith(b"TRACE / HTTP/1.1\r\n"))

    def test_http10_without_host_goes_to_the_default_site(self) -> None:
        h = Harness(self.config())
        h.send(b"GET /z HTTP/1.0\r\n\r\n")
        self.assertTrue(h.conns[0].sent().startswith(b"GET /z HTTP/1.1\r\n"))

    def test_several_empty_lines_before_a_request(self) -> None:
        h = Harness()
        _, client = h.send(b"\r\n\r\n\r\n" + GET)
        self.assertEqual(len(h.conns), 1)
