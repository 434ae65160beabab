"""Benchmark of prexy.urlmap alone: load time, memory and lookup cost by map size.

Standalone: ``python bench/bench_urlmap.py [--sizes 100,1000,10000,100000]``.
For each size it writes a map of that many regex entries of the issue's seed
shape (iterated md5 of "hello world": ``~^/hello/world/<hash>\\b(\\?[^/]*)*/?$
/;``), plus 100,000 exact entries for the largest size, then in a fresh
child process measures the load time, the RSS growth of loading it, and the
median per-lookup cost (process CPU time, so other processes' load stays
out) for the first entry's URL, the last entry's URL and a
URL that matches nothing.  It prints a table and the ratio of the cost at the
largest size to the cost at the smallest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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


def _time_lookup(
    lookup: Callable[[str], str], key: str, expected: str, repeat: int = 7, number: int = 20000
) -> float:
    """Median seconds per lookup of ``key`` over ``repeat`` runs of ``number``."""
    assert lookup(key) == expected, (key, lookup(key), expected)
    runs = []
    for _ in range(repeat):
        start = time.process_time()  # CPU time: other processes' load stays out
        for _ in range(number):
            lookup(key)
        runs.append((time.process_time() - start) / number)
    return statistics.median(runs)


def child(path: str, first: str, last: str) -> dict[str, float]:
    """Load the map at ``path`` in this (fresh) process and measure it."""
    sys.path.insert(0, str(REPO))
    import prexy.urlmap  # noqa: F401  (import cost is not load cost)
    from prexy.urlmap import load_map

    rss0 = _rss_kib()
    start = time.perf_counter()
    cpu = time.process_time()
    urlmap = load_map(path)
    load = time.perf_counter() - start
    load_cpu = time.process_time() - cpu
    rss1 = _rss_kib()
    return {
        "entries": urlmap.entry_count,
        "load_s": load,
        "load_cpu_s": load_cpu,
        "rss_mib": (rss1 - rss0) / 1024,
        "first_us": _time_lookup(urlmap.lookup, f"/hello/world/{first}", "/") * 1e6,
        "last_us": _time_lookup(urlmap.lookup, f"/hello/world/{last}?a=1", "/") * 1e6,
        "none_us": _time_lookup(urlmap.lookup, "/nothing/matches/here", "") * 1e6,
    }


def child_together(specs: list[tuple[str, str, str]], rounds: int) -> list[dict[str, float]]:
    """Load every map in one process and time their lookups round-robin, so
    machine noise hits all sizes alike; return per-map medians."""
    sys.path.insert(0, str(REPO))
    from prexy.urlmap import load_map

    maps = [(load_map(path), first, last) for path, first, last in specs]
    samples: list[dict[str, list[float]]] = [
        {"first_us": [], "last_us": [], "none_us": []} for _ in maps
    ]
    for _ in range(rounds):
        for (urlmap, first, last), sample in zip(maps, samples, strict=True):
            sample["first_us"].append(
                _time_lookup(urlmap.lookup, f"/hello/world/{first}", "/", 1, 20000) * 1e6)
            sample["last_us"].append(
                _time_lookup(urlmap.lookup, f"/hello/world/{last}?a=1", "/", 1, 20000) * 1e6)
            sample["none_us"].append(
                _time_lookup(urlmap.lookup, "/nothing/matches/here", "", 1, 20000) * 1e6)
    return [{k: statistics.median(v) for k, v in s.items()} for s in samples]


def _run_child(args: list[str]) -> object:
    out = subprocess.run(
        [sys.executable, __file__, *args], check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process runs per size")
    parser.add_argument("--child", nargs=3, metavar=("MAP", "FIRST", "LAST"), help=argparse.SUPPRESS)
    parser.add_argument("--together", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0
    if args.together:
        triples = [(s[0], s[1], s[2]) for s in json.loads(args.together)]
        print(json.dumps(child_together(triples, 15)))
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    runs: dict[int, list[dict[str, float]]] = {size: [] for size in sizes}
    with tempfile.TemporaryDirectory() as tmp:
        specs: dict[int, list[str]] = {}
        for size in sizes:
            path = Path(tmp) / f"map{size}.map"
            hashes = write_map(path, size, 100_000 if size == max(sizes) else 0)
            specs[size] = [str(path), hashes[0], hashes[-1]]
        for _ in range(args.rounds):  # interleaved: noise spreads over all sizes
            for size in sizes:
                result = _run_child(["--child", *specs[size]])
                assert isinstance(result, dict)
                runs[size].append(result)
        together = _run_child(["--together", json.dumps([specs[s] for s in sizes])])
        assert isinstance(together, list)
    rows = {size: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for size, rs in runs.items()}
    print(f"fresh process per size, median of {args.rounds} interleaved runs "
          "(lookup: CPU time, median of 7 x 20,000 calls):")
    print(f"{'regexes':>8} {'entries':>8} {'load s':>7} {'(CPU s)':>7} {'RSS MiB':>8} "
          f"{'first us':>9} {'last us':>8} {'none us':>8}")
    for size, r in rows.items():
        print(f"{size:>8} {int(r['entries']):>8} {r['load_s']:>7.2f} {r['load_cpu_s']:>7.2f} "
              f"{r['rss_mib']:>8.1f} {r['first_us']:>9.2f} {r['last_us']:>8.2f} {r['none_us']:>8.2f}")
    _ratios(rows, sizes)
    print("\nall sizes loaded in one process, lookups timed round-robin (median of 15):")
    print(f"{'regexes':>8} {'first us':>9} {'last us':>8} {'none us':>8}")
    same = dict(zip(sizes, together, strict=True))
    for size, r in same.items():
        print(f"{size:>8} {r['first_us']:>9.2f} {r['last_us']:>8.2f} {r['none_us']:>8.2f}")
    _ratios(same, sizes)
    return 0


def _ratios(rows: dict[int, dict[str, float]], sizes: list[int]) -> None:
    small, large = rows[min(sizes)], rows[max(sizes)]
    print(f"cost({max(sizes)})/cost({min(sizes)}): "
          f"first {large['first_us'] / small['first_us']:.2f}x, "
          f"last {large['last_us'] / small['last_us']:.2f}x, "
          f"none {large['none_us'] / small['none_us']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
