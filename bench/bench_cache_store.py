"""Compares three designs for the machine-wide shared cache store.

    python bench/bench_cache_store.py [--n 2000] [--seconds 2]

(a) ``lmdb``: :class:`prexy.cache.store.Store` itself (LMDB on /dev/shm,
    with its index, LRU and byte accounting);
(b) ``shmfile``: one file per object on /dev/shm (write to a temporary
    name, ``os.replace``), a byte counter in an index file under ``flock``
    on every put; a get is ``open``/``read``/``close`` (LRU bookkeeping,
    which would cost more syscalls, is left out: a lower bound);
(c) ``socket``: a cache process (one thread, ``selectors``, a dict in LRU
    order) over a unix socket with a length-prefixed protocol; the client
    is a blocking socket (a lower bound for a Twisted client, which adds a
    reactor round trip).

Every backend stores the same record (a marshalled head of 8 headers, then
the body) and a get decodes the head, as a hit would.  For 12-byte and
20 KB bodies it prints, per backend: put and get latency in one process
(median and p99, microseconds) and the hit throughput of 2 processes
reading at once (gets per second, total, and CPU microseconds per hit
summed over the readers and, for ``socket``, the cache process: less
sensitive than wall-clock rates to a busy machine).  Backends and sizes are
run round-robin ``--rounds`` times and medians reported.  Results go to
stdout as a markdown table.
"""

from __future__ import annotations

import argparse
import fcntl
import marshal
import multiprocessing
import os
import random
import selectors
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attrs  # noqa: E402

from prexy.cache.bans import Ban  # noqa: E402
from prexy.cache.policy import cache_key, vary_key  # noqa: E402
from prexy.cache.store import ObjectMeta, Store  # noqa: E402

HEADERS = (
    (b"Content-Type", b"text/html; charset=utf-8"),
    (b"Date", b"Mon, 30 Nov 2026 04:00:00 GMT"),
    (b"Last-Modified", b"Mon, 30 Nov 2026 03:00:00 GMT"),
    (b"ETag", b'"5f3a-1234567890"'),
    (b"Cache-Control", b"max-age=300"),
    (b"Vary", b"Accept-Encoding"),
    (b"Server", b"origin"),
    (b"X-Frame-Options", b"SAMEORIGIN"),
)
MAX_BYTES = 512 * 1024 * 1024
_LEN = struct.Struct("<I")


def record(body: bytes) -> bytes:
    head = marshal.dumps((200, HEADERS, time.time(), 300.0))
    return _LEN.pack(len(head)) + head + body


def decode(rec: bytes) -> tuple[Any, bytes]:
    (n,) = _LEN.unpack_from(rec, 0)
    return marshal.loads(rec[4 : 4 + n]), rec[4 + n :]


def keys(n: int) -> list[bytes]:
    return [cache_key("bench", b"GET", b"/page/%d" % i, b"", "v1") for i in range(n)]


# -- backends ------------------------------------------------------------------


class LmdbBackend:
    def __init__(self, path: str) -> None:
        self.store = Store.open(path, MAX_BYTES)

    def put(self, key: bytes, body: bytes) -> None:
        meta = ObjectMeta(200, HEADERS, time.time(), 300.0, site="bench", url=b"/")
        self.store.put(key, meta, body)

    def get(self, key: bytes) -> Any:
        obj = self.store.get(key)
        assert obj is not None
        return obj

    def close(self) -> None:
        self.store.close()


class ShmFileBackend:
    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(path, exist_ok=True)
        self.index = os.path.join(path, "index")
        if not os.path.exists(self.index):
            with open(self.index, "wb") as f:
                f.write(struct.pack("<Q", 0))

    def put(self, key: bytes, body: bytes) -> None:
        name = os.path.join(self.path, key.hex())
        tmp = f"{name}.{os.getpid()}.tmp"
        rec = record(body)
        with open(tmp, "wb") as f:
            f.write(rec)
        os.replace(tmp, name)
        fd = os.open(self.index, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            (total,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            os.pwrite(fd, struct.pack("<Q", total + len(rec)), 0)
        finally:
            os.close(fd)

    def get(self, key: bytes) -> Any:
        with open(os.path.join(self.path, key.hex()), "rb") as f:
            return decode(f.read())

    def close(self) -> None:
        pass


def serve(path: str, ready: Any) -> None:
    """The cache process: one thread, non-blocking, dict in LRU order."""
    data: dict[bytes, bytes] = {}
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(64)
    srv.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, None)
    buffers: dict[socket.socket, bytearray] = {}
    ready.set()
    while True:
        for skey, _ in sel.select():
            if skey.data is None:
                conn, _ = srv.accept()
                conn.setblocking(True)
                sel.register(conn, selectors.EVENT_READ, "c")
                buffers[conn] = bytearray()
                continue
            conn = skey.fileobj  # type: ignore[assignment]
            chunk = conn.recv(1 << 20)
            if not chunk:
                sel.unregister(conn)
                conn.close()
                continue
            buf = buffers[conn]
            buf += chunk
            while len(buf) >= 9:
                op, klen, vlen = struct.unpack_from("<BHI", buf, 0)
                end = 7 + klen + vlen
                if len(buf) < end:
                    break
                key = bytes(buf[7 : 7 + klen])
                if op == 1:
                    data.pop(key, None)
                    data[key] = bytes(buf[7 + klen : end])
                    conn.sendall(b"\x01" + _LEN.pack(0))
                else:
                    value = data.pop(key, None)
                    if value is None:
                        conn.sendall(b"\x00" + _LEN.pack(0))
                    else:
                        data[key] = value  # most recently used last
                        conn.sendall(b"\x01" + _LEN.pack(len(value)) + value)
                del buf[:end]


class SocketBackend:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)

    def _call(self, op: int, key: bytes, value: bytes = b"") -> bytes:
        self.sock.sendall(struct.pack("<BHI", op, len(key), len(value)) + key + value)
        head = self._exactly(5)
        (n,) = _LEN.unpack_from(head, 1)
        return self._exactly(n) if n else b""

    def _exactly(self, n: int) -> bytes:
        parts = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("cache process went away")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def put(self, key: bytes, body: bytes) -> None:
        self._call(1, key, record(body))

    def get(self, key: bytes) -> Any:
        return decode(self._call(2, key))

    def close(self) -> None:
        self.sock.close()


BACKENDS: dict[str, Any] = {"lmdb": LmdbBackend, "shmfile": ShmFileBackend, "socket": SocketBackend}


# -- measurements ----------------------------------------------------------------


def latencies(backend: Any, op: str, ks: list[bytes], body: bytes) -> tuple[float, float]:
    times = []
    fn = backend.put if op == "put" else backend.get
    for k in ks:
        t = time.perf_counter()
        if op == "put":
            fn(k, body)
        else:
            fn(k)
        times.append((time.perf_counter() - t) * 1e6)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.99)]


def reader(name: str, path: str, ks: list[bytes], seconds: float, start: Any, out: Any) -> None:
    backend = BACKENDS[name](path)
    rnd = random.Random(os.getpid())
    start.wait()
    done = 0
    cpu = time.process_time()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(200):
            backend.get(ks[rnd.randrange(len(ks))])
        done += 200
    out.put((done, time.process_time() - cpu))
    backend.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of another process (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(name: str, size: int, n: int, seconds: float, ctx: Any) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="prexy-bench-", dir="/dev/shm")
    server = None
    try:
        path = os.path.join(root, "store")
        if name == "socket":
            path = os.path.join(root, "sock")
            ready = ctx.Event()
            server = ctx.Process(target=serve, args=(path, ready), daemon=True)
            server.start()
            ready.wait(10)
        body = os.urandom(size)
        ks = keys(n)
        backend = BACKENDS[name](path)
        put_med, put_p99 = latencies(backend, "put", ks, body)
        get_med, get_p99 = latencies(backend, "get", ks, body)
        backend.close()
        start = ctx.Event()
        out = ctx.Queue()
        readers = [ctx.Process(target=reader, args=(name, path, ks, seconds, start, out)) for _ in range(2)]
        for r in readers:
            r.start()
        time.sleep(0.5)  # let both open their backend
        server_cpu = cpu_seconds(server.pid) if server is not None and server.pid else 0.0
        start.set()
        results = [out.get(timeout=seconds + 30) for _ in readers]
        if server is not None and server.pid:
            server_cpu = cpu_seconds(server.pid) - server_cpu
        for r in readers:
            r.join()
        hits = sum(done for done, _ in results)
        cpu = sum(c for _, c in results) + server_cpu
        return {
            "put_med": put_med, "put_p99": put_p99, "get_med": get_med, "get_p99": get_p99,
            "hits": hits / seconds, "cpu_per_hit": cpu / hits * 1e6,
        }
    finally:
        if server is not None:
            server.terminate()
            server.join()
        shutil.rmtree(root, ignore_errors=True)


def lmdb_extras(n: int) -> list[str]:
    """Costs only the chosen store has: lookup with Vary, put into a full
    store (with eviction), purge_url, ban over every object."""
    root = tempfile.mkdtemp(prefix="prexy-bench-", dir="/dev/shm")
    try:
        store = Store.open(os.path.join(root, "store"), 8 * 1024 * 1024)
        headers = [(b"Accept-Encoding", b"gzip, deflate, br"), (b"User-Agent", b"bench")]
        urls = [b"/page/%d" % i for i in range(n)]
        meta = ObjectMeta(200, HEADERS, time.time(), 300.0, site="bench", vary=(b"accept-encoding",))
        full_times = []
        for url in urls:
            k = cache_key("bench", b"GET", url, vary_key(b"accept-encoding", headers), "v1")
            t = time.perf_counter()
            store.put(k, attrs.evolve(meta, url=url), b"x" * 2000)
            full_times.append((time.perf_counter() - t) * 1e6)
        stats = store.stats()
        alive = [u for u in urls if store.lookup("bench", b"GET", u, "v1", headers).obj is not None]
        times = []
        for url in alive:
            t = time.perf_counter()
            store.lookup("bench", b"GET", url, "v1", headers)
            times.append((time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        for url in alive[:100]:
            store.purge_url("bench", url)
        purge = (time.perf_counter() - t) / 100 * 1e6
        count = store.stats()["count"]
        t = time.perf_counter()
        banned = store.ban(Ban("bench", target=r"^/page/\d*7$"))
        ban = (time.perf_counter() - t) * 1e3
        store.close()
        full_times.sort()
        times.sort()
        return [
            f"- lookup (Vary: Accept-Encoding) p50 {statistics.median(times):.1f} µs, p99 {times[int(len(times) * 0.99)]:.1f} µs",
            f"- put of a 2 KB object into a full 8 MiB store ({stats['count']} objects, evicting): "
            f"p50 {statistics.median(full_times):.1f} µs, p99 {full_times[int(len(full_times) * 0.99)]:.1f} µs",
            f"- purge_url: {purge:.1f} µs",
            f"- ban scanning {count} objects, deleting {banned}: {ban:.1f} ms",
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=2000, help="objects per run")
    parser.add_argument("--seconds", type=float, default=2.0, help="duration of the 2-process hit run")
    parser.add_argument("--only", default=",".join(BACKENDS), help="backends, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    args = parser.parse_args()
    ctx = multiprocessing.get_context("spawn")
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, Python {sys.version.split()[0]}, "
        f"{args.n} objects, {args.seconds} s hit runs, median of {args.rounds} interleaved rounds\n"
    )
    names = args.only.split(",")
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for size in (12, 20 * 1024):
            for name in names:
                results.setdefault((name, size), []).append(run(name, size, args.n, args.seconds, ctx))
                print(".", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(
        "| backend | body | put p50 µs | put p99 µs | get p50 µs | get p99 µs "
        "| hits/s, 2 procs | CPU µs/hit (all procs) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size in (12, 20 * 1024):
        for name in names:
            runs = results[(name, size)]
            r = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
            label = "12 B" if size == 12 else "20 KB"
            print(
                f"| {name} | {label} | {r['put_med']:.1f} | {r['put_p99']:.1f} | {r['get_med']:.1f} "
                f"| {r['get_p99']:.1f} | {r['hits']:,.0f} | {r['cpu_per_hit']:.1f} |",
                flush=True,
            )
    print()
    for line in lmdb_extras(args.n * 5):
        print(line)


if __name__ == "__main__":
    main()
