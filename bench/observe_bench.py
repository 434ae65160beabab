"""What the operator's view costs: counters, the live log, a reader.

Two measurements, each on the same two requests, Prexy with ``--workers
0`` (one process, so its own CPU time divided by the requests it answered
is exact):

- a proxied 12 B response (no rules) and the realistic 20 KB page
  rewritten with 10 realistic rules (``bench/realistic.py``);

1. **Counters and the idle log**: Prexy at this checkout's last commit
   against Prexy at a baseline revision (``--baseline``, by default the
   commit before the per-site and per-rule counters and the live log),
   each installed in its own venv (``bench/.work/venv`` and
   ``bench/.work/venv-baseline``); wrk runs at saturation alternate
   between the two; CPU µs per request, medians, and the ratio.
2. **A reader attached**: the last commit alone, with its admin endpoint;
   paced wrk runs (about 5,000 requests/s, when the machine can: wrk's
   ``delay()`` hook and the number of connections, calibrated first)
   alternate between no reader and one reader of ``GET /log``
   (``bench/log_reader.py``, unfiltered, reading everything); CPU µs per
   request with and without, the ratio, the records the reader got; then
   one longer run with the reader attached, the process's RSS sampled
   through it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import content
import harness
import realistic
import servers
from harness import LOCAL, WORK, WrkResult, fmt, markdown_table
from scenarios import REAL_PATHS, SIZES, Bench, Report, check_ok, interleaved_wrk, rss_mb, target
from servers import MissingFlag, PrexyInstall, Server

HERE = Path(__file__).resolve().parent

#: The commit before the operator's view (per-site and per-rule counters,
#: the live request log).
DEFAULT_BASELINE = "2989410"
#: The request rate the reader is measured at.
TARGET_RATE = 5000.0
#: Milliseconds each wrk connection waits between a response and its next
#: request in the paced runs.
PACE_MS = 2
#: Seconds a reader stays after its run (Prexy's CPU is read when wrk
#: ends): the records of the run's last tenth of a second reach it.
HANDOVER_WAIT = 0.3
#: Targets: CPU per request, the last commit against the baseline; with a
#: reader against without; RSS growth through the long run.
COUNTERS_LIMIT = 1.03
READER_LIMIT = 1.05
RSS_GROWTH_LIMIT_MB = 1.0

PACED_LUA = """local pause = 2
init = function(args)
  pause = tonumber(args[1]) or pause
end
delay = function()
  return pause
end
"""


@dataclass(frozen=True)
class Request:
    """One of the measured requests: its path and the Prexy flags it needs."""

    label: str
    path: str
    size: int | None
    args: tuple[str, ...]


def _requests() -> list[Request]:
    rules = content.write(WORK / "observe" / "realistic-10.rules", realistic.rules_text(10))
    return [
        Request("12 B proxied", "/small.txt", SIZES["/small.txt"], ()),
        Request("20 KB rewritten, 10 rules", REAL_PATHS["html-20k"], None, ("--rules", str(rules))),
    ]


def _baseline(bench: Bench, revision: str, notes: list[str]) -> PrexyInstall | None:
    """Prexy at ``revision`` in ``bench/.work/venv-baseline``; a venv that
    already holds that commit is reused (a commit's files do not change)."""
    repo = bench.settings.repo
    try:
        commit = servers.resolve_revision(repo, revision)
        recorded = WORK / "venv-baseline" / "installed-revision.txt"
        have = recorded.read_text().strip() if recorded.exists() else ""
        fresh = not (have.startswith("commit ") and commit.startswith(have.split()[1]))
        install = servers.install_prexy(repo, revision=commit, name="venv-baseline", reinstall=fresh)
    except (RuntimeError, subprocess.SubprocessError, OSError) as error:
        notes.append(f"the baseline Prexy ({revision}) could not be installed or run: {error}")
        harness.log(notes[-1])
        return None
    harness.log(f"baseline Prexy {install.revision}")
    return install


def _start(install: PrexyInstall, name: str, origin: Server, args: tuple[str, ...],
           notes: list[str]) -> Server | None:
    try:
        return servers.start_prexy(install, name, origin.port, args=args, workers=0)
    except MissingFlag as error:
        notes.append(f"skipped {name}: {error}")
    except RuntimeError as error:
        lines = [x for x in str(error).splitlines() if x.strip()]
        notes.append(f"{name} did not start: {lines[0]} ... {lines[-1].strip()}")
        harness.log(str(error))
    return None


def _paired(a: WrkResult | None, b: WrkResult | None) -> float | None:
    """The median of the per-round ratios a/b of CPU per request (the two
    runs of a round ran one after the other)."""
    if a is None or b is None:
        return None
    pairs = [(x["cpu_us_per_req"], y["cpu_us_per_req"]) for x, y in zip(a.runs, b.runs, strict=False)]
    ratios = [x / y for x, y in pairs if x and y]
    return statistics.median(ratios) if ratios else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}×"


# --------------------------------------------------------------------------
# 1. the last commit against the baseline


def _counters(bench: Bench, requests: list[Request], rounds: int, notes: list[str],
              verdicts: list[str], data: dict[str, object]) -> str:
    s = bench.settings
    origin = bench.origin()
    head = bench.prexy()
    base = _baseline(bench, s.baseline, notes)
    if head is None:
        notes.append(bench.install_error)
    rows: list[list[str]] = []
    for req in requests:
        started: list[Server] = []
        try:
            pair = [
                _start(head, "observe-head", origin, req.args, notes) if head else None,
                _start(base, "observe-baseline", origin, req.args, notes) if base else None,
            ]
            started = [x for x in pair if x is not None]
            targets = [x for x in started if check_ok(x, req.path, req.size, notes)]
            res = interleaved_wrk(targets, req.path, bench, connections=max(s.connections),
                                  rounds=rounds, notes=notes)
        finally:
            for srv in started:
                srv.stop()
        h, b = res.get("observe-head"), res.get("observe-baseline")
        hc, bc = (h.cpu_us_per_req if h else None), (b.cpu_us_per_req if b else None)
        r, paired = _ratio(hc, bc), _paired(h, b)
        rows.append([req.label, fmt(bc, 1), fmt(hc, 1), _x(r), _x(paired),
                     fmt(b.rps if b else None), fmt(h.rps if h else None)])
        data[f"counters {req.label}"] = {"head": h, "baseline": b, "ratio": r, "paired_ratio": paired}
        verdicts.append(target(
            f"{req.label}: CPU per request of the last commit ≤ {COUNTERS_LIMIT:g}× the baseline's "
            f"(medians {_x(r)}, per-round ratios' median {_x(paired)})",
            None if r is None else r <= COUNTERS_LIMIT))
    base_name = base.revision.split(";")[0] if base else s.baseline
    head_name = head.revision.split(";")[0] if head else "HEAD"
    notes.append(
        f"Counters and the idle log: {head_name} against the baseline {base_name}, both `--workers 0`, "
        f"no admin endpoint, no access log; wrk -t{s.threads} -c{max(s.connections)} at saturation, "
        f"{s.seconds:g} s per run, medians of {rounds} interleaved runs (order swapped each round) after "
        "a 1 s warm-up run each; 'per round' is the median of the rounds' own ratios."
    )
    return markdown_table(
        ["request", "baseline CPU µs/req", "last commit CPU µs/req", "ratio (medians)",
         "ratio (per round)", "baseline req/s", "last commit req/s"],
        rows,
    )


# --------------------------------------------------------------------------
# 2. a reader attached


class _Reader:
    """``bench/log_reader.py`` attached to a Prexy's ``GET /log``."""

    def __init__(self, admin_port: int, name: str) -> None:
        self.child = harness.spawn(name, [sys.executable, str(HERE / "log_reader.py"),
                                          f"http://{LOCAL}:{admin_port}"])
        deadline = time.monotonic() + 30
        while "ready" not in self._text():
            if not self.child.alive() or time.monotonic() > deadline:
                text = self._text()
                harness.stop(self.child)
                raise RuntimeError(f"the log reader did not attach: {text[-500:]}")
            time.sleep(0.02)

    def _text(self) -> str:
        try:
            return self.child.logfile.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> dict[str, int]:
        """Detach; what it read."""
        harness.stop(self.child)
        line = next((x for x in reversed(self._text().splitlines()) if x.startswith("READER ")), None)
        return json.loads(line[len("READER "):]) if line else {}


def _paced(server: Server, path: str, seconds: float, connections: int,
           measured: bool = True) -> WrkResult:
    return harness.wrk(
        server.url(path), seconds=seconds, connections=connections,
        cpu_of=server.cpu if measured else None,
        script=harness.wrk_script("observe-paced", PACED_LUA), script_args=(str(PACE_MS),),
    )


def _calibrate(server: Server, path: str, notes: list[str], label: str) -> int:
    """The number of paced connections that lands nearest TARGET_RATE
    (two 1 s runs; the machine may not reach it)."""
    connections = max(1, round(TARGET_RATE * (PACE_MS + 0.5) / 1000))
    for _ in range(3):
        got = _paced(server, path, 1, connections, measured=False)
        if not got.rps:
            break
        wanted = max(1, min(256, round(connections * TARGET_RATE / got.rps)))
        harness.log(f"  pacing {label}: {connections} connections -> {got.rps:,.0f} req/s; next {wanted}")
        if abs(wanted - connections) <= max(1, connections // 20):
            break
        connections = wanted
    return connections


@dataclass
class _Mode:
    runs: list[WrkResult] = field(default_factory=list)
    read: list[dict[str, int]] = field(default_factory=list)

    def cpu(self) -> float | None:
        values = [r.cpu_us_per_req for r in self.runs if r.cpu_us_per_req is not None]
        return statistics.median(values) if values else None

    def rps(self) -> float | None:
        return statistics.median(r.rps for r in self.runs) if self.runs else None


def _reader_rounds(bench: Bench, server: Server, admin_port: int, req: Request, rounds: int,
                   notes: list[str]) -> tuple[_Mode, _Mode, int, float | None]:
    s = bench.settings
    connections = _calibrate(server, req.path, notes, req.label)
    none, reader = _Mode(), _Mode()
    _paced(server, req.path, 1, connections, measured=False)  # warm-up
    for r in range(rounds):
        for attached in ((False, True) if r % 2 == 0 else (True, False)):
            attached_reader = _Reader(admin_port, "observe-reader") if attached else None
            try:
                result = _paced(server, req.path, s.seconds, connections)
                if attached_reader:
                    time.sleep(HANDOVER_WAIT)
            finally:
                read = attached_reader.stop() if attached_reader else None
            mode = reader if attached else none
            mode.runs.append(result)
            if read is not None:
                mode.read.append(read)
            harness.log(
                f"  {req.label} {'reader' if attached else 'no reader'}: {result.rps:,.0f} req/s, "
                f"{fmt(result.cpu_us_per_req, 1)} µs/req"
                + (f", reader got {read.get('records')} records, {read.get('dropped')} dropped" if read else "")
                + (f", errors {result.errors}" if result.errors else "")
                + (f", non-2xx {result.non2xx}" if result.non2xx else "")
            )
    ratios = [a.cpu_us_per_req / b.cpu_us_per_req for a, b in zip(reader.runs, none.runs, strict=False)
              if a.cpu_us_per_req and b.cpu_us_per_req]
    return none, reader, connections, statistics.median(ratios) if ratios else None


def _long_run(server: Server, admin_port: int, req: Request, connections: int,
              seconds: float) -> dict[str, object]:
    """One paced run of ``seconds`` with a reader attached; RSS every second."""
    samples: list[tuple[float, float]] = []
    halt = threading.Event()
    reader = _Reader(admin_port, "observe-reader-long")
    start = time.monotonic()

    def sample() -> None:
        while True:
            samples.append((time.monotonic() - start, rss_mb(server)))
            if halt.wait(1.0):
                break

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        result = _paced(server, req.path, seconds, connections)
        time.sleep(HANDOVER_WAIT)
    finally:
        halt.set()
        thread.join(5)
        read = reader.stop()
    samples.append((time.monotonic() - start, rss_mb(server)))
    # The first second warms the reader's path (its connection, the
    # records' first batches); growth is read from there to the end.
    steady = [mb for t, mb in samples if t >= 1.0] or [mb for _, mb in samples]
    return {"result": result, "read": read, "samples": samples, "start_mb": steady[0],
            "end_mb": steady[-1], "max_mb": max(steady), "growth_mb": steady[-1] - steady[0]}


def _reader(bench: Bench, requests: list[Request], rounds: int, notes: list[str],
            verdicts: list[str], data: dict[str, object]) -> str:
    s = bench.settings
    origin = bench.origin()
    head = bench.prexy()
    if head is None:
        return "(the last commit could not be installed)"
    long_seconds = 20.0 if s.quick else 30.0
    rows: list[list[str]] = []
    long_rows: list[list[str]] = []
    for req in requests:
        admin_port = harness.free_port()
        server = _start(head, "observe-reader-prexy", origin,
                        (*req.args, "--admin", f"tcp:{admin_port}:interface={LOCAL}"), notes)
        if server is None or not check_ok(server, req.path, req.size, notes):
            if server:
                server.stop()
            continue
        try:
            none, reader, connections, paired = _reader_rounds(bench, server, admin_port, req, rounds, notes)
            long = _long_run(server, admin_port, req, connections, long_seconds) if req is requests[0] else None
        finally:
            server.stop()
        nc, rc = none.cpu(), reader.cpu()
        r = _ratio(rc, nc)
        got = sum(x.get("records", 0) for x in reader.read)
        dropped = sum(x.get("dropped", 0) for x in reader.read)
        answered = sum(x.requests for x in reader.runs)
        rows.append([req.label, str(connections), fmt(none.rps()), fmt(reader.rps()), fmt(nc, 1), fmt(rc, 1),
                     _x(r), _x(paired), f"{got:,} of {answered:,}", f"{dropped:,}"])
        data[f"reader {req.label}"] = {"none": none.runs, "reader": reader.runs, "read": reader.read,
                                       "connections": connections, "ratio": r, "paired_ratio": paired}
        verdicts.append(target(
            f"{req.label}: CPU per request with a reader ≤ {READER_LIMIT:g}× without "
            f"(medians {_x(r)}, per-round ratios' median {_x(paired)}; at {fmt(reader.rps())} req/s)",
            None if r is None else r <= READER_LIMIT))
        rate = reader.rps()
        if rate is not None and rate < TARGET_RATE * 0.95:
            notes.append(f"{req.label}: the machine reached {rate:,.0f} req/s with the reader, "
                         f"not {TARGET_RATE:,.0f} ({connections} paced connections)")
        if long is not None:
            lr: WrkResult = long["result"]  # type: ignore[assignment]
            read: dict[str, int] = long["read"]  # type: ignore[assignment]
            series = long["samples"]
            assert isinstance(series, list)
            step = max(1, len(series) // 6)
            shown = ", ".join(f"{t:.0f} s {mb:.1f}" for t, mb in series[::step])
            long_rows.append([req.label, f"{long_seconds:g} s", fmt(lr.rps), fmt(lr.cpu_us_per_req, 1),
                              f"{read.get('records', 0):,} of {lr.requests:,}", f"{read.get('dropped', 0):,}",
                              f"{long['start_mb']:.1f}", f"{long['end_mb']:.1f}", f"{long['max_mb']:.1f}",
                              f"{long['growth_mb']:+.1f}"])
            data[f"long {req.label}"] = long
            notes.append(f"RSS through the long run (MB, every few seconds): {shown}.")
            growth = long["growth_mb"]
            assert isinstance(growth, float)
            verdicts.append(target(
                f"no memory growth with a reader attached ({long_seconds:g} s at {lr.rps:,.0f} req/s: "
                f"RSS {growth:+.1f} MB from 1 s to the end, limit {RSS_GROWTH_LIMIT_MB:g} MB)",
                growth <= RSS_GROWTH_LIMIT_MB))
    notes.append(
        f"A reader attached: the last commit alone, `--workers 0 --admin`; paced wrk (-t1, each connection "
        f"waits {PACE_MS} ms between a response and its next request; connections calibrated for "
        f"{TARGET_RATE:,.0f} req/s by 1 s runs), {s.seconds:g} s per run, {rounds} rounds, no reader and a "
        "reader alternating (order swapped each round); the reader (bench/log_reader.py, a separate process "
        "whose CPU is not Prexy's) attaches to `GET /log` unfiltered before the run and reads everything. "
        "'Records read' counts what the readers received against the requests wrk counted in those runs "
        "(wrk leaves out the answers in flight when it stops, which Prexy still logs)."
    )
    table = markdown_table(
        ["request", "paced conns", "req/s, no reader", "req/s, reader", "CPU µs/req, no reader",
         "CPU µs/req, reader", "ratio (medians)", "ratio (per round)", "records read", "dropped"],
        rows,
    )
    if long_rows:
        table += "\n\nA longer run with the reader attached (RSS of the Prexy process, MB):\n\n" + markdown_table(
            ["request", "run", "req/s", "CPU µs/req", "records read", "dropped", "RSS at 1 s", "RSS at end",
             "RSS max", "growth"],
            long_rows,
        )
    return table


def scenario_observe(bench: Bench) -> Report:
    """The operator's view's cost: against the baseline, and with a reader."""
    s = bench.settings
    rounds = max(s.rounds, 5 if s.quick else 7)
    notes: list[str] = []
    verdicts: list[str] = []
    data: dict[str, object] = {}
    requests = _requests()
    table = ("Counters and the idle log, the last commit against the baseline (one process each, wrk at "
             "saturation):\n\n" + _counters(bench, requests, rounds, notes, verdicts, data))
    table += ("\n\nThe live log with one reader attached, the last commit alone (paced wrk):\n\n"
              + _reader(bench, requests, rounds, notes, verdicts, data))
    return Report("observe: what the counters and the live log cost", table, notes, data, verdicts)
