"""One rule's successive matches over a buffer, and the fast runs over them.

:class:`RuleStream` finds a rule's next match from a position with the
cheapest tool that gives the same answer: ``bytes.find`` for a pure literal,
one running ``finditer``, restarted at the next occurrence of the rule's
rarest leading byte (:class:`Lead`) when none is near.  :func:`split_run`
replaces a pure literal's matches with one ``bytes.split``; :func:`advance`
keeps a heap of several streams' next matches current.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

import regex

from prexy.substitution import prefilter
from prexy.substitution.matches import LiteralMatch, RuleTimeout

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


class Lead:
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


class RuleStream:
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
    :class:`Lead`) starts each new scan at the next occurrence of them,
    and drops its running scan for a new one when none is near.  Measured
    on the bench page: ``regex`` took 15-19 µs to cross the 20 KB between
    the two matches of ``UA-\\d+-\\d+``, ``bytes.find`` of its ``U`` 0.6 µs.
    """

    __slots__ = (
        "buf", "timeout", "pattern", "_iter", "_last_end", "empty_ok", "start", "word", "lead", "last", "rule",
    )

    def __init__(
        self,
        buf: bytes,
        timeout: float | None,
        pattern: regex.Pattern[bytes],
        empty_ok: bool,
        start: int = 0,
        word: bytes | None = None,
        lead: Lead | None = None,
        last: int | None = None,
        rule: int = -1,
    ) -> None:
        #: The rule's index, named by the RuleTimeout of a scan past its limit.
        self.rule = rule
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
        try:
            if pos < self.start:
                pos = self.start
            elif pos > self.last:
                return None
            word = self.word
            if word is not None:
                at = self.buf.find(word, pos)
                return None if at < 0 else LiteralMatch(self.buf, at, at + len(word))
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
        except TimeoutError as exc:
            if self.rule < 0 or isinstance(exc, RuleTimeout):
                raise
            raise RuleTimeout(self.rule) from exc


def stops_after(buf: bytes, pos: int, stops: frozenset[int]) -> bool:
    """Whether a fast run must stop after a match ending at ``pos`` (see
    :meth:`Cursor.literal_runs`): the end of the buffer, or a byte in ``stops``."""
    return pos >= len(buf) or buf[pos] in stops


def split_run(
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


def advance(
    heap: list[tuple[int, int, regex.Match[bytes]]], streams: dict[int, RuleStream], pos: int
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
