"""Upstream bodies through ``twistd prexy --workers 2``: a compressed body
with garbage after the end of its stream is served whole and rewritten
(as ``gzip -d`` and browsers serve it), counted and logged; a body the
proxy knows is complete ends the rewrite with its last bytes, as the
replace-filter module ends a static file."""

from __future__ import annotations

import gzip
import os
import random
import shutil
from typing import Any

import brotli
import pytest
import pytest_twisted
import zstandard
from twisted.internet import defer, error, reactor
from twisted.web import resource, server

from .conftest import Cleanups
from .test_service import RawClient, connect, metrics_showing
from .twistd_support import Twistd, body_of, free_port, scratch_dir

_rng = random.Random(31)
#: About 180 KB, so that it reaches Prexy in several reads.
PAGE = b"".join(
    b"<p><a href='https://www.origin.example/%032x'>www.origin.example</a></p>\n" % _rng.getrandbits(128)
    for _ in range(2500)
)
REWRITTEN = PAGE.replace(b"www.origin.example", b"www.clone.example")
GARBAGE = b"\r\n<!-- appended by the origin's footer module -->\n"
TRIM_PAGE = b"  hello, world  \nblah yeah\nhello  \n   baby!\n     \nabc\n"

#: path -> (body, Content-Encoding, chunked)
BODIES: dict[bytes, tuple[bytes, bytes | None, bool]] = {
    b"/gzip": (gzip.compress(PAGE) + GARBAGE, b"gzip", False),
    b"/gzip-chunked": (gzip.compress(PAGE) + GARBAGE, b"gzip", True),
    b"/gzip-members": (gzip.compress(PAGE[:1000]) + gzip.compress(PAGE[1000:]) + GARBAGE, b"gzip", False),
    b"/br": (brotli.compress(PAGE, quality=5) + GARBAGE, b"br", False),
    b"/zstd": (zstandard.ZstdCompressor().compress(PAGE) + GARBAGE, b"zstd", True),
    b"/trim": (TRIM_PAGE, None, False),
    b"/trim-gzip": (gzip.compress(TRIM_PAGE), b"gzip", False),
}


class CodedOrigin(resource.Resource):
    """Serves ``BODIES``: with a Content-Length, or chunked in 4 KB pieces."""

    isLeaf = True

    def render_GET(self, request: server.Request) -> Any:
        body, coding, chunked = BODIES[request.path]
        request.setHeader(b"content-type", b"text/html")
        if coding is not None:
            request.setHeader(b"content-encoding", coding)
        if not chunked:
            request.setHeader(b"content-length", b"%d" % len(body))
            return body
        for i in range(0, len(body), 4096):
            request.write(body[i : i + 4096])
        request.finish()
        return server.NOT_DONE_YET


def write(directory: str, name: str, data: bytes) -> str:
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


class TestUpstreamBodies:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        site = server.Site(CodedOrigin())
        site.log = lambda r: None  # type: ignore[method-assign]
        listening = reactor.listenTCP(0, site, interface="127.0.0.1")
        cleanup(listening.stopListening)
        self.upstream = f"http://127.0.0.1:{listening.getHost().port}"
        self.dir = scratch_dir("prexy-bodies-")
        cleanup(shutil.rmtree, self.dir, True)

    @defer.inlineCallbacks
    def start(self, rules: bytes) -> Any:
        self.port, self.admin = free_port(), free_port()
        child = Twistd(
            "--listen", f"tcp:{self.port}:interface=127.0.0.1", "--upstream", self.upstream,
            "--rules", write(self.dir, "site.rules", rules), "--workers", "2",
            "--admin", f"tcp:{self.admin}:interface=127.0.0.1",
        )
        self.cleanup(child.stop)
        yield child.ready()
        return child

    @defer.inlineCallbacks
    def get(self, path: bytes, headers: bytes = b"") -> Any:
        client = RawClient(b"GET " + path + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + headers + b"\r\n")
        yield connect(self.port, client)
        return bytes(client.data), client.reason

    @pytest_twisted.inlineCallbacks
    def test_trailing_garbage_served_whole(self) -> Any:
        """gzip (with a length, chunked, several members), br and zstd bodies
        followed by garbage: 200 and the whole rewritten page, identity or
        gzip for the client, the connection closed cleanly; counted by
        coding, and each worker logs the site once."""
        child = yield self.start(b"replace_filter 'www\\.origin\\.example' 'www.clone.example' g;\n")
        for path in (b"/gzip", b"/gzip-chunked", b"/gzip-members", b"/br", b"/zstd"):
            for accept in (b"", b"Accept-Encoding: gzip\r\n"):
                raw, reason = yield self.get(path, accept)
                assert raw.startswith(b"HTTP/1.1 200 "), (path, raw[:300])
                body = body_of(raw)
                if accept:
                    assert b"\r\ncontent-encoding: gzip\r\n" in raw.partition(b"\r\n\r\n")[0].lower()
                    body = gzip.decompress(body)
                assert body == REWRITTEN, (path, accept, len(body))
                assert reason.check(error.ConnectionDone), (path, reason)  # closed, not reset
        yield metrics_showing(self.admin, 'prexy_decode_trailing_garbage_total{coding="gzip"} 6')
        yield metrics_showing(self.admin, 'prexy_decode_trailing_garbage_total{coding="br"} 2')
        yield metrics_showing(self.admin, 'prexy_decode_trailing_garbage_total{coding="zstd"} 2')
        logged = child.output().count("garbage after the end of a")
        assert 1 <= logged <= 2, child.output()[-2000:]

    @pytest_twisted.inlineCallbacks
    def test_complete_body_ends_the_rewrite(self) -> Any:
        """With ``replace_filter_max_buffered_size 0``, ``\\s+$`` at the end of
        a body whose length Prexy has read (identity or gzip) is replaced,
        as the module does for a static file: no bail-out."""
        yield self.start(b"replace_filter_max_buffered_size 0;\nreplace_filter '\\s+$' '' g;\n")
        for path in (b"/trim", b"/trim-gzip"):
            raw, _ = yield self.get(path)
            assert raw.startswith(b"HTTP/1.1 200 "), raw[:300]
            assert body_of(raw) == b"  hello, world\nblah yeah\nhello\n   baby!\nabc", path
            assert b"rewrite-bailout" not in raw, path
