"""The sites-at-scale line: thousands of sites on one node.

    python bench/sites_bench.py [--sites 10000] [--workers 2] [--layout include|inline]
                                [--twistd PATH] [--check-only]

Generates a configuration of N sites (default 10,000; ``--sites 1000`` for
a quick run), each with 20 rules: a standard set of 10 shared by every site
plus one of 500 distinct sets of 10 (so 500 distinct rule sets to compile),
and a small origin (``python -m http.server`` on loopback) serving one page
with the strings the rules rewrite.  Site 0 names its own copy of set 0
(same bytes, so it shares set 0's compiled object until it changes).

Measured, in one run:

- ``--check``: wall time of ``twistd prexy --config FILE --check``;
- start: from spawning ``twistd -n prexy --config FILE`` to the first 200
  answer (a GET for site 0, retried every 20 ms until one arrives);
- RSS of the master and of each worker, after that first answer, after
  one request to each of 100 sites, and (at the end) with every distinct
  rule set compiled in every worker;
- reload: under a bounded load (4 client threads, keep-alive, requests
  spread over 200 sites including site 0), site 0's rules file changes and
  ``POST /reload`` goes to the admin endpoint (after a warm-up: each of
  the 200 sites' rule sets compiled by the load's first requests); the time from sending it
  until site 0 answers with the new replacement, the time until the POST
  is answered, and the failed requests (any status but 200, any connection
  error) during the whole load.

Targets: first answer under 5 s after start; RSS per worker
under 300 MB; a reload after one site's rules change under 1 s to take
effect, no request failing.  ``--layout inline`` writes every site into
the main file (what a configuration looked like before ``include``).
Stdlib only; ``bench/run.py --only sites`` runs it with the bench's Prexy.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

LOCAL = "127.0.0.1"
DISTINCT = 500
#: The page every site's upstream serves: a little of everything the rules match.
PAGE_LINKS = 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOCAL, 0))
        return int(s.getsockname()[1])


def standard_rules() -> str:
    """The 10 rules every site shares (analytics ids, CDN, a banner)."""
    return "\n".join([
        "# the standard rules every site includes",
        "replace_filter_types text/html text/css application/javascript;",
        r"replace_filter 'https?://cdn\.shared-cdn\.com/' 'https://cdn.clone-cdn.nl/' g;",
        r"replace_filter '(UA-)\d+-\d+' '${1}99999-9' g;",
        r"replace_filter 'G-[A-Z0-9]{10}' 'G-CLONE00000' g;",
        r"replace_filter 'AIza[0-9A-Za-z_-]{35}' 'AIzaCLONEKEY' g;",
        r"replace_filter '</head>' '<script src=\"/clone.js\"></script></head>';",
        r"replace_filter 'https?://fonts\.shared-fonts\.com' 'https://fonts.clone.nl' g;",
        r"replace_filter '//static\.shared-cdn\.com' '//static.clone-cdn.nl' g;",
        r"replace_filter 'shared-analytics\.com' 'clone-analytics.nl' gi;",
        r"replace_filter '\bCopyright (\d{4})\b' 'Copyright $1 Clone' g;",
        r"replace_filter 'https:\\/\\/api\.shared-cdn\.com' 'https:\\/\\/api.clone-cdn.nl' g;",
        "",
    ])


def distinct_rules(k: int, marker: str = "nl") -> str:
    """Set ``k``'s 10 rules: its own host names in every form a page has them."""
    h = f"site{k}"
    return "\n".join([
        f"# distinct rule set {k}",
        rf"replace_filter '(https?:)//www\.{h}\.com' '$1//www.{h}.{marker}' g;",
        rf"replace_filter '//img\.{h}\.com' '//img.{h}.{marker}' g;",
        rf"replace_filter '//api\.{h}\.com' '//api.{h}.{marker}' g;",
        rf"replace_filter 'https:\\/\\/www\.{h}\.com' 'https:\\/\\/www.{h}.{marker}' g;",
        rf"replace_filter '\bshop\.{h}\.com\b' 'shop.{h}.{marker}' g;",
        rf"replace_filter 'm\.{h}\.com' 'm.{h}.{marker}' gi;",
        rf"replace_filter '{h}\.com/(en|de|fr)/' '{h}.{marker}/$1/' g;",
        rf"replace_filter '\b{h}\.com\b' '{h}.{marker}' gi;",
        rf"replace_filter '(UA-{k:05d})-\d+' '$1-{k}' g;",
        rf"replace_filter 'Welcome to {h}' 'Welcome to {h} ({marker})';",
        "",
    ])


def page() -> bytes:
    """The origin's page: links on site 0's hosts and on the shared hosts."""
    links = []
    for i in range(PAGE_LINKS):
        links.append(f'<a href="https://www.site0.com/p/{i}">p{i}</a> <img src="//img.site0.com/{i}.png">')
        links.append(f'<link href="https://cdn.shared-cdn.com/{i}.css">')
    body = (
        "<html><head><title>Welcome to site0</title>"
        "<script>ga('UA-12345-6'); gtag('G-ABCDEFGHIJ');</script></head><body>\n"
        + "\n".join(links)
        + "\n<p>Copyright 2024 site0.com</p></body></html>\n"
    )
    return body.encode()


def generate(directory: Path, sites: int, *, layout: str = "include", origin_port: int,
             port: int, admin_port: int, workers: int) -> Path:
    """Write the configuration, rules files and the origin's page; the main file's path."""
    rules_dir = directory / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    (rules_dir / "standard.rules").write_text(standard_rules())
    for k in range(min(DISTINCT, sites)):
        (rules_dir / f"set-{k}.rules").write_text(distinct_rules(k))
    # Site 0's own file: the same bytes as set 0 until the reload changes it.
    (rules_dir / "site-0.rules").write_text(distinct_rules(0))
    www = directory / "www"
    www.mkdir(exist_ok=True)
    (www / "index.html").write_bytes(page())

    def site_table(i: int, up: str = "") -> str:
        # (a site file's relative names resolve against its own folder)
        own = "rules/site-0.rules" if i == 0 else f"rules/set-{i % DISTINCT}.rules"
        return (
            f"[sites.s{i}]\n"
            f'hosts = ["s{i}.test"]\n'
            f'upstream = "http://{LOCAL}:{origin_port}"\n'
            f'rules = ["{up}rules/standard.rules", "{up}{own}"]\n'
        )

    main = [
        "[server]",
        f'listen = ["tcp:{port}:interface={LOCAL}"]',
        f'admin = "tcp:{admin_port}:interface={LOCAL}"',
        'access_log = "off"',
        f"workers = {workers}",
        "shutdown_timeout = 5",
        'default_site = "s0"',
        "",
    ]
    if layout == "inline":
        main += [site_table(i) for i in range(sites)]
    else:
        main.insert(0, 'include = "sites.d/*.toml"')
        sites_dir = directory / "sites.d"
        sites_dir.mkdir(exist_ok=True)
        for i in range(sites):
            (sites_dir / f"s{i}.toml").write_text(site_table(i, "../"))
    conf = directory / "prexy.toml"
    conf.write_text("\n".join(main))
    return conf


# --------------------------------------------------------------------------
# Processes


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def _get(port: int, host: str, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(LOCAL, port, timeout=timeout)
    try:
        conn.request("GET", "/index.html", headers={"Host": host})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def _wait_answer(port: int, host: str, deadline: float) -> float:
    """Seconds (perf_counter) at which the first 200 for ``host`` arrived."""
    while time.perf_counter() < deadline:
        try:
            status, _ = _get(port, host, timeout=deadline - time.perf_counter())
            if status == 200:
                return time.perf_counter()
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"no answer for {host} before the deadline")


class Load:
    """A bounded load: ``threads`` keep-alive clients, requests over ``sites``
    sites in turn, every failure counted."""

    def __init__(self, port: int, sites: int, threads: int = 4) -> None:
        self.port = port
        self.sites = sites
        self.threads = threads
        self.ok = 0
        self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers = [threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)]

    def start(self) -> None:
        for w in self._workers:
            w.start()

    def stop(self) -> None:
        self._stop.set()
        for w in self._workers:
            w.join(30)

    def _run(self, offset: int) -> None:
        conn: http.client.HTTPConnection | None = None
        i = offset
        while not self._stop.is_set():
            host = f"s{(i * 7) % self.sites}.test"
            i += self.threads
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(LOCAL, self.port, timeout=10)
                conn.request("GET", "/index.html", headers={"Host": host})
                answer = conn.getresponse()
                answer.read()
                good = answer.status == 200
                if answer.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                good = False
                self.errors.append(f"{host}: {exc!r}")
                if conn is not None:
                    conn.close()
                conn = None
            with self._lock:
                if good:
                    self.ok += 1
                else:
                    self.failed += 1
            time.sleep(0.002)  # bounded: about 500 requests/s per thread at most
        if conn is not None:
            conn.close()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def compile_prexy(python: str) -> None:
    """Compile the Prexy that ``python`` imports to bytecode, as an install
    leaves it: a source tree run with ``PYTHONDONTWRITEBYTECODE`` would
    otherwise compile it anew in every process it starts (about 0.2 s of
    CPU each)."""
    where = subprocess.run([python, "-c", "import os, prexy; print(os.path.dirname(prexy.__file__))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([python, "-m", "compileall", "-q", where], check=True, stdout=subprocess.DEVNULL)


def run(sites: int, *, twistd: str, python: str, workers: int = 2, layout: str = "include",
        check_only: bool = False, keep: Path | None = None) -> dict[str, Any]:
    """One whole measurement; the numbers as a dict."""
    directory = Path(tempfile.mkdtemp(prefix="prexy-sites-")) if keep is None else keep
    directory.mkdir(parents=True, exist_ok=True)
    origin_port, port, admin_port = _free_port(), _free_port(), _free_port()
    t0 = time.perf_counter()
    conf = generate(directory, sites, layout=layout, origin_port=origin_port, port=port,
                    admin_port=admin_port, workers=workers)
    result: dict[str, Any] = {"sites": sites, "rules_per_site": 20, "distinct_sets": min(DISTINCT, sites),
                              "workers": workers, "layout": layout,
                              "generate_s": round(time.perf_counter() - t0, 2)}
    compile_prexy(python)
    t0 = time.perf_counter()
    check = subprocess.run([twistd, "prexy", "--config", str(conf), "--check"], capture_output=True, text=True)
    result["check_s"] = round(time.perf_counter() - t0, 2)
    if check.returncode != 0:
        raise RuntimeError(f"--check failed: {check.stderr[-2000:]}")
    if check_only:
        return result
    origin = subprocess.Popen(
        [python, "-m", "http.server", "--bind", LOCAL, "--directory", str(directory / "www"), str(origin_port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    log = open(directory / "prexy.log", "wb")
    proxy: subprocess.Popen[bytes] | None = None
    try:
        _wait_answer(origin_port, "origin", time.perf_counter() + 10)
        started = time.perf_counter()
        proxy = subprocess.Popen([twistd, "-n", "--pidfile=", "prexy", "--config", str(conf)],
                                 stdout=log, stderr=subprocess.STDOUT, cwd=directory)
        first = _wait_answer(port, "s0.test", started + 300)
        result["first_answer_s"] = round(first - started, 2)
        # CPU used until then: on an idle machine with as many cores as
        # workers, start-up takes about master + one worker (the workers
        # start side by side); these do not depend on other load.
        result["start_cpu_master_s"] = round(_cpu_s(proxy.pid), 2)
        result["start_cpu_workers_s"] = [round(_cpu_s(k), 2) for k in _children(proxy.pid)]
        result["loadavg_at_start"] = _loadavg()
        status, body = _get(port, "s0.test")
        if b"www.site0.nl" not in body:
            raise RuntimeError("site 0 was not rewritten")
        time.sleep(1.0)  # let every worker finish starting
        kids = _children(proxy.pid)
        result["rss_master_mb"] = round(_rss_mb(proxy.pid), 1)
        result["rss_workers_mb_idle"] = [round(_rss_mb(k), 1) for k in kids]
        for i in range(0, sites, max(1, sites // 100)):
            _get(port, f"s{i}.test")
        result["rss_workers_mb_100_sites"] = [round(_rss_mb(k), 1) for k in kids]

        load = Load(port, min(sites, 200))
        load.start()
        # Warm up: every loaded site's rule set compiled in each worker
        # (the load's first request for a site compiles it there).
        warm_until = time.perf_counter() + 120
        while load.ok < 8 * min(sites, 200) and time.perf_counter() < warm_until:
            time.sleep(0.1)
        result["warmup_requests"] = load.ok
        _, other_before = _get(port, "s1.test")
        (directory / "rules" / "site-0.rules").write_text(distinct_rules(0, "reloaded"))
        sent = time.perf_counter()
        answered: list[float] = []

        def post() -> None:
            req = urllib.request.Request(f"http://{LOCAL}:{admin_port}/reload", method="POST")
            with urllib.request.urlopen(req, timeout=300) as answer:
                answer.read()
            answered.append(time.perf_counter())

        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        effect = None
        while time.perf_counter() - sent < 300:
            try:
                status, body = _get(port, "s0.test")
                if status == 200 and b"www.site0.reloaded" in body:
                    effect = time.perf_counter()
                    break
            except OSError:
                pass
            time.sleep(0.01)
        poster.join(300)
        time.sleep(1.0)
        load.stop()
        status, other_after = _get(port, "s1.test")
        result["reload_effect_s"] = round(effect - sent, 3) if effect else None
        result["reload_answered_s"] = round(answered[0] - sent, 3) if answered else None
        result["load_requests_ok"] = load.ok
        result["load_requests_failed"] = load.failed
        result["load_errors_sample"] = load.errors[:5]
        result["other_site_unchanged"] = status == 200 and other_after == other_before
        result["workers_after_reload"] = len(_children(proxy.pid))
        result["rss_workers_mb_after_reload"] = [round(_rss_mb(k), 1) for k in _children(proxy.pid)]
        # The worst case: every distinct rule set compiled in every worker
        # (requests for sites 0..499, four each, spread over the workers).
        for _ in range(4):
            for i in range(min(sites, DISTINCT)):
                _get(port, f"s{i}.test")
        result["rss_workers_mb_all_sets"] = [round(_rss_mb(k), 1) for k in _children(proxy.pid)]
    finally:
        if proxy is not None:
            _stop(proxy)
        _stop(origin)
        log.close()
        if keep is None:
            shutil.rmtree(directory, ignore_errors=True)
    return result


def verdicts(r: dict[str, Any]) -> list[str]:
    """The issue's targets, met or missed."""
    out = []
    if "first_answer_s" in r:
        out.append(f"first answer {r['first_answer_s']} s (target < 5 s): "
                   + ("met" if r["first_answer_s"] < 5 else "MISSED"))
        worst = max(r["rss_workers_mb_100_sites"] or [0.0])
        out.append(f"RSS per worker {worst} MB (target < 300 MB): " + ("met" if worst < 300 else "MISSED"))
        every = max(r.get("rss_workers_mb_all_sets") or [0.0])
        out.append(f"RSS per worker with all {r['distinct_sets']} sets compiled {every} MB: "
                   + ("under 300" if every < 300 else "OVER 300"))
        eff = r.get("reload_effect_s")
        out.append(f"reload took effect in {eff} s (target < 1 s): "
                   + ("met" if eff is not None and eff < 1 else "MISSED"))
        out.append(f"failed requests during reload {r['load_requests_failed']} of "
                   f"{r['load_requests_ok'] + r['load_requests_failed']} (target 0): "
                   + ("met" if r["load_requests_failed"] == 0 else "MISSED"))
    return out


def scenario_sites(bench: Any) -> Any:
    """``bench/run.py --only sites``: this measurement with the bench's Prexy."""
    from scenarios import Report

    install = bench.prexy()
    if install is None:
        return Report("sites: thousands of sites on one node", "-", [bench.install_error])
    sizes = [1000] if bench.settings.quick else [1000, 10000]
    rows = []
    data: dict[str, Any] = {}
    targets: list[str] = []
    for n in sizes:
        r = run(n, twistd=str(install.twistd), python=str(install.python))
        data[str(n)] = r
        cpu = r["start_cpu_master_s"] + max(r["start_cpu_workers_s"] or [0.0])
        rows.append(
            f"| {n:,} | {r['check_s']} | {r['first_answer_s']} | {cpu:.2f} | {r['rss_master_mb']} | "
            f"{max(r['rss_workers_mb_100_sites'])} | {max(r['rss_workers_mb_all_sets'])} | {r['reload_effect_s']} | {r['reload_answered_s']} | "
            f"{r['load_requests_failed']}/{r['load_requests_ok'] + r['load_requests_failed']} |"
        )
        if n == sizes[-1]:
            targets = verdicts(r)
    table = (
        "| sites | --check s | first answer s | start CPU s (master + a worker) | master RSS MB | worker RSS MB | "
        "worker RSS MB, all sets compiled | reload effect s | reload answered s | failed/requests |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows)
    )
    notes = ["20 rules per site: 10 shared by all, 10 from one of 500 distinct sets; 2 workers",
             f"load average at start: {', '.join(str(data[str(n)]['loadavg_at_start']) for n in sizes)}"
             " (wall times grow with other load; the CPU column does not)",
             "reload: site 0's rules file changes, POST /reload, under 4 keep-alive clients over 200 sites"]
    return Report("sites: thousands of sites on one node", table, notes, data, targets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sites", type=int, default=10000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--layout", choices=("include", "inline"), default="include")
    parser.add_argument("--twistd", default=str(Path(sys.executable).with_name("twistd")))
    parser.add_argument("--check-only", action="store_true")
    parser.add_argument("--keep", type=Path, help="generate into this directory and keep it")
    args = parser.parse_args(argv)
    r = run(args.sites, twistd=args.twistd, python=sys.executable, workers=args.workers,
            layout=args.layout, check_only=args.check_only, keep=args.keep)
    print(json.dumps(r, indent=2))
    for line in verdicts(r):
        print(line)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
