"""Answers sent in the turn that produced them (ProxyChannel over SendNow)
keep HTTP's order on real sockets: a 100 Continue before its answer,
pipelined answers in request order, a large answer behind a small one."""

from __future__ import annotations

import json
from typing import Any

import pytest_twisted

from ..proxy.support import parse_response
from .conftest import OriginServer, Proxy
from .test_service import RawClient, connect


@pytest_twisted.inlineCallbacks
def test_100_continue_comes_first(origin_server: OriginServer, proxy: Proxy) -> Any:
    """twisted.web writes the 100 Continue itself; the answer follows it on
    the same connection, and the next request's answer follows that."""
    yield proxy.start_site(origin_server.url)
    body = b"x" * 1000
    client = RawClient(
        b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s"
        b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" % (len(body), body)
    )
    yield connect(proxy.port, client)
    raw = bytes(client.data)
    assert raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), raw[:200]
    echo_start = raw.index(b"{")
    echoed = json.loads(raw[echo_start : raw.index(b"HTTP/1.1 200", echo_start)])
    assert echoed["body"] == body.decode()
    assert raw.endswith(b"hello world!")


@pytest_twisted.inlineCallbacks
def test_pipelined_answers_in_order(origin_server: OriginServer, proxy: Proxy) -> Any:
    """Small, large (several socket buffers: partly queued) and small again,
    pipelined in one write: each answer whole and in order."""
    yield proxy.start_site(origin_server.url)
    client = RawClient(
        b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
        b"GET /big?mb=4 HTTP/1.1\r\nHost: t\r\n\r\n"
        b"GET /chunked HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
    )
    yield connect(proxy.port, client)
    raw = bytes(client.data)
    first = raw.index(b"hello world!")
    big = raw.index(b"Content-Length: %d" % (4 * 1024 * 1024))
    last = raw.rindex(b"HTTP/1.1 200 OK")
    assert first < big < last
    assert last - big > 4 * 1024 * 1024
    assert parse_response(raw[last:])[2] == b"first second"
