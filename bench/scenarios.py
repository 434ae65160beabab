"""The benchmark scenarios: each prints one markdown table and writes JSON.

A scenario gets a ``Bench`` (settings, the running origin, the Prexy
install) and returns a ``Report``.  Peers and Prexy run in the same
invocation, interleaved, so the ratio compares like with like on a noisy
machine.  A Prexy side that cannot run (flag not yet in ``twistd prexy
--help``, start failure, wrong responses) is reported in the notes and its
cells are left '-', while the peer side is still measured.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import socket
import statistics
import subprocess
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import content
import harness
import realistic
import servers
from harness import WORK, Client, WrkResult, fmt, fmt_ms, markdown_table, ratio
from servers import MissingFlag, PrexyInstall, Server

KB = 1024
MB = 1024 * 1024
LOAD_RULE_COUNTS = (10, 100, 1000)  # subs: also measured under wrk load (20 KB page)
PATHS = {"12 B": "/small.txt", "20 KB": "/page20k.html", "1 MB": "/page1m.html"}
SIZES = {"/small.txt": len(content.SMALL_BODY), "/page20k.html": 20 * KB, "/page1m.html": MB}


@dataclass
class Settings:
    """What the command line chose."""

    quick: bool
    seconds: float
    rounds: int
    connections: list[int]
    threads: int
    samples: int
    repo: Path
    reinstall: bool
    working_tree: bool
    #: The revision the 'observe' scenario compares the last commit with.
    baseline: str = "2989410"


@dataclass
class Report:
    """What a scenario prints and stores."""

    title: str
    table: str
    notes: list[str] = field(default_factory=list)
    data: dict[str, object] = field(default_factory=dict)
    targets: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        text = f"### {self.title}\n\n{self.table}\n"
        if self.targets:
            text += "\nTargets:\n" + "\n".join(f"- {t}" for t in self.targets) + "\n"
        if self.notes:
            text += "\n" + "\n".join(f"- {n}" for n in self.notes) + "\n"
        return text


class Bench:
    """Shared state of one benchmark invocation: origin, Prexy install."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.www = WORK / "www"
        self._origin: Server | None = None
        self._install: PrexyInstall | None = None
        self._install_error: str | None = None

    def origin(self) -> Server:
        """The static nginx origin (started once, 1 worker per core)."""
        if self._origin is None:
            content.write(self.www / "small.txt", content.SMALL_BODY)
            content.write(self.www / "page20k.html", content.html_page(20 * KB, seed=20))
            content.write(self.www / "page1m.html", content.html_page(MB, seed=1024))
            realistic.ensure_sources()
            for name, path in REAL_PATHS.items():
                content.write(self.www / path.lstrip("/"), realistic.load_page(name))
            self._origin = servers.start_nginx(
                "nginx-origin", servers.origin_body(self.www), workers=2,
            )
            for path, size in SIZES.items():
                got = harness.get_once(self._origin.port, path)
                assert got.status == 200 and len(got.body) == size, (path, got.status)
        return self._origin

    def page(self, path: str) -> bytes:
        return (self.www / path.lstrip("/")).read_bytes()

    def prexy(self) -> PrexyInstall | None:
        """Prexy installed in the bench venv, or None (reason in install_error)."""
        if self._install is None and self._install_error is None:
            try:
                self._install = servers.install_prexy(
                    self.settings.repo, reinstall=self.settings.reinstall,
                    working_tree=self.settings.working_tree,
                )
                harness.log(f"Prexy {self._install.revision}, flags: "
                            + " ".join(sorted(self._install.flags)))
            except (RuntimeError, subprocess.SubprocessError, OSError) as error:
                self._install_error = f"Prexy could not be installed or run: {error}"
                harness.log(self._install_error)
        return self._install

    @property
    def prexy_revision(self) -> str | None:
        """What was installed (commit or working tree), if Prexy was needed."""
        return self._install.revision if self._install else None

    @property
    def install_error(self) -> str:
        return self._install_error or "Prexy unavailable"

    def start_prexy(self, name: str, notes: list[str], *, args: tuple[str, ...] = (),
                    workers: int | None = 1, origin_port: int | None = None) -> Server | None:
        """Start Prexy for a scenario, or note why not and return None."""
        install = self.prexy()
        if install is None:
            notes.append(self.install_error)
            return None
        try:
            server = servers.start_prexy(
                install, name, origin_port if origin_port is not None else self.origin().port,
                args=args, workers=workers,
            )
        except MissingFlag as error:
            notes.append(f"skipped Prexy ({name}): {error}")
            return None
        except RuntimeError as error:
            lines = [x for x in str(error).splitlines() if x.strip()]
            notes.append(f"Prexy ({name}) did not start: {lines[0]} ... {lines[-1].strip()}")
            harness.log(str(error))
            return None
        notes.extend(server.notes)
        return server


def target(text: str, ok: bool | None) -> str:
    """One target line: met, MISSED, or not measured."""
    return f"{text}: " + ("not measured" if ok is None else "met" if ok else "**missed**")


def check_ok(server: Server, path: str, size: int | None, notes: list[str]) -> bool:
    """One GET must give 200 and the full body (of ``size`` bytes, when
    given) before any load is run."""
    try:
        got = harness.get_once(server.port, path, timeout=30)
    except OSError as error:
        notes.append(f"{server.name} {path}: {error}")
        return False
    if got.status != 200 or (size is not None and len(got.body) != size):
        notes.append(
            f"{server.name} {path}: status {got.status}, {len(got.body)} bytes "
            f"(expected 200, {size}); not measured"
        )
        return False
    return True


def interleaved_wrk(servers_: list[Server], path: str, bench: Bench, *, connections: int,
                    notes: list[str], threads: int | None = None, rounds: int | None = None,
                    seconds: float | None = None) -> dict[str, WrkResult]:
    """``rounds`` wrk runs per server, alternating the order; per-figure medians.

    A server whose wrk run fails (it died or hung) is noted and left out of
    the remaining rounds; the others are still measured.
    """
    s = bench.settings
    rounds = rounds or s.rounds
    seconds = seconds or s.seconds
    threads = threads or s.threads
    runs: dict[str, list[WrkResult]] = {srv.name: [] for srv in servers_}
    broken: set[str] = set()

    def run(srv: Server, run_seconds: float, measured: bool) -> WrkResult | None:
        try:
            return harness.wrk(
                srv.url(path), seconds=run_seconds, connections=connections, threads=threads,
                cpu_of=srv.cpu if measured else None,
                origin_cpu_of=bench.origin().cpu if measured else None,
            )
        except (RuntimeError, subprocess.SubprocessError) as error:
            broken.add(srv.name)
            first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            notes.append(f"{srv.name} {path} c={connections}: wrk failed ({first[:200]}); "
                         + ("server died" if not srv.child.alive() else "server still running"))
            return None

    for srv in servers_:  # warm-up: pools, caches, lazy imports
        run(srv, 1, False)
    for r in range(rounds):
        order = servers_ if r % 2 == 0 else list(reversed(servers_))
        for srv in order:
            if srv.name in broken:
                continue
            result = run(srv, seconds, True)
            if result is None:
                continue
            harness.log(
                f"  {srv.name} {path} c={connections}: {result.rps:,.0f} req/s "
                f"p50 {result.p50_ms:.2f} ms p99 {result.p99_ms:.2f} ms"
                + (f" errors {result.errors}" if result.errors else "")
                + (f" non-2xx {result.non2xx}" if result.non2xx else "")
            )
            runs[srv.name].append(result)
    return {name: harness.median_wrk(results) for name, results in runs.items() if results}


def _error_notes(name: str, label: str, result: WrkResult | None, notes: list[str]) -> None:
    if result is not None and (result.errors or result.non2xx):
        notes.append(
            f"{name} {label}: {result.errors} socket errors/timeouts, "
            f"{result.non2xx} non-2xx/3xx responses during the runs"
        )


# --------------------------------------------------------------------------
# proxy


def scenario_proxy(bench: Bench) -> Report:
    """nginx proxy_pass (upstream keep-alive) vs Prexy, one process each."""
    s = bench.settings
    origin = bench.origin()
    notes: list[str] = []
    nginx = servers.start_nginx_proxy("nginx-proxy", origin.port)
    prexy = bench.start_prexy("prexy-proxy", notes)
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    verdicts: list[str] = []
    try:
        for label in ("12 B", "20 KB"):
            path = PATHS[label]
            targets = [x for x in (prexy, nginx) if x and check_ok(x, path, SIZES[path], notes)]
            for conns in sorted(s.connections, reverse=True):
                res = interleaved_wrk(targets, path, bench, connections=conns, notes=notes)
                p = res.get("prexy-proxy")
                n = res.get("nginx-proxy")
                _error_notes("Prexy", f"{label} c={conns}", p, notes)
                _error_notes("nginx", f"{label} c={conns}", n, notes)
                rows.append([
                    label, str(conns),
                    fmt(p.rps if p else None), fmt(n.rps if n else None), ratio(p.rps if p else None, n.rps if n else None),
                    fmt(p.p50_ms if p else None, 2), fmt(n.p50_ms if n else None, 2),
                    fmt(p.p99_ms if p else None, 2), fmt(n.p99_ms if n else None, 2),
                    fmt(p.cpu_us_per_req if p else None), fmt(n.cpu_us_per_req if n else None),
                ])
                data[f"{label} c={conns}"] = {"prexy": p, "nginx": n}
                if conns == max(s.connections):
                    cpu = p.cpu_us_per_req if p else None
                    verdicts.append(target(
                        f"Prexy CPU per proxied keep-alive request ≤ 150 µs ({label}, "
                        f"c={conns}: {fmt(cpu)} µs)", None if cpu is None else cpu <= 150))
    finally:
        nginx.stop()
        if prexy:
            prexy.stop()
    table = markdown_table(
        ["response", "conns", "Prexy req/s", "nginx req/s", "Prexy/nginx req/s",
         "Prexy p50 ms", "nginx p50 ms", "Prexy p99 ms", "nginx p99 ms",
         "Prexy CPU µs/req", "nginx CPU µs/req"],
        rows,
    )
    notes.append(
        f"wrk -t{s.threads} on 127.0.0.1, {s.seconds:g} s per run, medians of {s.rounds} "
        "interleaved runs; CPU per request = utime+stime of the server's processes "
        "(/proc/PID/stat) over the run / requests completed. Target: Prexy "
        "CPU ≤ 150 µs per proxied keep-alive request."
    )
    return Report("proxy: nginx proxy_pass vs Prexy (1 worker each)", table, notes, data,
                  verdicts)


# --------------------------------------------------------------------------
# subs


@dataclass
class Timing:
    """Per-request wall times of one engine for one page."""

    seconds: list[float] = field(default_factory=list)
    capped: bool = False
    #: Responses that gave the rewrite time in a trailer: Prexy rewrote the
    #: body while sending it, not whole before the head.
    trailers: int = 0

    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


def _timed(client: Client, path: str, timing: Timing, cap: float) -> bytes | None:
    try:
        got = client.get(path)
    except (OSError, TimeoutError):
        timing.capped = True
        client.close()
        return None
    if got.status != 200:
        timing.capped = True
        return None
    timing.seconds.append(got.seconds)
    if "trailer" in got.headers:
        timing.trailers += 1
    if got.seconds > cap:
        timing.capped = True
    return got.body


def _compare(prexy_body: bytes | None, subs_body: bytes | None, original: bytes) -> str:
    if prexy_body is None or subs_body is None:
        return "-"
    if prexy_body == subs_body:
        return "identical" if prexy_body != original else "identical (unchanged!)"
    at = next(
        (i for i, (a, b) in enumerate(zip(prexy_body, subs_body, strict=False)) if a != b),
        min(len(prexy_body), len(subs_body)),
    )
    return f"differ at byte {at} ({len(prexy_body)} vs {len(subs_body)} bytes)"


#: Requests each server answers (new URLs) before a 20 KB cell is sampled.
WARMUP_REQUESTS = 50


#: Single requests per engine in a 20 KB ``subs`` cell: this many times
#: ``--samples``.  Measured on this 2-core machine (10 rules, nginx +
#: subs_filter and Prexy alternating as in the cell): the ratio of medians
#: over 30 consecutive windows of 49 rounds ranged 0.77-0.99, while the
#: 1,470 rounds pooled gave 0.90.
SMALL_PAGE_FACTOR = 40


#: Requests per engine in a row for the blocks ratio of a 20 KB cell, and
#: how many alternating rounds of such blocks.
BLOCK, BLOCK_ROUNDS = 20, 15


def _block_ratio(prexy: Client, subs: Client, path: str, cap: float) -> float | None:
    """Prexy's time over subs_filter's with BLOCK requests to one, then
    BLOCK to the other (order swapped each round): the median over rounds
    of the ratio of the two blocks' medians.  The per-request alternation
    of the cell runs each Prexy request right after a subs_filter one,
    which the process with the larger working set pays for (measured:
    1.17-1.24x per request, 0.94-1.02x in blocks of 20, 10 rules);
    neither server runs right after the other in production."""
    ratios: list[float] = []
    for r in range(BLOCK_ROUNDS):
        medians: dict[str, float] = {}
        order = (("subs", subs), ("prexy", prexy)) if r % 2 == 0 else (("prexy", prexy), ("subs", subs))
        for name, client in order:
            timing = Timing()
            for i in range(BLOCK):
                _timed(client, f"{path}?b={r}-{i}-{time.monotonic_ns()}", timing, cap)
            if timing.capped or not timing.seconds:
                return None
            medians[name] = statistics.median(timing.seconds)
        ratios.append(medians["prexy"] / medians["subs"])
    return statistics.median(ratios)


@dataclass(frozen=True)
class SubsCorpus:
    """What a ``subs`` run rewrites: pages (label -> origin path), rule counts,
    each count's rules for Prexy and for subs_filter, and a test that a body
    was rewritten."""

    name: str
    counts: tuple[int, ...]
    pages: dict[str, str]
    prexy_rules: Callable[[int], str]
    subs_rules: Callable[[int], str]
    rewritten: Callable[[bytes], bool]
    description: str


def _synthetic_corpus() -> SubsCorpus:
    return SubsCorpus(
        "synthetic", (1, 10, 100, 1000), {"20 KB": PATHS["20 KB"], "1 MB": PATHS["1 MB"]},
        lambda n: content.replace_filter_rules(content.rule_set(n)),
        lambda n: content.subs_filter_directives(content.rule_set(n)),
        lambda body: content.NEW_DOMAIN.encode() in body and content.DOMAIN.encode() not in body,
        "Rules: the domain, an analytics id `UA-\\d+-\\d+`, then generated "
        "`word[0-9]+token`-style regexes that rarely match (bench/content.py); "
        "replace_filter syntax for Prexy, `subs_filter ... gr` for nginx. subs_filter "
        "applies rules one after another per line, replace_filter in one leftmost pass; "
        "on these rules both should give the same bytes ('outputs').",
    )


def _realistic_corpus() -> SubsCorpus:
    return SubsCorpus(
        "realistic", realistic.RULE_COUNTS,
        {"20 KB (real)": REAL_PATHS["html-20k"], "0.8 MB (real)": REAL_PATHS["html-1m"]},
        realistic.rules_text,
        realistic.subs_filter_directives,
        lambda body: b"clone-shop.nl" in body and b"www." + realistic.ORIGIN.encode() not in body,
        f"Corpus {realistic.corpus_digest()} (bench/realistic.py): Python's HTML documentation "
        "with a shop's site furniture, and a cloning service's rules, about 90% literal swaps "
        "of the site's host names that match. subs_filter gets the literal rules as strings and "
        "the rest as regexes (`r`); its semantics differ (rules applied one after another, no "
        "once-rules across rules, no `$&`), so its output is compared, not required equal.",
    )


#: The realistic corpus pages on the origin.
REAL_PATHS = {"html-20k": "/real20k.html", "html-1m": "/real1m.html"}


def scenario_subs(bench: Bench) -> Report:
    """Per-request time with N realistic clone rules: Prexy --rules vs nginx + subs_filter."""
    return _subs(bench, _realistic_corpus())


def scenario_subs_synthetic(bench: Bench) -> Report:
    """Per-request time with N synthetic rules: Prexy --rules vs nginx + subs_filter."""
    return _subs(bench, _synthetic_corpus())


def _subs(bench: Bench, corpus: SubsCorpus) -> Report:
    s = bench.settings
    origin = bench.origin()
    notes: list[str] = []
    module = harness.subs_module_path()
    if module is None:
        raise RuntimeError("libnginx-mod-http-subs-filter is not installed")
    counts = list(corpus.counts)
    pages = list(corpus.pages)
    small_label = pages[0]
    cap = 20.0 if s.quick else 60.0  # a request slower than this ends the cell
    budget = 20.0 if s.quick else 45.0  # seconds of samples per engine and cell
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    medians: dict[tuple[int, str], tuple[float | None, float | None, str]] = {}
    load_rows: list[list[str]] = []
    firsts: dict[int, float] = {}
    for count in counts:
        rules_file = content.write(WORK / "rules" / f"rules-{corpus.name}-{count}.conf",
                                   corpus.prexy_rules(count))
        nginx = servers.start_nginx_proxy(
            f"nginx-subs-{count}", origin.port, modules=(module,),
            location_extra="            proxy_set_header Accept-Encoding \"\";\n"
            + "".join("            " + line + "\n"
                      for line in corpus.subs_rules(count).splitlines()),
        )
        prexy = bench.start_prexy(f"prexy-subs-{count}", notes, args=("--rules", str(rules_file)))
        try:
            for label in pages:
                path = corpus.pages[label]
                original = bench.page(path)
                pc, nc = (Client(prexy.port, cap + 5) if prexy else None), Client(nginx.port, cap + 5)
                cold, warm, subs = Timing(), Timing(), Timing()
                # First responses: warm-up, and the outputs compared.
                subs_body = _timed(nc, path + "?first", Timing(), cap)
                first = Timing()  # Prexy's first request since it started, on the first page
                prexy_body = _timed(pc, path + "?first", first, cap) if pc else None
                same = _compare(prexy_body, subs_body, original)
                rewritten = {
                    name: body is not None and corpus.rewritten(body)
                    for name, body in (("prexy", prexy_body), ("subs_filter", subs_body))
                }
                if pc and prexy_body is not None and not rewritten["prexy"]:
                    notes.append(f"Prexy did not rewrite {label} with {count} rules")
                if pc:
                    _timed(pc, path + "?warm", Timing(), cap)
                # Both servers reach their steady state before sampling: a
                # fresh Python process runs its first few dozen requests
                # measurably slower (about 30% for the first 25 here) while
                # the interpreter specialises the code it runs.
                small = len(original) <= 64 * KB
                for i in range(WARMUP_REQUESTS if small else 2):
                    for client in (nc, pc):
                        if client is not None:
                            _timed(client, path + f"?warmup={i}", Timing(), cap)
                spent = {"cold": 0.0, "warm": 0.0, "subs": 0.0}
                # 20 KB requests take about a millisecond: many more samples
                # cost little, keep one slow request from moving the median,
                # and spread the cell over a second or more rather than the
                # ~0.15 s that 49 rounds took, a window in which one burst
                # of other work on the machine can decide the ratio.
                samples = s.samples * SMALL_PAGE_FACTOR if small else s.samples
                for i in range(samples):
                    # Prexy "cold": a URL it has not seen (no applicability memory);
                    # "warm": the same URL again.  nginx's static origin ignores ?q.
                    query = f"?n={i}-{time.monotonic_ns()}"
                    for key, client, timing, url in (
                        ("subs", nc, subs, path + query),
                        ("cold", pc, cold, path + query),
                        ("warm", pc, warm, path + "?warm"),
                    ):
                        if client is None or timing.capped or spent[key] > budget:
                            continue
                        start = time.perf_counter()
                        _timed(client, url, timing, cap)
                        spent[key] += time.perf_counter() - start
                block_ratio = _block_ratio(pc, nc, path, cap) if small and pc else None
                for client in (pc, nc):
                    if client:
                        client.close()
                harness.log(
                    f"  {count} rules {label}: Prexy {fmt_ms(cold.median())} "
                    f"(repeat {fmt_ms(warm.median())}), subs_filter {fmt_ms(subs.median())}; {same}"
                )
                if cold.trailers and small:
                    notes.append(
                        f"Prexy {count} rules {label}: {cold.trailers} of {len(cold.seconds)} responses "
                        "were rewritten while sent (timing in a trailer), not whole before the head"
                    )
                for name, timing in (("Prexy", cold), ("subs_filter", subs)):
                    if timing.capped:
                        notes.append(
                            f"{name} {count} rules {label}: stopped sampling (a request took "
                            f"over {cap:g} s, failed or timed out); n={len(timing.seconds)}"
                        )
                medians[(count, label)] = (cold.median(), subs.median(), same)
                if label == small_label and first.seconds and cold.median():
                    firsts[count] = first.seconds[0] / cold.median()
                    notes.append(f"Prexy {count} rules: its first request for the page after start "
                                 "(after the one request of the readiness check, on a new connection) "
                                 f"took {fmt_ms(first.seconds[0])}, {firsts[count]:.2f}× the median of "
                                 "back-to-back requests (the target is read in the 'first' scenario, "
                                 "against warm requests after the same pause)")
                rows.append([
                    str(count), label, fmt_ms(cold.median()), fmt_ms(warm.median()),
                    fmt_ms(subs.median()), ratio(cold.median(), subs.median()),
                    "-" if block_ratio is None else f"{block_ratio:.2f}×", same,
                ])
                data[f"{count} rules {label}"] = {
                    "block_ratio": block_ratio,
                    "prexy_s": cold.seconds, "prexy_repeat_s": warm.seconds,
                    "subs_filter_s": subs.seconds, "output": same, "rewritten": rewritten,
                    "prexy_trailers": cold.trailers,
                }
            if count in LOAD_RULE_COUNTS:
                # The same page under load: throughput and CPU per request.
                path = corpus.pages[small_label]
                targets = [x for x in (prexy, nginx) if x and check_ok(x, path, SIZES.get(path), [])]
                res = interleaved_wrk(targets, path, bench, connections=max(s.connections),
                                      notes=notes)
                p = res.get(prexy.name) if prexy else None
                n = res.get(nginx.name)
                for who, result in (("Prexy", p), ("subs_filter", n)):
                    _error_notes(who, f"{count} rules under load", result, notes)
                load_rows.append([
                    str(count), fmt(p.rps if p else None), fmt(n.rps if n else None),
                    ratio(p.rps if p else None, n.rps if n else None),
                    fmt(p.p99_ms if p else None, 1), fmt(n.p99_ms if n else None, 1),
                    fmt(p.cpu_us_per_req if p else None), fmt(n.cpu_us_per_req if n else None),
                ])
                data[f"{count} rules 20 KB under load"] = {"prexy": p, "subs_filter": n}
        finally:
            nginx.stop()
            if prexy:
                prexy.stop()
    table = markdown_table(
        ["rules", "page", "Prexy", "Prexy (same URL again)", "subs_filter",
         "Prexy/subs_filter time", f"the same, blocks of {BLOCK}", "outputs"],
        rows,
    )
    if load_rows:
        table += (
            f"\n\nThe {small_label} page under load (wrk -c{max(s.connections)}, one URL, medians of "
            f"{s.rounds}):\n\n"
            + markdown_table(
                ["rules", "Prexy req/s", "subs_filter req/s", "Prexy/subs_filter req/s",
                 "Prexy p99 ms", "subs_filter p99 ms", "Prexy CPU µs/req",
                 "subs_filter CPU µs/req"],
                load_rows,
            )
        )
    notes.append(
        f"Median of up to {s.samples * SMALL_PAGE_FACTOR} (20 KB) or {s.samples} (1 MB) single GETs on one keep-alive loopback connection "
        "(time to the last body byte), engines interleaved, after "
        f"{WARMUP_REQUESTS} (20 KB) or 2 (1 MB) unmeasured requests to each. 'Prexy' uses a new URL per "
        "request (no rule-applicability memory); 'same URL again' repeats one URL. "
        f"'Blocks of {BLOCK}': after the cell, {BLOCK_ROUNDS} rounds of {BLOCK} requests to one "
        f"server then {BLOCK} to the other (order swapped each round), new URLs; the median of "
        "the rounds' ratios of block medians (the targets are read on the per-request ratio). "
        + corpus.description
    )
    notes.append(
        "Under load, wrk repeats one URL (so Prexy's rule-applicability memory, where "
        "present, applies, as it would for a popular page); CPU per request counts the "
        "server's own processes (Prexy; nginx master and worker), not the origin."
    )
    verdicts: list[str] = []

    def _ratio(count: int, label: str) -> float | None:
        prexy_s, subs_s, _ = medians.get((count, label), (None, None, ""))
        return prexy_s / subs_s if prexy_s is not None and subs_s else None

    if corpus.name == "synthetic":
        notes.append(
            "Targets: 20 KB with 10 rules faster than subs_filter; 100 and 1000 "
            "rules ≤ 1/2 of subs_filter's time."
        )
        r = _ratio(10, small_label)
        verdicts.append(target(f"20 KB, 10 rules: Prexy faster than subs_filter (time ratio "
                               f"{fmt(r, 2)})", None if r is None else r < 1))
        for count in (100, 1000):
            for label in pages:
                r = _ratio(count, label)
                verdicts.append(target(f"{label}, {count} rules: Prexy ≤ 1/2 of subs_filter's time "
                                       f"(ratio {fmt(r, 2)})", None if r is None else r <= 0.5))
    else:
        notes.append("Targets: 20 KB page, 1000 rules ≤ 2 ms, 100 rules ≤ 1.2 ms, "
                     "10 rules ≤ 0.9× subs_filter's time; ≤ 0.5× subs_filter at 100 rules and "
                     "≤ 0.1× at 1000.")
        for count, limit in ((1000, 0.002), (100, 0.0012)):
            t = medians.get((count, small_label), (None, None, ""))[0]
            verdicts.append(target(f"{small_label}, {count} rules: ≤ {limit * 1000:g} ms "
                                   f"({fmt_ms(t)})", None if t is None else t <= limit))
        for count, limit in ((10, 0.9), (100, 0.5), (1000, 0.1)):
            for label in pages if count > 10 else [small_label]:
                r = _ratio(count, label)
                verdicts.append(target(f"{label}, {count} rules: ≤ {limit:g}× subs_filter's time "
                                       f"(ratio {fmt(r, 2)})", None if r is None else r <= limit))
    compared = [v[2] for v in medians.values() if v[2] != "-"]
    if corpus.name == "synthetic":
        verdicts.append(target(
            f"outputs byte-identical to subs_filter ({sum(c.startswith('identical') for c in compared)}"
            f" of {len(compared)} compared)",
            None if not compared else all(c == "identical" for c in compared)))
    return Report(f"subs ({corpus.name} rules): Prexy --rules vs nginx subs_filter, time per request",
                  table, notes, data, verdicts)


# --------------------------------------------------------------------------
# cache


def _hit_state(server: Server, path: str) -> str:
    """Second GET of ``path``: what the cache headers say."""
    harness.get_once(server.port, path)
    got = harness.get_once(server.port, path)
    status = got.headers.get("cache-status")
    if status:
        return status
    xv = got.headers.get("x-varnish", "")
    age = got.headers.get("age")
    return f"x-varnish {xv!r} age {age}" if xv or age else "no cache headers"


def scenario_cache(bench: Bench) -> Report:
    """Cache hits: Varnish (default VCL) vs Prexy --cache-size with 2 workers."""
    s = bench.settings
    origin = bench.origin()
    notes: list[str] = []
    varnish = servers.start_varnish("varnish", origin.port)
    rules_file = content.write(WORK / "rules" / "rules-10.conf",
                               content.replace_filter_rules(content.rule_set(10)))
    install = bench.prexy()
    rules_args: tuple[str, ...] = ()
    if install and install.supports("--rules"):
        rules_args = ("--rules", str(rules_file))
    prexy = bench.start_prexy("prexy-cache", notes, args=("--cache-size", "256M", *rules_args),
                              workers=2)
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    verdicts: list[str] = []
    try:
        for label in ("12 B", "20 KB"):
            path = PATHS[label]
            targets = [x for x in (prexy, varnish) if x and check_ok(x, path, SIZES[path], notes)]
            hit = False
            for srv in targets:
                state = _hit_state(srv, path)
                notes.append(f"{srv.name} {label} second GET: {state}")
                if srv is prexy:
                    hit = "hit" in state.lower()
                if srv is prexy and not hit:
                    notes.append(f"Prexy's second GET of {label} was not a hit: its figures "
                                 "are not cache hits")
            res = interleaved_wrk(targets, path, bench, connections=max(s.connections), notes=notes,
                                  threads=2)
            p, v = res.get("prexy-cache"), res.get("varnish")
            _error_notes("Prexy", label, p, notes)
            _error_notes("Varnish", label, v, notes)
            rows.append([
                label, fmt(p.rps if p else None), fmt(v.rps if v else None), ratio(p.rps if p else None, v.rps if v else None),
                fmt(p.p99_ms if p else None, 2), fmt(v.p99_ms if v else None, 2),
                fmt(p.cpu_us_per_req if p else None), fmt(v.cpu_us_per_req if v else None),
                fmt(p.origin_cpu_us_per_req if p else None, 1),
                fmt(v.origin_cpu_us_per_req if v else None, 1),
            ])
            data[label] = {"prexy": p, "varnish": v}
            r = p.rps / v.rps if p and v and v.rps else None
            verdicts.append(target(
                f"{label}: Prexy hits ≥ 0.25× Varnish's req/s (ratio {fmt(r, 2)}"
                + ("" if hit else ", and Prexy's responses were not hits") + ")",
                None if r is None else (r >= 0.25 and hit)))
            origin_us = p.origin_cpu_us_per_req if p else None
            verdicts.append(target(
                f"{label}: a Prexy hit costs the origin nothing ({fmt(origin_us, 1)} µs of origin "
                "CPU per request)", None if origin_us is None else origin_us < 1))
        if prexy is not None:
            _range_hits(bench, prexy, varnish, data, verdicts, notes)
    finally:
        varnish.stop()
        if prexy:
            prexy.stop()
    table = markdown_table(
        ["response", "Prexy hits req/s", "Varnish hits req/s", "Prexy/Varnish",
         "Prexy p99 ms", "Varnish p99 ms", "Prexy CPU µs/hit", "Varnish CPU µs/hit",
         "origin CPU µs/req behind Prexy", "behind Varnish"],
        rows,
    )
    notes.append(
        f"wrk -t2 -c{max(s.connections)}, medians of {s.rounds}; Prexy with --workers 2, "
        "--cache-size 256M and the 10-rule set (hits must not run the rules), Varnish with "
        "the built-in VCL and malloc storage. Origin CPU per request should be ~0 on hits. "
        "Target: Prexy ≥ 0.25× Varnish's req/s."
    )
    return Report("cache: hits, Prexy vs Varnish", table, notes, data, verdicts)


def _range_hits(bench: Bench, prexy: Server, varnish: Server,
                data: dict[str, object], verdicts: list[str], notes: list[str]) -> None:
    """A range hit (the second half of the 20 KB object) against
    a full hit of it, on the same servers, wrk runs interleaved."""
    s = bench.settings
    path = PATHS["20 KB"]
    ranged = ("Range: bytes=10240-20479",)
    got = harness.get_once(prexy.port, path, headers={"Range": ranged[0].split(": ", 1)[1]})
    if got.status != 206 or len(got.body) != 10240:
        notes.append(f"Prexy's range hit answered {got.status} with {len(got.body)} bytes: not measured")
        return
    runs: dict[tuple[str, bool], list[float]] = {}
    cpu: dict[tuple[str, bool], list[float]] = {}
    cells = [(srv, r) for srv in (prexy, varnish) for r in (False, True)]
    for i in range(max(s.rounds, 3)):
        for srv, with_range in cells if i % 2 == 0 else list(reversed(cells)):
            result = harness.wrk(srv.url(path), seconds=s.seconds, connections=max(s.connections),
                                 threads=2, cpu_of=srv.cpu, headers=ranged if with_range else ())
            runs.setdefault((srv.name, with_range), []).append(result.rps)
            if result.cpu_us_per_req is not None:
                cpu.setdefault((srv.name, with_range), []).append(result.cpu_us_per_req)
    med = {k: statistics.median(v) for k, v in runs.items()}
    us = {k: statistics.median(v) for k, v in cpu.items()}
    for srv in (prexy, varnish):
        full, part = med[(srv.name, False)], med[(srv.name, True)]
        notes.append(
            f"Range hits, 20 KB object, `Range: bytes=10240-20479`: {srv.name} full hits "
            f"{fmt(full)} req/s ({fmt(us.get((srv.name, False)))} µs CPU), range hits {fmt(part)} req/s "
            f"({fmt(us.get((srv.name, True)))} µs), {ratio(part, full)} (wrk -c{max(s.connections)} -t2, "
            f"medians of {max(s.rounds, 3)} interleaved runs)")
    r = med[(prexy.name, True)] / med[(prexy.name, False)]
    data["range"] = {f"{k[0]}{' range' if k[1] else ''}": v for k, v in med.items()}
    verdicts.append(target(f"a Prexy range hit within 10% of a full hit's req/s ({r:.2f}x)", r >= 0.9))


# --------------------------------------------------------------------------
# workers


def scenario_workers(bench: Bench) -> Report:
    """req/s with 1 and 2 workers, nginx vs Prexy, same wrk on the same cores."""
    s = bench.settings
    origin = bench.origin()
    notes: list[str] = []
    started: list[Server] = []
    verdicts: list[str] = []
    try:
        for n in (1, 2):
            started.append(servers.start_nginx_proxy(f"nginx-w{n}", origin.port, workers=n))
        for n in (1, 2):
            srv = bench.start_prexy(f"prexy-w{n}", notes, workers=n)
            if srv is None:
                break
            started.append(srv)
        rows: list[list[str]] = []
        data: dict[str, object] = {}
        for label in ("12 B", "20 KB"):
            path = PATHS[label]
            targets = [x for x in started if check_ok(x, path, SIZES[path], notes)]
            masters = {x.name: x.master_cpu() for x in targets if x.name.startswith("prexy")}
            res = interleaved_wrk(targets, path, bench, connections=max(s.connections), threads=2,
                                  notes=notes)
            total_reqs = {name: r.requests for name, r in res.items()}
            master_us = {
                name: (srv.master_cpu() - masters[name]) / max(1, total_reqs[name]) * 1e6
                for srv in targets if (name := srv.name) in masters and name.endswith("w2")
            }
            g = {k: res.get(k) for k in ("nginx-w1", "nginx-w2", "prexy-w1", "prexy-w2")}
            rps = {k: (v.rps if v else None) for k, v in g.items()}
            rows.append([
                label, fmt(rps["nginx-w1"]), fmt(rps["nginx-w2"]),
                ratio(rps["nginx-w2"], rps["nginx-w1"]),
                fmt(rps["prexy-w1"]), fmt(rps["prexy-w2"]),
                ratio(rps["prexy-w2"], rps["prexy-w1"]),
                fmt(master_us.get("prexy-w2"), 1),
            ])
            data[label] = {"results": g, "prexy_master_us_per_req": master_us}
            gain_n = rps["nginx-w2"] / rps["nginx-w1"] if rps["nginx-w1"] and rps["nginx-w2"] else None
            gain_p = rps["prexy-w2"] / rps["prexy-w1"] if rps["prexy-w1"] and rps["prexy-w2"] else None
            verdicts.append(target(
                f"{label}: Prexy's gain from 1 to 2 workers ≥ nginx's ({fmt(gain_p, 2)} vs "
                f"{fmt(gain_n, 2)})",
                None if gain_p is None or gain_n is None else gain_p >= gain_n))
            m = master_us.get("prexy-w2")
            verdicts.append(target(f"{label}: Prexy's master uses no CPU per request "
                                   f"({fmt(m, 1)} µs)", None if m is None else m < 1))
            for k, v in g.items():
                _error_notes(k, label, v, notes)
        for srv in started:
            if srv.name in ("prexy-w2", "nginx-w2"):
                # Does every worker take a share of the load?
                split = ", ".join(
                    f"{'master' if pid == srv.child.pid else f'pid {pid}'} "
                    f"{harness.cpu_seconds([pid]):.1f} s"
                    for pid in srv.pids()
                )
                notes.append(f"{srv.name} CPU since start by process: {split}")
    finally:
        for srv in started:
            srv.stop()
    table = markdown_table(
        ["response", "nginx 1w req/s", "nginx 2w req/s", "nginx gain", "Prexy 1w req/s",
         "Prexy 2w req/s", "Prexy gain", "Prexy master CPU µs/req (2w)"],
        rows,
    )
    notes.append(
        f"wrk -t2 -c{max(s.connections)} on the same 2 cores as the servers (so gains are "
        "bounded by the load generator's share), medians of interleaved runs. Target: "
        "Prexy's gain ≥ nginx's gain; master CPU per request 0."
    )
    return Report("workers: 1 vs 2 workers, nginx vs Prexy", table, notes, data, verdicts)


# --------------------------------------------------------------------------
# urlmap


def rss_mb(server: Server) -> float:
    total = 0
    for pid in server.pids():
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def _single_latency(server: Server, path: str, n: int) -> float | None:
    client = Client(server.port, 60)
    times: list[float] = []
    try:
        for _ in range(n):
            got = client.get(path)
            times.append(got.seconds)
    except OSError:
        return None
    finally:
        client.close()
    return statistics.median(times) if times else None


def scenario_urlmap(bench: Bench) -> Report:
    """nginx map + return 301 vs Prexy --map, 100 to 100,000 regex entries."""
    s = bench.settings
    origin = bench.origin()
    notes: list[str] = []
    sizes = [100, 10_000, 100_000] if s.quick else [100, 1_000, 10_000, 100_000]
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    for size in sizes:
        text, hashes = content.regex_map(size)
        map_file = content.write(WORK / "maps" / f"map-{size}.map", text)
        urls = {
            "first": f"/hello/world/{hashes[0]}",
            "last": f"/hello/world/{hashes[-1]}",
            "none": "/small.txt?from=nowhere",
        }
        t0 = time.monotonic()
        nginx = servers.start_nginx_proxy(
            f"nginx-map-{size}", origin.port,
            http_extra=f"    map_hash_bucket_size 128;\n"
            f"    map $request_uri $new_uri {{\n        default \"\";\n        include {map_file};\n    }}\n",
            location_extra="            if ($new_uri) { return 301 $new_uri; }\n",
        )
        nginx_load = time.monotonic() - t0
        t0 = time.monotonic()
        prexy = bench.start_prexy(f"prexy-map-{size}", notes, args=("--map", str(map_file)))
        prexy_load = time.monotonic() - t0 if prexy else None
        loads = {"nginx": (nginx_load, rss_mb(nginx))}
        if prexy:
            loads["prexy"] = (prexy_load or 0.0, rss_mb(prexy))
        try:
            for which, url in urls.items():
                expected = 200 if which == "none" else 301
                targets = []
                for srv in [x for x in (prexy, nginx) if x]:
                    got = harness.get_once(srv.port, url, timeout=60)
                    if got.status == expected:
                        targets.append(srv)
                    else:
                        notes.append(f"{srv.name} {which}: status {got.status}, expected "
                                     f"{expected}; not measured")
                res = interleaved_wrk(targets, url, bench, connections=max(s.connections), notes=notes,
                                      rounds=1, seconds=min(s.seconds, 4))
                for name, result in res.items():
                    _error_notes(name, which, result, notes)
                lat = {srv.name: _single_latency(srv, url, 5 if size >= 10_000 else 20)
                       for srv in targets}
                n, p = res.get(nginx.name), res.get(prexy.name) if prexy else None
                rows.append([
                    f"{size:,}", which, fmt(p.rps if p else None), fmt(n.rps if n else None),
                    ratio(p.rps if p else None, n.rps if n else None),
                    fmt_ms(lat.get(prexy.name) if prexy else None), fmt_ms(lat.get(nginx.name)),
                ])
                data[f"{size} {which}"] = {"prexy": p, "nginx": n, "latency_s": lat}
        finally:
            nginx.stop()
            if prexy:
                prexy.stop()
        load_text = ", ".join(
            f"{k} start {v[0]:.1f} s, RSS {v[1]:.0f} MB" for k, v in loads.items()
        )
        notes.append(f"{size:,} entries: {load_text}")
        data[f"{size} load"] = loads
    verdicts: list[str] = []
    largest = data.get(f"{sizes[-1]} last")
    if isinstance(largest, dict):
        p, n = largest.get("prexy"), largest.get("nginx")
        r = p.rps / n.rps if isinstance(p, WrkResult) and isinstance(n, WrkResult) and n.rps else None
    else:
        r = None
    verdicts.append(target(f"{sizes[-1]:,} entries, last entry: Prexy ≥ 20× nginx's req/s "
                           f"({fmt(r, 1)}×)", None if r is None else r >= 20))
    load = data.get(f"{sizes[-1]} load")
    prexy_load = load.get("prexy") if isinstance(load, dict) else None
    verdicts.append(target(
        f"{sizes[-1]:,} entries: Prexy starts (map loaded, first HTTP answer) in < 3 s and stays "
        f"< 300 MB" + (f" ({prexy_load[0]:.1f} s, {prexy_load[1]:.0f} MB)" if prexy_load else ""),
        None if not prexy_load else prexy_load[0] < 3 and prexy_load[1] < 300))
    # Lookup cost at the largest map over the cost at the smallest.
    for which in ("first", "last", "none"):
        small, large = data.get(f"{sizes[0]} {which}"), data.get(f"{sizes[-1]} {which}")
        costs = []
        for cell in (small, large):
            result = cell.get("prexy") if isinstance(cell, dict) else None
            costs.append(1 / result.rps if isinstance(result, WrkResult) and result.rps else None)
        if costs[0] and costs[1]:
            verdicts.append(target(
                f"Prexy time per request ({which}) at {sizes[-1]:,} entries ≤ 1.5× at "
                f"{sizes[0]:,} ({costs[1] / costs[0]:.2f}×)", costs[1] / costs[0] <= 1.5))
    table = markdown_table(
        ["regex entries", "URL", "Prexy req/s", "nginx req/s", "Prexy/nginx req/s",
         "Prexy 1-conn latency", "nginx 1-conn latency"],
        rows,
    )
    notes.append(
        f"Map entries `~^/hello/world/<md5>\\b(\\?[^/]*)*/?$  /;` (iterated md5 of "
        f"'hello world'); nginx: `map $request_uri` + `return 301`; wrk -c{max(s.connections)}, "
        "1 run per cell; latency: median of single GETs on one connection. 'none' is "
        "proxied to the origin's 12-byte file by both."
    )
    return Report("urlmap: nginx map vs Prexy --map", table, notes, data, verdicts)


# --------------------------------------------------------------------------
# stream: a 100 MB body with 100 rules, and small requests beside it


class _RssSampler(threading.Thread):
    """Samples the RSS of a server's processes every 50 ms; keeps the peak."""

    def __init__(self, server: Server) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.start_mb = rss_mb(server)
        self.peak_mb = self.start_mb
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.05):
            self.peak_mb = max(self.peak_mb, rss_mb(self.server))


@dataclass
class Streamed:
    """One large response read as fast as possible."""

    size: int = 0
    seconds: float = 0.0
    complete: bool = False
    unrewritten: int = 0  # occurrences of the old domain seen in the body


def _stream(port: int, path: str, budget: float,
            stop: threading.Event | None = None, digest: hashlib._Hash | None = None) -> Streamed:
    """GET ``path`` reading as fast as possible for at most ``budget`` seconds.

    Counts the old domain in what arrives, so a server that gave up
    rewriting (a bail-out) does not pass for a fast one.
    ``digest``, when given, is updated with every byte read.
    """
    conn = http.client.HTTPConnection(harness.LOCAL, port, timeout=60)
    needle = content.DOMAIN.encode()
    out = Streamed()
    tail = b""
    start = time.perf_counter()
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        while time.perf_counter() - start < budget and not (stop and stop.is_set()):
            chunk = response.read1(256 * KB)
            if not chunk:
                out.complete = True
                break
            if digest is not None:
                digest.update(chunk)
            out.size += len(chunk)
            window = tail + chunk
            out.unrewritten += window.count(needle)
            tail = window[-(len(needle) - 1):]
    except OSError:
        pass
    finally:
        conn.close()
    out.seconds = time.perf_counter() - start
    return out


def _stream_until(port: int, path: str, halt: threading.Event) -> None:
    """Fetch ``path`` again and again until ``halt`` is set."""
    while not halt.is_set():
        _stream(port, path, 120.0, halt)


def big_page(bench: Bench) -> str:
    """``/page100m.html``: the 1 MB page 100 times (written once)."""
    path = bench.www / "page100m.html"
    if not path.exists() or path.stat().st_size != 100 * MB:
        bench.origin()
        one = bench.page("/page1m.html")
        with path.open("wb") as out:
            for _ in range(100):
                out.write(one)
    return "/page100m.html"


def scenario_stream(bench: Bench) -> Report:
    """100 MB through 100 rules (MiB/s, RSS growth) and small-request p99 beside it."""
    s = bench.settings
    origin = bench.origin()
    big = big_page(bench)
    notes: list[str] = []
    module = harness.subs_module_path()
    if module is None:
        raise RuntimeError("libnginx-mod-http-subs-filter is not installed")
    rules = content.rule_set(100)
    rules_file = content.write(WORK / "rules" / "rules-100.conf", content.replace_filter_rules(rules))
    nginx = servers.start_nginx_proxy(
        "nginx-stream", origin.port, modules=(module,),
        location_extra="            proxy_set_header Accept-Encoding \"\";\n"
        + "".join("            " + line + "\n"
                  for line in content.subs_filter_directives(rules).splitlines()),
    )
    prexy = bench.start_prexy("prexy-stream", notes, args=("--rules", str(rules_file)))
    budget = 10.0 if s.quick else 30.0
    heavy_clients = 3
    small_seconds = 3.0 if s.quick else 5.0
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    verdicts: list[str] = []
    try:
        for srv, label in ((prexy, "Prexy"), (nginx, "nginx subs_filter")):
            if srv is None:
                rows.append([label, "-", "-", "-", "-", "-", "-"])
                continue
            sampler = _RssSampler(srv)
            sampler.start()
            big_read = _stream(srv.port, big, budget)
            sampler.halt.set()
            sampler.join()
            got, seconds, complete = big_read.size, big_read.seconds, big_read.complete
            mib_s = got / MB / seconds if seconds else 0.0
            growth = sampler.peak_mb - sampler.start_mb
            if big_read.unrewritten:
                notes.append(f"{label} left {big_read.unrewritten} occurrences of the old domain "
                             "in the 100 MB body (rewriting stopped: a bail-out?)")
            # p99 of small requests alone, then with heavy rewrites running.
            halt = threading.Event()
            heavy = [
                threading.Thread(target=_stream_until, args=(srv.port, big, halt), daemon=True)
                for _ in range(heavy_clients)
            ]
            try:
                alone = harness.wrk(srv.url("/small.txt"), seconds=small_seconds, connections=10)
                for thread in heavy:
                    thread.start()
                time.sleep(0.5)
                loaded = harness.wrk(srv.url("/small.txt"), seconds=small_seconds,
                                     connections=10)
            except (RuntimeError, subprocess.SubprocessError) as error:
                notes.append(f"{label}: wrk failed ({str(error).strip()[:200]})")
                rows.append([label, f"{mib_s:.1f}", f"{growth:.1f}", "-", "-", "-", "-"])
                continue
            finally:
                halt.set()
                for thread in heavy:
                    if thread.is_alive():
                        thread.join(30)
            harness.log(
                f"  {label}: {mib_s:.1f} MiB/s ({got / MB:.0f} MiB in {seconds:.1f} s), RSS "
                f"+{growth:.1f} MB; small p99 {alone.p99_ms:.2f} -> {loaded.p99_ms:.2f} ms"
            )
            rows.append([
                label, f"{mib_s:.1f}" + ("" if complete else f" ({got / MB:.0f} MiB in {budget:g} s)"),
                f"{growth:.1f}", fmt(alone.p99_ms, 2), fmt(loaded.p99_ms, 2),
                ratio(loaded.p99_ms, alone.p99_ms, 1), fmt(loaded.rps),
            ])
            data[label] = {
                "mib_per_s": mib_s, "bytes": got, "seconds": seconds, "complete": complete,
                "rss_growth_mb": growth, "small_alone": alone, "small_with_heavy": loaded,
            }
            if srv is prexy:
                p99_ratio = loaded.p99_ms / alone.p99_ms if alone.p99_ms else None
                verdicts += [
                    target(f"100 MB with 100 rules ≥ 50 MiB/s through one worker ({mib_s:.1f})",
                           mib_s >= 50 and not big_read.unrewritten),
                    target(f"RSS growth < 20 MB ({growth:.1f} MB)", growth < 20),
                    target(f"small-request p99 beside heavy rewrites ≤ 3× alone "
                           f"({fmt(p99_ratio, 1)}×)", None if p99_ratio is None else p99_ratio <= 3),
                ]
    finally:
        nginx.stop()
        if prexy:
            prexy.stop()
    table = markdown_table(
        ["engine", "100 MB with 100 rules, MiB/s", "RSS growth MB", "small p99 ms alone",
         f"small p99 ms beside {heavy_clients} rewrites", "p99 ratio", "small req/s beside"],
        rows,
    )
    notes.append(
        f"One client reads /page100m.html as fast as it can (bounded to {budget:g} s; a "
        "partial read is marked); RSS of the server's processes sampled every 50 ms. "
        f"Then wrk -c10 on the 12-byte file for {small_seconds:g} s alone and with "
        f"{heavy_clients} clients looping over the 100 MB rewrite. Prexy 1 process, nginx "
        "1 worker. Targets: ≥ 50 MiB/s, RSS growth < 20 MB, p99 ratio ≤ 3."
    )
    return Report("stream: 100 MB through 100 rules, and small requests beside it",
                  table, notes, data, verdicts)


# --------------------------------------------------------------------------
# slowclient: memory with a client slower than the origin


def _slow_read(port: int, path: str, rate: int, seconds: float) -> int:
    """Read ``path`` at about ``rate`` bytes/s for ``seconds``; return bytes read."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * KB)
    sock.settimeout(10)
    total = 0
    try:
        sock.connect((harness.LOCAL, port))
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            if total > rate * elapsed:
                time.sleep(0.02)
                continue
            data = sock.recv(16 * KB)
            if not data:
                break
            total += len(data)
    except OSError:
        pass
    finally:
        sock.close()
    return total


def scenario_slowclient(bench: Bench) -> Report:
    """RSS of the proxy while one client reads a 100 MB body at 256 KB/s."""
    s = bench.settings
    origin = bench.origin()
    big = big_page(bench)
    notes: list[str] = []
    rules_file = content.write(WORK / "rules" / "rules-100.conf",
                               content.replace_filter_rules(content.rule_set(100)))
    seconds = 6.0 if s.quick else 15.0
    rate = 256 * KB
    rows: list[list[str]] = []
    data: dict[str, object] = {}
    verdicts: list[str] = []
    cases: list[tuple[str, Callable[[], Server | None]]] = [
        ("Prexy, pass-through", lambda: bench.start_prexy("prexy-slow", notes)),
        ("Prexy, 100 rules", lambda: bench.start_prexy(
            "prexy-slow-rules", notes, args=("--rules", str(rules_file)))),
        ("nginx proxy_pass (buffers to temp files)",
         lambda: servers.start_nginx_proxy("nginx-slow", origin.port)),
    ]
    for label, start in cases:
        srv = start()
        if srv is None:
            rows.append([label, "-", "-"])
            continue
        try:
            sampler = _RssSampler(srv)
            sampler.start()
            got = _slow_read(srv.port, big, rate, seconds)
            sampler.halt.set()
            sampler.join()
            growth = sampler.peak_mb - sampler.start_mb
            harness.log(f"  {label}: read {got / MB:.1f} MiB, RSS +{growth:.1f} MB")
            rows.append([label, f"{got / MB:.1f}", f"{growth:.1f}"])
            data[label] = {"bytes": got, "rss_growth_mb": growth}
            if label.startswith("Prexy"):
                verdicts.append(target(f"{label}: RSS growth < 20 MB with a slow client "
                                       f"({growth:.1f} MB)", growth < 20))
        finally:
            srv.stop()
    table = markdown_table(["server", "MiB read by the client", "RSS growth MB"], rows)
    notes.append(
        f"One client with a 64 KB receive buffer reads /page100m.html at "
        f"{rate // KB} KB/s for {seconds:g} s while the origin could send it all at once; "
        "RSS of the server's processes sampled every 50 ms. A proxy without backpressure "
        "buffers the body in memory (twisted.web.proxy grew by ~170 MB on 100 MB)."
    )
    return Report("slowclient: memory with a slow client", table, notes, data, verdicts)


# --------------------------------------------------------------------------
# Standalone scripts (run as they are in the bench venv)


def script_scenario(name: str, quick_args: tuple[str, ...] = ("--quick",)) -> Callable[[Bench], Report]:
    """A scenario that runs one of bench/'s standalone scripts in the bench venv."""

    def run(bench: Bench) -> Report:
        script = Path(__file__).resolve().parent / name
        if not script.exists():
            return Report(name, "(not present)", [f"bench/{name} does not exist yet"])
        install = bench.prexy()
        python = str(install.python) if install else "python3"
        args = list(quick_args) if bench.settings.quick else []
        done = subprocess.run([python, str(script), *args], capture_output=True, text=True,
                              timeout=1200, cwd=WORK)
        if done.returncode != 0 and args:
            # The script may not know --quick: run it plainly.
            done = subprocess.run([python, str(script)], capture_output=True, text=True,
                                  timeout=1200, cwd=WORK)
        notes = [] if done.returncode == 0 else [
            f"{name} exited with {done.returncode} (a missed target or a failure)"
            + (f": {done.stderr.strip()[-1500:]}" if done.stderr.strip() else "")
        ]
        return Report(f"{name} (run in the bench venv)", done.stdout.strip() or "(no output)",
                      notes, {"stdout": done.stdout, "returncode": done.returncode})
    return run


# adversarial: the shapes that make a backtracking engine blow up

#: (pattern as the rules file writes it, the body built against it).  The
#: bodies are those of tests/substitution/test_adversarial.py.
ADVERSARIAL = [
    ("(a|aa)*b", "ab-lines", lambda n: (b"a" * 998 + b"b\n") * (n // 1000)),
    ("(a+)+$", "ab-lines", lambda n: (b"a" * 998 + b"b\n") * (n // 1000)),
    ("(.*a){20}", "text", lambda n: b"the cat sat on a mat\n" * (n // 21)),
    ("(x+x+)+y", "x-lines", lambda n: (b"x" * 99 + b"\n") * (n // 100)),
    ('"(\\\\.|[^"])*"', "quote-open", lambda n: b'"' + b"\\a" * (n // 2)),
]


def _rewrite_cli(python: Path, rules: Path, body: Path) -> tuple[float, float]:
    """``python -m prexy rewrite`` on ``body``: (wall seconds, peak RSS MB)."""
    started = time.perf_counter()
    with body.open("rb") as stdin:
        proc = subprocess.Popen([str(python), "-m", "prexy", "rewrite", "--rules", str(rules)],
                                stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                cwd=WORK)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"rewrite exited {proc.returncode}")
    return elapsed, usage.ru_maxrss / 1024


def scenario_adversarial(bench: Bench) -> Report:
    """Rules regex cannot bound, on bodies built to make them backtrack:
    ``python -m prexy rewrite`` and the proxy, 1 MB and 5 MB."""
    notes: list[str] = []
    install = bench.prexy()
    if install is None:
        return Report("adversarial", "(Prexy unavailable)", [bench.install_error])
    bench.origin()  # serves the bodies written below
    rows: list[list[str]] = []
    targets: list[str] = []
    data: dict[str, object] = {}
    empty = WORK / "adversarial" / "empty.txt"
    content.write(empty, b"")
    for k, (pattern, label, make) in enumerate(ADVERSARIAL):
        quoted = pattern.replace("\\", "\\\\")
        rules = content.write(WORK / "adversarial" / f"rule{k}.rules",
                              f"replace_filter '{quoted}' '[$&]' g;\n".encode())
        files = {}
        for size in (1, 5):
            path = f"/adversarial/{k}-{size}m.html"
            files[size] = content.write(bench.www / path.lstrip("/"), make(size * MB))
        _, base_rss = _rewrite_cli(install.python, rules, empty)
        prexy = bench.start_prexy(f"prexy-adversarial-{k}", notes, args=("--rules", str(rules)))
        cells: dict[str, float] = {}
        try:
            for size, path in files.items():
                cli = [_rewrite_cli(install.python, rules, path) for _ in range(3)]
                wall = statistics.median(c[0] for c in cli)
                cells[f"cli {size}"] = wall
                cells[f"cli rss {size}"] = max(c[1] for c in cli) - base_rss
                if prexy is not None:
                    sampler = _RssSampler(prexy)
                    sampler.start()
                    client = Client(prexy.port, 120)
                    times = []
                    try:
                        for i in range(3):
                            got = client.get(f"/adversarial/{k}-{size}m.html?n={i}")
                            if got.status != 200 or len(got.body) < path.stat().st_size:
                                notes.append(f"{pattern} {size} MB: status {got.status}, "
                                             f"{len(got.body)} bytes")
                            times.append(got.seconds)
                    finally:
                        client.close()
                        sampler.halt.set()
                        sampler.join()
                    cells[f"proxy {size}"] = statistics.median(times)
                    cells[f"proxy rss {size}"] = sampler.peak_mb - sampler.start_mb
        finally:
            if prexy is not None:
                prexy.stop()
        data[pattern] = cells
        five = 5 * MB / 1e6
        row = [f"`{pattern}` on {label}"]
        for kind in ("cli", "proxy"):
            t1, t5 = cells.get(f"{kind} 1"), cells.get(f"{kind} 5")
            if t1 is None or t5 is None:
                row += ["-", "-", "-"]
                continue
            rate = five / t5
            growth = t5 / t1
            rss = cells[f"{kind} rss 5"]
            row += [f"{rate:.0f} MB/s", f"{growth:.2f}x", f"{rss:.1f} MB"]
            targets.append(target(f"{kind} `{pattern}` 5 MB >= 10 MB/s ({rate:.0f}), "
                                  f"5 MB <= 6x 1 MB ({growth:.2f}x), RSS growth < 20 MB ({rss:.1f})",
                                  rate >= 10 and growth <= 6 and rss < 20))
        rows.append(row)
    table = markdown_table(
        ["rule, body", "rewrite 5 MB", "5 MB / 1 MB", "RSS growth", "proxy 5 MB", "5 MB / 1 MB",
         "RSS growth"], rows)
    notes.append("wall time, median of 3 runs; the CLI's RSS growth is its peak against a run "
                 "on an empty body, the proxy's the peak of its processes while serving")
    return Report("adversarial: rules regex cannot bound", table, notes, data, targets)



# --------------------------------------------------------------------------
# compress: gzip/br answers to clients, a gzip upstream body


#: Prexy's default [compression] levels (README), given to both servers.
GZIP_LEVEL = 4
BR_LEVEL = 4
#: The types nginx compresses besides text/html (always on), as Prexy's list.
NGINX_GZIP_TYPES = ("text/plain text/css text/xml application/javascript application/json "
                    "application/xml image/svg+xml")


def _gunzip(body: bytes) -> bytes:
    """Decode a whole gzip body (several members allowed); ValueError if bad."""
    out: list[bytes] = []
    while body:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out.append(d.decompress(body))
        except zlib.error as error:
            raise ValueError(f"bad gzip: {error}") from None
        if not d.eof:
            raise ValueError("truncated gzip body")
        body = d.unused_data
    return b"".join(out)


def _decoded_digests(python: Path, coding: str, bodies: list[bytes]) -> list[str]:
    """sha256 of each body decoded in ``coding`` (br, zstd), decoded by the bench
    venv's Python, which has Prexy's ``brotli`` and ``zstandard``."""
    folder = WORK / "compress-check"
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i, body in enumerate(bodies):
        f = folder / f"{coding}-{i}.bin"
        f.write_bytes(body)
        files.append(str(f))
    script = (
        "import hashlib, sys\n"
        "import brotli, zstandard\n"
        "dec = {'br': brotli.decompress,\n"
        "       'zstd': lambda b: zstandard.ZstdDecompressor().decompressobj().decompress(b)}[sys.argv[1]]\n"
        "for name in sys.argv[2:]:\n"
        "    try:\n"
        "        print(hashlib.sha256(dec(open(name, 'rb').read())).hexdigest())\n"
        "    except Exception as e:\n"
        "        print('error', type(e).__name__)\n"
    )
    done = subprocess.run([str(python), "-c", script, coding, *files], capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.split("\n")[: len(bodies)]


@dataclass
class _Cell:
    """One (server, Accept-Encoding) column of the compress rotation."""

    label: str
    client: Client
    accept: str | None
    coding: str | None  # the Content-Encoding it must answer with
    identity: bytes  # what this server answers an identity client
    timing: Timing = field(default_factory=Timing)
    sizes: list[int] = field(default_factory=list)
    bodies: set[bytes] = field(default_factory=set)  # distinct encoded bodies, checked after
    failure: str | None = None

    def fetch(self, path: str, cap: float) -> None:
        headers = {"Accept-Encoding": self.accept} if self.accept else {}
        try:
            got = self.client.get(path, headers)
        except (OSError, TimeoutError, http.client.HTTPException) as error:
            self.failure = f"{path}: {type(error).__name__}: {error}"
            return
        if got.status != 200:
            self.failure = f"{path}: status {got.status}"
            return
        coding = got.headers.get("content-encoding")
        if coding != self.coding:
            self.failure = f"{path}: Content-Encoding {coding!r}, expected {self.coding!r}"
            return
        if self.coding and "accept-encoding" not in got.headers.get("vary", "").lower():
            self.failure = f"{path}: no Vary: Accept-Encoding"
            return
        if self.coding is None:
            if got.body != self.identity:
                self.failure = f"{path}: identity answer changed ({len(got.body)} bytes)"
                return
        elif self.coding == "gzip":  # cheap: every answer checked at once
            try:
                decoded = _gunzip(got.body)
            except ValueError as error:
                self.failure = f"{path}: {error}"
                return
            if decoded != self.identity:
                self.failure = (f"{path}: decoded gzip body ({len(decoded)} bytes) differs from "
                                f"the identity answer ({len(self.identity)} bytes)")
                return
        else:
            self.bodies.add(got.body)
        self.timing.seconds.append(got.seconds)
        self.sizes.append(len(got.body))
        if got.seconds > cap:
            self.timing.capped = True


def _gzip_origin(bench: Bench) -> Server:
    """An nginx origin that sends the 100 MB page gzip-encoded (a file
    compressed once with zlib level 6, `Content-Encoding: gzip`), as an
    upstream that compresses whatever it is asked for."""
    big = bench.www / big_page(bench).lstrip("/")
    gz_dir = WORK / "www-gzip" / "gz"
    gz = gz_dir / "page100m.html"
    stamp = gz_dir / "source-size"
    if not gz.exists() or not stamp.exists() or stamp.read_text() != str(big.stat().st_size):
        harness.log("  compressing the 100 MB page for the gzip origin (once)")
        gz_dir.mkdir(parents=True, exist_ok=True)
        comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        with big.open("rb") as src, gz.open("wb") as out:
            while chunk := src.read(4 * MB):
                out.write(comp.compress(chunk))
            out.write(comp.flush())
        stamp.write_text(str(big.stat().st_size))
    body = f"""        root {WORK / "www-gzip"};
        location /gz/ {{
            types {{ }}
            default_type text/html;
            add_header Content-Encoding gzip;
        }}
        location /id/ {{ alias {bench.www}/; }}
        location / {{ return 200 "ok"; }}
"""
    return servers.start_nginx("nginx-origin-gzip", body, workers=1)


def _prexy_config(origin_port: int, rules: Path, gzip_level: int) -> str:
    return f"""# written by bench/run.py (compress)
[server]
listen = ["tcp:{{port}}:interface={harness.LOCAL}"]

[compression]
enabled = true
gzip_level = {gzip_level}
br_level = {BR_LEVEL}

[sites.bench]
upstream = "http://{harness.LOCAL}:{origin_port}"
rules = ["{rules}"]
"""


def scenario_compress(bench: Bench) -> Report:
    """The speed targets for compression: a rewritten 20 KB page sent
    gzip (against nginx + subs_filter + gzip at the same level) and br; a
    100 MB gzip upstream body decoded and rewritten."""
    s = bench.settings
    origin = bench.origin()
    notes: list[str] = []
    verdicts: list[str] = []
    data: dict[str, object] = {}
    module = harness.subs_module_path()
    if module is None:
        raise RuntimeError("libnginx-mod-http-subs-filter is not installed")
    install = bench.prexy()
    cap = 20.0 if s.quick else 60.0
    count = 10
    path = REAL_PATHS["html-20k"]
    rules_file = content.write(WORK / "rules" / f"rules-realistic-{count}.conf",
                               realistic.rules_text(count))
    nginx = servers.start_nginx_proxy(
        "nginx-subs-gzip", origin.port, modules=(module,),
        location_extra="            proxy_set_header Accept-Encoding \"\";\n"
        + "".join("            " + line + "\n"
                  for line in realistic.subs_filter_directives(count).splitlines()),
        http_extra=(f"    gzip on;\n    gzip_comp_level {GZIP_LEVEL};\n"
                    f"    gzip_types {NGINX_GZIP_TYPES};\n    gzip_min_length 256;\n"
                    "    gzip_vary on;\n"),
    )
    prexy: Server | None = None
    if install is None:
        notes.append(bench.install_error)
    else:
        try:
            prexy = servers.start_prexy_config(
                install, "prexy-compress", _prexy_config(origin.port, rules_file, GZIP_LEVEL))
        except (MissingFlag, RuntimeError) as error:
            lines = [x for x in str(error).splitlines() if x.strip()] or [repr(error)]
            notes.append(f"Prexy (compress) did not start: {lines[0]} ... {lines[-1].strip()}")
    rows: list[list[str]] = []
    cells: list[_Cell] = []
    try:
        nc = Client(nginx.port, cap + 5)
        pc = Client(prexy.port, cap + 5) if prexy else None
        identity: dict[str, bytes] = {}
        for name, client in (("nginx", nc), ("prexy", pc)):
            if client is None:
                continue
            got = client.get(path + "?identity")
            if got.status != 200 or got.headers.get("content-encoding"):
                raise RuntimeError(f"{name} identity answer: status {got.status}, "
                                   f"Content-Encoding {got.headers.get('content-encoding')!r}")
            if b"clone-shop.nl" not in got.body:
                notes.append(f"{name} did not rewrite the page with {count} rules")
            identity[name] = got.body
        if "prexy" in identity:
            notes.append(
                "Identity answers: nginx + subs_filter "
                f"{len(identity['nginx']):,} bytes, Prexy {len(identity['prexy']):,} bytes ("
                + ("identical" if identity["nginx"] == identity["prexy"] else
                   "they differ: subs_filter applies the rules one after another, Prexy in one "
                   "leftmost pass; see the subs scenario") + ")")
        cells.append(_Cell("nginx + subs_filter + gzip", nc, "gzip", "gzip", identity["nginx"]))
        if pc is not None:
            cells.append(_Cell("Prexy", pc, "gzip", "gzip", identity["prexy"]))
            cells.append(_Cell("Prexy", pc, "br", "br", identity["prexy"]))
        # For reference, in the same rotation: both servers to a client that
        # accepts no coding (what compression adds to a request).
        cells.append(_Cell("nginx + subs_filter + gzip", nc, None, None, identity["nginx"]))
        if pc is not None:
            cells.append(_Cell("Prexy", pc, None, None, identity["prexy"]))
        for i in range(WARMUP_REQUESTS):
            for cell in cells:
                cell.fetch(path + f"?warmup={i}", cap)
        for cell in cells:  # warm-up answers are checked but not counted
            cell.timing.seconds.clear()
            cell.sizes.clear()
        samples = s.samples * SMALL_PAGE_FACTOR
        for i in range(samples):
            query = f"?n={i}-{time.monotonic_ns()}"  # a new URL each time, as in subs
            for cell in cells:
                if cell.failure is None and not cell.timing.capped:
                    cell.fetch(path + query, cap)
        for cell in cells:
            if cell.failure is None and cell.bodies and install is not None:
                want = hashlib.sha256(cell.identity).hexdigest()
                got_digests = _decoded_digests(install.python, cell.coding or "", sorted(cell.bodies))
                bad = [d for d in got_digests if d != want]
                if bad:
                    cell.failure = (f"{len(bad)} of {len(cell.bodies)} distinct {cell.coding} bodies "
                                    f"do not decode to the identity answer ({bad[0][:16]})")
            if cell.failure:
                notes.append(f"{cell.label} ({cell.accept}): cell aborted: {cell.failure}")
                cell.timing.seconds.clear()
                cell.sizes.clear()
        nc.close()
        if pc:
            pc.close()
    finally:
        nginx.stop()
        if prexy:
            prexy.stop()

    def med(cell: _Cell | None) -> float | None:
        return cell.timing.median() if cell else None

    def size(cell: _Cell | None) -> float | None:
        return statistics.median(cell.sizes) if cell and cell.sizes else None

    by = {(c.label.split()[0], c.accept): c for c in cells}
    ngz, nid = by.get(("nginx", "gzip")), by.get(("nginx", None))
    pgz, pbr, pid = by.get(("Prexy", "gzip")), by.get(("Prexy", "br")), by.get(("Prexy", None))
    for cell, versus, vs_label in ((ngz, None, ""), (pgz, ngz, "nginx gzip"),
                                   (pbr, pgz, "Prexy gzip"), (nid, None, ""),
                                   (pid, nid, "nginx identity")):
        if cell is None:
            continue
        sizes = cell.sizes
        rows.append([
            cell.accept or "(none)", cell.label,
            {"gzip": f"{GZIP_LEVEL}", "br": f"{BR_LEVEL}"}.get(cell.coding or "", "-"),
            fmt_ms(med(cell)), (f"{ratio(med(cell), med(versus))} {vs_label}" if versus else ""),
            fmt(size(cell)) + (f" ({min(sizes):,}-{max(sizes):,})" if sizes and min(sizes) != max(sizes) else ""),
            fmt(len(cell.identity)),
            ratio(size(cell), len(cell.identity), 3) if sizes and cell.coding else "-",
            "yes" if cell.failure is None and sizes else ("**no**" if cell.failure else "-"),
        ])
        data[f"{cell.label} {cell.accept}"] = {
            "seconds": cell.timing.seconds, "sizes": cell.sizes, "identity_bytes": len(cell.identity),
            "failure": cell.failure,
        }
    table = markdown_table(
        ["Accept-Encoding", "server", "level", "time/request", "ratio", "body bytes on the wire",
         "identity bytes", "compressed/identity", "decodes to identity"],
        rows,
    )
    added = {who: (med(gz) - med(ident)) if med(gz) and med(ident) else None
             for who, gz, ident in (("nginx", ngz, nid), ("Prexy", pgz, pid))}
    notes.append("What gzip adds to a request (gzip median minus the identity client's median): "
                 f"nginx {fmt_ms(added['nginx'])}, Prexy {fmt_ms(added['Prexy'])}.")
    data["gzip_added_s"] = added
    r = med(pgz) / med(ngz) if med(pgz) and med(ngz) else None
    verdicts.append(target(f"20 KB, 10 rules, gzip: Prexy at most 1.0x nginx + subs_filter + gzip "
                           f"level {GZIP_LEVEL} ({fmt(r, 2)}x)", None if r is None else r <= 1.0))
    b = size(pgz) / size(ngz) if size(pgz) and size(ngz) else None
    verdicts.append(target(f"gzip bytes on the wire within 2% of nginx's (Prexy {fmt(size(pgz))}, "
                           f"nginx {fmt(size(ngz))}: {fmt(b, 3)}x; fewer counts as within)",
                           None if b is None else b <= 1.02))
    r_br = med(pbr) / med(pgz) if med(pbr) and med(pgz) else None
    verdicts.append(target(f"br (level {BR_LEVEL}) at most 1.3x Prexy's gzip time ({fmt(r_br, 2)}x)",
                           None if r_br is None else r_br <= 1.3))
    notes.append(
        f"20 KB realistic page ({path}), {count} realistic rules (bench/realistic.py, as in subs). "
        f"Median of up to {s.samples * SMALL_PAGE_FACTOR} single GETs per cell on one keep-alive "
        "loopback connection per server (time to the last body byte), a new URL each round, cells "
        "interleaved (nginx gzip, Prexy gzip, Prexy br, then nginx and Prexy to a client sending no "
        f"Accept-Encoding, for reference), after {WARMUP_REQUESTS} unmeasured rounds. "
        f"nginx: subs_filter, then `gzip on; gzip_comp_level {GZIP_LEVEL}; gzip_types ...`; "
        f"Prexy: --config with [compression] gzip_level = {GZIP_LEVEL}, br_level = {BR_LEVEL}, "
        "no cache. 'Body bytes' are the encoded body without chunk framing or headers "
        "(both answers are chunked). Every gzip answer is decoded and compared with the "
        "server's identity answer; distinct br bodies are decoded by the bench venv's "
        "`brotli`; a mismatch aborts the cell."
    )
    if prexy is None:
        return Report("compress: gzip/br answers to clients", table, notes, data, verdicts)

    # The 100 MB gzip-encoded upstream body through 100 rules.
    gz_origin = _gzip_origin(bench)
    rules100 = content.write(WORK / "rules" / "rules-100.conf",
                             content.replace_filter_rules(content.rule_set(100)))
    budget = 10.0 if s.quick else 30.0
    stream_rows: list[list[str]] = []
    big_prexy: Server | None = None
    try:
        big_prexy = servers.start_prexy_config(
            install, "prexy-compress-gz", _prexy_config(gz_origin.port, rules100, GZIP_LEVEL))
        head = harness.get_once(gz_origin.port, "/gz/page100m.html", timeout=120)
        wire = len(head.body)
        # The reference: the same page sent identity by the origin, through the same Prexy.
        want = hashlib.sha256()
        ref = _stream(big_prexy.port, "/id/page100m.html", 120.0, digest=want)
        if not ref.complete or ref.unrewritten:
            raise RuntimeError(f"identity reference incomplete or unrewritten ({ref.size:,} bytes, "
                               f"{ref.unrewritten} old domains)")
        sampler = _RssSampler(big_prexy)
        sampler.start()
        seen = hashlib.sha256()
        read = _stream(big_prexy.port, "/gz/page100m.html", budget, digest=seen)
        sampler.halt.set()
        sampler.join()
        mib_s = read.size / MB / read.seconds if read.seconds else 0.0
        growth = sampler.peak_mb - sampler.start_mb
        same = read.complete and seen.digest() == want.digest()
        ok = same and not read.unrewritten
        if read.unrewritten:
            notes.append(f"Prexy left {read.unrewritten} occurrences of the old domain in the "
                         "decoded 100 MB body")
        if read.complete and not same:
            notes.append(f"Prexy's decoded 100 MB answer ({read.size:,} bytes) differs from its "
                         f"answer for the identity upstream body ({ref.size:,} bytes)")
        harness.log(f"  100 MB gzip upstream: {mib_s:.1f} MiB/s, RSS +{growth:.1f} MB")
        stream_rows.append([
            "identity (Prexy decodes, rewrites)", f"{wire / MB:.1f} MiB gzip",
            f"{mib_s:.1f}" + ("" if read.complete else f" ({read.size / MB:.0f} MiB in {budget:g} s)"),
            f"{growth:.1f}", "yes" if ok else "**no**",
        ])
        data["100 MB gzip upstream"] = {"mib_per_s": mib_s, "bytes": read.size,
                                        "seconds": read.seconds, "complete": read.complete,
                                        "rss_growth_mb": growth, "upstream_bytes": wire}
        verdicts.append(target(f"100 MB gzip body through 100 rules at least 30 MiB/s ({mib_s:.1f})",
                               mib_s >= 30 and ok))
        verdicts.append(target(f"RSS growth under 20 MB ({growth:.1f} MB)", growth < 20))
    except (MissingFlag, RuntimeError) as error:
        notes.append(f"100 MB gzip part not run: {str(error).splitlines()[0]}")
    finally:
        if big_prexy:
            big_prexy.stop()
        gz_origin.stop()
    if stream_rows:
        table += ("\n\n100 MB page (1 MB page x 100), gzip-encoded by the origin, through 100 "
                  "synthetic rules, one client reading as fast as it can:\n\n"
                  + markdown_table(["client", "upstream body", "MiB/s (decoded)", "RSS growth MB",
                                    "complete, equal to identity's answer"], stream_rows))
        notes.append(f"100 MB part: read bounded to {budget:g} s; RSS of Prexy's processes sampled "
                     "every 50 ms; the old domain is counted in what arrives, and the answer's "
                     "sha256 must equal that of the same Prexy's answer for the page sent identity "
                     "(fetched first). No peer: subs_filter cannot rewrite a gzip upstream body.")
    return Report("compress: gzip/br answers to clients, a gzip upstream body",
                  table, notes, data, verdicts)
