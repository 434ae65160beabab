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

One rule of the module's engine is not Perl's.  After each match the module
restarts its engine at the byte after the match, and there ``^``, ``\\b``
and ``\\B`` do not look at the real previous byte: they look at a register
that only a match of the *first* rule (rule 0) sets, to the class of that
match's last byte (newline, word byte, other; "other" before rule 0 has
matched).  So ``^b`` after a replaced ``\\n`` (a later rule) does not match,
and ``^[ \\t]+`` after a removed ``<!---->`` matches when rule 0's last match
ended a line.  Everywhere else, and after an empty match, assertions see the
real bytes.  Prexy follows it (``_restart_rule``); read from sregex's
``sre_vm_pike.c`` (the register is ``seen_newline``/``seen_word``, set from
capture slot 1, which is rule 0's ``$0`` end) and checked against the
module's measured outputs.

``feed(data)`` returns what is ready now, ``finish()`` what is left at the
end of the body.  ``finish(data)`` takes the body's last bytes together with
its end, as the module takes a buffer that carries the end (a static file,
or a proxied body whose end is known when its last bytes arrive): a match
at the very end is decided with them, and no bytes are held, so the buffer
limit cannot fire there.  ``feed(data)`` then ``finish()`` gives the same
bytes unless that ``feed`` hits the limit.  The output never depends on how
the body was cut, except where the buffer limit fires (as in the module).  Work per call is
proportional to the data passed, so callers keep latency bounded by feeding
slices (e.g. 64 KB).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Set as AbstractSet
from itertools import compress
from typing import TYPE_CHECKING

from prexy.substitution.byteclass import CLASS as _CLASS
from prexy.substitution.byteclass import NEWLINE, NONE, WORD

if TYPE_CHECKING:
    from prexy.substitution.matches import Found
    from prexy.substitution.ruleset import RuleSet
    from prexy.substitution.scanner import BodyScan

__all__ = ["DEFER_MIN", "HOLD_SLACK", "RulesMatched", "State", "Transducer", "warm"]

#: The module counts against ``max_buffered_size`` the bytes it holds at the
#: end of each buffer, less the best match found so far when no replacement
#: needs the matched bytes (see Transducer._run).  Prexy does the same, and
#: also bails out when everything it holds exceeds the limit by this much, so
#: memory stays bounded per response.
HOLD_SLACK = 16 * 1024

#: Once this many bytes are held, small feeds are gathered (until they reach a
#: quarter of what is held) before the held bytes are scanned again, so that a
#: trickle of tiny chunks costs O(n log n) rather than O(n^2).  Deferring never
#: changes the bytes that come out, nor where the buffer limit stops
#: substitution (see Transducer.feed).
DEFER_MIN = 1024

#: Remembered expansions of exact rules per rule set (see _replacement).
MEMO_SIZE = 4096

#: A byte of each class, standing for the previous byte at a restart.
_STAND_IN = {NONE: b" ", NEWLINE: b"\n", WORD: b"a"}

#: Bytes after a restart read first to decide the match there (more only
#: when a match there may run past them).
RESTART_WINDOW = 2048


class State(enum.Enum):
    """Where a transducer is in its life: ``feed``* then ``finish`` once."""

    SCANNING = "scanning"  # substituting
    PASSING_THROUGH = "passing through"  # no more substitution in this body
    FINISHED = "finished"  # finish() was called


class RulesMatched(AbstractSet[int]):
    """The indexes of the rules with a substitution: a read-only set over a
    transducer's ``rule_counts`` (membership, size and order from the
    counts themselves; nothing is kept per match)."""

    __slots__ = ("_counts",)

    def __init__(self, counts: list[int]) -> None:
        self._counts = counts

    def __contains__(self, rule: object) -> bool:
        counts = self._counts
        return isinstance(rule, int) and 0 <= rule < len(counts) and counts[rule] > 0

    def __iter__(self) -> Iterator[int]:
        return compress(range(len(self._counts)), self._counts)

    def __len__(self) -> int:
        return len(self._counts) - self._counts.count(0)

    def __repr__(self) -> str:
        return f"RulesMatched({sorted(self)!r})"


class Transducer:
    """Rewrites one body: ``Transducer(ruleset)``, one per response.

    ``timeout`` bounds every regex scan call (seconds; a scan that takes
    longer makes the rest of the body pass through, ``timed_out``).
    ``only`` runs just the rules with these indexes, in their order, for a
    caller that knows the others cannot match this body (the resource's
    applicability memory); the output is the same as with all rules
    exactly when that is true.

    Attributes for the caller: ``state``, ``bailed_out`` (the buffer limit
    stopped substitution), ``timed_out`` (a scan hit its time limit),
    ``match_count`` (every match, a fired once-rule's unchanged ones too),
    ``scan_seconds`` (time spent in feed/finish) and ``held`` (bytes waiting
    for more data), and per rule, for the operator's counters:

    * ``rule_counts[i]``: the substitutions rule ``i`` made (a match of a
      once-rule that already fired is emitted unchanged and not counted);
    * ``rule_bytes[i]``: the input bytes those substitutions replaced;
    * ``rules_matched``: the indexes with a count (a set-like view);
    * ``stopped_by``: the rule whose match in progress made the body bail
      out, or whose scan timed out, when known (else None);
    * ``max_held``: the most bytes held back between calls.

    The counts are list items added to where each replacement is emitted
    (no object per match); they never depend on how the body was cut,
    except where the buffer limit fires.  A scan that times out inside a
    run of fixed replacements gives the run's bytes unchanged, but the
    run's replacements stay counted; the module's stand-in replacement of
    a kept-apart match at a bail-out (see ``_run``) is not counted.
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
        # Matches of a fired once-rule, given unchanged (see match_count).
        self._unchanged = 0
        self.rule_counts = [0] * len(ruleset.rules)
        self.rule_bytes = [0] * len(ruleset.rules)
        self.stopped_by: int | None = None
        self.max_held = 0
        self.scan_seconds = 0.0
        self._scanner = ruleset.scanner
        # Both cursors of each buffer, made with what the body's buffers
        # share (built at the first scan).
        self._body: BodyScan | None = None
        rules = ruleset.rules
        self._single = len(rules) == 1
        # Per-rule facts, computed once per rule set (see RuleSet.rule_facts).
        self._once, self._literal, self._templates, self._seen_global, all_rules = (
            ruleset.rule_facts
        )
        self._exact, self._memo = ruleset.expansions
        self._disabled = [False] * len(rules)
        self._disabled_count = 0
        # Rules to run (indexes into ruleset.rules); see ``only`` above.
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
        # The module's restart rule (see _restart_rule): the class of the last byte
        # of the last match by rule 0 (NONE before any), and whether the
        # scan resumes at the end of a non-empty match.
        self._restart_facts = ruleset.restart_facts if self._active != (0,) else None
        # The module's count of held bytes (see _run); the rule of the last
        # completed match; the match kept apart by the last hold, if any.
        self._capturing = ruleset.capturing
        self._settled = ruleset.settled_patterns
        self._tail_match = False
        self._last_rule = 0
        self._candidate: tuple[int, int, int] | None = None
        self._last0 = NONE
        self._restart = False
        # When every match of rule 0 ends with a byte of one class, the
        # register is that class once rule 0 has matched: the fast runs
        # need not stop at rule 0's matches to track it.
        self._last0_fixed = ruleset.rule0_last_class if self._restart_facts is not None else None

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
    def match_count(self) -> int:
        """Every match made: the substitutions, and the matches of a fired
        once-rule given unchanged."""
        return sum(self.rule_counts) + self._unchanged

    @property
    def rules_matched(self) -> RulesMatched:
        """The indexes of the rules that made a substitution (a live view
        of ``rule_counts``)."""
        return RulesMatched(self.rule_counts)

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
        state = self.state
        if state is State.FINISHED:
            raise RuntimeError("feed() after finish()")
        held = len(self._buf) - self._pos + self._deferred_len
        if state is State.PASSING_THROUGH and not held:
            return bytes(data)
        data = bytes(data)
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
            if held + len(data) > self.max_held:
                self.max_held = held + len(data)
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
        """End of body, optionally with its last bytes ``data``; return the
        rest.  With ``data``, the end comes in the same buffer as them (see
        the module docstring): nothing is held, so no bail-out there."""
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
        was_held = self._pos if self._candidate is not None and self.held else -1
        self._candidate = None
        pos = self._scan(buf, self._pos, final, out)
        limit = self.ruleset.max_buffered_size
        if not final and (self._pending > limit or len(buf) - pos > limit + HOLD_SLACK):
            # The module's bail-out: flush held bytes, stop substituting.
            candidate = self._candidate
            if candidate is not None and candidate[0] == pos and pos == was_held:
                # Held since an earlier buffer, with a match found so far
                # that the module kept apart: it emits, in its place, the
                # replacement of the last rule that completed a match.
                _hold, start, end = candidate
                out.append(buf[pos:start])
                out.append(self._bail_replacement())
                out.append(buf[end:])
            else:
                out.append(buf[pos:])
            self.stopped_by = self._holding_rule(buf, pos)
            pos = len(buf)
            self.bailed_out = True
            self._stop_substituting()
        # Keep one byte of left context for ^ and \b; position 0 of the
        # buffer is the stream start only while nothing was dropped.
        keep_from = pos - 1 if pos > 0 else 0
        self._buf = buf[keep_from:]
        self._pos = pos - keep_from
        if len(buf) - pos > self.max_held:
            self.max_held = len(buf) - pos
        self.scan_seconds += time.perf_counter() - started
        return b"".join(out)

    def _scan(self, buf: bytes, pos: int, final: bool, out: list[bytes]) -> int:
        """Rewrite ``buf`` from ``pos`` into ``out``; return where holding starts."""
        scanner = self._scanner
        n = len(buf)
        if scanner is None or self.state is not State.SCANNING:
            out.append(buf[pos:])
            return n
        if self._restart_facts is None:
            return self._scan_from(buf, pos, final, out)
        restart = pos if self._restart else -1
        self._restart = False
        held = self._scan_from(buf, pos, final, out, restart)
        return held

    def _scan_from(
        self, buf: bytes, pos: int, final: bool, out: list[bytes], restart_at: int = -1
    ) -> int:
        """:meth:`_scan`'s loop; ``restart_at``: a position where the scan
        resumes after a non-empty match (the restart rule applies there),
        or -1.  Sets ``_restart`` when holding starts at such a position."""
        scanner = self._scanner
        assert scanner is not None
        n = len(buf)
        facts = self._restart_facts
        stops = None
        stop_rule = -1
        if facts is not None:
            stops = facts[1] if facts[1] is not None else frozenset(range(256))
            if self._last0_fixed is None:
                stop_rule = 0  # the register follows rule 0's matches one by one
        timeout = self.timeout
        emit = out.append
        literals = self._literal
        disabled = self._disabled
        once = self._once
        counts = self.rule_counts
        sizes = self.rule_bytes
        mark = -1  # len(out) while a run of replacements is in progress
        # Whether the last thing done was a non-empty match ending at n: the
        # module makes no empty match at the end of the body right after one
        # (see the module docstring).  Carried over from the previous call
        # while nothing has come since.
        ended_at_end = self._tail_match and pos == n
        self._tail_match = False
        body = self._body
        if body is None:
            body = self._body = scanner.body_scan(self._active, timeout)
        if final and pos >= n and not body.empty_ok:
            # The end of the body with every byte out: only an empty match
            # could be made there (the restart rule's too), and no rule
            # makes one.  (A body fed in pieces then ends without a scan.)
            return n
        try:
            cursor, holds = body.cursors(buf, pos, final)
            find = cursor.find
            # Below ``floor`` no match can run off the end of the buffer, so
            # the hold-back probe only runs for matches starting at or above it.
            if holds is None:
                floor = n + 1
                hold_point = None
            else:
                floor = holds.floor
                hold_point = holds.hold_point
            fast_stop = min(floor, n)
            global_literals = self.ruleset.global_literals
            memo = self._memo
            while pos < n or (final and pos == n and not ended_at_end):
                skip = False
                if pos == restart_at:
                    kind, quirk = self._restart_rule(buf, pos, final)
                    if kind == "hold":
                        self._pending = n - pos
                        self._defer_cap = self.ruleset.max_buffered_size
                        self._restart = True
                        return pos
                    if quirk is not None:
                        before = pos
                        pos, restart_at = self._apply_restart_match(buf, pos, quirk, emit)
                        ended_at_end = pos == n and restart_at == n > before
                        if self.state is not State.SCANNING:
                            emit(buf[pos:])
                            return n
                        continue
                    skip = kind == "none"
                    if skip and pos >= n:
                        return n  # the end of the body, and nothing matches there
                if pos < fast_stop and not skip:
                    # Replace the run of matches from here that need nothing
                    # but a fixed (or remembered) replacement without
                    # building a Found for each; find() takes over at the
                    # first that does.  (Its emits are undone if a scan
                    # times out within.)
                    mark = len(out)
                    pos, count = cursor.literal_runs(
                        pos, fast_stop, global_literals, emit, counts, sizes, memo, stops, stop_rule
                    )
                    mark = -1
                    if count:
                        ended_at_end = pos == n  # the run's last match ends at n
                    if count and stops is not None:
                        restart_at = pos
                        if pos < n or final:
                            continue  # the restart rule first
                    if pos >= n and (not final or ended_at_end):
                        break
                found = find(pos + 1 if skip else pos)
                if found is None:
                    if floor <= n:
                        assert hold_point is not None
                        hold = hold_point(pos, None)
                        if hold is not None:
                            emit(buf[pos:hold])
                            self._pending = n - hold
                            # All held bytes count: defer only below the limit.
                            self._defer_cap = self.ruleset.max_buffered_size
                            self._restart = hold == restart_at
                            return hold
                    emit(buf[pos:])
                    return n
                start = found.start
                if floor <= start:
                    assert hold_point is not None
                    hold = hold_point(pos, found)
                    if hold is not None:
                        emit(buf[pos:hold])
                        # The module's count (see _run): everything held,
                        # less the match found so far unless a replacement
                        # needs the matched bytes.
                        settled = self._settled[found.rule] if found.end == n else None
                        so_far: tuple[int, int] | None = (start, found.end)
                        if settled is not None:
                            # The module tests a look-ahead assertion only
                            # with the byte after it: a match that needs one
                            # at the end of the buffer is not found yet; the
                            # rule's first match that needs none is.
                            m = settled.search(buf, start, n, timeout=timeout)
                            so_far = m.span() if m is not None and m.end() > m.start() else None
                        if self._capturing or so_far is None:
                            self._pending = n - hold
                        else:
                            self._pending = n - hold - (so_far[1] - so_far[0])
                            self._candidate = (hold, *so_far)
                        self._defer_cap = self.ruleset.max_buffered_size
                        self._restart = hold == restart_at
                        return hold
                    if start == n and not final:
                        # An empty match at the end: decide it with the next bytes.
                        emit(buf[pos:])
                        self._restart = n == restart_at
                        self._tail_match = ended_at_end and pos == n
                        return n
                end = found.end
                if start > pos:
                    emit(buf[pos:start])
                rule = found.rule
                self._last_rule = rule
                literal = literals[rule]
                if disabled[rule]:
                    self._unchanged += 1
                    emit(buf[start:end])
                else:
                    counts[rule] += 1
                    sizes[rule] += end - start
                    if literal is not None and not once[rule]:
                        emit(literal)
                    else:
                        emit(self._replacement(found))
                if end == start:
                    ended_at_end = False
                    if rule == 0 and stops is not None and start != restart_at and start > 0:
                        self._last0 = _CLASS[buf[start - 1]]
                    if start < n:
                        emit(buf[start : start + 1])
                    pos = start + 1
                    restart_at = -1
                else:
                    pos = end
                    ended_at_end = end == n
                    if stops is not None:
                        restart_at = end
                        if rule == 0:
                            self._last0 = _CLASS[buf[end - 1]]
                if self.state is not State.SCANNING:
                    emit(buf[pos:])
                    return n
        except TimeoutError as exc:
            if mark >= 0:
                # (The counts of the run's replacements stay: the cursor
                # added them as it went, and undoing them would cost the
                # fast runs a record per match.)
                del out[mark:]
            self.stopped_by = getattr(exc, "rule", None)
            self.timed_out = True
            self._stop_substituting()
            emit(buf[pos:])
            return n
        if pos >= n and restart_at == n:
            self._restart = True
        self._tail_match = ended_at_end and pos >= n
        return min(pos, n)

    def _restart_rule(self, buf: bytes, r: int, final: bool) -> tuple[str, Found | None]:
        """The restart rule at ``r``, the end of a non-empty match.

        Returns ("same", None) when it cannot change what matches at ``r``
        (the register and the real previous byte agree for the assertions
        the rules test there, or no such rule can start at ``buf[r]``);
        ("match", found) with the match the module makes at ``r``, in
        the coordinates of a stand-in buffer (one byte of the register's
        class, then ``buf[r:]``: position 1 is ``r``); ("none", None) when
        nothing matches at ``r``; ("hold", None) when that needs more bytes.
        """
        facts = self._restart_facts
        assert facts is not None and self._scanner is not None
        kinds, starts = facts
        n = len(buf)
        fixed = self._last0_fixed
        if fixed is None:
            wanted = self._last0
        else:
            wanted = fixed if self.rule_counts[0] else NONE
        real = _CLASS[buf[r - 1]]
        differs = ("bol" in kinds and (wanted == NEWLINE) != (real == NEWLINE)) or (
            ("b" in kinds or "B" in kinds) and (wanted == WORD) != (real == WORD)
        )
        if not differs:
            return "same", None
        if starts is not None and (r >= n or buf[r] not in starts):
            return "same", None
        scanner = self._scanner
        timeout = self.timeout
        stand_in = _STAND_IN[wanted]
        end = min(n, r + RESTART_WINDOW)
        while True:
            view = stand_in + buf[r:end]
            whole = final and end == n
            cursor = scanner.cursor(view, timeout, self._active)
            found = cursor.find(1)
            if not whole:
                holds = scanner.hold_cursor(view, 1, timeout, self._active, cursor)
                if holds.floor <= (found.start if found is not None else len(view)):
                    if holds.hold_point(1, found) == 1:
                        if end == n:
                            return "hold", None
                        end = n
                        continue
            if found is not None and found.start == 1:
                return "match", found
            return "none", None

    def _apply_restart_match(
        self, buf: bytes, r: int, found: Found, emit: Callable[[bytes], object]
    ) -> tuple[int, int]:
        """Emit the match ``_restart_rule`` found at ``r``; return (the next scan
        position, the next restart position or -1)."""
        length = found.end - found.start
        rule = found.rule
        self._last_rule = rule
        end = r + length
        literal = self._literal[rule]
        if self._disabled[rule]:
            self._unchanged += 1
            emit(buf[r:end])
        else:
            self.rule_counts[rule] += 1
            self.rule_bytes[rule] += length
            if literal is not None and not self._once[rule]:
                emit(literal)
            else:
                emit(self._replacement(found))
        if length == 0:
            if r < len(buf):
                emit(buf[r : r + 1])
            return r + 1, -1
        if rule == 0:
            self._last0 = _CLASS[buf[end - 1]]
        return end, end

    def _holding_rule(self, buf: bytes, pos: int) -> int | None:
        """The first active rule with a path from ``pos`` that runs off the
        end of ``buf``: the match in progress that held the bytes the
        buffer limit flushed (None if no rule's probe says so, as after a
        restart whose register differs from the real byte).  Asked once,
        at the bail-out: the rules' leading bytes rule most of them out,
        and when one is left it is the one (its probe, which may cross
        every held byte, runs only to choose among several)."""
        from prexy.substitution.reach import reaches_at

        scanner = self._scanner
        if scanner is None:
            return None
        reaches = scanner.reaches
        timeout = self.timeout
        try:
            maybe = [rule for rule in self._active if reaches_at(reaches[rule], buf, pos, timeout, probe=False)]
            if len(maybe) == 1:
                return maybe[0]
            for rule in maybe:
                if reaches_at(reaches[rule], buf, pos, timeout):
                    return rule
        except TimeoutError:
            pass
        return None

    def _bail_replacement(self) -> bytes:
        """What the module emits for the kept-apart match at a bail-out:
        the replacement of the last rule that completed a match (rule 0
        before any).  Without captures every replacement is fixed."""
        template = self._templates[self._last_rule]
        return template.literal if template.is_literal else b""

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


#: Seconds the warm-up rewrite of a new rule set may scan for.
WARM_TIMEOUT = 0.2


#: A thorough warm-up (``warm(..., thorough=True)``) rewrites a page made of
#: this many of the rule set's own match strings this many times.
WARM_STRINGS, WARM_ROUNDS = 48, 16


def warm(ruleset: RuleSet, thorough: bool = False) -> RuleSet:
    """Do now what the first response with ``ruleset`` would otherwise pay
    for, and return it: the per-rule facts every transducer reads, and one
    rewrite of a short body made of the rules' own leading bytes, which
    touches the compiled scanners' memory once.  Measured with 1000
    realistic rules (bench/realistic.py): the first 20 KB page took 3.7 ms
    to rewrite in a fresh process, the following ones 0.7-1.0 ms.

    ``thorough`` (a worker's rule sets before it serves, see
    ``Runtime.compile_ahead``) also does what the first pages would do:

    * the remembered expansions (``_replacement``) of every string that
      the few-string rules whose replacement depends on the match can
      match (``RuleSet.match_strings``): a clone's ``(https?://)host`` ->
      ``${1}clone`` rules;
    * :data:`WARM_ROUNDS` rewrites of a small page of those strings among
      links and text, in three feeds, so the interpreter has specialised
      the scan paths a real page takes (CPython does so only after a
      function has run several times).

    Measured with the realistic sets (bench/realistic.py), 20 KB page,
    first page against the median of 50 (three processes each): in one
    process 3.4 / 3.0-3.4 / 3.4-3.9x without, 2.0-2.3 / 1.7-2.0 /
    1.5-2.4x with, at 10 / 100 / 1000 rules.  Through ``twistd prexy``
    (fresh start, one readiness request, then the page on a new
    connection, alternating with the build before): the first request's
    rewrite took 0.33-0.35 ms against 0.69-0.75 at 100 rules, 0.62-0.66
    against 1.03-1.51 at 1000, and the whole request 1.05-1.49 against
    1.61-1.71 ms and 1.53-1.85 against 2.00-2.72 ms.  It adds 1.3 / 3.3 /
    10 ms to loading a set of 10 / 100 / 1000 rules, whose compiling takes
    3.5 / 30 / 366 ms (medians of 3-5 sets).
    """
    ruleset.warm()
    sample = ruleset.warm_sample()
    if sample:
        # Under the scan timeout all the same: a rule on ``regex`` is one it
        # bounds, but no build should ever wait on a sample.
        t = Transducer(ruleset, timeout=WARM_TIMEOUT)
        t.feed(sample[: len(sample) // 2])
        t.finish(sample[len(sample) // 2 :])
    if thorough:
        once, literal = ruleset.rule_facts[:2]
        remembered = [
            i for i, exact in enumerate(ruleset.expansions[0]) if exact and not once[i] and literal[i] is None
        ]
        strings = ruleset.match_strings(MEMO_SIZE // 2, remembered)
        if strings:
            Transducer(ruleset, timeout=WARM_TIMEOUT).finish(b"\n".join(strings))
        strings = ruleset.match_strings(WARM_STRINGS)
        if strings:
            page = warm_page(strings)
            third = len(page) // 3
            for _ in range(WARM_ROUNDS):
                t = Transducer(ruleset, timeout=WARM_TIMEOUT)
                t.feed(page[:third])
                t.feed(page[third : 2 * third])
                t.finish(page[2 * third :])
    return ruleset


def warm_page(strings: list[bytes]) -> bytes:
    """A small HTML page with each of ``strings`` in a link, with text."""
    items = b"".join(
        b'<li><a href="%s/item-%d">Item %d</a> and a few words of text about it</li>\n' % (s, i, i)
        for i, s in enumerate(strings)
    )
    return b"<!DOCTYPE html>\n<html><head><title>Warm-up</title></head><body><ul>\n" + items + b"</ul></body></html>\n"
