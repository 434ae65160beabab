"""Issue 20's HTTP/2 speed line, Prexy beside Debian's nginx in one run.

h2load (Debian's nghttp2-client) asks for the realistic 20 KB page through
10 realistic rules over TLS: HTTP/2 with 10 clients x 10 streams, and
HTTP/1.1 (``h2load --h1``) with 100 connections, the same number of
requests in flight.  Prexy (one worker, ``[server] http2 = true``) rewrites
every answer (no cache); nginx (one worker, ``listen ... ssl http2``) runs
subs_filter with the same rules.  Runs interleaved; req/s and, for Prexy,
CPU per request from /proc.  Target: Prexy's HTTP/2 req/s at least 0.5x
its HTTP/1.1 figure, and its CPU per request within 1.3x.
"""

from __future__ import annotations

import re
import statistics
import subprocess
from typing import Any

import content
import harness
import realistic
import servers
from harness import LOCAL, WORK, markdown_table


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


def scenario_http2(bench: Any) -> Any:
    """HTTP/2 against HTTP/1.1 through Prexy, nginx http2 beside it."""
    from scenarios import REAL_PATHS, Report, target

    s = bench.settings
    origin = bench.origin()
    install = bench.prexy()
    if install is None:
        raise RuntimeError(bench.install_error)
    key, cert = _cert(WORK / "tls")
    rules = content.write(WORK / "rules" / "rules-realistic-10.conf", realistic.rules_text(10))
    module = harness.subs_module_path()
    path = REAL_PATHS["html-20k"]
    prexy = servers.start_prexy_config(install, "prexy-h2", f"""[server]
listen = ["ssl:{{port}}:interface={LOCAL}"]
http2 = true
tls_certificate = "{cert}"
tls_key = "{key}"
access_log = "off"
[sites.bench]
upstream = "http://{LOCAL}:{origin.port}"
rules = ["{rules}"]
""", plain_http=False)
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
    notes: list[str] = []
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
    return Report("HTTP/2 (issue 20)", table, notes, {"rps": rps, "cpu_us": cpu}, targets)
