"""Differential test against the real nginx: the same map files, the same keys, the
same answers, and the same files accepted or refused.

nginx serves each map's value for the key sent in an ``X-Key`` header (over a
unix socket, one keep-alive connection); Prexy loads the same files.  The
maps are a curated set of PCRE features plus seeded random maps mixing exact
keys, hostname masks and regexes.  Skipped when no nginx binary is found
(``$PREXY_NGINX``, else ``nginx`` on ``$PATH`` or ``/usr/sbin/nginx``).
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

from twisted.trial.unittest import SkipTest, SynchronousTestCase

from prexy.urlmap import MapError, UrlMap, load_map
from tests.cases import expand, parametrize


def _find_nginx() -> str | None:
    """The nginx binary to compare with, if any."""
    for candidate in (os.environ.get("PREXY_NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


NGINX = _find_nginx()

# PCRE features, each with keys to try; "$1" and "$n" show the captures
CURATED: list[tuple[str, list[str]]] = [
    (r"~(?U)(a+)", ["aaa"]), (r"~(?n)(a)(?<n>b)", ["ab"]), (r"~(?^)a", ["a", "A"]),
    (r"~*(?^)a", ["A", "a"]), (r"~(?<=ab|c)d", ["abd", "cd", "bd"]), (r"~(?x) ( a ) b # c", ["ab"]),
    (r"~(?i)x(?-i)y", ["Xy", "XY"]), (r"~^(a+)+$", ["aaaa"]), (r"~(a|ab)(c|bcd)(d*)", ["abcd"]),
    (r"~^(?:(a)|b)*$", ["ab", "ba"]), (r"~(a)?b", ["b", "ab"]), (r"~\bfoo\b", ["a foo", "afoo"]),
    (r"~(\W)", ["a-"]), (r"~(\s)", ["a\x0bb", "a\x0cb"]), (r"~(?s)a.b", ["a\tb"]), (r"~^\Qa*\E", ["a*"]),
    (r"~(?|(a)|(b))", ["b"]), (r"~(\h)", ["a\xa0b"]), (r"~(\w)", ["\xe9a"]), (r"~*(\xe9)", ["\xc9", "\xe9"]),
    (r"~(\d+)(?=px)", ["12px", "12em"]), (r"~(?<=/)(\w+)$", ["/ab"]), (r"~(a)\g{-1}", ["aa"]),
    (r"~^/hello/world/(ab)\b(\?[^/]*)*/?$", ["/hello/world/ab", "/hello/world/ab?x=1/", "/hello/world/abc"]),
    (r"~*^/Legacy/(\d+)$", ["/LEGACY/12", "/legacy/x"]), (r"~(?<n>[a-z]+)-(\d)", ["ab-1"]),
    (r"~[[:punct:]]([[:alpha:]])", ["!x", "1x"]), (r"~a{2}(b{,2})", ["aab{,2}", "aabb"]),
    (r"~(\x41)", ["A"]), (r"~(\101)", ["A"]), (r"~([\d-])", ["-"]), (r"~(a\Z)", ["a"]),
]
ALPHABET = ["/", "a", "b", "A", "B", ".", "1", "c", "?", "x"]
REGEXES = [
    r"~^/a", r"~^/ab", r"~*^/AB", r"~a\.b", r"~^/a(b)", r"~(?<n>b+)a", r"~(?P<n>a)b$", r"~^/a[b-c]+$",
    r"~\bab", r"~(a|b)c", r'"~a{2}"', r"~^/(?i)a", r"~a(?=b)", r"~(?<!a)b", r"~\d", r"~^\w+$", r"~^/a\b",
    r"~\.$", r"~^.*/b", r"~*b(A)", r"~^[^/]", r"~x?a$", r"~^/a/?$", r"~^/ab(\?[^/]*)*/?$", r"~[[:digit:]]",
    r"~^(a|/a)b", r"~ab|^/b", r"~^/\Qa.b\E", r"~a\Z", r"~\x2e", r"~(?i:A)b", r"~^", r"~*", r"~$",
]
# regexes nginx (PCRE2 10.42) refuses or accepts; Prexy must agree
ACCEPTANCE = [
    "~^/(a", "~a)", "~[a", "~(?<n>a)(?<n>b)", '"~a{3,2}"', r"~\y", "~[z-a]", r"~[\d-z]", "~[:alpha:]",
    "~(?z)", "~a**", r"~\k<q>", "~(?<1>a)", r"~\c", "~(?#x", "~(a)\\2", r"~\g{0}", "~[[:nope:]]",
    r"~\o{8}", r"~\x{zz}", "~(?<=a+)b", r"~(?<=x(a|bc))d", "~(?<=a|bc)d", r"~[\w-]", "~[]a]", "~(?R)",
    "~(a)(?1)", "~(?(1)a|b)", r"~\Ga", r"~\Ka", "~(?U)a+", "~(?m)^a", "~(?n)(a)", "~(?^)a", r"~\8",
    r"~\101", r"~\e", r"~\cA", '"~a{99999}"', "~()", "~(?:)", r"~\p{Lu}", "~a++", "~(?>a)", "~(?-i)a",
    "~(?xx)a", r"~[\x{41}-\x{5a}]", r"~[\Q]\E]", r"~\E", "~(*NO_JIT)a", "~(*LIMIT_MATCH=5)a",
    '"~a{65535}"', '"~a{1,65536}"', "~(*FAIL)", "~(*PRUNE)a", "~(?s).", "~(?i-s)a",
]


def _curated_map(regex: str) -> str:
    value = "[$1][$n]" if "<n>" in regex else "[$1]"
    return f'"{regex}" "{value}";\n' if not regex.startswith('"') else f'{regex} "{value}";\n'


def _random_key(r: random.Random, size: int = 8) -> str:
    return "".join(r.choice(ALPHABET) for _ in range(r.randint(0, size)))


def _random_host(r: random.Random) -> str:
    return ".".join(r.choice(["a", "b", "ex", "www", "A"]) for _ in range(r.randint(1, 3)))


def _random_map(r: random.Random) -> tuple[str, bool, list[str]]:
    """A valid map (no duplicate keys) mixing every kind of entry; its exact keys."""
    hostnames = r.random() < 0.3
    lines = ["hostnames;"] if hostnames else []
    if r.random() < 0.7:
        lines.append(f"default d{r.randint(0, 9)};")
    names: set[str] = set()
    exact: list[str] = []
    for i in range(r.randint(1, 12)):
        value = r.choice([f"v{i}", f"v{i}:$1", f"v{i}:$1x"])
        roll = r.random()
        if roll < 0.45:
            key = r.choice(REGEXES)
            if ("<n>" in key) and r.random() < 0.5:
                value = f"v{i}:$n"
        elif hostnames and roll < 0.75:
            host = _random_host(r)
            form = r.choice(["*.", ".", ".*"])
            claim = ("tail:" if form == ".*" else "head:") + host.lower()
            if claim in names or (form == "." and host.lower() in names):
                continue
            names.add(claim)
            if form == ".":
                names.add(host.lower())
            key = host + ".*" if form == ".*" else form + host
        else:
            key = _random_host(r) if hostnames else _random_key(r, 6)
            if (
                not key or key.lower() in names or "head:" + key.lower() in names
                or key in ("default", "include", "hostnames", "volatile")
            ):
                continue
            names.add(key.lower())
            exact.append(key)
        lines.append(f"{key} {value};")
    return "\n".join(lines) + "\n", hostnames, exact


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP/1.1 over a unix socket (no TCP port to race for)."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=10)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(self.unix_path)
        self.sock = sock


def _conf(workdir: str, maps: list[str], listen: str) -> str:
    blocks = "\n".join(f"map $http_x_key $m{i} {{ include {workdir}/m{i}.map; }}" for i in range(len(maps)))
    locations = "\n".join(f'location = /m{i} {{ return 200 "[$m{i}]"; }}' for i in range(len(maps)))
    temp = " ".join(f"{d}_temp_path {workdir}/{d};" for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""daemon off; master_process off; worker_processes 1;
error_log {workdir}/error.log; pid {workdir}/nginx.pid;
events {{}}
http {{
  access_log off; default_type text/plain; keepalive_requests 1000000; {temp}
  map_hash_max_size 65536; map_hash_bucket_size 256;
  {blocks}
  server {{ listen {listen}; {locations} }}
}}
"""


def _nginx_test(workdir: str, maps: list[str]) -> subprocess.CompletedProcess[str]:
    assert NGINX is not None
    for i, text in enumerate(maps):
        with open(f"{workdir}/m{i}.map", "wb") as f:
            f.write(text.encode("latin-1"))
    with open(f"{workdir}/nginx.conf", "w", encoding="ascii") as f:
        f.write(_conf(workdir, maps, f"unix:{workdir}/s"))
    return subprocess.run(
        [NGINX, "-t", "-q", "-e", f"{workdir}/startup.log", "-p", workdir, "-c", f"{workdir}/nginx.conf"],
        capture_output=True, text=True, check=False,
    )


#: The one work directory of this module's tests, or why nginx cannot run.
_WORKDIR: dict[str, str] = {}


def workdir() -> str:
    """A short temporary directory for nginx's files and socket, made once for
    the module and removed at exit; skips the test when this nginx cannot even
    check a trivial configuration here."""
    if "skip" in _WORKDIR:
        raise SkipTest(_WORKDIR["skip"])
    if "path" not in _WORKDIR:
        path = tempfile.mkdtemp(prefix="prexy-ng-")  # short: unix socket paths are limited
        probe = _nginx_test(path, ["k v;\n"])
        if probe.returncode != 0:
            shutil.rmtree(path, ignore_errors=True)
            _WORKDIR["skip"] = f"nginx cannot run here: {probe.stderr.strip()[:200]}"
            raise SkipTest(_WORKDIR["skip"])
        _WORKDIR["path"] = path
        atexit.register(shutil.rmtree, path, ignore_errors=True)
    return _WORKDIR["path"]


@contextlib.contextmanager
def served(workdir: str) -> Iterator[tuple[list[str], Callable[[int, str], str]]]:
    """nginx serving the curated and random maps; yields the maps and an ask(i, key)."""
    assert NGINX is not None
    r = random.Random(20261130)
    maps = [_curated_map(regex) for regex, _keys in CURATED]
    maps += [_random_map(r)[0] for _ in range(60)]
    test = _nginx_test(workdir, maps)
    assert test.returncode == 0, test.stderr
    proc = subprocess.Popen(
        [NGINX, "-e", f"{workdir}/startup.log", "-p", workdir, "-c", f"{workdir}/nginx.conf"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(f"{workdir}/s"):
            assert time.monotonic() < deadline, "nginx did not start"
            try:
                proc.wait(timeout=0.02)  # returns at once if nginx died
            except subprocess.TimeoutExpired:
                continue
            raise AssertionError(f"nginx exited with {proc.returncode} before listening")
        conn = _UnixHTTPConnection(f"{workdir}/s")

        def ask(index: int, key: str) -> str:
            conn.putrequest("GET", f"/m{index}")
            conn.putheader("X-Key", key.encode("latin-1"))
            conn.endheaders()
            body = conn.getresponse().read().decode("latin-1")
            assert body[:1] == "[" and body[-1:] == "]", body
            return body[1:-1]

        yield maps, ask
        conn.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _load(workdir: str, index: int) -> UrlMap:
    return load_map(f"{workdir}/m{index}.map")


@expand
class NginxDifferentialTests(SynchronousTestCase):
    skip = None if NGINX is not None else "no nginx binary (set PREXY_NGINX)"

    def setUp(self) -> None:
        self.workdir = workdir()

    def serve(self) -> tuple[list[str], Callable[[int, str], str]]:
        """nginx serving the curated and random maps, stopped after the test."""
        context = served(self.workdir)
        value = context.__enter__()
        self.addCleanup(context.__exit__, None, None, None)
        return value

    def test_curated_pcre_features_match_nginx(self) -> None:
        """Each curated PCRE feature gives nginx's value (and captures) for its keys."""
        workdir = self.workdir
        _maps, ask = self.serve()
        for index, (regex, keys) in enumerate(CURATED):
            urlmap = _load(workdir, index)
            for key in keys:
                assert urlmap.lookup(key) == ask(index, key), (regex, key)

    def test_random_maps_match_nginx(self) -> None:
        """Seeded random maps (exact keys, hostname masks, regexes, defaults) answer
        every key exactly as nginx does."""
        workdir = self.workdir
        maps, ask = self.serve()
        r = random.Random(7)
        compared = 0
        for index in range(len(CURATED), len(maps)):
            text = maps[index]
            urlmap = _load(workdir, index)
            exact = [ln.split()[0] for ln in text.splitlines()[1:] if ln and not ln.startswith(("~", '"', "*", "."))]
            for _ in range(30):
                if "hostnames;" in text and r.random() < 0.5:
                    key = _random_host(r) + r.choice(["", ".", "..", ".x"])
                elif exact and r.random() < 0.3:
                    key = "".join(c.upper() if r.random() < 0.5 else c for c in r.choice(exact))
                else:
                    key = _random_key(r)
                assert urlmap.lookup(key) == ask(index, key), (text, key)
                compared += 1
        assert compared > 1000

    @parametrize("regex", ACCEPTANCE)
    def test_same_regexes_accepted(self, regex: str) -> None:
        """A map entry nginx refuses, Prexy refuses at load; one nginx takes, Prexy takes."""
        workdir = self.workdir
        text = f"{regex} v;\n"
        here = os.path.join(workdir, "accept")  # apart from the files nginx is serving
        os.makedirs(here, exist_ok=True)
        nginx_ok = _nginx_test(here, [text]).returncode == 0
        try:
            load_map(f"{here}/m0.map")
            prexy_ok = True
        except MapError:
            prexy_ok = False
        assert prexy_ok == nginx_ok, regex
