"""Scanning behind a small interface: where is the next match, what must wait.

The transducer asks a scanner two questions about a buffer:

* ``cursor(buf).find(pos)``: the match the whole rule set makes first from
  ``pos`` (leftmost start, then rule order, then Perl priority inside the
  rule);
* ``hold_point(buf, lo, found)``: the leftmost position where some rule
  could still match if more bytes arrived (its exploration ran off the end of
  the buffer), or None.

:class:`RegexScanner` answers both with the ``regex`` package.  ``find``
runs each rule's own pattern (so each keeps ``regex``'s literal fast path,
which one big alternation loses) and merges their next matches in a heap by
(start, rule index), which is exactly the alternation's order; a rule's
cached next match stays valid until the scan passes its start.  ``hold_point``
runs a probe: all rules in one alternation, rewritten so that at the end of
the buffer any atom may match empty and mark the match (see
``dialect.to_regex_source``); its first success tells where a match could
still need more data.  The probe is only run where it can
matter: a match can only run off the end from a position whose distance to
the end, not counting bytes that unbounded repeats may eat, is within the
rules' bounded width.  A multi-pattern prefilter (issue 4) slots in as
another implementation of :class:`Scanner`.

Every call passes ``timeout=``; a ``TimeoutError`` propagates to the caller.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Protocol

import regex

from prexy.substitution.dialect import (
    PROBE_GROUP,
    ParsedRegex,
    _set_src,
    bounded_width,
    literal_prefix,
    repeat_bytes,
    to_regex_source,
)

__all__ = ["Scanner", "Found", "RegexScanner"]

FLAGS = regex.DOTALL | regex.MULTILINE


class Found:
    """A match: span, the rule that made it, and a way to read its groups."""

    __slots__ = ("start", "end", "rule", "_match", "_offset", "_ngroups")

    def __init__(
        self, start: int, end: int, rule: int, match: regex.Match[bytes], offset: int, ngroups: int
    ) -> None:
        self.start = start
        self.end = end
        self.rule = rule
        self._match = match
        self._offset = offset
        self._ngroups = ngroups

    def group(self, n: int) -> bytes:
        """Group ``n`` of the rule that matched (0: whole match); b"" if unset."""
        if n > self._ngroups:
            return b""
        value = self._match.group(self._offset + n)
        return value if value is not None else b""

    def span(self, n: int) -> tuple[int, int]:
        """Offsets of group ``n`` of the rule that matched; (-1, -1) if unset."""
        if n > self._ngroups:
            return (-1, -1)
        start, end = self._match.span(self._offset + n)
        return (start, end)

    @property
    def ngroups(self) -> int:
        """How many capture groups the matching rule has."""
        return self._ngroups


class Cursor(Protocol):
    """Successive ``find`` calls over one buffer, positions not decreasing."""

    def find(self, pos: int) -> Found | None:
        """The first match at or after ``pos`` (treating the buffer end as final)."""


class Scanner(Protocol):
    """What the transducer needs from a scanner."""

    def cursor(self, buf: bytes, timeout: float | None) -> Cursor:
        """A cursor over ``buf``; every scan it runs passes ``timeout``."""

    def reach_floor(self, buf: bytes, pos: int, timeout: float | None = None) -> int:
        """Lowest start ``>= pos`` whose exploration could reach the end of ``buf``."""

    def hold_point(
        self, buf: bytes, lo: int, found: Found | None, timeout: float | None
    ) -> int | None:
        """Leftmost position from ``lo`` whose match may need more bytes.

        Only positions up to ``found.start`` count (all of ``buf`` if no
        match was found), and at ``found.start`` only rules up to
        ``found.rule``.  ``lo`` must not be below ``reach_floor(buf, pos)``.
        """


class _SingleCursor:
    """One rule: its own pattern's next match."""

    __slots__ = ("_buf", "_timeout", "_search", "_ngroups")

    def __init__(
        self, buf: bytes, timeout: float | None, pattern: regex.Pattern[bytes], ngroups: int
    ) -> None:
        self._buf = buf
        self._timeout = timeout
        self._search = pattern.search
        self._ngroups = ngroups

    def find(self, pos: int) -> Found | None:
        m = self._search(self._buf, pos, timeout=self._timeout)
        if m is None:
            return None
        return Found(m.start(), m.end(), 0, m, 0, self._ngroups)


class _HeapCursor:
    """Merges the rules' own next matches by (start, rule index).

    A rule's cached next match stays valid while the scan position has not
    passed its start (the match found from an earlier position is also the
    leftmost from any later position up to its start), so each rule is
    searched again only when the scan moves past its cached match.
    """

    __slots__ = ("_buf", "_timeout", "_patterns", "_ngroups", "_heap", "_started")

    def __init__(
        self,
        buf: bytes,
        timeout: float | None,
        patterns: Sequence[regex.Pattern[bytes]],
        ngroups: Sequence[int],
    ) -> None:
        self._buf = buf
        self._timeout = timeout
        self._patterns = patterns
        self._ngroups = ngroups
        self._heap: list[tuple[int, int, regex.Match[bytes]]] = []
        self._started = False

    def find(self, pos: int) -> Found | None:
        heap = self._heap
        patterns = self._patterns
        buf = self._buf
        timeout = self._timeout
        if not self._started:
            self._started = True
            for rule, pattern in enumerate(patterns):
                m = pattern.search(buf, pos, timeout=timeout)
                if m is not None:
                    heap.append((m.start(), rule, m))
            heapq.heapify(heap)
        while heap and heap[0][0] < pos:
            rule = heap[0][1]
            m = patterns[rule].search(buf, pos, timeout=timeout)
            if m is None:
                heapq.heappop(heap)
            else:
                heapq.heapreplace(heap, (m.start(), rule, m))
        if not heap:
            return None
        start, rule, m = heap[0]
        return Found(start, m.end(), rule, m, 0, self._ngroups[rule])


class RegexScanner:
    """The ``regex``-package scanner: one pattern per rule, one probe."""

    def __init__(self, parsed: Sequence[ParsedRegex]) -> None:
        probe_parts: list[str] = []
        self._ngroups: list[int] = []
        self.sources: list[str] = []
        for p in parsed:
            self.sources.append(to_regex_source(p.tree, caseless=p.caseless))
            probe_parts.append(to_regex_source(p.tree, probe=True, caseless=p.caseless))
            self._ngroups.append(p.ngroups)
        self.patterns = [regex.compile(s.encode("latin-1"), FLAGS) for s in self.sources]
        # Fixed leading bytes of each rule: for a multi-pattern prefilter.
        self.prefixes = [literal_prefix(p.tree) for p in parsed]
        probe_src = "|".join("(?:" + s + ")" for s in probe_parts)
        self.probe = regex.compile(probe_src.encode("latin-1"), FLAGS)
        # Bound on the bytes a match consumes outside unbounded repeats, and the
        # bytes unbounded repeats can consume: used to skip the probe far from
        # the end of the buffer.
        self.bounded = max((bounded_width(p.tree) for p in parsed), default=0)
        eaten: frozenset[int] = frozenset()
        for p in parsed:
            eaten |= repeat_bytes(p.tree)
        self.repeat_bytes = eaten
        self._other = None
        if eaten and len(eaten) < 256:
            other = _set_src(frozenset(range(256)) - eaten)
            self._other = regex.compile(("(?r)" + other).encode("latin-1"), FLAGS)
        self._everything = len(eaten) == 256

    def cursor(self, buf: bytes, timeout: float | None) -> Cursor:
        if len(self.patterns) == 1:
            return _SingleCursor(buf, timeout, self.patterns[0], self._ngroups[0])
        return _HeapCursor(buf, timeout, self.patterns, self._ngroups)

    def find(self, buf: bytes, pos: int, timeout: float | None) -> Found | None:
        """One-off ``cursor(buf, timeout).find(pos)``."""
        return self.cursor(buf, timeout).find(pos)

    def reach_floor(self, buf: bytes, pos: int, timeout: float | None = None) -> int:
        """Lowest start whose exploration could reach the end of ``buf``."""
        n = len(buf)
        need = self.bounded + 2  # one byte of margin for assertions
        if not self.repeat_bytes:
            return max(pos, n - need)
        if self._everything or self._other is None:
            return pos
        end = n
        for _ in range(need):
            m = self._other.search(buf, pos, end, timeout=timeout)
            if m is None:
                return pos
            end = m.start()
        return max(pos, end)

    def hold_point(
        self, buf: bytes, lo: int, found: Found | None, timeout: float | None
    ) -> int | None:
        limit = found.start if found is not None else len(buf)
        if lo > limit:
            return None
        m = self.probe.search(buf, lo, timeout=timeout)
        if m is None or m.start() > limit:
            return None
        if PROBE_GROUP not in self.probe.groupindex:
            return None  # nothing in these rules depends on the next byte
        if m.start() < limit:
            # No real match starts before ``limit``: this path ran off the end.
            return m.start()
        # At the match's start: hold only if a path of higher priority than
        # the match (earlier rule, or earlier in Perl order) ran off the end.
        return limit if m.group(PROBE_GROUP) is not None else None
