"""WebSocket tunnels through ``twistd prexy``: a real WebSocket origin (the
``websockets`` package's server, in a thread) and a real WebSocket client
(the same package's, in the reactor's thread pool), real loopback sockets.

Proves: messages both ways, large ones too, byte for byte; the origin's
close and the client's close reach the other side; a non-101 answer is an
ordinary response; a site whose ``upgrade`` is empty forwards the request
without ``Upgrade``; an idle tunnel is closed after ``tunnel_idle``; every
tunnel is counted, and logged once with its bytes.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, threads
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.sync.server import serve

from .conftest import Cleanups
from .twistd_support import Twistd, free_port, scratch_dir


class WsOrigin:
    """A WebSocket server on loopback: ``/echo`` echoes every message,
    ``/bye`` sends one message and closes, ``/big`` sends 4 MiB in 64 KiB
    messages, ``/forbidden`` refuses the handshake with a 403.  It
    remembers the request headers of every handshake."""

    def __init__(self) -> None:
        self.handshakes: list[dict[str, str]] = []
        self.server = serve(self.handler, "127.0.0.1", 0, process_request=self.check, max_size=None)
        self.port = self.server.socket.getsockname()[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def check(self, connection: Any, request: Any) -> Any:
        self.handshakes.append({k.lower(): v for k, v in request.headers.raw_items()})
        if request.path == "/forbidden":
            return connection.respond(403, "no tunnels here\n")
        return None

    def handler(self, ws: Any) -> None:
        path = ws.request.path
        if path == "/echo":
            for message in ws:
                ws.send(message)
        elif path == "/bye":
            ws.send("bye")
            ws.close()
        elif path == "/big":
            chunk = bytes(range(256)) * 256
            for _ in range(64):
                ws.send(chunk)
            ws.recv()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(5)


@pytest.fixture
def ws_origin() -> Iterator[WsOrigin]:
    origin = WsOrigin()
    yield origin
    origin.stop()


@defer.inlineCallbacks
def start_prexy(cleanup: Cleanups, origin: WsOrigin, extra: str = "", site_extra: str = "") -> Any:
    port = free_port()
    directory = scratch_dir("prexy-ws-")
    config = os.path.join(directory, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f'[server]\nlisten = ["tcp:{port}:interface=127.0.0.1"]\nworkers = 1\n'
            f"{extra}\n"
            f'[sites.ws]\nupstream = "http://127.0.0.1:{origin.port}"\n{site_extra}'
        )
    child = Twistd("--config", config)
    cleanup(child.stop)
    yield child.ready()
    return child, port


def in_thread(f: Any, *args: Any) -> Any:
    return threads.deferToThread(f, *args)


@pytest_twisted.inlineCallbacks
def test_echo_both_ways(cleanup: Cleanups, ws_origin: WsOrigin) -> Any:
    """Text and binary messages, small and 1 MiB, come back byte for byte;
    the origin saw the client's WebSocket headers."""
    child, port = yield start_prexy(cleanup, ws_origin)

    def talk() -> list[Any]:
        big = os.urandom(1 << 20)
        with connect(f"ws://127.0.0.1:{port}/echo", max_size=None) as ws:
            out = []
            for message in ("hello", b"\x00\xffbinary", big, "é" * 1000):
                ws.send(message)
                out.append(ws.recv() == message)
            return out

    results = yield in_thread(talk)
    assert results == [True, True, True, True]
    handshake = ws_origin.handshakes[-1]
    assert handshake["upgrade"].lower() == "websocket"
    assert "upgrade" in handshake["connection"].lower()
    assert "sec-websocket-key" in handshake and handshake["sec-websocket-version"] == "13"
    assert "x-forwarded-for" in handshake


@pytest_twisted.inlineCallbacks
def test_origin_close_reaches_the_client(cleanup: Cleanups, ws_origin: WsOrigin) -> Any:
    """The origin's close frame and its close of the connection reach the
    client; the tunnel is logged once, closed by the upstream."""
    child, port = yield start_prexy(cleanup, ws_origin)

    def talk() -> tuple[str, bool]:
        with connect(f"ws://127.0.0.1:{port}/bye") as ws:
            first = ws.recv()
            try:
                ws.recv()
            except ConnectionClosed as exc:
                return first, exc.rcvd is not None and exc.rcvd.code == 1000
            return first, False

    first, clean = yield in_thread(talk)
    assert (first, clean) == ("bye", True)
    lines = [line for line in child.output().splitlines() if "tunnel /bye closed" in line]
    assert len(lines) == 1, child.output()
    assert "closed by upstream" in lines[0]


@pytest_twisted.inlineCallbacks
def test_large_download_with_backpressure(cleanup: Cleanups, ws_origin: WsOrigin) -> Any:
    """4 MiB from the origin arrive whole and in order at a client that
    reads them one by one."""
    child, port = yield start_prexy(cleanup, ws_origin)

    def talk() -> bool:
        chunk = bytes(range(256)) * 256
        with connect(f"ws://127.0.0.1:{port}/big", max_size=None, max_queue=1) as ws:
            ok = all(ws.recv() == chunk for _ in range(64))
            ws.send("done")
            return ok

    assert (yield in_thread(talk))


@pytest_twisted.inlineCallbacks
def test_refused_handshake_is_an_ordinary_response(cleanup: Cleanups, ws_origin: WsOrigin) -> Any:
    """A non-101 answer to an upgrade request reaches the client as it is."""
    child, port = yield start_prexy(cleanup, ws_origin)

    def talk() -> tuple[int, bytes]:
        try:
            connect(f"ws://127.0.0.1:{port}/forbidden")
        except InvalidStatus as exc:
            return exc.response.status_code, exc.response.body
        return 0, b""

    status, body = yield in_thread(talk)
    assert status == 403
    assert body == b"no tunnels here\n"


@pytest_twisted.inlineCallbacks
def test_site_without_upgrades_forwards_no_upgrade(cleanup: Cleanups, ws_origin: WsOrigin) -> Any:
    """With ``upgrade = []`` the request reaches the origin without
    ``Upgrade``, as an ordinary GET, so the handshake fails."""
    child, port = yield start_prexy(cleanup, ws_origin, site_extra="upgrade = []\n")

    def talk() -> int:
        try:
            connect(f"ws://127.0.0.1:{port}/echo")
        except InvalidStatus as exc:
            return int(exc.response.status_code)
        return 101

    status = yield in_thread(talk)
    assert status == 426  # the origin's Upgrade Required: it saw no Upgrade
    assert "upgrade" not in ws_origin.handshakes[-1]


@pytest_twisted.inlineCallbacks
def test_idle_tunnel_is_closed(cleanup: Cleanups, ws_origin: WsOrigin) -> Any:
    """No byte either way for ``tunnel_idle`` seconds closes the tunnel."""
    child, port = yield start_prexy(cleanup, ws_origin, "[timeouts]\ntunnel_idle = 0.5\n")

    def talk() -> bool:
        with connect(f"ws://127.0.0.1:{port}/echo", ping_interval=None) as ws:
            ws.send("x")
            assert ws.recv() == "x"
            try:
                ws.recv(timeout=10)
            except ConnectionClosed:
                return True
            except TimeoutError:
                return False
            return False

    assert (yield in_thread(talk))
    lines = [line for line in child.output().splitlines() if "tunnel /echo closed" in line]
    assert lines and "closed by idle" in lines[0], child.output()
