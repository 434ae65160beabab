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
not sent; a reload with a bad directive is refused and the old ones serve.
Last, :meth:`HeaderEdits.respond` against nginx case by case, and the
builder against ``nginx -t``.

nginx comes from ``$PREXY_NGINX``, ``nginx`` on ``$PATH`` or
``/usr/sbin/nginx``; the comparison is skipped only without one.
"""

from __future__ import annotations

import base64
import os
import socket
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
import pytest_twisted
from twisted.internet import defer, threads

from prexy.headervars import RequestVars

from .conftest import Cleanups
from .raw_origin import RawOrigin
from .test_headerrules_nginx import (
    build,
    check_deviation,
    check_loads,
    check_refused,
    find_nginx,
    nginx_conf,
)
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


class Origin(RawOrigin):
    """Answers ``/s/NNN`` with status NNN (else 200), its own headers (or
    the lines base64-encoded in the request's ``X-Resp``) and the request's
    head as the body, then closes the connection."""

    def answer(self, conn: socket.socket, head: bytes) -> bool:
        path = head.split(b" ", 2)[1]
        status = int(path[3:6]) if path.startswith(b"/s/") else 200
        body = b"" if status in (204, 304) else head
        asked = [line for line in head.split(b"\r\n") if line.lower().startswith(b"x-resp:")]
        if asked:
            own = base64.b64decode(asked[0].split(b":", 1)[1].strip())
        else:
            own = (b"X-Powered-By: PHP/8.2\r\nX-Up: origin\r\nX-Dup: one\r\n"
                   b'ETag: "v1"\r\nCache-Control: max-age=60\r\nContent-Type: text/plain\r\n')
            own += b"Location: /landing\r\n" if 300 <= status < 400 else b""
        conn.sendall(
            b"HTTP/1.1 %d Whatever\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s"
            % (status, own, len(body), body)
        )
        return False


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
def prexy(cleanup: Cleanups, origin_port: int, closed_port: int, cache: bool, admin: int | None = None,
          rules: str | None = None) -> Any:
    """``twistd prexy`` with two workers: site ``clone`` (the origin, cached
    when ``cache``) and ``down`` (the closed port), both with DIRECTIVES
    (or in the rules file ``rules``)."""
    d = scratch_dir("prexy-edits-")
    if rules is None:
        rules = os.path.join(d, "site.rules")
        with open(rules, "w") as f:
            f.write(DIRECTIVES)
    port = free_port()
    config = os.path.join(d, "prexy.toml")
    admin_line = f'admin = "tcp:{admin}:interface=127.0.0.1"\n' if admin is not None else ""
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\nworkers = 2\naccess_log = "off"\n{admin_line}'
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


@pytest_twisted.inlineCallbacks
def test_reload_refuses_a_bad_directive(cleanup: Cleanups, origin: Origin) -> Any:
    """A reload with a bad add_header is refused (409 naming the file and
    line) and the old directives keep serving; a good one goes live."""
    d = scratch_dir("prexy-edits-reload-")
    rules = os.path.join(d, "site.rules")
    with open(rules, "w") as f:
        f.write("add_header X-Frame-Options DENY;\n")
    admin = free_port()
    port = yield prexy(cleanup, origin.port, closed_port(), cache=False, admin=admin, rules=rules)

    def frame_options() -> list[bytes]:
        return compared(get(port, "clone.test", "/s/200")[1])[b"x-frame-options"]

    def reload() -> bytes:
        with socket.create_connection(("127.0.0.1", admin), timeout=20) as s:
            s.sendall(b"POST /reload HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        return data

    assert (yield threads.deferToThread(frame_options)) == [b"DENY"]
    with open(rules, "w") as f:
        f.write("add_header X-Frame-Options SAMEORIGIN;\n# the next one frames the message\nadd_header Content-Length 0;\n")
    answer = yield threads.deferToThread(reload)
    assert answer.startswith(b"HTTP/1.1 409"), answer
    assert f"{rules}:3:".encode() in answer, answer
    assert b"frames the message" in answer, answer
    assert (yield threads.deferToThread(frame_options)) == [b"DENY"]
    with open(rules, "w") as f:
        f.write("add_header X-Frame-Options SAMEORIGIN;\n")
    answer = yield threads.deferToThread(reload)
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert (yield threads.deferToThread(frame_options)) == [b"SAMEORIGIN"]


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


# -- the pure module against nginx, case by case ------------------------------------

@attrs.frozen
class Case:
    name: str
    directives: str
    upstream: tuple[str, ...]
    status: int = 200


ETAGS = ('ETag: "a"', "X-A: 1", 'ETag: "b"', "Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT")
CASES = [
    Case("appended, never replacing", "add_header X-A 2; add_header x-a 3; add_header Cache-Control no-cache;"
         " add_header Link </b>;", ("X-A: 1", "Cache-Control: max-age=1", "Link: </a>")),
    Case("ETag and Last-Modified replace the last", 'add_header etag "\\"n\\""; add_header Last-Modified Tue;', ETAGS),
    Case("ETag and Last-Modified: empty removes", 'add_header ETag ""; add_header Last-Modified "";', ETAGS),
    Case("ETag without one upstream", "add_header ETag x;", ("X-A: 1",)),
    Case("ETag empty without one", "add_header ETag ''; proxy_hide_header etag;", ETAGS),
    Case("hidden, then added", "proxy_hide_header ETag; proxy_hide_header last-modified; add_header ETag x;"
         " add_header ETag y;", ETAGS),
    Case("hidden caseless, every one", "proxy_hide_header x-powered-by;",
         ("X-Powered-By: a", "x-powered-by: b", "X-POWERED-BY: c", "X-Powered: d")),
    Case("hidden and added back", "proxy_hide_header X-A; add_header X-A mine;", ("X-A: 1", "X-B: 2")),
    Case("empty values add nothing", "add_header X-E ''; add_header X-V $http_x_none; add_header X-W '$is_args';",
         ("X-A: 1",)),
    Case("variables", "add_header X-V '$host|$http_host|$scheme|$request_uri|$args|$is_args|$query_string|"
         "$request_method|$remote_addr|$server_addr|$proxy_host|$server_protocol|$http_user_agent|$https';",
         ("X-A: 1",)),
    *[Case(f"status {s}", "add_header X-S s; add_header X-A a always; proxy_hide_header X-H;", ("X-H: h",), s)
      for s in (200, 201, 202, 203, 204, 206, 300, 301, 302, 303, 304, 305, 307, 308, 400, 401, 403, 404, 409,
                410, 418, 429, 500, 502, 503, 504)],
]
#: Headers nginx writes itself (its own Server and Date, its framing).
NGINX_OWN = (b"server", b"date", b"content-length", b"connection", b"transfer-encoding")


@attrs.frozen
class Served:
    port: int
    origin: int


@pytest.fixture(scope="module")
def served() -> Any:
    binary = find_nginx()
    if binary is None:
        pytest.skip("no nginx binary")
    origin = Origin()
    d = scratch_dir("prexy-edits-cases-")
    port = free_port()
    up = f"127.0.0.1:{origin.port}"
    body = "".join(f"    location /c{i}/ {{ proxy_pass http://{up}/; {c.directives} }}\n" for i, c in enumerate(CASES))
    conf = nginx_conf(Path(d), port, body)
    process = subprocess.Popen([binary, "-p", d, "-c", str(conf)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        pytest_twisted.blockon(listening(port))
        yield Served(port, origin.port)
    finally:
        stop_process(process)
        origin.close()


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_respond_as_nginx(served: Served, index: int) -> None:
    """Each case: the head nginx sends (but its own headers) is, pair by
    pair and in order, what HeaderEdits.respond makes of the upstream's."""
    case = CASES[index]
    path = f"/c{index}/s/{case.status}?q=1"
    wanted = "".join(line + "\r\n" for line in case.upstream).encode()
    extra = b"User-Agent: UA/1\r\nX-Resp: " + base64.b64encode(wanted) + b"\r\n"
    status, theirs, _ = get(served.port, "clone.test", path, extra)
    assert status == case.status
    theirs = [(n, v.replace(b"PORT", b"%d" % served.port)) for n, v in theirs if n.lower() not in NGINX_OWN]
    upstream = [(n.encode(), v.strip().encode()) for n, _, v in (line.partition(":") for line in case.upstream)]
    vars = RequestVars.of(
        http_host=b"clone.test:%d" % served.port, secure=False, local_host="127.0.0.1", local_port=served.port,
        proxy_host=f"127.0.0.1:{served.origin}", remote_host="127.0.0.1", method=b"GET", uri=path.encode(),
        protocol=b"HTTP/1.1", headers={b"user-agent": [b"UA/1"]},
    )
    ours = build(case.directives.encode()).edits.respond(upstream, case.status, vars, False)
    assert ours == theirs


#: Directive sets both refuse; True where the module claims nginx's wording.
LOAD_REFUSED = [
    ("add_header X;", True),
    ("add_header X a always b;", True),
    ("add_header X a b;", True),
    ("add_header X a ALWAYS;", True),
    ("proxy_hide_header;", True),
    ("proxy_hide_header a b;", True),
    ("proxy_set_header X;", True),
    ("proxy_set_header X a b;", True),
    ("add_header X $foo;", True),
    ("add_header X $request_ur;", True),
    ("proxy_set_header X ${host;", True),
    ("proxy_set_header X $;", True),
]

LOAD_ACCEPTED = [
    "add_header X $host always;",
    "add_header X '';",
    "add_header X-Y $HTTP_X_SOMETHING;",
    "proxy_hide_header X-Powered-By;",
    "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
    "proxy_set_header X '';",
    "proxy_set_header Host $host; proxy_set_header X-Real-IP $remote_addr;",
    "add_header A '$scheme$https$server_port$server_addr$remote_port$request_method$args$is_args$query_string';",
    "add_header B '${server_protocol}${proxy_host}${request_uri}';",
]

#: nginx loads these; the module refuses them on purpose (prexy.headeredits' docstring).
LOAD_DEVIATIONS = [
    ("add_header Content-Length 5;", "Prexy frames the message"),
    ("add_header Transfer-Encoding x;", "Prexy frames the message"),
    ("proxy_hide_header Content-Type;", None),
    ("proxy_set_header Connection upgrade;", "hop-by-hop: the site's upgrade setting does WebSockets"),
    ("proxy_set_header Upgrade $http_upgrade;", "hop-by-hop: the site's upgrade setting does WebSockets"),
    ("proxy_set_header Expect 100-continue;", "Prexy handles Expect"),
    ("proxy_hide_header Via;", "Prexy's own header"),
    ("proxy_set_header Host '';", "an HTTP/1.1 request has a Host"),
    ("proxy_set_header Host a; proxy_set_header Host b;", "one Host"),
    ("add_header X $1;", "no location regexes"),
    ("add_header X $uri;", "no normalised URI here"),
    ("add_header X $server_name;", "no server_name here"),
    ("add_header 'X Y' a;", "not a header name"),
    ("add_header X 'a\\nb';", "a value with a line break"),
]


@pytest.mark.parametrize(("directives", "wording"), LOAD_REFUSED, ids=[d for d, _ in LOAD_REFUSED])
def test_refuses_what_nginx_refuses(tmp_path: Path, directives: str, wording: bool) -> None:
    check_refused(tmp_path, directives, wording)


@pytest.mark.parametrize("directives", LOAD_ACCEPTED)
def test_loads_what_nginx_loads(tmp_path: Path, directives: str) -> None:
    check_loads(tmp_path, directives)


@pytest.mark.parametrize(("directives", "why"), LOAD_DEVIATIONS, ids=[d for d, _ in LOAD_DEVIATIONS])
def test_documented_load_deviations(tmp_path: Path, directives: str, why: str | None) -> None:
    check_deviation(tmp_path, directives, why)
