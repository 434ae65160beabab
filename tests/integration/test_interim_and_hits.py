"""Through ``twistd prexy`` with a scripted origin: a 103 Early Hints
reaches the client before its answer, and cache hits come compressed in the
client's coding from a copy made once."""

from __future__ import annotations

import gzip
import os
import socket
from typing import Any

import brotli
import pytest
import pytest_twisted
from twisted.internet import defer, threads

from .conftest import Cleanups
from .test_rfc_cache import ScriptedOrigin
from .twistd_support import Twistd, free_port, scratch_dir

PAGE = b"<html><body>" + b"<p>www.origin.test text</p>" * 300 + b"</body></html>"


@pytest.fixture
def scripted() -> Any:
    server = ScriptedOrigin()
    yield server
    server.close()


def raw_get(port: int, extra: bytes = b"") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"GET /page HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + extra + b"\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return data


@defer.inlineCallbacks
def start(cleanup: Cleanups, origin: ScriptedOrigin, site_extra: str = "") -> Any:
    d = scratch_dir("prexy-hints-")
    rules = os.path.join(d, "site.rules")
    with open(rules, "w") as f:
        f.write("replace_filter 'www\\.origin\\.test' 'clone.test' g;\nreplace_filter_headers Link;\n")
    port = free_port()
    config = os.path.join(d, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\nworkers = 2\naccess_log = "off"\n'
            f'[cache]\nsize = "16M"\npath = "{d}/store"\n'
            f'[sites.t]\nupstream = "http://127.0.0.1:{origin.port}"\nrules = ["{rules}"]\n{site_extra}'
        )
    child = Twistd("--config", config)
    cleanup(child.stop)
    yield child.ready()
    return port


def page_reply(extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nCache-Control: max-age=600\r\nETag: \"p1\"\r\n"
            b"%sContent-Length: %d\r\n\r\n%s" % (extra, len(PAGE), PAGE))


@pytest_twisted.inlineCallbacks
def test_early_hints_before_the_answer(cleanup: Cleanups, scripted: ScriptedOrigin) -> Any:
    """The 103 goes first, its Link rewritten by replace_filter_headers;
    then the rewritten page."""
    port = yield start(cleanup, scripted, "cache = false\n")
    scripted.replies.append(b"HTTP/1.1 103 Early Hints\r\nLink: <https://www.origin.test/a.css>; rel=preload\r\n\r\n"
                          + page_reply())
    data = yield threads.deferToThread(raw_get, port)
    interim, _, rest = data.partition(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 103 Early Hints\r\nLink: <https://clone.test/a.css>; rel=preload"
    assert rest.startswith(b"HTTP/1.1 200 OK")
    assert b"clone.test text" in rest


@pytest_twisted.inlineCallbacks
def test_cache_hits_compressed_once(cleanup: Cleanups, scripted: ScriptedOrigin) -> Any:
    """Hits in gzip and br from two workers decode to the rewritten page;
    the origin is asked once."""
    port = yield start(cleanup, scripted)
    scripted.replies.append(page_reply())
    first = yield threads.deferToThread(raw_get, port)
    head, _, body = first.partition(b"\r\n\r\n")
    assert b"stored" in head
    for _ in range(4):
        for accept, decode in ((b"gzip", gzip.decompress), (b"br", brotli.decompress)):
            data = yield threads.deferToThread(raw_get, port, b"Accept-Encoding: " + accept + b"\r\n")
            head, _, body = data.partition(b"\r\n\r\n")
            assert b"Content-Encoding: " + accept in head and b"hit" in head, head
            assert decode(body) == PAGE.replace(b"www.origin.test", b"clone.test")
    assert len(scripted.requests) == 1
