"""Plumbing for the Prexy benchmarks: tools, processes, servers, load, tables.

Everything here is stdlib-only and bounded in time.  Servers run as private
child processes on 127.0.0.1 with their configuration, pid and log files
under ``bench/.work/``; every child is registered so that ``cleanup()`` (run
from ``finally`` and ``atexit``) terminates it and its descendants by pid.
Nothing relies on a system service.
"""

from __future__ import annotations

import atexit
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import realistic  # bench/ is on sys.path (run.py)

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORK = BENCH / ".work"
LOCAL = "127.0.0.1"

APT_PACKAGES = ("nginx", "wrk", "libnginx-mod-http-subs-filter", "varnish",
                "python3.11-doc", "libjs-jquery", "libjs-bootstrap4",  # these three: bench/realistic.py
                "nghttp2-client")  # h2load: bench/h2.py
SUBS_MODULE_NAME = "ngx_http_subs_filter_module.so"
SUBS_MODULE_DIRS = (
    Path("/usr/lib/nginx/modules"),
    Path("/usr/share/nginx/modules"),
    Path("/usr/share/nginx/modules-available"),
)


def log(message: str) -> None:
    """Progress goes to stderr so stdout carries only the tables."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# Installing the peers


def _have(binary: str) -> bool:
    return shutil.which(binary) is not None or Path("/usr/sbin", binary).exists()


def subs_module_path() -> Path | None:
    """Where the Debian package put the subs_filter dynamic module, if anywhere."""
    for directory in SUBS_MODULE_DIRS:
        candidate = directory / SUBS_MODULE_NAME
        if candidate.exists():
            return candidate
    return None


def _pid_alive(pidfile: Path) -> int | None:
    try:
        pid = int(pidfile.read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


def ensure_tools() -> None:
    """Install nginx, wrk, the subs_filter module and Varnish when missing.

    apt runs at most once.  A ``policy-rc.d`` that forbids service starts is
    put in place for the install (only if none exists, and removed after) so
    the Debian nginx/varnish services never grab port 80/6081; if a service
    was started by this install anyway, it is stopped again.
    """
    missing = [
        name
        for name, ok in (
            ("nginx", _have("nginx")),
            ("wrk", _have("wrk")),
            ("libnginx-mod-http-subs-filter", subs_module_path() is not None),
            ("varnish", _have("varnishd")),
            ("nghttp2-client", _have("h2load")),
            ("realistic corpus", all(p.source.exists() for p in realistic.PAGES.values())),
            # Debian's own python3 needs python3-venv for `venv` with pip.
            ("python3-venv", importlib.util.find_spec("ensurepip") is not None),
        )
        if not ok
    ]
    if not missing:
        return
    packages = [*APT_PACKAGES, *(["python3-venv"] if "python3-venv" in missing else [])]
    if os.geteuid() != 0:
        raise SystemExit(f"missing {', '.join(missing)}: run as root or install them with apt")
    log(f"installing {' '.join(missing)} with apt-get")
    policy = Path("/usr/sbin/policy-rc.d")
    created_policy = False
    running_before = {
        name: _pid_alive(Path(f"/run/{name}.pid")) for name in ("nginx", "varnishd")
    }
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        if not policy.exists():
            policy.write_text("#!/bin/sh\n# written by prexy bench/run.py for one apt run\nexit 101\n")
            policy.chmod(0o755)
            created_policy = True
        subprocess.run(["apt-get", "update", "-q"], check=True, env=env, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *packages], check=True, env=env, timeout=1200
        )
    finally:
        if created_policy:
            policy.unlink(missing_ok=True)
    for name, before in running_before.items():
        now = _pid_alive(Path(f"/run/{name}.pid"))
        if now is not None and before is None:
            log(f"stopping the {name} system service that the install started")
            os.kill(now, signal.SIGTERM)


# --------------------------------------------------------------------------
# Child processes


@dataclass
class Child:
    """A child process started in its own session, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    logfile: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.logfile.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


_children: list[Child] = []


def _descendants(root: int) -> list[int]:
    """Pids whose parent chain leads to ``root`` (read from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in parents.get(pid, []):
            found.append(child)
            todo.append(child)
    return found


def spawn(name: str, argv: Sequence[str], *, cwd: Path | None = None,
          env: dict[str, str] | None = None) -> Child:
    """Start ``argv`` with stdout+stderr to ``bench/.work/logs/NAME.log``."""
    logdir = WORK / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    logfile = logdir / f"{name}.log"
    with logfile.open("wb") as out:
        popen = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=cwd, env=env, start_new_session=True,
        )
    child = Child(name, popen, logfile)
    _children.append(child)
    return child


def stop(child: Child, grace: float = 5.0) -> None:
    """SIGTERM the child, wait, then SIGKILL it and any descendant still there."""
    if child in _children:
        _children.remove(child)
    family = _descendants(child.pid) if child.alive() else []
    if child.alive():
        try:
            child.popen.send_signal(signal.SIGTERM)
            child.popen.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    if child.alive():
        child.popen.kill()
        child.popen.wait(5)
    deadline = time.monotonic() + grace
    for pid in family:
        while _exists(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _exists(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _exists(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def cleanup() -> None:
    """Stop every registered child (newest first)."""
    for child in reversed(list(_children)):
        try:
            stop(child)
        except Exception as error:  # noqa: BLE001 - cleanup must go on
            log(f"cleanup of {child.name} failed: {error}")


def install_cleanup() -> None:
    """Make SIGTERM/SIGHUP unwind through ``finally`` and run cleanup at exit."""
    atexit.register(cleanup)

    def _raise(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _raise)
    signal.signal(signal.SIGHUP, _raise)


#: Ports free_port handed out: the kernel may offer a released port again,
#: and one configuration taking two equal ports would merge two servers.
_handed_out: set[int] = set()


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1, never the same twice in
    one process."""
    while True:
        with socket.socket() as sock:
            sock.bind((LOCAL, 0))
            port = int(sock.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port


def wait_port(child: Child, port: int, timeout: float = 30.0) -> None:
    """Wait until ``port`` accepts connections; fail with the child's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with {child.popen.returncode}:\n{child.log_tail()}"
            )
        try:
            with socket.create_connection((LOCAL, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{child.name} did not listen on {port} in {timeout}s:\n{child.log_tail()}")


def wait_http(child: Child, port: int, timeout: float = 60.0) -> None:
    """Wait until an HTTP request on ``port`` gets any response.

    A master process may open the port before its workers have loaded the
    rules and maps; the first answer shows that someone is serving.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise RuntimeError(
                f"{child.name} exited with {child.popen.returncode}:\n{child.log_tail()}"
            )
        try:
            get_once(port, "/__bench_ready", timeout=max(1.0, deadline - time.monotonic()))
            return
        except (OSError, http.client.HTTPException):
            time.sleep(0.05)
    raise RuntimeError(f"{child.name} gave no HTTP answer in {timeout}s:\n{child.log_tail()}")


# --------------------------------------------------------------------------
# CPU accounting

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Iterable[int]) -> float:
    """utime+stime (seconds) of the given processes, from /proc/PID/stat."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # stat fields 14 and 15
    return total / CLK_TCK


@dataclass(frozen=True)
class CpuSnapshot:
    """Machine-wide busy CPU time and the part used by this harness's tree."""

    when: float
    busy: float
    ours: float


def cpu_snapshot() -> CpuSnapshot:
    """Read /proc/stat and our own process tree (live and already reaped).

    Children we have waited for (wrk, stopped servers, and what they reaped)
    are in ``os.times()``; children still running are read from /proc.
    """
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    busy = (user + nice + system + irq + softirq + steal) / CLK_TCK
    times = os.times()
    ours = times.user + times.system + times.children_user + times.children_system
    ours += cpu_seconds(_descendants(os.getpid()))
    return CpuSnapshot(time.monotonic(), busy, ours)


def foreign_load(before: CpuSnapshot, after: CpuSnapshot) -> str:
    """How much CPU others took between two snapshots (a noise indicator)."""
    wall = after.when - before.when
    foreign = max(0.0, (after.busy - before.busy) - (after.ours - before.ours))
    cores = os.cpu_count() or 1
    share = foreign / (wall * cores) * 100 if wall > 0 else 0.0
    return (f"CPU not used by this benchmark's processes: {foreign:.1f} s in {wall:.0f} s "
            f"({share:.0f}% of {cores} cores: other work on the machine, plus kernel time "
            "not charged to a process)")


def family_pids(child: Child) -> list[int]:
    """The child and all its descendants (workers of a master)."""
    return [child.pid, *_descendants(child.pid)]


# --------------------------------------------------------------------------
# Load generation


WRK_DONE_LUA = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\\"requests\\": %d, \\"duration_us\\": %d, \\"bytes\\": %d, " ..
    "\\"p50_us\\": %d, \\"p90_us\\": %d, \\"p99_us\\": %d, \\"max_us\\": %d, " ..
    "\\"connect\\": %d, \\"read\\": %d, \\"write\\": %d, \\"status\\": %d, " ..
    "\\"timeout\\": %d}\\n",
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


@dataclass
class WrkResult:
    """One wrk run; latencies in milliseconds."""

    rps: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    requests: int
    errors: int
    non2xx: int
    cpu_us_per_req: float | None = None
    origin_cpu_us_per_req: float | None = None
    raw: dict[str, int] = field(default_factory=dict)
    runs: list[dict[str, float | None]] = field(default_factory=list)  # a median's inputs


def _wrk_script() -> Path:
    path = WORK / "wrk-done.lua"
    if not path.exists() or path.read_text() != WRK_DONE_LUA:
        WORK.mkdir(parents=True, exist_ok=True)
        path.write_text(WRK_DONE_LUA)
    return path


#: wrk Lua that numbers the threads: each gets ``tid`` (0, 1, ...) for
#: its ``init`` to read.
LUA_THREAD_IDS = """local threads = 0
setup = function(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
"""


def wrk_script(name: str, body: str) -> Path:
    """Write ``bench/.work/NAME.lua``: ``body`` (``setup``/``init``/``request``
    functions of wrk's Lua API) followed by the ``done`` hook that reports
    the figures; for ``wrk(..., script=...)``."""
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"{name}.lua"
    path.write_text(body + "\n" + WRK_DONE_LUA)
    return path


def pinned(cpus: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` run on the CPUs ``cpus`` (a taskset list such as ``0-3``)
    when given; taskset execs the program, so the pid stays the same."""
    return ["taskset", "-c", cpus, *argv] if cpus else list(argv)


def wrk(url: str, *, seconds: float, connections: int, threads: int = 1,
        cpu_of: Callable[[], float] | None = None,
        origin_cpu_of: Callable[[], float] | None = None, timeout_s: float = 10.0,
        headers: Sequence[str] = (), script: Path | None = None,
        script_args: Sequence[str] = (), cpus: str | None = None) -> WrkResult:
    """Run wrk with ``--latency`` and return its figures (plus CPU/request).

    ``cpu_of`` returns the CPU seconds used so far by the server under test;
    it is sampled right before and after the run.  ``origin_cpu_of`` does the
    same for the origin behind it (a cache hit should cost the origin nothing).
    ``script`` replaces the plain reporting script (made by ``wrk_script``),
    ``script_args`` go to its ``init(args)``; ``cpus`` pins wrk to those CPUs.
    """
    threads = max(1, min(threads, connections))
    argv = pinned(cpus, [
        "wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, round(seconds))}s",
        f"--timeout={int(timeout_s)}s", "--latency", "-s", str(script or _wrk_script()),
        *(x for h in headers for x in ("-H", h)), url, *(["--", *script_args] if script_args else []),
    ])
    before = cpu_of() if cpu_of else 0.0
    origin_before = origin_cpu_of() if origin_cpu_of else 0.0
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + timeout_s + 30)
    after = cpu_of() if cpu_of else 0.0
    origin_after = origin_cpu_of() if origin_cpu_of else 0.0
    (WORK / "logs").mkdir(parents=True, exist_ok=True)
    with (WORK / "logs" / "wrk.log").open("a") as wrk_log:  # the --latency text, for reference
        wrk_log.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}\n")
    line = next((x for x in done.stdout.splitlines() if x.startswith("WRKJSON ")), None)
    if done.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed ({done.returncode}): {done.stdout}\n{done.stderr}")
    data: dict[str, int] = json.loads(line[len("WRKJSON "):])
    duration = data["duration_us"] / 1e6
    requests = data["requests"]
    errors = data["connect"] + data["read"] + data["write"] + data["timeout"]
    result = WrkResult(
        rps=requests / duration if duration else 0.0,
        p50_ms=data["p50_us"] / 1000,
        p90_ms=data["p90_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        requests=requests,
        errors=errors,
        non2xx=data["status"],
        raw=data,
    )
    if cpu_of and requests:
        result.cpu_us_per_req = (after - before) / requests * 1e6
    if origin_cpu_of and requests:
        result.origin_cpu_us_per_req = (origin_after - origin_before) / requests * 1e6
    return result


def median_wrk(results: Sequence[WrkResult]) -> WrkResult:
    """Per-figure medians of several runs; errors are summed."""
    cpus = [r.cpu_us_per_req for r in results if r.cpu_us_per_req is not None]
    origin = [r.origin_cpu_us_per_req for r in results if r.origin_cpu_us_per_req is not None]
    return WrkResult(
        rps=statistics.median(r.rps for r in results),
        p50_ms=statistics.median(r.p50_ms for r in results),
        p90_ms=statistics.median(r.p90_ms for r in results),
        p99_ms=statistics.median(r.p99_ms for r in results),
        requests=sum(r.requests for r in results),
        errors=sum(r.errors for r in results),
        non2xx=sum(r.non2xx for r in results),
        cpu_us_per_req=statistics.median(cpus) if cpus else None,
        origin_cpu_us_per_req=statistics.median(origin) if origin else None,
        runs=[
            {"rps": r.rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms, "cpu_us_per_req": r.cpu_us_per_req}
            for r in results
        ],
    )


# --------------------------------------------------------------------------
# Single requests


@dataclass
class Fetched:
    """One response read whole, with the wall time it took."""

    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float


class Client:
    """A keep-alive HTTP/1.1 client on one loopback connection (http.client)."""

    def __init__(self, port: int, timeout: float = 120.0) -> None:
        self.port = port
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def get(self, path: str, headers: dict[str, str] | None = None) -> Fetched:
        """GET ``path``; reconnect once if the server closed the connection."""
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(LOCAL, self.port, timeout=self.timeout)
            start = time.perf_counter()
            try:
                self.conn.request("GET", path, headers=headers or {})
                response = self.conn.getresponse()
                body = response.read()
            except (http.client.HTTPException, ConnectionError):
                self.close()
                if attempt:
                    raise
                continue
            seconds = time.perf_counter() - start
            if response.will_close:
                self.close()
            return Fetched(
                response.status,
                {k.lower(): v for k, v in response.getheaders()},
                body,
                seconds,
            )
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def get_once(port: int, path: str, headers: dict[str, str] | None = None,
             timeout: float = 60.0) -> Fetched:
    """One GET on a fresh connection."""
    client = Client(port, timeout)
    try:
        return client.get(path, headers)
    finally:
        client.close()


# --------------------------------------------------------------------------
# Output


def fmt(value: float | None, digits: int = 0) -> str:
    """A number for a table cell; '-' when there is none."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def fmt_ms(seconds: float | None) -> str:
    """Seconds as a human latency."""
    if seconds is None:
        return "-"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 0.01:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds * 1000:.2f} ms"


def ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    """a/b as 'N.NN×'."""
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.{digits}f}×"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_results(scenario: str, payload: object) -> Path:
    """Write ``bench/.work/results-SCENARIO.json``."""
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"results-{scenario}.json"
    path.write_text(json.dumps(payload, indent=2, default=lambda o: o.__dict__) + "\n")
    return path
