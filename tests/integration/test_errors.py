"""The answers Prexy makes itself, through ``twistd prexy --workers 2``:

- the origin down: a 502 whose body is generic (it names neither the
  origin's address nor its port; the log does, in one line), or the site's
  page when ``error_pages`` gives one;
- the origin dying mid-body while the answer's head is still held (the
  body being rewritten): a 502 on a connection that goes on serving, over
  HTTP/1.1 and HTTP/2 (h2c), never a silent close that a keep-alive client
  would take for an idle one and retry.
"""

from __future__ import annotations

import os
import shutil
import socket
from typing import Any

import pytest_twisted
from twisted.internet import defer, threads

from .conftest import Cleanups
from .raw_origin import RawOrigin
from .test_http2 import RawH2
from .twistd_support import Twistd, free_port, scratch_dir

#: The body starts a comment that the rules would remove: the transducer
#: holds it (and so the head) until the comment ends, which never comes.
RULES = "replace_filter '<!--[^>]*-->' '' g;\nreplace_filter_types text/html;\n"
DYING = (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100000\r\n\r\n"
         b"<!-- " + b"held " * 100)
OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 9\r\n\r\n<p>ok</p>"


class DyingOrigin(RawOrigin):
    """``/dies``: a head and part of the body, then the connection closes;
    anything else: a short page."""

    def answer(self, conn: socket.socket, head: bytes) -> bool:
        if head.split(b" ")[1] == b"/dies":
            conn.sendall(DYING)
            return False
        conn.sendall(OK)
        return True


def read_answer(sock: socket.socket) -> tuple[int, dict[bytes, bytes], bytes]:
    """One answer with a Content-Length from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise AssertionError(f"closed without an answer after {data!r}")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b": ")
        headers[name.lower()] = value
    length = int(headers[b"content-length"])
    while len(rest) < length:
        more = sock.recv(65536)
        if not more:
            raise AssertionError("closed mid-body")
        rest += more
    return int(lines[0].split()[1]), headers, rest[:length]


def get(port: int, path: bytes = b"/", method: bytes = b"GET") -> tuple[int, dict[bytes, bytes], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(method + b" " + path + b" HTTP/1.1\r\nHost: shop.test\r\n\r\n")
        return read_answer(s)


@defer.inlineCallbacks
def start(cleanup: Cleanups, upstream_port: int, site_extra: str = "", h2c: bool = False) -> Any:
    d = scratch_dir("prexy-errors-")
    cleanup(shutil.rmtree, d, True)
    os.mkdir(os.path.join(d, "errors"))
    with open(os.path.join(d, "errors", "5xx.html"), "w") as f:
        f.write("<h1>Back soon</h1>\n")
    with open(os.path.join(d, "errors", "504.html"), "w") as f:
        f.write("<h1>Slow</h1>\n")
    with open(os.path.join(d, "site.rules"), "w") as f:
        f.write(RULES)
    port = free_port()
    listen = f"tcp:{port}:interface=127.0.0.1"
    config = os.path.join(d, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = ["{listen}"]\naccess_log = "off"\n'
            + (f'h2c_listen = ["{listen}"]\n' if h2c else "")
            + f'[timeouts]\nconnect = 2\n'
            f'[sites.shop]\nupstream = "http://127.0.0.1:{upstream_port}"\nrules = "site.rules"\n{site_extra}'
        )
    child = Twistd("--config", config, "--workers", "2")
    cleanup(child.stop)
    yield child.ready()
    return child, port


@pytest_twisted.inlineCallbacks
def test_origin_down_generic_502(cleanup: Cleanups) -> Any:
    """Nothing listens on the origin's port: a 502 that names neither its
    address nor its port; the log has the reason, with both, in one line."""
    down = free_port()
    child, port = yield start(cleanup, down)
    status, headers, body = yield threads.deferToThread(get, port)
    assert (status, body) == (502, b"502 Bad Gateway\n")
    assert headers[b"content-type"] == b"text/plain; charset=utf-8"
    raw = b"".join(k + v for k, v in headers.items()) + body
    assert str(down).encode() not in raw and b"127.0.0.1" not in raw
    lines = [line for line in child.output().splitlines() if f"127.0.0.1:{down}" in line]
    assert len(lines) == 1 and "502 for GET /" in lines[0], child.output()


@pytest_twisted.inlineCallbacks
def test_origin_down_site_page(cleanup: Cleanups) -> Any:
    """With ``error_pages``: the class's page, as text/html, for a GET and
    (its length only) a HEAD."""
    down = free_port()
    _, port = yield start(cleanup, down, 'error_pages = { "5xx" = "errors/5xx.html", "504" = "errors/504.html" }\n')
    status, headers, body = yield threads.deferToThread(get, port)
    assert (status, body) == (502, b"<h1>Back soon</h1>\n")
    assert headers[b"content-type"] == b"text/html; charset=utf-8"

    def head() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"HEAD / HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n")
            data = b""
            while more := s.recv(65536):
                data += more
            return data

    raw = yield threads.deferToThread(head)
    assert raw.startswith(b"HTTP/1.1 502 ") and b"Content-Length: 19\r\n" in raw and raw.endswith(b"\r\n\r\n")


@pytest_twisted.inlineCallbacks
def test_origin_dies_before_the_head(cleanup: Cleanups) -> Any:
    """The origin closes mid-body while the rewrite holds the head: the
    client gets a 502 on its keep-alive connection, which then serves its
    next request."""
    origin = DyingOrigin()
    cleanup(origin.close)
    _, port = yield start(cleanup, origin.port)

    def two() -> list[tuple[int, dict[bytes, bytes], bytes]]:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET /dies HTTP/1.1\r\nHost: shop.test\r\n\r\n")
            first = read_answer(s)
            s.sendall(b"GET /ok HTTP/1.1\r\nHost: shop.test\r\n\r\n")
            return [first, read_answer(s)]

    (status, headers, body), (status2, _, body2) = yield threads.deferToThread(two)
    assert (status, body) == (502, b"502 Bad Gateway\n")
    assert b"etag" not in headers and b"transfer-encoding" not in headers
    assert (status2, body2) == (200, b"<p>ok</p>")


@pytest_twisted.inlineCallbacks
def test_origin_dies_before_the_head_http2(cleanup: Cleanups) -> Any:
    """The same over HTTP/2 (h2c): a 502 on the stream, not RST_STREAM,
    and the connection's next stream is served."""
    origin = DyingOrigin()
    cleanup(origin.close)
    _, port = yield start(cleanup, origin.port, h2c=True)

    def streams() -> RawH2:
        client = RawH2(port, tls_alpn=False)
        try:
            client.request(1, "/dies")
            client.read_until(lambda: 1 in client.ended or 1 in client.resets)
            client.request(3, "/ok")
            client.read_until(lambda: 3 in client.ended or 3 in client.resets)
        finally:
            client.close()
        return client

    client = yield threads.deferToThread(streams)
    assert 1 not in client.resets, client.resets
    assert client.heads[1][b":status"] == b"502"
    assert client.bodies[1] == b"502 Bad Gateway\n"
    assert client.heads[3][b":status"] == b"200" and client.bodies[3] == b"<p>ok</p>"
