"""A request fuzzer against the in-memory proxy.

Valid requests (a few shapes: bodies by length and chunked, absolute-form,
keep-alive pairs) are mutated and sent split at random points.  Whatever
comes, the proxy must keep these invariants:

- nothing is logged as an error (no traceback);
- the client gets an answer or a close: at once, once the upstream answers
  what was forwarded, or at the latest when the head or body deadline runs
  out;
- what reaches the upstream is a well-formed request (it passes the gate
  itself, and its body framing is one the upstream reads the same way);
- a well-formed request on a new connection is served afterwards.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.config import Limits, Timeouts
from prexy.h1server import Request, RequestReader

from .support import Harness

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
H = b"Host: www.example.test\r\n"

SEEDS = [
    b"GET /a?b=c HTTP/1.1\r\n" + H + b"Accept: */*\r\n\r\n",
    b"POST /p HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n\r\nhello",
    b"POST /p HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"GET http://www.example.test/x HTTP/1.1\r\nHost: other.test\r\n\r\n",
    b"GET /1 HTTP/1.1\r\n" + H + b"\r\nGET /2 HTTP/1.1\r\n" + H + b"\r\n",
    b"HEAD / HTTP/1.0\r\n\r\n",
]
TOKENS = [b" ", b"\r\n", b"\n", b"\r", b":", b"\x00", b"\x7f", b"\xc3\xa9", b"Host: b\r\n", b"%", b"%00",
          b"Transfer-Encoding: chunked\r\n", b"Content-Length: 3\r\n", b"\t", b"/..", b"#", b"*", b" \r\n",
          b"HTTP/1.0", b"http://", b"@", b",", b"0\r\n\r\n", b"Expect: 100-continue\r\n"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(raw)))
        kind = draw(st.sampled_from(["insert", "delete", "byte"]))
        if kind == "insert":
            raw[at:at] = draw(st.sampled_from(TOKENS))
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 4))]
        else:
            raw[at : at + 1] = bytes([draw(st.integers(0, 255))])
    return bytes(raw)


def upstream_requests(sent: bytes) -> list[bytes]:
    """The heads in what went to the upstream (bodies skipped by their
    framing, which the proxy always writes as Content-Length or chunked)."""
    heads = []
    rest = sent
    while rest:
        head, sep, rest = rest.partition(b"\r\n\r\n")
        assert sep, f"a partial head went upstream: {head!r}"
        heads.append(head + sep)
        lower = head.lower()
        if b"\r\ncontent-length:" in lower:
            n = int(lower.split(b"\r\ncontent-length:")[1].split(b"\r\n")[0])
            rest = rest[n:]
        elif b"\r\ntransfer-encoding: chunked" in lower:
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line, 16)
                rest = rest[size + 2 :] if size else rest.partition(b"\r\n")[2]
                if not size:
                    break
    return heads


class RequestFuzzTests(SynchronousTestCase):
    @given(mutated(), st.lists(st.integers(1, 200), max_size=6))
    @settings(max_examples=400, deadline=None)
    def test_invariants(self, raw: bytes, cuts: list[int]) -> None:
        h = Harness(timeouts=Timeouts(connect=5, first_byte=10, idle=7, pool_idle=30))
        channel, client = h.client()
        points = [0, *sorted(c for c in cuts if c < len(raw)), len(raw)]
        for a, b in zip(points, points[1:], strict=False):
            if client.disconnecting:
                break
            channel.dataReceived(raw[a:b])
        # Answer whatever was forwarded, as many times as it was asked.
        for _ in range(4):
            for conn in h.conns:
                if conn.transport.connected and not conn.transport.disconnecting:
                    asked = conn.sent().count(b"\r\n\r\n")
                    answered = getattr(conn, "_fuzz_answered", 0)
                    for _ in range(asked - answered):
                        conn.reply(OK)
                    conn._fuzz_answered = asked  # type: ignore[attr-defined]
            h.settle()
        if not client.disconnecting and not client.value():
            # Nothing yet: an incomplete head or body, which a deadline ends.
            h.clock.advance(61)
        self.assertTrue(client.value() or client.disconnecting, raw)
        self.assertEqual(self.flushLoggedErrors(), [], raw)
        for conn in h.conns:
            for head in upstream_requests(conn.sent()):
                self.assertIsInstance(RequestReader(Limits()).feed(head)[0], Request, head)
        # And the proxy still serves a good request.
        sizes = [len(conn.sent()) for conn in h.conns]
        _, fresh = h.send(SEEDS[0])
        for i, conn in enumerate(h.conns):
            if i >= len(sizes) or len(conn.sent()) > sizes[i]:
                conn.reply(OK)
        h.settle()
        self.assertTrue(fresh.value().startswith(b"HTTP/1.1 200 OK"), fresh.value()[:200])
