"""What a scan finds, and the questions a scanner answers.

:class:`Found` is one match (its span, its rule, its groups read on demand);
:class:`Cursor` and :class:`HoldCursor` are the two questions the transducer
asks of one buffer, :class:`Scanner` what builds them.  The match stand-ins
give a ``Found`` the groups of a match whose span is already known.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import regex


class RuleTimeout(TimeoutError):
    """A scan of one rule that ran past its time limit (``rule``: its index)."""

    def __init__(self, rule: int) -> None:
        super().__init__(f"rule {rule}: scan timed out")
        self.rule = rule


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
        counts: list[int], sizes: list[int], memo: Mapping[tuple[int, bytes], bytes] | None = None,
        stops: frozenset[int] | None = None, stop_rule: int = -1,
    ) -> tuple[int, int]:
        """Replace, from ``pos``, the matches that start before ``stop`` as
        long as each is non-empty and its rule has a fixed global
        replacement (``literals[rule]``, or for a match whose span the
        cursor knows, ``memo[(rule, matched bytes)]`` when present: global
        rules only); stop at the first that is not.  Adds one to
        ``counts[rule]`` and the match's length to ``sizes[rule]`` for each
        replacement (list items: no object per match); returns the new
        position and the number of matches.

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
        self, buf: bytes, pos: int, timeout: float | None, active: Sequence[int], cursor: Cursor | None = None
    ) -> HoldCursor:
        """A hold-back cursor over ``buf`` for a scan starting at ``pos``;
        ``cursor``, the same buffer's match cursor (not yet used past
        ``pos``), may share its work."""


class LiteralMatch:
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


class SpanMatch:
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
