"""The streaming substitution transducer: bytes in, bytes out, no I/O.

One :class:`Transducer` rewrites one response body with a shared
:class:`~prexy.substitution.ruleset.RuleSet`, exactly as
``replace-filter-nginx-module`` does:

* the match that starts leftmost wins, then the earlier rule, then Perl
  priority inside the rule; matches never overlap; after an empty match the
  next byte is copied and the scan moves on one byte;
* a rule without ``g`` fires once: with a single rule the rest of the body
  then passes through; with several, a fired once-rule still matches and
  consumes text but its match is emitted unchanged, and once every rule is a
  fired once-rule the rest passes through;
* only bytes that may still belong to a match are held back; anchors and
  ``\\b`` at a chunk edge wait for the real neighbouring byte;
* when more than ``max_buffered_size`` bytes would have to be held, the held
  bytes are flushed unchanged and substitution stops for the rest of the
  body (``bailed_out``);
* a scan that exceeds its time limit passes the rest of the body through
  unchanged (``timed_out``).

``feed(data)`` returns what is ready now, ``finish()`` what is left at the
end of the body.  The output never depends on how the body was cut, except
where the buffer limit fires (as in the module).  Work per call is
proportional to the data passed, so callers keep latency bounded by feeding
slices (e.g. 64 KB).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prexy.substitution.ruleset import RuleSet
    from prexy.substitution.scanner import Found

__all__ = ["DEFER_MIN", "HOLD_SLACK", "State", "Transducer"]

#: The module counts against ``max_buffered_size`` only the held bytes before
#: the best match found so far (the match itself and what follows are kept to
#: be rescanned).  Prexy does the same, and also bails out when everything it
#: holds exceeds the limit by this much, so memory stays bounded per response.
HOLD_SLACK = 16 * 1024

#: Once this many bytes are held, small feeds are gathered (until they reach a
#: quarter of what is held) before the held bytes are scanned again, so that a
#: trickle of tiny chunks costs O(n log n) rather than O(n^2).  Deferring never
#: changes the bytes that come out, nor where the buffer limit stops
#: substitution (see Transducer.feed).
DEFER_MIN = 1024

#: Remembered expansions of exact rules per rule set (see _replacement).
MEMO_SIZE = 4096


class State(enum.Enum):
    """Where a transducer is in its life: ``feed``* then ``finish`` once."""

    SCANNING = "scanning"  # substituting
    PASSING_THROUGH = "passing through"  # no more substitution in this body
    FINISHED = "finished"  # finish() was called


class Transducer:
    """Rewrites one body; create it with ``RuleSet.new_transducer()``.

    Attributes for the caller: ``state``, ``bailed_out`` (the buffer limit
    stopped substitution), ``timed_out`` (a scan hit its time limit),
    ``match_count``, ``rules_matched`` (indexes into ``ruleset.rules``),
    ``scan_seconds`` (time spent in feed/finish) and ``held`` (bytes waiting
    for more data).
    """

    def __init__(
        self,
        ruleset: RuleSet,
        *,
        timeout: float | None = 1.0,
        only: Iterable[int] | None = None,
    ) -> None:
        self.ruleset = ruleset
        self.timeout = timeout
        self.bailed_out = False
        self.timed_out = False
        self.match_count = 0
        self.rules_matched: set[int] = set()
        self.scan_seconds = 0.0
        self._scanner = ruleset.scanner
        rules = ruleset.rules
        self._single = len(rules) == 1
        # Per-rule facts, computed once per rule set (see RuleSet.rule_facts).
        self._once, self._literal, self._templates, self._seen_global, all_rules = (
            ruleset.rule_facts
        )
        self._exact, self._memo = ruleset.expansions
        self._disabled = [False] * len(rules)
        self._disabled_count = 0
        # Rules to run (indexes into ruleset.rules); see RuleSet.new_transducer.
        if only is None:
            self._active = all_rules
        else:
            self._active = tuple(sorted(set(only)))
            if any(not 0 <= i < len(rules) for i in self._active):
                raise ValueError("rule index out of range")
        scanning = self._scanner is not None and bool(self._active)
        self.state = State.SCANNING if scanning else State.PASSING_THROUGH
        self._buf = b""
        self._pos = 0  # bytes of _buf before _pos were already emitted
        # Held bytes that count against max_buffered_size (see _scan).
        self._pending = 0
        # Fed bytes not scanned yet, and how many held bytes may be reached
        # by deferring (0: scan every feed); see feed().
        self._deferred: list[bytes] = []
        self._deferred_len = 0
        self._defer_cap = 0

    # -- public API ---------------------------------------------------------

    @property
    def passing_through(self) -> bool:
        """True once the rest of the body will pass through unchanged."""
        return self.state is not State.SCANNING

    @property
    def finished(self) -> bool:
        """True once ``finish()`` was called."""
        return self.state is State.FINISHED

    @property
    def active_rules(self) -> tuple[int, ...]:
        """The rules this transducer runs (all, or those given as ``only``)."""
        return self._active

    @property
    def held(self) -> int:
        """How many bytes are held back waiting for more data."""
        return len(self._buf) - self._pos + self._deferred_len

    def feed(self, data: bytes) -> bytes:
        """Take the next bytes of the body; return the output ready now.

        The work done is proportional to ``len(data)`` (and the matches in
        it): feed large bodies in slices, e.g. with :meth:`feed_slices`.
        """
        if self.state is State.FINISHED:
            raise RuntimeError("feed() after finish()")
        if self.state is State.PASSING_THROUGH and not self.held:
            return bytes(data)
        data = bytes(data)
        held = self.held
        if (
            self._defer_cap
            and held >= DEFER_MIN
            and self._deferred_len + len(data) < held // 4
            and held + len(data) <= self._defer_cap
        ):
            # Everything from the hold point on stays held whatever these
            # bytes are, and no limit can be crossed before the cap.
            self._deferred.append(data)
            self._deferred_len += len(data)
            return b""
        return self._run(self._take_deferred(data), final=False)

    def _take_deferred(self, data: bytes) -> bytes:
        if not self._deferred:
            return data
        self._deferred.append(data)
        joined = b"".join(self._deferred)
        self._deferred.clear()
        self._deferred_len = 0
        return joined

    def feed_slices(self, data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
        """Feed ``data`` ``size`` bytes at a time, yielding each output.

        Suits a cooperative scheduler (``twisted.internet.task.cooperate``):
        each step does a bounded amount of work.
        """
        view = memoryview(data)
        for i in range(0, len(data), size):
            yield self.feed(view[i : i + size].tobytes())

    def finish(self, data: bytes = b"") -> bytes:
        """End of body (optionally with its last bytes); return the rest."""
        if self.state is State.FINISHED:
            raise RuntimeError("finish() called twice")
        out = self._run(self._take_deferred(bytes(data)), final=True)
        self.state = State.FINISHED
        self._buf = b""
        self._pos = 0
        return out

    def _stop_substituting(self) -> None:
        self.state = State.PASSING_THROUGH

    # -- the scan loop --------------------------------------------------------

    def _run(self, data: bytes, final: bool) -> bytes:
        started = time.perf_counter()
        buf = self._buf + data if self._buf else data
        out: list[bytes] = []
        self._pending = 0
        self._defer_cap = 0
        pos = self._scan(buf, self._pos, final, out)
        limit = self.ruleset.max_buffered_size
        if not final and (self._pending > limit or len(buf) - pos > limit + HOLD_SLACK):
            # The module's bail-out: flush held bytes, stop substituting.
            out.append(buf[pos:])
            pos = len(buf)
            self.bailed_out = True
            self._stop_substituting()
        # Keep one byte of left context for ^ and \b; position 0 of the
        # buffer is the stream start only while nothing was dropped.
        keep_from = pos - 1 if pos > 0 else 0
        self._buf = buf[keep_from:]
        self._pos = pos - keep_from
        self.scan_seconds += time.perf_counter() - started
        return b"".join(out)

    def _scan(self, buf: bytes, pos: int, final: bool, out: list[bytes]) -> int:
        """Rewrite ``buf`` from ``pos`` into ``out``; return where holding starts."""
        scanner = self._scanner
        n = len(buf)
        if scanner is None or self.state is not State.SCANNING:
            out.append(buf[pos:])
            return n
        timeout = self.timeout
        emit = out.append
        literals = self._literal
        disabled = self._disabled
        once = self._once
        rules_matched = self.rules_matched
        mark = -1  # len(out) while a run of replacements is in progress
        try:
            cursor = scanner.cursor(buf, timeout, self._active)
            find = cursor.find
            # Below ``floor`` no match can run off the end of the buffer, so
            # the hold-back probe only runs for matches starting at or above it.
            if final:
                floor = n + 1
                hold_point = None
            else:
                holds = scanner.hold_cursor(buf, pos, timeout, self._active)
                floor = holds.floor
                hold_point = holds.hold_point
            fast_stop = min(floor, n)
            global_literals = self.ruleset.global_literals
            memo = self._memo
            while pos < n or (final and pos == n):
                if pos < fast_stop:
                    # Replace the run of matches from here that need nothing
                    # but a fixed (or remembered) replacement without
                    # building a Found for each; find() takes over at the
                    # first that does.  (Its emits are undone if a scan
                    # times out within.)
                    mark = len(out)
                    pos, count = cursor.literal_runs(
                        pos, fast_stop, global_literals, emit, rules_matched, memo
                    )
                    mark = -1
                    self.match_count += count
                    if pos >= n and not final:
                        break
                found = find(pos)
                if found is None:
                    if floor <= n:
                        assert hold_point is not None
                        hold = hold_point(pos, None)
                        if hold is not None:
                            emit(buf[pos:hold])
                            self._pending = n - hold
                            # All held bytes count: defer only below the limit.
                            self._defer_cap = self.ruleset.max_buffered_size
                            return hold
                    emit(buf[pos:])
                    return n
                start = found.start
                if floor <= start:
                    assert hold_point is not None
                    hold = hold_point(pos, found)
                    if hold is not None:
                        emit(buf[pos:hold])
                        # As in the module, only the bytes before the match
                        # found so far count against the limit; the match
                        # and what follows it are kept apart to be rescanned.
                        self._pending = start - hold
                        if found.end < n - 1:
                            # This match stands whatever comes next, so the
                            # count can only shrink: defer up to the hard cap.
                            self._defer_cap = self.ruleset.max_buffered_size + HOLD_SLACK
                        else:
                            self._defer_cap = self.ruleset.max_buffered_size
                        return hold
                    if start == n and not final:
                        # An empty match at the end: decide it with the next bytes.
                        emit(buf[pos:])
                        return n
                end = found.end
                if start > pos:
                    emit(buf[pos:start])
                rule = found.rule
                self.match_count += 1
                rules_matched.add(rule)
                literal = literals[rule]
                if disabled[rule]:
                    emit(buf[start:end])
                elif literal is not None and not once[rule]:
                    emit(literal)
                else:
                    emit(self._replacement(found))
                if end == start:
                    if start < n:
                        emit(buf[start : start + 1])
                    pos = start + 1
                else:
                    pos = end
                if self.state is not State.SCANNING:
                    emit(buf[pos:])
                    return n
        except TimeoutError:
            if mark >= 0:
                del out[mark:]
            self.timed_out = True
            self._stop_substituting()
            emit(buf[pos:])
            return n
        return min(pos, n)

    def _replacement(self, found: Found) -> bytes:
        """The replacement for ``found``; fires once-rules.

        The expansion of an exact rule (no assertion: its groups depend on
        the matched bytes alone) is remembered per matched bytes, in the
        rule set: a clone's ``(https?://)host`` -> ``${1}clone`` matches
        the same few strings all over a page.
        """
        rule = found.rule
        value = self._literal[rule]
        if value is None:
            if self._exact[rule] and not self._once[rule]:
                # (Global rules only: the cursor's literal_runs replaces
                # remembered matches itself, with no once-rule to fire.)
                key = (rule, found.group(0))
                memo = self._memo
                value = memo.get(key)
                if value is None:
                    value = self._templates[rule].expand(found.group)
                    if len(memo) >= MEMO_SIZE:
                        memo.clear()
                    memo[key] = value
            else:
                value = self._templates[rule].expand(found.group)
        if self._once[rule]:
            if self._single:
                self._stop_substituting()
            else:
                self._disabled[rule] = True
                self._disabled_count += 1
                if not self._seen_global and self._disabled_count == len(self._disabled):
                    self._stop_substituting()
        return value
