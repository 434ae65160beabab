"""Answers sent in the turn that produced them (ProxyChannel over SendNow)
keep HTTP's order on real sockets: a 100 Continue before its answer,
pipelined answers in request order, a large answer behind a small one."""

from __future__ import annotations

import json
from typing import Any

from twisted.internet import defer, reactor
from twisted.trial.unittest import TestCase

from prexy.config import Config, SiteConfig, UpstreamURL
from prexy.runtime import build_runtime
from prexy.service import ProxyService

from ..proxy.support import parse_response
from .origin import Origin, origin_site
from .test_service import RawClient, connect


class WriteOrderTests(TestCase):
    timeout = 60

    @defer.inlineCallbacks
    def setUp(self) -> Any:
        self.origin = Origin()
        origin_port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        self.addCleanup(origin_port.stopListening)
        config = Config(
            listen=("tcp:0:interface=127.0.0.1",),
            sites=(SiteConfig("t", UpstreamURL.parse(f"http://127.0.0.1:{origin_port.getHost().port}")),),
            default_site="t",
            access_log=None,
        )
        self.service = ProxyService(reactor, config, build_runtime(config))
        self.service.startService()
        self.addCleanup(self.service.stopService)
        ports = yield self.service.listening_ports()
        self.port = ports[0].getHost().port

    @defer.inlineCallbacks
    def test_100_continue_comes_first(self) -> Any:
        """twisted.web writes the 100 Continue itself; the answer follows it
        on the same connection, and the next request's answer follows that."""
        body = b"x" * 1000
        client = RawClient(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n%s"
            b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" % (len(body), body)
        )
        yield connect(self.port, client)
        raw = bytes(client.data)
        self.assertTrue(raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"), raw[:200])
        echo_start = raw.index(b"{")
        echoed = json.loads(raw[echo_start : raw.index(b"HTTP/1.1 200", echo_start)])
        self.assertEqual(echoed["body"], body.decode())
        self.assertTrue(raw.endswith(b"hello world!"))

    @defer.inlineCallbacks
    def test_pipelined_answers_in_order(self) -> Any:
        """Small, large (several socket buffers: partly queued) and small
        again, pipelined in one write: each answer whole and in order."""
        client = RawClient(
            b"GET /hello HTTP/1.1\r\nHost: t\r\n\r\n"
            b"GET /big?mb=4 HTTP/1.1\r\nHost: t\r\n\r\n"
            b"GET /chunked HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        yield connect(self.port, client)
        raw = bytes(client.data)
        first = raw.index(b"hello world!")
        big = raw.index(b"Content-Length: %d" % (4 * 1024 * 1024))
        last = raw.rindex(b"HTTP/1.1 200 OK")
        self.assertLess(first, big)
        self.assertLess(big, last)
        self.assertGreater(last - big, 4 * 1024 * 1024)
        self.assertTrue(raw.endswith(b"0\r\n\r\n"))
        self.assertEqual(parse_response(raw[last:])[2], b"first second")
