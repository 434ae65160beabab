"""prexy.http1: the request writer and the sans-IO response reader.

Every response case runs whole, byte by byte, and followed by trailing data
(a pipelined response, or garbage); hypothesis cuts valid responses at
random places and mutates them (the events never depend on the cuts, and a
mutation gives events or a clean ResponseError, never a crash); valid
responses are also read by Twisted's own ``HTTPClientParser`` as an oracle.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.protocol import Protocol
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from twisted.web._newclient import HTTPClientParser, Request
from twisted.web.http_headers import Headers

from prexy import http1
from prexy.http1 import (
    CHUNKED,
    CLOSE,
    LAST_CHUNK,
    LENGTH,
    MAX_CHUNK_LINE,
    MAX_HEADER_BYTES,
    MAX_HEADER_COUNT,
    NONE,
    Data,
    End,
    Head,
    ResponseError,
    ResponseIncomplete,
    ResponseReader,
    UnsolicitedUpgrade,
    chunk,
    request_head,
)

NEXT = b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"
GARBAGE = b"\x00garbage\r\n\r\n"


def merged(events: list[Any]) -> list[Any]:
    """Events with adjacent Data joined (their cuts follow the reads)."""
    out: list[Any] = []
    for event in events:
        if isinstance(event, Data) and out and isinstance(out[-1], Data):
            out[-1] = Data(out[-1].data + event.data)
        elif isinstance(event, Data) and not event.data:
            continue
        else:
            out.append(event)
    return out


def read(
    pieces: list[bytes], method: bytes = b"GET", close: bool = False, **options: Any
) -> tuple[list[Any], bytes]:
    """The merged events and trailing data of ``pieces``; ``options`` are
    the reader's (``max_head``, ``upgrade``)."""
    reader = ResponseReader(method, **options)
    events: list[Any] = []
    for piece in pieces:
        events += reader.receive_data(piece)
    if close:
        events += reader.connection_closed()
    return merged(events), reader.trailing_data


def cut(raw: bytes, points: list[int]) -> list[bytes]:
    points = sorted({p % (len(raw) + 1) for p in points})
    edges = [0, *points, len(raw)]
    return [raw[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def head(
    code: int = 200,
    headers: list[tuple[bytes, bytes]] | None = None,
    length: int | None = None,
    framing: str = LENGTH,
    keep_alive: bool = True,
    phrase: bytes = b"OK",
    version: bytes = b"HTTP/1.1",
    connection_names: frozenset[bytes] = frozenset(),
) -> Head:
    headers = headers or []
    return Head(
        code, phrase, version, headers, [n.lower() for n, _ in headers], connection_names, length, framing,
        keep_alive,
    )


class CaseMixin(SynchronousTestCase):
    def check(
        self, raw: bytes, expected: list[Any], method: bytes = b"GET", close: bool = False,
        trailing: bool = True, **options: Any,
    ) -> None:
        """``raw`` gives ``expected`` whole and byte by byte; followed by a
        pipelined response or garbage, the same events and those bytes as
        trailing data (unless the message ends only with the connection,
        or at an error).  ``options`` go to the reader."""
        self.assertEqual(read([raw], method, close, **options), (expected, b""))
        bytewise = [raw[i : i + 1] for i in range(len(raw))]
        self.assertEqual(read(bytewise, method, close, **options)[0], expected)
        if trailing and not close and isinstance(expected[-1], End):
            for extra in (NEXT, GARBAGE):
                self.assertEqual(read([raw + extra], method, **options), (expected, extra))
                self.assertEqual(read([*bytewise, extra], method, **options), (expected, extra))

    def error(self, raw: bytes, method: bytes = b"GET", close: bool = False, **options: Any) -> ResponseError:
        """``raw`` ends in a ResponseError (502), whole and byte by byte,
        and trailing data changes nothing."""
        events, _ = read([raw], method, close, **options)
        self.assertIsInstance(events[-1], ResponseError)
        self.assertEqual(events[-1].status, 502)
        self.check(raw, events, method, close, **options)
        self.assertEqual(read([raw + GARBAGE], method, close, **options)[0][: len(events)], events)
        return events[-1]


class LengthTests(CaseMixin):
    """Content-Length bodies."""

    def test_length(self) -> None:
        self.check(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            [head(headers=[(b"Content-Length", b"5")], length=5), Data(b"hello"), End(True, [])],
        )

    def test_body_in_one_read_is_one_slice(self) -> None:
        """The body that came with the head is handed over as one piece; a
        read that is all body is handed over as it is."""
        reader = ResponseReader()
        events = reader.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
        self.assertEqual(events[1:], [Data(b"12345")])
        rest = b"67890"
        (data, end) = reader.receive_data(rest)
        self.assertIs(data.data, rest)  # type: ignore[union-attr]
        self.assertEqual(end, End(True, []))

    def test_zero_length_has_no_body(self) -> None:
        self.check(
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
            [head(headers=[(b"Content-Length", b"0")], length=0, framing=NONE), End(True, [])],
        )

    def test_equal_duplicates_accepted(self) -> None:
        hs = [(b"Content-Length", b"2"), (b"content-length", b"2")]
        self.check(
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\n\r\nab",
            [head(headers=hs, length=2), Data(b"ab"), End(True, [])],
        )

    def test_bad_lengths(self) -> None:
        for value in (b"abc", b"1,1", b"-1", b""):
            with self.subTest(value=value):
                self.error(b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\n")
        self.error(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nab")

    def test_only_ascii_digits(self) -> None:
        """1*DIGIT (RFC 9110 8.6): what int() also takes is refused, for GET
        and HEAD (the framing is checked even without a body)."""
        for value in (b"+5", b"1_1", b"-0", b"+0", b"0x5", b"5 5", b"5\t5", b"1e3", b"\xd9\xa5", b"9" * 5000):
            for method in (b"GET", b"HEAD"):
                with self.subTest(value=value[:20], method=method):
                    self.error(b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\nhello", method)

    def test_leading_zeros_and_whitespace(self) -> None:
        """Leading zeros are still digits; whitespace around a field value
        is not part of it."""
        self.check(
            b"HTTP/1.1 200 OK\r\nContent-Length: \t005 \r\n\r\nhello",
            [head(headers=[(b"Content-Length", b"005")], length=5), Data(b"hello"), End(True, [])],
        )

    def test_cut_short(self) -> None:
        events, _ = read([b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel"], close=True)
        self.assertEqual(events[1], Data(b"hel"))
        self.assertIsInstance(events[2], ResponseIncomplete)


class ChunkedTests(CaseMixin):
    """Chunked bodies: extensions, trailers, lenient line ends, errors."""

    def test_chunked_with_extensions_and_trailers(self) -> None:
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;ext=1\r\nhello\r\n1\r\n \r\n6\r\nworld!\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        self.check(
            raw,
            [
                head(headers=[(b"Transfer-Encoding", b"chunked")], length=None, framing=CHUNKED),
                Data(b"hello world!"),
                End(True, [(b"X-Trailer", b"t")]),
            ],
        )

    def test_chunks_of_one_read_are_one_data(self) -> None:
        reader = ResponseReader()
        events = reader.receive_data(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n"
        )
        self.assertEqual(events[1:], [Data(b"abcd"), End(True, [])])

    def test_lf_only_whitespace_and_extensions(self) -> None:
        """LF alone ends a framing line; hex digits in either case, leading
        zeros, whitespace before ";" (BWS) or at the end, and extensions
        (ignored) are accepted."""
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"02\nab\n1 \t; x=\"y z\"\r\nc\r\nA;\r\n0123456789\n1 \r\nd\n0;last\n\n"
        )
        events, _ = read([raw])
        self.assertEqual(events[1:], [Data(b"abc0123456789d"), End(True, [])])
        self.check(raw, events)

    def test_sizes_only_hex_digits(self) -> None:
        """1*HEXDIG (RFC 9112 7.1): what int(x, 16) also takes is refused
        ("0x0" would even end the body early), and so is a CR that is not
        the line end's."""
        start = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for size in (b"0x5", b"0X5", b"+5", b"-5", b"5_0", b" 5", b"\t5", b"5 5", b"0x0", b"", b";x", b"5\r", b"\xd9\xa5"):
            with self.subTest(size=size):
                self.error(start + size + b"\r\nhello\r\n0\r\n\r\n")
        for body in (b"5\r\nhello\r\r\n0\r\n\r\n", b"5;a\rb\r\nhello\r\n0\r\n\r\n"):
            with self.subTest(body=body):
                self.error(start + body)

    def test_transfer_encoding_wins_over_length(self) -> None:
        hs = [(b"Content-Length", b"100"), (b"Transfer-Encoding", b"gzip, chunked")]
        self.check(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: gzip, chunked\r\n\r\n1\r\na\r\n0\r\n\r\n",
            [head(headers=hs, length=None, framing=CHUNKED), Data(b"a"), End(True, [])],
        )

    def test_unsupported_transfer_encoding(self) -> None:
        for value in (b"gzip", b"chunked, gzip", b""):
            with self.subTest(value=value):
                self.error(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: " + value + b"\r\n\r\n")

    def test_framing_errors(self) -> None:
        start = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        for body in (b"zz\r\n", b"-1\r\n", b"2\r\nabc\r\n", b"1" * (MAX_CHUNK_LINE + 1) + b"\r\n"):
            with self.subTest(body=body[:20]):
                self.error(start + body)

    def test_data_before_an_error_is_delivered(self) -> None:
        events, _ = read([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\nzz\r\n"])
        self.assertEqual(events[1], Data(b"ab"))
        self.assertIsInstance(events[2], ResponseError)

    def test_too_many_trailers(self) -> None:
        trailers = b"".join(b"T%d: x\r\n" % i for i in range(MAX_HEADER_COUNT + 1))
        self.error(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + trailers + b"\r\n")

    def test_cut_short(self) -> None:
        events, _ = read([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"], close=True)
        self.assertEqual(events[1], Data(b"ab"))
        self.assertIsInstance(events[2], ResponseIncomplete)


class CloseDelimitedTests(CaseMixin):
    """No length and no chunking: the body ends with the connection."""

    def test_close_delimited(self) -> None:
        self.check(
            b"HTTP/1.1 200 OK\r\n\r\npart one, part two",
            [head(length=None, framing=CLOSE, keep_alive=False), Data(b"part one, part two"), End(False, [])],
            close=True,
        )

    def test_nothing_after_the_end(self) -> None:
        reader = ResponseReader()
        reader.receive_data(b"HTTP/1.1 200 OK\r\n\r\nx")
        self.assertEqual(reader.connection_closed(), [End(False, [])])
        self.assertEqual(reader.connection_closed(), [])
        self.assertTrue(reader.done)


class NoBodyTests(CaseMixin):
    """HEAD, 204, 304 and 101 have no body; other 1xx are skipped."""

    def test_head_keeps_length(self) -> None:
        hs = [(b"Content-Length", b"1234")]
        self.check(
            b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n",
            [head(headers=hs, length=1234, framing=NONE), End(True, [])],
            method=b"HEAD",
        )
        self.check(b"HTTP/1.1 200 OK\r\n\r\n", [head(length=None, framing=NONE), End(True, [])], method=b"HEAD")

    def test_204_304(self) -> None:
        for code in (204, 304):
            for method in (b"GET", b"HEAD"):
                with self.subTest(code=code, method=method):
                    self.check(
                        b"HTTP/1.1 %d X\r\nContent-Length: 5\r\n\r\n" % code,
                        [head(code, [(b"Content-Length", b"5")], 0, NONE, phrase=b"X"), End(True, [])],
                        method=method,
                    )

    def test_unsolicited_101(self) -> None:
        """A 101 to a request that did not ask to upgrade is a 502 (it used
        to be forwarded, and the connection pooled as if it still spoke
        HTTP), after interim responses too."""
        switch = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        for raw in (switch, switch + b"\x81\x05hello", b"HTTP/1.1 100 Continue\r\n\r\n" + switch):
            for method in (b"GET", b"HEAD", b"POST"):
                with self.subTest(raw=raw, method=method):
                    self.assertIsInstance(self.error(raw, method), UnsolicitedUpgrade)

    def test_101_when_asked(self) -> None:
        """The seam for upgrades: told that the request asked to upgrade,
        the reader takes a 101 as the final response, with no body and no
        reuse; what follows is the new protocol's, in trailing_data."""
        hs = [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade")]
        raw = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
        expected = [
            head(101, hs, 0, NONE, False, b"Switching Protocols", connection_names=frozenset({b"upgrade"})),
            End(False, []),
        ]
        self.check(raw, expected, upgrade=True)
        self.assertEqual(read([raw + b"\x81\x05hello"], upgrade=True), (expected, b"\x81\x05hello"))

    def test_interim_responses_skipped(self) -> None:
        raw = (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
            b"HTTP/1.1 199 whatever\r\nbad line, not checked\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        )
        self.check(raw, [head(headers=[(b"Content-Length", b"2")], length=2), Data(b"ok"), End(True, [])])


    def test_interim_responses_passed_on(self) -> None:
        """With ``interim=True`` each 1xx but 100 and 101 comes first as an
        Interim event, without its hop-by-hop fields, whole or byte by byte."""
        raw = (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n"
            b"Connection: x-hop\r\nX-Hop: 1\r\nLink: </b.js>\r\n\r\n"
            b"HTTP/1.1 199\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        )
        self.check(raw, [
            http1.Interim(103, b"Early Hints", [(b"Link", b"</a.css>; rel=preload"), (b"Link", b"</b.js>")]),
            http1.Interim(199, b"", []),
            head(headers=[(b"Content-Length", b"2")], length=2), Data(b"ok"), End(True, []),
        ], interim=True)

    def test_bad_interim_head_is_an_error(self) -> None:
        """A 1xx that is passed on is checked like a final head."""
        self.error(b"HTTP/1.1 103 Early Hints\r\nbad line\r\n\r\nHTTP/1.1 200 OK\r\n\r\n", interim=True)


class HeadTests(CaseMixin):
    """The status line and header block."""

    def test_fields(self) -> None:
        raw = (
            b"HTTP/1.1 404 Not Found Here\r\nX-A:  1 \r\nx-a: 2\r\nFolded: a\r\n \t b\r\n"
            b"Connection: X-A, Keep-Alive\r\nContent-Length: 0\r\n\r\n"
        )
        hs = [
            (b"X-A", b"1"), (b"x-a", b"2"), (b"Folded", b"a b"), (b"Connection", b"X-A, Keep-Alive"),
            (b"Content-Length", b"0"),
        ]
        self.check(
            raw,
            [
                head(404, hs, 0, NONE, phrase=b"Not Found Here", connection_names=frozenset({b"x-a", b"keep-alive"})),
                End(True, []),
            ],
        )

    def test_no_phrase(self) -> None:
        for line in (b"HTTP/1.1 200", b"HTTP/1.1 200 "):
            with self.subTest(line=line):
                events, _ = read([line + b"\r\nContent-Length: 0\r\n\r\n"])
                self.assertEqual(events[0].phrase, b"")  # type: ignore[union-attr]

    def test_keep_alive_rules(self) -> None:
        cases = [
            (b"HTTP/1.1", b"", True),
            (b"HTTP/1.1", b"Connection: close\r\n", False),
            (b"HTTP/1.1", b"Connection: keep-alive\r\n", True),
            (b"HTTP/1.0", b"", False),
            (b"HTTP/1.0", b"Connection: keep-alive\r\n", True),
            (b"HTTP/1.0", b"Connection: keep-alive, close\r\n", False),
        ]
        for version, extra, keep in cases:
            with self.subTest(version=version, extra=extra):
                events, _ = read([version + b" 200 OK\r\n" + extra + b"Content-Length: 1\r\n\r\nx"])
                self.assertEqual((events[0].keep_alive, events[-1]), (keep, End(keep, [])))  # type: ignore[union-attr]
                self.check(version + b" 200 OK\r\n" + extra + b"Content-Length: 1\r\n\r\nx", events)

    def test_bad_heads(self) -> None:
        for raw in (
            b"SSH-2.0-OpenSSH\r\n\r\n",
            b"HTTP/2 200 OK\r\n\r\n",
            b"HTTP/1.1\r\n\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/1.1 99 OK\r\n\r\n",
            b"HTTP/1.1 1000 OK\r\n\r\n",
            b"\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n: no name\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nSpace : before colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n folded first\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBare: lf\nX: y\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nBare: cr\rX: y\r\n\r\n",
        ):
            with self.subTest(raw=raw):
                self.error(raw)

    def test_status_code_is_three_ascii_digits(self) -> None:
        """int() also takes a sign, "_", whitespace and leading zeros."""
        for code in (b"+200", b"2_00", b"\t200", b"200\t", b"0200", b"+20", b"020", b"099", b"20", b"\xd9\xa2\xd9\xa0\xd9\xa0"):
            with self.subTest(code=code):
                self.error(b"HTTP/1.1 " + code + b" OK\r\nContent-Length: 0\r\n\r\n")
        for number in (100, 103, 200, 599, 999):
            with self.subTest(number=number):
                events, _ = read([b"HTTP/1.1 %d X\r\n\r\nHTTP/1.1 204 X\r\n\r\n" % number])
                self.assertIsInstance(events[0], Head)

    def test_version(self) -> None:
        """HTTP/1.DIGIT: another minor version reads as 1.1, anything else
        after "HTTP/1." is refused (a prefix check read "HTTP/1.0x" as 1.1)."""
        events, _ = read([b"HTTP/1.2 200 OK\r\nContent-Length: 0\r\n\r\n"])
        self.assertEqual(events[0].version, b"HTTP/1.2")
        for version in (b"HTTP/1.", b"HTTP/1.0x", b"HTTP/1.10", b"HTTP/1.x", b"HTTP/1.\xd9\xa1", b"http/1.1"):
            with self.subTest(version=version):
                self.error(version + b" 200 OK\r\nContent-Length: 0\r\n\r\n")

    def test_nul_refused(self) -> None:
        """A NUL in a header name, value, continuation line or the status
        line is invalid (RFC 9110 5.5); other controls pass, as before."""
        for raw in (
            b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX\x00A: b\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nX-A: a\r\n \x00\r\nContent-Length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 0\x00\r\n\r\n",
            b"HTTP/1.1 200 O\x00K\r\nContent-Length: 0\r\n\r\n",
        ):
            with self.subTest(raw=raw):
                self.error(raw)
        events, _ = read([b"HTTP/1.1 200 OK\r\nX-A: a\x01\x7fb\r\nContent-Length: 0\r\n\r\n"])
        self.assertEqual(events[0].headers[0], (b"X-A", b"a\x01\x7fb"))

    def test_header_limits(self) -> None:
        many = b"".join(b"X-%d: y\r\n" % i for i in range(MAX_HEADER_COUNT - 1))
        self.assertIsInstance(read([b"HTTP/1.1 204 OK\r\n" + many + b"\r\n"])[0][0], Head)
        self.error(b"HTTP/1.1 204 OK\r\n" + many + b"X: y\r\n\r\n")
        start = b"HTTP/1.1 204 OK\r\nX: "
        fits = start + b"y" * (MAX_HEADER_BYTES - len(start) - 4) + b"\r\n\r\n"
        self.assertEqual(len(fits), MAX_HEADER_BYTES)
        for pieces in ([fits], cut(fits, list(range(0, len(fits), 1000)))):
            self.assertIsInstance(read(pieces)[0][0], Head)
        over = start + b"y" * (MAX_HEADER_BYTES - len(start) - 3) + b"\r\n\r\n"
        for pieces in ([over], cut(over, list(range(0, len(over), 1000))), [over[:-4], over[-4:]]):
            self.assertIsInstance(read(pieces)[0][-1], ResponseError)
        # An endless head is refused once it is over the limit.
        self.assertIsInstance(read([b"HTTP/1.1 200 OK\r\n", b"X" * MAX_HEADER_BYTES])[0][-1], ResponseError)
        # 100 KB, whole or in pieces.
        big = b"HTTP/1.1 200 OK\r\nX: " + b"y" * 100_000 + b"\r\nContent-Length: 0\r\n\r\n"
        for pieces in ([big], cut(big, list(range(0, len(big), 4096)))):
            self.assertIsInstance(read(pieces)[0][-1], ResponseError)

    def test_max_head_is_a_parameter(self) -> None:
        """max_head bounds the head exactly, status line and blank line
        included, whole, byte by byte, and however it is cut."""
        start = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX: "
        for limit in (300, 4096, 70_000):
            fits = start + b"y" * (limit - len(start) - 4) + b"\r\n\r\n"
            over = start + b"y" * (limit - len(start) - 3) + b"\r\n\r\n"
            self.assertEqual((len(fits), len(over)), (limit, limit + 1))
            with self.subTest(limit=limit):
                hs = [(b"Content-Length", b"2"), (b"X", fits[len(start) : -4])]
                expected = [head(headers=hs, length=2), Data(b"ok"), End(True, [])]
                if limit < 5000:  # byte by byte is slow for the long one
                    self.check(fits + b"ok", expected, max_head=limit)
                    self.error(over + b"ok", max_head=limit)
                for pieces in ([fits + b"ok"], cut(fits + b"ok", list(range(0, limit, 97))), [fits, b"ok"]):
                    self.assertEqual(read(pieces, max_head=limit)[0], expected)
                for pieces in ([over + b"ok"], cut(over + b"ok", list(range(0, limit, 97))), [over[:-4], over[-4:]]):
                    self.assertIsInstance(read(pieces, max_head=limit)[0][-1], ResponseError)

    def test_max_head_counts_interim_heads(self) -> None:
        """The limit is on all the bytes before the body: 1xx heads count
        (each of them used to get the whole limit again, without end)."""
        interim = b"HTTP/1.1 100 Continue\r\n\r\n"
        final = b"HTTP/1.1 204 No Content\r\n\r\n"
        limit = 4 * len(interim) + len(final)
        expected = [head(204, [], 0, NONE, phrase=b"No Content"), End(True, [])]
        self.check(interim * 4 + final, expected, max_head=limit)
        self.error(interim * 5 + final, max_head=limit)
        self.error(interim * 4 + final.replace(b"204", b"204 ", 1), max_head=limit)
        # The default limit, with heads that are each well under it.
        big = b"HTTP/1.1 103 Early Hints\r\nLink: " + b"l" * 40_000 + b"\r\n\r\n"
        for pieces in ([big * 2 + final], cut(big * 2 + final, list(range(0, 2 * len(big), 4096)))):
            self.assertIsInstance(read(pieces)[0][-1], ResponseError)
        self.assertIsInstance(read([big + final])[0][0], Head)

    def test_closed_before_head(self) -> None:
        for raw in (b"", b"HTTP/1.1 200 OK\r\n"):
            events, _ = read([raw], close=True)
            self.assertEqual(len(events), 1)
            self.assertIsInstance(events[0], ResponseIncomplete)

    def test_after_an_error_nothing_more(self) -> None:
        reader = ResponseReader()
        self.assertIsInstance(reader.receive_data(b"junk\r\n\r\n")[0], ResponseError)
        self.assertEqual(reader.receive_data(b"HTTP/1.1 200 OK\r\n\r\n"), [])
        self.assertEqual(reader.connection_closed(), [])
        self.assertFalse(reader.done)


# -- generated responses ----------------------------------------------------------

_token = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-", min_size=1, max_size=12)
_value = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789 ,;=/\"", max_size=20).map(str.strip)


@st.composite
def responses(draw: st.DrawFn) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]], bytes]:
    """A valid response with a body: (raw, code, phrase, headers, body)."""
    code = draw(st.integers(200, 599).filter(lambda c: c not in (204, 304)))
    phrase = draw(st.sampled_from([b"OK", b"Not Found", b"Whatever It Is"]))
    names = draw(st.lists(_token, max_size=6))
    headers = [
        (n.encode(), draw(_value).encode())
        for n in names
        if n.lower() not in ("content-length", "transfer-encoding", "connection", "keep-alive", "te",
                             "trailers", "upgrade", "proxy-connection")
    ]
    body = draw(st.binary(max_size=300))
    head_ = b"HTTP/1.1 %d %s\r\n" % (code, phrase) + b"".join(n + b": " + v + b"\r\n" for n, v in headers)
    if draw(st.booleans()):
        raw = head_ + b"Content-Length: %d\r\n\r\n" % len(body) + body
    else:
        sizes = draw(st.lists(st.integers(1, 50), max_size=10))
        pieces, pos = [], 0
        for size in sizes:
            if pos < len(body):
                pieces.append(chunk(body[pos : pos + size]))
                pos += size
        pieces.append(chunk(body[pos:]))
        raw = head_ + b"Transfer-Encoding: chunked\r\n\r\n" + b"".join(pieces) + LAST_CHUNK
    return raw, code, phrase, headers, body


def twisted_reads(raw: bytes) -> tuple[int, bytes, dict[bytes, list[bytes]], bytes, bytes]:
    """What Twisted's HTTPClientParser makes of ``raw``: code, phrase,
    headers (lower-case names), body, and the bytes after the response."""
    rest: list[bytes] = []
    parser = HTTPClientParser(Request(b"GET", b"/", Headers(), None), rest.append)
    parser.makeConnection(StringTransport())
    parser.dataReceived(raw)
    response = parser.response
    if rest and response._state == "INITIAL":
        # HTTP11ClientProtocol does this when its parser finishes a body.
        response._bodyDataFinished()
    body: list[bytes] = []
    done: list[Failure] = []

    class Sink(Protocol):
        def dataReceived(self, data: bytes) -> None:
            body.append(data)

        def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
            done.append(reason)

    response.deliverBody(Sink())
    assert done and rest, "Twisted did not finish"
    headers = {k.lower(): list(v) for k, v in response.headers.getAllRawHeaders()}
    return response.code, response.phrase, headers, b"".join(body), rest[0]


class GeneratedTests(SynchronousTestCase):
    """Random cuts, mutations, generated numbers, and Twisted's parser as an
    oracle."""

    @settings(max_examples=150, deadline=None)
    @given(responses(), st.lists(st.integers(0, 2000), max_size=12), st.sampled_from([b"", NEXT, GARBAGE]))
    def test_cuts_do_not_matter(self, response: Any, points: list[int], extra: bytes) -> None:
        raw, code, _, _, body = response
        whole = read([raw + extra])
        self.assertEqual(read(cut(raw + extra, points)), whole)
        events, trailing = whole
        self.assertEqual((events[0].code, events[1:]), (code, ([Data(body)] if body else []) + [events[-1]]))
        self.assertEqual((events[-1].keep_alive, trailing), (True, extra))

    @settings(max_examples=300, deadline=None)
    @given(
        responses(),
        st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255), st.sampled_from("rid")), min_size=1, max_size=4),
        st.lists(st.integers(0, 2000), max_size=8),
        st.booleans(),
    )
    def test_mutations_never_crash(self, response: Any, edits: list[Any], points: list[int], close: bool) -> None:
        """A mutated response gives events or a clean error, the same however
        it is cut, and nothing after an error."""
        raw = bytearray(response[0])
        for where, byte, how in edits:
            where %= len(raw) + 1
            if how == "r" and where < len(raw):
                raw[where] = byte
            elif how == "i":
                raw.insert(where, byte)
            elif where < len(raw):
                del raw[where]
        mutated = bytes(raw)
        whole = read([mutated], close=close)
        self.assertEqual(read(cut(mutated, points), close=close), whole)
        events = whole[0]
        for event in events[:-1]:
            self.assertNotIsInstance(event, ResponseError)
        if events:
            self.assertIsInstance(events[0], (Head, ResponseError))
        if close and events:
            self.assertIsInstance(events[-1], (End, ResponseError))

    @settings(max_examples=300, deadline=None)
    @given(st.text(alphabet="0123456789abcdefABxX+-_ \t;=", max_size=8))
    def test_numbers_are_digits(self, text: str) -> None:
        """A Content-Length is accepted exactly when it is ASCII digits
        (around them, whitespace); a chunk size exactly when it is hex
        digits, then perhaps whitespace, then perhaps ";" and anything."""
        value = text.encode()
        events, _ = read([b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\n"])
        self.assertEqual(isinstance(events[0], Head), value.strip(b" \t").isdigit())
        size, _, _ = value.partition(b";")
        valid = bool(size.rstrip(b" \t")) and all(c in b"0123456789abcdefABCDEF" for c in size.rstrip(b" \t"))
        raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + value + b"\r\n"
        events, _ = read([raw])
        self.assertEqual(not isinstance(events[-1], ResponseError), valid, events)

    @settings(max_examples=150, deadline=None)
    @given(responses(), st.sampled_from([b"", NEXT]))
    def test_twisted_agrees(self, response: Any, extra: bytes) -> None:
        raw, code, phrase, headers, body = response
        events, trailing = read([raw + extra])
        first = events[0]
        assert isinstance(first, Head)
        ours: dict[bytes, list[bytes]] = {}
        for (_, value), lname in zip(first.headers, first.lnames, strict=True):
            if lname not in (b"content-length", b"transfer-encoding"):
                ours.setdefault(lname, []).append(value)
        got = b"".join(e.data for e in events if isinstance(e, Data))
        self.assertEqual((first.code, first.phrase, ours, got, trailing), twisted_reads(raw + extra))


class RequestWriterTests(SynchronousTestCase):
    """request_head and chunk framing."""

    def test_length(self) -> None:
        self.assertEqual(
            request_head(b"POST", b"/f?q", [(b"Host", b"h"), (b"X", b"1")], 7),
            b"POST /f?q HTTP/1.1\r\nHost: h\r\nX: 1\r\nContent-Length: 7\r\n\r\n",
        )

    def test_no_body(self) -> None:
        self.assertEqual(request_head(b"GET", b"/", [(b"Host", b"h")]), b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        for method in (b"POST", b"PUT", b"PATCH"):
            self.assertEqual(request_head(method, b"/", [], 0), method + b" / HTTP/1.1\r\nContent-Length: 0\r\n\r\n")

    def test_chunked(self) -> None:
        raw = request_head(b"POST", b"/", [(b"Host", b"h")], None)
        self.assertEqual(raw, b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        body = chunk(b"hello") + chunk(b"") + chunk(b"x" * 300) + LAST_CHUNK
        self.assertEqual(body, b"5\r\nhello\r\n12c\r\n" + b"x" * 300 + b"\r\n0\r\n\r\n")
        # The same framing reads back (a response's body framing is the same).
        events, _ = read([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body])
        self.assertEqual(events[1:], [Data(b"hello" + b"x" * 300), End(True, [])])

    def test_module_is_pure(self) -> None:
        """prexy.http1 imports no Twisted."""
        import ast
        import inspect

        tree = ast.parse(inspect.getsource(http1))
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        self.assertFalse([n for n in names if n.startswith("twisted")])
