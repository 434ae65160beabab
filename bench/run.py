"""Benchmark Prexy side by side with nginx, nginx subs_filter and Varnish.

    python bench/run.py [--quick] [--only NAME[,NAME...]] [--connections 50,1]

Installs what it needs when missing (Debian ``nginx``, ``wrk``,
``libnginx-mod-http-subs-filter``, ``varnish``; Prexy itself with ``pip
install`` of this repository into ``bench/.work/venv``), starts a static
nginx origin and the servers under test on 127.0.0.1, and prints one
markdown table per scenario.  Results also go to
``bench/.work/results-<scenario>.json`` and all tables of the run to
``bench/.work/results.md``.  Every child process is stopped at
exit.  Scenarios: proxy, subs, first, stream, slowclient, workers, cache, urlmap, transducer,
urlmap-index, cache-store, compress, compress-hits, tunnel, http2, cluster, sites, mix, scaling,
floor, observe (see bench/README.md).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from catalog import SCENARIOS  # noqa: E402
from observe_bench import DEFAULT_BASELINE  # noqa: E402
from scenarios import Bench, Report, Settings  # noqa: E402

DEFAULT_ORDER = ("proxy", "subs", "subs-synthetic", "first", "stream", "slowclient", "workers", "cache", "urlmap", "transducer", "urlmap-index",
                 "cache-store", "compress", "compress-hits", "tunnel", "http2", "cluster", "sites", "mix", "scaling")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="shorter runs (2 s wrk runs, fewer samples)")
    parser.add_argument("--only", action="append", default=[],
                        help=f"scenario(s) to run, comma-separated: {', '.join(SCENARIOS)}")
    parser.add_argument("--seconds", type=float, help="seconds per wrk run (default 6, quick 2)")
    parser.add_argument("--rounds", type=int, help="interleaved wrk runs per server (default 3)")
    parser.add_argument("--connections", default="50,1",
                        help="comma-separated wrk connection counts for 'proxy' (default 50,1;"
                             " the largest is used by the other scenarios)")
    parser.add_argument("--threads", type=int, default=1,
                        help="wrk threads for single-worker scenarios (default 1)")
    parser.add_argument("--samples", type=int,
                        help="single requests per cell in 'subs' (default 7, quick 3)")
    parser.add_argument("--repo", type=Path, default=harness.REPO,
                        help="Prexy source tree to pip install (default: this repository)")
    parser.add_argument("--working-tree", action="store_true",
                        help="install the working tree with uncommitted changes (default: HEAD)")
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, metavar="REV",
                        help="the revision 'observe' compares the last commit with (default "
                             f"{DEFAULT_BASELINE},"
                             " main before the per-site and per-rule counters and the live log)")
    parser.add_argument("--no-reinstall", action="store_true",
                        help="reuse the Prexy already installed in bench/.work/venv")
    parser.add_argument("--no-install", action="store_true",
                        help="never run apt-get (fail if a tool is missing)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [n.strip() for item in args.only for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario(s): {', '.join(unknown)}; known: {', '.join(SCENARIOS)}",
              file=sys.stderr)
        return 2
    settings = Settings(
        quick=args.quick,
        seconds=args.seconds or (2.0 if args.quick else 6.0),
        rounds=args.rounds or (1 if args.quick else 3),
        connections=[int(c) for c in args.connections.split(",")],
        threads=args.threads,
        samples=args.samples or (3 if args.quick else 7),
        repo=args.repo.resolve(),
        reinstall=not args.no_reinstall,
        working_tree=args.working_tree,
        baseline=args.baseline,
    )
    lock = harness.WORK / "run.lock"
    harness.WORK.mkdir(parents=True, exist_ok=True)
    lock_file = lock.open("a+")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.seek(0)
        print(f"another bench run holds {lock} ({lock_file.read().strip()}); runs share "
              "bench/.work/ and the CPUs, so they must not overlap", file=sys.stderr)
        return 3
    lock_file.truncate(0)
    lock_file.write(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
    lock_file.flush()
    (harness.WORK / "logs" / "wrk.log").unlink(missing_ok=True)
    harness.install_cleanup()
    if not args.no_install:
        harness.ensure_tools()
    bench = Bench(settings)
    reports: list[Report] = []
    failed: list[str] = []
    started = time.monotonic()
    try:
        for name in names or DEFAULT_ORDER:
            harness.log(f"scenario {name}")
            load_before = os.getloadavg()[0]
            cpu_before = harness.cpu_snapshot()
            try:
                report = SCENARIOS[name](bench)
            except Exception as error:  # noqa: BLE001 - one scenario must not stop the rest
                traceback.print_exc()
                failed.append(name)
                report = Report(name, "(failed)", [f"{type(error).__name__}: {error}"])
            report.notes.append(
                f"Load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; "
                f"{harness.foreign_load(cpu_before, harness.cpu_snapshot())}."
            )
            if bench.prexy_revision:
                report.notes.append(f"Prexy: {bench.prexy_revision}.")
            reports.append(report)
            path = harness.write_results(name, {
                "scenario": name, "title": report.title, "table": report.table,
                "targets": report.targets, "notes": report.notes, "data": report.data,
                "settings": settings.__dict__ | {"repo": str(settings.repo)},
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": platform.platform(),
                "prexy": bench.prexy_revision,
            })
            print(report.markdown(), flush=True)
            (harness.WORK / "results.md").write_text("\n".join(r.markdown() for r in reports))
            harness.log(f"wrote {path}")
    finally:
        harness.cleanup()
    harness.log(f"done in {time.monotonic() - started:.0f} s"
                + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
