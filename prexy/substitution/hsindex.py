"""Where every rule matches, for all rules in one pass: a Hyperscan index.

With many rules, asking each rule's own ``regex`` pattern where it matches
costs time per rule for every buffer, and a clone's rules really match
(its host names are everywhere), so a prefilter that only says *which*
rules may match does not save that cost.  A :class:`MatchIndex` answers
*where* for the *exact* rules, in one pass whose cost does not grow with
their number: rules without assertions in which every start has at most
one match end (a fixed width, or a short finite expansion such as
``(https?://)host`` where no alternative is a prefix or a suffix of another
of another width).  Most of a clone's rules are of this kind.

* Exact rules that are literal bytes (letters of both cases allowed) are
  looked for whole when the rule set has few such keys (:data:`WHOLE_KEYS`):
  every report is a match.  With more, each is looked for by the 8-byte
  window of it that the fewest of them share (:data:`WINDOW`), one
  Hyperscan pattern per window, and the bytes around a hit are compared
  with the key: here, or for a window of one key by the scan when it gets
  there (a report to confirm, :data:`Report`).
* Other exact rules are scanned as one Hyperscan pattern per width,
  without start-of-match tracking: a report ending at ``e`` is the match
  ``[e - width, e)``.
* The remaining rules (``others``) go through the Hyperscan prefilter of
  :mod:`.prefilter`, which says which of them may match and from where;
  their own ``regex`` scans then run.  (Start-of-match tracking for them
  in Hyperscan measured several times slower on rules like
  ``word[0-9]+token``: 34 against 150 MB/s at 100 rules.)

The hold-back question (from where could a rule still match differently
if more bytes came) is answered for the bounded-width rules by a trie of
their expansions over the buffer's last bytes (:class:`TailTrie`); the
rule's probe, or for an exact rule its byte-set sequences, then decide
(:mod:`.scanner`); unbounded rules keep the rule-by-rule hold cursor.

Pure: imports no Twisted; Hyperscan is a dependency on x86_64, and
:data:`AVAILABLE` says whether it imports here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import regex

from prexy.substitution import prefilter as prefilter_module
from prexy.substitution.analysis import can_match_empty, max_width, min_width
from prexy.substitution.emit import FLAGS, set_source
from prexy.substitution.prefilter import (
    HyperscanDatabase,
    HyperscanFilter,
    head_sets,
    hyperscan_source,
)
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

_hs: Any = prefilter_module.hyperscan_module()

__all__ = ["AVAILABLE", "Events", "MatchIndex", "TailTrie", "WINDOW", "exact_widths", "expand", "literal_keys"]

#: Whether the ``hyperscan`` package is importable here.
AVAILABLE = _hs is not None

#: Longest finite expansion of a rule checked for exactness.
MAX_ALTERNATIVES = 16

_Seq = tuple[frozenset[int], ...]

#: One shared frozenset per byte: a rule set's expansions hold one per
#: literal byte, and thousands of sets per worker made a fresh
#: one each time (67 of the 247 KB a 20-rule clone set took compiled).
_BYTE = tuple(frozenset((b,)) for b in range(256))


def _expand(node: Node, limit: int, relaxed: bool = False) -> list[_Seq] | None:
    """The rule as a finite list of byte-set sequences, or None (assertion,
    unbounded repeat, or more than ``limit`` alternatives); ``relaxed``:
    assertions match empty."""
    if isinstance(node, Assert) and relaxed:
        return [()]
    if isinstance(node, Char):
        return [(_BYTE[node.byte],)]
    if isinstance(node, Set):
        return [(node.members,)]
    if isinstance(node, Assert):
        return None
    if isinstance(node, Group):
        return _expand(node.child, limit, relaxed)
    if isinstance(node, Cat):
        out: list[_Seq] = [()]
        for item in node.items:
            alts = _expand(item, limit, relaxed)
            if alts is None or len(out) * len(alts) > limit:
                return None
            out = [a + b for a in out for b in alts]
        return out
    if isinstance(node, Alt):
        out = []
        for item in node.items:
            alts = _expand(item, limit, relaxed)
            if alts is None:
                return None
            out.extend(alts)
            if len(out) > limit:
                return None
        return out
    if isinstance(node, Repeat):
        if node.high is None or node.high - node.low + 1 > limit:
            return None
        child = _expand(node.child, limit, relaxed)
        if child is None:
            return None
        if len(child) == 1:  # a fixed piece repeated: one sequence per count
            return [child[0] * k for k in range(node.low, node.high + 1)]
        out = []
        for k in range(node.low, node.high + 1):
            seqs: list[_Seq] = [()]
            for _ in range(k):
                seqs = [a + b for a in seqs for b in child]
                if len(seqs) > limit:
                    return None
            out.extend(seqs)
            if len(out) > limit:
                return None
        return out
    raise TypeError(node)  # pragma: no cover


def expand(node: Node) -> list[_Seq] | None:
    """The rule's matches as at most :data:`MAX_ALTERNATIVES` byte-set
    sequences, or None (see :func:`exact_widths`)."""
    return _expand(node, MAX_ALTERNATIVES)


def _overlaps(short: _Seq, long: _Seq, at: int) -> bool:
    """Whether some string of ``short`` equals the part of some string of
    ``long`` that starts at offset ``at``."""
    return all(a & b for a, b in zip(short, long[at : at + len(short)], strict=True))


def _has_assert(node: Node) -> bool:
    if isinstance(node, Assert):
        return True
    if isinstance(node, Group):
        return _has_assert(node.child)
    if isinstance(node, Repeat):
        return _has_assert(node.child)
    if isinstance(node, (Cat, Alt)):
        return any(_has_assert(i) for i in node.items)
    return False


def exact_widths(parsed: ParsedRegex) -> dict[int, list[_Seq] | None] | None:
    """When every start of the rule has at most one match end, the widths
    of its matches (each with its alternatives, or None for "the whole
    rule": a fixed width); otherwise None.

    A rule without assertions has that property when all its matches have
    one width, or when it is a short finite set of byte-set sequences in
    which no sequence can be a proper prefix of another (two ends for one
    start) nor a proper suffix of another (two starts for one end, which a
    scan without start tracking could not tell apart).
    """
    tree = parsed.tree
    if _has_assert(tree):
        return None
    width = max_width(tree)
    if width is not None and width > 0 and width == min_width(tree):
        return {width: None}
    alts = _expand(tree, MAX_ALTERNATIVES)
    if not alts or any(not a for a in alts):
        return None
    for a in alts:
        for b in alts:
            if len(a) < len(b) and (_overlaps(a, b, 0) or _overlaps(a, b, len(b) - len(a))):
                return None
    by_width: dict[int, list[_Seq] | None] = {}
    for a in alts:
        seqs = by_width.setdefault(len(a), [])
        assert seqs is not None
        if a not in seqs:
            seqs.append(a)
    return by_width


def _seq_source(seq: _Seq) -> str:
    return "".join(set_source(m) if m != ALL_BYTES else "[\\x00-\\xff]" for m in seq)


def _pc(node: Node) -> str | None:
    """Hyperscan syntax for every non-empty prefix of ``node``'s matches
    (whole matches included), assertions dropped; None when there is none.
    (Hyperscan tracks the start of a match only for patterns that cannot
    match empty.)"""
    if isinstance(node, (Char, Set)):
        return _atom(node)
    if isinstance(node, Assert):
        return None
    if isinstance(node, Group):
        return _pc(node.child)
    if isinstance(node, Cat):
        # prefixes(a rest) = prefixes(a) | a prefixes(rest)
        items = [i for i in node.items if not isinstance(i, Assert)]
        if not items:
            return None
        tail = _pc(items[-1])
        for item in reversed(items[:-1]):
            if tail is not None and isinstance(item, (Char, Set)):
                tail = f"{_atom(item)}(?:{tail})?"  # the same prefixes, a smaller automaton
                continue
            head = _pc(item)
            after = None if tail is None else f"{_whole(item)}(?:{tail})"
            parts = [x for x in (head, after) if x is not None]
            tail = None if not parts else "(?:" + "|".join(parts) + ")"
        return tail
    if isinstance(node, Alt):
        parts = [x for x in (_pc(i) for i in node.items) if x is not None]
        return None if not parts else "(?:" + "|".join(parts) + ")"
    if isinstance(node, Repeat):
        inner = _pc(node.child)
        if node.high == 0 or inner is None:
            return None
        if node.high == 1:
            return inner
        reps = "*" if node.high is None else f"{{0,{node.high - 1}}}"
        return f"(?:{_whole(node.child)}){reps}(?:{inner})"
    raise TypeError(node)  # pragma: no cover - exhaustive


def _atom(node: Char | Set) -> str:
    if isinstance(node, Char):
        return f"\\x{node.byte:02x}"
    return set_source(node.members) if node.members != ALL_BYTES else "[\\x00-\\xff]"


def _whole(node: Node) -> str:
    return "(?:" + hyperscan_source(ParsedRegex(node, 0, False)).decode("latin-1") + ")"


def _cut_pattern(heads: Sequence[frozenset[int]]) -> regex.Pattern[bytes] | None:
    """A ``regex`` pattern for the proper non-empty prefixes of ``heads``
    (byte sets) that end at the end of the buffer; None when there are none."""
    if len(heads) < 2:
        return None
    src = set_source(heads[-2])
    for members in reversed(heads[:-2]):
        src = f"{set_source(members)}(?:{src})?"
    return regex.compile(f"(?:{src})\\z".encode("latin-1"), FLAGS)


def prefix_source(parsed: ParsedRegex) -> bytes | None:
    """Hyperscan syntax matching, at the end of a buffer, from every place
    where one of the rule's paths (assertions dropped) is still alive; None
    when the rule is nothing but assertions."""
    body = _pc(parsed.tree)
    if body is None:
        return None
    return ("(?:" + body + ")\\z").encode("latin-1")


#: One report of an exact rule: (start, rule, end, check).  ``check`` 0:
#: a match; otherwise a literal key's window was seen there, and the report
#: is a match when :meth:`MatchIndex.confirm` says so.
Report = tuple[int, int, int, int]


class Events:
    """One buffer's reports: every match of the exact rules (with window
    hits still to confirm), and for the others the prefilter's candidates."""

    __slots__ = ("exact", "candidates", "lasts")

    def __init__(self, exact: list[Report], candidates: dict[int, int], lasts: dict[int, int]) -> None:
        #: Every match of every exact rule, sorted, as :data:`Report`; the
        #: reports to confirm include every match of their rules.
        self.exact = exact
        #: Other rules that may match from the scan position: rule -> a
        #: position before which it has no match.
        self.candidates = candidates
        #: Per candidate: a position after which it has no match starting.
        self.lasts = lasts


def _key(members: frozenset[int]) -> int | None:
    """The trie key of one byte set: the byte, or the lower-case letter of
    a case pair; None for a larger set."""
    if len(members) == 1:
        (b,) = members
        return b | 0x20 if 0x41 <= b <= 0x5A else b
    if len(members) == 2:
        lo = min(members)
        if 0x41 <= lo <= 0x5A and members == {lo, lo | 0x20}:
            return lo | 0x20
    return None


_LOWER = bytes(b | 0x20 if 0x41 <= b <= 0x5A else b for b in range(256))


class TailTrie:
    """Where the bounded-width rules may still be matching at a buffer's end.

    Each rule's matches as byte sequences (its finite expansion with
    assertions dropped, or else its fixed leading sets), letters folded,
    form a trie.  A rule's path may be alive at the end from position i
    when the bytes from i to the end are a path of the trie above one of
    the rule's sequences (every path is a key of one dictionary, so each
    suffix of the buffer's last bytes costs one lookup), or when, from i,
    the bytes follow the trie to a node where the rule goes on with a
    larger byte set (found with ``bytes.find`` of that node's path).  Both
    are lower bounds: the rule's probe decides.  (Hyperscan took 3.2 s to
    compile the same question, anchored, for 1000 rules.)
    """

    def __init__(self, rules: dict[int, ParsedRegex]) -> None:
        children: list[dict[int, int]] = [{}]
        paths: list[bytes] = [b""]
        below: list[set[int]] = [set()]
        opened: list[set[int]] = [set()]
        self.width = 0
        for rule, p in rules.items():
            w = max_width(p.tree)
            assert w is not None
            self.width = max(self.width, w)
            seqs = _expand(p.tree, MAX_ALTERNATIVES, relaxed=True)
            open_end = False
            if seqs is None:
                seqs = [tuple(head_sets(p))]
                open_end = True
            for seq in seqs:
                node = 0
                below[0].add(rule)
                for members in seq:
                    key = _key(members)
                    if key is None:
                        opened[node].add(rule)
                        break
                    nxt = children[node].get(key)
                    if nxt is None:
                        nxt = children[node][key] = len(children)
                        children.append({})
                        paths.append(paths[node] + bytes((key,)))
                        below.append(set())
                        opened.append(set())
                    node = nxt
                    below[node].add(rule)
                else:
                    if open_end:
                        opened[node].add(rule)
        #: Per node: rules below it, and rules that go on with a larger set.
        self.below = [sorted(r) for r in below]
        self.opened = [sorted(r) for r in opened]
        #: Every path of the trie (folded bytes) -> its node.
        self._nodes = {path: node for node, path in enumerate(paths) if node}
        self._depth = max(map(len, paths))
        #: A translation marking with 1 the (folded) bytes that begin a path.
        self._firsts = bytes(1 if bytes((b,)) in self._nodes else 0 for b in range(256))
        #: (path, node) of the nodes where some rule goes on with a larger set.
        self._open = [(paths[node], node) for node, rules in enumerate(self.opened) if rules]
        # With many paths, Hyperscan finds where their first three bytes are.
        self._heads: HyperscanDatabase | None = None
        heads = sorted({p[:3] for p in self._nodes if len(p) >= 3})
        if _hs is not None and heads and len(self._nodes) >= PREFIX_SCAN_MIN:
            self._heads = HyperscanDatabase([_hex(h) for h in heads], [(0,)] * len(heads), 0)

    def places(self, buf: bytes, pos: int) -> list[tuple[int, int, bool]]:
        """(position, node, reached the end) for each trie node that names
        rules possibly alive at the end of ``buf`` from that position, at
        the node's leftmost such position."""
        n = len(buf)
        lo = max(pos, n - self.width)
        tail = buf[lo:].translate(_LOWER)
        m = len(tail)
        out: list[tuple[int, int, bool]] = []
        nodes = self._nodes
        # Only where a path can begin: one lookup per such byte, not per
        # suffix (realistic sets, the jQuery page in 1 KiB feeds: 10 rules
        # 5.46 -> 4.84 ms, 1000 rules 9.99 -> 9.61 ms; a 1 KiB feed's tail
        # has 29 or 44 suffixes, of which 2 or 24 begin with such a byte).
        first = max(0, m - self._depth)
        if self._heads is not None and self._heads.db is not None:
            starts: list[int] = []
            push = starts.append
            self._heads.scan(tail[first:] if first else tail, lambda _i, _s, e, _f, _c: push(first + e - 3))
            starts.extend(j for j in (m - 2, m - 1) if j >= first)
            for j in starts:
                node = nodes.get(tail[j:])
                if node is not None:
                    out.append((lo + j, node, True))
        else:
            marks = tail.translate(self._firsts)
            j = marks.find(1, first)
            while j >= 0:
                node = nodes.get(tail[j:])
                if node is not None:
                    out.append((lo + j, node, True))
                j = marks.find(1, j + 1)
        for path, node in self._open:
            i = tail.find(path) if path else 0
            if i >= 0:
                out.append((lo + i, node, False))
        return out


#: From this many trie paths on, the tail trie's places are found with a
#: Hyperscan scan for the paths' first three bytes (then one lookup per
#: place) instead of a lookup per byte that begins a path (more than half
#: of the bytes with 1000 rules).  Measured, realistic sets in 1 KiB feeds,
#: first bytes -> Hyperscan: 10 rules (204 paths) 0.41 -> 0.44 ms on the
#: 20 KB page; 100 rules (2242) 0.78 -> 0.73 ms; 1000 rules (17466) 1.02
#: -> 0.93 ms, jQuery 10.2 -> 9.95 ms (p10 9.9 -> 8.8).
PREFIX_SCAN_MIN = 2000


#: At most this many unbounded rules are bounded by one Hyperscan scan
#: (MatchIndex.alive); more keep the rule-by-rule hold cursor.  Measured:
#: the 3 unbounded rules of the realistic sets, 1 KiB feeds of the 1 MB
#: page, 50 ms this way against 172 ms rule by rule; the 8 ``word[0-9]+``
#: rules of the synthetic 10-rule set, 20 KB page, 250 us against 150.
LONG_MAX = 4

#: Bytes of a literal rule that Hyperscan looks for: the window of this many
#: bytes that the fewest of the rule set's literals share (see MatchIndex).
WINDOW = 8


def literal_keys(seqs: list[_Seq]) -> list[tuple[bytes, bool]] | None:
    """The sequences as (bytes, caseless) when each is literal bytes, or
    literal bytes whose letters all match either case (then the bytes are
    lower case); None otherwise."""
    out: list[tuple[bytes, bool]] = []
    for seq in seqs:
        if all(len(m) == 1 for m in seq):
            key = (bytes(next(iter(m)) for m in seq), False)
        else:
            folded = bytearray()
            for m in seq:
                k = _key(m)
                if k is None or (len(m) == 1 and 0x61 <= (k | 0x20) <= 0x7A):
                    return None  # a larger set, or a letter of one case among folded ones
                folded.append(k)
            key = (bytes(folded), True)
        if key not in out:
            out.append(key)
    return out


def _windows(keys: list[bytes]) -> list[int]:
    """Per key, the offset of its WINDOW bytes (case folded) that the fewest
    keys also have: host names share their base domain and scheme, so a
    literal matcher that looked for those would confirm hundreds of keys
    at every occurrence (Hyperscan took 150-240 us per 20 KB page with
    786 such literals, 9 us with 100)."""
    counts: dict[bytes, int] = {}
    for key in keys:
        low = key.translate(_LOWER)
        for at in {low[i : i + WINDOW] for i in range(max(1, len(low) - WINDOW + 1))}:
            counts[at] = counts.get(at, 0) + 1
    out = []
    for key in keys:
        low = key.translate(_LOWER)
        offsets = range(max(1, len(low) - WINDOW + 1))
        out.append(min(offsets, key=lambda i: (counts[low[i : i + WINDOW]], -i)))
    return out


def _hex(key: bytes) -> bytes:
    return "".join(f"\\x{b:02x}" for b in key).encode("latin-1")


#: From a scan position up to this, the literal scan covers the whole buffer
#: and drops the reports before the position (see MatchIndex._literal_handler).
WHOLE_SCAN_POS = 64

#: Literal keys Hyperscan looks for whole (each report a match, nothing to
#: compare here) when the rule set has at most this many; more go by their
#: windows (see _windows).  Measured on the realistic sets, 20 KB page, the
#: literal scan with its callback (events), windows -> whole keys: 10 rules
#: (11 keys) 41 -> 26 us, 100 rules (114 keys) 95 -> 72 us, 200 rules (238)
#: 104 -> 88 us, 300 rules (362) 155 -> 150 us, 500 rules (609) 130 -> 147
#: us, 1000 rules (1202) 152 -> 208 us: with hundreds of keys sharing their
#: last bytes (a base domain) Hyperscan's own scan grows (1202 keys: 129 us
#: on a page where none occurs, 23 us by windows).  Keys of at most WINDOW
#: bytes are their own window and always whole.
WHOLE_KEYS = 256


def _whole_keys(keys: list[bytes]) -> list[bool]:
    """Per key: whether Hyperscan looks for it whole (else by its window)."""
    every = len(keys) <= WHOLE_KEYS
    return [every or len(k) <= WINDOW for k in keys]


class MatchIndex:
    """All rules' Hyperscan databases, compiled once per rule set."""

    def __init__(
        self,
        parsed: Sequence[ParsedRegex],
        widths: Sequence[dict[int, list[_Seq] | None] | None] | None = None,
    ) -> None:
        """``widths``: each rule's :func:`exact_widths`, when known already."""
        if _hs is None:
            raise RuntimeError("the hyperscan package is not installed")
        exact_exprs: list[bytes] = []
        exact_facts: list[tuple[int, int]] = []
        others: list[int] = []
        short: dict[int, ParsedRegex] = {}
        literals: list[tuple[int, bytes, bool]] = []
        for rule, p in enumerate(parsed):
            empty = can_match_empty(p.tree)
            if not empty and max_width(p.tree) is not None:
                short[rule] = p
            exact = None if empty else (exact_widths(p) if widths is None else widths[rule])
            if exact is None:
                others.append(rule)
                continue
            seqs = expand(p.tree)
            keys = literal_keys(seqs) if seqs is not None else None
            if keys is not None:
                literals.extend((rule, key, caseless) for key, caseless in keys)
                continue
            for width, alts in exact.items():
                src = hyperscan_source(p) if alts is None else "|".join(
                    _seq_source(a) for a in alts
                ).encode("latin-1")
                exact_exprs.append(src)
                exact_facts.append((rule, width))
        flags = _hs.HS_FLAG_DOTALL
        self._exact = HyperscanDatabase(exact_exprs, exact_facts, flags)
        others.extend(self._exact.refused)
        # Literal rules: a key Hyperscan looks for whole (see WHOLE_KEYS) is
        # its own pattern, one per (rule, key), so that each report is a
        # match; the others are found by their rarest window, one pattern
        # per distinct window, and the key around it is compared here.
        whole = _whole_keys([k for _, k, _ in literals])
        lit_exprs: list[bytes] = []
        lit_flags: list[int] = []
        sure: list[tuple[int, int]] = []
        for (rule, key, caseless), is_whole in zip(literals, whole, strict=True):
            if is_whole:
                lit_exprs.append(_hex(key))
                lit_flags.append(flags | (_hs.HS_FLAG_CASELESS if caseless else 0))
                sure.append((rule, len(key)))
        rest = [lit for lit, is_whole in zip(literals, whole, strict=True) if not is_whole]
        windows: dict[tuple[bytes, bool], int] = {}
        window_facts: list[list[tuple[int, int, bytes, bool]]] = []
        #: Per check number (see Report): the key and whether it is caseless.
        self.checks: list[tuple[bytes, bool]] = [(b"", False)]
        reports: list[list[tuple[int, int, int, int]]] = []
        for (rule, key, caseless), at in zip(rest, _windows([k for _, k, _ in rest]), strict=True):
            part = key[at : at + WINDOW]
            i = windows.get((part, caseless))
            if i is None:
                i = windows[(part, caseless)] = len(window_facts)
                lit_exprs.append(_hex(part))
                lit_flags.append(flags | (_hs.HS_FLAG_CASELESS if caseless else 0))
                window_facts.append([])
                reports.append([])
            window_facts[i].append((rule, len(part) + at, key, caseless))
            reports[i].append((len(part) + at, rule, len(key), len(self.checks)))
            self.checks.append((key, caseless))
        lit_facts: list[Any] = [*sure, *((f[0][0], f) for f in window_facts)]
        self._window = HyperscanDatabase(lit_exprs, lit_facts, lit_flags, lazy=True)
        #: Pattern ids below this are whole keys (their rule and length).
        self._sure_count = len(sure)
        self._sure_rules = tuple(rule for rule, _ in sure)
        self._sure_lengths = tuple(length for _, length in sure)
        #: Per pattern id from _sure_count on: (rule, reach from the key's
        #: start to the window's end, key, caseless) of the keys around it.
        self._window_facts: list[list[tuple[int, int, bytes, bool]] | None] = [
            *(None for _ in sure), *window_facts
        ]
        #: Per pattern id: (reach from the key's start to the report's end,
        #: rule, key length, check) of each key reported there.
        self._reports: list[tuple[tuple[int, int, int, int], ...]] = [
            *(((length, rule, length, 0),) for rule, length in sure), *map(tuple, reports)
        ]
        #: Per window pattern id: its report when it is one key's window.
        self._one = [r[0] if i >= len(sure) and len(r) == 1 else None for i, r in enumerate(self._reports)]
        self._exact_facts = self._exact.facts
        #: Rules the index does not report, in order: they are found with the
        #: prefilter and their own scans (``others``, global indexes).
        self.others = tuple(sorted(set(others)))
        self._filter: HyperscanFilter | None = None
        if self.others:
            self._filter = HyperscanFilter([parsed[r] for r in self.others], lazy=True)
        self._united: HyperscanDatabase | None = None
        self._unite()
        if self._window.refused:  # pragma: no cover - plain bytes always compile
            raise RuntimeError(f"Hyperscan refused literal windows of rules {sorted(self._window.refused)}")
        #: The bounded-width rules' hold-back question.
        self.tail = TailTrie(short)
        # Unbounded rules that cannot match empty: when they are few
        # (LONG_MAX), one start-of-match scan of their prefix closures
        # anchored at the end says where each may still be alive; otherwise
        # they keep the rule-by-rule cursor.
        long_rules = [r for r in range(len(parsed)) if r not in short and not can_match_empty(parsed[r].tree)]
        self._long: HyperscanDatabase | None = None
        if 0 < len(long_rules) <= LONG_MAX:
            exprs: list[bytes] = []
            facts: list[tuple[int, int]] = []
            for r in long_rules:
                pc = prefix_source(parsed[r])
                if pc is not None:  # (None: nothing but assertions; every path is at the end)
                    exprs.append(pc)
                    facts.append((r, -1))
            self._long = HyperscanDatabase(exprs, facts, flags | _hs.HS_FLAG_SOM_LEFTMOST)
            bounded = set(long_rules) - self._long.refused
        else:
            bounded = set()
        #: The rules that scan bounds.
        self.long_rules = tuple(sorted(bounded))
        #: Rules neither the trie nor that scan bound (the rule-by-rule cursor's).
        self.unbounded = tuple(r for r in range(len(parsed)) if r not in short and r not in bounded)
        self.unbounded_set = frozenset(self.unbounded)
        #: Rules that may start a match at the very end of a buffer, first.
        self.bounded_rules = tuple(r for r in range(len(parsed)) if r not in self.unbounded_set)
        #: Per unbounded rule (or rule of the scan above) that the prefilter
        #: looks for by its head (see :meth:`begun`): the head's length, and
        #: a pattern that finds where the end of a buffer cuts the head (None
        #: for a one-byte head), and the head's first byte when it is one
        #: (looked for first: most buffers do not end near it).
        self._cut_heads: dict[int, tuple[int, regex.Pattern[bytes] | None, bytes | None]] = {}
        if self._filter is not None:
            for local, heads in self._filter.heads.items():
                rule = self.others[local]
                if rule in self.unbounded_set or rule in bounded:
                    first = bytes(heads[0]) if len(heads[0]) == 1 else None
                    self._cut_heads[rule] = (len(heads), _cut_pattern(heads), first)
        # All those patterns as one alternation, and the longest head: most
        # buffers end in no head, which one search says (see begun).
        cuts = [(length, p) for length, p, _ in self._cut_heads.values() if p is not None]
        self._any_cut: regex.Pattern[bytes] | None = None
        self._cut_longest = max((length for length, _ in cuts), default=0)
        if cuts:
            self._any_cut = regex.compile(b"|".join(p.pattern for _, p in cuts), FLAGS)

    def _unite(self) -> None:
        """Compile the literal windows', the exact rules' and the
        prefilter's patterns as one database (:meth:`events`' one scan);
        the windows and the prefilter are then never compiled apart.
        Apart when there are not two parts to unite, or when Hyperscan
        does not compile them together (then each part leaves out what it
        refuses).  (The exact rules compile first, alone: a rule Hyperscan
        refuses there goes to the prefilter.)"""
        parts = [self._window, self._exact]
        filt = self._filter.db if self._filter is not None else None
        if filt is not None:
            parts.append(filt)
        if sum(1 for d in parts if d.exprs) >= 2:
            exprs = [e for d in parts for e in d.exprs]
            flags = [f for d in parts for f in d.flags]
            try:
                self._united = HyperscanDatabase(exprs, [(0,)] * len(exprs), flags, strict=True)
            except _hs.error:
                self._united = None
        if self._united is None:
            self._window.compile()
            if self._filter is not None:
                self._filter.settle()
            return
        #: Pattern ids of the one scan: the windows' from 0, the exact
        #: rules' from _at_exact, the prefilter's from _at_filter.
        self._at_exact = len(self._window.exprs)
        self._at_filter = self._at_exact + len(self._exact.exprs)
        others = self.others
        #: Per prefilter pattern: (rule, its head's length or None).
        self._filter_facts: list[tuple[int, int | None]] = (
            [(others[local], length) for local, length in filt.facts] if filt is not None else []
        )
        #: Rules the prefilter always reports (global indexes).
        self._always = tuple(others[local] for local in self._filter.always) if self._filter is not None else ()
        for d in parts:
            d.release()

    def events(self, buf: bytes, pos: int, active: Sequence[bool] | None) -> Events:
        """The reports of ``buf[pos:]`` for the rules marked in ``active``
        (None: all rules)."""
        if self._united is not None:
            return self._events_united(buf, pos, active)
        return self._events_apart(buf, pos, active)

    def _events_united(self, buf: bytes, pos: int, active: Sequence[bool] | None) -> Events:
        """:meth:`events` with one Hyperscan scan of the buffer for the
        literal windows, the exact rules and the prefilter together (one
        callback): a buffer costs one scan call and one automaton over its
        bytes instead of up to three.  (Measured, one scan of 16 KiB: the
        nettle manual at 10 othersite rules 8.9 us apart, 6.1 united;
        Bootstrap's CSS at 10 realistic rules 5.9 against 4.4; whole
        bodies up to 20% faster.)  All of ``buf`` is
        scanned when ``pos`` is at most WHOLE_SCAN_POS and reports before
        ``pos`` are dropped; a rule the prefilter looks for whole (one
        report) then counts as a candidate even if its match lies before
        ``pos``, which costs only its own scan.  From further on,
        ``buf[pos:]``.
        """
        united = self._united
        assert united is not None
        n = len(buf)
        off = 0 if pos <= WHOLE_SCAN_POS else pos
        exact: list[Report] = []
        add = exact.append
        spans: dict[int, tuple[int, int]] = dict.fromkeys(self._always, (pos, n))
        sure = self._sure_count
        rules = self._sure_rules
        lengths = self._sure_lengths
        one_key = self._one
        many = self._window_facts
        reports = self._reports
        at_exact = self._at_exact
        at_filter = self._at_filter
        efacts = self._exact_facts
        ffacts = self._filter_facts

        if pos >= n:
            pass  # nothing to scan
        elif active is None and not off:

            def on_match(i: int, _s: int, e: int, _f: int, _c: object) -> None:
                # All rules, all of buf (the whole body, and a feed's buffer
                # from its byte of left context): no mask to read, no offset
                # to add.  (The general handler's checks cost 8% on the
                # realistic 1.7 MB page at 10 rules: 13,000 reports.)  The
                # literal windows' part is ``_literal_handler``'s, inlined:
                # a call per report would cost more than those checks.
                if i < at_exact:
                    if i < sure:
                        s = e - lengths[i]
                        if s >= pos:
                            add((s, rules[i], e, 0))
                        return
                    one = one_key[i]
                    if one is not None:
                        reach, rule, length, check = one
                        s = e - reach
                        if s >= pos:
                            add((s, rule, s + length, check))
                        return
                    for rule, reach, key, caseless in many[i]:  # type: ignore[union-attr]
                        s = e - reach
                        if s >= pos and (
                            buf[s : s + len(key)].lower() == key if caseless else buf.startswith(key, s)
                        ):
                            add((s, rule, s + len(key), 0))
                    return
                if i < at_filter:
                    rule, width = efacts[i - at_exact]
                    s = e - width
                    if s >= pos:
                        add((s, rule, e, 0))
                    return
                head, head_length = ffacts[i - at_filter]
                if head_length is None:
                    spans[head] = (pos, n)
                    return
                at = e - head_length
                if at < pos:
                    return
                had = spans.get(head)
                spans[head] = (at, at) if had is None else (had[0], at)

            united.scan(buf, on_match)
        else:

            def on_match_at(i: int, _s: int, e: int, _f: int, _c: object) -> None:
                e += off
                if i < at_exact:
                    if i < sure:
                        s = e - lengths[i]
                        if s >= pos and (active is None or active[rules[i]]):
                            add((s, rules[i], e, 0))
                        return
                    one = one_key[i]
                    if one is not None:
                        reach, rule, length, check = one
                        s = e - reach
                        if s >= pos and (active is None or active[rule]):
                            add((s, rule, s + length, check))
                        return
                    for reach, rule, length, check in reports[i]:
                        s = e - reach
                        if s >= pos and (active is None or active[rule]):
                            add((s, rule, s + length, check))
                    return
                if i < at_filter:
                    rule, width = efacts[i - at_exact]
                    s = e - width
                    if s >= pos and (active is None or active[rule]):
                        add((s, rule, e, 0))
                    return
                head, head_length = ffacts[i - at_filter]
                if active is not None and not active[head]:
                    return
                if head_length is None:
                    spans[head] = (pos, n)
                    return
                at = e - head_length
                if at < pos:
                    return
                had = spans.get(head)
                spans[head] = (at, at) if had is None else (had[0], at)

            united.scan(buf[off:] if off else buf, on_match_at)
        exact.sort()
        if not spans:
            return Events(exact, {}, {})
        candidates = {rule: first for rule, (first, _last) in spans.items()}
        lasts = {rule: last for rule, (_first, last) in spans.items()}
        return Events(exact, candidates, lasts)

    def _events_apart(self, buf: bytes, pos: int, active: Sequence[bool] | None) -> Events:
        """:meth:`events` with the databases scanned one by one."""
        data = buf[pos:] if pos else buf
        exact: list[Report] = []
        add = exact.append
        if self._exact.db is not None:
            facts = self._exact_facts
            if active is None:
                def on_exact(i: int, _s: int, e: int, _f: int, _c: object) -> None:
                    rule, width = facts[i]
                    add((e - width + pos, rule, e + pos, 0))
            else:
                def on_exact(i: int, _s: int, e: int, _f: int, _c: object) -> None:
                    rule, width = facts[i]
                    if active[rule]:
                        add((e - width + pos, rule, e + pos, 0))
            self._exact.scan(data, on_exact)
        if self._window.db is not None:
            if active is None and pos <= WHOLE_SCAN_POS:
                self._window.scan(buf, self._literal_handler(buf, pos, active, add))
            else:
                self._window.scan(data, self._literal_handler(buf, pos, active, add))
        exact.sort()
        candidates: dict[int, int] = {}
        lasts: dict[int, int] = {}
        if self._filter is not None:
            others = self.others
            for local, (at, last) in self._filter.spans(buf, pos).items():
                rule = others[local]
                if active is None or active[rule]:
                    candidates[rule] = at
                    lasts[rule] = last
        return Events(exact, candidates, lasts)

    def _literal_handler(
        self, buf: bytes, pos: int, active: Sequence[bool] | None, add: Any
    ) -> Any:
        """The literal scan's callback: for all rules from a position up to
        WHOLE_SCAN_POS, a scan of all of ``buf`` (reports before ``pos``
        dropped); otherwise of ``buf[pos:]``.

        A whole key's report is its match.  A window of one key gives a
        report to confirm, confirmed only if the scan gets there (at 1000
        realistic rules, 211 reports of which the scan takes 90: the others
        are inside an earlier match); a window of several keys is compared
        with each here.  Measured against comparing every window hit here,
        realistic 1000-rule set, 20 KB page: events 263 -> 211 us,
        transducer 428 -> 406 us (a busy machine; p10 238 -> 186 and 408
        -> 384); 10 and 100 rules (whole keys) unchanged.  The variant for
        the common case, all rules from position 0, saves the offset and
        the mask per report (2-3% of the transducer's time on the 20 KB
        page against one that adds the offset); from another position the
        generic one measured the same as that variant (1 KiB feeds).  A
        feed's scan starts at 1 (the byte of left context the transducer
        keeps): in 16 KiB feeds of the othersite corpus's largest page at
        100 rules the generic callback took 13% of the time, the same
        reports 8% in this one.
        """
        sure = self._sure_count
        rules = self._sure_rules
        lengths = self._sure_lengths
        reports = self._reports
        if active is None and pos <= WHOLE_SCAN_POS:
            ones = self._one
            many = self._window_facts

            def on_literal(i: int, _s: int, e: int, _f: int, _c: object) -> None:
                if i < sure:
                    s = e - lengths[i]
                    if s >= pos:
                        add((s, rules[i], e, 0))
                    return
                one = ones[i]
                if one is not None:
                    reach, rule, length, check = one
                    s = e - reach
                    if s >= pos:
                        add((s, rule, s + length, check))
                    return
                for rule, reach, key, caseless in many[i]:  # type: ignore[union-attr]
                    s = e - reach
                    if s >= pos and (buf[s : s + len(key)].lower() == key if caseless else buf.startswith(key, s)):
                        add((s, rule, s + len(key), 0))
            return on_literal

        def on_literal_at(i: int, _s: int, e: int, _f: int, _c: object) -> None:
            e += pos
            for reach, rule, length, check in reports[i]:
                s = e - reach
                if s >= pos and (active is None or active[rule]):
                    add((s, rule, s + length, check))
        return on_literal_at

    def confirm(self, buf: bytes, start: int, check: int) -> bool:
        """Whether the report to confirm ``check`` at ``start`` is a match."""
        key, caseless = self.checks[check]
        if caseless:
            return buf[start : start + len(key)].lower() == key
        return buf.startswith(key, start)

    def matches(self, buf: bytes, events: Events) -> list[tuple[int, int, int]]:
        """The (start, rule, end) of the exact rules' matches in ``events``
        (of ``buf``): its reports, confirmed."""
        return [(s, r, e) for s, r, e, c in events.exact if not c or self.confirm(buf, s, c)]

    def begun(
        self, buf: bytes, pos: int, candidates: Mapping[int, int], rules: Sequence[int]
    ) -> tuple[list[int], list[tuple[int, int]], int | None]:
        """Sort ``rules`` (unbounded ones: see ``unbounded`` and
        ``long_rules``) by whether a match of theirs may have begun in
        ``buf[pos:]`` and run off its end: (the rules whose head occurs,
        (place, rule) for those whose head only the end cuts, the first of
        the others or None).

        A rule the prefilter looks for by its head (the byte sets every
        match starts with) can begin such a match only where its head
        occurs, which the prefilter reported (``candidates``: the same
        buffer's and position's :attr:`Events.candidates`), or where the
        end of the buffer cuts its head (then only from that place on), or
        at the very end (where every rule that cannot match empty waits:
        the others reach exactly the end).  A rule the prefilter looks for
        whole counts as begun.  So a rule that has not begun to match
        costs the hold-back question nothing but this test.  (Measured,
        bench/bench_transducer.py --feeds: see bench/README.md, "Issue 34:
        the reads a real origin gives".)
        """
        n = len(buf)
        kept: list[int] = []
        cut_at: list[tuple[int, int]] = []
        first_end: int | None = None
        cut = self._cut_heads
        any_cut = self._any_cut
        if any_cut is None or any_cut.search(buf, max(pos, n - self._cut_longest + 1), n) is None:
            # The end of the buffer cuts no head: one search instead of one
            # per rule (the 5 unbounded rules of the othersite 100-rule set,
            # a plain feed: 2.4 -> 1.3 us).
            for rule in rules:
                if rule in candidates or rule not in cut:
                    kept.append(rule)
                elif first_end is None:
                    first_end = rule
            return kept, cut_at, first_end
        for rule in rules:
            if rule in candidates or rule not in cut:
                kept.append(rule)
                continue
            length, pattern, first = cut[rule]
            lo = max(pos, n - length + 1)
            if pattern is None or (first is not None and buf.find(first, lo) < 0):
                m = None
            else:
                m = pattern.search(buf, lo, n)
            if m is not None:
                cut_at.append((m.start(), rule))
            elif first_end is None:
                first_end = rule
        return kept, cut_at, first_end

    def alive(self, buf: bytes, pos: int) -> dict[int, int]:
        """Per unbounded rule of the hold scan, the leftmost place ``>= pos``
        and before the end from which one of its paths (assertions dropped)
        reaches the end of ``buf``; rules with no such place are left out."""
        n = len(buf)
        out: dict[int, int] = {}
        if self._long is not None and self._long.db is not None and pos < n:
            facts = self._long.facts

            def on_long(i: int, s: int, _e: int, _f: int, _c: object) -> None:
                rule = facts[i][0]
                here = s + pos
                if here < out.get(rule, n):
                    out[rule] = here

            self._long.scan(buf[pos:] if pos else buf, on_long)
        return out
