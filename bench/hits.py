"""The compressed-hits figure: cache hits of a rewritten 20 KB page
(the real page of the subs scenario, 10 realistic rules) to clients that
take gzip or br, against hits to clients that take no coding, on the same
Prexy (2 workers, one shared store), wrk runs interleaved.

A hit never compresses: the first hit in each coding stores the compressed
variant (warmed before measuring), every later one reads it.  So the
figure to watch is req/s with a coding over req/s without, which the issue
wants within 10% (the bytes sent are fewer; the work per hit is one more
store read and the negotiation).
"""

from __future__ import annotations

import statistics

import content
import harness
import realistic
import servers
from harness import LOCAL, markdown_table
from scenarios import REAL_PATHS, Bench, Report, target


def scenario_compressed_hits(bench: Bench) -> Report:
    """req/s of cache hits in gzip and br, over hits in identity."""
    s = bench.settings
    origin = bench.origin()
    install = bench.prexy()
    if install is None:
        raise RuntimeError(bench.install_error)
    rules = content.write(harness.WORK / "rules" / "rules-realistic-10.conf", realistic.rules_text(10))
    prexy = servers.start_prexy_config(install, "prexy-hits", f"""[server]
listen = ["tcp:{{port}}:interface={LOCAL}"]
access_log = "off"
[cache]
size = "256M"
[sites.bench]
upstream = "http://{LOCAL}:{origin.port}"
rules = ["{rules}"]
cache = true
cache_ttl = 3600
""", workers=2)
    path = REAL_PATHS["html-20k"]
    codings = {"identity": (), "gzip": ("Accept-Encoding: gzip",), "br": ("Accept-Encoding: gzip, br",)}
    notes: list[str] = []
    try:
        client = harness.Client(prexy.port, 30)
        sizes = {}
        for name, headers in codings.items():
            for _ in range(3):  # the miss, the first hit in the coding, a plain hit
                got = client.get(path, headers=dict(h.split(": ", 1) for h in headers))
            if got.status != 200 or "hit" not in got.headers.get("cache-status", ""):
                raise RuntimeError(f"{name}: no cache hit ({got.status}, {got.headers.get('cache-status')!r})")
            want = None if name == "identity" else name
            if got.headers.get("content-encoding") != want:
                raise RuntimeError(f"{name}: Content-Encoding {got.headers.get('content-encoding')!r}")
            sizes[name] = len(got.body)
        client.close()
        rounds = s.rounds if s.rounds > 1 else 3
        runs: dict[str, list[float]] = {name: [] for name in codings}
        cpu: dict[str, list[float]] = {name: [] for name in codings}
        names = list(codings)
        for r in range(rounds):
            for name in names if r % 2 == 0 else reversed(names):
                result = harness.wrk(prexy.url(path), seconds=s.seconds, connections=50, threads=2,
                                     cpu_of=prexy.cpu, headers=codings[name])
                if result.errors or result.non2xx:
                    notes.append(f"{name}: {result.errors} errors, {result.non2xx} non-2xx")
                runs[name].append(result.rps)
                if result.cpu_us_per_req is not None:
                    cpu[name].append(result.cpu_us_per_req)
                harness.log(f"  hits {name}: {result.rps:,.0f} req/s")
    finally:
        prexy.stop()
    rps = {name: statistics.median(v) for name, v in runs.items()}
    us = {name: statistics.median(v) if v else float("nan") for name, v in cpu.items()}
    rows = [[name, f"{sizes[name]:,}", f"{rps[name]:,.0f}", f"{us[name]:.0f}",
             f"{rps[name] / rps['identity']:.2f}x"] for name in codings]
    table = markdown_table(["hits to a client taking", "bytes", "req/s (median)", "CPU us/req",
                            "req/s / identity"], rows)
    worst = min(rps["gzip"], rps["br"]) / rps["identity"]
    targets = [target(f"compressed hits within 10% of identity hits' req/s: {worst:.2f}x", worst >= 0.9)]
    notes.append(f"wrk -c50 -t2, {rounds} interleaved runs of {s.seconds:.0f} s per coding; "
                 "Prexy with 2 workers and one shared store.")
    return Report("Compressed cache hits", table, notes,
                  {"rps": rps, "cpu_us": us, "sizes": sizes}, targets)
