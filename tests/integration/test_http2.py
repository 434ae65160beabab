"""HTTP/2 through ``twistd prexy`` (``[server] http2 = true``) on a TLS
listener: the ``h2`` library and a raw frame client (hyperframe + hpack,
which reads on after a GOAWAY and can leave a window closed) over real TLS
sockets with ALPN, curl --http2, and cleartext h2c.

Proves: a client offering h2 gets HTTP/2 and a client offering only
http/1.1 gets HTTP/1.1 on the same listener; the rewritten page, its
compression and cache hits are the same bytes over both; several streams
on one connection; the rewrite's Server-Timing arrives as trailers; a
stream whose window the client leaves closed does not make the worker
spin and does not hold up a stream beside it; a rapid-reset flood gets
GOAWAY ENHANCE_YOUR_CALM while the worker goes on serving; a reload's
GOAWAY lets the stream in flight finish; an ``h2c_listen`` listener serves
HTTP/2 with prior knowledge and HTTP/1.1.
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import pytest_twisted
from hyperframe.frame import (
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from twisted.internet import defer, reactor, task, threads

from prexy.h2server import PREFACE

from .conftest import Cleanups
from .raw_origin import RawOrigin
from .test_headerrules_nginx import self_signed
from .test_rfc_cache import ScriptedOrigin
from .twistd_support import Twistd, free_port, scratch_dir

PAGE = b"<html><body>" + b"<p>www.origin.test page</p>" * 200 + b"</body></html>"
REWRITTEN = PAGE.replace(b"www.origin.test", b"clone.test")


def reply() -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nCache-Control: max-age=600\r\nETag: \"p\"\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE))


@pytest.fixture
def scripted() -> Any:
    server = ScriptedOrigin()
    for _ in range(20):
        server.replies.append(reply())
    yield server
    server.close()


@defer.inlineCallbacks
def start(cleanup: Cleanups, origin: ScriptedOrigin, workers: int = 1, http2: str = "http2 = true\n") -> Any:
    """twistd prexy on TLS with a cache and a map, in front of ``origin``."""
    d = Path(scratch_dir("prexy-h2-"))
    (d / "site.map").write_text("/old-page /new-page;\n")
    child, port = yield run_twistd(
        cleanup, d, origin.port, f"workers = {workers}\n{http2}access_log = \"-\"\n",
        f'[cache]\nsize = "16M"\npath = "{d}/store"\n', f'map = "{d}/site.map"\n',
    )
    return child, port


@defer.inlineCallbacks
def run_twistd(cleanup: Cleanups, d: Path, origin_port: int, server: str, tables: str = "", site: str = "") -> Any:
    """twistd prexy on an ssl: listener with a self-signed certificate in
    ``d``, one site rewriting ``www.origin.test``; ``server``, ``tables``
    and ``site`` add lines to [server], tables before the site, and the
    site's table."""
    self_signed(d)
    (d / "site.rules").write_text("replace_filter 'www\\.origin\\.test' 'clone.test' g;\n")
    port = free_port()
    (d / "prexy.toml").write_text(
        f'[server]\nlisten = ["ssl:{port}:interface=127.0.0.1"]\n{server}'
        f'tls_certificate = "{d}/cert.pem"\ntls_key = "{d}/key.pem"\n{tables}'
        f'[sites.t]\nupstream = "http://127.0.0.1:{origin_port}"\nrules = ["{d}/site.rules"]\n{site}'
    )
    child = Twistd("--config", str(d / "prexy.toml"))
    cleanup(child.stop)
    yield child.ready()
    return child, port


def tls(port: int, alpn: list[str]) -> ssl.SSLSocket:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.set_alpn_protocols(alpn)
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="localhost")


def h2_get(port: int, paths: list[str], accept: bytes | None = None) -> tuple[str | None, dict[int, tuple[dict[bytes, bytes], bytes]]]:
    """GET every path on one HTTP/2 connection, concurrently."""
    sock = tls(port, ["h2", "http/1.1"])
    chosen = sock.selected_alpn_protocol()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    streams = {}
    for i, path in enumerate(paths):
        sid = 1 + 2 * i
        headers = [(b":method", b"GET"), (b":path", path.encode()), (b":scheme", b"https"), (b":authority", b"clone.test")]
        if accept:
            headers.append((b"accept-encoding", accept))
        conn.send_headers(sid, headers, end_stream=True)
        streams[sid] = [{}, b""]
    sock.sendall(conn.data_to_send())
    done: set[int] = set()
    while len(done) < len(paths):
        data = sock.recv(65536)
        if not data:
            break
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived):
                streams[event.stream_id][0] = dict(event.headers)
            elif isinstance(event, h2.events.DataReceived):
                streams[event.stream_id][1] += event.data
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                done.add(event.stream_id)
        sock.sendall(conn.data_to_send())
    sock.close()
    return chosen, {sid: (h, b) for sid, (h, b) in streams.items()}


def h1_get(port: int, path: str) -> tuple[str | None, bytes]:
    sock = tls(port, ["http/1.1"])
    chosen = sock.selected_alpn_protocol()
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: clone.test\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return chosen, data


@pytest_twisted.inlineCallbacks
def test_h2_and_http11_on_one_listener(cleanup: Cleanups, scripted: ScriptedOrigin) -> Any:
    """h2 when offered, HTTP/1.1 otherwise; rewritten bytes either way; the
    second and third streams of one connection are cache hits."""
    child, port = yield start(cleanup, scripted)
    chosen, answers = yield threads.deferToThread(h2_get, port, ["/a", "/a", "/a"])
    assert chosen == "h2"
    for headers, body in answers.values():
        assert headers[b":status"] == b"200"
        assert body == REWRITTEN
    chosen, data = yield threads.deferToThread(h1_get, port, "/a")
    assert chosen == "http/1.1"
    assert data.startswith(b"HTTP/1.1 200")
    assert b"hit" in data.split(b"\r\n\r\n")[0]


@pytest_twisted.inlineCallbacks
def test_h2_compressed(cleanup: Cleanups, scripted: ScriptedOrigin) -> Any:
    """A client taking gzip gets the rewritten page compressed over HTTP/2,
    from the miss and from the hit alike."""
    child, port = yield start(cleanup, scripted)
    _, answers = yield threads.deferToThread(h2_get, port, ["/g"], b"gzip")
    _, again = yield threads.deferToThread(h2_get, port, ["/g"], b"gzip")
    for headers, body in (*answers.values(), *again.values()):
        assert headers[b"content-encoding"] == b"gzip"
        assert gzip.decompress(body) == REWRITTEN


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
@pytest_twisted.inlineCallbacks
def test_curl_http2(cleanup: Cleanups, scripted: ScriptedOrigin) -> Any:
    """curl --http2 speaks HTTP/2 to the listener and gets the page."""
    child, port = yield start(cleanup, scripted)
    out = os.path.join(scratch_dir("prexy-curl-"), "body")

    def run() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["curl", "-sk", "--http2", "-o", out, "-w", "%{http_version} %{http_code}",
             f"https://127.0.0.1:{port}/c"], capture_output=True, timeout=30, env=dict(os.environ))

    done = yield threads.deferToThread(run)
    assert done.stdout == b"2 200", done
    with open(out, "rb") as f:
        assert f.read() == REWRITTEN


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl")
@pytest.mark.parametrize(("workers", "http2", "version"), [
    (0, "", b"2"),  # the default, in the twistd process itself (no adopted socket)
    (1, "", b"2"),  # the default, in a worker
    (1, "http2 = false\n", b"1.1"),
])
@pytest_twisted.inlineCallbacks
def test_http2_by_default(cleanup: Cleanups, scripted: ScriptedOrigin, workers: int, http2: str, version: bytes) -> Any:
    """An ssl: listener offers h2 unless [server] http2 = false, with or
    without worker processes; the body is the same either way."""
    child, port = yield start(cleanup, scripted, workers=workers, http2=http2)
    out = os.path.join(scratch_dir("prexy-curl-"), "body")

    def run() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["curl", "-sk", "-o", out, "-w", "%{http_version} %{http_code}",
             f"https://127.0.0.1:{port}/d"], capture_output=True, timeout=30, env=dict(os.environ))

    done = yield threads.deferToThread(run)
    assert done.stdout == version + b" 200", done
    with open(out, "rb") as f:
        assert f.read() == REWRITTEN


class HeldOrigin(RawOrigin):
    """An origin answering by path: each route is a list of byte pieces
    and ``threading.Event``s; an event is waited for before the pieces
    after it are sent.  ``arrived[path]`` is set when a request for it
    came."""

    def __init__(self, routes: dict[bytes, list[Any]]) -> None:
        self.routes = routes
        self.arrived = {path: threading.Event() for path in routes}
        super().__init__()

    def answer(self, conn: socket.socket, head: bytes) -> bool:
        path = head.split(b" ")[1]
        pieces = self.routes.get(path, [b"HTTP/1.1 404 x\r\nContent-Length: 0\r\n\r\n"])
        if path in self.arrived:
            self.arrived[path].set()
        for piece in pieces:
            if isinstance(piece, threading.Event):
                piece.wait(30)
            else:
                conn.sendall(piece)
        return True


def chunked_html(body: bytes) -> list[Any]:
    return [b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)]


class RawH2:
    """A small HTTP/2 client: frames written and read with hyperframe and
    hpack on a socket (TLS with ALPN h2, or cleartext)."""

    def __init__(self, port: int, *, tls_alpn: bool = True, window: int = 65535) -> None:
        from hpack import Decoder, Encoder

        self.sock: Any = tls(port, ["h2"]) if tls_alpn else socket.create_connection(("127.0.0.1", port), timeout=10)
        self.encoder, self.decoder = Encoder(), Decoder()
        self.buffer = b""
        self.heads: dict[int, dict[bytes, bytes]] = {}
        self.trailers: dict[int, dict[bytes, bytes]] = {}
        self.bodies: dict[int, bytes] = {}
        self.ended: set[int] = set()
        self.resets: dict[int, int] = {}
        self.goaway: Any = None
        self.closed = False
        #: Streams whose data is not acknowledged (their window stays closed).
        self.stalled: set[int] = set()
        settings = SettingsFrame(0, settings={SettingsFrame.INITIAL_WINDOW_SIZE: window})
        self.sock.sendall(PREFACE + settings.serialize() + WindowUpdateFrame(0, window_increment=1 << 30).serialize())

    def request(self, sid: int, path: str, extra: list[tuple[str, str]] | None = None, send: bool = True) -> bytes:
        fields = [(":method", "GET"), (":path", path), (":scheme", "https"), (":authority", "clone.test"),
                  *(extra or [])]
        frame = HeadersFrame(sid, self.encoder.encode(fields), flags=["END_HEADERS", "END_STREAM"])
        data = frame.serialize()
        if send:
            self.sock.sendall(data)
        return data

    def read_until(self, done: Any) -> None:
        """Read and answer frames until ``done()`` or the connection ends."""
        while not done():
            try:
                data = self.sock.recv(65536)
            except (ConnectionResetError, ssl.SSLError):
                data = b""
            if not data:
                self.closed = True
                return
            self.buffer += data
            out = b""
            while len(self.buffer) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
                if len(self.buffer) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buffer[9 : 9 + length]))
                self.buffer = self.buffer[9 + length :]
                out += self._frame(frame)
            if out:
                self.sock.sendall(out)

    def _frame(self, frame: Any) -> bytes:
        sid = frame.stream_id
        if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            return SettingsFrame(0, flags=["ACK"]).serialize()
        if isinstance(frame, PingFrame) and "ACK" not in frame.flags:
            return PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]).serialize()
        if isinstance(frame, HeadersFrame):
            fields = {bytes(n): bytes(v) for n, v in self.decoder.decode(frame.data, raw=True)}
            (self.trailers if sid in self.heads else self.heads)[sid] = fields
        elif isinstance(frame, DataFrame):
            self.bodies[sid] = self.bodies.get(sid, b"") + frame.data
        elif isinstance(frame, RstStreamFrame):
            self.resets[sid] = frame.error_code
        elif isinstance(frame, GoAwayFrame):
            self.goaway = frame
        if "END_STREAM" in getattr(frame, "flags", ()):
            self.ended.add(sid)
        if isinstance(frame, DataFrame) and frame.flow_controlled_length and sid not in self.stalled:
            return WindowUpdateFrame(sid, window_increment=frame.flow_controlled_length).serialize()
        return b""

    def close(self) -> None:
        self.sock.close()


def worker_cpu_seconds(child: Twistd) -> float:
    """User + system CPU time of the twistd master's workers."""
    total = 0
    for pid in child.children():
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


@defer.inlineCallbacks
def start_held(cleanup: Cleanups, routes: dict[bytes, list[Any]]) -> Any:
    origin = HeldOrigin(routes)
    cleanup(origin.close)
    d = Path(scratch_dir("prexy-h2-"))
    child, port = yield run_twistd(cleanup, d, origin.port, 'workers = 1\nhttp2 = true\naccess_log = "off"\n')
    return child, port, origin, d / "prexy.toml"


def dechunk(raw: bytes) -> bytes:
    head, _, body = raw.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" not in head.lower():
        return body
    out = b""
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out, body = out + body[:size], body[size + 2 :]
    return out


def h1_get_body(port: int, path: str, accept: str = "") -> bytes:
    sock = tls(port, ["http/1.1"])
    extra = f"Accept-Encoding: {accept}\r\n" if accept else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: clone.test\r\n{extra}Connection: close\r\n\r\n".encode())
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return dechunk(data)


@pytest_twisted.inlineCallbacks
def test_same_bytes_as_http11(cleanup: Cleanups, scripted: ScriptedOrigin) -> Any:
    """The rewritten miss, the cache hit and the gzip-compressed answer
    are the same bytes over HTTP/2 as over HTTP/1.1."""
    child, port = yield start(cleanup, scripted)
    _, h2_miss = yield threads.deferToThread(h2_get, port, ["/same"])
    h1_hit = yield threads.deferToThread(h1_get_body, port, "/same")
    _, h2_hit = yield threads.deferToThread(h2_get, port, ["/same"])
    _, h2_gzip = yield threads.deferToThread(h2_get, port, ["/same"], b"gzip")
    h1_gzip = yield threads.deferToThread(h1_get_body, port, "/same", "gzip")
    assert h2_miss[1][1] == h1_hit == h2_hit[1][1] == REWRITTEN
    assert h2_gzip[1][0][b"content-encoding"] == b"gzip"
    assert h2_gzip[1][1] == h1_gzip


def h1_head(port: int, path: str) -> bytes:
    sock = tls(port, ["http/1.1"])
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: clone.test\r\nConnection: close\r\n\r\n".encode())
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    return data.split(b"\r\n\r\n")[0]


@pytest_twisted.inlineCallbacks
def test_redirects_as_over_http11(cleanup: Cleanups) -> Any:
    """The map's redirect, and an upstream redirect rewritten for the clone
    (proxy_redirect default), carry the same status and Location over
    HTTP/2 as over HTTP/1.1."""
    origin = ScriptedOrigin()
    cleanup(origin.close)
    for _ in range(2):
        origin.replies.append(
            b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:%d/login?next=%%2F\r\n"
            b"Cache-Control: no-store\r\nContent-Length: 0\r\n\r\n" % origin.port)
    child, port = yield start(cleanup, origin)
    _, mapped = yield threads.deferToThread(h2_get, port, ["/old-page", "/account"])
    head_map = yield threads.deferToThread(h1_head, port, "/old-page")
    head_up = yield threads.deferToThread(h1_head, port, "/account")
    (map_headers, _), (up_headers, _) = mapped[1], mapped[3]

    def location(head: bytes) -> bytes:
        [value] = [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"location:")]
        return value

    assert (map_headers[b":status"], head_map[:12]) == (b"301", b"HTTP/1.1 301")
    assert map_headers[b"location"] == location(head_map)
    assert map_headers[b"location"].endswith(b"/new-page")
    assert (up_headers[b":status"], head_up[:12]) == (b"302", b"HTTP/1.1 302")
    assert up_headers[b"location"] == location(head_up)
    assert up_headers[b"location"].startswith(b"https://clone.test")  # the clone's, not the origin's
    assert up_headers[b"location"].endswith(b"/login?next=%2F")


@pytest_twisted.inlineCallbacks
def test_trailers(cleanup: Cleanups) -> Any:
    """A streamed, rewritten answer ends with the rewrite's Server-Timing
    in HTTP/2 trailers, announced by ``Trailer``."""
    go = threading.Event()
    head, rest = chunked_html(PAGE)
    child, port, origin, config = yield start_held(cleanup, {b"/t": [head, go, rest]})
    client = RawH2(port)
    cleanup(client.close)
    client.request(1, "/t")
    go.set()
    yield threads.deferToThread(client.read_until, lambda: 1 in client.ended)
    assert client.heads[1][b"trailer"].lower() == b"server-timing"
    assert client.bodies[1] == REWRITTEN
    assert client.trailers[1][b"server-timing"].startswith(b"rewrite;dur=")


@pytest_twisted.inlineCallbacks
def test_slow_stream_beside_a_fast_one(cleanup: Cleanups) -> Any:
    """Stream 1 asks for a 2 MB rewritten page and never opens its window;
    stream 3 beside it gets its page whole; meanwhile the worker uses
    (almost) no CPU: it waits for a WINDOW_UPDATE instead of spinning."""
    big = PAGE * (2 * 1024 * 1024 // len(PAGE))
    child, port, origin, config = yield start_held(cleanup, {
        b"/big": chunked_html(big),
        b"/small": [b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(PAGE), PAGE)],
    })
    client = RawH2(port)
    cleanup(client.close)
    client.stalled.add(1)
    client.request(1, "/big")
    yield threads.deferToThread(client.read_until, lambda: len(client.bodies.get(1, b"")) >= 65535)
    client.request(3, "/small")
    yield threads.deferToThread(client.read_until, lambda: 3 in client.ended)
    assert client.bodies[3] == REWRITTEN
    assert len(client.bodies[1]) == 65535 and 1 not in client.ended
    before = worker_cpu_seconds(child)
    yield task.deferLater(reactor, 2.0, lambda: None)
    used = worker_cpu_seconds(child) - before
    assert used < 0.3, f"the worker used {used:.2f} s of CPU in 2 s with a stalled stream"
    # Opening the window lets the rest through, whole.
    client.stalled.discard(1)
    client.sock.sendall(WindowUpdateFrame(1, window_increment=len(big)).serialize())
    yield threads.deferToThread(client.read_until, lambda: 1 in client.ended)
    assert client.bodies[1] == big.replace(b"www.origin.test", b"clone.test")


@pytest_twisted.inlineCallbacks
def test_rapid_reset_flood(cleanup: Cleanups) -> Any:
    """1000 streams opened and reset at once: GOAWAY ENHANCE_YOUR_CALM and
    the connection closed; the worker serves the next connection."""
    child, port, origin, config = yield start_held(cleanup, {b"/r": [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]})
    client = RawH2(port)
    cleanup(client.close)
    flood = b""
    for i in range(1000):
        flood += client.request(1 + 2 * i, "/r", send=False) + RstStreamFrame(1 + 2 * i, error_code=8).serialize()
    client.sock.sendall(flood)
    yield threads.deferToThread(client.read_until, lambda: False)
    assert client.goaway is not None and client.goaway.error_code == 11  # ENHANCE_YOUR_CALM
    assert client.closed
    again = RawH2(port)
    cleanup(again.close)
    again.request(1, "/r")
    yield threads.deferToThread(again.read_until, lambda: 1 in again.ended)
    assert again.bodies[1] == b"ok"


@pytest_twisted.inlineCallbacks
def test_reload_goaway_lets_the_stream_finish(cleanup: Cleanups) -> Any:
    """A reload that starts a new generation of workers (here: a new
    [http2] idle_timeout) while stream 1 waits for its origin: the old
    worker sends GOAWAY (NO_ERROR, last stream 1), stream 1 still gets its
    whole answer, then the connection closes; a new connection is served
    by the new worker."""
    go = threading.Event()
    head, rest = chunked_html(PAGE)
    child, port, origin, config = yield start_held(cleanup, {b"/held": [head, go, rest], b"/next": [head, rest]})
    client = RawH2(port)
    cleanup(client.close)
    client.request(1, "/held")
    yield threads.deferToThread(origin.arrived[b"/held"].wait, 10)
    config.write_text(config.read_text().replace("[sites.t]", "[http2]\nidle_timeout = 60\n[sites.t]"))
    reloaded = child.notified("READY=1")
    os.kill(child.process.pid, signal.SIGHUP)
    yield reloaded
    yield threads.deferToThread(client.read_until, lambda: client.goaway is not None)
    assert (client.goaway.error_code, client.goaway.last_stream_id) == (0, 1)
    assert 1 not in client.ended
    go.set()
    yield threads.deferToThread(client.read_until, lambda: client.closed)
    assert client.bodies[1] == REWRITTEN and 1 in client.ended
    fresh = RawH2(port)
    cleanup(fresh.close)
    fresh.request(1, "/next")
    yield threads.deferToThread(fresh.read_until, lambda: 1 in fresh.ended)
    assert fresh.bodies[1] == REWRITTEN


@pytest_twisted.inlineCallbacks
def test_h2c_prior_knowledge(cleanup: Cleanups) -> Any:
    """A cleartext listener named in ``h2c_listen`` serves HTTP/2 with prior
    knowledge (a raw client and curl --http2-prior-knowledge) and
    HTTP/1.1."""
    origin = HeldOrigin({b"/c": [b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nh2c"] * 1})
    cleanup(origin.close)
    d = Path(scratch_dir("prexy-h2c-"))
    port = free_port()
    (d / "prexy.toml").write_text(
        f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\nh2c_listen = ["tcp:{port}:interface=127.0.0.1"]\n'
        f'workers = 1\naccess_log = "off"\n[sites.t]\nupstream = "http://127.0.0.1:{origin.port}"\n'
    )
    child = Twistd("--config", str(d / "prexy.toml"))
    cleanup(child.stop)
    yield child.ready()
    client = RawH2(port, tls_alpn=False)
    cleanup(client.close)
    client.request(1, "/c")
    yield threads.deferToThread(client.read_until, lambda: 1 in client.ended)
    assert (client.heads[1][b":status"], client.bodies[1]) == (b"200", b"h2c")

    def plain() -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"GET /c HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

    data = yield threads.deferToThread(plain)
    assert data.startswith(b"HTTP/1.1 200") and data.endswith(b"h2c")
    if shutil.which("curl"):
        done = yield threads.deferToThread(
            subprocess.run, ["curl", "-s", "--http2-prior-knowledge", "-w", " %{http_version}",
                             f"http://127.0.0.1:{port}/c"], capture_output=True, timeout=30)
        assert done.stdout == b"h2c 2", done


@pytest_twisted.inlineCallbacks
def test_reload_in_place_keeps_the_connection(cleanup: Cleanups) -> Any:
    """A reload that changes only the site's rules happens in the running
    worker: the HTTP/2 connection gets no GOAWAY and its next stream is
    rewritten by the new rules."""
    head, rest = chunked_html(PAGE)
    child, port, origin, config = yield start_held(cleanup, {b"/a": [head, rest], b"/b": [head, rest]})
    client = RawH2(port)
    cleanup(client.close)
    client.request(1, "/a")
    yield threads.deferToThread(client.read_until, lambda: 1 in client.ended)
    assert client.bodies[1] == REWRITTEN
    rules = config.parent / "site.rules"
    rules.write_text("replace_filter 'www\\.origin\\.test' 'other.test' g;\n")
    reloaded = child.notified("READY=1")
    os.kill(child.process.pid, signal.SIGHUP)
    yield reloaded
    client.request(3, "/b")
    yield threads.deferToThread(client.read_until, lambda: 3 in client.ended)
    assert client.bodies[3] == PAGE.replace(b"www.origin.test", b"other.test")
    assert client.goaway is None and not client.closed
