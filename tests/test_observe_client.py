"""Finding the admin endpoint and talking to it (prexy.observe.client):
endpoint strings and URLs, the configuration file, the token, the ndjson
reader fed in pieces, and the client over a fake connection (no socket)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.observe.client import (
    AdminClient,
    AdminError,
    AdminTarget,
    NdjsonReader,
    config_target,
    endpoint_target,
    find_target,
    parse_admin,
)
from tests.cases import expand, parametrize, tmp_dir

REPO = Path(__file__).resolve().parents[1]


@expand
class EndpointTests(SynchronousTestCase):
    """The configuration's admin endpoint string -> where to connect."""

    @parametrize("desc,target", {
        "loopback": ("tcp:9080:interface=127.0.0.1", AdminTarget("http", "127.0.0.1", 9080)),
        "any": ("tcp:9080", AdminTarget("http", "127.0.0.1", 9080)),
        "zeros": ("tcp:9080:interface=0.0.0.0", AdminTarget("http", "127.0.0.1", 9080)),
        "keywords": ("tcp:port=9081:interface=10.1.2.3", AdminTarget("http", "10.1.2.3", 9081)),
        "v6": ("tcp6:9080:interface=\\:\\:1", AdminTarget("http", "::1", 9080)),
        "v6any": ("tcp6:9080", AdminTarget("http", "::1", 9080)),
        "unix": ("unix:/run/prexy/admin.sock", AdminTarget("unix", "/run/prexy/admin.sock")),
        "unixaddress": ("unix:address=/run/prexy/admin.sock:mode=660", AdminTarget("unix", "/run/prexy/admin.sock")),
    })
    def test_endpoint(self, desc: str, target: AdminTarget) -> None:
        self.assertEqual(endpoint_target(desc), target)

    @parametrize("desc,reason", {
        "ssl": ("ssl:9443", "is TLS: give --admin https://"),
        "systemd": ("systemd:domain=INET:index=0", "a socket systemd passes"),
        "noport": ("tcp:interface=127.0.0.1", "no port"),
        "range": ("tcp:70000", "out of range"),
        "kind": ("udp:9080", "unsupported"),
        "unixempty": ("unix:", "no socket path"),
    })
    def test_refused(self, desc: str, reason: str) -> None:
        with self.assertRaises(AdminError) as caught:
            endpoint_target(desc)
        self.assertIn(reason, str(caught.exception))
        self.assertEqual(caught.exception.status, 2)

    def test_describe(self) -> None:
        self.assertEqual(AdminTarget("http", "127.0.0.1", 9080).describe(), "http://127.0.0.1:9080")
        self.assertEqual(AdminTarget("http", "::1", 9080).describe(), "http://[::1]:9080")
        self.assertEqual(AdminTarget("https", "a", 443, "/prexy").describe(), "https://a:443/prexy")
        self.assertEqual(AdminTarget("unix", "/s").describe(), "unix:/s")


@expand
class AdminOptionTests(SynchronousTestCase):
    """``--admin``: a URL, an endpoint string, or HOST:PORT."""

    @parametrize("value,target", {
        "url": ("http://127.0.0.1:9080", AdminTarget("http", "127.0.0.1", 9080)),
        "slash": ("http://127.0.0.1:9080/", AdminTarget("http", "127.0.0.1", 9080)),
        "prefix": ("https://admin.example/prexy/", AdminTarget("https", "admin.example", 443, "/prexy")),
        "hostport": ("localhost:9080", AdminTarget("http", "localhost", 9080)),
        "v6": ("http://[::1]:9080", AdminTarget("http", "::1", 9080)),
        "endpoint": ("tcp:9080", AdminTarget("http", "127.0.0.1", 9080)),
        "unix": ("unix:/tmp/a.sock", AdminTarget("unix", "/tmp/a.sock")),
    })
    def test_parsed(self, value: str, target: AdminTarget) -> None:
        self.assertEqual(parse_admin(value), target)

    @parametrize("value,reason", {
        "scheme": ("ftp://a:21", "use an http:// or https:// URL"),
        "nohost": ("http://:9080", "no host"),
        "query": ("http://a:1/?x=1", "no query"),
        "port": ("http://a:99999", "--admin"),
    })
    def test_refused(self, value: str, reason: str) -> None:
        with self.assertRaises(AdminError) as caught:
            parse_admin(value)
        self.assertIn(reason, str(caught.exception))


class ConfigTests(SynchronousTestCase):
    """``--config``: the file's ``[server] admin`` and ``admin_token``."""

    def setUp(self) -> None:
        self.dir = tmp_dir(self)

    def write(self, text: str) -> str:
        path = self.dir / "prexy.toml"
        path.write_text(text)
        return str(path)

    def test_tcp_and_token(self) -> None:
        path = self.write('[server]\nadmin = "tcp:9081:interface=127.0.0.1"\nadmin_token = "s3"\n'
                          '[sites.a]\nupstream = "http://x"\nrules = ["missing.rules"]\n')
        self.assertEqual(config_target(path), AdminTarget("http", "127.0.0.1", 9081, token="s3"))

    def test_unix(self) -> None:
        path = self.write('[server]\nadmin = "unix:/run/prexy/admin.sock"\n')
        self.assertEqual(config_target(path), AdminTarget("unix", "/run/prexy/admin.sock"))

    def test_example_configuration(self) -> None:
        """The configuration shipped in conf/ gives its admin endpoint, without
        reading the files it names (rules, certificates)."""
        self.assertEqual(config_target(str(REPO / "conf" / "prexy.toml")), AdminTarget("http", "127.0.0.1", 9080))

    def test_errors(self) -> None:
        cases = {
            '[server]\nlisten = ["tcp:8080"]\n': "[server] admin is not set: this Prexy has no admin endpoint",
            "[server\n": "not a Prexy configuration",
            'server = 3\n': "[server] is not a table",
            '[server]\nadmin = 9080\n': "[server] admin must be an endpoint string",
            '[server]\nadmin = "tcp:9080"\nadmin_token = 5\n': "[server] admin_token must be a string",
            '[server]\nadmin = "systemd:domain=INET:index=1"\n': "a socket systemd passes",
        }
        for text, reason in cases.items():
            path = self.write(text)
            with self.assertRaises(AdminError) as caught:
                config_target(path)
            self.assertTrue(str(caught.exception).startswith(path + ": "), str(caught.exception))
            self.assertIn(reason, str(caught.exception))
        with self.assertRaises(AdminError) as caught:
            config_target(str(self.dir / "nope.toml"))
        self.assertIn("nope.toml: cannot read: No such file or directory", str(caught.exception))

    def test_precedence(self) -> None:
        """--admin wins over the file's endpoint; --token over the
        environment's PREXY_ADMIN_TOKEN over the file's token."""
        path = self.write('[server]\nadmin = "tcp:9081"\nadmin_token = "file"\n')
        self.assertEqual(find_target(None, path, None, {}), AdminTarget("http", "127.0.0.1", 9081, token="file"))
        self.assertEqual(find_target("tcp:7000", path, None, {}).port, 7000)
        self.assertEqual(find_target("tcp:7000", path, None, {}).token, "file")
        self.assertEqual(find_target(None, path, None, {"PREXY_ADMIN_TOKEN": "env"}).token, "env")
        self.assertEqual(find_target(None, path, "opt", {"PREXY_ADMIN_TOKEN": "env"}).token, "opt")
        self.assertIsNone(find_target("tcp:7000", None, None, {}).token)
        with self.assertRaises(AdminError) as caught:
            find_target(None, None, None, {})
        self.assertEqual(str(caught.exception), "say where Prexy's admin endpoint is: --admin URL or --config FILE")


def lines_of(values: list[Any]) -> bytes:
    return b"".join(json.dumps(v).encode() + b"\n" for v in values)


VALUES = [{"site": "shop", "url": "/a", "rules": [1, 3]}, {"dropped": 4}, {"site": "b", "url": "/\u00e9"}]


class NdjsonReaderTests(SynchronousTestCase):
    """The live log's stream cut into records, whatever the reads."""

    def test_every_split(self) -> None:
        """Fed in two pieces cut at every byte, or byte by byte, the same
        records come out, each as soon as its newline arrives."""
        data = lines_of(VALUES)
        for cut in range(len(data) + 1):
            reader = NdjsonReader()
            out = reader.feed(data[:cut]) + reader.feed(data[cut:])
            self.assertEqual(out, VALUES)
            self.assertTrue(reader.end())
        reader = NdjsonReader()
        seen = []
        for i in range(len(data)):
            got = reader.feed(data[i:i + 1])
            if got:
                self.assertEqual(data[i:i + 1], b"\n")
            seen += got
        self.assertEqual(seen, VALUES)

    def test_blank_lines_and_crlf(self) -> None:
        self.assertEqual(NdjsonReader().feed(b'\n{"a": 1}\r\n\r\n{"b": 2}\n'), [{"a": 1}, {"b": 2}])

    def test_ends_mid_line(self) -> None:
        reader = NdjsonReader()
        self.assertEqual(reader.feed(b'{"a": 1}\n{"b"'), [{"a": 1}])
        self.assertFalse(reader.end())

    def test_not_json(self) -> None:
        with self.assertRaises(AdminError) as caught:
            NdjsonReader().feed(b"<html>\n")
        self.assertIn("not JSON: '<html>'", str(caught.exception))

    def test_line_too_long(self) -> None:
        """A line past the limit without a newline is refused, not buffered."""
        reader = NdjsonReader(max_line=100)
        reader.feed(b"x" * 60)
        with self.assertRaises(AdminError):
            reader.feed(b"x" * 60)


class FakeSocket:
    def __init__(self) -> None:
        self.timeouts: list[float | None] = []

    def settimeout(self, value: float | None) -> None:
        self.timeouts.append(value)


class FakeResponse:
    def __init__(self, status: int, pieces: list[bytes], broken: BaseException | None = None) -> None:
        self.status = status
        self.pieces = list(pieces)
        self.broken = broken
        self.closed = False

    def read1(self, n: int) -> bytes:
        if self.pieces:
            return self.pieces.pop(0)
        if self.broken is not None:
            raise self.broken
        return b""

    def read(self) -> bytes:
        out = b"".join(self.pieces)
        self.pieces = []
        return out

    def close(self) -> None:
        self.closed = True


class FakeConnection:
    """An ``http.client.HTTPConnection`` stand-in: records the request and
    answers with a canned response (or fails as a socket would)."""

    def __init__(
        self, response: FakeResponse | None = None, error: BaseException | None = None,
        answer_error: BaseException | None = None,
    ) -> None:
        self.response = response
        #: Raised by connect() (a refusal) or by request() (after connecting).
        self.error = error
        self.answer_error = answer_error
        self.requests: list[tuple[str, str, bytes | None, dict[str, str]]] = []
        self.sock = FakeSocket()
        self.closed = False

    def connect(self) -> None:
        if self.error is not None:
            raise self.error

    def request(self, method: str, path: str, body: bytes | None = None, headers: Any = None) -> None:
        if self.answer_error is not None:
            raise self.answer_error
        self.requests.append((method, path, body, dict(headers)))

    def getresponse(self) -> FakeResponse:
        assert self.response is not None
        return self.response

    def close(self) -> None:
        self.closed = True


def client_with(conn: FakeConnection, target: AdminTarget | None = None) -> tuple[AdminClient, list[Any]]:
    made: list[Any] = []

    def connect(t: AdminTarget, timeout: float | None) -> Any:
        made.append((t, timeout))
        return conn

    return AdminClient(target or AdminTarget("http", "127.0.0.1", 9080, "/p", "tok"), 5.0, connect), made


class ClientTests(SynchronousTestCase):
    """Requests made, answers read, failures worded (no socket: a fake
    connection stands in)."""

    def test_get_json_with_token_and_prefix(self) -> None:
        conn = FakeConnection(FakeResponse(200, [b'{"requests": 5}']))
        client, made = client_with(conn)
        self.assertEqual(client.get_json("/stats.json"), {"requests": 5})
        method, path, body, headers = conn.requests[0]
        self.assertEqual((method, path, body), ("GET", "/p/stats.json", None))
        self.assertEqual(headers["Authorization"], "Bearer tok")
        self.assertEqual(made[0][1], 5.0)

    def test_no_token_no_header(self) -> None:
        conn = FakeConnection(FakeResponse(200, [b"{}"]))
        client, _ = client_with(conn, AdminTarget("unix", "/s"))
        client.get_json("/stats.json")
        self.assertNotIn("Authorization", conn.requests[0][3])

    def test_refused_connection(self) -> None:
        for error, reason in [
            (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
            (FileNotFoundError(2, "No such file or directory"), "no such socket"),
            (TimeoutError("timed out"), "timed out"),
            (PermissionError(13, "Permission denied"), "permission denied"),
        ]:
            conn = FakeConnection(error=error)
            client, _ = client_with(conn)
            with self.assertRaises(AdminError) as caught:
                client.get_json("/stats.json")
            self.assertEqual(str(caught.exception),
                             f"cannot reach the admin endpoint at http://127.0.0.1:9080/p: {reason}")
            self.assertEqual(caught.exception.status, 2)
            self.assertTrue(conn.closed)

    def test_no_answer(self) -> None:
        """Connected, but no answer in time (a dry run that hangs), or the
        connection cut: said so, not "cannot reach"."""
        client, _ = client_with(FakeConnection(answer_error=TimeoutError("timed out")))
        with self.assertRaises(AdminError) as caught:
            client.call("POST", "/sites/a/dry-run?count=5", b"x", {})
        self.assertEqual(str(caught.exception),
                         "the admin endpoint at http://127.0.0.1:9080/p did not answer POST /sites/a/dry-run within 5 s")
        self.assertEqual(caught.exception.status, 1)
        client, _ = client_with(FakeConnection(answer_error=ConnectionResetError(104, "Connection reset by peer")))
        with self.assertRaises(AdminError) as caught:
            client.get_json("/stats.json")
        self.assertEqual(str(caught.exception),
                         "the admin endpoint at http://127.0.0.1:9080/p broke off: connection reset by peer")

    def test_refusals(self) -> None:
        """A refusal's JSON error is the message; 401 says what to do."""
        for status, body, message in [
            (404, b'{"error": "no site \'x\'"}', "/sites/x.json: no site 'x'"),
            (401, b"", "/sites/x.json: the admin endpoint wants a token"),
            (500, b"<h1>oops</h1>\nmore", "/sites/x.json: 500 <h1>oops</h1>"),
            (503, b"", "/sites/x.json: 503 Service Unavailable"),
        ]:
            client, _ = client_with(FakeConnection(FakeResponse(status, [body])))
            with self.assertRaises(AdminError) as caught:
                client.get_json("/sites/x.json")
            self.assertTrue(str(caught.exception).startswith(message), str(caught.exception))
            self.assertEqual(caught.exception.status, 1)

    def test_not_json(self) -> None:
        client, _ = client_with(FakeConnection(FakeResponse(200, [b"ok\n"])))
        with self.assertRaises(AdminError) as caught:
            client.get_json("/stats.json")
        self.assertIn("answered /stats.json with no JSON", str(caught.exception))

    def test_call_returns_refusal(self) -> None:
        """``call`` (the dry run) gives a 400's error to the caller."""
        conn = FakeConnection(FakeResponse(400, [b'{"error": "d.rules:3:7: bad"}']))
        client, _ = client_with(conn)
        self.assertEqual(client.call("POST", "/sites/a/dry-run", b"x", {"Content-Type": "text/plain"}),
                         (400, {"error": "d.rules:3:7: bad"}))
        self.assertEqual(conn.requests[0][2], b"x")

    def test_records_as_they_come(self) -> None:
        """The stream's records are given one by one as reads complete them
        (a record split across reads included); the socket then waits
        without a timeout; the end of the stream ends the iteration."""
        data = lines_of(VALUES)
        response = FakeResponse(200, [data[:10], data[10:50], data[50:]])
        conn = FakeConnection(response)
        client, _ = client_with(conn)
        records = client.records("/log?site=shop")
        self.assertEqual(next(records), VALUES[0])
        self.assertEqual(response.pieces, [data[50:]])  # read no further than the first record needed
        self.assertEqual(list(records), VALUES[1:])
        self.assertEqual(conn.requests[0][3]["Accept"], "application/x-ndjson")
        self.assertEqual(conn.sock.timeouts, [None])
        self.assertTrue(response.closed)

    def test_stream_broken(self) -> None:
        client, _ = client_with(FakeConnection(FakeResponse(200, [b'{"a": 1}\n'], ConnectionResetError(104, "x"))))
        records = client.records("/log")
        self.assertEqual(next(records), {"a": 1})
        with self.assertRaises(AdminError) as caught:
            next(records)
        self.assertIn("broke off the stream", str(caught.exception))

    def test_stream_ends_mid_line(self) -> None:
        client, _ = client_with(FakeConnection(FakeResponse(200, [b'{"a": 1}\n{"b":'])))
        with self.assertRaises(AdminError) as caught:
            list(client.records("/log"))
        self.assertIn("ended the stream mid-line", str(caught.exception))

    def test_stream_refused(self) -> None:
        client, _ = client_with(FakeConnection(FakeResponse(400, [b'{"error": "unknown parameter \'x\'"}'])))
        with self.assertRaises(AdminError) as caught:
            list(client.records("/log?x=1"))
        self.assertEqual(str(caught.exception), "/log: unknown parameter 'x'")
