"""Benchmark of prexy.urlmap alone: load time, memory and lookup cost by map size.

Standalone: ``python bench/bench_urlmap.py [--sizes 100,1000,10000,100000]``.
For each size it writes a map of that many regex entries of the issue's seed
shape (iterated md5 of "hello world": ``~^/hello/world/<hash>\\b(\\?[^/]*)*/?$
/;``), plus 100,000 exact entries for the largest size, then in a fresh
child process measures the load time, the RSS growth of loading it, and the
median per-lookup cost for the first entry's URL, the last entry's URL and a
URL that matches nothing.  It prints a table and the ratio of the cost at the
largest size to the cost at the smallest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def seed_hashes(count: int, seed: str = "hello world") -> list[str]:
    """``h0 = md5(seed)``, ``h1 = md5(h0)``, ... as hex strings."""
    out: list[str] = []
    h = hashlib.md5(seed.encode()).hexdigest()
    for _ in range(count):
        out.append(h)
        h = hashlib.md5(h.encode()).hexdigest()
    return out


def write_map(path: Path, regexes: int, exact: int) -> list[str]:
    """Write the seed-shaped map; return the regex hashes in file order."""
    hashes = seed_hashes(regexes)
    with open(path, "w", encoding="latin-1") as f:
        for h in hashes:
            f.write(f"~^/hello/world/{h}\\b(\\?[^/]*)*/?$  /;\n")
        for i, h in enumerate(seed_hashes(exact, "exact entries")):
            f.write(f"/exact/{h} /new/{i};\n")
    return hashes


def _rss_kib() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _time_lookup(lookup: object, key: str, expected: str, repeat: int = 7, number: int = 20000) -> float:
    """Median seconds per lookup of ``key`` over ``repeat`` runs of ``number``."""
    fn = lookup  # type: ignore[assignment]
    assert fn(key) == expected, (key, fn(key), expected)  # type: ignore[operator]
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn(key)  # type: ignore[operator]
        runs.append((time.perf_counter() - start) / number)
    return statistics.median(runs)


def child(path: str, first: str, last: str) -> dict[str, float]:
    """Load the map at ``path`` in this (fresh) process and measure it."""
    sys.path.insert(0, str(REPO))
    import prexy.urlmap  # noqa: F401  (import cost is not load cost)
    from prexy.urlmap import load_map

    rss0 = _rss_kib()
    start = time.perf_counter()
    urlmap = load_map(path)
    load = time.perf_counter() - start
    rss1 = _rss_kib()
    return {
        "entries": urlmap.entry_count,
        "load_s": load,
        "rss_mib": (rss1 - rss0) / 1024,
        "first_us": _time_lookup(urlmap.lookup, f"/hello/world/{first}", "/") * 1e6,
        "last_us": _time_lookup(urlmap.lookup, f"/hello/world/{last}?a=1", "/") * 1e6,
        "none_us": _time_lookup(urlmap.lookup, "/nothing/matches/here", "") * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--child", nargs=3, metavar=("MAP", "FIRST", "LAST"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            path = Path(tmp) / f"map{size}.map"
            hashes = write_map(path, size, 100_000 if size == max(sizes) else 0)
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(path), hashes[0], hashes[-1]],
                check=True, capture_output=True, text=True,
            ).stdout
            rows[size] = json.loads(out)
            os.unlink(path)
    print(f"{'regexes':>8} {'entries':>8} {'load s':>7} {'RSS MiB':>8} "
          f"{'first us':>9} {'last us':>8} {'none us':>8}")
    for size, r in rows.items():
        print(f"{size:>8} {int(r['entries']):>8} {r['load_s']:>7.2f} {r['rss_mib']:>8.1f} "
              f"{r['first_us']:>9.2f} {r['last_us']:>8.2f} {r['none_us']:>8.2f}")
    small, large = rows[min(sizes)], rows[max(sizes)]
    print(f"cost({max(sizes)})/cost({min(sizes)}): "
          f"first {large['first_us'] / small['first_us']:.2f}x, "
          f"last {large['last_us'] / small['last_us']:.2f}x, "
          f"none {large['none_us'] / small['none_us']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
