"""Multi-pattern prefilters: which rules can match anywhere in a buffer.

With many rules, running every rule's own ``regex`` scan over every buffer
costs time linear in the rule count, though most rules match nowhere.  A
prefilter answers one question for all rules at once: *which rules may have
a match starting at or after ``pos`` in ``buf``*.  The answer may include
rules that do not match (the scanner then finds nothing for them) but never
leaves out one that does; the scanner then runs ``regex`` only for these
rules, so precedence, captures, anchors and ``\\b`` are decided exactly as
before and the output cannot change.

Two engines, chosen with numbers (``bench/bench_transducer.py``):

* :class:`HyperscanFilter` (optional dependency ``hyperscan``): every rule
  that cannot match empty goes into one Hyperscan block-mode database
  (``HS_FLAG_SINGLEMATCH``, ``HS_FLAG_PREFILTER``) as its rare fixed-offset
  head (``word[0-9]`` for ``word[0-9]+token``) or, when the head is too
  common, as the whole rule with its assertions dropped (both match at
  least where the rule does); one scan reports each rule that has some
  match.  Rules Hyperscan refuses are always run.
* :class:`AnchorFilter` (pure ``regex``): each rule gets an *anchor*, one
  of the byte sets at fixed offsets at the start of its matches, chosen so
  that few bytes of a page are anchors and many rules share one (the
  digit after ``about``, ``account``, ... in ``about[0-9]+tok``; the ``x``
  in ``www\\.example\\.com``).  One scan per distinct anchor set finds
  the anchor bytes; a dictionary lookup of the fixed bytes around it (or a
  short head pattern) names the rules that may start there.

Besides which rules, a prefilter says from where each may match (its first
head or anchor), so the rule's own scan starts there.  Rules that can match
empty, and rules whose best anchor is too common to help, are in
``always`` and are run on every buffer.  :data:`ENGINE` is the
default engine (``"hyperscan"`` when the package imports, else
``"anchor"``); :func:`make_filter` builds one.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import regex

from prexy.substitution.analysis import can_match_empty, first_bytes
from prexy.substitution.emit import set_source
from prexy.substitution.syntax import (
    ALL_BYTES,
    Alt,
    Assert,
    Cat,
    Char,
    Group,
    Node,
    ParsedRegex,
    Repeat,
    Set,
)

_hs: Any
try:  # optional: pip install hyperscan (the "fast" extra)
    _hs = importlib.import_module("hyperscan")
except ImportError:  # pragma: no cover - depends on the environment
    _hs = None

__all__ = [
    "ENGINE",
    "ENGINES",
    "HAVE_HYPERSCAN",
    "AnchorFilter",
    "HyperscanDatabase",
    "HyperscanFilter",
    "RuleFilter",
    "head_sets",
    "make_filter",
]

#: Whether the ``hyperscan`` package is importable here.
HAVE_HYPERSCAN = _hs is not None


def hyperscan_module() -> Any:
    """The ``hyperscan`` module, or None where it does not import."""
    return _hs

#: Engines :func:`make_filter` knows, fastest first.
ENGINES = ("hyperscan", "anchor") if HAVE_HYPERSCAN else ("anchor",)

#: The default engine (a module-level switch: tests and benchmarks set it).
ENGINE = ENGINES[0]

FLAGS = regex.DOTALL | regex.MULTILINE

#: Longest run of leading byte sets kept per rule.
MAX_HEAD = 16

#: An anchor whose bytes make up more than this share of typical HTML is
#: not worth scanning for: the rule is run on every buffer instead.
MAX_ANCHOR_COST = 0.08


class RuleFilter(Protocol):
    """Which rules may match in a buffer (a superset, never fewer)."""

    #: Rules that are never filtered out.
    always: frozenset[int]

    def candidates(self, buf: bytes, pos: int, timeout: float | None) -> dict[int, int]:
        """Rules that may have a match starting at or after ``pos``.

        Each maps to a position ``>= pos`` before which it has no match.
        """


def _byte_costs() -> list[float]:
    """Rough share of each byte value in HTML pages, to pick rare anchors."""
    cost = [0.0002] * 256
    for b in range(0x80, 0x100):
        cost[b] = 0.0005
    # English letter frequencies (percent), letters being ~70% of a page.
    letters = (
        "e12.7 t9.1 a8.2 o7.5 i7.0 n6.7 s6.3 h6.1 r6.0 d4.3 l4.0 c2.8 u2.8 m2.4 w2.4 "
        "f2.2 g2.0 y2.0 p1.9 b1.5 v1.0 k0.8 j0.15 x0.15 q0.1 z0.07"
    )
    for item in letters.split():
        c = float(item[1:]) / 100 * 0.7
        cost[ord(item[0])] = c
        cost[ord(item[0].upper())] = c / 10
    for ch in "0123456789":
        cost[ord(ch)] = 0.003
    cost[ord(" ")] = 0.15
    cost[ord("\n")] = 0.02
    cost[ord("\t")] = 0.01
    for ch in '<>/"=':
        cost[ord(ch)] = 0.012
    for ch in ".,-:;'_#&!?()":
        cost[ord(ch)] = 0.005
    return cost


_COST = _byte_costs()


def byte_costs() -> list[float]:
    """Each byte value's rough share of an HTML page (shared, do not modify)."""
    return _COST


def _set_cost(members: frozenset[int]) -> float:
    return sum(_COST[b] for b in members)


def _choose_anchors(
    heads_of: dict[int, list[frozenset[int]]], runs: dict[int, int]
) -> dict[int, int]:
    """Pick each rule's anchor offset so that few bytes of a page are hits.

    Every distinct anchor set is scanned once per buffer, so sets are
    chosen greedily by how many rules they serve per unit of cost: e.g. the
    digit after ``about``, ``account``, ... serves them all in one scan.
    A rule may be anchored within its run or on the set right after it.
    """
    options: dict[int, dict[frozenset[int], int]] = {}
    for rule, heads in heads_of.items():
        opts: dict[frozenset[int], int] = {}
        for i in range(min(runs[rule] + 1, len(heads))):
            opts[heads[i]] = i  # the last offset of a repeated set
        options[rule] = opts
    served: dict[frozenset[int], list[int]] = {}
    left = set(options)
    while left:
        count: dict[frozenset[int], int] = {}
        for rule in left:
            for members in options[rule]:
                count[members] = count.get(members, 0) + 1
        best = max(count, key=lambda m: (count[m] / max(_set_cost(m), 1e-6), -len(m)))
        served[best] = [r for r in left if best in options[r]]
        left.difference_update(served[best])
    # Drop a chosen set whose rules can all use other chosen sets (e.g. a
    # letter picked first for a few rules that the digit set serves too).
    for members in sorted(served, key=_set_cost, reverse=True):
        rules = served[members]
        others = [m for m in served if m != members]
        moves = []
        for rule in rules:
            usable = [m for m in others if m in options[rule]]
            if not usable:
                break
            moves.append((rule, min(usable, key=_set_cost)))
        else:
            del served[members]
            for rule, target in moves:
                served[target].append(rule)
    return {rule: options[rule][m] for m, rules in served.items() for rule in rules}


def _head(node: Node, out: list[frozenset[int]]) -> bool:
    """Append the byte sets at fixed offsets that start every match of ``node``.

    Returns True when all of ``node`` was described (so what follows it is
    at a fixed offset too).  Assertions take no room and are skipped.
    """
    if len(out) >= MAX_HEAD:
        return False
    if isinstance(node, Char):
        out.append(frozenset((node.byte,)))
        return True
    if isinstance(node, Set):
        out.append(node.members)
        return True
    if isinstance(node, Assert):
        return True
    if isinstance(node, Group):
        return _head(node.child, out)
    if isinstance(node, Cat):
        for item in node.items:
            if not _head(item, out):
                return False
        return True
    if isinstance(node, Repeat):
        if node.low == 0:
            return False
        child: list[frozenset[int]] = []
        whole = _head(node.child, child)
        if whole and node.high == node.low and len(child) * node.low <= MAX_HEAD:
            out.extend(child * node.low)
            return len(out) <= MAX_HEAD
        out.extend(child[: MAX_HEAD - len(out)])
        return False
    return False  # Alt: not at fixed offsets


def head_sets(parsed: ParsedRegex) -> list[frozenset[int]]:
    """Byte sets at offsets 0, 1, ... of every non-empty match of the rule.

    Empty when nothing is known (then only ``first_bytes`` holds).
    """
    out: list[frozenset[int]] = []
    _head(parsed.tree, out)
    if not out:
        first = first_bytes(parsed.tree)
        if first:
            out.append(first)
    return out[:MAX_HEAD]


class AnchorFilter:
    """The pure-``regex`` prefilter: rare anchor bytes, then a lookup.

    A rule whose matches start with fixed bytes (its *run*) gets its anchor
    in the run or on the byte set right after it; where the anchor occurs,
    the run is looked up in a dictionary and the next byte checked.  A rule
    without a run is anchored on its first byte set and checked with a
    short head pattern there.
    """

    def __init__(self, parsed: Sequence[ParsedRegex]) -> None:
        always: set[int] = set()
        # anchor set -> (offset, run length) -> run -> [(rule, next set)];
        # and anchor set -> [(head pattern, rule)]
        plan: dict[frozenset[int], dict[tuple[int, int], dict[bytes, list[Any]]]] = {}
        heads_checked: dict[frozenset[int], list[Any]] = {}
        heads_of: dict[int, list[frozenset[int]]] = {}
        runs: dict[int, int] = {}
        for rule, p in enumerate(parsed):
            heads = head_sets(p) if not can_match_empty(p.tree) else []
            run = 0
            while run < len(heads) and len(heads[run]) == 1:
                run += 1
            if not heads:
                always.add(rule)
                continue
            heads_of[rule] = heads
            runs[rule] = run
        for rule, best in _choose_anchors(heads_of, runs).items():
            heads = heads_of[rule]
            run = runs[rule]
            anchor = heads[best]
            if _set_cost(anchor) > MAX_ANCHOR_COST:
                always.add(rule)
                continue
            plan.setdefault(anchor, {})
            if run:
                key = bytes(next(iter(s)) for s in heads[:run])
                after = heads[run] if run < len(heads) else None
                table = plan[anchor].setdefault((best, run), {})
                table.setdefault(key, []).append((rule, after))
            else:
                src = "".join(set_source(s) for s in heads)
                head = regex.compile(src.encode("latin-1"), FLAGS)
                heads_checked.setdefault(anchor, []).append((head, rule))
        self.always = frozenset(always)
        self._groups: list[
            tuple[regex.Pattern[bytes] | bytes, list[Any], list[Any], frozenset[int]]
        ] = []
        for anchor in plan:
            tables = [(o, length, t) for (o, length), t in sorted(plan[anchor].items())]
            checked = heads_checked.get(anchor, [])
            members = {rule for _, _, t in tables for v in t.values() for rule, _ in v}
            members.update(rule for _, rule in checked)
            pattern: regex.Pattern[bytes] | bytes
            if len(anchor) == 1:
                pattern = bytes(anchor)
            else:
                pattern = regex.compile(set_source(anchor).encode("latin-1"), FLAGS)
            self._groups.append((pattern, tables, checked, frozenset(members)))

    def candidates(self, buf: bytes, pos: int, timeout: float | None) -> dict[int, int]:
        """See :meth:`RuleFilter.candidates`.

        A rule's anchor is always at the same offset, and anchors are met
        in ascending order, so its first hit gives where it may start.
        """
        found = dict.fromkeys(self.always, pos)
        n = len(buf)
        for pattern, tables, checked, members in self._groups:
            size = len(members)
            hit: dict[int, int] = {}
            for q in _places(buf, pos, pattern, timeout):
                for offset, length, table in tables:
                    p = q - offset
                    if p < pos:
                        continue
                    end = p + length
                    entries = table.get(buf[p:end])
                    if entries:
                        for rule, after in entries:
                            if after is None or (end < n and buf[end] in after):
                                hit.setdefault(rule, p)
                for head, rule in checked:
                    if rule not in hit and head.match(buf, q, timeout=timeout):
                        hit[rule] = q
                if len(hit) == size:
                    break
            found.update(hit)
        return found


def _places(
    buf: bytes, pos: int, pattern: regex.Pattern[bytes] | bytes, timeout: float | None
) -> Iterator[int]:
    """Where ``pattern`` (a byte class, or one byte as bytes) occurs from ``pos``."""
    if isinstance(pattern, bytes):
        # One byte: memchr is many times faster than a regex scan.
        q = buf.find(pattern, pos)
        while q >= 0:
            yield q
            q = buf.find(pattern, q + 1)
    else:
        for m in pattern.finditer(buf, pos, timeout=timeout):
            yield m.start()


def _hs_source(node: Node, out: list[str]) -> None:
    """Hyperscan syntax for ``node`` without its assertions (more matches)."""
    if isinstance(node, Char):
        out.append(f"\\x{node.byte:02x}")
    elif isinstance(node, Set):
        out.append(set_source(node.members) if node.members != ALL_BYTES else "[\\x00-\\xff]")
    elif isinstance(node, Assert):
        pass
    elif isinstance(node, Group):
        out.append("(?:")
        _hs_source(node.child, out)
        out.append(")")
    elif isinstance(node, Cat):
        out.append("(?:")
        for item in node.items:
            _hs_source(item, out)
        out.append(")")
    elif isinstance(node, Alt):
        out.append("(?:")
        for k, item in enumerate(node.items):
            if k:
                out.append("|")
            _hs_source(item, out)
        out.append(")")
    elif isinstance(node, Repeat):
        out.append("(?:")
        _hs_source(node.child, out)
        out.append(")")
        low, high = node.low, node.high
        out.append(f"{{{low},}}" if high is None else f"{{{low},{high}}}")
    else:  # pragma: no cover - exhaustive
        raise TypeError(node)


def hyperscan_source(parsed: ParsedRegex) -> bytes:
    """The rule as a Hyperscan pattern matching at least what it matches."""
    out: list[str] = []
    _hs_source(parsed.tree, out)
    return "".join(out).encode("latin-1")


#: A rule's fixed-offset head is scanned for instead of the whole rule when
#: it is expected this rarely per byte of a page (see :func:`_hs_pattern`).
HEAD_SELECTIVITY = 1e-4


def _hs_pattern(parsed: ParsedRegex) -> tuple[bytes, int | None]:
    """What Hyperscan looks for to know that a rule may match.

    The bytes at fixed offsets that start every match (``word[0-9]``
    for ``word[0-9]+token``) when they are rare enough: a fixed-length
    pattern scans several times faster than the whole rule (1000 rules:
    ~1.9 GB/s against ~230 MB/s) and compiles faster, for a few more
    candidates.  Otherwise the whole rule, assertions dropped.  Returns the
    pattern and the head's length (None for the whole rule).
    """
    heads = head_sets(parsed)
    chance = 1.0
    for members in heads:
        chance *= min(1.0, _set_cost(members))
    if heads and chance <= HEAD_SELECTIVITY:
        source = "".join(set_source(m) if m != ALL_BYTES else "[\\x00-\\xff]" for m in heads)
        return source.encode("latin-1"), len(heads)
    return hyperscan_source(parsed), None


class HyperscanDatabase:
    """One compiled block-mode Hyperscan database, with per-pattern facts.

    ``facts[i]`` is what the caller needs of pattern ``i``; its first item
    is the rule.  Patterns Hyperscan refuses are left out and their rules
    listed in ``refused`` (every pattern of such a rule is left out).  Safe
    to share between threads: each thread scans with its own scratch.
    """

    def __init__(
        self,
        exprs: list[bytes],
        facts: list[Any],
        flags: int | list[int],
        strict: bool = False,
        lazy: bool = False,
    ) -> None:
        """``strict``: raise Hyperscan's error when the patterns do not
        compile together, instead of leaving out those it refuses.
        ``lazy``: compile only when :meth:`compile` is called (a caller
        that may compile the patterns with others instead); until then
        ``db`` is None and ``exprs``, ``facts``, ``flags`` are all given."""
        if isinstance(flags, int):
            flags = [flags] * len(exprs)
        #: Per pattern id: what the caller needs (the rule first).
        self.facts: list[Any] = list(facts)
        #: The patterns compiled (or to compile), and their flags.
        self.exprs = list(exprs)
        self.flags = list(flags)
        self.refused: set[int] = set()  # rules of patterns Hyperscan refused
        self.db: Any = None
        self._local = threading.local()
        self._pending = True
        if not lazy:
            self.compile(strict)

    def compile(self, strict: bool = False) -> None:
        """Compile the patterns (once; see ``lazy``)."""
        if not self._pending:
            return
        self._pending = False
        exprs, facts, flags = self.exprs, self.facts, self.flags
        good = list(range(len(exprs)))
        if exprs:
            try:
                self.db = self._compile(exprs, flags)
            except _hs.error:
                if strict:
                    raise
                good = []
                for i, expr in enumerate(exprs):
                    try:
                        self._compile([expr], [flags[i]])
                    except _hs.error:
                        self.refused.add(facts[i][0])
                    else:
                        good.append(i)
                good = [i for i in good if facts[i][0] not in self.refused]
                self.db = self._compile([exprs[i] for i in good], [flags[i] for i in good]) if good else None
        self.facts = [facts[i] for i in good]
        self.exprs = [exprs[i] for i in good]
        self.flags = [flags[i] for i in good]
        if self.db is not None:
            self._local.scratch = _hs.Scratch(self.db)

    @staticmethod
    def _compile(exprs: list[bytes], flags: list[int]) -> Any:
        db = _hs.Database(mode=_hs.HS_MODE_BLOCK)
        db.compile(expressions=exprs, ids=list(range(len(exprs))), elements=len(exprs), flags=flags)
        return db

    def release(self) -> None:
        """Drop the compiled database, or never compile it (its patterns
        now scan as part of another one): ``db`` stays None."""
        self._pending = False
        self.db = None
        self._local = threading.local()

    def scan(self, data: bytes, handler: Any) -> None:
        """Scan ``data``, calling ``handler(id, from, to, flags, context)`` per match."""
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:  # scratch space is per thread
            scratch = self._local.scratch = _hs.Scratch(self.db)
        self.db.scan(data, match_event_handler=handler, scratch=scratch)



class HyperscanFilter:
    """The Hyperscan prefilter: one block-mode scan reports the rules present.

    Each rule is looked for as its head or as a whole (:func:`_hs_pattern`).
    A whole rule is reported once; a head (rare by choice) at each
    occurrence, so that the last one bounds where the rule may start.
    Safe to share between threads (each thread scans with its own scratch).
    """

    def __init__(self, parsed: Sequence[ParsedRegex], lazy: bool = False) -> None:
        """``lazy``: compile only on :meth:`settle` (see
        ``HyperscanDatabase``'s ``lazy``)."""
        if _hs is None:
            raise RuntimeError("the hyperscan package is not installed")
        always = {rule for rule, p in enumerate(parsed) if can_match_empty(p.tree)}
        ids = [rule for rule in range(len(parsed)) if rule not in always]
        exprs: list[bytes] = []
        #: Per pattern: (rule, the head's length or None for the whole rule).
        facts: list[tuple[int, int | None]] = []
        #: Per rule looked for by its head: the head's byte sets.  Where the
        #: scan reports none of its occurrences, a match of the rule can
        #: only begin where the end of the buffer cuts the head.
        self.heads: dict[int, tuple[frozenset[int], ...]] = {}
        for rule in ids:
            source, length = _hs_pattern(parsed[rule])
            exprs.append(source)
            facts.append((rule, length))
            if length is not None:
                self.heads[rule] = tuple(head_sets(parsed[rule]))
        flags = _hs.HS_FLAG_DOTALL | _hs.HS_FLAG_PREFILTER
        self._db = HyperscanDatabase(
            exprs, facts, [flags | (_hs.HS_FLAG_SINGLEMATCH if length is None else 0) for _, length in facts],
            lazy=True,
        )
        #: The patterns, for a scan shared with other patterns
        #: (``MatchIndex``): see :meth:`spans` for their reports.
        self.db = self._db
        # Rules whose pattern Hyperscan refuses always run.
        self.always = frozenset(always)
        self._always = always
        if not lazy:
            self.settle()

    def settle(self) -> None:
        """Compile the patterns (once), leaving out the rules Hyperscan
        refuses: they always run."""
        self._db.compile()
        self.always = frozenset(self._always | self._db.refused)
        for rule in self._db.refused:
            self.heads.pop(rule, None)

    def candidates(self, buf: bytes, pos: int, timeout: float | None) -> dict[int, int]:
        """See :meth:`RuleFilter.candidates` (Hyperscan scans in linear time).

        Hyperscan reports a rule's first match end; for a rule looked for
        by its fixed-length head, its first possible start is that end
        minus the head's length (``pos`` otherwise).
        """
        return {rule: first for rule, (first, _last) in self.spans(buf, pos).items()}

    def spans(self, buf: bytes, pos: int) -> dict[int, tuple[int, int]]:
        """Rules that may have a match starting at or after ``pos``, each
        with (a position ``>= pos`` before which it has no match, one after
        which none starts).  (Measured on the realistic 100-rule set, 20 KB
        page: the rules' own scans after their last possible start took
        about 20 us per page: ``<title>`` from its one match to the end.)"""
        n = len(buf)
        found = dict.fromkeys(self.always, (pos, n))
        if self._db.db is None or pos >= n:
            return found
        facts = self._db.facts

        def on_match(i: int, start: int, end: int, flags: int, context: object) -> None:
            rule, length = facts[i]
            if length is None:
                found[rule] = (pos, n)
                return
            at = pos + max(0, end - length)
            had = found.get(rule)
            found[rule] = (at, at) if had is None else (had[0], at)

        self._db.scan(buf[pos:] if pos else buf, on_match)
        return found


def make_filter(parsed: Sequence[ParsedRegex], engine: str | None = None) -> RuleFilter:
    """A prefilter over ``parsed`` with ``engine`` (default :data:`ENGINE`)."""
    name = ENGINE if engine is None else engine
    if name == "hyperscan":
        return HyperscanFilter(parsed)
    if name == "anchor":
        return AnchorFilter(parsed)
    raise ValueError(f"unknown prefilter engine {name!r}")
