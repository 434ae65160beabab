"""The match cursors: the rule set's first match from a position.

One rule reads its own stream (:class:`SingleCursor`); several merge their
streams' next matches in a heap by (start, rule index), which is exactly the
alternation's order (:class:`HeapCursor`); with a Hyperscan index the exact
rules' matches come from one pass over the buffer and the others merge in
(:class:`EventCursor`); a set with a rule on the sregex-order VM runs as the
module's one program (:class:`SetCursor`).  Each also replaces runs of
matches with fixed replacements without a ``Found`` per match
(``literal_runs``).

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

import regex

from prexy.substitution import hsindex
from prexy.substitution.compiled import CompiledRules
from prexy.substitution.matches import Found, LiteralMatch, RuleTimeout, SpanMatch
from prexy.substitution.rulestream import RuleStream, advance, split_run, stops_after


class SingleCursor:
    """One rule: its own pattern's next match."""

    __slots__ = ("_stream", "_rule", "_ngroups", "_loops", "_word")

    def __init__(
        self, stream: RuleStream, rule: int, ngroups: int, loops: frozenset[int], word: bytes | None
    ) -> None:
        self._stream = stream
        self._rule = rule
        self._ngroups = ngroups
        self._loops = loops
        self._word = word  # the rule's pattern when it is a pure literal

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        counts: list[int], sizes: list[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
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
            pos, count = split_run(buf, pos, stop, self._word, literal, emit)
            if count:
                counts[self._rule] += count
                sizes[self._rule] += count * len(self._word)
            return pos, count
        count = 0
        replaced = 0
        try:
            for m in stream.pattern.finditer(buf, pos, timeout=stream.timeout):
                start = m.start()
                if start >= stop:
                    break
                if start > pos:
                    emit(buf[pos:start])
                emit(literal)
                pos = m.end()
                count += 1
                replaced += pos - start
                if stops is not None and stops_after(buf, pos, stops):
                    break
        except TimeoutError as exc:
            raise RuleTimeout(self._rule) from exc
        if count:
            counts[self._rule] += count
            sizes[self._rule] += replaced
        return pos, count

    def find(self, pos: int) -> Found | None:
        """The rule's first match at or after ``pos``."""
        m = self._stream.next_from(pos)
        if m is None:
            return None
        return Found(m.start(), m.end(), self._rule, m, 0, self._ngroups, self._loops)


class HeapCursor:
    """Merges the rules' own next matches by (start, rule index).

    A rule's cached next match stays valid while the scan position has not
    passed its start (the match found from an earlier position is also the
    leftmost from any later position up to its start), so each rule is
    searched again only when the scan moves past its cached match.
    """

    __slots__ = ("_streams", "_ngroups", "_loops", "_heap", "_started", "_make", "_words")

    def __init__(
        self,
        make: Callable[[int], dict[int, RuleStream]],
        ngroups: Sequence[int],
        loops: Sequence[frozenset[int]],
        words: Sequence[bytes | None],
    ) -> None:
        #: Per rule: its pattern when it is a pure literal (see split_run).
        self._words = words
        # ``make(pos)`` gives the streams of the rules that may match from pos.
        self._make = make
        self._streams: dict[int, RuleStream] = {}
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
        counts: list[int], sizes: list[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
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
                pos, taken = split_run(m.string, start, bound, word, literal, emit)
                count += taken
                counts[rule] += taken
                sizes[rule] += taken * len(word)
                streams[rule].forget()
            else:
                emit(literal)
                pos = end
                count += 1
                counts[rule] += 1
                sizes[rule] += end - start
            if stops is not None and stops_after(m.string, pos, stops):
                break
        return pos, count

    def find(self, pos: int) -> Found | None:
        """The first match at or after ``pos``: leftmost, then lowest rule index."""
        heap = self._heap
        if not self._started:
            self._start(pos)
        streams = self._streams
        advance(heap, streams, pos)
        if not heap:
            return None
        start, rule, m = heap[0]
        return Found(start, m.end(), rule, m, 0, self._ngroups[rule], self._loops[rule])


class EventCursor:
    """Matches from a :class:`~.hsindex.MatchIndex`: one pass over the
    buffer gives every match of the exact rules; the other rules that may
    match (the index's prefilter says which, and from where) run their own
    scans and merge in a heap as in :class:`HeapCursor`.  The order is
    the same: (start, rule)."""

    __slots__ = (
        "_scanner", "_buf", "_timeout", "_mask", "_exact", "_i", "_heap", "_streams", "_started", "_confirm",
        "_checks", "_candidates", "_lasts",
    )

    def __init__(
        self,
        scanner: CompiledRules,
        buf: bytes,
        timeout: float | None,
        mask: Sequence[bool] | None,
    ) -> None:
        """``mask``: per rule, whether it is active (None: all are)."""
        self._scanner = scanner
        self._buf = buf
        self._timeout = timeout
        self._mask = mask
        self._exact: list[hsindex.Report] = []
        self._i = 0
        self._confirm: Callable[[bytes, int, int], bool] | None = None
        self._checks: list[tuple[bytes, bool]] = []
        self._heap: list[tuple[int, int, regex.Match[bytes]]] = []
        self._streams: dict[int, RuleStream] = {}
        self._candidates: Mapping[int, int] = {}
        self._lasts: Mapping[int, int] = {}
        self._started = False

    def candidates(self, pos: int) -> Mapping[int, int]:
        """The prefilter's rules that may match from ``pos`` (see
        :attr:`.hsindex.Events.candidates`), from the scan of the buffer
        this cursor makes anyway.  ``pos`` is where that scan starts: the
        position of the first ``find`` or ``literal_runs`` (or one before
        it, when called first)."""
        if not self._started:
            self._start(pos)
        return self._candidates

    def lasts(self, pos: int) -> Mapping[int, int]:
        """Per rule of :meth:`candidates`: a position after which none of
        its matches starts (:attr:`.hsindex.Events.lasts`)."""
        if not self._started:
            self._start(pos)
        return self._lasts

    def _start(self, pos: int) -> None:
        self._started = True
        sc = self._scanner
        index = sc.index
        assert index is not None
        buf = self._buf
        timeout = self._timeout
        events = index.events(buf, pos, self._mask)
        self._candidates = events.candidates
        self._lasts = events.lasts
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
        advance(heap, streams, pos)
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
                m = SpanMatch(self._buf, sc.patterns[rule], start, end, self._timeout)
            else:
                m = LiteralMatch(self._buf, start, end)
        return Found(start, end, rule, m, 0, ngroups, sc.loops[rule])

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        counts: list[int], sizes: list[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
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
            advance(heap, streams, pos)
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
                counts[rule] += 1
                sizes[rule] += end - start
                i += 1
                if stops is not None and (pos >= n or buf[pos] in stops):  # stops_after, inlined
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
            counts[rule] += 1
            sizes[rule] += end - start
            if stops is not None and stops_after(buf, pos, stops):
                return pos, count


class SetCursor:
    """The active rules as the module's one program (``pikevm.PikePattern``
    of them all): another rule's match clears a flagged rule's threads of
    lower priority, which decides whether sregex's late assertion test drops
    its match (``^\\s+|\\s+$`` beside ``\\n`` on ``!\\n  \\nx`` gives
    Perl's ``\\n  ``, alone the module's ``  \\n``)."""

    __slots__ = ("_pattern", "_rules", "_buf", "_ngroups", "_loops")

    def __init__(self, scanner: CompiledRules, buf: bytes, rules: Sequence[int]) -> None:
        self._pattern = scanner.set_pattern(rules)
        self._rules = rules
        self._buf = buf
        self._ngroups = scanner.ngroups
        self._loops = scanner.loops

    def literal_runs(
        self, pos: int, stop: int, literals: Sequence[bytes | None], emit: Callable[[bytes], object],
        counts: list[int], sizes: list[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
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
