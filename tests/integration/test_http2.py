"""HTTP/2 through ``twistd prexy`` (``[server] http2 = true``) on a TLS
listener: the ``h2`` library as the client over a real TLS socket with
ALPN, and curl --http2.

Proves: a client offering h2 gets HTTP/2 and a client offering only
http/1.1 gets HTTP/1.1 on the same listener; the rewritten page, its
compression and cache hits are the same bytes over both; several streams
on one connection.
"""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
import pytest_twisted
from twisted.internet import defer, threads

from .conftest import Cleanups
from .test_headerrules_nginx import self_signed
from .test_rfc_cache import ScriptedOrigin
from .twistd_support import Twistd, free_port

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
def start(cleanup: Cleanups, origin: ScriptedOrigin) -> Any:
    d = Path(tempfile.mkdtemp(prefix="prexy-h2-"))
    self_signed(d)
    (d / "site.rules").write_text("replace_filter 'www\\.origin\\.test' 'clone.test' g;\n")
    port = free_port()
    (d / "prexy.toml").write_text(
        f'[server]\nlisten = ["ssl:{port}:interface=127.0.0.1"]\nworkers = 1\nhttp2 = true\n'
        f'tls_certificate = "{d}/cert.pem"\ntls_key = "{d}/key.pem"\naccess_log = "-"\n'
        f'[cache]\nsize = "16M"\npath = "{d}/store"\n'
        f'[sites.t]\nupstream = "http://127.0.0.1:{origin.port}"\nrules = ["{d}/site.rules"]\n'
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
    out = tempfile.mktemp()

    def run() -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            ["curl", "-sk", "--http2", "-o", out, "-w", "%{http_version} %{http_code}",
             f"https://127.0.0.1:{port}/c"], capture_output=True, timeout=30, env=dict(os.environ))

    done = yield threads.deferToThread(run)
    assert done.stdout == b"2 200", done
    with open(out, "rb") as f:
        assert f.read() == REWRITTEN
