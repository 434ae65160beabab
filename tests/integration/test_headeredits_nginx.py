"""``add_header``, ``proxy_hide_header`` and ``proxy_set_header`` through
``twistd prexy --workers 2``, side by side with Debian's nginx carrying the
same directives (:mod:`prexy.headeredits`).

One origin answers ``/s/NNN`` with status NNN, a few headers of its own
(``X-Powered-By``, ``X-Up``, ``X-Dup``, ``ETag``...) and, as its body, the
head of the request it got.  nginx has one server proxying to it and one
proxying to a closed port; Prexy has the same as two sites of one
``twistd prexy``, both with a rules file holding :data:`DIRECTIVES`.  For
each status the headers the directives name must come out the same from
both (each proxy's own port written as PORT), and the origin must see the
same ``proxy_set_header`` results; the closed port gives both a 502, where
only the ``always`` headers come.  Then, Prexy alone, a cache hit (and a
304 from the cache) gets what the miss got, the hidden header stored but
not sent.

nginx comes from ``$PREXY_NGINX``, ``nginx`` on ``$PATH`` or
``/usr/sbin/nginx``; the comparison is skipped only without one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, threads

from .conftest import Cleanups
from .test_headerrules_nginx import find_nginx
from .test_strict import listening
from .twistd_support import Twistd, free_port, free_ports, scratch_dir, stop_process

#: The same text in nginx's servers and Prexy's rules file.
DIRECTIVES = """
add_header X-Frame-Options DENY;
add_header Strict-Transport-Security "max-age=31536000" always;
add_header X-Dup two;
add_header X-Dup three;
add_header X-Empty "";
add_header X-Vars "$host|$HTTP_HOST|$scheme|$https|$server_port|$server_addr|$remote_addr|$request_method|$request_uri|$args|$is_args|$query_string|$proxy_host|$server_protocol|$http_x_test|$http_x_none|$http_cookie";
add_header X-Always "$request_uri $http_x_forwarded_for" always;
proxy_hide_header X-Powered-By;
proxy_hide_header x-up;
proxy_set_header Host $host;
proxy_set_header X-Real-IP $remote_addr;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Test "";
proxy_set_header Accept-Language "";
proxy_set_header Via "";
proxy_set_header X-Req "$request_method $request_uri";
proxy_set_header X-Req "second";
"""

#: The response headers compared (lower case).
COMPARED = (b"x-frame-options", b"strict-transport-security", b"x-dup", b"x-empty", b"x-vars", b"x-always",
            b"x-powered-by", b"x-up", b"location", b"etag")
#: The request headers the origin must see the same from both.
SEEN = (b"host", b"x-real-ip", b"x-forwarded-for", b"x-test", b"accept-language", b"via", b"x-req", b"cookie")

STATUSES = (200, 201, 204, 206, 301, 302, 303, 307, 308, 400, 404, 410, 500, 503)


class Origin:
    """Answers ``/s/NNN`` with status NNN (else 200), its own headers and
    the request's head as the body."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head = data.split(b"\r\n\r\n", 1)[0]
            path = head.split(b" ", 2)[1]
            status = int(path[3:6]) if path.startswith(b"/s/") else 200
            body = b"" if status in (204, 304) else head
            extra = b"Location: /landing\r\n" if 300 <= status < 400 else b""
            conn.sendall(
                b"HTTP/1.1 %d Whatever\r\nX-Powered-By: PHP/8.2\r\nX-Up: origin\r\nX-Dup: one\r\n"
                b'ETag: "v1"\r\nCache-Control: max-age=60\r\nContent-Type: text/plain\r\n%s'
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (status, extra, len(body), body)
            )

    def close(self) -> None:
        self.sock.close()


CLIENT = b"X-Test: t\r\nAccept-Language: nl\r\nX-Forwarded-For: 203.0.113.9\r\nCookie: a=1\r\nCookie: b=2\r\n"


def get(port: int, host: str, path: str, extra: bytes = CLIENT) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """One GET: the status, the header pairs (the proxy's port as PORT) and the body."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n".encode() + extra + b"\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    pairs = [(n, v.replace(b"%d" % port, b"PORT")) for n, _, v in (line.partition(b": ") for line in lines[1:])]
    return int(lines[0].split(b" ")[1]), pairs, body


def compared(pairs: list[tuple[bytes, bytes]], names: tuple[bytes, ...] = COMPARED) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {name: [] for name in names}
    for name, value in pairs:
        if name.lower() in out:
            out[name.lower()].append(value)
    return out


def seen(body: bytes, port: int) -> dict[bytes, list[bytes]]:
    """The compared request headers the origin got (the proxy's port as PORT)."""
    lines = body.split(b"\r\n")[1:]
    return compared([(n, v.replace(b"%d" % port, b"PORT")) for n, _, v in (line.partition(b": ") for line in lines)],
                    SEEN)


class Nginx:
    """Two servers: one proxying to the origin, one to a closed port."""

    def __init__(self, binary: str, origin_port: int, closed_port: int) -> None:
        self.dir = scratch_dir("prexy-edits-nginx-")
        self.port, self.down_port = free_ports(2)
        d = self.dir
        servers = "".join(
            f"  server {{ listen 127.0.0.1:{port}; server_name _;\n"
            f"    location / {{ proxy_pass http://127.0.0.1:{up};\n{DIRECTIVES} }} }}\n"
            for port, up in ((self.port, origin_port), (self.down_port, closed_port))
        )
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(
                f"daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n"
                f"error_log {d}/error.log info;\nevents {{ worker_connections 64; }}\n"
                f"http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d};\n"
                f"  fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n{servers}}}\n"
            )
        self.process = subprocess.Popen([binary, "-p", d, "-c", os.path.join(d, "nginx.conf")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        stop_process(self.process)


@pytest.fixture
def origin() -> Any:
    server = Origin()
    yield server
    server.close()


@defer.inlineCallbacks
def prexy(cleanup: Cleanups, origin_port: int, closed_port: int, cache: bool) -> Any:
    """``twistd prexy`` with two workers: site ``clone`` (the origin, cached
    when ``cache``) and ``down`` (the closed port), both with DIRECTIVES."""
    d = scratch_dir("prexy-edits-")
    rules = os.path.join(d, "site.rules")
    with open(rules, "w") as f:
        f.write(DIRECTIVES)
    port = free_port()
    config = os.path.join(d, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\nworkers = 2\naccess_log = "off"\n'
            f'[cache]\nsize = "16M"\npath = "{d}/store"\n'
            f'[sites.clone]\nhosts = ["clone.test"]\nupstream = "http://127.0.0.1:{origin_port}"\n'
            f'rules = ["{rules}"]\ncache = {"true" if cache else "false"}\n'
            f'[sites.down]\nhosts = ["down.test"]\nupstream = "http://127.0.0.1:{closed_port}"\n'
            f'rules = ["{rules}"]\ncache = false\n'
        )
    child = Twistd("--config", config)
    cleanup(child.stop)
    yield child.ready()
    assert len(child.children()) == 2
    return port


def closed_port() -> int:
    """A port nothing listens on (reserved for this run, so it stays so)."""
    return free_port()


@pytest_twisted.inlineCallbacks
def test_same_headers_as_nginx(cleanup: Cleanups, origin: Origin) -> Any:
    """Every status: the same added and hidden headers through Prexy as
    through nginx, the same proxy_set_header results at the origin, and
    the same always-headers on both proxies' own 502."""
    binary = find_nginx()
    if binary is None:
        pytest.skip("no nginx binary")
    down = closed_port()
    nginx = Nginx(binary, origin.port, down)
    cleanup(nginx.stop)
    yield listening(nginx.down_port)
    port = yield prexy(cleanup, origin.port, down, cache=False)
    mismatches = []
    for status in STATUSES:
        path = f"/s/{status}?a=1&b=%20"
        theirs = yield threads.deferToThread(get, nginx.port, "clone.test", path)
        ours = yield threads.deferToThread(get, port, "clone.test", path)
        assert (theirs[0], ours[0]) == (status, status)
        if compared(ours[1]) != compared(theirs[1]):
            mismatches.append(f"{status}:\n  nginx {compared(theirs[1])}\n  prexy {compared(ours[1])}")
        if status == 200:
            origin_saw = (seen(theirs[2], nginx.port), seen(ours[2], port))
            assert origin_saw[0] == origin_saw[1], origin_saw
            assert origin_saw[1][b"x-req"] == [b"GET /s/200?a=1&b=%20", b"second"]
            assert origin_saw[1][b"x-forwarded-for"] == [b"203.0.113.9, 127.0.0.1"]
            assert origin_saw[1][b"host"] == [b"clone.test"]
            assert origin_saw[1][b"x-test"] == origin_saw[1][b"via"] == []
    assert not mismatches, "\n".join(mismatches)
    ok = compared(ours[1])
    theirs = yield threads.deferToThread(get, nginx.down_port, "down.test", "/x?y")
    ours = yield threads.deferToThread(get, port, "down.test", "/x?y")
    assert (theirs[0], ours[0]) == (502, 502)
    assert compared(ours[1]) == compared(theirs[1])
    assert compared(ours[1])[b"x-always"] == [b"/x?y 203.0.113.9"]
    assert compared(ours[1])[b"x-frame-options"] == []
    # And the 200 really was edited: added, appended, hidden.
    status, pairs, _ = yield threads.deferToThread(get, port, "clone.test", "/s/200")
    got = compared(pairs)
    assert got[b"x-dup"] == [b"one", b"two", b"three"]
    assert got[b"x-powered-by"] == got[b"x-up"] == got[b"x-empty"] == []
    assert got[b"x-vars"] == [b"clone.test|clone.test:PORT|http||PORT|127.0.0.1|127.0.0.1|GET|/s/200|||"
                              b"|127.0.0.1:%d|HTTP/1.1|t||a=1; b=2" % origin.port]
    assert ok[b"strict-transport-security"] == [b"max-age=31536000"]


@pytest_twisted.inlineCallbacks
def test_cache_hit_gets_what_the_miss_got(cleanup: Cleanups, origin: Origin) -> Any:
    """With the cache on: a hit, and a 304 from the cache, get the miss's
    added headers; the hidden one, stored with the object, stays hidden."""
    port = yield prexy(cleanup, origin.port, closed_port(), cache=True)
    path = "/s/200?hit"
    plain = b"X-Forwarded-For: 203.0.113.9\r\n"  # no cookie: the answer may be shared
    _, miss, _ = yield threads.deferToThread(get, port, "clone.test", path, plain)
    _, hit, _ = yield threads.deferToThread(get, port, "clone.test", path, plain)
    status, not_modified, _ = yield threads.deferToThread(
        get, port, "clone.test", path, plain + b'If-None-Match: "v1"\r\n')
    assert [v for n, v in hit if n.lower() == b"cache-status"][0].startswith(b"prexy; hit")
    assert compared(hit) == compared(miss)
    assert compared(miss)[b"x-dup"] == [b"one", b"two", b"three"]
    assert compared(miss)[b"x-powered-by"] == []
    assert status == 304
    assert compared(not_modified) == compared(miss)
    # A 404 is not stored here, but goes through the same step: always only.
    status, missing, _ = yield threads.deferToThread(get, port, "clone.test", "/s/404", plain)
    assert status == 404
    assert compared(missing)[b"x-frame-options"] == []
    assert compared(missing)[b"strict-transport-security"] == [b"max-age=31536000"]
