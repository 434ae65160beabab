"""The linear-time engine: RE2 behind the part of ``regex``'s API the scanner uses.

sregex, the module's engine, is a Pike VM: every pattern of its dialect runs
in time linear in the body.  ``regex`` backtracks, so a few shapes (an
unbounded repeat over overlapping alternatives, ``(.*a){20}``, ...) can take
exponential or high polynomial time on it; ``dialect.check_pathological``
names them at load.  Those rules run here instead, on Google's RE2
(``google-re2``), which has the same leftmost-first (Perl) priority, lazy
repeats, ASCII ``\\b`` and captures, and never backtracks.

:class:`LinearPattern` takes a source from ``dialect.to_re2_source`` and
answers ``search``, ``match`` and ``finditer`` as a compiled ``regex``
pattern would on a whole buffer, so the scanner's rule streams and hold-back
probes use it unchanged.  ``timeout=`` is accepted and ignored: a linear
scan needs no guard.  RE2 sees the bytes before ``pos`` (``^`` and ``\\b``
look at the real previous byte, as with ``regex``); callers always scan to
the end of the buffer, where both engines see the end of the text.

Measured on this machine (bench/README, issue 15): RE2 ran the adversarial
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


def _options() -> re2.Options:
    options = re2.Options()
    options.encoding = re2.Options.Encoding.LATIN1
    options.max_mem = MAX_MEM
    options.log_errors = False
    return options


_OPTIONS = _options()


class LinearError(ValueError):
    """RE2 could not compile a source (too large for its memory budget)."""


class LinearMatch:
    """One RE2 match, read as a ``regex`` match: spans, groups, the string.

    ``spans(n)`` gives the last capture only (RE2 keeps no capture history).
    """

    __slots__ = ("_m", "string")

    def __init__(self, m: re2._Match, string: bytes) -> None:
        self._m = m
        self.string = string

    def start(self, n: int | str = 0) -> int:
        return int(self._m.start(n))

    def end(self, n: int | str = 0) -> int:
        return int(self._m.end(n))

    def span(self, n: int | str = 0) -> tuple[int, int]:
        start, end = self._m.span(n)
        return int(start), int(end)

    def spans(self, n: int | str = 0) -> list[tuple[int, int]]:
        span = self.span(n)
        return [] if span[0] < 0 else [span]

    def group(self, n: int | str = 0) -> bytes | None:
        value = self._m.group(n)
        return None if value is None else bytes(value)

    def marked(self) -> bool:
        """For a hold-back probe (``dialect.to_re2_source(probe=True)``):
        whether the match went through one of its end-of-buffer marks."""
        return any(g is not None for g in self._m.groups())


class LinearPattern:
    """A compiled RE2 pattern with ``regex``'s calling conventions."""

    __slots__ = ("_re", "source")

    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._re = re2.compile(("(?sm)" + source).encode("latin-1"), _OPTIONS)
        except re2.error as exc:
            raise LinearError(str(exc)) from None

    def search(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> LinearMatch | None:
        m = self._re.search(string, pos, endpos)
        return None if m is None else LinearMatch(m, string)

    def match(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> LinearMatch | None:
        m = self._re.match(string, pos, endpos)
        return None if m is None else LinearMatch(m, string)

    def finditer(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> Iterator[LinearMatch]:
        for m in self._re.finditer(string, pos, endpos):
            yield LinearMatch(m, string)
