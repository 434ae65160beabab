"""parse_simple_head: the short parser for cache hits agrees with
twisted.web's full parser on every head it accepts, and refuses what it
does not handle."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import StringTransport
from twisted.web.http import HTTPChannel, Request

from prexy.proxy.headers import SIMPLE_HEAD_MAX, parse_simple_head


def twisted_parse(data: bytes) -> tuple[bytes, bytes, list[tuple[bytes, bytes]]] | None:
    """What twisted.web makes of ``data``: method, uri and header pairs of
    the one request it received, or None (no request, or a 400)."""
    seen: list[Any] = []

    class Recording(Request):
        def process(self) -> None:
            headers = [(n.lower(), v) for n, vs in self.requestHeaders.getAllRawHeaders() for v in vs]
            seen.append((self.method, self.uri, headers))
            self.finish()

    channel = HTTPChannel()
    channel.requestFactory = Recording  # type: ignore[assignment]
    transport = StringTransport()
    channel.makeConnection(transport)
    channel.dataReceived(data)
    channel.connectionLost(None)  # type: ignore[arg-type]
    if len(seen) != 1 or transport.value().startswith(b"HTTP/1.1 400"):
        return None
    return seen[0]


def grouped(pairs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Pairs in twisted.web's order: names by first appearance, values in order."""
    order: dict[bytes, list[bytes]] = {}
    for name, value in pairs:
        order.setdefault(name, []).append(value)
    return [(n, v) for n, vs in order.items() for v in vs]


def test_plain_get() -> None:
    head = b"GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nX-Y:  z \r\n\r\n"
    assert parse_simple_head(head) == (
        b"GET", b"/a?b=1", [(b"host", b"example.com"), (b"accept", b"*/*"), (b"x-y", b"z")]
    )


def test_refused() -> None:
    """Everything the short way leaves to the full parser."""
    for head in (
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\n\r\n",  # pipelined
        b"GET /a HTTP/1.1\r\nHost: x\r\n",  # incomplete
        b"POST /a HTTP/1.1\r\nHost: x\r\n\r\n",
        b"PURGE /a HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /a HTTP/1.0\r\nHost: x\r\n\r\n",
        b"GET http://x/a HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /a\tb HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET  /a HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n",
        b"GET /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"GET /a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET /a HTTP/1.1\r\nExpect: 100-continue\r\n\r\n",
        b"GET /a HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",
        b"GET /a HTTP/1.1\r\nConnection: upgrade\r\n\r\n",
        b"GET /a HTTP/1.1\r\nConnection: close\r\nConnection: close\r\n\r\n",
        b"GET /a HTTP/1.1\r\nX: a\r\n b\r\n\r\n",  # obs-fold
        b"GET /a HTTP/1.1\r\nX : a\r\n\r\n",
        b"GET /a HTTP/1.1\r\nX\r\n\r\n",
        b"GET /a HTTP/1.1\r\nX: a\nY: b\r\n\r\n",  # bare LF
        b"GET /a HTTP/1.1\r\nX: a\rb\r\n\r\n",  # bare CR
        b"GET /a HTTP/1.1\r\nX: a\x00\r\n\r\n",
        b"GET /a HTTP/1.1\r\nX: " + b"a" * SIMPLE_HEAD_MAX + b"\r\n\r\n",
    ):
        assert parse_simple_head(head) is None, head


_names = st.sampled_from(
    [b"Host", b"host", b"Accept", b"Cookie", b"If-None-Match", b"Connection", b"X-A", b"x-a",
     b"Content-Length", b"Expect", b"Bad Name", b"", b"\xff"]
)
_values = st.binary(max_size=12).map(lambda b: b.replace(b"\r\n", b""))
_good_names = st.sampled_from([b"Host", b"Accept", b"Cookie", b"If-None-Match", b"X-A", b"x-a", b"User-Agent"])
_good_values = st.text("abc ;=,*/\t\"-_", max_size=12).map(lambda t: t.encode())
_lines = st.one_of(
    # Mostly well-formed lines, so that many heads are accepted.
    st.tuples(_good_names, st.sampled_from([b":", b": ", b":\t"]), _good_values).map(b"".join),
    st.tuples(_good_names, st.just(b": "), _good_values).map(b"".join),
    st.tuples(_names, st.sampled_from([b":", b": ", b":\t", b" :", b""]), _values).map(b"".join),
    st.sampled_from([b" folded", b"\tfolded", b"Connection: close", b"Connection: keep-alive"]),
)
_request_lines = st.one_of(
    st.tuples(
        st.sampled_from([b"GET ", b"HEAD "]),
        st.text("abcXYZ019/?=&%.-_~", max_size=12).map(lambda t: b"/" + t.encode()),
        st.just(b" HTTP/1.1"),
    ).map(b"".join),
    st.tuples(
        st.sampled_from([b"GET", b"HEAD", b"POST", b"get"]),
        st.sampled_from([b" ", b"  ", b"\t"]),
        st.one_of(st.just(b"/"), st.binary(max_size=10).map(lambda b: b"/" + b)),
        st.sampled_from([b" HTTP/1.1", b" HTTP/1.0", b" HTTP/1.1 ", b""]),
    ).map(b"".join),
)


@settings(max_examples=400, deadline=None)
@given(_request_lines, st.lists(_lines, max_size=6))
def test_agrees_with_twisted(request_line: bytes, lines: list[bytes]) -> None:
    """Whatever the short parser accepts, twisted.web parses to the same
    method, target and headers."""
    data = b"\r\n".join([request_line, *lines]) + b"\r\n\r\n"
    mine = parse_simple_head(data)
    if mine is None:
        return
    theirs = twisted_parse(data)
    assert theirs is not None, data
    method, target, pairs = mine
    assert (method, target, grouped(pairs)) == theirs
