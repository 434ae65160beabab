"""A connection's requests read by llhttp and Prexy's rules
(``prexy.h1server``, with ``prexy.requesthead``), pure.

Each case runs whole, byte by byte, in random pieces (hypothesis) and with
bytes after the head, and must give the same verdict each way.  Mutated
heads that pass are read back the same way once rebuilt as the proxy
forwards them; chunked bodies are checked whole and byte by byte; a head
fed a byte at a time costs about what it costs whole.
"""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Limits
from prexy.h1server import END, Request, RequestReader
from prexy.requesthead import CHUNKED, LENGTH, NO_BODY, Refusal, check_host
from tests.cases import expand, parametrize

LIMITS = Limits()
H = b"Host: a\r\n"

#: (name, head, expected status; 0 = passes)
CASES: list[tuple[str, bytes, int]] = [
    ("plain", b"GET / HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("http10 without Host", b"GET / HTTP/1.0\r\n\r\n", 0),
    ("one leading CRLF", b"\r\nGET / HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("several leading CRLFs", b"\r\n\r\n\r\nGET / HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("chunked", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: Chunked\r\n\r\n", 0),
    ("length", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 0012\r\n\r\n", 0),
    ("tab in value", b"GET / HTTP/1.1\r\n" + H + b"X-A: a\tb\r\n\r\n", 0),
    ("non-ASCII value", b"GET / HTTP/1.1\r\n" + H + b"X-A: \xc3\xa9\r\n\r\n", 0),
    ("ipv6 host", b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", 0),
    ("empty port", b"GET / HTTP/1.1\r\nHost: a:\r\n\r\n", 0),
    ("raw pipes and braces", b"GET /a|b{c}^`\"<> HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("dot-segments inside the root", b"GET /a/../b/./c HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("dots in the query", b"GET /?x=/../../ HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("absolute-form", b"GET http://B.example:81/x?y HTTP/1.1\r\nHost: a\r\n\r\n", 0),
    ("absolute-form, query only", b"GET https://b?q HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("WebDAV method", b"VERSION-CONTROL / HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("method llhttp knows", b"PROPFIND / HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("custom method", b"BAN / HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("two spaces", b"GET  / HTTP/1.1\r\n" + H + b"\r\n", 0),
    ("bare LF", b"GET / HTTP/1.1\n" + H + b"\r\n", 400),
    ("LF-only head", b"GET / HTTP/1.1\nHost: a\n\n", 400),
    ("bare CR", b"GET / HTTP/1.1\rHost: a\r\n\r\n", 400),
    ("CR inside a value", b"GET / HTTP/1.1\r\n" + H + b"X-A: b\rc\r\n\r\n", 400),
    ("obs-fold", b"GET / HTTP/1.1\r\n" + H + b"X-A: b\r\n c\r\n\r\n", 400),
    ("obs-fold hides TE", b"POST / HTTP/1.1\r\n" + H + b"X-A: b\r\n\tTransfer-Encoding: chunked\r\n\r\n", 400),
    ("lower-case method", b"get / HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("no version", b"GET /\r\n" + H + b"\r\n", 400),
    ("HTTP/1.2", b"GET / HTTP/1.2\r\n" + H + b"\r\n", 505),
    ("HTTP/2.0", b"GET / HTTP/2.0\r\n" + H + b"\r\n", 505),
    ("CONNECT", b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 405),
    ("asterisk", b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("no slash", b"GET x HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("ftp scheme", b"GET ftp://a/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("userinfo", b"GET http://u@a/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("empty authority", b"GET http:///x HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("absolute-form, HTTP/1.1 without Host", b"GET http://a/x HTTP/1.1\r\n\r\n", 400),
    ("DEL in target", b"GET /a\x7f HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("non-ASCII target", b"GET /\xc3\xa9 HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("fragment", b"GET /a#b HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("bad escape", b"GET /a%zz HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("short escape", b"GET /a%4 HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("escaped NUL", b"GET /a%00 HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("above the root", b"GET /../etc/passwd HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("above the root, escaped", b"GET /a/%2e%2E/%2E./x HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("above the root at the end", b"GET /a/../.. HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("space before colon", b"GET / HTTP/1.1\r\n" + H + b"X-A : b\r\n\r\n", 400),
    ("no colon", b"GET / HTTP/1.1\r\n" + H + b"XAb\r\n\r\n", 400),
    ("bad name", b"GET / HTTP/1.1\r\n" + H + b"X(A): b\r\n\r\n", 400),
    ("NUL in value", b"GET / HTTP/1.1\r\n" + H + b"X-A: b\x00\r\n\r\n", 400),
    ("control in value", b"GET / HTTP/1.1\r\n" + H + b"X-A: b\x01\r\n\r\n", 400),
    ("two Hosts", b"GET / HTTP/1.1\r\n" + H + H + b"\r\n", 400),
    ("no Host", b"GET / HTTP/1.1\r\n\r\n", 400),
    ("empty Host", b"GET / HTTP/1.1\r\nHost:\r\n\r\n", 400),
    ("Host with a list", b"GET / HTTP/1.1\r\nHost: a, b\r\n\r\n", 400),
    ("Host with a slash", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
    ("Host with an empty label", b"GET / HTTP/1.1\r\nHost: a..b\r\n\r\n", 400),
    ("Host with a bad port", b"GET / HTTP/1.1\r\nHost: a:8o\r\n\r\n", 400),
    ("Host with userinfo", b"GET / HTTP/1.1\r\nHost: u@a\r\n\r\n", 400),
    ("Host, unclosed IP literal", b"GET / HTTP/1.1\r\nHost: [::1\r\n\r\n", 400),
    ("two lengths", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
    ("signed length", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +1\r\n\r\n", 400),
    ("length list", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 1, 1\r\n\r\n", 400),
    ("TE on HTTP/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    ("TE in two headers", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n", 400),
    ("TE beside CL", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
    ("TE identity", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: identity\r\n\r\n", 501),
    ("TE list", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n", 501),
    ("request line over 8 KiB", b"GET /" + b"a" * 8200 + b" HTTP/1.1\r\n" + H + b"\r\n", 414),
    ("header line over 8 KiB", b"GET / HTTP/1.1\r\n" + H + b"X-A: " + b"a" * 8200 + b"\r\n\r\n", 431),
    ("100 header lines", b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(99)) + b"\r\n", 0),
    ("101 header lines", b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n", 431),
    ("1,000 header lines", b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(999)) + b"\r\n", 431),
    ("101 header lines, a bad one last",
     b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(99)) + b"X(A): b\r\n\r\n", 431),
    ("101 header lines, two Hosts", b"GET / HTTP/1.1\r\n" + H * 2 + b"".join(b"X-%d: v\r\n" % i for i in range(99)) + b"\r\n", 431),
    ("head over 64 KiB", b"GET / HTTP/1.1\r\n" + H + b"X-A: " + b"a" * 8000 + b"\r\n" * 0
     + b"".join(b"X-%d: %s\r\n" % (i, b"b" * 8000) for i in range(9)) + b"\r\n", 431),
]


def first(events: list[object]) -> Request | Refusal | None:
    """The first request or refusal among ``events``."""
    for event in events:
        if isinstance(event, Request | Refusal):
            return event
    return None


def verdict(result: Request | Refusal | None) -> int | None:
    """0 for a head that passed, its status for a refusal, None pending."""
    if isinstance(result, Request):
        return 0
    if isinstance(result, Refusal):
        return result.status
    return None


def feed_pieces(raw: bytes, cuts: list[int], limits: Limits = LIMITS) -> tuple[int | None, Request | Refusal | None]:
    """Feed ``raw`` cut at ``cuts``; the first request or refusal."""
    reader = RequestReader(limits)
    points = [0, *sorted(c for c in cuts if 0 < c < len(raw)), len(raw)]
    for a, b in zip(points, points[1:], strict=False):
        result = first(reader.feed(raw[a:b]))
        if result is not None:
            return verdict(result), result
    return None, None


@expand
class ReaderCaseTests(SynchronousTestCase):
    """Each case, whole, byte by byte and with trailing data."""

    @parametrize("name, raw, status", CASES)
    def test_whole(self, name: str, raw: bytes, status: int) -> None:
        got, _ = feed_pieces(raw, [])
        self.assertEqual(got, status, name)

    @parametrize("name, raw, status", CASES)
    def test_byte_by_byte(self, name: str, raw: bytes, status: int) -> None:
        got, _ = feed_pieces(raw, list(range(len(raw))))
        self.assertEqual(got, status, name)

    @parametrize("name, raw, status", CASES)
    def test_trailing_data(self, name: str, raw: bytes, status: int) -> None:
        """Bytes after the head (a body, the next request) change nothing:
        they are the body, or the next request's."""
        got, _ = feed_pieces(raw + b"abc\r\n\r\nGET", [])
        self.assertEqual(got, status, name)

    @given(st.data())
    @settings(max_examples=300)
    def test_any_chunking(self, data: st.DataObject) -> None:
        name, raw, status = data.draw(st.sampled_from(CASES))
        cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=8))
        got, _ = feed_pieces(raw, cuts)
        self.assertEqual(got, status, name)


class ReaderResultTests(SynchronousTestCase):
    """What a passed head says."""

    def head(self, raw: bytes) -> Request:
        result = first(RequestReader(LIMITS).feed(raw))
        assert isinstance(result, Request), result
        return result

    def test_origin_form(self) -> None:
        head = self.head(b"GET /a?b HTTP/1.1\r\nHost: Shop.Example:80\r\n\r\n").head
        self.assertEqual((head.method, head.target, head.host, head.version), (b"GET", b"/a?b", b"Shop.Example:80", b"HTTP/1.1"))
        self.assertFalse(head.replace_host)
        self.assertEqual((head.framing, head.has_body), (NO_BODY, False))

    def test_absolute_form_authority_wins(self) -> None:
        """RFC 9112 3.2.2: the target's authority, not the Host header."""
        head = self.head(b"GET http://a.example/x?y HTTP/1.1\r\nHost: b.example\r\n\r\n").head
        self.assertEqual((head.target, head.host, head.replace_host), (b"/x?y", b"a.example", True))
        same = self.head(b"GET HTTP://A.example HTTP/1.1\r\nHost: a.EXAMPLE\r\n\r\n").head
        self.assertEqual((same.target, same.host, same.replace_host), (b"/", b"A.example", False))
        old = self.head(b"GET http://a.example/x HTTP/1.0\r\n\r\n").head
        self.assertEqual((old.host, old.replace_host), (b"a.example", True))

    def test_framing(self) -> None:
        length = self.head(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n").head
        self.assertEqual((length.framing, length.length, length.has_body), (LENGTH, 5, True))
        empty = self.head(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n").head
        self.assertFalse(empty.has_body)
        chunked = self.head(b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n").head
        self.assertEqual((chunked.framing, chunked.has_body), (CHUNKED, True))

    def test_fields_in_order_without_white_space(self) -> None:
        request = self.head(b"GET / HTTP/1.1\r\nHost: a\r\nX-A:  b c \t\r\nx-a:d\r\nCookie: e\r\n\r\n")
        self.assertEqual(request.fields, [(b"Host", b"a"), (b"X-A", b"b c"), (b"x-a", b"d"), (b"Cookie", b"e")])

    def test_persistence(self) -> None:
        self.assertTrue(self.head(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").persistent)
        self.assertFalse(self.head(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Close\r\n\r\n").persistent)
        self.assertFalse(self.head(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").persistent)

    def test_expect_continue(self) -> None:
        self.assertTrue(self.head(b"PUT / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n").expect_continue)
        self.assertFalse(self.head(b"PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\n").expect_continue)

    def test_in_head_while_a_head_comes(self) -> None:
        reader = RequestReader(LIMITS)
        self.assertFalse(reader.in_head)
        self.assertEqual(reader.feed(b"GET / HT"), [])
        self.assertTrue(reader.in_head)
        [request, end] = reader.feed(b"TP/1.1\r\nHost: a\r\n\r\n")
        self.assertIsInstance(request, Request)
        self.assertIs(end, END)
        self.assertFalse(reader.in_head)
        self.assertEqual(len(reader.feed(b"GET /2 HTTP/1.1\r\nHost: a\r\n\r\n")), 2)

    def test_hosts(self) -> None:
        for good in (b"a", b"a.b.c", b"a-b_c~d", b"a:1", b"a:", b"[::1]", b"[::1]:80", b"1.2.3.4", b"xn--bcher-kva.example", b"\xc3\xa9"):
            self.assertIsNone(check_host(good), good)
        for bad in (b"", b"a b", b"a/b", b"a\\b", b"u@a", b"a..b", b"a:b", b"a:1234567", b"[::1", b"[x]", b"a?b", b"a#b"):
            self.assertIsNotNone(check_host(bad), bad)

    def test_limits_are_parameters(self) -> None:
        small = Limits(max_request_line=300, max_header_line=300, max_request_head=1000)
        line = b"GET /" + b"a" * 300 + b" HTTP/1.1\r\nHost: a\r\n\r\n"
        self.assertEqual(feed_pieces(line, [], small)[0], 414)
        self.assertEqual(feed_pieces(line, [], LIMITS)[0], 0)
        lines = [b"GET / HTTP/1.1", b"Host: a"] + [b"X: " + b"a" * 250] * 4
        self.assertEqual(feed_pieces(b"\r\n".join(lines) + b"\r\n\r\n", [], small)[0], 431)


@expand
class HeaderLinesTests(SynchronousTestCase):
    """``max_header_lines``: the header lines of a head are counted, the
    request line and the final empty line not, whole or in pieces."""

    SMALL = Limits(max_header_lines=3)

    @parametrize("count", range(8))
    def test_shortest_lines_at_the_edge(self, count: int) -> None:
        """Heads of the shortest lines there are (``A / HTTP/1.0``, ``a:``),
        whose size is the smallest that can hold ``count`` lines."""
        raw = b"A / HTTP/1.0\r\n" + b"a:\r\n" * count + b"\r\n"
        expected = 0 if count <= 3 else 431
        self.assertEqual(feed_pieces(raw, [], self.SMALL)[0], expected)
        self.assertEqual(feed_pieces(raw, list(range(len(raw))), self.SMALL)[0], expected)

    def test_setting_is_honoured(self) -> None:
        """The limit is the setting, not a constant: 150 lines pass at 150
        and are refused at the default."""
        raw = b"GET / HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(149)) + b"\r\n"
        self.assertEqual(feed_pieces(raw, [], Limits(max_header_lines=150))[0], 0)
        self.assertEqual(feed_pieces(raw, [], LIMITS)[0], 431)
        refused = feed_pieces(raw, [], LIMITS)[1]
        assert isinstance(refused, Refusal)
        self.assertEqual(refused.reason, "too many header lines")

    def test_refused_before_the_head_ends(self) -> None:
        """The 101st line is refused as soon as the line after it starts
        (llhttp reports a line when the next one begins), before the head
        ends."""
        reader = RequestReader(LIMITS)
        self.assertEqual(reader.feed(b"GET / HTTP/1.1\r\n" + H + b"X: v\r\n" * 99), [])
        self.assertEqual(verdict(first(reader.feed(b"X: v\r\nX"))), 431)

    @given(st.integers(1, 6), st.lists(st.integers(0, 12), max_size=9), st.lists(st.integers(0, 200), max_size=5))
    @settings(max_examples=200)
    def test_any_count_any_lengths(self, limit: int, sizes: list[int], cuts: list[int]) -> None:
        """Any number of lines of any length, whole or in pieces: refused
        exactly when there are more lines than the limit."""
        raw = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"x:%s\r\n" % (b"v" * n) for n in sizes) + b"\r\n"
        expected = 0 if 1 + len(sizes) <= limit else 431
        limits = Limits(max_header_lines=limit)
        self.assertEqual(feed_pieces(raw, [], limits)[0], expected)
        self.assertEqual(feed_pieces(raw, cuts, limits)[0], expected)


class EarlyRefusalTests(SynchronousTestCase):
    """A head that outgrows a limit is refused while it is still coming, so
    nothing holds more of it than the limits allow."""

    def test_long_request_line_refused_before_it_ends(self) -> None:
        reader = RequestReader(LIMITS)
        self.assertEqual(reader.feed(b"GET /" + b"a" * 8000), [])
        self.assertEqual(verdict(first(reader.feed(b"a" * 200))), 414)

    def test_long_header_line_refused_before_it_ends(self) -> None:
        reader = RequestReader(LIMITS)
        self.assertEqual(reader.feed(b"GET / HTTP/1.1\r\nX-A: " + b"a" * 8000), [])
        self.assertEqual(verdict(first(reader.feed(b"a" * 200))), 431)

    def test_long_header_line_behind_a_request(self) -> None:
        """A head that begins behind another request in the same read is
        bounded from the next read on."""
        reader = RequestReader(LIMITS)
        events = reader.feed(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nX-A: " + b"a" * 4000)
        self.assertEqual(len(events), 2)
        self.assertEqual(verdict(first(reader.feed(b"a" * 4000))), None)
        self.assertEqual(verdict(first(reader.feed(b"a" * 8300))), 431)

    def test_big_head_refused_before_it_ends(self) -> None:
        reader = RequestReader(LIMITS)
        result = first(reader.feed(b"GET / HTTP/1.1\r\n"))
        line = b"X-A: " + b"a" * 4000 + b"\r\n"
        fed = 0
        while result is None:
            result = first(reader.feed(line))
            fed += len(line)
        self.assertEqual(verdict(result), 431)
        self.assertLessEqual(fed, LIMITS.max_request_head + len(line))

    def test_bare_lf_refused_at_once(self) -> None:
        """An LF-only client is answered at its first line, not left waiting."""
        self.assertEqual(verdict(first(RequestReader(LIMITS).feed(b"GET / HTTP/1.1\nHost: a\n"))), 400)
        self.assertEqual(verdict(first(RequestReader(LIMITS).feed(b"GET / HTTP/1.1\rHost"))), 400)

    def test_byte_at_a_time_is_linear(self) -> None:
        """A 60 KB head fed a byte at a time costs within a small factor of
        the same head fed whole (it is not rescanned per byte)."""
        raw = b"GET / HTTP/1.1\r\nHost: a\r\n" + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 7000) for i in range(8)) + b"\r\n"

        def run(step: int) -> float:
            start = time.perf_counter()
            reader = RequestReader(LIMITS)
            events = []
            for i in range(0, len(raw), step):
                events += reader.feed(raw[i : i + step])
            assert isinstance(first(events), Request)
            return time.perf_counter() - start

        one = min(run(1) for _ in range(3))
        hundred = min(run(100) for _ in range(3))
        # Per-call overhead dominates either way; quadratic rescanning would
        # make ``one`` thousands of times ``hundred``.
        self.assertLess(one, hundred * 300)
        self.assertLess(one, 2.0)


# -- mutated heads -----------------------------------------------------------------------

TOKENS = [b"GET", b"POST", b" ", b"/", b"HTTP/1.1", b"HTTP/1.0", b"\r\n", b"\n", b"\r", b":", b"Host", b"a",
          b"Content-Length", b"Transfer-Encoding", b"chunked", b"0", b"5", b"\t", b"\x00", b"%", b"?", b"#",
          b"..", b"http://", b"@", b",", b"\x7f", b"\xc3", b"X-A"]


def forwarded(request: Request) -> bytes:
    """The head as the proxy sends it on: its request line rebuilt, the
    fields as read, the framing by the head's verdict."""
    head = request.head
    lines = [b"%s %s HTTP/1.1" % (head.method, head.target)]
    framing = {b"content-length", b"transfer-encoding", b"host"}
    lines += [b"%s: %s" % (n, v) for n, v in request.fields if n.lower() not in framing]
    lines.append(b"Host: %s" % (head.host or b"x"))
    if head.framing == LENGTH:
        lines.append(b"Content-Length: %d" % head.length)
    elif head.framing == CHUNKED:
        lines.append(b"Transfer-Encoding: chunked")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def valid_head() -> st.SearchStrategy[bytes]:
    names = st.sampled_from([b"Accept", b"Cookie", b"X-A", b"User-Agent", b"Content-Length", b"Transfer-Encoding"])
    values = st.binary(min_size=0, max_size=12).map(lambda b: bytes(c for c in b if 0x21 <= c < 0x7F))
    fields = st.lists(st.tuples(names, values), max_size=5)
    return st.builds(
        lambda method, path, fields, version: b"%s /%s %s\r\nHost: a\r\n%s\r\n" % (
            method, path, version, b"".join(b"%s: %s\r\n" % f for f in fields)),
        st.sampled_from([b"GET", b"POST", b"HEAD", b"PUT"]),
        st.binary(max_size=10).map(lambda b: bytes(c for c in b if 0x21 <= c < 0x7F and c not in b"#%")),
        fields,
        st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]),
    )


@st.composite
def mutated_head(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(valid_head()))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(raw)))
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        token = draw(st.sampled_from(TOKENS))
        if kind == "insert":
            raw[at:at] = token
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 4))]
        else:
            raw[at : at + len(token)] = token
    return bytes(raw)


class MutatedHeadTests(SynchronousTestCase):
    """Any chunking of a mutated head gets the same verdict, and a head
    that passed, rebuilt as the proxy forwards it, is read back the same."""

    @given(mutated_head(), st.lists(st.integers(0, 200), max_size=5))
    @settings(max_examples=500)
    def test_same_verdict_and_read_back(self, raw: bytes, cuts: list[int]) -> None:
        status, result = feed_pieces(raw, cuts)
        whole, _ = feed_pieces(raw, [])
        self.assertEqual(status, whole)  # any chunking, same verdict
        if not isinstance(result, Request):
            return
        again = first(RequestReader(LIMITS).feed(forwarded(result)))
        assert isinstance(again, Request), (raw, again)
        head, back = result.head, again.head
        self.assertEqual((back.method, back.target, back.framing, back.length), (head.method, head.target, head.framing, head.length))


#: (name, chunked body, expected: "done", "more" (waits, fine) or a status)
CHUNKED_CASES = [
    ("one chunk", b"5\r\nhello\r\n0\r\n\r\n", "done"),
    ("extensions and BWS", b"5 ;a=b\r\nhello\r\n0;x\r\n\r\n", "done"),
    ("trailer", b"3\r\nabc\r\n0\r\nX-T: 1\r\n\r\n", "done"),
    ("upper-case hex", b"A\r\n0123456789\r\n0\r\n\r\n", "done"),
    ("data holding LF", b"3\r\na\nb\r\n0\r\n\r\n", "done"),
    ("not finished", b"5\r\nhel", "more"),
    ("LF-only size line", b"3\nabc\r\n0\r\n\r\n", 400),
    ("LF-only last chunk", b"3\r\nabc\r\n0\n\n", 400),
    ("LF-only trailer end", b"0\r\n\n", 400),
    ("0x size", b"0x3\r\nabc\r\n0\r\n\r\n", 400),
    ("signed size", b"+3\r\nabc\r\n0\r\n\r\n", 400),
    ("empty size", b"\r\nabc\r\n0\r\n\r\n", 400),
    ("long extension", b"3;" + b"x" * 5000 + b"\r\nabc\r\n0\r\n\r\n", "done"),
    ("size without CRLF", b"3 abc\r\n0\r\n\r\n", 400),
]


@expand
class ChunkedBodyTests(SynchronousTestCase):
    """A chunked body's framing, whole, byte by byte and with the next
    request behind it: the body ends, waits for more, or is refused."""

    HEAD = b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"

    def outcome(self, body: bytes, step: int) -> str | int:
        reader = RequestReader(LIMITS)
        reader.feed(self.HEAD)
        for i in range(0, len(body), step):
            for event in reader.feed(body[i : i + step]):
                if event is END:
                    return "done"
                if isinstance(event, Refusal):
                    return event.status
        return "more"

    @parametrize("name, body, expected", CHUNKED_CASES)
    def test_whole(self, name: str, body: bytes, expected: str | int) -> None:
        self.assertEqual(self.outcome(body, len(body)), expected, name)

    @parametrize("name, body, expected", CHUNKED_CASES)
    def test_byte_by_byte(self, name: str, body: bytes, expected: str | int) -> None:
        self.assertEqual(self.outcome(body, 1), expected, name)

    @parametrize("name, body, expected", CHUNKED_CASES)
    def test_next_request_behind_is_not_read(self, name: str, body: bytes, expected: str | int) -> None:
        if expected == "more":
            return  # an unfinished body goes on into what follows
        self.assertEqual(self.outcome(body + b"GET / HTTP/1.1\n\n", len(body) + 17), expected, name)
