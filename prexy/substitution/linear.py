"""The linear-time engine: RE2 behind the part of ``regex``'s API the scanner uses.

sregex, the module's engine, is a Pike VM: every pattern of its dialect runs
in time linear in the body.  ``regex`` backtracks, so a few shapes (an
unbounded repeat over overlapping alternatives, ``(.*a){20}``, ...) can take
exponential or high polynomial time on it; ``analysis.check_pathological``
names them at load.  Those rules run here instead, on Google's RE2
(``google-re2``), which has the same leftmost-first (Perl) priority, lazy
repeats, ASCII ``\\b`` and captures, and never backtracks.

:class:`LinearPattern` takes a source from ``emit.to_re2_source`` and
answers ``search``, ``match`` and ``finditer`` as a compiled ``regex``
pattern would on a whole buffer, so the scanner's rule streams and hold-back
probes use it unchanged.  ``timeout=`` is accepted and ignored: a linear
scan needs no guard.  RE2 sees the bytes before ``pos`` (``^`` and ``\\b``
look at the real previous byte, as with ``regex``); callers always scan to
the end of the buffer, where both engines see the end of the text.

Measured on this machine (bench/README): RE2 ran the adversarial
shapes at 390-410 MB/s where ``regex`` took minutes, and a search call costs
about what ``regex`` costs (3.5 against 4.4 µs on a short tail).
"""

from __future__ import annotations

from collections.abc import Iterator

import re2

__all__ = ["LinearError", "LinearMatch", "LinearPattern"]

#: RE2 keeps its DFA states in this much memory per pattern (its default is
#: 8 MiB); the largest counted repeats of the dialect (bounds up to 499)
#: need more to compile.
MAX_MEM = 64 << 20


def _options(capture: bool) -> re2.Options:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.max_mem = MAX_MEM
    options.log_errors = False
    options.never_capture = not capture
    return options


#: Where a match is, RE2 finds with its DFAs alone when asked for no groups;
#: groups need its NFA, about ten times slower (measured: 126 against
#: 11.6 MB/s for ``(a|aa)*b`` on lines of 998 ``a``).  So a pattern finds its
#: matches without groups, and reads the groups of one match only when the
#: caller asks for them.
_FIND = _options(capture=False)
_GROUPS = _options(capture=True)


class LinearError(ValueError):
    """RE2 could not compile a source (too large for its memory budget)."""


class LinearMatch:
    """One RE2 match, read as a ``regex`` match: spans, groups, the string.

    The span comes from the search; groups are read on first use, by the
    capturing pattern anchored at the match's start (the match it finds
    there is the same one).  ``spans(n)`` gives the last capture only (RE2
    keeps no capture history).
    """

    __slots__ = ("_pattern", "string", "_start", "_end", "_endpos", "_m")

    def __init__(self, pattern: LinearPattern, string: bytes, start: int, end: int, endpos: int | None) -> None:
        self._pattern = pattern
        self.string = string
        self._start = start
        self._end = end
        self._endpos = endpos
        self._m: re2._Match | None = None

    def _groups(self) -> re2._Match:
        m = self._m
        if m is None:
            m = self._pattern.groups_at(self.string, self._start, self._endpos)
            assert m is not None and m.end() == self._end, (self._start, self._end)
            self._m = m
        return m

    def start(self, n: int = 0) -> int:
        return self._start if n == 0 else int(self._groups().start(n))

    def end(self, n: int = 0) -> int:
        return self._end if n == 0 else int(self._groups().end(n))

    def span(self, n: int = 0) -> tuple[int, int]:
        if n == 0:
            return self._start, self._end
        start, end = self._groups().span(n)
        return int(start), int(end)

    def spans(self, n: int = 0) -> list[tuple[int, int]]:
        span = self.span(n)
        return [] if span[0] < 0 else [span]

    def group(self, n: int = 0) -> bytes | None:
        if n == 0:
            return self.string[self._start : self._end]
        value = self._groups().group(n)
        return None if value is None else bytes(value)

    def marked(self) -> bool:
        """For a hold-back probe (``emit.to_re2_source(probe=True)``):
        whether the match went through one of its end-of-buffer marks.  A
        mark matches only at the end of the text, and whatever follows it
        then matches empty, so a match that ends before the end has none."""
        if self._end != len(self.string):
            return False
        return any(g is not None for g in self._groups().groups())


class LinearPattern:
    """A compiled RE2 pattern with ``regex``'s calling conventions."""

    __slots__ = ("_find", "_capture", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        raw = ("(?sm)" + source).encode("latin-1")
        try:
            self._find = re2.compile(raw, _FIND)
            self._capture = re2.compile(raw, _GROUPS)
        except re2.error as exc:
            raise LinearError(str(exc)) from None

    def groups_at(self, string: bytes, pos: int, endpos: int | None) -> re2._Match | None:
        """The match at ``pos`` exactly, with its groups."""
        return self._capture.match(string, pos, endpos)

    def search(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> LinearMatch | None:
        m = self._find.search(string, pos, endpos)
        return None if m is None else LinearMatch(self, string, m.start(), m.end(), endpos)

    def match(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> LinearMatch | None:
        m = self._find.match(string, pos, endpos)
        return None if m is None else LinearMatch(self, string, m.start(), m.end(), endpos)

    def finditer(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> Iterator[LinearMatch]:
        for m in self._find.finditer(string, pos, endpos):
            yield LinearMatch(self, string, m.start(), m.end(), endpos)
