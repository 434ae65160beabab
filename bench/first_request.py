"""The first-request figure: the first request after a start and
after a reload, against warm requests made the same way.

A request's time on this machine depends as much on what the process did
just before as on the process's own state.  Measured here (realistic
20 KB page, 10 rules): Prexy answers back-to-back requests on one kept
connection in about 0.4 ms, but a request on a new connection after
0.3 s without traffic takes about 2 ms, warm or not, and nginx +
subs_filter shows the same kind of jump.  A first request always comes
after such a pause (the start, the readiness check, the reload), so
comparing it with back-to-back requests measures the pause, not the
start.  This scenario compares like with like:

* nginx + subs_filter with the same rules, as the reference: its
  back-to-back time and its time after the pause on a new connection;
* per rule count, ``--starts`` fresh ``twistd prexy`` processes (one
  worker): after the readiness check, a pause, then the page on a new
  connection (*the first request*); then warm requests the same way (a
  pause, a new connection, a new URL) and back-to-back ones; then the
  rules file gets a comment (new bytes: a new rule set to compile),
  SIGHUP, the worker's "reloaded configuration" line, a pause, and the page
  on a new connection (*the first after reload*), then warm requests the
  same way again.

The target (first request within 1.5x of a warm one) is read on the
first / warm-after-the-same-pause ratio; the ratio to back-to-back
requests is printed beside it.
"""

from __future__ import annotations

import os
import signal
import statistics
import time

import content
import harness
import realistic
import servers
from harness import Client, fmt_ms, markdown_table
from scenarios import Bench, Report, target

#: Seconds without traffic before each request measured "after a pause".
PAUSE = 0.3
#: The page (the realistic 20 KB page of the subs scenario).
PATH = "/real20k.html"


def _fetch(client: Client, url: str) -> tuple[float, dict[str, str]]:
    got = client.get(url)
    if got.status != 200:
        raise RuntimeError(f"{url}: status {got.status}")
    return got.seconds, got.headers


def _after_pause(port: int, url: str) -> float:
    """One GET on a new connection after PAUSE seconds of quiet."""
    time.sleep(PAUSE)
    client = Client(port, 30)
    try:
        return _fetch(client, url)[0]
    finally:
        client.close()


def _warm_after_pause(port: int, label: str, n: int) -> float:
    return statistics.median(
        _after_pause(port, f"{PATH}?{label}={i}-{time.monotonic_ns()}") for i in range(n)
    )


def _back_to_back(port: int, label: str, n: int) -> float:
    client = Client(port, 30)
    try:
        times = [_fetch(client, f"{PATH}?{label}={i}-{time.monotonic_ns()}")[0] for i in range(n)]
    finally:
        client.close()
    return statistics.median(times[n // 2 :])


def _wait_reloaded(server: servers.Server, before: int, timeout: float = 60.0) -> None:
    """Wait until the worker logged one more "reloaded configuration"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.child.logfile.read_text(errors="replace").count("reloaded configuration") > before:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{server.name}: no reload logged in {timeout:g} s:\n{server.child.log_tail()}")


def scenario_first_request(bench: Bench) -> Report:
    """First request after start and after reload, against warm requests after the same pause."""
    s = bench.settings
    origin = bench.origin()
    module = harness.subs_module_path()
    if module is None:
        raise RuntimeError("libnginx-mod-http-subs-filter is not installed")
    starts = 2 if s.quick else 5
    warm_n = 8 if s.quick else 15
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    notes: list[str] = []
    verdicts: list[str] = []
    for count in realistic.RULE_COUNTS:
        nginx = servers.start_nginx_proxy(
            f"nginx-first-{count}", origin.port, modules=(module,),
            location_extra="            proxy_set_header Accept-Encoding \"\";\n"
            + "".join("            " + line + "\n"
                      for line in realistic.subs_filter_directives(count).splitlines()),
        )
        try:
            _back_to_back(nginx.port, "w", 50)
            n_paused = _warm_after_pause(nginx.port, "p", warm_n)
            n_b2b = _back_to_back(nginx.port, "b", 200)
        finally:
            nginx.stop()
        rows.append([str(count), "nginx + subs_filter", "-", fmt_ms(n_paused), fmt_ms(n_b2b), "-", "-", "-"])
        firsts: list[float] = []
        reloads: list[float] = []
        cell: list[dict[str, float]] = []
        for k in range(starts):
            rules_file = content.write(harness.WORK / "rules" / f"first-{count}-{k}.conf",
                                       realistic.rules_text(count))
            prexy = bench.start_prexy(f"prexy-first-{count}", notes, args=("--rules", str(rules_file)))
            if prexy is None:
                break
            try:
                first = _after_pause(prexy.port, f"{PATH}?first={time.monotonic_ns()}")
                paused = _warm_after_pause(prexy.port, "p", warm_n)
                b2b = _back_to_back(prexy.port, "b", 200)
                before = prexy.child.logfile.read_text(errors="replace").count("reloaded configuration")
                with open(rules_file, "a") as f:
                    f.write(f"# edited {k}\n")
                os.kill(prexy.child.pid, signal.SIGHUP)
                _wait_reloaded(prexy, before)
                reload = _after_pause(prexy.port, f"{PATH}?reloaded={time.monotonic_ns()}")
                paused2 = _warm_after_pause(prexy.port, "q", warm_n)
            finally:
                prexy.stop()
            firsts.append(first / paused)
            reloads.append(reload / paused2)
            cell.append({"first_s": first, "warm_after_pause_s": paused, "back_to_back_s": b2b,
                         "first_after_reload_s": reload, "warm_after_pause_after_reload_s": paused2})
            rows.append([
                str(count), f"Prexy, start {k + 1}", fmt_ms(first), fmt_ms(paused), fmt_ms(b2b),
                f"{first / paused:.2f}×", f"{first / b2b:.2f}×", f"{reload / paused2:.2f}×",
            ])
        data[f"{count} rules"] = cell
        if firsts:
            verdicts.append(target(
                f"{count} rules: first request after start ≤ 1.5× a warm one after the same pause "
                f"(median of {len(firsts)} starts {statistics.median(firsts):.2f}×)",
                statistics.median(firsts) <= 1.5))
            verdicts.append(target(
                f"{count} rules: first request after a reload ≤ 1.5× a warm one after the same pause "
                f"(median {statistics.median(reloads):.2f}×)",
                statistics.median(reloads) <= 1.5))
    table = markdown_table(
        ["rules", "server", "first request", f"warm, after {PAUSE:g} s pause, new connection",
         "warm, back to back", "first / warm after pause", "first / back to back",
         "first after reload / warm after pause"],
        rows,
    )
    notes.append(
        f"The realistic 20 KB page, a new URL each time. 'After a pause': {PAUSE:g} s without "
        "traffic, then a new connection (its connect counted); the first request and the first "
        "after a reload come that way too. Warm figures are medians of "
        f"{warm_n} (after a pause) and of the last 100 of 200 (back to back). The reload "
        "changes the rules file's bytes (a comment), so the worker compiles a new set ahead "
        "(in place, SIGHUP to the master)."
    )
    return Report("first request after start and after reload, realistic rules", table, notes, data,
                  verdicts)
