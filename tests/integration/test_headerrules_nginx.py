"""Differential test of :mod:`prexy.headerrules` against a real nginx.

One nginx (http and https) proxies to a tiny origin that answers with the response headers
the request asks for (base64 in ``X-Resp``); every case is one ``location``
with its own ``proxy_redirect`` / ``proxy_cookie_*`` directives.  The
``Location``, ``Refresh`` and ``Set-Cookie`` headers nginx sends must be the
ones :meth:`HeaderRules.apply` computes from the same directives and the
equivalent :class:`RequestVars` (nginx's own port as ``server_port``).  nginx
puts the absolute Location before every other header and Prexy keeps it in
place, so Locations compare as sorted lists.

The load tests run ``nginx -t`` on directive sets: what nginx refuses the
builder refuses, with nginx's wording where the module claims it, and what
nginx loads the builder loads, except the deviations listed (with reasons)
in ``LOAD_DEVIATIONS`` and the module docstring.

nginx comes from ``$PREXY_NGINX``, ``nginx`` on ``$PATH`` or
``/usr/sbin/nginx``; the tests are skipped without one.
"""

from __future__ import annotations

import base64
import datetime
import os
import random
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
import pytest_twisted

from prexy.headerrules import HeaderRules, HeaderRulesBuilder, RequestVars
from prexy.substitution.rules import RulesError, Token, tokenize

from .twistd_support import free_port, listening

HOST = "Example.COM:8080"
COMPARED = (b"location", b"refresh", b"set-cookie")


@attrs.frozen
class Case:
    name: str
    directives: str
    headers: tuple[str, ...]
    host: str | None = HOST  # None: HTTP/1.0 without Host
    tls: bool = False  # through nginx's https server


LOC = "Location: http://@origin@/a/b?c#f"
REFRESH = "Refresh: 5; URL=http://@origin@/a/r"
COOKIES = (
    "Set-Cookie: a=1; Domain=origin.com; Path=/app/x",
    "Set-Cookie: b=2;domain=.ORIGIN.com ;  path = /app/ ;secure",
    "Set-Cookie: c=3; Domain=sub.origin.com; Path=/APP",
    "Set-Cookie: d; Domain=origin.com; Path=/app/",
    "Set-Cookie:  e = 5 ;; Domain=origin.com;Path=/app/;",
    "Set-Cookie: f=6",
    "Set-Cookie: g=7; Domain=; Path=",
    "Set-Cookie: h=8; Domain=.; Path",
    "Set-Cookie: =9; DOMAIN=Origin.Com; PATH=/app/",
    "Set-Cookie: i=10; Domain=origin.com\t; Path=/app/\t",
    "Set-Cookie: j=11; Domain=origin.comx; Path=/appx",
    "Set-Cookie: k=1=2; x=a=b; Domain = origin.com ;",
    "Set-Cookie: Domain=origin.com; Path=/app/; HttpOnly",
    "Set-Cookie: l=12; Expires=Wed, 21 Oct 2026 07:28:00 GMT; Path=/app/; SameSite=Lax",
    "Set-Cookie: m=13; Domain=.origin.com; Domain=origin.com; Path=/app/; path=/app/y",
)

CASES = [
    Case("no directives", "", (LOC, REFRESH, "Location: /rel")),
    Case("default", "proxy_redirect default;", (LOC, REFRESH)),
    Case("off", "proxy_redirect off;", (LOC, REFRESH, "Location: /rel")),
    Case("default is literal with two args", "proxy_redirect default /zz/;", (LOC, "Location: default/x")),
    Case("string to absolute", "proxy_redirect http://@origin@/a/ https://new.example/;", (LOC, REFRESH)),
    Case("string is case-sensitive", "proxy_redirect http://@origin@/A/ /z/;", (LOC,)),
    Case("first match wins", "proxy_redirect http://@origin@/a/ /one/; proxy_redirect http://@origin@/ /two/;", (LOC,)),
    Case("explicit rules replace the default", "proxy_redirect http://other/ /;", (LOC,)),
    Case("default among others", "proxy_redirect http://other/ /; proxy_redirect default;", (LOC, "Location: http://other/x")),
    Case("host in FROM", "proxy_redirect http://$host/ /h/;", ("Location: http://example.com/x", "Location: http://Example.COM/y")),
    Case("variables in TO", "proxy_redirect http://@origin@/ $scheme://${host}:$server_port/$proxy_host/$http_host/;", (LOC,)),
    Case("HOST is host", "proxy_redirect http://@origin@/ http://$HOST/;", (LOC,)),
    Case("regex captures", "proxy_redirect ~^http://([^/]+)/(.*)$ https://$1/x/$2;", (LOC, REFRESH)),
    Case("regex caseless named", "proxy_redirect ~*^HTTP://(?<h>[^/]+)/ /n/$h;", (LOC, REFRESH)),
    Case("regex is case-sensitive", "proxy_redirect ~^HTTP:// /no/;", (LOC,)),
    Case("regex no match falls through", "proxy_redirect ~^ftp: /ftp/; proxy_redirect http://@origin@/ /s/;", (LOC,)),
    Case("dollar ten", "proxy_redirect ~^/(.*) /$1$10;", ("Location: /foo",)),
    Case("unset groups", "proxy_redirect ~(a)|(b) [$1][$2][$3];", ("Location: /b", "Location: /a", "Location: /zzz")),
    Case("stale captures", "proxy_redirect ~^/f(o)o /1:$1; proxy_redirect / /2:$1;", ("Location: /bar", "Location: /foo", "Location: /bar", "Refresh: 0;url=/x")),
    Case("groupless regex keeps captures", "proxy_redirect ~^/f(o)o /1:$1; proxy_redirect ~bar /2:$1;", ("Location: /foo", "Location: /bar")),
    Case("named capture elsewhere", "proxy_redirect ~^/(?<seg>[a-z]+) /n/$seg; proxy_cookie_path / /$seg/;", ("Location: /abc", "Set-Cookie: a=1; Path=/p")),
    Case("relative rewritten becomes absolute", "proxy_redirect / /rel/;", ("Location: /foo",)),
    Case("two rewritten: the last is absolute", "proxy_redirect / /rel/;", ("Location: /foo", "Location: /bar")),
    Case("first rewritten, second not", "proxy_redirect /a /b;", ("Location: /a1", "Location: /c1")),
    Case("unrewritten relative stays", "proxy_redirect http://@origin@/ /;", ("Location: /foo", "Location: foo")),
    Case("rewritten to non-slash", "proxy_redirect / x/;", ("Location: /foo",)),
    Case("empty FROM", "proxy_redirect '' pre;", ("Location: /foo", "Refresh: 3; uRl= /e")),
    Case("empty regex", "proxy_redirect ~ /all;", ("Location: anything", "Refresh: 1")),
    Case("double slash", "proxy_redirect http://@origin@/ //;", (LOC,)),
    Case("refresh forms", "proxy_redirect / /rel/;", ("Refresh: 0;url=/a", "Refresh: 0; curl=/b; url=/c", "Refresh: /d", "Refresh: 3; uRl= /e", "Refresh: 1; URL=/f")),
    Case("refresh regex tail", "proxy_redirect ~^/(.*) http://$http_host/$1$10;", ("Refresh: 0; curl=/b; url=/c",)),
    Case("no Host header", "proxy_redirect http://@origin@/ /;", (LOC,), host=None),
    Case("other headers untouched", "proxy_redirect ~ /x; proxy_cookie_path ~ /y;", ("X-Location: /a", "Link: </a>", "Set-Cookie2: a=1; Path=/")),
    Case("domain string with variable", "proxy_cookie_domain origin.com www.$host;", COOKIES),
    Case("domain dots stripped", "proxy_cookie_domain .origin.com .new.org;", COOKIES),
    Case("domain caseless", "proxy_cookie_domain ORIGIN.com new.org;", COOKIES),
    Case("domain regex", "proxy_cookie_domain ~^(.*)\\.origin\\.com$ $1.new.org;", COOKIES),
    Case("domain regex is caseless, eats the dot", "proxy_cookie_domain ~ORIGIN ~X;", COOKIES),
    Case("domain empty pattern", "proxy_cookie_domain . EMPTY;", COOKIES),
    Case("domain first match wins", "proxy_cookie_domain sub.origin.com s.new; proxy_cookie_domain ~origin any.new;", COOKIES),
    Case("path prefix", "proxy_cookie_path /app/ /;", COOKIES),
    Case("path regex caseless", "proxy_cookie_path ~*^/APP(/.*)?$ /x$1;", COOKIES),
    Case("path regex", "proxy_cookie_path ~^/app /y;", COOKIES),
    Case("path empty prefix", "proxy_cookie_path '' /pre;", COOKIES),
    Case("path with variable", "proxy_cookie_path /$scheme/ /s/;", ("Set-Cookie: a=1; Path=/http/x", "Set-Cookie: b=1; Path=/https/x")),
    Case("domain and path", "proxy_cookie_domain origin.com new.org; proxy_cookie_path /app/ /b/;", COOKIES),
    Case("cookie off, redirect on", "proxy_cookie_domain off; proxy_cookie_path off;", COOKIES + (LOC,)),
    Case("cookie captures feed redirect", "proxy_cookie_path ~^/(a)pp /; proxy_redirect / /$1/;", ("Set-Cookie: a=1; Path=/app", "Location: /x")),
    Case("header names caseless", "proxy_redirect / /r/; proxy_cookie_path / /p/;", ("LOCATION: /x", "refresh: 1; url=/y", "set-COOKIE: a=1; path=/z")),
    Case("empty values", "proxy_redirect ~^$ /empty; proxy_cookie_path ~^$ /e;", ("Location: ", "Refresh: 0; url=", "Set-Cookie: a=1; Path=")),
    Case("domain capture into path", "proxy_cookie_domain ~^(?<sub>[a-z]+)\\. $sub.new; proxy_cookie_path / /$sub$1/;", ("Set-Cookie: a=1; Domain=www.origin.com; Path=/x",)),
    Case("several refresh", "proxy_redirect http://@origin@/ /;", (REFRESH, REFRESH.replace("URL", "url"), "Refresh: 5")),
    Case("https default", "", (LOC, "Location: /rel"), tls=True),
    Case("https scheme variable", "proxy_redirect / $scheme://$host:$server_port/s/;", ("Location: /a",), tls=True),
    Case("https relative", "proxy_redirect / /r/;", ("Location: /a", "Refresh: 1; url=/b"), tls=True),
    Case("cookie without attributes", "proxy_cookie_path ~ /y; proxy_cookie_domain ~ y;", ("Set-Cookie: a=1", "Set-Cookie: b", "Set-Cookie: c=;", "Set-Cookie: ;")),
]


def find_nginx() -> str | None:
    for candidate in (os.environ.get("PREXY_NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Origin:
    """Answers every request with the header lines in its ``X-Resp``."""

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
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                lines = [line for line in data.split(b"\r\n") if line.lower().startswith(b"x-resp:")]
                extra = base64.b64decode(lines[0].split(b":", 1)[1].strip()) if lines else b""
                conn.sendall(b"HTTP/1.1 302 Found\r\n" + extra + b"Content-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def nginx_conf(d: Path, port: int, body: str, tls_port: int | None = None) -> Path:
    conf = d / "nginx.conf"
    tls = ""
    if tls_port is not None:
        self_signed(d)
        tls = (f"  server {{ listen 127.0.0.1:{tls_port} ssl; server_name 127.0.0.1;\n"
               f"    ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem;\n{body}  }}\n")
    conf.write_text(
        f"daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n"
        f"error_log {d}/error.log info;\nevents {{ worker_connections 64; }}\n"
        f"http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d};\n"
        f"  fastcgi_temp_path {d}; uwsgi_temp_path {d}; scgi_temp_path {d};\n"
        f"  server {{ listen 127.0.0.1:{port}; server_name 127.0.0.1;\n{body}  }}\n{tls}}}\n"
    )
    return conf


def self_signed(d: Path) -> None:
    """cert.pem and key.pem in ``d``: a throw-away self-signed certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2)).sign(key, hashes.SHA256())
    )
    (d / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (d / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


@attrs.frozen
class Served:
    port: int
    tls_port: int
    origin: int


@pytest.fixture(scope="module")
def nginx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    binary = find_nginx()
    if binary is None:
        pytest.skip("no nginx binary")
    origin = Origin()
    port, tls_port = free_port(), free_port()
    up = f"127.0.0.1:{origin.port}"
    body = "".join(
        f"    location /c{i}/ {{ proxy_pass http://{up}; {c.directives.replace('@origin@', up)} }}\n"
        for i, c in enumerate(CASES)
    )
    body += f"    location /fuzz/ {{ proxy_pass http://{up}; {FUZZ_DIRECTIVES} }}\n"
    conf = nginx_conf(tmp_path_factory.mktemp("nginx"), port, body, tls_port)
    process = subprocess.Popen([binary, "-p", str(conf.parent), "-c", str(conf)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        try:
            pytest_twisted.blockon(listening(port))  # nginx gives no readiness notice
        except Exception:
            process.kill()
            raise RuntimeError(f"nginx did not start: {process.stderr.read() if process.stderr else ''!r}") from None
        yield Served(port, tls_port, origin.port)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        origin.close()


def fetch(port: int, path: str, host: str | None, wanted: bytes, tls: bool = False) -> list[tuple[bytes, bytes]]:
    head = f"GET {path} HTTP/1.1\r\nHost: {host}\r\n" if host is not None else f"GET {path} HTTP/1.0\r\n"
    request = head.encode() + b"X-Resp: " + base64.b64encode(wanted) + b"\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        s = raw
        if tls:
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            s = context.wrap_socket(raw)
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    lines = data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
    return [(n, v) for n, _, v in (line.partition(b": ") for line in lines)]


def build(directives: bytes) -> HeaderRules:
    builder = HeaderRulesBuilder()

    def fail(tok: Token, reason: str) -> RulesError:
        return RulesError("<t>", tok.line, tok.column, tok.value.decode("latin-1"), reason)

    for tokens in tokenize(directives, "<t>"):
        assert builder.directive(tokens[0], tokens[1:], fail)
    return builder.build()


def compared(headers: list[tuple[bytes, bytes]]) -> dict[bytes, list[bytes]]:
    out: dict[bytes, list[bytes]] = {name: [] for name in COMPARED}
    for name, value in headers:
        if name.lower() in out:
            out[name.lower()].append(value)
    out[b"location"].sort()
    return out


@pytest.mark.parametrize("index", range(len(CASES)), ids=[c.name for c in CASES])
def test_same_headers_as_nginx(nginx: Served, index: int) -> None:
    """Each case: nginx's rewritten headers are those apply() computes."""
    case = CASES[index]
    up = f"127.0.0.1:{nginx.origin}"
    lines = [h.replace("@origin@", up) for h in case.headers]
    wanted = "".join(line + "\r\n" for line in lines).encode()
    port = nginx.tls_port if case.tls else nginx.port
    theirs = fetch(port, f"/c{index}/x", case.host, wanted, case.tls)
    sent = [(n.strip().encode(), v.strip(" ").encode()) for n, _, v in (h.partition(":") for h in lines)]
    rules = build(case.directives.replace("@origin@", up).encode()).bind(f"http://{up}/".encode())
    host = (case.host or "127.0.0.1").rsplit(":", 1)[0].lower().encode()
    http_host = (case.host or "").encode()
    scheme = b"https" if case.tls else b"http"
    ours = rules.apply(sent, RequestVars(scheme, host, http_host, port, up.encode()))
    mine, nginxs = compared(ours), compared(theirs)
    diff = [(name, a, b) for name in COMPARED for a, b in zip(mine[name], nginxs[name], strict=False) if a != b]
    assert mine == nginxs, diff or (mine, nginxs)


FUZZ_DIRECTIVES = "proxy_cookie_domain .x. y; proxy_cookie_domain ~^a(.)? d$1; proxy_cookie_path / /p/;"
FUZZ_FIRST = ["a=1", "a", "=", " a = b ", "", "Domain=x.", "a=b=c"]
FUZZ_ATTRS = ["Domain=x.", " domain = .X. ", "Domain=a", "DOMAIN=ab", "domain=.a.", "Path=/", "path = /q ",
              "Path", "", " ", "x=y", "Domain=", "Path=a/", "Path=", "Domain=.", "Secure", "p=/", "Domain\t=a"]


def test_random_cookies_as_nginx(nginx: Served) -> None:
    """300 seeded random Set-Cookie values: nginx's output is apply()'s."""
    rng = random.Random(1722)
    values = []
    for _ in range(300):
        parts = [rng.choice(FUZZ_FIRST)] + [rng.choice(FUZZ_ATTRS) for _ in range(rng.randrange(0, 6))]
        value = rng.choice([";", "; ", " ;"]).join(parts) + rng.choice(["", "", ";", "; ;"])
        # nginx trims spaces around a header value, so the value it rewrites has none there.
        values.append(value.strip(" "))
    rules = build(FUZZ_DIRECTIVES.encode())
    vars = RequestVars(b"http", b"example.com", HOST.encode(), nginx.port, b"o")
    for start in range(0, len(values), 50):
        batch = values[start : start + 50]
        wanted = "".join(f"Set-Cookie: {v}\r\n" for v in batch).encode()
        theirs = [v for n, v in fetch(nginx.port, "/fuzz/x", HOST, wanted) if n == b"Set-Cookie"]
        ours = [v for _, v in rules.apply([(b"Set-Cookie", v.encode()) for v in batch], vars)]
        assert [(a, b) for a, b in zip(ours, theirs, strict=True) if a != b] == []


#: Directive sets both refuse; True where the module claims nginx's wording.
LOAD_REFUSED = [
    ("proxy_redirect;", True),
    ("proxy_redirect a b c;", True),
    ("proxy_redirect x;", True),
    ("proxy_redirect OFF;", True),
    ("proxy_redirect off; proxy_redirect off;", True),
    ("proxy_redirect off; proxy_redirect a b;", True),
    ("proxy_redirect a b; proxy_redirect off;", True),
    ("proxy_redirect default; proxy_redirect off;", True),
    ("proxy_redirect off; proxy_redirect default;", True),
    ("proxy_redirect ~(a b;", False),
    ("proxy_redirect ~*[ b;", False),
    ("proxy_redirect a $foo;", True),
    ("proxy_redirect $Foo b;", True),
    ("proxy_redirect a $;", True),
    ("proxy_redirect a ${host;", True),
    ("proxy_redirect a ${};", True),
    ("proxy_redirect a $0;", True),
    ("proxy_redirect a $-;", True),
    ("proxy_redirect a ${-};", True),
    ("proxy_redirect a ${ho-st};", True),
    ("proxy_redirect a x${;", True),
    ("proxy_cookie_path /$ b;", True),
    ("proxy_redirect ~a $h;", True),
    ("proxy_redirect ~(?<host>a) x;", True),
    ("proxy_redirect ~(?<a>x)(?<a>y) x;", False),
    ("proxy_redirect ~(?<1a>a) x;", False),
    ("proxy_redirect ~(?<abcdefghijabcdefghijabcdefghijabc>a) x;", False),
    ("proxy_cookie_domain;", True),
    ("proxy_cookie_domain x;", True),
    ("proxy_cookie_domain a b c;", True),
    ("proxy_cookie_domain off; proxy_cookie_domain off;", True),
    ("proxy_cookie_domain a b; proxy_cookie_domain off;", True),
    ("proxy_cookie_domain off; proxy_cookie_domain a b;", True),
    ("proxy_cookie_domain ~*a b;", False),
    ("proxy_cookie_path x;", True),
    ("proxy_cookie_path default;", True),
    ("proxy_cookie_path off; proxy_cookie_path a b;", True),
    ("proxy_cookie_path ~**a b;", False),
]

LOAD_ACCEPTED = [
    "proxy_redirect ~ x;",
    "proxy_redirect ~* x;",
    "proxy_cookie_path ~ x;",
    "proxy_cookie_domain ~ x;",
    "proxy_redirect a $HOST;",
    "proxy_redirect ~(?P<n>a) $n;",
    "proxy_redirect ~(?'q'a) $Q;",
    "proxy_redirect ~(?<Foo>a) $foo;",
    "proxy_redirect ~(?<h>a) $h; proxy_cookie_path / /$h;",
    "proxy_cookie_path / /$h2; proxy_redirect ~(?<h2>a) $h2;",
    "proxy_redirect ~\\Qa(\\E x;",
    "proxy_redirect ~a(?#c(d) x;",
    "proxy_redirect ~[]a(] x;",
    "proxy_redirect ~[[:alpha:]]+ x;",
    "proxy_redirect default x;",
    "proxy_redirect a ${host}x$1${http_host}$9;",
]

#: nginx loads these; the module refuses them on purpose (see its docstring).
LOAD_DEVIATIONS = [
    ("proxy_redirect a $uri;", "no such value in a header rule"),
    ("proxy_redirect a $http_x_foo;", "no such value in a header rule"),
    ("proxy_redirect ~(?<proxy_host>a) x;", "a capture shadowing $proxy_host is refused"),
]


def nginx_loads(tmp_path: Path, directives: str) -> tuple[bool, str]:
    binary = find_nginx()
    if binary is None:
        pytest.skip("no nginx binary")
    body = f"    location / {{ proxy_pass http://127.0.0.1:9; {directives} }}\n"
    conf = nginx_conf(tmp_path, free_port(), body)
    done = subprocess.run([binary, "-t", "-p", str(tmp_path), "-c", str(conf)], capture_output=True, timeout=30)
    return done.returncode == 0, done.stderr.decode("latin-1")


def our_error(directives: str) -> str | None:
    try:
        build(directives.encode())
    except RulesError as exc:
        return exc.reason
    return None


def check_refused(tmp_path: Path, directives: str, wording: bool) -> None:
    """nginx refuses ``directives``, so does the builder (in the same words
    where ``wording``)."""
    ok, stderr = nginx_loads(tmp_path, directives)
    assert not ok
    reason = our_error(directives)
    assert reason is not None
    if wording:
        assert reason in stderr, (reason, stderr)


def check_loads(tmp_path: Path, directives: str) -> None:
    """nginx loads ``directives``, so does the builder."""
    ok, stderr = nginx_loads(tmp_path, directives)
    assert ok, stderr
    assert our_error(directives) is None


def check_deviation(tmp_path: Path, directives: str, why: str | None) -> None:
    """nginx loads ``directives`` and the builder refuses them, as
    documented (``why`` None: both load them)."""
    ok, stderr = nginx_loads(tmp_path, directives)
    assert ok, stderr
    if why is None:
        assert our_error(directives) is None
    else:
        assert our_error(directives) is not None, why


@pytest.mark.parametrize(("directives", "wording"), LOAD_REFUSED, ids=[d for d, _ in LOAD_REFUSED])
def test_refuses_what_nginx_refuses(tmp_path: Path, directives: str, wording: bool) -> None:
    check_refused(tmp_path, directives, wording)


@pytest.mark.parametrize("directives", LOAD_ACCEPTED)
def test_loads_what_nginx_loads(tmp_path: Path, directives: str) -> None:
    check_loads(tmp_path, directives)


@pytest.mark.parametrize(("directives", "why"), LOAD_DEVIATIONS, ids=[d for d, _ in LOAD_DEVIATIONS])
def test_documented_load_deviations(tmp_path: Path, directives: str, why: str) -> None:
    check_deviation(tmp_path, directives, why)
