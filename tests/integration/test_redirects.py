"""The clone's own redirects and cookies through ``twistd prexy``, side by
side with Debian's nginx carrying the same directives.

The origin answers on another name than the clone's (``localhost`` and its
port, while clients ask for ``clone.test``) with the redirect and login
cookie headers each request asks for.  Prexy reads ``proxy_redirect``,
``proxy_cookie_domain`` and ``proxy_cookie_path`` from the site's rules file,
nginx from its ``location``; both forward with the upstream's own Host
(Prexy ``host_header = "upstream"``, nginx's default).  One nginx
server and one twistd per directive set, each proxying ``/``.  ``Location``,
``Refresh`` and ``Set-Cookie`` must come out the same from both (each
proxy's own port written as PORT).  Then a login: the cookie the clone
hands out goes back through Prexy to the origin.

nginx comes from ``$PREXY_NGINX``, ``nginx`` on ``$PATH`` or
``/usr/sbin/nginx`` (``.ci/run`` installs Debian's); the comparison is
skipped only without one.
"""

from __future__ import annotations

import base64
import os
import subprocess
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, threads

from .conftest import Cleanups
from .test_headerrules_nginx import Origin, find_nginx
from .twistd_support import Twistd, free_port, free_ports, listening, scratch_dir, stop_process

#: name -> directives (the same text in nginx's location and Prexy's rules file)
DIRECTIVES = {
    "default": "",
    "off": "proxy_redirect off;",
    "string": "proxy_redirect http://localhost:@port@/account/ /my/;",
    "regex": "proxy_redirect ~^https?://localhost(:\\d+)?/(.*)$ http://$host/$2;",
    "cookies": "proxy_cookie_domain localhost $host; proxy_cookie_path /app/ /;",
    "cookie regex": "proxy_cookie_domain ~^(.*)localhost$ $1clone.test; proxy_cookie_path ~*^/APP(.*) /c$1;",
    "everything": (
        "proxy_redirect default; proxy_redirect https://localhost/ https://$host/;"
        " proxy_cookie_domain .localhost .$host; proxy_cookie_path / /shop/;"
    ),
}

#: What the origin answers with (``@port@``: its port).
RESPONSES = [
    b"Location: http://localhost:@port@/login?next=%2Fcart\r\n",
    b"Location: http://localhost:@port@/account/orders\r\n",
    b"Location: https://localhost/secure\r\n",
    b"Location: /relative/path\r\n",
    b"Location: http://elsewhere.example/x\r\n",
    b"Refresh: 0; url=http://localhost:@port@/next\r\n",
    b"Set-Cookie: sid=abc123; Domain=localhost; Path=/app/; HttpOnly\r\n"
    b"Set-Cookie: pref=1; domain=.LOCALHOST; path=/APP/settings; Secure\r\n"
    b"Set-Cookie: plain=2\r\n",
    b"Location: http://localhost:@port@/\r\nSet-Cookie: a=1;Domain=localhost;Path=/app/x\r\n",
]

COMPARED = (b"location", b"refresh", b"set-cookie")


def fetch(port: int, path: str, wanted: bytes, origin_port: int) -> dict[bytes, list[bytes]]:
    """The compared headers of one answer, the proxy's port as PORT."""
    import socket

    request = (
        f"GET {path} HTTP/1.1\r\nHost: clone.test:{port}\r\nConnection: close\r\n".encode()
        + b"X-Resp: " + base64.b64encode(wanted) + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    out: dict[bytes, list[bytes]] = {name: [] for name in COMPARED}
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b": ")
        if name.lower() in out:
            out[name.lower()].append(value.replace(b"%d" % port, b"PORT"))
    out[b"location"].sort()  # nginx moves the absolute Location first
    return out


class Nginx:
    """nginx with one server (port) per directive set, each proxying ``/``."""

    def __init__(self, binary: str, origin_port: int) -> None:
        self.dir = scratch_dir("prexy-redirect-nginx-")
        self.ports = free_ports(len(DIRECTIVES))
        d = self.dir
        servers = "".join(
            f"  server {{ listen 127.0.0.1:{port}; server_name _;\n"
            f"    location / {{ proxy_pass http://localhost:{origin_port}; "
            f"{text.replace('@port@', str(origin_port))} }} }}\n"
            for port, text in zip(self.ports, DIRECTIVES.values(), strict=True)
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
def twistd_for(cleanup: Cleanups, origin_port: int, directives: str) -> Any:
    d = scratch_dir("prexy-redirect-")
    rules = os.path.join(d, "site.rules")
    with open(rules, "w") as f:
        f.write(directives.replace("@port@", str(origin_port)) + "\n")
    port = free_port()
    config = os.path.join(d, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\nworkers = 1\naccess_log = "off"\n'
            f'[sites.clone]\nupstream = "http://localhost:{origin_port}"\nhost_header = "upstream"\n'
            f'rules = ["{rules}"]\n'
        )
    child = Twistd("--config", config)
    cleanup(child.stop)
    yield child.ready()
    return port


@pytest_twisted.inlineCallbacks
def test_same_redirects_and_cookies_as_nginx(cleanup: Cleanups, origin: Any) -> Any:
    """Every directive set on every origin answer: the same Location,
    Refresh and Set-Cookie through Prexy as through nginx."""
    binary = find_nginx()
    if binary is None:
        pytest.skip("no nginx binary")
    nginx = Nginx(binary, origin.port)
    cleanup(nginx.stop)
    yield listening(nginx.ports[-1])
    mismatches = []
    compared = rewritten = 0
    for nginx_port, (name, directives) in zip(nginx.ports, DIRECTIVES.items(), strict=True):
        port = yield twistd_for(cleanup, origin.port, directives)
        for response in RESPONSES:
            wanted = response.replace(b"@port@", b"%d" % origin.port)
            theirs = yield threads.deferToThread(fetch, nginx_port, "/page", wanted, origin.port)
            ours = yield threads.deferToThread(fetch, port, "/page", wanted, origin.port)
            compared += 1
            original = [line.split(b": ", 1)[1] for line in wanted.split(b"\r\n") if line]
            rewritten += sum(1 for values in ours.values() for v in values if v not in original)
            if ours != theirs:
                mismatches.append(f"{name} / {wanted!r}:\n  nginx {theirs}\n  prexy {ours}")
    assert not mismatches, "\n".join(mismatches)
    assert compared == len(DIRECTIVES) * len(RESPONSES)
    assert rewritten >= 30, rewritten  # the directives really changed headers


@pytest_twisted.inlineCallbacks
def test_login_on_the_clone(cleanup: Cleanups, origin: Any) -> Any:
    """The origin's login redirect and session cookie, both on its own
    name, work on the clone's: the redirect stays on clone.test and the
    cookie's Domain is the clone's, which a browser would send back."""
    port = yield twistd_for(cleanup, origin.port, "proxy_cookie_domain localhost $host;")
    wanted = (b"Location: http://localhost:%d/account\r\nSet-Cookie: sid=s3cr3t; Domain=localhost; Path=/\r\n"
              % origin.port)
    got = yield threads.deferToThread(fetch, port, "/login", wanted, origin.port)
    assert got[b"location"] == [b"http://clone.test:PORT/account"]
    assert got[b"set-cookie"] == [b"sid=s3cr3t; Domain=clone.test; Path=/"]
