"""Scanning behind a small interface: where is the next match, what must wait.

The transducer asks a scanner two questions about one buffer, through two
cursors whose positions only grow while that buffer is scanned:

* ``cursor(buf, timeout, active).find(pos)``: the match the rule set makes
  first from ``pos`` (leftmost start, then rule order, then Perl priority
  inside the rule);
* ``hold_cursor(buf, pos, timeout, active).hold_point(lo, found)``: the
  leftmost position where some rule could still match differently if more
  bytes arrived (one of its paths, tried before any real match there, runs
  off the end of the buffer), or None.

:class:`RegexScanner` answers both with the ``regex`` package.  ``find``
runs each rule's own pattern (so each keeps ``regex``'s literal fast path,
which one big alternation loses) and merges their next matches in a heap by
(start, rule index), which is exactly the alternation's order; a rule's
cached next match stays valid until the scan passes its start.
``hold_point`` runs each rule's *probe*, the rule rewritten so that at the
end of the buffer any atom or assertion may match empty and mark the match
(``dialect.to_regex_source(probe=True)``): the probe's first success at a
position says whether a path of higher priority than any real match there
reached the end.  Probes only run where it can matter: above the rule's
floor (the end of the buffer minus what the rule can consume, not counting
bytes its unbounded repeats may eat) and, for a rule with fixed leading
bytes, only where those bytes are.

With many rules both questions would cost time linear in the rule count,
so neither asks every rule.  For ``find``, a multi-pattern prefilter
(:mod:`.prefilter`: Hyperscan when installed, else rare-byte anchors) says
once per buffer which rules may match from ``pos``, and only those rules'
patterns run (from :data:`FILTER_MIN_RULES` active rules on).  For
``hold_point``, rules are grouped by how their floor is computed and by a
tail test: a rule that cannot match empty can run off the end from before
the end only where its literal prefix (found for all rules at once with a
trie over the last bytes) or one of its first bytes is; a rule with no such
place above its floor reaches exactly the end and is never probed, and the
others wait in the heap as lower bounds, probed only when they come first.

Every regex call passes ``timeout=``; a ``TimeoutError`` propagates to the
caller.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

import regex

from prexy.substitution import hsindex, prefilter
from prexy.substitution.dialect import (
    PROBE_GROUP,
    ParsedRegex,
    backtracking_risk,
    bounded_width,
    can_match_empty,
    empty_loop_groups,
    first_bytes,
    literal_prefix,
    max_width,
    pure_literal,
    repeat_bytes,
    set_source,
    to_re2_source,
    to_regex_source,
)
from prexy.substitution.linear import LinearError, LinearMatch, LinearPattern
from prexy.substitution.pikevm import PikePattern, PikeProbe, order_reason

__all__ = ["Cursor", "Found", "HoldCursor", "RegexScanner", "Scanner"]

FLAGS = regex.DOTALL | regex.MULTILINE

#: From this many active rules on, a multi-pattern prefilter picks the rules
#: to run on each buffer (see :mod:`.prefilter`).
FILTER_MIN_RULES = 2

#: Hold-back heap entries: a rule's exact reach, or a lower bound of it.
EXACT = -1
BOUND = -2

#: A rule whose matches all start with fixed bytes (``UA-`` in ``UA-\d+``)
#: finds its next possible start by the rarest of those bytes (a ``memchr``,
#: far faster than ``regex`` crossing the same bytes).  When no such byte is
#: within this many bytes of where its running ``finditer`` would go on, the
#: scan restarts at the next occurrence instead (a new scan costs about what
#: ``regex`` takes to cross a few KB).
SKIP_GAP = 2048

#: Occurrences of the rare byte checked for the whole prefix before the
#: search settles for a lower bound of the next start (a page full of that
#: byte then costs a few steps per search, not one per occurrence).
LEAD_PROBES = 8


class _Lead:
    """Fixed leading bytes of every match of a rule, and the rarest of them."""

    __slots__ = ("prefix", "offset", "byte")

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        costs = prefilter.byte_costs()
        self.offset = min(range(len(prefix)), key=lambda i: costs[prefix[i]])
        self.byte = prefix[self.offset]

    def next_start(self, buf: bytes, pos: int) -> int:
        """A position ``>= pos`` with no occurrence of the prefix between
        ``pos`` and it: the next occurrence, or a lower bound of it after
        LEAD_PROBES false hits; -1 if the prefix does not occur from pos."""
        offset = self.offset
        i = buf.find(self.byte, pos + offset)
        probes = 0
        while i >= 0:
            start = i - offset
            if buf.startswith(self.prefix, start):
                return start
            probes += 1
            if probes >= LEAD_PROBES:
                # Every occurrence of the prefix from pos has the byte at
                # ``offset``; none of those before i had the prefix.
                return i + 1 - offset
            i = buf.find(self.byte, i + 1)
        return -1


#: Near the end of a buffer, up to this many positions are matched against
#: all literal prefixes at once (see ``_Trie``) to skip rules' probes.
TRIE_SPAN = 512


class Found:
    """A match: span, the rule that made it, and a way to read its groups."""

    __slots__ = ("start", "end", "rule", "_match", "_offset", "_ngroups", "_loop_groups")

    def __init__(
        self,
        start: int,
        end: int,
        rule: int,
        match: regex.Match[bytes],
        offset: int,
        ngroups: int,
        loop_groups: frozenset[int] = frozenset(),
    ) -> None:
        self.start = start
        self.end = end
        self.rule = rule
        self._match = match
        self._offset = offset
        self._ngroups = ngroups
        self._loop_groups = loop_groups

    def span(self, n: int) -> tuple[int, int]:
        """Offsets of group ``n`` of the rule that matched; (-1, -1) if unset."""
        if n > self._ngroups:
            return (-1, -1)
        if n == 0:
            return (self.start, self.end)
        if n in self._loop_groups:
            # Perl and sregex drop a last loop iteration that matched empty
            # right after a non-empty one; ``regex`` keeps its captures.
            spans = self._match.spans(self._offset + n)
            if not spans:
                return (-1, -1)
            if len(spans) >= 2 and spans[-1][0] == spans[-1][1] == spans[-2][1]:
                return spans[-2]
            return spans[-1]
        start, end = self._match.span(self._offset + n)
        return (start, end)

    def group(self, n: int) -> bytes:
        """Group ``n`` of the rule that matched (0: whole match); b"" if unset."""
        if n > self._ngroups:
            return b""
        if n == 0:
            return bytes(self._match.string[self.start : self.end])
        if n in self._loop_groups:
            start, end = self.span(n)
            if start < 0:
                return b""
            return bytes(self._match.string[start:end])
        value = self._match.group(self._offset + n)
        return value if value is not None else b""

    @property
    def ngroups(self) -> int:
        """How many capture groups the matching rule has."""
        return self._ngroups


class Cursor(Protocol):
    """Successive ``find`` calls over one buffer, positions not decreasing."""

    def find(self, pos: int) -> Found | None:
        """The first match at or after ``pos`` (treating the buffer end as final)."""

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        matched: set[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
        stops: frozenset[int] | None = None, stop_rule: int = -1,
    ) -> tuple[int, int]:
        """Replace, from ``pos``, the matches that start before ``stop`` as
        long as each is non-empty and its rule has a fixed global
        replacement (``literals[rule]``, or for a match whose span the
        cursor knows, ``memo[(rule, matched bytes)]`` when present: global
        rules only); stop at the first that is not.  Adds the rules that
        matched to ``matched``; returns the new position and the number of
        matches.

        With ``stops`` (see ``Transducer``'s restart rule), the run also
        stops right after any match followed by one of the bytes in
        ``stops`` or by the end of the buffer; and before any match of
        ``stop_rule``."""


class HoldCursor(Protocol):
    """The hold-back question for one buffer, positions not decreasing."""

    #: No match starting below ``floor`` can run off the end of the buffer.
    floor: int

    def hold_point(self, lo: int, found: Found | None) -> int | None:
        """Leftmost position ``>= lo`` whose match may still need more bytes.

        Only positions up to ``found.start`` count (the whole buffer if no
        match was found), and at ``found.start`` only rules up to
        ``found.rule``.
        """


class Scanner(Protocol):
    """What the transducer needs from a scanner."""

    def cursor(self, buf: bytes, timeout: float | None, active: Sequence[int]) -> Cursor:
        """A match cursor over ``buf`` for the rules ``active`` (indexes, in order).

        Every scan it runs passes ``timeout``.
        """

    def hold_cursor(
        self, buf: bytes, pos: int, timeout: float | None, active: Sequence[int]
    ) -> HoldCursor:
        """A hold-back cursor over ``buf`` for a scan starting at ``pos``."""


class _LiteralMatch:
    """What the cursors read of a ``regex`` match, for an occurrence of a
    literal rule without groups (group 0 only)."""

    __slots__ = ("string", "_start", "_end")

    def __init__(self, string: bytes, start: int, end: int) -> None:
        self.string = string
        self._start = start
        self._end = end

    def start(self, n: int = 0) -> int:
        return self._start

    def end(self, n: int = 0) -> int:
        return self._end

    def group(self, n: int = 0) -> bytes:
        return self.string[self._start : self._end]


class _SpanMatch:
    """A match of an exact rule whose span is known: the rule's own
    ``regex`` match, bounded to that span, runs only if a group is read."""

    __slots__ = ("string", "_pattern", "_start", "_end", "_timeout", "_m")

    def __init__(
        self, string: bytes, pattern: regex.Pattern[bytes], start: int, end: int, timeout: float | None
    ) -> None:
        self.string = string
        self._pattern = pattern
        self._start = start
        self._end = end
        self._timeout = timeout
        self._m: regex.Match[bytes] | None = None

    def _match(self) -> regex.Match[bytes]:
        m = self._m
        if m is None:
            m = self._pattern.match(self.string, self._start, self._end, timeout=self._timeout)
            assert m is not None and m.end() == self._end, (self._start, self._end)
            self._m = m
        return m

    def start(self, n: int = 0) -> int:
        return self._start if n == 0 else self._match().start(n)

    def end(self, n: int = 0) -> int:
        return self._end if n == 0 else self._match().end(n)

    def span(self, n: int = 0) -> tuple[int, int]:
        return (self._start, self._end) if n == 0 else self._match().span(n)

    def spans(self, n: int = 0) -> list[tuple[int, int]]:
        return self._match().spans(n)

    def group(self, n: int = 0) -> bytes | None:
        return self.string[self._start : self._end] if n == 0 else self._match().group(n)


class _RuleStream:
    """The successive matches of one rule over a buffer.

    A rule that cannot match empty reads its matches from one ``finditer``
    (a single C-level scan, far cheaper per match than a ``search`` call);
    its next match is reused whenever the scan position has not passed into
    the previous one.  A rule that can match empty is searched anew, since
    ``finditer`` may then return a non-empty match where an empty one was
    just found, which the module never does.  ``start``: no match of the
    rule starts before it (a prefilter's hint), so scans begin there;
    ``last``: none starts after it, so no search is made from beyond it.

    A rule that is one literal byte string without groups (``word``) is
    found with ``bytes.find``: the same leftmost occurrence, without the
    regex call and the CPU-clock reads its timeout costs on each call;
    like ``bytes.split``, ``find`` cannot backtrack.

    A rule whose matches all start with fixed bytes (``lead``, see
    :class:`_Lead`) starts each new scan at the next occurrence of them,
    and drops its running scan for a new one when none is near.  Measured
    on the bench page: ``regex`` took 15-19 µs to cross the 20 KB between
    the two matches of ``UA-\\d+-\\d+``, ``bytes.find`` of its ``U`` 0.6 µs.
    """

    __slots__ = ("buf", "timeout", "pattern", "_iter", "_last_end", "empty_ok", "start", "word", "lead", "last")

    def __init__(
        self,
        buf: bytes,
        timeout: float | None,
        pattern: regex.Pattern[bytes],
        empty_ok: bool,
        start: int = 0,
        word: bytes | None = None,
        lead: _Lead | None = None,
        last: int | None = None,
    ) -> None:
        self.word = word
        self.lead = lead
        self.buf = buf
        #: No match starts after this (a prefilter's bound).
        self.last = len(buf) if last is None else last
        self.timeout = timeout
        self.pattern = pattern
        self.empty_ok = empty_ok
        self.start = start
        self._iter: Iterator[regex.Match[bytes]] | None = None
        self._last_end = -1

    def forget(self) -> None:
        """The scan moved on without this stream: search afresh next time."""
        self._iter = None

    def next_from(self, pos: int) -> regex.Match[bytes] | None:
        """The leftmost match starting at or after ``pos``."""
        if pos < self.start:
            pos = self.start
        elif pos > self.last:
            return None
        word = self.word
        if word is not None:
            at = self.buf.find(word, pos)
            return None if at < 0 else _LiteralMatch(self.buf, at, at + len(word))
        if self.empty_ok:
            return self.pattern.search(self.buf, pos, timeout=self.timeout)
        it = self._iter
        lead = self.lead
        if lead is not None:
            buf = self.buf
            if it is not None and self._last_end <= pos:
                # Going on with the running scan: worth it unless no match
                # can start in the next SKIP_GAP bytes it would cross.
                resume = self._last_end + lead.offset
                if buf.find(lead.byte, resume, resume + SKIP_GAP) < 0:
                    at = lead.next_start(buf, max(pos, self._last_end + SKIP_GAP))
                    if at < 0:
                        return None
                    it = None
                    pos = at
            else:
                at = lead.next_start(buf, pos)
                if at < 0:
                    return None
                pos = at
        if it is not None and self._last_end <= pos:
            m = next(it, None)
            if m is None:
                self._last_end = len(self.buf) + 1
                return None
            if m.start() >= pos:
                self._last_end = m.end()
                return m
        it = self._iter = self.pattern.finditer(self.buf, pos, timeout=self.timeout)
        m = next(it, None)
        self._last_end = m.end() if m is not None else len(self.buf) + 1
        return m


def _stops_after(buf: bytes, pos: int, stops: frozenset[int]) -> bool:
    """Whether a fast run must stop after a match ending at ``pos`` (see
    :meth:`Cursor.literal_runs`): the end of the buffer, or a byte in ``stops``."""
    return pos >= len(buf) or buf[pos] in stops


def _split_run(
    buf: bytes, pos: int, limit: int, word: bytes, literal: bytes, emit: Callable[[bytes], object]
) -> tuple[int, int]:
    """Replace the occurrences of ``word`` (a pure-literal rule) that start
    in ``buf[pos:limit]`` by ``literal``: one ``bytes.split`` instead of a
    regex scan and a Python step per match.  For a fixed string, leftmost
    non-overlapping matches from ``pos`` are exactly the pieces ``split``
    cuts, and the slice taken ends ``len(word) - 1`` bytes past ``limit``
    so that no match starting before ``limit`` is cut.  Returns (the
    position after the last match, the number of matches); nothing is
    emitted past that position."""
    segment = buf[pos : limit + len(word) - 1]
    pieces = segment.split(word)
    count = len(pieces) - 1
    if not count:
        return pos, 0
    tail = pieces.pop()
    emit(literal.join(pieces))
    emit(literal)
    return pos + len(segment) - len(tail), count


class _SingleCursor:
    """One rule: its own pattern's next match."""

    __slots__ = ("_stream", "_rule", "_ngroups", "_loops", "_word")

    def __init__(
        self, stream: _RuleStream, rule: int, ngroups: int, loops: frozenset[int], word: bytes | None
    ) -> None:
        self._stream = stream
        self._rule = rule
        self._ngroups = ngroups
        self._loops = loops
        self._word = word  # the rule's pattern when it is a pure literal

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        matched: set[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
        stops: frozenset[int] | None = None, stop_rule: int = -1,
    ) -> tuple[int, int]:
        """See :meth:`Cursor.literal_runs`: one ``finditer`` loop, no merging."""
        stream = self._stream
        literal = literals[self._rule]
        if literal is None or stream.empty_ok:
            return pos, 0
        buf = stream.buf
        if self._rule == stop_rule:
            return pos, 0
        if self._word is not None and stops is None:
            pos, count = _split_run(buf, pos, stop, self._word, literal, emit)
            if count:
                matched.add(self._rule)
            return pos, count
        count = 0
        for m in stream.pattern.finditer(buf, pos, timeout=stream.timeout):
            start = m.start()
            if start >= stop:
                break
            if start > pos:
                emit(buf[pos:start])
            emit(literal)
            pos = m.end()
            count += 1
            if stops is not None and _stops_after(buf, pos, stops):
                break
        if count:
            matched.add(self._rule)
        return pos, count

    def find(self, pos: int) -> Found | None:
        """The rule's first match at or after ``pos``."""
        m = self._stream.next_from(pos)
        if m is None:
            return None
        return Found(m.start(), m.end(), self._rule, m, 0, self._ngroups, self._loops)


def _advance(
    heap: list[tuple[int, int, regex.Match[bytes]]], streams: dict[int, _RuleStream], pos: int
) -> None:
    """Bring every heap entry that starts before ``pos`` up to its rule's
    next match from ``pos`` (or drop it): the heap's top is then the first
    match from ``pos``."""
    while heap and heap[0][0] < pos:
        rule = heap[0][1]
        m = streams[rule].next_from(pos)
        if m is None:
            heapq.heappop(heap)
        else:
            heapq.heapreplace(heap, (m.start(), rule, m))


class _HeapCursor:
    """Merges the rules' own next matches by (start, rule index).

    A rule's cached next match stays valid while the scan position has not
    passed its start (the match found from an earlier position is also the
    leftmost from any later position up to its start), so each rule is
    searched again only when the scan moves past its cached match.
    """

    __slots__ = ("_streams", "_ngroups", "_loops", "_heap", "_started", "_make", "_words")

    def __init__(
        self,
        make: Callable[[int], dict[int, _RuleStream]],
        ngroups: Sequence[int],
        loops: Sequence[frozenset[int]],
        words: Sequence[bytes | None],
    ) -> None:
        #: Per rule: its pattern when it is a pure literal (see _split_run).
        self._words = words
        # ``make(pos)`` gives the streams of the rules that may match from pos.
        self._make = make
        self._streams: dict[int, _RuleStream] = {}
        self._ngroups = ngroups
        self._loops = loops
        self._heap: list[tuple[int, int, regex.Match[bytes]]] = []
        self._started = False

    def _start(self, pos: int) -> None:
        self._started = True
        heap = self._heap
        streams = self._streams = self._make(pos)
        for rule, stream in streams.items():
            m = stream.next_from(pos)
            if m is not None:
                heap.append((m.start(), rule, m))
        heapq.heapify(heap)

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        matched: set[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
        stops: frozenset[int] | None = None, stop_rule: int = -1,
    ) -> tuple[int, int]:
        """See :meth:`Cursor.literal_runs`: the merge of :meth:`find`
        without a ``Found`` per match, for the common case of domain and id
        swaps."""
        if not self._started:
            self._start(pos)
        heap = self._heap
        streams = self._streams
        words = self._words
        count = 0
        heapreplace = heapq.heapreplace
        while heap:
            start, rule, m = heap[0]
            if start < pos:
                m = streams[rule].next_from(pos)
                if m is None:
                    heapq.heappop(heap)
                else:
                    heapreplace(heap, (m.start(), rule, m))
                continue
            if start >= stop:
                break
            literal = literals[rule]
            end = m.end()
            if literal is None or end == start or rule == stop_rule:
                break
            if start > pos:
                emit(m.string[pos:start])
            word = words[rule]
            if word is not None and stops is None:
                # The rule's matches up to the next one of another rule
                # (strictly before it: the other may win a tie) all come
                # first in the merge: take them in one split.
                bound = stop
                if len(heap) > 1:
                    bound = min(bound, heap[1][0], heap[2][0] if len(heap) > 2 else bound)
                # A tie at ``start`` (a later rule) leaves just this match.
                bound = max(bound, start + 1)
                pos, taken = _split_run(m.string, start, bound, word, literal, emit)
                count += taken
                streams[rule].forget()
            else:
                emit(literal)
                pos = end
                count += 1
            matched.add(rule)
            if stops is not None and _stops_after(m.string, pos, stops):
                break
        return pos, count

    def find(self, pos: int) -> Found | None:
        """The first match at or after ``pos``: leftmost, then lowest rule index."""
        heap = self._heap
        if not self._started:
            self._start(pos)
        streams = self._streams
        _advance(heap, streams, pos)
        if not heap:
            return None
        start, rule, m = heap[0]
        return Found(start, m.end(), rule, m, 0, self._ngroups[rule], self._loops[rule])


class _Reach:
    """Per-rule facts for the hold-back question, computed once per rule set.

    The probe pattern is compiled on first use: with many rules most are
    never probed (no occurrence of their prefix near a buffer's end).  An
    exact rule (:func:`.hsindex.exact_widths`) needs no probe: ``seqs``, its
    matches as byte-set sequences, answer the question directly (compiling
    the probes of 1000 realistic rules took 3.8 s).
    """

    __slots__ = (
        "_source", "_probe", "prefix", "width", "bounded", "eaten", "key", "other", "seqs", "longest",
        "linear", "_tail",
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
        self.width = max_width(parsed.tree)
        self.bounded = bounded_width(parsed.tree)
        self.eaten = repeat_bytes(parsed.tree)
        # Rules with the same key share the floor computation of a buffer.
        self.key = (self.width, self.bounded, self.eaten)
        # Finds, backwards, a byte that no unbounded repeat of the rule eats.
        self.other: regex.Pattern[bytes] | None = None
        if self.width is None and len(self.eaten) < 256:
            other = set_source(frozenset(range(256)) - self.eaten)
            self.other = regex.compile(("(?r)" + other).encode("latin-1"), FLAGS)

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
        """The rule's probe (see ``dialect.to_regex_source``), compiled once."""
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


_Where = tuple[int, int, int]


class _FloorPlan:
    """How to find the floors of a set of active rules, grouped, per buffer.

    Rules that share their floor computation (``where``: ``(0, width, 0)``
    for bounded width; ``(1, 0, 0)`` when their repeats eat any byte;
    ``(2, j, k)`` for the ``k``-th mark of backward walk ``j``) and their
    tail test form a group.  The tail test (``key``) says whether a rule can
    reach past the end from before the end: None, always probe; bytes, a
    literal prefix every match starts with; a set, the bytes a match can
    start with.  ``walks``: per set of bytes that unbounded repeats eat,
    the backward pattern for the other bytes and how many of them to find.
    """

    __slots__ = ("walks", "literal", "literal_order", "others", "trie", "lowest", "lowest_literal")

    def __init__(
        self,
        walks: list[tuple[regex.Pattern[bytes], int]],
        groups: dict[tuple[_Where, bytes | frozenset[int] | None], list[int]],
    ) -> None:
        self.walks = walks
        #: Literal key -> its groups (where, rules); and all of them by first rule.
        self.literal: dict[bytes, list[tuple[_Where, list[int]]]] = {}
        self.literal_order: list[tuple[int, bytes, _Where]] = []
        #: Groups without a literal key.
        self.others: list[tuple[_Where, frozenset[int] | None, list[int]]] = []
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

    def _lowest(self, wheres: Iterable[_Where]) -> tuple[int, bool, dict[int, int]]:
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


class _HoldCursor:
    """Answers "where could a match still need more data" for one buffer.

    For each rule, the leftmost position ``>= lo`` from which one of its
    paths, tried before any real match at that position, runs off the end
    of the buffer.  A rule's path can only get there from a position above
    its *floor*: the end of the buffer minus what the rule can consume
    (bytes its unbounded repeats can eat are not counted); and, when the
    rule starts with fixed bytes, only from where those bytes are.

    A rule that cannot match empty gets there from a position before the
    end only by consuming its first bytes there (just the first one at the
    last position); at the end itself every path of it waits.  So a rule
    with no such place above its floor reaches exactly the end (and is not
    probed; ``_end_rule`` is the first of them), and for the others the
    first such place is a lower bound of where they reach.  The heap holds
    (position, rule, exact): lower bounds are made exact only when they
    come first, so with many rules few are ever probed.
    """

    def __init__(
        self,
        buf: bytes,
        pos: int,
        timeout: float | None,
        scanner: RegexScanner,
        active: Sequence[int],
    ) -> None:
        n = self._begin(buf, timeout, scanner)
        plan = scanner.floor_plan(active)
        # Walking back from the end over bytes that a rule's unbounded repeats
        # may eat, count the others: at most ``bounded`` of them fit in one
        # path.  One walk serves all rules whose repeats eat the same bytes.
        all_marks: list[list[int]] = []
        for other, need in plan.walks:
            found = other.finditer(buf, pos, n, timeout=timeout)
            all_marks.append([m.start() for m in itertools.islice(found, need)])

        def floor_of(where: _Where) -> int:
            kind, a, b = where
            if kind == 0:
                return max(pos, n - a - 1)
            if kind == 1:
                return pos  # its repeats eat any byte
            marks = all_marks[a]
            return max(pos, marks[b]) if b < len(marks) else pos

        def lowest(summary: tuple[int, bool, dict[int, int]]) -> int:
            width, anything, deepest = summary
            low = n + 1
            if width >= 0:
                low = max(pos, n - width - 1)
            if anything:
                low = pos
            for j, b in deepest.items():
                low = min(low, floor_of((2, j, b)))
            return low

        #: No path starting below ``floor`` can run off the end.
        self.floor = lowest(plan.lowest)
        # Heap entries (position, rule, what): what is EXACT (the rule's
        # reach), BOUND (a lower bound of it) or the index of a group in
        # ``groups`` (a lower bound for all its rules, expanded on demand).
        groups: list[tuple[int, list[int]]] = []
        heap: list[tuple[int, int, int]] = []
        relevant: set[tuple[bytes, _Where]] = set()
        end_rule: int | None = None
        low_literal = lowest(plan.lowest_literal)
        if n - low_literal <= TRIE_SPAN:
            places = plan.trie.places(buf, low_literal)
        else:  # a long stretch: every literal group may reach from its floor
            places = {key: [] for key in plan.literal}
        # Many literal groups share a floor computation (``where``): with
        # 1000 rules this loop runs for dozens of keys per buffer.
        floor_cache: dict[_Where, int] = {}
        literal = plan.literal
        for key, where_list in places.items():
            for where, rules in literal[key]:
                floor = floor_cache.get(where)
                if floor is None:
                    floor = floor_cache[where] = floor_of(where)
                if where_list:
                    # Places are in increasing order: the first at or above the floor.
                    if where_list[-1] < floor:
                        continue
                    first = where_list[0]
                    if first < floor:
                        first = where_list[bisect.bisect_left(where_list, floor)]
                else:
                    first = floor
                relevant.add((key, where))
                heap.append((first, rules[0], len(groups)))
                groups.append((floor, rules))
        for first_rule, key, where in plan.literal_order:
            if (key, where) not in relevant:
                end_rule = first_rule
                break
        last_seen: dict[frozenset[int], int] = {}
        for where, members, rules in plan.others:
            floor = floor_of(where)
            if members is not None:
                last = last_seen.get(members)
                if last is None:
                    m = scanner.tail_pattern(members).search(buf, floor, n, timeout=timeout)
                    last = m.start() if m is not None else -1
                    if m is not None:
                        last_seen[members] = last
                if last < floor:
                    if end_rule is None or rules[0] < end_rule:
                        end_rule = rules[0]
                    continue
            heap.append((floor, rules[0], len(groups)))
            groups.append((floor, rules))
        heapq.heapify(heap)
        self._floors: dict[int, int] = {}
        self._groups = groups
        self._heap = heap
        self._end_rule = end_rule

    def _begin(self, buf: bytes, timeout: float | None, scanner: RegexScanner) -> int:
        """What every hold cursor keeps; returns the buffer's length."""
        self._buf = buf
        self._timeout = timeout
        self._reach = scanner.reaches
        return len(buf)

    def _expand(self, s: int, what: int) -> None:
        """Replace the group entry ``what`` (bound ``s``) by an entry for its
        first rule and one for the group of the others: the heap pops them
        in the same order as one entry per rule, and most groups are done
        with at their first rule.  (Measured against one entry per rule,
        realistic 1000-rule set in 1 KiB feeds: jQuery 10.1 -> 9.6 ms,
        the 20 KB page 0.85 -> 0.84 ms; 10 rules the same.)"""
        floor, rules = self._groups[what]
        heap = self._heap
        self._floors[rules[0]] = floor
        heapq.heappush(heap, (s, rules[0], BOUND))
        if len(rules) > 1:
            heapq.heappush(heap, (s, rules[1], len(self._groups)))
            self._groups.append((floor, rules[1:]))

    def _rule_reach(self, rule: int, start: int) -> int | None:
        """Leftmost position ``>= start`` where rule ``rule`` runs off the end."""
        return _reach_from(self._reach[rule], self._buf, max(start, self._floors[rule]), self._timeout)

    def _settle(self, lo: int) -> None:
        """Make the first heap entry exact and at or after ``lo``."""
        heap = self._heap
        while heap:
            s, rule, what = heap[0]
            if what == EXACT and s >= lo:
                return
            if what >= 0:
                heapq.heappop(heap)
                self._expand(s, what)
                continue
            reach = self._rule_reach(rule, max(lo, s))
            if reach is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (reach, rule, EXACT))

    def hold_point(self, lo: int, found: Found | None) -> int | None:
        """Leftmost position from ``lo`` whose match may need more bytes.

        Positions before ``found.start`` count for every rule (no real match
        starts there); at ``found.start`` only rules up to ``found.rule``
        (for that rule, a path of higher Perl priority than the match).
        """
        n = len(self._buf)
        heap = self._heap
        self._settle(lo)
        end_rule = self._end_rule
        if heap:
            s = heap[0][0]
            if end_rule is not None and n < s:
                s = n
        elif end_rule is not None:
            s = n
        else:
            return None
        if found is None:
            return s if s <= n else None
        if s < found.start:
            return s
        if s > found.start:
            return None
        # Ties at the match's start: is one of them a rule of priority?
        for t, first, what in [e for e in heap if e[0] == s and e[1] <= found.rule]:
            if what == EXACT:
                return s
            if what == BOUND:
                rules: Sequence[int] = [first]
            else:
                floor, rules = self._groups[what]
                for rule in rules:
                    self._floors[rule] = floor
            for rule in rules:
                if rule <= found.rule and self._rule_reach(rule, t) == t:
                    return s
        if s == n and end_rule is not None and end_rule <= found.rule:
            return s
        return None


class _EventCursor:
    """Matches from a :class:`~.hsindex.MatchIndex`: one pass over the
    buffer gives every match of the exact rules; the other rules that may
    match (the index's prefilter says which, and from where) run their own
    scans and merge in a heap as in :class:`_HeapCursor`.  The order is
    the same: (start, rule)."""

    __slots__ = (
        "_scanner", "_buf", "_timeout", "_mask", "_exact", "_i", "_heap", "_streams", "_started", "_confirm",
        "_checks",
    )

    def __init__(
        self, scanner: RegexScanner, buf: bytes, timeout: float | None, active: Sequence[int]
    ) -> None:
        self._scanner = scanner
        self._buf = buf
        self._timeout = timeout
        self._mask = None if len(active) == len(scanner.patterns) else scanner.mask(active)
        self._exact: list[hsindex.Report] = []
        self._i = 0
        self._confirm: Callable[[bytes, int, int], bool] | None = None
        self._checks: list[tuple[bytes, bool]] = []
        self._heap: list[tuple[int, int, regex.Match[bytes]]] = []
        self._streams: dict[int, _RuleStream] = {}
        self._started = False

    def _start(self, pos: int) -> None:
        self._started = True
        sc = self._scanner
        index = sc.index
        assert index is not None
        buf = self._buf
        timeout = self._timeout
        events = index.events(buf, pos, self._mask)
        self._exact = events.exact
        self._confirm = index.confirm
        self._checks = index.checks
        streams = self._streams
        lasts = events.lasts
        for rule, at in events.candidates.items():
            streams[rule] = sc.stream(buf, timeout, rule, at, lasts[rule])
        heap = self._heap
        for rule, stream in streams.items():
            m = stream.next_from(pos)
            if m is not None:
                heap.append((m.start(), rule, m))
        heapq.heapify(heap)

    def _next(self, pos: int) -> tuple[int, int, int, regex.Match[bytes] | None] | None:
        """The first match from ``pos``: (start, rule, end, match or None
        for an exact one)."""
        if not self._started:
            self._start(pos)
        exact = self._exact
        i = self._i
        confirm = self._confirm
        assert confirm is not None
        buf = self._buf
        # (A report that is not a match is passed for good.)
        while i < len(exact) and (exact[i][0] < pos or (exact[i][3] and not confirm(buf, exact[i][0], exact[i][3]))):
            i += 1
        self._i = i
        heap = self._heap
        streams = self._streams
        _advance(heap, streams, pos)
        if i < len(exact):
            start, rule, end, _check = exact[i]
            if not heap or (start, rule) < heap[0][:2]:
                return start, rule, end, None
        if heap:
            start, rule, m = heap[0]
            return start, rule, m.end(), m
        return None

    def find(self, pos: int) -> Found | None:
        """The first match at or after ``pos``: leftmost, then lowest rule index."""
        nxt = self._next(pos)
        if nxt is None:
            return None
        start, rule, end, m = nxt
        sc = self._scanner
        ngroups = sc.ngroups[rule]
        if m is None:
            if ngroups:
                # The span is known; the groups come from the rule itself, if read.
                m = _SpanMatch(self._buf, sc.patterns[rule], start, end, self._timeout)
            else:
                m = _LiteralMatch(self._buf, start, end)
        return Found(start, end, rule, m, 0, ngroups, sc.loops[rule])

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        matched: set[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
        stops: frozenset[int] | None = None, stop_rule: int = -1,
    ) -> tuple[int, int]:
        """See :meth:`Cursor.literal_runs`: exact rules' matches also by
        their remembered expansion.  The exact rules' reports are walked in
        place up to the next match of another rule (the common case: the
        page's host names one after another)."""
        if not self._started:
            self._start(pos)
        buf = self._buf
        exact = self._exact
        n_exact = len(exact)
        heap = self._heap
        streams = self._streams
        i = self._i
        checks = self._checks
        n = len(buf)
        count = 0
        while True:
            _advance(heap, streams, pos)
            if heap:
                h_start, h_rule = heap[0][0], heap[0][1]
            else:
                h_start, h_rule = n + 1, 0
            while i < n_exact:
                start, rule, end, check = exact[i]
                if start < pos:
                    i += 1
                    continue
                if start > h_start or (start == h_start and rule > h_rule):
                    break  # the other rule's match comes first
                if check:  # a report to confirm (MatchIndex.confirm, inlined)
                    key, caseless = checks[check]
                    if not (buf[start : start + len(key)].lower() == key if caseless else buf.startswith(key, start)):
                        i += 1
                        continue
                literal = literals[rule]
                if literal is None and memo is not None:
                    literal = memo.get((rule, buf[start:end]))
                if start >= stop or literal is None or rule == stop_rule:
                    self._i = i
                    return pos, count
                if start > pos:
                    emit(buf[pos:start])
                emit(literal)
                pos = end
                count += 1
                matched.add(rule)
                i += 1
                if stops is not None and (pos >= n or buf[pos] in stops):  # _stops_after, inlined
                    self._i = i
                    return pos, count
            self._i = i
            if not heap:
                return pos, count
            start, rule, m = heap[0]
            if start < pos:
                continue  # passed by the exact matches just taken: advance it first
            end = m.end()
            literal = literals[rule]
            if start >= stop or literal is None or end == start or rule == stop_rule:
                return pos, count
            if start > pos:
                emit(buf[pos:start])
            emit(literal)
            pos = end
            count += 1
            matched.add(rule)
            if stops is not None and _stops_after(buf, pos, stops):
                return pos, count


class _EventHoldCursor(_HoldCursor):
    """:class:`_HoldCursor` with its lower bounds from the match index: for
    the bounded-width rules its tail trie, for a few unbounded ones its
    prefix-closure scan (one pass for all of them); the rule's probe, or its
    byte-set sequences, make a bound exact only when it comes first.  Other
    unbounded rules keep a rule-by-rule cursor of their own; the hold point
    is the nearer of the two."""

    def __init__(
        self,
        buf: bytes,
        pos: int,
        timeout: float | None,
        scanner: RegexScanner,
        active: Sequence[int],
    ) -> None:
        n = self._begin(buf, timeout, scanner)
        index = scanner.index
        assert index is not None
        mask = None if len(active) == len(scanner.patterns) else scanner.mask(active)
        # Bounded rules: one group entry per trie node that may be alive.
        heap: list[tuple[int, int, int]] = [
            (s, rule, BOUND) for rule, s in index.alive(buf, pos).items() if mask is None or mask[rule]
        ]
        groups: list[tuple[int, list[int]]] = []
        trie = index.tail
        for at, node, ended in trie.places(buf, pos):
            rules = trie.below[node] if ended else trie.opened[node]
            if mask is not None:
                rules = [r for r in rules if mask[r]]
                if not rules:
                    continue
            heap.append((at, rules[0], len(groups)))
            groups.append((at, rules))
        heapq.heapify(heap)
        unbounded = [r for r in index.unbounded if mask is None or mask[r]]
        self._rest = _HoldCursor(buf, pos, timeout, scanner, unbounded) if unbounded else None
        #: No path starting below ``floor`` can run off the end.
        self.floor = heap[0][0] if heap else n
        if self._rest is not None:
            self.floor = min(self.floor, self._rest.floor)
        self._floors: dict[int, int] = collections.defaultdict(int)
        self._groups = groups
        self._heap = heap
        # Every rule bounded here may still start a match at the very end.
        first = next((r for r in index.bounded_rules if mask is None or mask[r]), None)
        self._end_rule = first

    def hold_point(self, lo: int, found: Found | None) -> int | None:
        """See :meth:`_HoldCursor.hold_point`: the nearer of the trie's and
        the unbounded rules' answers."""
        mine = super().hold_point(lo, found)
        if self._rest is None:
            return mine
        theirs = self._rest.hold_point(lo, found)
        if mine is None:
            return theirs
        return mine if theirs is None else min(mine, theirs)


def _marked(m: regex.Match[bytes] | LinearMatch) -> bool:
    """Whether a probe's match went through an end-of-buffer mark."""
    if isinstance(m, LinearMatch):
        return m.marked()
    return m.group(PROBE_GROUP) is not None


def _reach_from(r: _Reach, buf: bytes, start: int, timeout: float | None) -> int | None:
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
            if m is not None and _marked(m):
                return s
            start = s + 1
        return None
    match = r.probe.match
    prefix = r.prefix
    if prefix:
        k = len(prefix)
        i = buf.find(prefix, start, n)
        while i >= 0 and i <= n - k:
            m = match(buf, i, timeout=timeout)
            if m is not None and _marked(m):
                return i
            i = buf.find(prefix, i + 1, n)
        # A prefix cut by the end of the buffer: only where what is left
        # begins the prefix.  From the very end every path must wait.
        for i in range(max(start, n - k + 1), n):
            if prefix.startswith(buf[i:n]):
                m = match(buf, i, timeout=timeout)
                if m is not None and _marked(m):
                    return i
        return n if start <= n else None
    search = r.probe.search
    while start <= n:
        m = search(buf, start, timeout=timeout)
        if m is None:
            return None
        if _marked(m):
            return m.start()
        start = m.start() + 1
    return None


#: A rule set with a rule on the sregex-order VM finds all its matches on one
#: VM program of its active rules, as the module does, up to this many rules
#: (above it, each rule on its own: see :class:`_SetCursor`).
VM_SET_MAX = 64


class _SetCursor:
    """The active rules as the module's one program (``pikevm.PikePattern``
    of them all): another rule's match clears a flagged rule's threads of
    lower priority, which decides whether sregex's late assertion test drops
    its match (``^\\s+|\\s+$`` beside ``\\n`` on ``!\\n  \\nx`` gives
    Perl's ``\\n  ``, alone the module's ``  \\n``)."""

    __slots__ = ("_pattern", "_rules", "_buf", "_ngroups", "_loops")

    def __init__(self, scanner: RegexScanner, buf: bytes, rules: Sequence[int]) -> None:
        self._pattern = scanner.set_pattern(rules)
        self._rules = rules
        self._buf = buf
        self._ngroups = scanner.ngroups
        self._loops = scanner.loops

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        matched: set[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
        stops: frozenset[int] | None = None, stop_rule: int = -1,
    ) -> tuple[int, int]:
        """No fast run: :meth:`find` takes every match."""
        return pos, 0

    def find(self, pos: int) -> Found | None:
        """The program's first match from ``pos``."""
        m = self._pattern.search(self._buf, pos)
        if m is None:
            return None
        rule = self._rules[m.rule]
        start, end = m.span()
        return Found(start, end, rule, m, 0, self._ngroups[rule], self._loops[rule])


class _SetHoldCursor:
    """The hold-back question for :class:`_SetCursor`: the rules' own floor
    (no path from below it reaches the end, whatever the order), then the
    program run without the end of the text (``pikevm.PikeProbe``)."""

    __slots__ = ("floor", "_probe", "_buf")

    def __init__(self, scanner: RegexScanner, buf: bytes, pos: int, timeout: float | None, rules: Sequence[int]) -> None:
        self.floor = _HoldCursor(buf, pos, timeout, scanner, rules).floor
        self._probe = PikeProbe(scanner.set_pattern(rules))
        self._buf = buf

    def hold_point(self, lo: int, found: Found | None) -> int | None:
        """See :meth:`HoldCursor.hold_point`."""
        reached = self._probe.search(self._buf, max(lo, self.floor))
        if reached is None:
            return None
        at = reached.start()
        return at if found is None or at <= found.start else None


#: How :class:`RegexScanner` picks the engine of each rule: ``auto`` puts on
#: RE2 exactly the rules ``regex`` cannot bound (``dialect.backtracking_risk``);
#: ``all`` and ``none`` force one engine.  Measured (16 KiB feeds,
#: median of 5 interleaved runs): every rule on RE2 took 1.01-1.13x the time
#: of ``auto`` on the realistic and synthetic 1-1000-rule sets.
LINEAR_MODES = ("auto", "all", "none")


def _linear_reason(parsed: ParsedRegex, mode: str) -> str | None:
    """Why a rule runs on RE2 under ``mode``, or None."""
    if mode == "none":
        return None
    if mode == "all":
        return "every rule runs on RE2"
    if mode != "auto":
        raise ValueError(f"linear must be one of {LINEAR_MODES}, not {mode!r}")
    why = backtracking_risk(parsed.tree)
    return None if why is None else f"regex could backtrack: {why}"


class RegexScanner:
    """The ``regex``-package scanner: one pattern and one probe per rule,
    on RE2 for the rules ``regex`` cannot run in bounded time."""

    def __init__(
        self, parsed: Sequence[ParsedRegex], engine: str | None = None, linear: str = "auto"
    ) -> None:
        self._ngroups = [p.ngroups for p in parsed]
        #: Per rule: why it runs on the linear engine (RE2), or None for
        #: ``regex``; and why RE2 could not take a rule that needs it.
        self.linear: list[str | None] = []
        self.linear_refused: dict[int, str] = {}
        self.sources: list[str] = []
        self.patterns: list[regex.Pattern[bytes] | LinearPattern | PikePattern] = []
        for k, p in enumerate(parsed):
            why = _linear_reason(p, linear)
            if why is not None:
                source = to_re2_source(p.tree)
                try:
                    self.patterns.append(LinearPattern(source))
                except LinearError as exc:
                    self.linear_refused[k] = str(exc)
                    why = None
                else:
                    self.sources.append(source)
                    self.linear.append(why)
                    continue
            self.linear.append(None)
            self.sources.append(to_regex_source(p.tree, caseless=p.caseless))
            self.patterns.append(regex.compile(self.sources[-1].encode("latin-1"), FLAGS))
        #: Per rule: why its matches (and its hold-back probe's answers,
        #: ``_Reach.use_vm``) come from the sregex-order VM (see
        #: :mod:`.pikevm`), or None.
        self.vm = [order_reason(p) for p in parsed]
        #: Whether any rule is on the VM (most sets have none: no per-feed test).
        self._any_vm = any(v is not None for v in self.vm)
        self._parsed = list(parsed)
        self._set_patterns: dict[tuple[int, ...], PikePattern] = {}
        for k, why_vm in enumerate(self.vm):
            if why_vm is not None:
                self.patterns[k] = PikePattern(parsed[k])
        #: Per rule: its match widths when it is exact (see hsindex.exact_widths).
        self.widths = [hsindex.exact_widths(p) for p in parsed]
        self.reaches = [
            _Reach(p, w is not None, why is not None)
            for p, w, why in zip(parsed, self.widths, self.linear, strict=True)
        ]
        for k, why_vm in enumerate(self.vm):
            if why_vm is not None:
                pattern = self.patterns[k]
                assert isinstance(pattern, PikePattern)
                self.reaches[k].use_vm(pattern)
        # (A rule on the VM is searched anew from each position, as the
        # module restarts there: see _RuleStream.)
        self._empty_ok = [can_match_empty(p.tree) or v is not None for p, v in zip(parsed, self.vm, strict=True)]
        self._loops = [empty_loop_groups(p.tree) for p in parsed]
        #: Per rule: the bytes it matches when it is a pure literal.
        self.words = [pure_literal(p.tree) for p in parsed]
        #: Per rule: its literal when it has no groups either (see _RuleStream).
        self._finds = [w if p.ngroups == 0 else None for w, p in zip(self.words, parsed, strict=True)]
        #: Per rule: the fixed bytes all its matches start with, when it is
        #: scanned by ``finditer`` (see _RuleStream.next_from).
        self._leads = [
            _Lead(r.prefix) if r.prefix and f is None and not e else None
            for r, f, e in zip(self.reaches, self._finds, self._empty_ok, strict=True)
        ]
        self._plans: dict[tuple[int, ...], _FloorPlan] = {}
        #: The multi-pattern prefilter (None: every rule scans every buffer).
        self.engine = prefilter.ENGINE if engine is None else engine
        self.filter: prefilter.RuleFilter | None = None
        #: With the ``hyperscan`` engine: where all rules match, in one scan.
        self.index: hsindex.MatchIndex | None = None
        if len(parsed) >= FILTER_MIN_RULES and self.engine == "hyperscan":
            self.index = hsindex.MatchIndex(parsed, self.widths)
        elif len(parsed) >= FILTER_MIN_RULES and self.engine != "none":
            self.filter = prefilter.make_filter(parsed, self.engine)
        self._masks: dict[tuple[int, ...], list[bool]] = {}
        # Compile now what a scan may need, so that no request pays for it
        # (and no scan timeout counts it): the probes of the rules that are
        # not exact (exact ones need none).
        for reach in self.reaches:
            if reach.seqs is None:
                reach.probe  # noqa: B018 - compiled on first access
        # For the hold-back question: rules that cannot match empty get past
        # the end only through one of their first bytes (see _HoldCursor).
        self.tail_keys: list[bytes | frozenset[int] | None] = []
        for p, r in zip(parsed, self.reaches, strict=True):
            if can_match_empty(p.tree):
                self.tail_keys.append(None)
            elif len(r.prefix) >= 2:
                self.tail_keys.append(r.prefix[:8])
            else:
                self.tail_keys.append(first_bytes(p.tree))
        self._tail_patterns: dict[frozenset[int], regex.Pattern[bytes]] = {}

    @property
    def ngroups(self) -> list[int]:
        """Per rule: its number of capture groups."""
        return self._ngroups

    @property
    def loops(self) -> list[frozenset[int]]:
        """Per rule: its groups inside repeats that can match empty."""
        return self._loops

    def stream(
        self, buf: bytes, timeout: float | None, rule: int, start: int = 0, last: int | None = None
    ) -> _RuleStream:
        """A fresh match stream of one rule over ``buf`` (no match starts
        before ``start`` nor after ``last``)."""
        return _RuleStream(
            buf, timeout, self.patterns[rule], self._empty_ok[rule], start, self._finds[rule], self._leads[rule],
            len(buf) if last is None else last,
        )

    def mask(self, active: Sequence[int]) -> list[bool]:
        """Per rule, whether it is in ``active`` (cached per subset)."""
        key = tuple(active)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) >= 64:  # many rule subsets: stay bounded
                self._masks.clear()
            mask = self._masks[key] = [False] * len(self.patterns)
            for rule in key:
                mask[rule] = True
        return mask

    def tail_pattern(self, members: frozenset[int]) -> regex.Pattern[bytes]:
        """A backward search for one byte of ``members`` (compiled once per set)."""
        pat = self._tail_patterns.get(members)
        if pat is None:
            src = "(?r)" + set_source(members)
            pat = self._tail_patterns[members] = regex.compile(src.encode("latin-1"), FLAGS)
        return pat

    def floor_plan(self, active: Sequence[int]) -> _FloorPlan:
        """How to find the floors of ``active`` rules (cached per rule subset)."""
        key = tuple(active)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        walk_index: dict[frozenset[int], int] = {}
        walks: list[tuple[regex.Pattern[bytes], int]] = []
        groups: dict[tuple[_Where, bytes | frozenset[int] | None], list[int]] = {}
        for rule in key:
            r = self.reaches[rule]
            where: _Where
            if r.width is not None:
                where = (0, r.width, 0)
            elif r.other is None:
                where = (1, 0, 0)
            else:
                j = walk_index.get(r.eaten)
                if j is None:
                    j = walk_index[r.eaten] = len(walks)
                    walks.append((r.other, 0))
                k = r.bounded + 1
                other, need = walks[j]
                walks[j] = (other, max(need, k + 1))
                where = (2, j, k)
            groups.setdefault((where, self.tail_keys[rule]), []).append(rule)
        if len(self._plans) >= 64:  # many rule subsets: stay bounded
            self._plans.clear()
        plan = self._plans[key] = _FloorPlan(walks, groups)
        return plan

    def cursor(
        self, buf: bytes, timeout: float | None, active: Sequence[int] | None = None
    ) -> Cursor:
        """A match cursor over ``buf`` for ``active`` rules (default: all)."""
        rules = range(len(self.patterns)) if active is None else active
        if self._set_vm(rules):
            return _SetCursor(self, buf, rules)
        stream = self.stream
        if len(rules) == 1:
            rule = rules[0]
            return _SingleCursor(
                stream(buf, timeout, rule), rule, self._ngroups[rule], self._loops[rule], self.words[rule]
            )
        if self.index is not None:
            return _EventCursor(self, buf, timeout, rules)
        filt = self.filter if len(rules) >= FILTER_MIN_RULES else None

        def make(pos: int) -> dict[int, _RuleStream]:
            if filt is None:
                return {rule: stream(buf, timeout, rule) for rule in rules}
            may = filt.candidates(buf, pos, timeout)
            if len(rules) == len(self.patterns):  # every rule is active
                chosen: Iterable[int] = may
            else:
                chosen = may.keys() & set(rules)
            return {rule: stream(buf, timeout, rule, may[rule]) for rule in chosen}

        return _HeapCursor(make, self._ngroups, self._loops, self.words)

    def hold_cursor(
        self, buf: bytes, pos: int, timeout: float | None, active: Sequence[int] | None = None
    ) -> _HoldCursor:
        """A hold-back cursor over ``buf`` for ``active`` rules (default: all)."""
        rules = range(len(self.patterns)) if active is None else active
        if self._set_vm(rules):
            return _SetHoldCursor(self, buf, pos, timeout, rules)  # type: ignore[return-value]
        if self.index is not None and len(rules) > 1:
            return _EventHoldCursor(buf, pos, timeout, self, rules)
        return _HoldCursor(buf, pos, timeout, self, rules)

    def _set_vm(self, rules: Sequence[int]) -> bool:
        """Whether ``rules`` (several, one of them flagged) run as one VM program."""
        return self._any_vm and 1 < len(rules) <= VM_SET_MAX and any(self.vm[r] is not None for r in rules)

    def set_pattern(self, rules: Sequence[int]) -> PikePattern:
        """The module's one program of ``rules`` (cached per rule subset)."""
        key = tuple(rules)
        pattern = self._set_patterns.get(key)
        if pattern is None:
            if len(self._set_patterns) >= 16:
                self._set_patterns.clear()
            pattern = self._set_patterns[key] = PikePattern(*(self._parsed[r] for r in key))
        return pattern

    def find(self, buf: bytes, pos: int, timeout: float | None) -> Found | None:
        """One-off ``cursor(buf, timeout).find(pos)`` over all rules."""
        return self.cursor(buf, timeout).find(pos)
