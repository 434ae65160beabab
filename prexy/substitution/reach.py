"""Per-rule facts for the hold-back question, computed once per rule set.

:class:`Reach` holds what a rule can consume and its probe (the rule
rewritten so that at the end of the buffer any atom may match empty and
mark the match, ``emit.to_regex_source(probe=True)``); :func:`reach_from`
runs it: the leftmost position from which one of the rule's paths, tried
before any real match there, runs off the end of the buffer.
:class:`FloorPlan` groups rules by how their floor is found.

Patterns made of byte sets without repeats (a rule's head gate, the cut
heads of ``MatchIndex.begun``, the hold cursors' tail tests) run in time
linear in the bytes they cross, so they are called without ``timeout=``
(the backward walks to a floor use no pattern: see ``Reach.marks``): ``regex`` reads the process's CPU clock for it, which
cost 3-8 us per call against 0.5-0.9 us without on the development VM
(where that clock is a system call), more than such a search.  The rules'
own patterns and probes always pass the timeout.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

from collections.abc import Iterable

import regex

from prexy.substitution import hsindex
from prexy.substitution.analysis import (
    bounded_width,
    can_match_empty,
    literal_prefix,
    max_width,
    repeat_bytes,
)
from prexy.substitution.emit import FLAGS, PROBE_GROUP, set_source, to_re2_source, to_regex_source
from prexy.substitution.linear import LinearMatch, LinearPattern
from prexy.substitution.pikevm import PikePattern, PikeProbe
from prexy.substitution.prefilter import head_sets
from prexy.substitution.syntax import ParsedRegex


class Reach:
    """Per-rule facts for the hold-back question, computed once per rule set.

    The probe pattern is compiled on first use: with many rules most are
    never probed (no occurrence of their prefix near a buffer's end).  An
    exact rule (:func:`.hsindex.exact_widths`) needs no probe: ``seqs``, its
    matches as byte-set sequences, answer the question directly (compiling
    the probes of 1000 realistic rules took 3.8 s).
    """

    __slots__ = (
        "_source", "_probe", "prefix", "width", "bounded", "eaten", "key", "other", "seqs", "longest",
        "linear", "_tail", "gate", "_floor_mark",
    )

    def __init__(self, parsed: ParsedRegex, exact: bool = False, linear: bool = False) -> None:
        self.seqs = hsindex.expand(parsed.tree) if exact else None
        self.longest = max(map(len, self.seqs)) if self.seqs else 0
        #: The probe runs on RE2 (see :mod:`.linear`) like the rule itself.
        self.linear = linear
        if linear:
            self._source = to_re2_source(parsed.tree, probe=True)
        else:
            self._source = to_regex_source(parsed.tree, probe=True, caseless=parsed.caseless)
        self._probe: regex.Pattern[bytes] | LinearPattern | PikeProbe | None = None
        self._tail: LinearPattern | None = None
        self.prefix = literal_prefix(parsed.tree)
        #: Where a path of a rule that cannot match empty may begin: its head
        #: (the byte sets every match starts with), whole or cut by the end
        #: of the buffer.  Used when it says more than the literal prefix
        #: (a case-insensitive rule's prefix is at most its first byte):
        #: the probe, slow to call with many atoms, then runs only there.
        #: (Exact rules and rules on RE2 answer without the probe's scan.)
        self.gate: regex.Pattern[bytes] | None = None
        probed = self.seqs is None and not linear and not can_match_empty(parsed.tree)
        heads = head_sets(parsed) if probed else []
        if len(heads) >= 2 and len(heads) > len(self.prefix):
            src = set_source(heads[-1])
            for members in reversed(heads[:-1]):
                src = f"{set_source(members)}(?:\\z|{src})"
            self.gate = regex.compile(src.encode("latin-1"), FLAGS)
        self.width = max_width(parsed.tree)
        self.bounded = bounded_width(parsed.tree)
        self.eaten = repeat_bytes(parsed.tree)
        # Rules with the same key share the floor computation of a buffer.
        self.key = (self.width, self.bounded, self.eaten)
        # Finds, backwards, a byte that no unbounded repeat of the rule eats.
        self.other: regex.Pattern[bytes] | None = None
        self._floor_mark: tuple[bytes, bytes | None] | None = None
        if self.width is None and len(self.eaten) < 256:
            other = set_source(frozenset(range(256)) - self.eaten)
            self.other = regex.compile(("(?r)" + other).encode("latin-1"), FLAGS)

    def _marking(self) -> tuple[bytes, bytes | None]:
        """The byte the walks look for, or a translation marking the bytes
        (``b"\\x01"``) that the rule's unbounded repeats do not eat."""
        marks = self._floor_mark
        if marks is None:
            x = bytes(sorted(frozenset(range(256)) - self.eaten))
            table = None if len(x) == 1 else bytes(1 if b in x else 0 for b in range(256))
            marks = self._floor_mark = (x if table is None else b"\x01", table)
        return marks

    def _window(self, buf: bytes, lo: int, n: int, need: int) -> tuple[int, bytes, bytes]:
        """The shortest of the windows ``buf[n - 256 * 4**i : n]`` (or
        ``buf[lo:n]``) that holds ``need`` marks: (its start, its bytes,
        marked, the mark)."""
        sep, table = self._marking()
        size = 256
        while True:
            start = max(lo, n - size)
            if table is None:
                if buf.count(sep, start, n) >= need or start == lo:
                    return start, buf[start:n], sep
            else:
                window = buf[start:n].translate(table)
                if window.count(sep) >= need or start == lo:
                    return start, window, sep
            size *= 4

    def floor_mark(self, buf: bytes, lo: int, n: int) -> int:
        """For a rule with ``other``: the place of the ``bounded + 2``-th
        byte from ``n`` back that its unbounded repeats do not eat, within
        ``buf[lo:n]``, or -1 when there are fewer (the walk of
        :class:`~.holdcursors.RuleHoldCursor` to its floor).

        In time linear in the bytes crossed, in C: windows that grow from
        the end (those bytes marked with ``translate`` unless there is one),
        counted, then cut with ``rsplit``.  (``regex`` searches backwards
        byte by byte: its ``(?r)`` finditer crossed 16 KiB with five ``"``
        in 236 us, a counted backward pattern in 682 us; this in 1.3 us.)
        """
        need = self.bounded + 2
        start, window, sep = self._window(buf, lo, n, need)
        if window.count(sep) < need:
            return -1
        # The need-th mark from the end ends the first piece.
        return start + len(window.rsplit(sep, need)[0])

    def marks(self, buf: bytes, lo: int, n: int, need: int) -> list[int]:
        """The places of the last ``need`` bytes of ``buf[lo:n]`` that the
        rule's unbounded repeats do not eat, from the end back (fewer when
        there are fewer); see :meth:`floor_mark`."""
        start, window, sep = self._window(buf, lo, n, need)
        pieces = window.rsplit(sep, need)
        out: list[int] = []
        at = start + len(window)
        for piece in reversed(pieces[1:]):
            at -= len(piece) + 1
            out.append(at)
        return out

    @property
    def tail(self) -> LinearPattern:
        """For a rule on RE2: its probe made to end at the end of the buffer.
        Where it matches from is where some path of the rule runs to the
        end; a marked first success of the probe can only start there."""
        if self._tail is None:
            self._tail = LinearPattern(f"(?:{self._source})\\z")
        return self._tail

    @property
    def probe(self) -> regex.Pattern[bytes] | LinearPattern | PikeProbe:
        """The rule's probe (see ``emit.to_regex_source``), compiled once."""
        if self._probe is None:
            src = self._source
            if self.linear:
                self._probe = LinearPattern(src)
                return self._probe
            if f"(?P<{PROBE_GROUP}>)" not in src:
                # Nothing in the rule can mark: add a branch that never matches.
                src = f"(?:{src})|(?!)(?P<{PROBE_GROUP}>)"
            self._probe = regex.compile(src.encode("latin-1"), FLAGS)
        return self._probe

    def use_vm(self, pattern: PikePattern) -> None:
        """For a rule on the sregex-order VM: the VM answers the probe's
        question by its own thread order (see ``pikevm.PikeProbe``)."""
        self.linear = False
        self._probe = PikeProbe(pattern)


Where = tuple[int, int, int]


class FloorPlan:
    """How to find the floors of a set of active rules, grouped, per buffer.

    Rules that share their floor computation (``where``: ``(0, width, 0)``
    for bounded width; ``(1, 0, 0)`` when their repeats eat any byte;
    ``(2, j, k)`` for the ``k``-th mark of backward walk ``j``) and their
    tail test form a group.  The tail test (``key``) says whether a rule can
    reach past the end from before the end: None, always probe; bytes, a
    literal prefix every match starts with; a set, the bytes a match can
    start with.  ``walks``: per set of bytes that unbounded repeats eat,
    a rule with that set (its ``Reach.marks`` walks back over the other
    bytes) and how many of them to find.
    """

    __slots__ = ("walks", "literal", "literal_order", "others", "trie", "lowest", "lowest_literal")

    def __init__(
        self,
        walks: list[tuple[Reach, int]],
        groups: dict[tuple[Where, bytes | frozenset[int] | None], list[int]],
    ) -> None:
        self.walks = walks
        #: Literal key -> its groups (where, rules); and all of them by first rule.
        self.literal: dict[bytes, list[tuple[Where, list[int]]]] = {}
        self.literal_order: list[tuple[int, bytes, Where]] = []
        #: Groups without a literal key.
        self.others: list[tuple[Where, frozenset[int] | None, list[int]]] = []
        for (where, key), rules in groups.items():
            if isinstance(key, bytes):
                self.literal.setdefault(key, []).append((where, rules))
                self.literal_order.append((rules[0], key, where))
            else:
                self.others.append((where, key, rules))
        self.literal_order.sort()
        self.trie = _Trie(self.literal)
        # The lowest floors (of all groups; of literal ones): a bounded width,
        # whether some floor is the scan start, and per walk the deepest mark.
        self.lowest = self._lowest(where for where, _ in groups)
        self.lowest_literal = self._lowest(where for where, key in groups if isinstance(key, bytes))

    def _lowest(self, wheres: Iterable[Where]) -> tuple[int, bool, dict[int, int]]:
        width = -1
        anything = False
        deepest: dict[int, int] = {}
        for kind, a, b in wheres:
            if kind == 0:
                width = max(width, a)
            elif kind == 1:
                anything = True
            else:
                deepest[a] = max(deepest.get(a, 0), b)
        return width, anything, deepest


class _Trie:
    """Literal prefixes, to find at once which of them occur near the end.

    ``places(buf, low)``: for each prefix that starts at a position
    ``>= low`` (whole, or cut by the end of the buffer), those positions in
    ascending order.
    """

    __slots__ = ("_children", "_ends", "_below")

    def __init__(self, keys: Iterable[bytes]) -> None:
        self._children: list[dict[int, int]] = [{}]
        self._ends: list[list[bytes]] = [[]]
        self._below: list[list[bytes]] = [[]]
        for key in sorted(keys):
            node = 0
            self._below[0].append(key)
            for byte in key:
                nxt = self._children[node].get(byte)
                if nxt is None:
                    nxt = self._children[node][byte] = len(self._children)
                    self._children.append({})
                    self._ends.append([])
                    self._below.append([])
                node = nxt
                self._below[node].append(key)
            self._ends[node].append(key)

    def places(self, buf: bytes, low: int) -> dict[bytes, list[int]]:
        """See the class docstring."""
        n = len(buf)
        children = self._children
        ends = self._ends
        below = self._below
        found: dict[bytes, list[int]] = {}
        for i in range(low, n):
            node = 0
            x = i
            while True:
                if x == n:
                    for key in below[node]:
                        found.setdefault(key, []).append(i)
                    break
                node_next = children[node].get(buf[x])
                if node_next is None:
                    break
                node = node_next
                x += 1
                for key in ends[node]:
                    found.setdefault(key, []).append(i)
        return found


def marked(m: regex.Match[bytes] | LinearMatch) -> bool:
    """Whether a probe's match went through an end-of-buffer mark."""
    if isinstance(m, LinearMatch):
        return m.marked()
    return m.group(PROBE_GROUP) is not None


def reaches_at(r: Reach, buf: bytes, pos: int, timeout: float | None, probe: bool = True) -> bool:
    """Whether ``reach_from(r, buf, pos, timeout) == pos``: :func:`reach_from`'s
    question at one position, without its search past it.  With ``probe``
    false, only what the rule's leading bytes (or, for an exact rule, its
    byte-set sequences) say: False means no, True maybe; the probe itself,
    which may cross every byte to the end, is not run."""
    n = len(buf)
    if r.seqs is not None:
        # Its paths are at most ``longest`` bytes long.
        return pos > n - r.longest and reach_from(r, buf, pos, timeout) == pos
    if pos >= n:
        return reach_from(r, buf, pos, timeout) == pos
    prefix = r.prefix
    if prefix and not buf.startswith(prefix, pos) and not (n - pos < len(prefix) and prefix.startswith(buf[pos:])):
        return False
    gate = r.gate
    if gate is not None and gate.match(buf, pos, n) is None:
        return False
    if not probe:
        return True
    # Past the cheap filters, reach_from's own answer: its search from
    # ``pos`` decides ``pos`` first (a probe's match read alone can differ
    # from the search's at the same place: an assertion at the end of the
    # buffer), and only the few rules whose leading bytes fit get here.
    return reach_from(r, buf, pos, timeout) == pos


def reach_from(r: Reach, buf: bytes, start: int, timeout: float | None) -> int | None:
    """Leftmost position ``>= start`` from which the rule's probe says one
    of its paths, tried before any real match there, runs off the end."""
    n = len(buf)
    seqs = r.seqs
    if seqs is not None:
        # A path is alive from s when the bytes to the end begin one of the
        # rule's sequences and do not complete it (no other can be longer).
        for s in range(max(start, n - r.longest + 1), n):
            left = n - s
            for seq in seqs:
                if len(seq) > left and all(buf[s + k] in seq[k] for k in range(left)):
                    return s
        return n if start <= n else None
    if r.linear:
        # One RE2 search finds the next place where some path reaches the
        # end; only there is the probe's first success worth reading.  (A
        # search per position, as below, would cross the same bytes again
        # for each start inside a long match.)
        tail = r.tail.search
        probe = r.probe.match
        while start <= n:
            t = tail(buf, start)
            if t is None:
                return None
            s = t.start()
            m = probe(buf, s)
            if m is not None and marked(m):
                return s
            start = s + 1
        return None
    match = r.probe.match
    gate = r.gate
    if gate is not None:
        g = gate.search(buf, start, n)  # no timeout: see the module docstring
        while g is not None:
            i = g.start()
            m = match(buf, i, timeout=timeout)
            if m is not None and marked(m):
                return i
            g = gate.search(buf, i + 1, n)
        # From the very end every path must wait.
        return n if start <= n else None
    prefix = r.prefix
    if prefix:
        k = len(prefix)
        i = buf.find(prefix, start, n)
        while i >= 0 and i <= n - k:
            m = match(buf, i, timeout=timeout)
            if m is not None and marked(m):
                return i
            i = buf.find(prefix, i + 1, n)
        # A prefix cut by the end of the buffer: only where what is left
        # begins the prefix.  From the very end every path must wait.
        for i in range(max(start, n - k + 1), n):
            if prefix.startswith(buf[i:n]):
                m = match(buf, i, timeout=timeout)
                if m is not None and marked(m):
                    return i
        return n if start <= n else None
    search = r.probe.search
    while start <= n:
        m = search(buf, start, timeout=timeout)
        if m is None:
            return None
        if marked(m):
            return m.start()
        start = m.start() + 1
    return None
