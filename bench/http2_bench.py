"""The HTTP/2 speed lines, Prexy beside Debian's nginx in one run.

1. h2load (Debian's nghttp2-client) asks for the realistic 20 KB page
   through 10 realistic rules over TLS: HTTP/2 with 10 clients x 10
   streams, and HTTP/1.1 (``h2load --h1``) with 100 connections, the same
   number of requests in flight.  Prexy (one worker, ``[server] http2 =
   true``) rewrites every answer (no cache); nginx (one worker, ``listen
   ... ssl http2``) runs subs_filter with the same rules.  Runs
   interleaved; req/s and CPU per request from /proc.  Target: Prexy's
   HTTP/2 req/s at least 0.5x its HTTP/1.1 figure, and its CPU per request
   within 1.3x.
2. A slow stream beside a fast one, on one connection: stream 1 asks for
   the 100 MB page (rewritten) and never opens its window; meanwhile the
   same connection asks for the 20 KB page again and again, one at a time.
   Targets: the fast stream's p99 at most 2x its p99 on a connection with
   no slow stream (interleaved), Prexy's RSS growth under 20 MB.
3. 200 concurrent streams on one connection (h2load -c1 -m200, the
   0.8 MB realistic page rewritten): none fails; Prexy's peak RSS under
   100 MB above idle.  Prexy advertises 256 concurrent streams for it
   (``[http2] max_concurrent_streams``; the default is nginx's 128).

Run ``python bench/run.py --quick --only http2`` (add ``--repo DIR`` to
measure another tree, e.g. the commit before Prexy's own HTTP/2 connection).
"""

from __future__ import annotations

import re
import socket
import ssl
import statistics
import subprocess
import threading
import time
from typing import Any

import content
import harness
import realistic
import servers
from harness import LOCAL, WORK, markdown_table
from scenarios import REAL_PATHS, Bench, Report, big_page, rss_mb, target


def _cert(directory: Any) -> tuple[str, str]:
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = directory / "key.pem", directory / "cert.pem"
    if not key.exists():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost"],
            check=True, capture_output=True,
        )
    return str(key), str(cert)


def h2load(url: str, *, h1: bool, seconds: float, cpu_of: Any = None) -> tuple[float, float | None]:
    """req/s (and CPU us per request of ``cpu_of``) of one timed h2load run."""
    args = ["h2load", "-D", str(max(1, round(seconds))), "--warm-up-time=1"]
    args += ["--h1", "-c100", "-m1"] if h1 else ["-c10", "-m10"]
    before = cpu_of() if cpu_of else 0.0
    done = subprocess.run([*args, url], capture_output=True, text=True, timeout=seconds + 60)
    after = cpu_of() if cpu_of else 0.0
    m = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", done.stdout)
    ok = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", done.stdout)
    if m is None or ok is None:
        raise RuntimeError(f"h2load failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    succeeded = int(ok.group(3))
    if int(ok.group(4)):
        raise RuntimeError(f"h2load: {ok.group(4)} requests failed")
    cpu = (after - before) / succeeded * 1e6 if cpu_of and succeeded else None
    return float(m.group(1)), cpu


def scenario_http2(bench: Bench) -> Report:
    """HTTP/2 against HTTP/1.1 through Prexy, nginx http2 beside it."""
    s = bench.settings
    origin = bench.origin()
    install = bench.prexy()
    if install is None:
        raise RuntimeError(bench.install_error)
    key, cert = _cert(WORK / "tls")
    rules = content.write(WORK / "rules" / "rules-realistic-10.conf", realistic.rules_text(10))
    module = harness.subs_module_path()
    path = REAL_PATHS["html-20k"]
    config = f"""[server]
listen = ["ssl:{{port}}:interface={LOCAL}"]
http2 = true
tls_certificate = "{cert}"
tls_key = "{key}"
access_log = "off"
[http2]
max_concurrent_streams = 256
[sites.bench]
upstream = "http://{LOCAL}:{origin.port}"
rules = ["{rules}"]
"""
    notes: list[str] = []
    try:
        prexy = servers.start_prexy_config(install, "prexy-h2", config, plain_http=False)
    except Exception:  # a Prexy from before the [http2] table (twisted.web's connection)
        config = config.replace("[http2]\nmax_concurrent_streams = 256\n", "")
        prexy = servers.start_prexy_config(install, "prexy-h2", config, plain_http=False)
        notes.append("This Prexy has no [http2] table: h2's default of 100 concurrent streams.")
    nginx = None
    if module is not None:
        directives = "".join("            " + line + "\n" for line in realistic.subs_filter_directives(10).splitlines())
        nginx = servers.start_nginx("nginx-h2", f"""        listen {LOCAL}:{{tls_port}} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{
            proxy_pass http://{LOCAL}:{origin.port};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Accept-Encoding "";
{directives}        }}
""".replace("{tls_port}", str(harness.free_port())), modules=(module,))
    try:
        rounds = 3
        seconds = 3.0 if s.quick else 6.0
        cells: dict[str, list[tuple[float, float | None]]] = {}
        plan = [("prexy h2", prexy, False), ("prexy h1", prexy, True)]
        if nginx is not None:
            tls_port = int(re.search(rb"listen [\d.]+:(\d+) ssl", (WORK / "nginx-h2" / "nginx.conf").read_bytes()).group(1))
            plan += [("nginx h2", nginx, False), ("nginx h1", nginx, True)]
        for r in range(rounds):
            for name, srv, h1 in plan if r % 2 == 0 else list(reversed(plan)):
                port = srv.port if srv is prexy else tls_port
                url = f"https://{LOCAL}:{port}{path}"
                cells.setdefault(name, []).append(h2load(url, h1=h1, seconds=seconds, cpu_of=srv.cpu))
                harness.log(f"  {name}: {cells[name][-1][0]:,.0f} req/s")
        big = big_page(bench)
        slow = slow_beside_fast(prexy.port, path, big, 150 if s.quick else 500, lambda: rss_mb(prexy), prexy.cpu)
        many = many_streams(prexy.port, REAL_PATHS["html-1m"], 200, 600 if s.quick else 2000, lambda: rss_mb(prexy))
    finally:
        prexy.stop()
        if nginx is not None:
            nginx.stop()
    rps = {n: statistics.median(r for r, _ in v) for n, v in cells.items()}
    cpu = {n: statistics.median(c for _, c in v if c is not None) for n, v in cells.items() if any(c for _, c in v)}
    rows = [[n, f"{rps[n]:,.0f}", f"{cpu[n]:.0f}" if n in cpu else "-"] for n in rps]
    table = markdown_table(["server, protocol", "req/s (median)", "CPU us/req"], rows)
    r = rps["prexy h2"] / rps["prexy h1"]
    c = cpu["prexy h2"] / cpu["prexy h1"]
    targets = [
        target(f"Prexy HTTP/2 req/s at least 0.5x its HTTP/1.1 figure ({r:.2f}x)", r >= 0.5),
        target(f"Prexy HTTP/2 CPU per request within 1.3x of HTTP/1.1's ({c:.2f}x)", c <= 1.3),
    ]
    notes.append(f"h2load over TLS, HTTP/2 -c10 -m10 and HTTP/1.1 --h1 -c100, {rounds} interleaved runs of "
                 f"{seconds:.0f} s per cell; the realistic 20 KB page through 10 realistic rules, rewritten "
                 "every time (no cache); one Prexy worker, one nginx worker with subs_filter.")
    p99_ratio = slow["p99_loaded_ms"] / slow["p99_alone_ms"]
    table += "\n" + markdown_table(
        ["Prexy HTTP/2, one connection", "fast p50 ms", "fast p99 ms", "RSS growth MB", "slow stream got",
         "CPU, stalled stream alone"],
        [["fast stream alone", f"{slow['p50_alone_ms']:.2f}", f"{slow['p99_alone_ms']:.2f}", "-", "-", "-"],
         ["beside a stalled 100 MB stream", f"{slow['p50_loaded_ms']:.2f}", f"{slow['p99_loaded_ms']:.2f}",
          f"{slow['rss_growth_mb']:.1f}", f"{slow['slow_bytes']:,} B", f"{slow['stalled_cpu'] * 100:.0f}%"]],
    )
    table += "\n" + markdown_table(
        ["200 streams on one connection", "requests", "failed", "req/s", "RSS idle MB", "RSS peak MB"],
        [[str(many["streams"]), f"{many['succeeded']:,}", f"{many['failed']}", f"{many['rps']:,.0f}",
          f"{many['rss_idle_mb']:.1f}", f"{many['rss_peak_mb']:.1f}"]],
    )
    targets += [
        target(f"fast stream's p99 beside a stalled one at most 2x alone ({p99_ratio:.2f}x)", p99_ratio <= 2),
        target(f"RSS growth with a stalled 100 MB rewritten stream under 20 MB ({slow['rss_growth_mb']:.1f} MB)",
               slow["rss_growth_mb"] < 20),
        target(f"no busy loop: a stalled stream alone uses under 5% of a core ({slow['stalled_cpu'] * 100:.0f}%)",
               slow["stalled_cpu"] < 0.05),
        target(f"200 concurrent streams: none fails ({many['failed']} failed)", many["failed"] == 0),
        target(f"200 concurrent streams: RSS under 100 MB above idle "
               f"({many['rss_peak_mb'] - many['rss_idle_mb']:.1f} MB)", many["rss_peak_mb"] - many["rss_idle_mb"] < 100),
    ]
    notes.append(f"Slow stream: stream 1 GETs {big} (rewritten) and never opens its window; the fast stream GETs "
                 f"{path} {slow['n']} times one after another on the same connection, and as often on a "
                 "connection of its own, interleaved in 2 rounds each; RSS of the Prexy processes before the "
                 "slow stream and after the last fast request; then Prexy's CPU in 1 s with only the stalled "
                 "stream open.")
    notes.append(f"200 streams: h2load -c1 -m{many['streams']} -n{many['requested']} on "
                 f"{REAL_PATHS['html-1m']} (rewritten); peak RSS sampled every 20 ms.")
    data = {"rps": rps, "cpu_us": cpu, "slow_beside_fast": slow, "many_streams": many}
    return Report("HTTP/2", table, notes, data, targets)


class Probe:
    """A blocking HTTP/2 client for measurements: hyperframe frames on a
    TLS socket (ALPN h2).  Streams in ``stalled`` get no WINDOW_UPDATE; the
    connection's window is always reopened, so a stalled stream holds up
    nobody but itself on the client side."""

    def __init__(self, port: int) -> None:
        from hpack import Decoder, Encoder
        from hyperframe.frame import SettingsFrame, WindowUpdateFrame

        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        raw = socket.create_connection((LOCAL, port), timeout=60)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = context.wrap_socket(raw, server_hostname="localhost")
        self.encoder, self.decoder = Encoder(), Decoder()
        self.buffer = b""
        self.ended: set[int] = set()
        self.received: dict[int, int] = {}
        self.stalled: set[int] = set()
        self.sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + SettingsFrame(0).serialize()
                          + WindowUpdateFrame(0, window_increment=1 << 30).serialize())

    def get(self, sid: int, path: str) -> None:
        from hyperframe.frame import HeadersFrame

        block = self.encoder.encode([(":method", "GET"), (":path", path), (":scheme", "https"),
                                     (":authority", "bench.test")])
        self.sock.sendall(HeadersFrame(sid, block, flags=["END_HEADERS", "END_STREAM"]).serialize())

    def until(self, done: Any) -> None:
        from hyperframe.frame import (
            DataFrame,
            Frame,
            HeadersFrame,
            PingFrame,
            SettingsFrame,
            WindowUpdateFrame,
        )

        while not done():
            data = self.sock.recv(1 << 20)
            if not data:
                raise RuntimeError("the server closed the connection")
            self.buffer += data
            out = []
            while len(self.buffer) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self.buffer[:9]))
                if len(self.buffer) < 9 + length:
                    break
                frame.parse_body(memoryview(self.buffer[9 : 9 + length]))
                self.buffer = self.buffer[9 + length :]
                sid = frame.stream_id
                if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                    out.append(SettingsFrame(0, flags=["ACK"]).serialize())
                elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
                    out.append(PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]).serialize())
                elif isinstance(frame, HeadersFrame):
                    self.decoder.decode(frame.data)
                elif isinstance(frame, DataFrame):
                    self.received[sid] = self.received.get(sid, 0) + len(frame.data)
                    size = frame.flow_controlled_length
                    if size:
                        out.append(WindowUpdateFrame(0, window_increment=size).serialize())
                        if sid not in self.stalled:
                            out.append(WindowUpdateFrame(sid, window_increment=size).serialize())
                if "END_STREAM" in frame.flags:
                    self.ended.add(sid)
            if out:
                self.sock.sendall(b"".join(out))

    def close(self) -> None:
        self.sock.close()


def _fast_loop(probe: Probe, first_sid: int, path: str, n: int) -> list[float]:
    """Latencies (s) of ``n`` GETs of ``path`` one after another."""
    out = []
    sid = first_sid
    for _ in range(n):
        started = time.perf_counter()
        probe.get(sid, path)
        probe.until(lambda sid=sid: sid in probe.ended)
        out.append(time.perf_counter() - started)
        sid += 2
    return out


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


def slow_beside_fast(port: int, fast_path: str, slow_path: str, n: int, rss: Any, cpu: Any) -> dict[str, Any]:
    """The fast stream's latency alone and beside a stalled stream of
    ``slow_path`` on the same connection; Prexy's RSS growth meanwhile, and
    the CPU it uses in a second with only the stalled stream open."""
    warm = Probe(port)
    _fast_loop(warm, 1, fast_path, 20)
    warm.close()
    alone: list[float] = []
    loaded: list[float] = []
    growth = 0.0
    slow_bytes = 0
    stalled_cpu = 0.0
    for _ in range(2):
        probe = Probe(port)
        alone += _fast_loop(probe, 1, fast_path, n)
        probe.close()
        before = rss()
        probe = Probe(port)
        probe.stalled.add(1)
        probe.get(1, slow_path)
        probe.until(lambda probe=probe: probe.received.get(1, 0) >= 65535)
        loaded += _fast_loop(probe, 3, fast_path, n)
        growth = max(growth, rss() - before)
        slow_bytes = probe.received.get(1, 0)
        started, used = time.perf_counter(), cpu()
        time.sleep(1.0)
        stalled_cpu = max(stalled_cpu, (cpu() - used) / (time.perf_counter() - started))
        probe.close()
    return {
        "n": n, "p50_alone_ms": _p(alone, 0.5), "p99_alone_ms": _p(alone, 0.99),
        "p50_loaded_ms": _p(loaded, 0.5), "p99_loaded_ms": _p(loaded, 0.99),
        "rss_growth_mb": growth, "slow_bytes": slow_bytes, "stalled_cpu": stalled_cpu,
    }


def many_streams(port: int, path: str, streams: int, requests: int, rss: Any) -> dict[str, Any]:
    """h2load with ``streams`` concurrent streams on one connection; Prexy's
    idle and peak RSS."""
    idle = rss()
    peak = [idle]
    halt = threading.Event()

    def sample() -> None:
        while not halt.wait(0.02):
            peak[0] = max(peak[0], rss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        done = subprocess.run(["h2load", "-c1", f"-m{streams}", f"-n{requests}", f"https://{LOCAL}:{port}{path}"],
                              capture_output=True, text=True, timeout=600)
    finally:
        halt.set()
        sampler.join()
    m = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", done.stdout)
    ok = re.search(r"requests: (\d+) total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored",
                   done.stdout)
    if m is None or ok is None:
        raise RuntimeError(f"h2load failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    return {
        "streams": streams, "requested": requests, "succeeded": int(ok.group(3)),
        "failed": requests - int(ok.group(3)),
        "rps": float(m.group(1)), "rss_idle_mb": idle, "rss_peak_mb": peak[0],
    }
