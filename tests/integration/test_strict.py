"""Black-box strictness through ``twistd prexy --workers 2``, side by side
with a real nginx in front of the same origin.

The same raw requests go to both.  Every request nginx refuses (a 4xx or
5xx and nothing sent to the origin) must be refused by Prexy with the same
class of status and nothing sent upstream.  Where Prexy is stricter than
nginx on purpose, the case is listed in ``STRICTER`` with the reason; any
other request nginx serves, Prexy must serve too.  Then the deadlines
(``client_header``, ``client_body``) and a seeded fuzzer: no traceback in
the log, an answer or a close for every connection, nothing malformed at
the origin, and a well-formed request still served afterwards.

nginx comes from ``$PREXY_NGINX``, ``nginx`` on ``$PATH`` or
``/usr/sbin/nginx`` (``.ci/run`` installs Debian's); the comparison is
skipped without it, the rest runs anyway.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import time
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.protocol import ClientFactory, Protocol

from prexy.config import Limits
from prexy.h1server import Request, RequestReader

from .conftest import Cleanups, OriginServer
from .twistd_support import Twistd, free_port, free_port_block, listening, scratch_dir, stop_process

H = b"Host: a\r\n"

#: name -> raw request (whole; bodies included)
CASES: dict[str, bytes] = {
    "plain": b"GET /hello HTTP/1.1\r\n" + H + b"\r\n",
    "http10 without Host": b"GET /hello HTTP/1.0\r\n\r\n",
    "absolute-form": b"GET http://a/hello HTTP/1.1\r\nHost: b\r\n\r\n",
    "leading CRLF": b"\r\nGET /hello HTTP/1.1\r\n" + H + b"\r\n",
    "chunked body": b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "length body": b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n\r\nabc",
    "GET with a body": b"GET /hello HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n\r\nabc",
    "30 KB head": b"GET /hello HTTP/1.1\r\n" + H + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(30)) + b"\r\n",
    "raw pipe in target": b"GET /hello?a|b HTTP/1.1\r\n" + H + b"\r\n",
    "underscore in a name": b"GET /hello HTTP/1.1\r\n" + H + b"X_A: b\r\n\r\n",
    "obs-fold hides TE": b"POST /echo HTTP/1.1\r\n" + H + b"X-A: b\r\n Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc",
    "obs-fold hides CL": b"POST /echo HTTP/1.1\r\n" + H + b"X-A: b\r\n Content-Length: 3\r\n\r\nabc",
    "obs-fold": b"GET /hello HTTP/1.1\r\n" + H + b"X-A: b\r\n c\r\n\r\n",
    "TE chunked, identity in two headers": b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "TE chunked, identity": b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked, identity\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "TE identity": b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: identity\r\nContent-Length: 3\r\n\r\nabc",
    "TE beside CL": b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "TE on HTTP/1.0": b"POST /echo HTTP/1.0\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "two equal lengths": b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    "signed length": b"POST /echo HTTP/1.1\r\n" + H + b"Content-Length: +3\r\n\r\nabc",
    "two Hosts": b"GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
    "two equal Hosts": b"GET /hello HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
    "no Host on 1.1": b"GET /hello HTTP/1.1\r\n\r\n",
    "empty Host": b"GET /hello HTTP/1.1\r\nHost: \r\n\r\n",
    "Host a, b": b"GET /hello HTTP/1.1\r\nHost: a, b\r\n\r\n",
    "Host with a slash": b"GET /hello HTTP/1.1\r\nHost: a/b\r\n\r\n",
    "Host with an empty label": b"GET /hello HTTP/1.1\r\nHost: a..b\r\n\r\n",
    "Host with a control byte": b"GET /hello HTTP/1.1\r\nHost: a\x01b\r\n\r\n",
    "absolute-form without Host": b"GET http://a/hello HTTP/1.1\r\n\r\n",
    "absolute-form, empty authority": b"GET http:///hello HTTP/1.1\r\n" + H + b"\r\n",
    "asterisk": b"GET * HTTP/1.1\r\n" + H + b"\r\n",
    "OPTIONS asterisk": b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n",
    "CONNECT": b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
    "no slash": b"GET hello HTTP/1.1\r\n" + H + b"\r\n",
    "DEL in target": b"GET /a\x7fb HTTP/1.1\r\n" + H + b"\r\n",
    "control byte in target": b"GET /a\x01b HTTP/1.1\r\n" + H + b"\r\n",
    "bad escape": b"GET /a%zz HTTP/1.1\r\n" + H + b"\r\n",
    "escaped NUL": b"GET /a%00 HTTP/1.1\r\n" + H + b"\r\n",
    "above the root": b"GET /../etc/passwd HTTP/1.1\r\n" + H + b"\r\n",
    "lower-case method": b"get /hello HTTP/1.1\r\n" + H + b"\r\n",
    "custom method": b"BAN /hello HTTP/1.1\r\n" + H + b"\r\n",
    "two spaces": b"GET  /hello HTTP/1.1\r\n" + H + b"\r\n",
    "bad method": b"G@T /hello HTTP/1.1\r\n" + H + b"\r\n",
    "HTTP/2.0": b"GET /hello HTTP/2.0\r\n" + H + b"\r\n",
    "lower-case version": b"GET /hello http/1.1\r\n" + H + b"\r\n",
    "TRACE": b"TRACE /hello HTTP/1.1\r\n" + H + b"\r\n",
    "space before colon": b"GET /hello HTTP/1.1\r\n" + H + b"X-A : b\r\n\r\n",
    "empty name": b"GET /hello HTTP/1.1\r\n" + H + b": b\r\n\r\n",
    "NUL in a value": b"GET /hello HTTP/1.1\r\n" + H + b"X-A: b\x00c\r\n\r\n",
    "bare CR": b"GET /hello HTTP/1.1\rHost: a\r\n\r\n",
    "70 KB request line": b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n" + H + b"\r\n",
    "9 KB request line": b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + H + b"\r\n",
    "40 KB header": b"GET /hello HTTP/1.1\r\n" + H + b"X-A: " + b"a" * 40000 + b"\r\n\r\n",
    "9 KB header": b"GET /hello HTTP/1.1\r\n" + H + b"X-A: " + b"a" * 9000 + b"\r\n\r\n",
    "70 KB head": b"GET /hello HTTP/1.1\r\n" + H + b"".join(b"X-%d: %s\r\n" % (i, b"a" * 1000) for i in range(70)) + b"\r\n",
    "100 header lines": b"GET /hello HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(99)) + b"\r\n",
    "Host and 1,000 more header lines":
        b"GET /hello HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(1000)) + b"\r\n",
    "0x chunk size": b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
}

#: Requests nginx serves and Prexy refuses on purpose, with the reason.
STRICTER: dict[str, tuple[bytes, str]] = {
    "non-ASCII target": (b"GET /\xc3\xa9 HTTP/1.1\r\n" + H + b"\r\n", "a request target is ASCII (RFC 9112 3.2)"),
    "fragment in target": (b"GET /a#b HTTP/1.1\r\n" + H + b"\r\n", "a fragment is never sent (RFC 9112 3.2)"),
    "HTTP/1.2": (b"GET /hello HTTP/1.2\r\n" + H + b"\r\n", "only 1.0 and 1.1 are spoken (505)"),
    "no colon": (b"GET /hello HTTP/1.1\r\n" + H + b"XAb\r\n\r\n", "nginx drops it; a proxy must not guess"),
    "bad name": (b"GET /hello HTTP/1.1\r\n" + H + b"X(A): b\r\n\r\n", "nginx drops it; a proxy must not guess"),
    "control byte in a value": (b"GET /hello HTTP/1.1\r\n" + H + b"X-A: b\x01c\r\n\r\n", "RFC 9110 5.5"),
    "LF-only": (b"GET /hello HTTP/1.1\nHost: a\n\n", "bare LF line ends split differently on other hops"),
    "LF-only chunked body": (
        b"POST /echo HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n3\nabc\n0\n\n",
        "as in a head; twisted.web's decoder would wait for a CRLF",
    ),
    "Host with userinfo": (b"GET /hello HTTP/1.1\r\nHost: u@a\r\n\r\n", "not a host (RFC 3986 3.2.2)"),
    "Host with a backslash": (b"GET /hello HTTP/1.1\r\nHost: a\\b\r\n\r\n", "not a host (RFC 3986 3.2.2)"),
    "Host with a bad port": (b"GET /hello HTTP/1.1\r\nHost: a:x\r\n\r\n", "a port is digits"),
    "101 header lines": (
        b"GET /hello HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(100)) + b"\r\n",
        "limits.max_header_lines, 100 as Apache's LimitRequestFields (nginx refuses past 1,000)",
    ),
    "ftp target": (b"GET ftp://a/hello HTTP/1.1\r\n" + H + b"\r\n", "Prexy fronts http and https only"),
}
ALL_CASES = {**CASES, **{name: raw for name, (raw, _) in STRICTER.items()}}


def find_nginx() -> str | None:
    for candidate in (os.environ.get("PREXY_NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


class Answer(Protocol):
    """Sends one raw request; done at the end of the first complete
    response (by Content-Length), at the close, or after ``wait`` s."""

    def __init__(self, request: bytes, wait: float = 3.0) -> None:
        self.request = request
        self.data = bytearray()
        self.done: defer.Deferred[Answer] = defer.Deferred()
        self.timed_out = False
        self._timer = reactor.callLater(wait, self._late)

    def connectionMade(self) -> None:
        self.transport.write(self.request)

    def dataReceived(self, data: bytes) -> None:
        self.data += data
        head, sep, body = bytes(self.data).partition(b"\r\n\r\n")
        if not sep:
            return
        length = None
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        chunked = b"transfer-encoding: chunked" in head.lower()
        if (length is not None and len(body) >= length) or (chunked and body.endswith(b"0\r\n\r\n")):
            self.transport.loseConnection()

    def _late(self) -> None:
        self.timed_out = True
        if self.transport is not None:
            self.transport.abortConnection()

    def failed(self, reason: Any) -> None:
        if self._timer.active():
            self._timer.cancel()
        self.done.errback(reason)

    def connectionLost(self, reason: Any) -> None:
        if self._timer.active():
            self._timer.cancel()
        self.done.callback(self)

    @property
    def status(self) -> int | None:
        for line in bytes(self.data).split(b"\r\n"):
            if line.startswith(b"HTTP/1."):
                code = int(line.split(b" ")[1])
                if code >= 200:
                    return code
        return None


def send(port: int, raw: bytes, wait: float = 3.0) -> defer.Deferred[Answer]:
    answer = Answer(raw, wait)
    factory = ClientFactory.forProtocol(lambda: answer)
    factory.clientConnectionFailed = lambda c, r: answer.failed(r)  # type: ignore[method-assign]
    reactor.connectTCP("127.0.0.1", port, factory)
    return answer.done


class Nginx:
    """nginx as a reverse proxy to ``upstream`` (a port), in a child."""

    def __init__(self, binary: str, upstream: int) -> None:
        self.dir = scratch_dir("prexy-nginx-")
        self.port = free_port()
        d = self.dir
        conf = f"""daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
  access_log off; client_body_temp_path {d}; proxy_temp_path {d}; fastcgi_temp_path {d};
  uwsgi_temp_path {d}; scgi_temp_path {d};
  server {{ listen 127.0.0.1:{self.port}; server_name _;
    location / {{ proxy_pass http://127.0.0.1:{upstream}; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_set_header Host $http_host; }} }}
}}
"""
        with open(os.path.join(d, "nginx.conf"), "w") as f:
            f.write(conf)
        self.process = subprocess.Popen(
            [binary, "-p", d, "-c", os.path.join(d, "nginx.conf")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        stop_process(self.process)


def classify(answer: Answer, reached: int) -> str:
    """'served' or 'refused:<class>' (or 'none' for no answer at all)."""
    status = answer.status
    if status is None:
        return "none"
    if status >= 400 and not reached:
        return f"refused:{status // 100}xx"
    return "served"


class TestStrict:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups, origin_server: OriginServer) -> None:
        self.cleanup = cleanup
        self.origin = origin_server.origin
        self.origin_port = origin_server.port
        self.upstream = origin_server.url
        self.dir = scratch_dir("prexy-strict-")

    @defer.inlineCallbacks
    def twistd(self, config: str = "", workers: int = 2) -> Any:
        port = free_port_block(2)
        path = os.path.join(self.dir, "prexy.toml")
        with open(path, "w") as f:
            f.write(
                f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\naccess_log = "off"\n'
                f"workers = {workers}\n{config}\n"
                f'[sites.t]\nupstream = "{self.upstream}"\n'
            )
        child = Twistd("--config", path)
        self.cleanup(child.stop)
        yield child.ready()
        return child, port

    @defer.inlineCallbacks
    def outcome(self, port: int, raw: bytes) -> Any:
        before = len(self.origin.requests)
        answer = yield send(port, raw)
        return classify(answer, len(self.origin.requests) - before), answer

    @pytest_twisted.inlineCallbacks
    def test_refuses_what_nginx_refuses(self) -> Any:
        binary = find_nginx()
        if binary is None:
            pytest.skip("no nginx binary")
        nginx = Nginx(binary, self.origin_port.getHost().port)
        self.cleanup(nginx.stop)
        yield listening(nginx.port)
        child, port = yield self.twistd()
        problems = []
        for name, raw in ALL_CASES.items():
            theirs, _ = yield self.outcome(nginx.port, raw)
            ours, answer = yield self.outcome(port, raw)
            if answer.timed_out:
                problems.append(f"{name}: no answer and no close from Prexy")
            if theirs.startswith("refused") and ours != theirs:
                problems.append(f"{name}: nginx {theirs}, Prexy {ours}")
            if theirs == "served" and ours != "served" and name not in STRICTER:
                problems.append(f"{name}: nginx serves it, Prexy {ours}")
            if name in STRICTER and not ours.startswith("refused"):
                problems.append(f"{name}: Prexy should refuse it ({STRICTER[name][1]}), got {ours}")
        assert problems == [], "\n".join(problems)
        assert "Traceback" not in child.output()

    @pytest_twisted.inlineCallbacks
    def test_header_lines_limit(self) -> Any:
        """``limits.max_header_lines`` through ``twistd prexy --workers 2``:
        up to it is served, one line past it (or Host and 1,000 more) is a
        431 that reaches no origin, counted and logged."""
        def head(count: int) -> bytes:
            return b"GET /hello HTTP/1.1\r\n" + H + b"".join(b"X-%d: v\r\n" % i for i in range(count - 1)) + b"\r\n"

        child, port = yield self.twistd("[limits]\nmax_header_lines = 150\n")
        ours, answer = yield self.outcome(port, head(150))
        assert (ours, answer.status) == ("served", 200), bytes(answer.data)
        for count in (151, 1001):
            ours, answer = yield self.outcome(port, head(count))
            assert (ours, answer.status) == ("refused:4xx", 431), bytes(answer.data)
        yield child.stop()
        assert child.output().count("refused a request from 127.0.0.1: 431 too many header lines") == 2

    @pytest_twisted.inlineCallbacks
    def test_header_deadline(self) -> Any:
        """A head trickled a byte every 0.2 s is answered 408 at the
        deadline (1 s here), and the connection closed."""
        child, port = yield self.twistd("[timeouts]\nclient_header = 1\n", workers=0)
        head = b"GET /hello HTTP/1.1\r\nHost: a\r\n" + b"X-A: " + b"a" * 100

        class Trickle(Answer):
            def connectionMade(self) -> None:
                self.trickle(0)

            def trickle(self, i: int) -> None:
                if not self.done.called and i < len(head):
                    self.transport.write(head[i : i + 1])
                    reactor.callLater(0.2, self.trickle, i + 1)

        answer = Trickle(b"", wait=10)
        reactor.connectTCP("127.0.0.1", port, ClientFactory.forProtocol(lambda: answer))
        started = time.monotonic()
        yield answer.done
        elapsed = time.monotonic() - started
        assert answer.status == 408, bytes(answer.data)
        assert not answer.timed_out
        assert 0.9 <= elapsed < 5, elapsed
        assert self.origin.requests == []

    @pytest_twisted.inlineCallbacks
    def test_body_deadline(self) -> Any:
        """A body that stops for longer than client_body gets 408."""
        child, port = yield self.twistd("[timeouts]\nclient_body = 1\n", workers=0)
        started = time.monotonic()
        answer = yield send(port, b"POST /echo HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc", wait=10)
        elapsed = time.monotonic() - started
        assert answer.status == 408, bytes(answer.data)
        assert 0.9 <= elapsed < 5, elapsed
        assert self.origin.requests == []

    @pytest_twisted.inlineCallbacks
    def test_fuzzed_requests(self) -> Any:
        """Seeded mutations of valid requests: every connection gets an
        answer or a close, nothing the gate would refuse reaches the origin,
        a good request is served after each batch, no traceback.  The
        deadlines are 2 s here, so a head or body a mutation cut short is
        answered 408 well within the client's 8 s."""
        child, port = yield self.twistd("[timeouts]\nclient_header = 2\nclient_body = 2\n")
        rng = random.Random(17)
        seeds = [CASES["plain"], CASES["chunked body"], CASES["length body"], CASES["absolute-form"]]
        tokens = [b" ", b"\r\n", b"\n", b"\r", b":", b"\x00", b"\x7f", b"\xc3\xa9", b"Host: b\r\n", b"%",
                  b"Transfer-Encoding: chunked\r\n", b"Content-Length: 5\r\n", b"\t", b"..", b"#", b"*"]
        for _batch in range(6):
            pending = []
            for _ in range(25):
                raw = bytearray(rng.choice(seeds))
                for _ in range(rng.randint(1, 3)):
                    at = rng.randrange(len(raw) + 1)
                    op = rng.randrange(3)
                    if op == 0:
                        raw[at:at] = rng.choice(tokens)
                    elif op == 1:
                        del raw[at : at + rng.randint(1, 3)]
                    else:
                        raw[at : at + 1] = bytes([rng.randrange(256)])
                pending.append(send(port, bytes(raw), wait=8))
            answers = yield defer.gatherResults(pending)
            for answer in answers:
                assert not answer.timed_out, f"no answer and no close: {answer.request!r}"
            good = yield send(port, CASES["plain"])
            assert good.status == 200, bytes(good.data)
        for request in self.origin.requests:
            head = request.method + b" " + request.uri + b" " + request.clientproto + b"\r\n"
            head += b"".join(b"%s: %s\r\n" % (n, v) for n, vs in request.requestHeaders.getAllRawHeaders() for v in vs)
            assert isinstance(RequestReader(Limits()).feed(head + b"\r\n")[0], Request), head
        output = child.output()
        assert "Traceback" not in output
        assert "Unhandled" not in output
