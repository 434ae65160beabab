"""A soak under faults: two Prexy nodes, a day of production in half an hour.

Two ``twistd -n prexy`` nodes (two workers each, a cache store each) share
a ``[cluster]`` Redis (a ``redis-server`` child) in front of one loopback
origin (this file run with ``--serve-origin``, its own process).  For
``--duration`` seconds (30 minutes by default) a client in this process
sends traffic at a steady rate while faults are injected, and checks every
answer:

- traffic: a page-view mix over HTTP/1.1 (keep-alive) and HTTP/2 (h2c with
  prior knowledge): rewritten HTML pages (cached, not cached, compressed by
  the origin, two of 1 MB and more), binary assets passed through (some
  asked for with a byte range), large bodies (1-4 MB, some read slowly,
  some dropped by the client mid-body), request bodies (POST, hashed by the
  origin), WebSocket tunnels (echo), PURGEs and bans sent to one node and
  checked on both;
- faults: a rules change and reload every ``--reload-every`` seconds, a
  worker killed with SIGKILL every ``--kill-every`` seconds (the youngest
  worker of each node in turn, so each node keeps one worker from the
  start: the long-lived worker whose memory matters), the origin failing
  5% of requests (a 500, or a connection reset) and stalling 1% (past the
  site's ``first_byte`` timeout), Redis stopped and started every
  ``--redis-every`` seconds.

The client chooses the faults: a faulted request carries ``fault=KIND`` and a
nonce in its query (so the cache never shares it with another request), and
its expected answer is known (500 passed through, 502 for a reset, 504 for a
stall).  Every completed body is compared with what it must be: a page
rewritten by the rules in force when the request started (the rules file
names a generation that the rewrite writes into the page; a request that
started during a reload may carry either generation), binary bodies byte for
byte, a range as the slice of its object, a POST's digest, a tunnel's echo.

The invariants are printed as a table at the end (value, bound, held), and
the exit status is 0 only if every one held.  Memory is judged per process
from the end of its warm-up (for a worker: once its memos, which fill by
design, first hold 90% of the most they held) to the end of its life, as
medians of ``--window`` seconds.  ``--json FILE`` writes the table and the
samples (RSS, anonymous memory and descriptors per process over time, each
worker's memo bytes, latencies per minute, reload and kill timings, every
failure) for later analysis.  One progress line a minute goes to stderr.

    python bench/soak.py                          # 30 minutes
    python bench/soak.py --duration 120 --reload-every 20 --kill-every 30 \\
        --redis-every 50 --warmup 30 --window 15 --p99-window 40

Needs ``redis-server`` and the packages Prexy's tests use (h2).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

REPO_ROOT = Path(__file__).resolve().parents[1]
TWISTD = "import sys; sys.argv[0] = 'twistd'; from twisted.scripts.twistd import run; run()"
HOST = "soak.test"
SITE = "soak"
#: The site's first_byte timeout; a stalled origin answer waits longer.
FIRST_BYTE = 2.0
STALL = FIRST_BYTE + 4.0
#: Descriptors a process may hold above its floor after warm-up before that
#: counts as growth, when 10% is less: its pooled upstream connections and
#: the client's keep-alive connections come and go.
FD_SLACK = 4
#: A worker is warm once its memos hold this share of the most they held.
MEMO_WARM = 0.9
MB = 1 << 20
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# -- the site's content ------------------------------------------------------------------

WORDS = (
    "lorem ipsum dolor sit amet shop sale price basket delivery widget review stock offer size "
    "colour brand return order summer winter shoes bags coats kids home garden gifts"
).split()
#: What the rules rewrite, scattered through every page.
MARKS = (
    "https://www.origin-shop.com/item",
    "SOAKGEN",
    "UA-31415926-2",
    "Widget",
    "//cdn.origin-shop.com/img.png",
    "help.origin-shop.com",
)
UA_RE = re.compile(rb"(UA-)\d+-\d+")

#: Page-view paths by kind: (prefix, count).
KINDS = {"p": 100, "np": 20, "gz": 50, "bin": 200, "big": 6, "pg": 0}
#: 1 MB objects fetched before the clock starts: more than the store holds.
FILL = 48


def _seed(path: str) -> int:
    return int(hashlib.sha256(path.encode()).hexdigest()[:12], 16)


def _html(path: str, size: int) -> bytes:
    rng = random.Random(_seed(path))
    parts = [f"<!doctype html><html><head><title>{path} SOAKGEN</title>"
             "<script>ga('create','UA-31415926-2','auto')</script></head><body>\n"]
    total = len(parts[0])
    while total < size:
        words = rng.choices(WORDS, k=40)
        words.insert(rng.randrange(40), rng.choice(MARKS))
        line = "<p>" + " ".join(words) + "</p>\n"
        parts.append(line)
        total += len(line)
    parts.append("<footer>SOAKGEN help.origin-shop.com</footer></body></html>\n")
    return "".join(parts).encode()


@lru_cache(maxsize=512)
def resource(path: str) -> tuple[str, str, bytes]:
    """The origin's answer for ``path`` (no query): content type,
    Cache-Control, body.  Deterministic: the client computes the same."""
    parts = path.strip("/").split("/")
    kind = parts[0]
    n = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    rng = random.Random(_seed(path))
    if kind in ("p", "gz", "np"):
        if kind == "p" and n < 2:
            size = 1_000_000 + 500_000 * n  # the large rewritten pages
        else:
            size = int(min(200_000, max(2_000, rng.lognormvariate(9.9, 0.8))))
        control = "no-store" if kind == "np" else "max-age=20"
        return "text/html; charset=utf-8", control, _html(path, size)
    if kind == "bin":
        size = int(min(120_000, max(500, rng.lognormvariate(9.6, 1.0))))
        return "image/png", "max-age=60", rng.randbytes(size)
    if kind == "big":
        return "application/octet-stream", "max-age=60", rng.randbytes(1_000_000 + 600_000 * n)
    if kind == "fill":  # only fetched before the clock starts, to fill the store
        return "application/octet-stream", "max-age=3600", rng.randbytes(1_000_000)
    if kind == "pg":
        return "text/plain", "max-age=3600", f"purge check {path}\n".encode() * 20
    if kind == "probe":
        return "text/html; charset=utf-8", "no-store", b"<html><head></head><body>SOAKGEN</body></html>\n"
    return "text/plain", "no-store", b"not found\n"


def rules_text(gen: int) -> str:
    """Generation ``gen``'s rules file: odd generations have one rule more."""
    lines = [
        f"# soak rules, generation {gen}",
        "replace_filter_types text/html;",
        r"replace_filter 'origin-shop\.com' 'clone-shop.nl' g;",
        f"replace_filter 'SOAKGEN' 'gen-{gen}' g;",
        r"replace_filter '(UA-)\d+-\d+' '${1}99999-9' g;",
    ]
    if gen % 2:
        lines.append("replace_filter 'Widget' 'Gadget' g;")
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=512)
def rewritten(path: str, gen: int) -> bytes:
    """What Prexy must answer for ``path`` under generation ``gen``."""
    ctype, _, body = resource(path)
    if not ctype.startswith("text/html"):
        return body
    out = body.replace(b"origin-shop.com", b"clone-shop.nl").replace(b"SOAKGEN", b"gen-%d" % gen)
    out = UA_RE.sub(rb"\g<1>99999-9", out)
    if gen % 2:
        out = out.replace(b"Widget", b"Gadget")
    return out


GEN_RE = re.compile(rb"gen-(\d+)")

# -- the origin (its own process) ----------------------------------------------------------


class Origin:
    """A loopback HTTP/1.1 origin on asyncio: keep-alive, ranges, gzip for
    ``/gz/``, POST digests on ``/echo``, a WebSocket echo on ``/ws``, and
    the faults a request's query asks for."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await self._body(reader, headers)
                if not await self._answer(method, target, headers, body, reader, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        except asyncio.CancelledError:  # the origin stops: a stalled answer ends here
            return
        finally:
            writer.close()

    async def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            return await reader.readexactly(int(headers["content-length"]))
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    return bytes(out)
                out += await reader.readexactly(size)
                await reader.readexactly(2)
        return b""

    async def _answer(self, method: str, target: str, headers: dict[str, str], body: bytes,
                      reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        url = urlsplit(target)
        query = parse_qs(url.query)
        fault = query.get("fault", [""])[0]
        self.count(fault or "ok")
        if fault == "reset":
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            return False
        if fault == "stall":
            await asyncio.sleep(STALL)
            return False
        if fault == "500":
            self._send(writer, 500, [("Content-Type", "text/plain"), ("Cache-Control", "no-store")],
                       b"origin fault\n")
            await writer.drain()
            return True
        if url.path == "/ws" and headers.get("upgrade", "").lower() == "websocket":
            await self._websocket(headers, reader, writer)
            return False
        if url.path == "/echo":
            digest = hashlib.sha256(body).hexdigest().encode()
            self._send(writer, 200, [("Content-Type", "text/plain"), ("Cache-Control", "no-store")],
                       digest + b" %d\n" % len(body))
            await writer.drain()
            return True
        ctype, control, data = resource(url.path)
        fields = [("Content-Type", ctype), ("Cache-Control", control)]
        status = 200
        if url.path.startswith("/gz/") and "gzip" in headers.get("accept-encoding", ""):
            data = _gzipped(url.path)
            fields += [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]
        elif "range" in headers and url.path.startswith(("/bin/", "/big/")):
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", headers["range"])
            if m:
                start = int(m.group(1))
                end = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                if start <= end:
                    fields.append(("Content-Range", f"bytes {start}-{end}/{len(data)}"))
                    data, status = data[start:end + 1], 206
        fields.append(("Accept-Ranges", "bytes"))
        self._send(writer, status, fields, b"" if method == "HEAD" else data)
        await writer.drain()
        return True

    def _send(self, writer: asyncio.StreamWriter, status: int, fields: list[tuple[str, str]], body: bytes) -> None:
        reason = {200: "OK", 206: "Partial Content", 500: "Internal Server Error"}.get(status, "X")
        head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields)
        head += f"Content-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode("latin-1") + body)

    async def _websocket(self, headers: dict[str, str], reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        key = headers.get("sec-websocket-key", "").encode()
        accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest()).decode()
        writer.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode())
        while True:
            opcode, payload = await read_frame(reader)
            if opcode == 8:
                writer.write(frame(8, payload[:2], mask=False))
                await writer.drain()
                return
            if opcode in (1, 2):
                writer.write(frame(opcode, payload, mask=False))
                await writer.drain()


@lru_cache(maxsize=128)
def _gzipped(path: str) -> bytes:
    return gzip.compress(resource(path)[2], 5)


def frame(opcode: int, payload: bytes, mask: bool = True) -> bytes:
    """One WebSocket frame (FIN set), masked when a client sends it."""
    head = bytes([0x80 | opcode])
    n = len(payload)
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([bit | 127]) + struct.pack(">Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    masked = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return head + key + masked


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await reader.readexactly(2)
    n = b1 & 0x7F
    if n == 126:
        (n,) = struct.unpack(">H", await reader.readexactly(2))
    elif n == 127:
        (n,) = struct.unpack(">Q", await reader.readexactly(8))
    key = await reader.readexactly(4) if b1 & 0x80 else None
    payload = await reader.readexactly(n)
    if key:
        payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return b0 & 0x0F, payload


def serve_origin(port: int, stats_path: str | None) -> None:
    """The origin process: serve on 127.0.0.1:``port`` until SIGTERM."""
    origin = Origin()

    async def main() -> None:
        server = await asyncio.start_server(origin.serve, "127.0.0.1", port, reuse_address=True, limit=1 << 20)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        print("origin ready", flush=True)
        await stop.wait()
        server.close()
        if stats_path:
            Path(stats_path).write_text(json.dumps(origin.counts))

    asyncio.run(main())


# -- the clients ------------------------------------------------------------------------------


class Failed(Exception):
    """A request that got no complete answer: ``got_any`` when some of the
    answer had arrived."""

    def __init__(self, why: str, got_any: bool) -> None:
        super().__init__(why)
        self.why = why
        self.got_any = got_any


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class H1Pool:
    """HTTP/1.1 keep-alive connections to one port."""

    def __init__(self, port: int, keep: int = 6) -> None:
        self.port = port
        self.keep = keep
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.retried = 0

    async def connect(self, rcvbuf: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", self.port))
        except OSError as exc:
            sock.close()
            raise Failed(f"connect: {exc!r}", False) from None
        return await asyncio.open_connection(sock=sock, limit=1 << 16)

    async def request(self, method: str, target: str, headers: Iterable[tuple[str, str]] = (),
                      body: bytes | None = None, *, fresh: bool = False, slow: float = 0.0,
                      drop_after: int | None = None) -> Answer:
        """One exchange.  A reused connection that fails before any byte of
        the answer is retried once on a new one (as browsers do, RFC 9112
        9.3.1); ``slow`` reads at that many bytes a second from a small
        receive buffer; ``drop_after`` closes the connection after that many
        body bytes (the answer is then returned incomplete)."""
        reused = bool(self.idle) and not fresh and not slow and drop_after is None
        conn = self.idle.pop() if reused else await self.connect(16384 if slow else None)
        try:
            return await self._exchange(conn, method, target, headers, body, slow, drop_after)
        except Failed as exc:
            conn[1].close()
            if reused and not exc.got_any and method in ("GET", "HEAD", "PURGE"):
                self.retried += 1
                return await self._exchange(await self.connect(), method, target, headers, body, 0.0, None)
            raise

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], method: str,
                        target: str, headers: Iterable[tuple[str, str]], body: bytes | None,
                        slow: float, drop_after: int | None) -> Answer:
        reader, writer = conn
        head = f"{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers)
        if body is not None:
            head += f"Content-Length: {len(body)}\r\n"
        got_any = False
        try:
            writer.write(head.encode() + b"\r\n" + (body or b""))
            await writer.drain()
            while True:
                raw = await reader.readuntil(b"\r\n\r\n")
                got_any = True
                status = int(raw[9:12])
                if status >= 200 or status == 101:
                    break
            fields: dict[str, str] = {}
            for line in raw.decode("latin-1").split("\r\n")[1:]:
                if ":" in line:
                    name, _, value = line.partition(":")
                    fields[name.strip().lower()] = value.strip()
            if status == 101:
                return Answer(status, fields, b"")
            data = bytearray()
            limit = drop_after if drop_after is not None else None
            if method == "HEAD" or status in (204, 304):
                pass
            elif "chunked" in fields.get("transfer-encoding", "").lower():
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        while (await reader.readuntil(b"\r\n")) != b"\r\n":
                            pass
                        break
                    data += await self._read(reader, size, slow)
                    await reader.readexactly(2)
                    if limit is not None and len(data) >= limit:
                        break
            elif "content-length" in fields:
                left = int(fields["content-length"])
                while left:
                    piece = await self._read(reader, min(left, 1 << 16 if not slow else 8192), slow)
                    data += piece
                    left -= len(piece)
                    if limit is not None and len(data) >= limit:
                        break
            else:
                while chunk := await reader.read(1 << 16):
                    data += chunk
                writer.close()
                return Answer(status, fields, bytes(data))
        except (asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.LimitOverrunError, ValueError) as exc:
            raise Failed(f"{type(exc).__name__}: {exc}"[:200], got_any) from None
        if drop_after is not None or "close" in fields.get("connection", "").lower():
            writer.close()
        elif len(self.idle) < self.keep:
            self.idle.append(conn)
        else:
            writer.close()
        return Answer(status, fields, bytes(data))

    @staticmethod
    async def _read(reader: asyncio.StreamReader, n: int, slow: float) -> bytes:
        if not slow:
            return await reader.readexactly(n)
        out = bytearray()
        while len(out) < n:
            piece = await reader.readexactly(min(8192, n - len(out)))
            out += piece
            await asyncio.sleep(len(piece) / slow)
        return bytes(out)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class H2Conn:
    """One HTTP/2 connection (h2c, prior knowledge) with concurrent streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import h2.config
        import h2.connection

        self.reader, self.writer = reader, writer
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(1 << 24)
        self.writer.write(self.h2.data_to_send())
        self.streams: dict[int, tuple[asyncio.Future[Answer], dict[str, str], bytearray]] = {}
        self.closed = False
        self.used = False
        self.task = asyncio.get_running_loop().create_task(self._read())

    async def request(self, path: str, headers: Iterable[tuple[str, str]]) -> Answer:
        if self.closed:
            raise Failed("connection closed", False)
        self.used = True
        sid = self.h2.get_next_available_stream_id()
        fut: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self.streams[sid] = (fut, {}, bytearray())
        fields = [(b":method", b"GET"), (b":scheme", b"http"), (b":authority", HOST.encode()),
                  (b":path", path.encode())] + [(k.lower().encode(), v.encode()) for k, v in headers]
        self.h2.send_headers(sid, fields, end_stream=True)
        self.h2.increment_flow_control_window(1 << 22, stream_id=sid)
        self.writer.write(self.h2.data_to_send())
        return await fut

    async def _read(self) -> None:
        import h2.events
        import h2.exceptions

        why = "EOF"
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    break
                for ev in self.h2.receive_data(data):
                    if isinstance(ev, h2.events.ResponseReceived):
                        st = self.streams.get(ev.stream_id)
                        if st:
                            st[1].update((k.decode().lower(), v.decode("latin-1")) for k, v in ev.headers)
                    elif isinstance(ev, h2.events.DataReceived):
                        st = self.streams.get(ev.stream_id)
                        if st:
                            st[2].extend(ev.data)
                        self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded):
                        st = self.streams.pop(ev.stream_id, None)
                        if st and not st[0].done():
                            st[0].set_result(Answer(int(st[1].get(":status", "0")), st[1], bytes(st[2])))
                    elif isinstance(ev, h2.events.StreamReset):
                        st = self.streams.pop(ev.stream_id, None)
                        if st and not st[0].done():
                            st[0].set_exception(Failed(f"RST_STREAM {ev.error_code!r}", bool(st[1])))
                    elif isinstance(ev, h2.events.ConnectionTerminated):
                        why = f"GOAWAY {ev.error_code!r} last={ev.last_stream_id}"
                        for sid in [s for s in self.streams if s > (ev.last_stream_id or 0)]:
                            fut, fields, _ = self.streams.pop(sid)
                            if not fut.done():
                                fut.set_exception(Failed(why + " (not processed)", False))
                out = self.h2.data_to_send()
                if out:
                    self.writer.write(out)
        except (ConnectionError, OSError, h2.exceptions.ProtocolError) as exc:
            why = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            self.closed = True
            for fut, fields, _ in self.streams.values():
                if not fut.done():
                    fut.set_exception(Failed(why, bool(fields)))
            self.streams.clear()
            self.writer.close()


class H2Client:
    """HTTP/2 to one port: one connection, reopened when it ends; a request
    refused before any answer on a connection that had served others is
    retried once on a new one."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: H2Conn | None = None
        self.retried = 0
        self._opening: asyncio.Future[H2Conn] | None = None

    async def _get(self) -> H2Conn:
        if self.conn is not None and not self.conn.closed:
            return self.conn
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_future()
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=1 << 16)
                self.conn = H2Conn(reader, writer)
                self._opening.set_result(self.conn)
            except OSError as exc:
                self._opening.set_exception(Failed(f"connect: {exc!r}", False))
                self._opening.exception()
            finally:
                opening, self._opening = self._opening, None
            return opening.result()
        return await asyncio.shield(self._opening)

    async def request(self, path: str, headers: Iterable[tuple[str, str]] = ()) -> Answer:
        conn = await self._get()
        reused = conn.used
        try:
            return await conn.request(path, headers)
        except Failed as exc:
            if reused and not exc.got_any:
                self.retried += 1
                return await (await self._get()).request(path, headers)
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.writer.close()


# -- the children -----------------------------------------------------------------------------


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def proc_children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def proc_sample(pid: int) -> tuple[int, int, int, int] | None:
    """(RSS, anonymous, the cache store's map, in KiB; open descriptors) of
    ``pid``, None if gone.  The store's map (LMDB's ``data.mdb``, shared by a
    node's processes) is page cache: it grows as the process touches more of
    the file, up to the file's size (at most twice the store's size plus 64
    MB); the anonymous part is the heap."""
    try:
        rss = anon = 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
        store = 0
        with open(f"/proc/{pid}/smaps") as f:
            inside = False
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    inside = line.rstrip().endswith("/store/data.mdb")
                elif inside and line.startswith("Rss:"):
                    store += int(line.split()[1])
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return rss, anon, store, fds


def worker_slot(pid: int) -> int | None:
    """The slot of worker ``pid`` (from the spec on its command line), None if gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        return int(json.loads(args[args.index(b"prexy.worker") + 1])["slot"])
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        return None


def process_memo(metrics: str) -> dict[str, float]:
    """``prexy_process_memo_bytes`` by process label, from ``/metrics`` text."""
    out: dict[str, float] = {}
    for m in re.finditer(r'^prexy_process_memo_bytes\{process="([^"]+)"\} (\S+)$', metrics, re.M):
        out[m.group(1)] = float(m.group(2))
    return out


def proc_cpu(pid: int) -> float:
    """CPU seconds (user and system) ``pid`` has used, 0 if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def fd_kinds(pid: int) -> dict[str, int]:
    """What ``pid``'s descriptors are, counted by kind (socket, pipe, the
    store's files, other files, anon_inode:...): the last sample's go into
    the JSON, to tell what a growing count is made of."""
    kinds: dict[str, int] = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return kinds
    for fd in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith(("socket:", "pipe:")):
            kind = target.split(":", 1)[0]
        elif target.startswith("anon_inode:"):
            kind = target
        elif "/store" in target:
            kind = "store file"
        else:
            kind = "file"
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


def cpu_pressure() -> float:
    """Seconds some runnable task has waited for a CPU (Linux PSI), 0 without it."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().split("total=")[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def proc_start(pid: int) -> float:
    """Start of ``pid`` in seconds since boot (for telling pids apart)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


class Notify:
    """A NOTIFY_SOCKET: the datagrams a node's master sends (READY=1)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.setblocking(False)
        self.messages: list[tuple[float, str]] = []
        self.waiters: list[tuple[str, asyncio.Future[float]]] = []
        asyncio.get_running_loop().add_reader(self.sock.fileno(), self._read)

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            now = time.monotonic()
            message = data.decode("utf-8", "replace")
            self.messages.append((now, message))
            waiting, self.waiters = self.waiters, []
            for wanted, fut in waiting:
                if wanted in message.split("\n"):
                    if not fut.done():
                        fut.set_result(now)
                else:
                    self.waiters.append((wanted, fut))

    def next(self, wanted: str = "READY=1") -> asyncio.Future[float]:
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.waiters.append((wanted, fut))
        return fut

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()


@dataclass
class Node:
    name: str
    dir: Path
    http: int
    h2c: int
    admin: int
    process: subprocess.Popen[bytes] | None = None
    notify: Notify | None = None
    log_path: Path | None = None
    gen: int = 0
    #: (gen, may be in force from, may be in force until) per generation.
    gens: list[list[float]] = field(default_factory=list)
    pool: H1Pool | None = None
    h2: H2Client | None = None
    in_flight: set[int] = field(default_factory=set)

    def workers(self) -> list[int]:
        return proc_children(self.process.pid) if self.process else []


class Redis:
    def __init__(self, port: int, directory: Path) -> None:
        self.port = port
        self.dir = directory
        self.process: subprocess.Popen[bytes] | None = None
        self.log = open(directory / "redis.log", "ab")

    async def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--loglevel", "notice", "--dir", str(self.dir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        assert self.process.stdout is not None
        out = self.process.stdout
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        seen = bytearray()

        def readable() -> None:
            data = os.read(out.fileno(), 65536)
            self.log.write(data)
            self.log.flush()
            seen.extend(data)
            if not data:
                loop.remove_reader(out.fileno())
                if not ready.done():
                    ready.set_exception(RuntimeError(f"redis-server exited: {seen.decode(errors='replace')}"))
            elif b"Ready to accept connections" in seen and not ready.done():
                ready.set_result(None)

        loop.add_reader(out.fileno(), readable)
        await asyncio.wait_for(ready, 20)

    async def stop(self) -> None:
        if self.process is None:
            return
        process, self.process = self.process, None
        process.send_signal(signal.SIGTERM)
        await wait_exit(process, 15)
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(process.stdout.fileno())  # type: ignore[union-attr]
        process.stdout.close()  # type: ignore[union-attr]


async def wait_exit(process: subprocess.Popen[bytes], seconds: float) -> int | None:
    deadline = time.monotonic() + seconds
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            return await asyncio.to_thread(process.wait)
        await asyncio.sleep(0.05)
    return process.returncode


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Settings:
    duration: float = 1800.0
    rate: float = 30.0
    reload_every: float = 60.0
    kill_every: float = 90.0
    redis_every: float = 300.0
    redis_down: float = 15.0
    purge_every: float = 10.0
    warmup: float = 120.0
    replacement_warmup: float = 30.0
    #: Seconds of samples whose median is a memory level: ten of the
    #: workers' 30-s trims, and the swings of the bodies in flight.
    window: float = 300.0
    #: A process's memory at the end over its level after warm-up, at most.
    memory_bound: float = 1.10
    p99_window: float = 300.0
    sample_every: float = 5.0
    tunnels: int = 2
    #: The memory rows that count in the verdict (the others are shown).
    #: Not whole RSS by default: it counts the pages of the cache store's
    #: file a process has touched, which grow with the file to its size.
    judge_memory: tuple[str, ...] = ("own", "anon", "fds")
    dir: str | None = None
    ports: list[int] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    keep: bool = False
    seed: int = 1


class Soak:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.rng = random.Random(settings.seed)
        self.dir = Path(settings.dir or tempfile.mkdtemp(prefix="prexy-soak-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.start = 0.0
        self.stopping = False
        self.nodes: list[Node] = []
        self.origin: subprocess.Popen[bytes] | None = None
        self.redis: Redis | None = None
        self.redis_up = True
        self.redis_back_at = 0.0
        self.seq = 0
        # results
        self.requests = 0
        self.bodies_checked = 0
        self.wrong: list[dict[str, Any]] = []
        self.unexpected: list[dict[str, Any]] = []
        self.failed_by_kill = 0
        self.fault_ok = 0
        self.fault_wrong: list[dict[str, Any]] = []
        self.dropped = 0
        self.slow_reads = 0
        self.posts = 0
        self.tunnels_ok = 0
        self.ws_messages = 0
        self.kills: list[dict[str, Any]] = []
        self.reloads: list[dict[str, Any]] = []
        self.purges: list[dict[str, Any]] = []
        self.redis_cycles: list[dict[str, Any]] = []
        self.latencies: list[tuple[float, float, str]] = []
        self.slowest: list[tuple[float, float, str, str, str, str]] = []
        #: (t, CPU seconds a second used by the whole machine, by the soak's
        #: processes; the share of that time some runnable task waited for a CPU).
        self.load: list[tuple[float, float, float, float]] = []
        self._cpu_last: tuple[float, float, dict[int, float], float] | None = None
        self.samples: dict[str, list[tuple[float, int, int, int, int, int]]] = {}
        #: Per worker: (time, bytes its memos hold), from its node's /metrics.
        self.memo_samples: dict[str, list[tuple[float, float]]] = {}
        self.proc_info: dict[str, dict[str, Any]] = {}
        self.skipped_ticks = 0
        self.in_flight = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self.cpu: dict[str, float] = {}

    def now(self) -> float:
        return time.monotonic() - self.start

    # -- set-up -----------------------------------------------------------------------

    def _ports(self, n: int) -> list[int]:
        if self.s.ports:
            if len(self.s.ports) < n:
                raise SystemExit(f"--ports needs {n} ports")
            return self.s.ports[:n]
        held, out = [], []
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            held.append(sock)
            out.append(sock.getsockname()[1])
        for sock in held:
            sock.close()
        return out

    def config_text(self, node: Node, redis_port: int, origin_port: int) -> str:
        """A node's configuration; ``--set TABLE.KEY=VALUE`` adds or replaces keys."""
        tables: dict[str, dict[str, str]] = {
            "server": {
                "listen": f'["tcp:{node.http}:interface=127.0.0.1", "tcp:{node.h2c}:interface=127.0.0.1"]',
                "h2c_listen": f'["tcp:{node.h2c}:interface=127.0.0.1"]',
                "admin": f'"tcp:{node.admin}:interface=127.0.0.1"',
                "workers": "2",
                "access_log": f'"{node.dir / "access.log"}"',
                "shutdown_timeout": "5",
            },
            # Smaller than the working set (about 30 MB, and 7 MB more for each
            # rules generation), so the store is full once warm.
            "cache": {"size": '"32M"', "path": f'"{node.dir / "store"}"'},
            "cluster": {"redis": f'"redis://127.0.0.1:{redis_port}/0"', "node": f'"{node.name}"',
                        "start_wait": "5", "confirm_timeout": "3"},
            "timeouts": {"first_byte": f"{FIRST_BYTE}"},
            f"sites.{SITE}": {"hosts": f'["{HOST}"]', "upstream": f'"http://127.0.0.1:{origin_port}"',
                              "rules": '["site.rules"]'},
        }
        for item in self.s.sets:
            key, _, value = item.partition("=")
            table, _, name = key.rpartition(".")
            if not table or not name or not value:
                raise SystemExit(f"--set {item!r}: expected TABLE.KEY=VALUE (VALUE in TOML)")
            tables.setdefault(table, {})[name] = value
        return "".join(f"[{t}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()) for t, keys in tables.items())

    async def setup(self) -> None:
        ports = self._ports(8)
        origin_port, redis_port = ports[0], ports[1]
        log(f"soak: run directory {self.dir}")
        self.origin = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-origin", str(origin_port),
             "--origin-stats", str(self.dir / "origin-stats.json")],
            stdout=subprocess.PIPE, stderr=open(self.dir / "origin.log", "wb"), stdin=subprocess.DEVNULL,
            env=child_env(),
        )
        assert self.origin.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self.origin.stdout.readline), 30)
        if b"origin ready" not in line:
            raise RuntimeError(f"origin did not start: {line!r}")
        self.redis = Redis(redis_port, self.dir)
        await self.redis.start()
        for i, name in enumerate("ab"):
            d = self.dir / name
            d.mkdir(exist_ok=True)
            http, h2c, admin = ports[2 + 3 * i: 5 + 3 * i]
            node = Node(name, d, http, h2c, admin)
            (d / "site.rules").write_text(rules_text(0))
            (d / "prexy.toml").write_text(self.config_text(node, redis_port, origin_port))
            node.notify = Notify(str(d / "notify"))
            node.log_path = d / "twistd.log"
            ready = node.notify.next()
            node.process = subprocess.Popen(
                [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy", "--config", str(d / "prexy.toml")],
                cwd=d, stdout=open(node.log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=child_env({"NOTIFY_SOCKET": node.notify.path}),
            )
            node.pool = H1Pool(node.http)
            node.h2 = H2Client(node.h2c)
            node.gens = [[0, 0.0, float("inf")]]
            self.nodes.append(node)
            try:
                await asyncio.wait_for(ready, 90)
            except TimeoutError:
                raise RuntimeError(f"node {name} not ready:\n{node.log_path.read_text()[-3000:]}") from None
        log(f"soak: origin :{origin_port}, redis :{redis_port}, nodes "
            + ", ".join(f"{n.name} http :{n.http} h2c :{n.h2c} admin :{n.admin}" for n in self.nodes))

    async def teardown(self) -> None:
        for node in self.nodes:
            if node.pool:
                node.pool.close()
            if node.h2:
                node.h2.close()
        for node in self.nodes:
            if node.process and node.process.poll() is None:
                workers = node.workers()
                node.process.send_signal(signal.SIGTERM)
                if await wait_exit(node.process, 20) is None:
                    pass
                for pid in workers:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
            if node.notify:
                node.notify.close()
        if self.redis:
            await self.redis.stop()
        if self.origin and self.origin.poll() is None:
            self.origin.send_signal(signal.SIGTERM)
            await wait_exit(self.origin, 10)

    def kill_all(self) -> None:
        """Last resort (an exception, a signal): SIGKILL every child."""
        for node in self.nodes:
            if node.process and node.process.poll() is None:
                for pid in node.workers():
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                node.process.kill()
        for proc in (self.origin, self.redis.process if self.redis else None):
            if proc is not None and proc.poll() is None:
                proc.kill()

    # -- bookkeeping ----------------------------------------------------------------------

    def allowed_gens(self, node: Node, t: float) -> set[int]:
        return {int(g) for g, lo, hi in node.gens if lo <= t <= hi}

    def failure(self, node: Node, what: str, t0: float, exc: Failed | str) -> None:
        """A request that should have succeeded did not: blamed on a kill of
        one of ``node``'s workers when it was in flight then, else counted
        unexpected."""
        why = exc.why if isinstance(exc, Failed) else exc
        t1 = self.now()
        for kill in self.kills:
            if kill["node"] == node.name and t0 <= kill["t"] <= t1 and isinstance(exc, Failed):
                kill["failed"] += 1
                self.failed_by_kill += 1
                return
        self.unexpected.append({"t": round(t0, 3), "end": round(t1, 3), "node": node.name, "what": what,
                                "why": why})

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            self.unexpected.append({"t": round(self.now(), 3), "node": "-", "what": "harness",
                                    "why": f"{type(exc).__name__}: {exc}"})

    async def tracked(self, node: Node, coro: Awaitable[Any]) -> Any:
        self.seq += 1
        token = self.seq
        node.in_flight.add(token)
        self.in_flight += 1
        try:
            return await coro
        finally:
            node.in_flight.discard(token)
            self.in_flight -= 1

    # -- traffic ------------------------------------------------------------------------------

    def pick_path(self) -> str:
        r = self.rng.random()
        if r < 0.40:
            n = min(int(self.rng.paretovariate(1.2)) + 1, KINDS["p"] - 1)
            if n < 2 and self.rng.random() < 0.9:
                n = 2 + self.rng.randrange(KINDS["p"] - 2)
            return f"/p/{n}"
        if r < 0.50:
            return f"/np/{self.rng.randrange(KINDS['np'])}"
        if r < 0.65:
            return f"/gz/{self.rng.randrange(KINDS['gz'])}"
        return f"/bin/{min(int(self.rng.paretovariate(1.0)), KINDS['bin'] - 1)}"

    async def page_view(self) -> None:
        node = self.rng.choice(self.nodes)
        path = self.pick_path()
        proto = "h2" if self.rng.random() < 0.4 else "h1"
        headers: list[tuple[str, str]] = []
        if self.rng.random() < 0.5:
            headers.append(("Accept-Encoding", "gzip"))
        rng_range = None
        if path.startswith("/bin/") and self.rng.random() < 0.3:
            size = len(resource(path)[2])
            a = self.rng.randrange(size)
            b = min(size - 1, a + self.rng.randrange(1, 20000))
            rng_range = (a, b)
            headers.append(("Range", f"bytes={a}-{b}"))
        fault = ""
        roll = self.rng.random()
        if roll < 0.025:
            fault = "500"
        elif roll < 0.05:
            fault = "reset"
        elif roll < 0.06:
            fault = "stall"
        target = path + (f"?fault={fault}&n={self.rng.getrandbits(48):x}" if fault else "")
        t0 = self.now()
        try:
            if proto == "h2":
                assert node.h2 is not None
                answer = await self.tracked(node, node.h2.request(target, headers))
            else:
                assert node.pool is not None
                answer = await self.tracked(node, node.pool.request("GET", target, headers))
        except Failed as exc:
            self.requests += 1
            self.failure(node, f"{proto} GET {target}", t0, exc)
            return
        self.requests += 1
        t1 = self.now()
        if fault:
            want = {"500": 500, "reset": 502, "stall": 504}[fault]
            if answer.status == want:
                self.fault_ok += 1
            else:
                self.fault_wrong.append({"t": round(t0, 3), "node": node.name, "target": target,
                                         "status": answer.status, "want": want})
            return
        if answer.status not in (200, 206):
            self.failure(node, f"{proto} GET {target}", t0, f"status {answer.status}: {answer.body[:200]!r}")
            return
        self.check_body(node, proto, path, t0, answer, rng_range)
        if not path.startswith("/p/") or int(path.split("/")[2]) >= 2:
            self.latencies.append((t0, t1 - t0, proto))
            self.slowest.append((t1 - t0, t0, proto, node.name, path, answer.headers.get("cache-status", "")))
            if len(self.slowest) > 400:
                self.slowest = sorted(self.slowest, reverse=True)[:50]

    def decoded(self, answer: Answer) -> bytes | None:
        coding = answer.headers.get("content-encoding", "").strip().lower()
        if not coding or coding == "identity":
            return answer.body
        if coding == "gzip":
            try:
                return gzip.decompress(answer.body)
            except (OSError, EOFError, zlib.error):
                return None
        return None

    def check_body(self, node: Node, proto: str, path: str, t0: float, answer: Answer,
                   rng_range: tuple[int, int] | None) -> None:
        self.bodies_checked += 1
        body = self.decoded(answer)
        ctype = resource(path)[0]
        expected: list[bytes] = []
        gens = sorted(self.allowed_gens(node, t0))
        if ctype.startswith("text/html"):
            expected = [rewritten(path, g) for g in gens]
        else:
            full = resource(path)[2]
            if answer.status == 206 and rng_range is not None:
                expected = [full[rng_range[0]: rng_range[1] + 1]]
            else:
                expected = [full]
        if body is not None and body in expected:
            return
        found = GEN_RE.search(body or b"")
        record = {
            "t": round(t0, 3), "node": node.name, "proto": proto, "path": path, "status": answer.status,
            "range": rng_range, "coding": answer.headers.get("content-encoding"),
            "cache": answer.headers.get("cache-status"), "allowed_gens": gens,
            "gen_seen": int(found.group(1)) if found else None,
            "length": None if body is None else len(body), "expected_lengths": [len(e) for e in expected],
        }
        if body is not None and expected:
            e = expected[0]
            record["first_difference"] = next((i for i, (x, y) in enumerate(zip(body, e, strict=False)) if x != y),
                                              min(len(body), len(e)))
        if len(self.wrong) < 20 and body is not None:
            (self.dir / f"wrong-{len(self.wrong)}.body").write_bytes(body)
        self.wrong.append(record)

    async def post(self) -> None:
        node = self.rng.choice(self.nodes)
        body = self.rng.randbytes(self.rng.choice((1000, 20_000, 200_000, 1_000_000)))
        t0 = self.now()
        assert node.pool is not None
        try:
            answer = await self.tracked(node, node.pool.request(
                "POST", f"/echo?n={self.rng.getrandbits(32):x}", [("Content-Type", "application/octet-stream")],
                body, fresh=True))
        except Failed as exc:
            self.requests += 1
            self.failure(node, "POST /echo", t0, exc)
            return
        self.requests += 1
        self.posts += 1
        if answer.status != 200:
            self.failure(node, "POST /echo", t0, f"status {answer.status}")
            return
        self.bodies_checked += 1
        want = hashlib.sha256(body).hexdigest().encode() + b" %d\n" % len(body)
        if self.decoded(answer) != want:
            self.wrong.append({"t": round(t0, 3), "node": node.name, "what": "POST digest",
                               "got": answer.body[:100].decode("latin-1"), "want": want.decode()})

    async def big(self) -> None:
        node = self.rng.choice(self.nodes)
        path = f"/big/{self.rng.randrange(KINDS['big'])}"
        mode = self.rng.choice(("whole", "slow", "drop"))
        t0 = self.now()
        assert node.pool is not None
        try:
            answer = await self.tracked(node, node.pool.request(
                "GET", path, (), slow=1_000_000.0 if mode == "slow" else 0.0,
                drop_after=65536 if mode == "drop" else None, fresh=mode != "whole"))
        except Failed as exc:
            self.requests += 1
            self.failure(node, f"GET {path} ({mode})", t0, exc)
            return
        self.requests += 1
        if answer.status != 200:
            self.failure(node, f"GET {path} ({mode})", t0, f"status {answer.status}")
            return
        if mode == "drop":
            self.dropped += 1
            return
        if mode == "slow":
            self.slow_reads += 1
        self.check_body(node, "h1", path, t0, answer, None)

    async def tunnel(self) -> None:
        """One WebSocket tunnel through a node: messages echoed for 5-15 s."""
        node = self.rng.choice(self.nodes)
        assert node.pool is not None
        t0 = self.now()
        key = base64.b64encode(os.urandom(16)).decode()
        writer = None
        try:
            conn = await node.pool.connect()
            reader, writer = conn
            token = self.seq = self.seq + 1
            node.in_flight.add(token)
            try:
                answer = await node.pool._exchange(
                    conn, "GET", "/ws", [("Upgrade", "websocket"), ("Connection", "Upgrade"),
                                         ("Sec-WebSocket-Key", key), ("Sec-WebSocket-Version", "13")], None, 0, None)
                if answer.status != 101:
                    self.failure(node, "WebSocket", t0, f"status {answer.status}")
                    return
                want = base64.b64encode(hashlib.sha1(key.encode() + WS_GUID).digest()).decode()
                if answer.headers.get("sec-websocket-accept") != want:
                    self.wrong.append({"t": round(t0, 3), "node": node.name, "what": "WebSocket accept"})
                    return
                end = time.monotonic() + self.rng.uniform(5, 15)
                while time.monotonic() < end and not self.stopping:
                    payload = self.rng.randbytes(self.rng.choice((10, 200, 5000, 70000)))
                    writer.write(frame(2, payload))
                    await writer.drain()
                    opcode, echo = await asyncio.wait_for(read_frame(reader), 30)
                    self.ws_messages += 1
                    if (opcode, echo) != (2, payload):
                        self.wrong.append({"t": round(t0, 3), "node": node.name, "what": "WebSocket echo",
                                           "length": len(echo), "want": len(payload)})
                        return
                    await asyncio.sleep(0.5)
                writer.write(frame(8, struct.pack(">H", 1000)))
                await writer.drain()
                opcode, _ = await asyncio.wait_for(read_frame(reader), 30)
                self.tunnels_ok += 1
            finally:
                node.in_flight.discard(token)
        except Failed as exc:
            self.failure(node, "WebSocket", t0, exc)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            self.failure(node, "WebSocket", t0, Failed(f"{type(exc).__name__}: {exc}", True))
        except TimeoutError:
            self.failure(node, "WebSocket", t0, "no echo in 30 s")
        finally:
            if writer is not None:
                writer.close()

    async def traffic(self) -> None:
        """The steady traffic: ``rate`` requests a second, open loop."""
        interval = 1.0 / self.s.rate
        next_at = time.monotonic()
        while not self.stopping:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.in_flight > 200:
                self.skipped_ticks += 1
                continue
            r = self.rng.random()
            if r < 0.03:
                self.spawn(self.post())
            elif r < 0.05:
                self.spawn(self.big())
            else:
                self.spawn(self.page_view())

    async def tunnels(self) -> None:
        async def keep_one() -> None:
            while not self.stopping:
                await self.tunnel()
                await asyncio.sleep(0.2)

        await asyncio.gather(*(keep_one() for _ in range(self.s.tunnels)))

    # -- faults -----------------------------------------------------------------------------

    async def admin(self, node: Node, method: str, target: str, timeout: float = 30) -> Answer:
        pool = H1Pool(node.admin)
        return await asyncio.wait_for(pool.request(method, target, (("Connection", "close"),), fresh=True), timeout)

    async def at(self, t: float) -> None:
        """Sleeps until ``t`` seconds into the run.  Faults come half a
        period in, then every period, on a fixed schedule: the first and
        the last windows of a run get as many of each."""
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def reloader(self) -> None:
        gen = 0
        while not self.stopping:
            await self.at((gen + 0.5) * self.s.reload_every)
            if self.stopping:
                return
            gen += 1
            await asyncio.gather(*(self.reload(node, gen) for node in self.nodes))

    async def reload(self, node: Node, gen: int) -> None:
        rules = node.dir / "site.rules"
        tmp = node.dir / "site.rules.tmp"
        tmp.write_text(rules_text(gen))
        os.replace(tmp, rules)
        t0 = self.now()
        old = node.gens[-1]
        node.gens.append([gen, t0, float("inf")])
        record: dict[str, Any] = {"node": node.name, "gen": gen, "t": round(t0, 3)}
        self.reloads.append(record)
        probe = asyncio.ensure_future(self.probe_gen(node, gen, t0))
        try:
            answer = await self.admin(node, "POST", "/reload", 60)
            record["status"] = answer.status
            record["answer"] = answer.body.decode("latin-1").strip()[:300]
        except (TimeoutError, Failed) as exc:
            record["status"] = None
            record["answer"] = repr(exc)[:300]
        t1 = self.now()
        record["answered_s"] = round(t1 - t0, 3)
        if record["status"] == 200:
            old[2] = t1  # from the answer on, every worker serves the new rules
        else:
            node.gens[-1][2] = t1  # refused: the new generation never came
        try:
            seen = await asyncio.wait_for(probe, 30)
            record["first_seen_s"] = round(seen - t0, 3)
        except TimeoutError:
            record["first_seen_s"] = None
        in_force = [record["answered_s"]] + ([record["first_seen_s"]] if record["first_seen_s"] is not None else [])
        record["in_force_s"] = max(in_force) if record["status"] == 200 and record["first_seen_s"] is not None else None

    async def probe_gen(self, node: Node, gen: int, t0: float) -> float:
        """Asks ``node`` for an uncached page until it carries ``gen``."""
        pool = H1Pool(node.http, keep=0)
        while True:
            try:
                answer = await pool.request("GET", f"/probe?n={self.rng.getrandbits(32):x}", (), fresh=True)
                found = GEN_RE.search(answer.body)
                if found and int(found.group(1)) == gen:
                    return self.now()
            except Failed:
                pass
            await asyncio.sleep(0.02)

    async def killer(self) -> None:
        k = 0
        while not self.stopping:
            await self.at((k + 0.5) * self.s.kill_every)
            if self.stopping:
                return
            node = self.nodes[k % len(self.nodes)]
            k += 1
            workers = node.workers()
            if not workers:
                continue
            victim = max(workers, key=proc_start)  # the youngest: each node keeps its first worker
            assert node.notify is not None
            ready = node.notify.next()
            t = self.now()
            os.kill(victim, signal.SIGKILL)
            record = {"node": node.name, "pid": victim, "t": round(t, 3), "in_flight": len(node.in_flight),
                      "failed": 0, "replaced_s": None}
            self.kills.append(record)
            try:
                at = await asyncio.wait_for(ready, 30) - self.start
                while self.now() - t < 30:  # and two workers again, the victim not among them
                    now = node.workers()
                    if len(now) >= 2 and victim not in now:
                        record["replaced_s"] = round(max(at, self.now()) - t, 3)
                        break
                    await asyncio.sleep(0.02)
            except TimeoutError:
                pass

    async def redis_cycles_loop(self) -> None:
        while not self.stopping:
            await self.at((len(self.redis_cycles) + 0.5) * self.s.redis_every - self.s.redis_down / 2)
            if self.stopping:
                return
            assert self.redis is not None
            record = {"t": round(self.now(), 3)}
            await self.redis.stop()
            self.redis_up = False
            await asyncio.sleep(self.s.redis_down)
            await self.redis.start()
            self.redis_up = True
            self.redis_back_at = self.now()
            record["back"] = round(self.redis_back_at, 3)
            self.redis_cycles.append(record)

    # -- PURGE and ban -------------------------------------------------------------------------

    async def cache_status(self, node: Node, path: str) -> str:
        assert node.pool is not None
        for _ in range(3):
            try:
                answer = await node.pool.request("GET", path)
                if answer.status == 200:
                    return answer.headers.get("cache-status", "")
            except Failed:
                pass
            await asyncio.sleep(0.2)
        return "failed"

    async def invalidations(self) -> None:
        k = 0
        while not self.stopping:
            await self.at((k + 1) * self.s.purge_every)
            if self.stopping:
                return
            k += 1
            self.spawn(self.invalidate(k))

    async def invalidate(self, k: int) -> None:
        path = f"/pg/{k}"
        sender = self.nodes[k % 2]
        kind = "ban" if (k // 2) % 2 else "purge"
        record: dict[str, Any] = {"t": round(self.now(), 3), "kind": kind, "sender": sender.name, "path": path}
        self.purges.append(record)
        for _ in range(3):  # until both nodes hold it (a reload meanwhile makes new keys: again)
            states = [await self.cache_status(n, path) for n in self.nodes for _ in range(2)]
            if all(s.startswith("prexy; hit") for s in states[1::2]):
                break
        else:
            record["result"] = "not cached on both nodes first"
            record["ok"] = None
            return
        for attempt in range(3):  # a connection cut by a worker's kill: again (both are idempotent)
            try:
                if kind == "purge":
                    assert sender.pool is not None
                    answer = await asyncio.wait_for(sender.pool.request("PURGE", path), 30)
                else:
                    answer = await self.admin(sender, "POST", f"/ban?regex=%5E{path}$&site={SITE}")
                break
            except (TimeoutError, Failed) as exc:
                record.setdefault("attempts_failed", []).append(repr(exc)[:200])
                if attempt == 2:
                    record["ok"] = False
                    return
                await asyncio.sleep(0.5)
        text = answer.body.decode("latin-1")
        record["answer"] = text.strip()
        record["redis_up"] = self.redis_up
        if answer.status != 200 or not re.search(r"(purged|banned) [1-9][0-9]* object", text):
            record["ok"] = False
            return
        t_answer = self.now()
        confirmed = "applied by every live node" in text or "applied by all 1 other" in text
        record["confirmed"] = confirmed
        results = {}
        for node in self.nodes:
            if node is sender or confirmed:
                status = await self.cache_status(node, path)
                results[node.name] = round(self.now() - t_answer, 3) if status.startswith("prexy; fwd=uri-miss") else None
                if results[node.name] is None:
                    record[f"status_{node.name}"] = status
            else:
                # Not confirmed (Redis away): the other node must apply it once
                # Redis is back; asked every 0.5 s, for at most 60 s after that.
                while True:
                    status = await self.cache_status(node, path)
                    if status.startswith("prexy; fwd=uri-miss"):
                        results[node.name] = round(self.now() - t_answer, 3)
                        break
                    if self.redis_up and self.now() - max(self.redis_back_at, t_answer) > 60:
                        results[node.name] = None
                        record[f"status_{node.name}"] = status
                        break
                    await asyncio.sleep(0.5)
        record["miss_after_s"] = results
        record["ok"] = all(v is not None for v in results.values())

    # -- samples -------------------------------------------------------------------------------

    async def sampler(self) -> None:
        while not self.stopping:
            self.sample()
            await asyncio.sleep(self.s.sample_every)

    def sample(self) -> None:
        t = round(self.now(), 2)
        for node in self.nodes:
            if node.process is None:
                continue
            pids = [("master", node.process.pid)] + [("worker", p) for p in node.workers()]
            for role, pid in pids:
                name = f"{node.name} {role} {pid}"
                got = proc_sample(pid)
                if got is None:
                    continue
                if name not in self.proc_info:
                    self.proc_info[name] = {"node": node.name, "role": role, "pid": pid, "first": t,
                                            "initial": t < self.s.warmup / 4}
                self.proc_info[name]["last"] = t
                self.proc_info[name]["fd_kinds"] = fd_kinds(pid)
                self.samples.setdefault(name, []).append((t, *got, got[0] - got[2]))
        for name, proc in (("origin", self.origin), ("redis", self.redis.process if self.redis else None)):
            if proc is not None and proc.poll() is None:
                got = proc_sample(proc.pid)
                if got:
                    self.samples.setdefault(f"{name} {proc.pid}", []).append((t, *got, got[0] - got[2]))
        self.sample_load(t)

    async def memo_sampler(self) -> None:
        while not self.stopping:
            await asyncio.gather(*(self.sample_memo(node) for node in self.nodes))
            await asyncio.sleep(self.s.sample_every)

    async def sample_memo(self, node: Node) -> None:
        """Each worker's memo bytes, as its master reports them: a worker
        is warm once these stop growing (``memory_rows``)."""
        if node.process is None:
            return
        try:
            answer = await self.admin(node, "GET", "/metrics", 10)
        except (TimeoutError, OSError, ConnectionError):
            return
        if answer.status != 200:
            return
        t = round(self.now(), 2)
        held = process_memo(answer.body.decode("utf-8", "replace"))
        pids = {pid: worker_slot(pid) for pid in node.workers()}
        for pid, slot in pids.items():
            role = f"worker-{slot}"
            # (Two workers in one slot, while one replaces the other: not told apart.)
            if slot is None or role not in held or list(pids.values()).count(slot) > 1:
                continue
            self.memo_samples.setdefault(f"{node.name} worker {pid}", []).append((t, held[role]))

    def sample_load(self, t: float) -> None:
        """The machine's CPU use since the last sample, and the part of it
        that the soak's own processes (this one, the origin, Redis, the
        nodes) used: what is left is other work on the machine, which the
        latencies feel too."""
        pids = [os.getpid()] + [p.pid for p in (self.origin, self.redis.process if self.redis else None) if p]
        for node in self.nodes:
            if node.process is not None:
                pids += [node.process.pid, *node.workers()]
        mine = {pid: proc_cpu(pid) for pid in pids}
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except OSError:
            return
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
        stalled = cpu_pressure()
        now = time.monotonic()
        if self._cpu_last is not None:
            then, busy_then, mine_then, stalled_then = self._cpu_last
            span = now - then
            ours = sum(v - mine_then[p] for p, v in mine.items() if p in mine_then)
            if span > 0:
                self.load.append((t, round((busy - busy_then) / span, 3), round(ours / span, 3),
                                  round((stalled - stalled_then) / span, 3)))
        self._cpu_last = (now, busy, mine, stalled)

    async def progress(self) -> None:
        minute = 0
        while not self.stopping:
            await asyncio.sleep(60)
            minute += 1
            recent = [lat for t, lat, _ in self.latencies if t >= self.now() - 60]
            p99 = percentile(recent, 99)
            rss = ", ".join(f"{name.split()[0]}{name.split()[1][0]} {s[-1][1] / 1024:.0f}"
                            for name, s in self.samples.items()
                            if name in self.proc_info and self.proc_info[name]["last"] >= self.now() - 10)
            in_force = [r["in_force_s"] for r in self.reloads if r.get("in_force_s") is not None]
            log(f"soak {minute}/{self.s.duration / 60:.0f} min: {self.requests} requests, "
                f"{self.bodies_checked} bodies checked, wrong {len(self.wrong)}, unexpected {len(self.unexpected)}, "
                f"by kills {self.failed_by_kill}, kills {len(self.kills)}, reloads {len(self.reloads)} "
                f"(max in force {max(in_force, default=0):.2f} s), p99 last minute {p99 * 1000:.0f} ms, "
                f"RSS MB: {rss}")

    # -- the run ---------------------------------------------------------------------------------

    async def prewarm(self) -> None:
        """Before the clock starts: more 1 MB fillers than a store holds,
        then every URL of the mix on each node, plain and gzip, three times (a
        miss, then hits; a connection each, so that each worker sees most):
        the stores are full and the workers' memos hold the working set, so
        the levels taken after warm-up are a warm server's."""
        paths = [f"/{kind}/{n}" for kind, count in KINDS.items() if kind != "np" for n in range(count)]
        fill = [(node, f"/fill/{n}", "") for node in self.nodes for n in range(FILL)]
        mix = [(node, path, coding) for node in self.nodes for path in paths for coding in ("", "gzip")]
        self.rng.shuffle(mix)
        queue = mix * 3 + fill  # popped from the end: the fillers first

        async def one_by_one() -> None:
            while queue:
                node, path, coding = queue.pop()
                assert node.pool is not None
                t0 = self.now()
                # A connection for each request, so that both workers get
                # their share (a kept one stays with the worker that took it).
                headers = [("Connection", "close")] + ([("Accept-Encoding", coding)] if coding else [])
                try:
                    answer = await node.pool.request("GET", path, headers, fresh=True)
                except Failed as exc:
                    self.failure(node, f"warm-up GET {path}", t0, exc)
                    continue
                if answer.status != 200:
                    self.failure(node, f"warm-up GET {path}", t0, f"status {answer.status}")

        t = time.monotonic()
        await asyncio.gather(*(one_by_one() for _ in range(4)))
        for node in self.nodes:  # a ban that matches nothing: the master reads the whole store once
            await self.admin(node, "POST", f"/ban?regex=%5E/nothing$&site={SITE}")
        log(f"soak: warm-up fetched {FILL} 1 MB fillers and {len(paths)} URLs, plain and gzip, 3 times on each node "
            f"in {time.monotonic() - t:.1f} s")

    async def run(self) -> None:
        await self.setup()
        self.start = time.monotonic()
        await self.prewarm()
        self.start = time.monotonic()
        for node in self.nodes:
            node.gens = [[0, 0.0, float("inf")]]
        loops = [self.traffic(), self.tunnels(), self.reloader(), self.killer(), self.redis_cycles_loop(),
                 self.invalidations(), self.sampler(), self.memo_sampler(), self.progress()]
        runners = [asyncio.ensure_future(c) for c in loops]
        try:
            done, _ = await asyncio.wait(runners, timeout=self.s.duration, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # a harness error ends the run
        finally:
            self.stopping = True
            self.sample()
            for task in runners:
                task.cancel()
            await asyncio.gather(*runners, return_exceptions=True)
            if self.redis and self.redis.process is None:  # stopped by the last cycle
                await self.redis.start()
                self.redis_up = True
                self.redis_back_at = self.now()
            # Let the requests and checks in flight end (bounded).
            deadline = time.monotonic() + 90
            while self.tasks and time.monotonic() < deadline:
                await asyncio.wait(list(self.tasks), timeout=1)
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            self.cpu = {"client": sum(os.times()[:2]), **self.prexy_cpu()}
            await self.teardown()

    def prexy_cpu(self) -> dict[str, float]:
        """CPU seconds of each node (master and its workers now; killed
        workers' time is lost with them) and of the origin."""
        out: dict[str, float] = {}
        cpu = proc_cpu
        for node in self.nodes:
            if node.process is not None:
                out[f"node {node.name}"] = cpu(node.process.pid) + sum(cpu(p) for p in node.workers())
        if self.origin is not None:
            out["origin"] = cpu(self.origin.pid)
        return out

    # -- the verdict --------------------------------------------------------------------------

    def tracebacks(self) -> list[str]:
        found = []
        paths = [n.log_path for n in self.nodes if n.log_path] + [self.dir / "origin.log"]
        for path in paths:
            if path is None or not path.exists():
                continue
            text = path.read_text(errors="replace")
            for m in re.finditer(r"Traceback \(most recent call last\)|Unhandled [Ee]rror", text):
                found.append(f"{path.parent.name}/{path.name}: {text[max(0, m.start() - 300): m.start() + 1500]}")
        return found

    def warm_from(self, name: str, info: dict[str, Any]) -> float:
        """When process ``name`` is past its warm-up: ``--warmup`` (a first
        process) or ``--replacement-warmup`` seconds after it appeared, and
        for a worker not before its memos first held 90% of the most they
        ever held.  Until then its memory grows by design: the memos fill
        towards ``[cache] memo_size`` (a worker that replaced a killed one
        starts with them empty)."""
        begin = info["first"] + (self.s.warmup if info["initial"] else self.s.replacement_warmup)
        memo = self.memo_samples.get(name, [])
        peak = max((held for _, held in memo), default=0.0)
        if peak > 0:
            begin = max(begin, next(t for t, held in memo if held >= MEMO_WARM * peak))
        return begin

    def memory_rows(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Per process: its level after warm-up and at the end (medians of
        ``window`` seconds of samples), for RSS and descriptors."""
        rows = []
        for name, info in self.proc_info.items():
            samples = self.samples[name]
            begin = self.warm_from(name, info)
            life_end = info["last"]
            base = [s for s in samples if begin <= s[0] < begin + self.s.window]
            # Judged over a span at least as long as a window: a process
            # killed soon after its warm-up shows its warming, not a trend.
            end = [s for s in samples if s[0] > life_end - self.s.window and s[0] >= begin + 2 * self.s.window]
            row: dict[str, Any] = {"process": name, "lived_s": round(life_end - info["first"], 1),
                                   "initial": info["initial"], "warm_s": round(begin - info["first"], 1),
                                   "fd_kinds_last": info.get("fd_kinds", {})}
            memo = self.memo_samples.get(name, [])
            if memo:
                row["memo_first_mb"] = round(memo[0][1] / MB, 1)
                row["memo_last_mb"] = round(memo[-1][1] / MB, 1)
            if not base or not end:
                row["judged"] = False
                rows.append(row)
                continue
            row["judged"] = True
            for i, key in ((1, "rss"), (2, "anon"), (3, "store"), (4, "fds"), (5, "own")):
                # Memory: the median of a window.  Descriptors: the fewest
                # held in it, since connections come and go; a leak raises
                # that floor.
                level: Callable[[list[float]], float] = min if key == "fds" else statistics.median
                b = level([s[i] for s in base])
                e = level([s[i] for s in end])
                row[f"{key}_base"], row[f"{key}_end"] = b, e
                row[f"{key}_ratio"] = round(e / b, 3) if b else None
            bound = self.s.memory_bound
            row["rss_held"] = row["rss_end"] <= bound * row["rss_base"]
            row["own_held"] = row["own_end"] <= bound * row["own_base"]
            row["anon_held"] = row["anon_end"] <= bound * row["anon_base"]
            row["fds_held"] = row["fds_end"] <= max(bound * row["fds_base"], row["fds_base"] + FD_SLACK)
            rows.append(row)
        return rows, [r for r in rows if r["judged"]]

    def verdict(self) -> tuple[list[tuple[str, str, str, bool | None]], dict[str, Any]]:
        """The table: (invariant, value, bound, held); held is None for a
        memory row left out of the verdict by ``--judge-memory``."""
        rows: list[tuple[str, str, str, bool | None]] = []

        def add(what: str, value: Any, bound: str, held: bool | None) -> None:
            rows.append((what, str(value), bound, held))

        add("wrong bytes: completed bodies not as expected", f"{len(self.wrong)} of {self.bodies_checked}",
            "0", not self.wrong)
        add("requests that failed unexpectedly", f"{len(self.unexpected)} of {self.requests}", "0",
            not self.unexpected)
        over = [k for k in self.kills if k["failed"] > k["in_flight"]]
        add("requests failed on killed workers",
            f"{self.failed_by_kill} (in flight at the kills: {sum(k['in_flight'] for k in self.kills)})",
            "each kill <= its node's requests in flight", not over)
        add("faulted origin requests answered 500/502/504 as injected",
            f"{self.fault_ok} of {self.fault_ok + len(self.fault_wrong)}", "all", not self.fault_wrong)
        replaced = [k["replaced_s"] for k in self.kills if k["replaced_s"] is not None]
        add("killed workers replaced", f"{len(replaced)} of {len(self.kills)}, max "
            f"{max(replaced, default=0):.2f} s", "all, within 10 s",
            len(replaced) == len(self.kills) and max(replaced, default=0) <= 10)
        ok_reloads = [r for r in self.reloads if r.get("status") == 200 and r.get("in_force_s") is not None]
        add("reloads in force", f"{len(ok_reloads)} of {len(self.reloads)}", "all",
            len(ok_reloads) == len(self.reloads))
        times = [r["in_force_s"] for r in ok_reloads]
        add("reload in force (max; median)",
            f"{max(times, default=0):.2f} s; {statistics.median(times) if times else 0:.2f} s", "<= 1 s",
            max(times, default=0) <= 1.0)
        judged_p = [p for p in self.purges if p.get("ok") is not None]
        for kind in ("purge", "ban"):
            these = [p for p in judged_p if p["kind"] == kind]
            add(f"{kind.upper() if kind == 'purge' else 'bans'} honoured on both nodes",
                f"{sum(1 for p in these if p['ok'])} of {len(these)}"
                + (f" ({sum(1 for p in self.purges if p['kind'] == kind and p.get('ok') is None)} not checked)"
                   if any(p.get("ok") is None for p in self.purges if p["kind"] == kind) else ""),
                "all", all(p["ok"] for p in these) and bool(these))
        tracebacks = self.tracebacks()
        add("tracebacks in the logs", len(tracebacks), "0", not tracebacks)
        all_rows, judged = self.memory_rows()
        limit = f"<= {self.s.memory_bound:.2f}"
        for key, label, bound in (("rss", "RSS (median)", limit),
                                  ("own", "RSS less the store's map (median)", limit),
                                  ("anon", "anonymous memory (median)", limit),
                                  ("fds", "open descriptors (fewest)", f"{limit} (or +{FD_SLACK})")):
            worst = max(judged, key=lambda r: r[f"{key}_ratio"] or 0, default=None)
            what = f"{label} of every process at the end / after warm-up"
            counted = key in self.s.judge_memory
            if worst is None:
                add(what, "no process judged", bound, False if counted else None)
                continue
            add(what, f"max {worst[f'{key}_ratio']:.3f} ({worst['process']}; {len(judged)} judged, "
                f"{len(all_rows) - len(judged)} ended before: below)", bound,
                all(r[f"{key}_held"] for r in judged) if counted else None)
        first = [lat for t, lat, _ in self.latencies if t < self.s.p99_window]
        last = [lat for t, lat, _ in self.latencies if t >= self.s.duration - self.s.p99_window]
        p_first, p_last = percentile(first, 99), percentile(last, 99)

        def foreign(lo: float, hi: float) -> tuple[float, float]:
            spans = [(busy - ours, waited) for t, busy, ours, waited in self.load if lo < t <= hi]
            if not spans:
                return 0.0, 0.0
            return statistics.mean(x for x, _ in spans), max(w for _, w in spans)

        f_first, w_first = foreign(0, self.s.p99_window)
        f_last, w_last = foreign(self.s.duration - self.s.p99_window, self.s.duration + 1)
        add(f"p99 of the steady traffic, last {self.s.p99_window:.0f} s / first {self.s.p99_window:.0f} s",
            f"{p_last * 1000:.1f} ms / {p_first * 1000:.1f} ms = {p_last / p_first if p_first else 0:.2f} "
            f"(other load {f_last:.1f} / {f_first:.1f} cores, CPU waits up to {w_last:.0%} / {w_first:.0%})",
            "<= 1.5", bool(first and last) and p_last <= 1.5 * p_first)
        extra = {
            "tracebacks": tracebacks[:5],
            "processes": all_rows,
            "p99_first_ms": p_first * 1000, "p99_last_ms": p_last * 1000,
        }
        return rows, extra

    def report(self, json_path: str | None) -> bool:
        rows, extra = self.verdict()
        width = max(len(r[0]) for r in rows)
        vwidth = max(len(r[1]) for r in rows)
        bwidth = max(len(r[2]) for r in rows)
        lines = [f"{'invariant':<{width}}  {'value':<{vwidth}}  {'bound':<{bwidth}}  held",
                 f"{'-' * width}  {'-' * vwidth}  {'-' * bwidth}  ----"]
        lines += [f"{w:<{width}}  {v:<{vwidth}}  {b:<{bwidth}}  "
                  f"{'yes' if h else '(not judged)' if h is None else 'NO'}" for w, v, b, h in rows]
        info = (f"{self.requests} requests ({self.requests / self.s.duration:.1f}/s), {self.bodies_checked} bodies "
                f"checked, {self.posts} POSTs, {self.slow_reads} slow reads, {self.dropped} dropped mid-body, "
                f"{self.tunnels_ok} tunnels ({self.ws_messages} messages), {len(self.kills)} kills, "
                f"{len(self.reloads)} reloads, {len(self.redis_cycles)} Redis restarts, "
                f"{len(self.purges)} PURGEs and bans, retried on a reused connection: "
                f"{sum(n.pool.retried for n in self.nodes if n.pool)} HTTP/1.1, "
                f"{sum(n.h2.retried for n in self.nodes if n.h2)} HTTP/2; ticks skipped: {self.skipped_ticks}; "
                "CPU seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in self.cpu.items()))
        print("\n".join(lines))
        print(info)
        for title, items in (("wrong bodies", self.wrong), ("unexpected failures", self.unexpected),
                             ("faults answered otherwise", self.fault_wrong)):
            if items:
                print(f"\n{title} (first 10 of {len(items)}):")
                for item in items[:10]:
                    print("  " + json.dumps(item, default=str))
        for p in self.purges:
            if p.get("ok") is False:
                print("  invalidation not honoured: " + json.dumps(p, default=str))
        for r in self.reloads:
            if r.get("in_force_s") is None or r["in_force_s"] > 1.0:
                print("  slow or failed reload: " + json.dumps(r, default=str))
        for tb in extra["tracebacks"][:2]:
            print("\ntraceback: " + tb)
        print(f"\nprocesses (KiB, descriptors; medians of {self.s.window:.0f} s after warm-up -> at the end; a worker is "
              f"warm once its memos first hold {MEMO_WARM:.0%} of the most they held, and judged when it lives "
              f"two windows past that):")
        for r in extra["processes"]:
            if r["judged"]:
                print(f"  {r['process']:<22} lived {r['lived_s']:>7.0f} s  warm {r['warm_s']:>4.0f} s  "
                      f"RSS {r['rss_base']:>8.0f} -> "
                      f"{r['rss_end']:>8.0f} ({r['rss_ratio']:.3f})  anon {r['anon_base']:>7.0f} -> "
                      f"{r['anon_end']:>7.0f} ({r['anon_ratio']:.3f})  store map {r['store_base']:>6.0f} -> "
                      f"{r['store_end']:>6.0f}  fds {r['fds_base']:.0f} -> {r['fds_end']:.0f}"
                      + ("" if r["fds_held"] else f" (last: {r['fd_kinds_last']})"))
            else:
                memo = (f"; its memos {r['memo_first_mb']:.1f} -> {r['memo_last_mb']:.1f} MB"
                        if "memo_first_mb" in r else "")
                print(f"  {r['process']:<22} lived {r['lived_s']:>7.0f} s  (not judged: warm after "
                      f"{r['warm_s']:.0f} s{memo})")
        held = all(r[3] is not False for r in rows)
        if json_path:
            minutes: dict[int, list[float]] = {}
            for t, lat, _ in self.latencies:
                minutes.setdefault(int(t // 60), []).append(lat)
            payload = {
                "settings": self.s.__dict__,
                "cpu_seconds": self.cpu,
                "held": held,
                "table": [{"invariant": w, "value": v, "bound": b, "held": h} for w, v, b, h in rows],
                "summary": info,
                "latency_per_minute_ms": {
                    m: {"count": len(v), "p50": percentile(v, 50) * 1000, "p90": percentile(v, 90) * 1000,
                        "p99": percentile(v, 99) * 1000, "max": max(v) * 1000}
                    for m, v in sorted(minutes.items())
                },
                "samples": {name: [list(s) for s in v] for name, v in self.samples.items()},
                "memo_samples": {name: [list(s) for s in v] for name, v in self.memo_samples.items()},
                "machine_load": [list(x) for x in self.load],
                "machine_load_columns": ["t", "cpu_busy_cores", "soak_cores", "cpu_pressure_some"],
                "slowest": [list(x) for x in sorted(self.slowest, reverse=True)[:50]],
                "slowest_columns": ["latency_s", "t", "proto", "node", "path", "cache_status"],
                "sample_columns": ["t", "rss_kib", "anon_kib", "store_map_kib", "fds", "rss_less_store_map_kib"],
                "processes": extra["processes"],
                "reloads": self.reloads, "kills": self.kills, "invalidations": self.purges,
                "redis_restarts": self.redis_cycles, "wrong": self.wrong, "unexpected": self.unexpected,
                "faults_otherwise": self.fault_wrong, "tracebacks": extra["tracebacks"],
            }
            Path(json_path).write_text(json.dumps(payload, indent=1, default=str))
        print("\nsoak: every invariant held" if held else "\nsoak: INVARIANTS VIOLATED")
        return held


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))  # nearest rank
    return ordered[k]


def log(message: str) -> None:
    print(time.strftime("%H:%M:%S ") + message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of traffic (default 1800)")
    p.add_argument("--rate", type=float, default=d.rate, help="requests a second, both nodes together (30)")
    p.add_argument("--reload-every", type=float, default=d.reload_every, help="seconds between reloads (60)")
    p.add_argument("--kill-every", type=float, default=d.kill_every, help="seconds between worker kills (90)")
    p.add_argument("--redis-every", type=float, default=d.redis_every, help="seconds between Redis stops (300)")
    p.add_argument("--redis-down", type=float, default=d.redis_down, help="seconds Redis stays stopped (15)")
    p.add_argument("--purge-every", type=float, default=d.purge_every, help="seconds between PURGE/ban checks (10)")
    p.add_argument("--warmup", type=float, default=d.warmup,
                   help="seconds before a first process's memory level is taken (120)")
    p.add_argument("--replacement-warmup", type=float, default=d.replacement_warmup,
                   help="the same for a worker that replaced a killed one (30)")
    p.add_argument("--window", type=float, default=d.window,
                   help="seconds of samples whose median is a memory level (300)")
    p.add_argument("--p99-window", type=float, default=d.p99_window,
                   help="the first and last seconds whose p99 are compared (300)")
    p.add_argument("--sample-every", type=float, default=d.sample_every, help="seconds between samples (5)")
    p.add_argument("--tunnels", type=int, default=d.tunnels, help="WebSocket tunnels open at once (2)")
    p.add_argument("--dir", help="run directory (default: a new temporary one, removed unless --keep)")
    p.add_argument("--keep", action="store_true", help="keep the run directory (logs, stores)")
    p.add_argument("--ports", help="8 comma-separated ports to use (origin, redis, then http, h2c, admin per node)")
    p.add_argument("--set", action="append", default=[], metavar="TABLE.KEY=VALUE",
                   help="an extra configuration key for both nodes, VALUE in TOML (e.g. cache.memo_size='\"16M\"')")
    p.add_argument("--memory-bound", type=float, default=d.memory_bound,
                   help="a process's memory and descriptors at the end over their level after warm-up, "
                        "at most (1.10)")
    p.add_argument("--judge-memory", default=",".join(d.judge_memory),
                   help="the memory rows that count in the verdict, of rss (whole RSS), own (RSS less the cache "
                        "store's map), anon, fds (default: own,anon,fds); the others are shown, not judged")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", help="write the table and the samples to this file")
    p.add_argument("--serve-origin", type=int, help=argparse.SUPPRESS)
    p.add_argument("--origin-stats", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = set(args.judge_memory.split(",")) - {"rss", "own", "anon", "fds", ""}
    if unknown:
        p.error(f"--judge-memory: unknown row(s) {', '.join(sorted(unknown))} (rss, own, anon, fds)")
    settings = Settings(
        duration=args.duration, rate=args.rate, reload_every=args.reload_every, kill_every=args.kill_every,
        redis_every=args.redis_every, redis_down=args.redis_down, purge_every=args.purge_every,
        warmup=args.warmup, replacement_warmup=args.replacement_warmup, window=args.window,
        p99_window=min(args.p99_window, args.duration / 2), sample_every=args.sample_every, tunnels=args.tunnels,
        dir=args.dir, keep=args.keep or bool(args.dir), sets=args.set, seed=args.seed,
        judge_memory=tuple(x for x in args.judge_memory.split(",") if x), memory_bound=args.memory_bound,
        ports=[int(x) for x in args.ports.split(",")] if args.ports else [],
    )
    return args, settings


def main(argv: list[str] | None = None) -> int:
    args, settings = parse_args(argv)
    if args.serve_origin:
        serve_origin(args.serve_origin, args.origin_stats)
        return 0
    if not (shutil.which("redis-server") or os.path.exists("/usr/bin/redis-server")):
        log("soak: needs redis-server (Debian: apt-get install redis-server)")
        return 2
    soak = Soak(settings)

    async def go() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, lambda: task and task.cancel())
        await soak.run()

    try:
        asyncio.run(go())
    except (asyncio.CancelledError, KeyboardInterrupt):
        soak.kill_all()
        log("soak: interrupted")
        return 3
    except BaseException:
        soak.kill_all()
        raise
    held = soak.report(args.json)
    if not settings.keep:
        shutil.rmtree(soak.dir, ignore_errors=True)
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
