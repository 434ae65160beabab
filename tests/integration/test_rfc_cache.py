"""The cache by RFC 9111 through ``twistd prexy``: a 304 that updates the
stored head, ranges answered from the store, stale-if-error on a 503, and
an unsafe method that invalidates only after a success.

The origin is scripted: each request it gets is answered with the next
response of its queue, and it remembers what it was asked.  Objects are
made stale on arrival with ``Age`` (``max-age=10`` and ``Age: 10``), so no
test waits for a clock.
"""

from __future__ import annotations

import os
import socket
from collections import deque
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, threads

from .conftest import Cleanups
from .raw_origin import RawOrigin
from .twistd_support import Twistd, free_port, scratch_dir

BODY = b"0123456789" * 100


class ScriptedOrigin(RawOrigin):
    """Answers requests in turn from ``replies`` (a 500 once they run
    out), keeping each request head in ``requests``."""

    def __init__(self) -> None:
        self.replies: deque[bytes] = deque()
        self.requests: list[bytes] = []
        super().__init__()

    def answer(self, conn: socket.socket, head: bytes) -> bool:
        self.requests.append(head)
        conn.sendall(self.replies.popleft() if self.replies else b"HTTP/1.1 500 x\r\nContent-Length: 0\r\n\r\n")
        return True


def ok(extra: bytes, body: bytes = BODY, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: text/plain\r\nETag: \"e1\"\r\n%sContent-Length: %d\r\n\r\n%s" % (
        status, extra, len(body), body)


def fetch(port: int, extra: bytes = b"", method: bytes = b"GET", body: bytes = b"",
          path: bytes = b"/obj") -> tuple[int, dict[bytes, bytes], bytes]:
    raw = method + b" " + path + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n" + extra
    if body:
        raw += b"Content-Length: %d\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw + b"\r\n" + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, out = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b": ")
        headers[name.lower()] = value
    return int(lines[0].split()[1]), headers, out


@pytest.fixture
def origin() -> Any:
    server = ScriptedOrigin()
    yield server
    server.close()


@defer.inlineCallbacks
def start(cleanup: Cleanups, origin: ScriptedOrigin, grace: int = 0) -> Any:
    d = scratch_dir("prexy-rfc-")
    port = free_port()
    config = os.path.join(d, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\nworkers = 1\naccess_log = "off"\n'
            f'[cache]\nsize = "16M"\npath = "{d}/store"\n'
            f'[sites.t]\nupstream = "http://127.0.0.1:{origin.port}"\ncache_grace = {grace}\ncache_keep = 600\n'
            f'purge_from = ["127.0.0.1"]\n'
        )
    child = Twistd("--config", config)
    cleanup(child.stop)
    yield child.ready()
    return port


def get(port: int, *args: Any) -> Any:
    return threads.deferToThread(fetch, port, *args)


@pytest_twisted.inlineCallbacks
def test_304_updates_the_stored_head(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """The 304's Cache-Control and X-V replace the stored ones and make the
    object fresh for an hour: the next request is a hit with them."""
    port = yield start(cleanup, origin)
    origin.replies.append(ok(b"Cache-Control: max-age=10\r\nAge: 10\r\nX-V: 1\r\n"))
    status, headers, _ = yield get(port)
    assert status == 200
    origin.replies.append(b"HTTP/1.1 304 Not Modified\r\nCache-Control: max-age=3600\r\nX-V: 2\r\nETag: \"e1\"\r\n\r\n")
    status, headers, body = yield get(port)
    assert (status, body) == (200, BODY)
    assert b'if-none-match: "e1"' in origin.requests[-1].lower()
    assert len(origin.requests) == 2
    status, headers, body = yield get(port)
    assert len(origin.requests) == 2, "a hit"
    assert (status, body, headers[b"x-v"], headers[b"cache-control"]) == (200, BODY, b"2", b"max-age=3600")


@pytest_twisted.inlineCallbacks
def test_ranges_from_the_store(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """A range miss fetches the whole object (no Range upstream) and its
    client gets the range; range hits are 206s of the stored bytes."""
    port = yield start(cleanup, origin)
    origin.replies.append(ok(b"Cache-Control: max-age=600\r\n"))
    status, _, body = yield get(port, b"Range: bytes=0-9\r\n")
    assert b"range" not in origin.requests[-1].lower()
    assert (status, body) == (206, BODY[:10])
    status, headers, body = yield get(port, b"Range: bytes=100-109\r\n")
    assert (status, body, headers[b"content-range"]) == (206, BODY[100:110], b"bytes 100-109/1000")
    status, headers, _ = yield get(port, b"Range: bytes=2000-\r\n")
    assert (status, headers[b"content-range"]) == (416, b"bytes */1000")
    assert len(origin.requests) == 1


@pytest_twisted.inlineCallbacks
def test_stale_if_error_on_503(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """A stale object with stale-if-error is served when the origin
    answers 503, and stays for the next 503."""
    port = yield start(cleanup, origin)
    origin.replies.append(ok(b"Cache-Control: max-age=10, stale-if-error=600\r\nAge: 10\r\n"))
    yield get(port)
    for _ in range(2):
        origin.replies.append(ok(b"", b"down", b"503 Service Unavailable"))
        status, headers, body = yield get(port)
        assert (status, body) == (200, BODY)
        assert b"stale-if-error" in headers[b"cache-status"]
    assert len(origin.requests) == 3


@pytest_twisted.inlineCallbacks
def test_unsafe_method_invalidates_after_success_only(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """M-SEARCH answered 500 keeps the object; answered 200 removes it."""
    port = yield start(cleanup, origin)
    origin.replies.append(ok(b"Cache-Control: max-age=600\r\n"))
    yield get(port)
    origin.replies.append(ok(b"", b"no", b"500 Internal Server Error"))
    yield get(port, b"", b"M-SEARCH")
    status, headers, _ = yield get(port)
    assert b"hit" in headers[b"cache-status"] and len(origin.requests) == 2
    origin.replies.append(ok(b"", b"ok"))
    yield get(port, b"", b"M-SEARCH")
    origin.replies.append(ok(b"Cache-Control: max-age=600\r\n"))
    status, headers, _ = yield get(port)
    assert len(origin.requests) == 4, "fetched again after the invalidation"


@pytest_twisted.inlineCallbacks
def test_no_cache_is_stored_and_revalidated_on_every_use(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """Cache-Control: no-cache with an ETag: each request revalidates
    (If-None-Match upstream) and a 304 is answered with the stored body."""
    port = yield start(cleanup, origin)
    origin.replies.append(ok(b"Cache-Control: no-cache\r\n"))
    status, headers, body = yield get(port)
    assert (status, body) == (200, BODY) and b"stored" in headers[b"cache-status"]
    for n in (2, 3):
        origin.replies.append(b"HTTP/1.1 304 Not Modified\r\nETag: \"e1\"\r\nCache-Control: no-cache\r\n\r\n")
        status, headers, body = yield get(port)
        assert (status, body) == (200, BODY)
        assert len(origin.requests) == n
        assert b'if-none-match: "e1"' in origin.requests[-1].lower()


@pytest_twisted.inlineCallbacks
def test_must_revalidate_and_stale_on_arrival_get_no_grace(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """With the site's grace at 60 s, a stale object with must-revalidate, or
    one that arrived already stale, is revalidated before it is served (the
    client gets the new version), never served from grace."""
    port = yield start(cleanup, origin, grace=60)
    for extra in (b"Cache-Control: max-age=10, must-revalidate\r\nAge: 10\r\n", b"Cache-Control: max-age=10\r\nAge: 10\r\n"):
        origin.requests.clear()
        origin.replies.append(ok(extra + b"X-V: 1\r\n"))
        status, headers, _ = yield get(port)
        assert headers[b"x-v"] == b"1"
        origin.replies.append(ok(b"Cache-Control: max-age=600\r\nX-V: 2\r\n", status=b"200 OK"))
        status, headers, body = yield get(port)
        assert b"grace" not in headers[b"cache-status"] and headers[b"x-v"] == b"2", headers
        assert b'if-none-match: "e1"' in origin.requests[-1].lower()
        # The next object of the same URL: purge so the loop starts afresh.
        yield threads.deferToThread(fetch, port, b"", b"PURGE")


@pytest_twisted.inlineCallbacks
def test_unsafe_method_invalidates_its_location(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """A POST answered 201 with Location and Content-Location on the same
    host drops those URLs' objects too; one on another host is left."""
    port = yield start(cleanup, origin)
    for path in (b"/a", b"/b", b"/c"):
        origin.replies.append(ok(b"Cache-Control: max-age=600\r\n"))
        yield get(port, b"", b"GET", b"", path)
    origin.replies.append(ok(b"Location: /a\r\nContent-Location: http://t/b\r\n", b"made", b"201 Created"))
    yield get(port, b"", b"POST", b"x", b"/new")
    origin.replies.append(ok(b"Location: http://elsewhere/c\r\n", b"made", b"201 Created"))
    yield get(port, b"", b"POST", b"x", b"/new")
    assert len(origin.requests) == 5
    status, headers, _ = yield get(port, b"", b"GET", b"", b"/c")
    assert b"hit" in headers[b"cache-status"], "another host's URL stays"
    for n, path in enumerate((b"/a", b"/b"), start=6):
        origin.replies.append(ok(b"Cache-Control: max-age=600\r\n"))
        status, headers, _ = yield get(port, b"", b"GET", b"", path)
        assert len(origin.requests) == n and b"hit" not in headers[b"cache-status"], path


@pytest_twisted.inlineCallbacks
def test_no_cache_field_names_are_not_stored(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    """no-cache="X-User": the miss's own client gets X-User; hits are
    served without it, and without asking the origin."""
    port = yield start(cleanup, origin)
    origin.replies.append(ok(b'Cache-Control: max-age=600, no-cache="X-User"\r\nX-User: alice\r\nX-Other: 1\r\n'))
    status, headers, _ = yield get(port)
    assert headers[b"x-user"] == b"alice"
    status, headers, body = yield get(port)
    assert (status, body) == (200, BODY) and b"hit" in headers[b"cache-status"]
    assert b"x-user" not in headers and headers[b"x-other"] == b"1"
    assert len(origin.requests) == 1
