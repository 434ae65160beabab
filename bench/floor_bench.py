"""The floor of this architecture, beside Prexy and the peers.

Two requests, each measured on three servers, one process each, wrk runs
interleaved (CPU per request from each server's own CPU time):

- a 20 KB cache hit: Varnish (built-in VCL), ``floor_hit.py`` (the least a
  Twisted server does per hit with Prexy's duties: llhttp, Prexy's LMDB
  store, one send, an access log line) and Prexy (``--cache-size``, one
  worker);
- a proxied 12 B request: nginx ``proxy_pass`` (upstream keep-alive),
  ``floor_proxy.py`` (the least a Twisted proxy does per request with
  Prexy's transducer and one rule) and Prexy (one worker).

The ratios say how far each target is from the floor: what Prexy spends
above the floor goes to how Prexy is written, what the floor spends
above the peer to Twisted and CPython.
"""

from __future__ import annotations

import sys
from pathlib import Path

import content
import harness
import servers
from harness import WORK, fmt, markdown_table, ratio
from scenarios import PATHS, SIZES, Bench, Report, check_ok, interleaved_wrk, target
from servers import Server

HERE = Path(__file__).resolve().parent


def _start_script(bench: Bench, name: str, script: str, *args: str) -> Server:
    """One of the floor programs, on a free port, with the benchmark's Python."""
    install = bench.prexy()
    python = str(install.python) if install is not None else sys.executable
    port = harness.free_port()
    child = harness.spawn(name, [python, str(HERE / script), str(port), *args])
    harness.wait_port(child, port, timeout=60)
    return Server(name, port, child)


def scenario_floor(bench: Bench) -> Report:
    """CPU per request: the peer, the architecture's floor, Prexy."""
    s = bench.settings
    origin = bench.origin()
    notes: list[str] = []
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    verdicts: list[str] = []
    conns = max(s.connections)
    hit_path, proxied_path = PATHS["20 KB"], PATHS["12 B"]
    body = harness.get_once(origin.port, hit_path).body
    body_file = content.write(WORK / "floor" / "page20k.html", body)
    rules = content.write(WORK / "floor" / "never.rules", "replace_filter 'zzqq-never' 'x' g;\n")
    started: list[Server] = []
    try:
        cells = [
            ("20 KB hit", hit_path, "Varnish",
             lambda: servers.start_varnish("floor-varnish", origin.port),
             lambda: _start_script(bench, "floor-hit", "floor_hit.py", str(body_file)),
             lambda: bench.start_prexy("floor-prexy-cache", notes, args=("--cache-size", "256M"))),
            ("12 B proxied", proxied_path, "nginx",
             lambda: servers.start_nginx_proxy("floor-nginx", origin.port),
             lambda: _start_script(bench, "floor-proxy", "floor_proxy.py", str(rules), f"127.0.0.1:{origin.port}"),
             lambda: bench.start_prexy("floor-prexy", notes)),
        ]
        for label, path, peer_name, start_peer, start_floor, start_prexy in cells:
            peer, floor, prexy = start_peer(), start_floor(), start_prexy()
            trio = [x for x in (peer, floor, prexy) if x is not None]
            started += trio
            targets = [x for x in trio if x is floor or check_ok(x, path, SIZES[path], notes)]
            for srv in targets:  # a hit path: fill the caches
                harness.get_once(srv.port, path)
            res = interleaved_wrk(targets, path, bench, connections=conns, notes=notes)
            got = {name: res.get(srv.name) for name, srv in (("peer", peer), ("floor", floor), ("prexy", prexy)) if srv}
            cpu = {k: (v.cpu_us_per_req if v else None) for k, v in got.items()}
            rps = {k: (v.rps if v else None) for k, v in got.items()}
            rows.append([
                label, peer_name, fmt(cpu.get("peer")), fmt(cpu.get("floor")), fmt(cpu.get("prexy")),
                ratio(cpu.get("floor"), cpu.get("peer")), ratio(cpu.get("prexy"), cpu.get("peer")),
                ratio(cpu.get("prexy"), cpu.get("floor")),
                fmt(rps.get("peer")), fmt(rps.get("floor")), fmt(rps.get("prexy")),
            ])
            data[label] = got
            for srv in trio:
                srv.stop()
            started = []
            limit = 2.0 if label.endswith("hit") else 3.0
            p, peer_us = cpu.get("prexy"), cpu.get("peer")
            r = p / peer_us if p and peer_us else None
            verdicts.append(target(
                f"{label}: Prexy's CPU per request ≤ {limit:g}× {peer_name}'s ({fmt(r, 2)}×)",
                None if r is None else r <= limit))
    finally:
        for srv in started:
            srv.stop()
    table = markdown_table(
        ["request", "peer", "peer CPU µs/req", "floor CPU µs/req", "Prexy CPU µs/req",
         "floor/peer", "Prexy/peer", "Prexy/floor", "peer req/s", "floor req/s", "Prexy req/s"],
        rows,
    )
    notes.append(
        f"wrk -t{s.threads} -c{conns} on 127.0.0.1, {s.seconds:g} s per run, medians of {s.rounds} "
        "interleaved runs; one process each (nginx one worker; Varnish's manager and child both "
        "counted); CPU per request = utime+stime of the server's processes over the run / requests. "
        "The floors: bench/floor_hit.py and bench/floor_proxy.py (their docstrings say what they do)."
    )
    return Report("floor: the peer, the architecture's floor and Prexy", table, notes, data, verdicts)
