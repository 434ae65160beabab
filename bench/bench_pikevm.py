"""Throughput of rules on the sregex-order Pike VM (``prexy.substitution.pikevm``).

Run standalone::

    python bench/bench_pikevm.py [--runs N]

Rules where sregex's thread order can change a match (``pikevm.order_reason``)
run on a Pike VM written in Python, with RE2 finding where a match can start.
This measures them through the transducer on the realistic 20 KB page
(``bench/realistic.py``, ``html-20k``; whole, and in 4 KB buffers as an
upstream may send it) against the same rule on ``regex`` (the engine it would
run on without the flag: Perl's order), medians of interleaved runs, and the
VM alone on adversarial bodies (1 MB and 5 MB: time must grow linearly).

Measured (2-core x86_64 shared with other work, median of 9 interleaved
runs, MB/s; "regex" is the same rule in Perl's order, which is not the
module's output for the trim rule)::

    rule                        feed    vm   regex  vm/regex
    ^\\s+|\\s+$                   whole 11.6   59.2    0.20
    ^\\s+|\\s+$                   4 KB  10.9   46.9    0.23
    ^[ \\t]+|[ \\t]+$             whole 13.2   89.8    0.15
    (?:\\bclass|\\bid)=\\b|href=  whole 44.7   96.9    0.46
    10 realistic rules                385.5
    10 realistic + ^[ \\t]+|[ \\t]+$  8.6   (one VM program for the set)
    VM alone, ^\\s+|\\s+$: 1 MB of 'x  \\n' (262,144 matches) 0.88 MB/s,
    5 MB 0.87 MB/s (5.02x the time); 1 MB of blanks then x 3.30 MB/s,
    5 MB 3.36 MB/s (4.91x).

On a busier run (load ~1.2) the same ratios held (trim 6.8 against 34.3).
Before the lazy DFA (the VM stepping every thread in Python) the trim rule
ran at 3.0 MB/s on the page.  A rule set with a flagged rule finds all its
matches on one VM program (``findcursors.SetCursor``), so every rule of it
pays the VM's price.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.realistic import load_page  # noqa: E402
from prexy.substitution import compiled as compiled_mod  # noqa: E402
from prexy.substitution.dialect import parse_sregex  # noqa: E402
from prexy.substitution.pikevm import PikePattern  # noqa: E402
from prexy.substitution.rules import compile_rule  # noqa: E402
from prexy.substitution.ruleset import RuleSet  # noqa: E402
from prexy.substitution.transducer import Transducer  # noqa: E402

#: Rules on the VM: the trim rule of the conformance cases, a trailing-blank
#: squeezer written with ``\b``, and a line-end rule with a shared tail.
VM_RULES = [
    (rb"^\s+|\s+$", b""),
    (rb"^[ \t]+|[ \t]+$", b""),
    (rb"(?:\bclass|\bid)=\b|href=", b"X="),
]


def _run(ruleset: RuleSet, page: bytes, size: int) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    tr = Transducer(ruleset, timeout=None)
    if size >= len(page):
        out = tr.finish(page)
    else:
        out = b"".join(tr.feed(page[i : i + size]) for i in range(0, len(page), size)) + tr.finish()
    return time.perf_counter() - t0, out


def _without_vm(rules: list, engine: str) -> RuleSet:
    """The same rules with the VM switched off (Perl's order on ``regex``)."""
    saved = compiled_mod.order_reason
    compiled_mod.order_reason = lambda parsed: None  # type: ignore[assignment]
    try:
        rs = RuleSet.build(rules, max_buffered_size=10**9, engine=engine)
        rs.scanner  # noqa: B018 - compiled now, with the flag off
    finally:
        compiled_mod.order_reason = saved
    return rs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    page = load_page("html-20k")
    mb = len(page) / 1e6
    print(f"page html-20k: {len(page)} bytes, {args.runs} interleaved runs, median MB/s")
    print(f"{'rule':34} {'feed':>6} {'vm':>8} {'regex':>8} {'vm/regex':>9} {'same bytes':>10}")
    for pattern, repl in VM_RULES:
        rules = [compile_rule(pattern, repl, "g")]
        vm = RuleSet.build(rules, max_buffered_size=10**9, engine="none")
        assert [e for _, e, _ in vm.engines()] == ["sregex-vm"], pattern
        perl = _without_vm(rules, "none")
        for size in (len(page), 4096):
            a: list[float] = []
            b: list[float] = []
            for _ in range(args.runs):
                ta, out_vm = _run(vm, page, size)
                tb, out_perl = _run(perl, page, size)
                a.append(ta)
                b.append(tb)
            va, vb = mb / statistics.median(a), mb / statistics.median(b)
            feed = "whole" if size >= len(page) else f"{size // 1024}K"
            print(
                f"{pattern.decode():34} {feed:>6} {va:8.1f} {vb:8.1f} {va / vb:9.2f} "
                f"{'yes' if out_vm == out_perl else 'no':>10}"
            )
    print("a rule set with a flagged rule runs as one VM program (whole page):")
    from bench.realistic import rules as realistic_rules

    base = [compile_rule(r.pattern.encode("latin-1"), r.replacement.encode("latin-1"), r.flags) for r in realistic_rules(10)]
    trim = compile_rule(rb"^[ \t]+|[ \t]+$", b"", "g")
    for label, rules in (("10 realistic rules", base), ("10 realistic + trim", [*base, trim])):
        rs = RuleSet.build(rules, max_buffered_size=10**9)
        times = [_run(rs, page, len(page))[0] for _ in range(args.runs)]
        print(f"  {label:22} {mb / statistics.median(times):7.1f} MB/s")
    print("VM alone on adversarial bodies (finditer to the end):")
    trim = PikePattern(parse_sregex(rb"^\s+|\s+$"))
    for label, unit in (("blank lines 'x  \\n'", b"x  \n"), ("spaces then x", b" ")):
        times = {}
        for size in (1 << 20, 5 << 20):
            body = (unit * (size // len(unit)))[:size] + b"x"
            t0 = time.perf_counter()
            n = sum(1 for _ in trim.finditer(body))
            times[size] = time.perf_counter() - t0
            print(f"  {label:22} {size >> 20} MB: {size / 1e6 / times[size]:7.2f} MB/s, {n} matches")
        print(f"  {label:22} 5 MB / 1 MB time: {times[5 << 20] / times[1 << 20]:.2f}x")


if __name__ == "__main__":
    main()
