"""The WebSocket tunnel figures, Prexy beside nginx in one run.

A WebSocket origin in this process (asyncio, one thread) answers the
handshake with a real ``101`` and then, by path: ``/blast`` sends bytes as
fast as the socket takes them, ``/echo`` sends back what it reads,
``/idle`` holds the connection.  The clients speak raw sockets after the
handshake (the tunnel carries bytes, not frames), so what is measured is
the proxy and not a WebSocket library.  nginx is Debian's, configured as
its documentation says for WebSocket proxying (``proxy_http_version 1.1``,
``Upgrade``/``Connection`` headers).

- throughput: MB/s from ``/blast`` through one tunnel, medians of
  interleaved runs;
- echo: round trips of a 64-byte message, sequential; p50 and p99, and
  what the proxy adds to the p99 of a direct connection;
- idle: RSS growth of the proxy's processes with 1,000 open, quiet tunnels.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import socket
import statistics
import threading
import time

import harness
import servers
from harness import LOCAL, markdown_table
from scenarios import Bench, Report, rss_mb, target

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
BLAST = b"\x82\x7e\xff\xff" + bytes(range(256)) * 256  # one 64 KiB binary frame per write, repeated


class WsOrigin:
    """The origin described in the module docstring, on its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, LOCAL, 0, backlog=4096, limit=1 << 20))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            key = b""
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"sec-websocket-key:"):
                    key = line.split(b":", 1)[1].strip()
            accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n")
            if path == b"/blast":
                while True:
                    writer.write(BLAST)
                    await writer.drain()
            elif path == b"/echo":
                while True:
                    data = await reader.read(65536)
                    if not data:
                        break
                    writer.write(data)
            else:
                await reader.read()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    def stop(self) -> None:
        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop)
        self.thread.join(5)


def handshake(port: int, path: str, timeout: float = 10.0) -> tuple[socket.socket, bytes]:
    """A connected socket past the 101 head, and the bytes read after it."""
    sock = socket.create_connection((LOCAL, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                 "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            raise RuntimeError(f"closed during the handshake: {data[:200]!r}")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise RuntimeError(f"no 101: {head[:200]!r}")
    return sock, rest


def throughput(port: int, seconds: float) -> float:
    """MB/s read from /blast through ``port`` for ``seconds``."""
    sock, rest = handshake(port, "/blast")
    got = len(rest)
    buf = bytearray(1 << 20)
    start = time.monotonic()
    end = start + seconds
    try:
        while time.monotonic() < end:
            n = sock.recv_into(buf)
            if not n:
                raise RuntimeError("the tunnel closed mid-run")
            got += n
    finally:
        sock.close()
    return got / (time.monotonic() - start) / 1e6


def echo_times(port: int, count: int) -> list[float]:
    """Seconds per round trip of a 64-byte message through /echo."""
    sock, _ = handshake(port, "/echo")
    message = b"\x81\x3e" + b"m" * 62
    times = []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            sock.sendall(message)
            left = len(message)
            while left:
                n = len(sock.recv(65536))
                if not n:
                    raise RuntimeError("the tunnel closed mid-run")
                left -= n
            times.append(time.perf_counter() - t0)
    finally:
        sock.close()
    return times


def idle_rss(server: servers.Server, count: int) -> tuple[float, int]:
    """RSS growth (MB) of ``server`` with ``count`` quiet tunnels open, and
    how many opened."""
    before = rss_mb(server)
    socks = []
    try:
        for _ in range(count):
            sock, _ = handshake(server.port, "/idle")
            socks.append(sock)
        time.sleep(0.5)  # bench only: let the proxy settle before reading /proc
        return rss_mb(server) - before, len(socks)
    finally:
        for sock in socks:
            sock.close()


def _p(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def scenario_tunnel(bench: Bench) -> Report:
    """Through one tunnel: MB/s, echo latency, 1,000 idle tunnels' memory."""
    s = bench.settings
    notes: list[str] = []
    origin = WsOrigin()
    nginx = servers.start_nginx("nginx-ws", f"""        location / {{
            proxy_pass http://{LOCAL}:{origin.port};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout 3600s;
            proxy_buffering off;
        }}
""")
    install = bench.prexy()
    if install is None:
        raise RuntimeError(bench.install_error)
    prexy = servers.start_prexy_config(install, "prexy-ws", f"""[server]
listen = ["tcp:{{port}}:interface={LOCAL}"]
access_log = "off"
[timeouts]
tunnel_idle = 3600
[sites.ws]
upstream = "http://{LOCAL}:{origin.port}"
""")
    try:
        seconds = 2.0 if s.quick else 5.0
        rounds = 3 if s.quick else 5
        mbps: dict[str, list[float]] = {"direct": [], "nginx": [], "prexy": []}
        ports = {"direct": origin.port, "nginx": nginx.port, "prexy": prexy.port}
        for r in range(rounds):
            order = list(ports) if r % 2 == 0 else list(reversed(ports))
            for name in order:
                mbps[name].append(throughput(ports[name], seconds))
        count = 2000 if s.quick else 5000
        echo: dict[str, list[float]] = {name: [] for name in ports}
        for r in range(rounds):
            order = list(ports) if r % 2 == 0 else list(reversed(ports))
            for name in order:
                echo[name] += echo_times(ports[name], count // rounds)
        idle = {}
        for name, server in (("nginx", nginx), ("prexy", prexy)):
            idle[name] = idle_rss(server, 1000)
    finally:
        nginx.stop()
        prexy.stop()
        origin.stop()

    med = {name: statistics.median(v) for name, v in mbps.items()}
    p50 = {name: _p(v, 0.50) * 1e3 for name, v in echo.items()}
    p99 = {name: _p(v, 0.99) * 1e3 for name, v in echo.items()}
    rows = [
        [f"one tunnel, MB/s (median of {rounds})", f"{med['direct']:.0f}", f"{med['nginx']:.0f}",
         f"{med['prexy']:.0f}", f"{med['prexy'] / med['nginx']:.2f}x"],
        ["echo p50, ms", f"{p50['direct']:.3f}", f"{p50['nginx']:.3f}", f"{p50['prexy']:.3f}",
         f"{p50['prexy'] / p50['nginx']:.2f}x"],
        ["echo p99, ms", f"{p99['direct']:.3f}", f"{p99['nginx']:.3f}", f"{p99['prexy']:.3f}",
         f"{p99['prexy'] / p99['nginx']:.2f}x"],
        ["1,000 idle tunnels, RSS growth MB", "-", f"{idle['nginx'][0]:.1f}", f"{idle['prexy'][0]:.1f}",
         "-"],
    ]
    table = markdown_table(["", "direct", "nginx", "Prexy", "Prexy / nginx"], rows)
    added = p99["prexy"] - p99["direct"]
    targets = [
        target(f"one tunnel at least 50 MB/s: {med['prexy']:.0f} MB/s", med["prexy"] >= 50),
        target(f"echo p99 under 1 ms added: {added:.3f} ms over direct", added < 1.0),
        target(f"1,000 idle tunnels under 100 MB RSS: {idle['prexy'][0]:.1f} MB "
               f"({idle['prexy'][1]} opened)", idle["prexy"][0] < 100 and idle["prexy"][1] == 1000),
    ]
    notes.append(f"{rounds} interleaved rounds of {seconds:.0f} s per server for MB/s; "
                 f"{count // rounds * rounds} echo round trips each; one Prexy worker, one nginx worker.")
    harness.log(f"tunnel: {med} p99 {p99}")
    return Report("WebSocket tunnel", table, notes,
                  {"mbps": mbps, "p50_ms": p50, "p99_ms": p99, "idle_mb": idle}, targets)
