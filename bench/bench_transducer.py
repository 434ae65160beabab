"""Throughput of the substitution transducer alone (no HTTP, no network).

Run standalone::

    python bench/bench_transducer.py [--runs N] [--quick] [--cold] [--feeds] [--engine E ...]

``--feeds``: the reads a real origin gives, on the realistic corpus and on
bench/othersite.py's pages and rules (not tuned on): each page whole and in
64 KiB and 16 KiB feeds at 10, 100 and 1000 rules, the feeds' time against
the whole body's and their MB/s (see :func:`feeds_main`).

For 1, 10, 100 and 1000 rules (the issue's mix: the site's domain, an
analytics id, then generated ``word[0-9]+token``-style regexes that rarely
match, all global) and pages of 20 KB and 1 MB (generated HTML carrying the
domain and the id), it prints the median MB/s of several runs per
multi-pattern prefilter engine (``prexy.substitution.prefilter``: every
installed one by default; ``none`` runs every rule on every buffer),
feeding the page in 64 KB slices as the proxy does, after checking that all
engines give the same bytes.  MB/s is wall-clock; "CPU MB/s" uses the
process's CPU time, the steadier figure on a busy machine.  Targets: 1 MB
with 1 rule >= 100 MB/s and with 10 rules >= 50 MB/s; 1000 rules >= 50 MB/s
and >= 1/2 of the same engine at 10 rules.

Its figures are in bench/README.md.

Hyperscan (optional dependency) is the default when it imports; without
it the anchor filter is used.  ``none`` (every rule scanning every buffer)
shows what the prefilter saves.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from prexy.substitution import prefilter  # noqa: E402
from prexy.substitution.rules import parse_rules  # noqa: E402
from prexy.substitution.ruleset import RuleSet  # noqa: E402
from prexy.substitution.transducer import Transducer  # noqa: E402

DOMAIN = "www.example.com"
ANALYTICS_ID = "UA-12345678-1"
SLICE = 64 * 1024
WORDS = (
    "about account archive article author banner browse button cache card category "
    "channel comment community content cookie daily data design detail digital discuss "
    "document download editor email event feature field footer forum gallery global guide "
    "header help history home image index issue item journal label latest layout library "
    "link local login market media member menu message module network news notice online "
    "option order page panel photo policy portal post press price print privacy product "
    "profile project public question quick radio record region report review search section "
    "select service share shop sidebar signup site social source sport store story style "
    "support system table team theme today token topic travel update upload user video view "
    "weather widget word world"
).split()


def html_page(size: int, seed: int = 1) -> bytes:
    """A deterministic HTML page of ``size`` bytes with the domain and the id."""
    rng = random.Random(seed)
    head = (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<link rel="canonical" href="https://{DOMAIN}/">\n'
        f"<script>ga('create','{ANALYTICS_ID}','auto');</script>\n</head>\n<body>\n"
    )
    parts = [head]
    length = len(head)
    while length < size:
        words = [rng.choice(WORDS) for _ in range(rng.randint(40, 90))]
        if rng.random() < 0.05:
            words[rng.randrange(len(words))] = f"word{rng.randint(1, 999)}token"
        text = " ".join(words)
        if rng.random() < 0.5:
            slug = "-".join(rng.choice(WORDS) for _ in range(3))
            text += f' See <a href="https://{DOMAIN}/{slug}/">{slug}</a>.'
        if rng.random() < 0.05:
            text += f"<!-- {ANALYTICS_ID} -->"
        para = f"<p>{text}.</p>\n"
        parts.append(para)
        length += len(para)
    return "".join(parts).encode()[:size]


def rules_text(count: int) -> bytes:
    """The issue's rule mix as a rules file."""
    lines = [f"replace_filter '{DOMAIN.replace('.', chr(92) + '.')}' 'www.example.org' g;"]
    if count >= 2:
        lines.append("replace_filter 'UA-\\d+-\\d+' 'UA-00000000-0' g;")
    suffixes = ("token", "tok", "ref", "id", "key")
    words = ["word", *(w for w in WORDS if w != "word")]
    n = 0
    while len(lines) < count:
        block = n // len(words)
        word = words[n % len(words)]
        digit = str(block) if block else ""
        lines.append(
            f"replace_filter '{word}{digit}[0-9]+{suffixes[block % len(suffixes)]}' "
            f"'{word.upper()}-{n}' g;"
        )
        n += 1
    return "\n".join(lines[:count]).encode()


def rewrite(ruleset: RuleSet, page: bytes) -> tuple[bytes, float, float]:
    """Rewrite ``page`` in 64 KB slices; return the output, wall and CPU seconds."""
    started = time.perf_counter()
    cpu_started = time.process_time()
    t = Transducer(ruleset)
    out = [t.feed(page[i : i + SLICE]) for i in range(0, len(page), SLICE)]
    out.append(t.finish())
    cpu = time.process_time() - cpu_started
    elapsed = time.perf_counter() - started
    assert not t.bailed_out and not t.timed_out
    return b"".join(out), elapsed, cpu


def measure(ruleset: RuleSet, page: bytes, runs: int, budget: float) -> tuple[float, float]:
    """Median wall and CPU MB/s over ``runs`` runs (fewer past the budget)."""
    rates = []
    cpu_rates = []
    deadline = time.perf_counter() + budget
    for _ in range(runs):
        _, elapsed, cpu = rewrite(ruleset, page)
        rates.append(len(page) / elapsed / 1e6)
        cpu_rates.append(len(page) / max(cpu, 1e-9) / 1e6)
        if time.perf_counter() > deadline:
            break
    return statistics.median(rates), statistics.median(cpu_rates)


FEEDS = {"whole": None, "16 KiB": 16 * 1024, "1 KiB": 1024}


def feed_time(ruleset: RuleSet, page: bytes, feed: int | None) -> tuple[bytes, float]:
    """Rewrite ``page`` in feeds of ``feed`` bytes (None: whole); (output, CPU s)."""
    started = time.process_time()
    t = Transducer(ruleset)
    if feed is None:
        out = t.finish(page)
    else:
        out = b"".join(t.feed(page[i : i + feed]) for i in range(0, len(page), feed)) + t.finish()
    cpu = time.process_time() - started
    assert not t.bailed_out and not t.timed_out
    return out, cpu


#: The feed sizes of ``--feeds``: what a remote origin's reads give.
ORIGIN_FEEDS = {"whole": None, "64 KiB": 64 * 1024, "16 KiB": 16 * 1024}


def feeds_main(runs: int, counts: tuple[int, ...]) -> int:
    """The reads a real origin gives: each page of both corpora (the
    realistic one, and bench/othersite.py's pages and rules that the code
    was not tuned on) whole and in 64 KiB and 16 KiB feeds, at 10, 100 and
    1000 rules; CPU time, median of ``runs`` interleaved runs.  Prints each
    feed size's time against the whole body's and its MB/s.  Targets: 16
    KiB feeds within 1.5x of the whole body, and at 1000 rules >= 50 MB/s."""
    import othersite  # noqa: PLC0415 - bench/ is on sys.path
    import realistic  # noqa: PLC0415

    realistic.ensure_sources()
    corpora: dict[str, tuple[dict[str, bytes], dict[int, str]]] = {
        "realistic": (
            {name: realistic.load_page(name) for name in ("html-20k", "html-1m", "html-1.7m", "jquery", "bootstrap-css")},
            {count: realistic.rules_text(count) for count in counts},
        ),
        "othersite": (
            {name: othersite.load_page(name) for name in othersite.available_pages()},
            {count: othersite.rules_text(count) for count in counts},
        ),
    }
    print(f"corpora: realistic {realistic.corpus_digest()}, othersite {othersite.corpus_digest()} "
          f"(seed {othersite.SEED}; pages {', '.join(str(othersite.PAGES[n]) for n in othersite.available_pages())})")
    print(f"transducer alone, CPU time, median of {runs} interleaved runs; per feed size: x whole, MB/s")
    print(f"{'corpus':>9} {'rules':>5} {'page':>14} {'KB':>5} {'whole MB/s':>10}"
          + "".join(f" {label:>15}" for label in ORIGIN_FEEDS if label != "whole"))
    ok = True
    misses: list[str] = []
    for corpus, (pages, texts) in corpora.items():
        for count in counts:
            ruleset = parse_rules(texts[count].encode(), f"{corpus}-{count}")
            for name, page in pages.items():
                want, _ = feed_time(ruleset, page, None)
                times: dict[str, list[float]] = {label: [] for label in ORIGIN_FEEDS}
                for _ in range(runs):
                    for label, size in ORIGIN_FEEDS.items():
                        out, cpu = feed_time(ruleset, page, size)
                        assert out == want, (corpus, count, name, label)
                        times[label].append(cpu)
                med = {label: statistics.median(v) for label, v in times.items()}
                cells = "".join(
                    f" {med[label] / med['whole']:>5.2f}x {len(page) / med[label] / 1e6:>6.0f}"
                    for label in ORIGIN_FEEDS if label != "whole"
                )
                print(f"{corpus:>9} {count:>5} {name:>14} {len(page) // 1000:>5} {len(page) / med['whole'] / 1e6:>10.0f}"
                      + cells, flush=True)
                ratio = med["16 KiB"] / med["whole"]
                rate = len(page) / med["16 KiB"] / 1e6
                if ratio > 1.5:
                    misses.append(f"{corpus} {count} {name}: 16 KiB feeds {ratio:.2f}x whole")
                if count >= 1000 and rate < 50:
                    misses.append(f"{corpus} {count} {name}: 16 KiB feeds {rate:.0f} MB/s")
    for miss in misses:
        ok = False
        print(f"BELOW TARGET: {miss}")
    if ok:
        print("targets met: 16 KiB feeds within 1.5x of whole, >= 50 MB/s at 1000 rules")
    return 0 if ok else 1


def realistic_main(runs: int) -> int:
    """The realistic cells: the realistic corpus (bench/realistic.py), 10 / 100 /
    1000 clone rules, whole bodies and 16 KiB and 1 KiB feeds; CPU time,
    median of ``runs`` interleaved runs; the first run after compiling is
    reported apart (it must not pay for compilation)."""
    import realistic  # noqa: PLC0415 - bench/ is on sys.path

    realistic.ensure_sources()
    pages = {name: realistic.load_page(name) for name in ("html-20k", "html-1m", "jquery", "bootstrap-css")}
    print(f"realistic corpus {realistic.corpus_digest()}, CPU ms per page (MB/s), median of {runs}")
    print(f"{'rules':>6} {'page':>14} {'compile':>8} {'first':>8}" + "".join(f" {f:>18}" for f in FEEDS))
    results: dict[tuple[int, str, str], float] = {}
    ok = True
    for count in realistic.RULE_COUNTS:
        started = time.perf_counter()
        ruleset = parse_rules(realistic.rules_text(count).encode(), f"realistic-{count}")
        compile_ms = (time.perf_counter() - started) * 1000
        for name, page in pages.items():
            want, first = feed_time(ruleset, page, 16 * 1024)
            times: dict[str, list[float]] = {f: [] for f in FEEDS}
            for _ in range(runs):
                for label, size in FEEDS.items():
                    out, cpu = feed_time(ruleset, page, size)
                    assert out == want, (count, name, label)
                    times[label].append(cpu)
            cells = []
            for label in FEEDS:
                med = statistics.median(times[label])
                results[(count, name, label)] = med
                cells.append(f"{med * 1000:>8.2f} ({len(page) / med / 1e6:>6.0f})")
            warm = results[(count, name, "16 KiB")]
            print(f"{count:>6} {name:>14} {compile_ms:>8.0f} {first * 1000:>8.2f}" + "".join(f" {c:>18}" for c in cells)
                  + f"  first/warm {first / warm:.2f}", flush=True)
            compile_ms = 0.0
    mb = len(pages["html-1m"])

    def check(text: str, met: bool) -> None:
        nonlocal ok
        ok = ok and met
        print(f"target {text}: {'ok' if met else 'BELOW TARGET'}")

    r10 = mb / results[(10, "html-1m", "16 KiB")] / 1e6
    r1000 = mb / results[(1000, "html-1m", "16 KiB")] / 1e6
    check(f"1 MB page, 16 KiB feeds, 10 rules >= 100 MB/s ({r10:.0f})", r10 >= 100)
    check(f"1 MB page, 16 KiB feeds, 1000 rules >= 50 MB/s ({r1000:.0f})", r1000 >= 50)
    for name in pages:
        ratio = results[(1000, name, "16 KiB")] / results[(10, name, "16 KiB")]
        check(f"{name}: 1000 rules <= 2x 10 rules ({ratio:.2f}x)", ratio <= 2)
        small = results[(1000, name, "1 KiB")] / results[(1000, name, "whole")]
        check(f"{name}, 1000 rules: 1 KiB feeds <= 1.5x whole body ({small:.2f}x)", small <= 1.5)
    return 0 if ok else 1


#: Memory written between cache-cold runs: more than the last-level cache.
THRASH_BYTES = 32 * 1024 * 1024


def cold_main(runs: int) -> int:
    """The 20 KB realistic page whole, per page, warm and cache-cold: before
    each cold run THRASH_BYTES are written (one byte per cache line), as
    when nginx and its filter run between a worker's requests.  Wall time
    (the cold cost is memory stalls), medians of ``runs`` interleaved runs."""
    import realistic  # noqa: PLC0415 - bench/ is on sys.path

    realistic.ensure_sources()
    page = realistic.load_page("html-20k")
    junk = bytearray(THRASH_BYTES)
    ones = b"\x01" * (THRASH_BYTES // 64)
    print(f"realistic html-20k whole, us per page, median of {runs} (warm / cache-cold)")
    for count in realistic.RULE_COUNTS:
        ruleset = parse_rules(realistic.rules_text(count).encode(), f"realistic-{count}")
        feed_time(ruleset, page, None)
        warm: list[float] = []
        cold: list[float] = []
        for _ in range(runs):
            started = time.perf_counter()
            feed_time(ruleset, page, None)
            warm.append(time.perf_counter() - started)
            junk[::64] = ones
            started = time.perf_counter()
            feed_time(ruleset, page, None)
            cold.append(time.perf_counter() - started)
        print(f"{count:>6} rules {statistics.median(warm) * 1e6:>8.0f} {statistics.median(cold) * 1e6:>8.0f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", choices=("realistic", "synthetic"), default="realistic",
                        help="realistic: bench/realistic.py's pages and clone rules (default); "
                             "synthetic: the generated page and word[0-9]+token rules")
    parser.add_argument("--runs", type=int, default=7, help="runs per cell (median)")
    parser.add_argument("--feeds", action="store_true",
                        help="the reads a real origin gives: both corpora (realistic and othersite) "
                             "in 64 KiB and 16 KiB feeds against the whole body, 10/100/1000 rules")
    parser.add_argument("--quick", action="store_true", help="1 and 10 rules only")
    parser.add_argument("--cold", action="store_true",
                        help="realistic 20 KB page only: per page, warm and cache-cold")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds per cell at most")
    parser.add_argument(
        "--engine",
        action="append",
        choices=[*prefilter.ENGINES, "none"],
        help="prefilter engine(s) to measure (default: every one installed)",
    )
    args = parser.parse_args(argv)
    if args.cold:
        return cold_main(max(args.runs, 51))
    if args.feeds:
        return feeds_main(3 if args.quick else args.runs, (10, 100, 1000))
    if args.corpus == "realistic":
        return realistic_main(3 if args.quick else args.runs)
    counts = (1, 10) if args.quick else (1, 10, 100, 1000)
    engines = args.engine or list(prefilter.ENGINES)
    sizes = {"20 KB": 20 * 1024, "1 MB": 1024 * 1024}
    pages = {label: html_page(size) for label, size in sizes.items()}
    try:
        load = " (load average {:.2f} {:.2f} {:.2f})".format(*os.getloadavg())
    except OSError:
        load = ""
    print(f"transducer alone, 64 KB slices, median of {args.runs} runs{load}")
    print("per engine: wall MB/s, CPU MB/s, compile ms")
    print(f"{'rules':>6} {'page':>6}" + "".join(f" {e:>27}" for e in engines))
    results: dict[tuple[str, int, str], float] = {}
    for count in counts:
        text = rules_text(count)
        rulesets: dict[str, RuleSet] = {}
        compile_ms: dict[str, float] = {}
        for engine in engines:
            saved = prefilter.ENGINE
            prefilter.ENGINE = engine
            try:
                started = time.perf_counter()
                rulesets[engine] = parse_rules(text, f"rules-{count}")
                compile_ms[engine] = (time.perf_counter() - started) * 1000
            finally:
                prefilter.ENGINE = saved
        for label, page in pages.items():
            outputs = {rewrite(rulesets[e], page)[0] for e in engines}
            assert len(outputs) == 1, "engines disagree"
            cells = []
            for engine in engines:
                rate, cpu_rate = measure(rulesets[engine], page, args.runs, args.budget)
                results[(engine, count, label)] = rate
                cells.append(f"{rate:>9.1f} {cpu_rate:>8.1f} {compile_ms[engine]:>8.0f}")
            print(f"{count:>6} {label:>6} " + " ".join(f"{c:>27}" for c in cells), flush=True)
    ok = True
    engine = engines[0]
    for key, target in (((1, "1 MB"), 100.0), ((10, "1 MB"), 50.0)):
        if (engine, *key) in results:
            met = results[(engine, *key)] >= target
            ok = ok and met
            verdict = "ok" if met else "BELOW TARGET"
            print(f"target {key[0]} rules, {key[1]}: >= {target:.0f} MB/s ({engine}): {verdict}")
    for label in pages:
        if (engine, 1000, label) not in results:
            continue
        at_1000 = results[(engine, 1000, label)]
        at_10 = results[(engine, 10, label)]
        met = at_1000 >= 50.0 and at_1000 >= at_10 / 2
        ok = ok and met
        verdict = "ok" if met else "BELOW TARGET"
        print(
            f"target 1000 rules, {label}: >= 50 MB/s and >= 1/2 of 10 rules "
            f"({at_1000:.1f} vs {at_10:.1f}, {engine}): {verdict}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
