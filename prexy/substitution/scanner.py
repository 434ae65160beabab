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
(``emit.to_regex_source(probe=True)``): the probe's first success at a
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
With the Hyperscan index, a rule the tail trie cannot bound is not asked
at all unless it has begun to match: its head occurs in the buffer (the
prefilter's scan says so) or is cut by its end (``MatchIndex.begun``), so
a feed's cost does not grow with rules that are not matching there.

Every regex call passes ``timeout=``; a ``TimeoutError`` propagates to the
caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prexy.substitution.compiled import FILTER_MIN_RULES, CompiledRules
from prexy.substitution.findcursors import EventCursor, HeapCursor, SetCursor, SingleCursor
from prexy.substitution.holdcursors import EventHoldCursor, IndexPlan, RuleHoldCursor, SetHoldCursor
from prexy.substitution.matches import Cursor, Found, HoldCursor, Scanner
from prexy.substitution.rulestream import RuleStream

__all__ = ["BodyScan", "Cursor", "Found", "HoldCursor", "RegexScanner", "Scanner"]


class RegexScanner(CompiledRules):
    """The ``regex``-package scanner: one pattern and one probe per rule,
    on RE2 for the rules ``regex`` cannot run in bounded time."""

    #: Per rule subset: its IndexPlan (made on first use, see index_plan).
    _index_plans: dict[tuple[int, ...], IndexPlan | None]

    def cursor(
        self, buf: bytes, timeout: float | None, active: Sequence[int] | None = None
    ) -> Cursor:
        """A match cursor over ``buf`` for ``active`` rules (default: all)."""
        rules = range(len(self.patterns)) if active is None else active
        if self.runs_as_set(rules):
            return SetCursor(self, buf, rules)
        stream = self.stream
        if len(rules) == 1:
            rule = rules[0]
            return SingleCursor(
                stream(buf, timeout, rule), rule, self._ngroups[rule], self._loops[rule], self.words[rule]
            )
        if self.index is not None:
            return EventCursor(self, buf, timeout, None if len(rules) == len(self.patterns) else self.mask(rules))
        filt = self.filter if len(rules) >= FILTER_MIN_RULES else None

        def make(pos: int) -> dict[int, RuleStream]:
            if filt is None:
                return {rule: stream(buf, timeout, rule) for rule in rules}
            may = filt.candidates(buf, pos, timeout)
            if len(rules) == len(self.patterns):  # every rule is active
                chosen: Iterable[int] = may
            else:
                chosen = may.keys() & set(rules)
            return {rule: stream(buf, timeout, rule, may[rule]) for rule in chosen}

        return HeapCursor(make, self._ngroups, self._loops, self.words)

    def hold_cursor(
        self,
        buf: bytes,
        pos: int,
        timeout: float | None,
        active: Sequence[int] | None = None,
        cursor: Cursor | None = None,
    ) -> HoldCursor:
        """A hold-back cursor over ``buf`` for ``active`` rules (default: all).

        ``cursor``: this buffer's match cursor for the same rules, not yet
        used past ``pos``: with a match index, its scan of the buffer also
        says which rules have begun to match (see ``MatchIndex.begun``)."""
        rules = range(len(self.patterns)) if active is None else active
        if self.runs_as_set(rules):
            return SetHoldCursor(self, buf, pos, timeout, rules)
        if self.index is not None and len(rules) > 1:
            if isinstance(cursor, EventCursor):
                candidates = cursor.candidates(pos)
            else:
                mask = None if len(rules) == len(self.patterns) else self.mask(rules)
                candidates = self.index.events(buf, pos, mask).candidates
            return EventHoldCursor(buf, pos, timeout, self, rules, candidates)
        return RuleHoldCursor(buf, pos, timeout, self, rules)

    def index_plan(self, active: Sequence[int]) -> IndexPlan | None:
        """The index's :class:`~.holdcursors.IndexPlan` of ``active``
        rules (cached per subset), or None where the cursors do not come
        from the index (no index, one rule, or a set that runs as one
        program)."""
        key = tuple(active)
        try:
            plans = self._index_plans
        except AttributeError:
            plans = self._index_plans = {}
        if key in plans:
            return plans[key]
        plan = None
        if self.index is not None and len(key) > 1 and not self.runs_as_set(key):
            plan = IndexPlan(self, key)
        if len(plans) >= 64:  # many rule subsets: stay bounded
            plans.clear()
        plans[key] = plan
        return plan

    def body_scan(self, active: Sequence[int], timeout: float | None) -> BodyScan:
        """The cursors of one body's buffers (see :class:`BodyScan`)."""
        return BodyScan(self, active, timeout)

    def find(self, buf: bytes, pos: int, timeout: float | None) -> Found | None:
        """One-off ``cursor(buf, timeout).find(pos)`` over all rules."""
        return self.cursor(buf, timeout).find(pos)


class BodyScan:
    """Both cursors of each buffer of one body, with what does not depend
    on the buffer worked out once for the body: a transducer asks
    ``cursors(buf, pos, final)`` once per feed.

    With a Hyperscan index and several rules, a buffer's cursors are built
    straight from one scan of the buffer (``MatchIndex.events``) and the
    body's :class:`~.holdcursors.IndexPlan`, without the scanner's
    dispatch, the rule subset's mask and lists made again, or a second
    look at the events.  (Measured on 1 KB feeds of plain text, min of
    7x1000: 21.7 -> 17.6 us per feed at 10 realistic rules, 30.0 -> 26.3
    at 1000; 22.2 -> 18.5 and 31.0 -> 27.7 othersite.)  Otherwise the
    scanner's own
    ``cursor`` and ``hold_cursor``.
    """

    __slots__ = ("_scanner", "_timeout", "_active", "_plan", "empty_ok")

    def __init__(self, scanner: RegexScanner, active: Sequence[int], timeout: float | None) -> None:
        self._scanner = scanner
        self._timeout = timeout
        self._active = active
        self._plan = scanner.index_plan(active)
        empty = scanner.empty_ok
        #: Whether some active rule may match the empty string: otherwise
        #: nothing matches at the end of a body once every byte is out.
        self.empty_ok = any(empty[r] for r in active)

    def cursors(self, buf: bytes, pos: int, final: bool) -> tuple[Cursor, HoldCursor | None]:
        """The match cursor over ``buf`` and, unless ``final``, the
        hold-back cursor for a scan starting at ``pos``."""
        plan = self._plan
        scanner = self._scanner
        if plan is None:
            cursor = scanner.cursor(buf, self._timeout, self._active)
            if final:
                return cursor, None
            return cursor, scanner.hold_cursor(buf, pos, self._timeout, self._active, cursor)
        cursor = EventCursor(scanner, buf, self._timeout, plan.mask)
        if final:
            return cursor, None
        holds = EventHoldCursor(
            buf, pos, self._timeout, scanner, self._active, cursor.candidates(pos), plan, cursor.lasts(pos)
        )
        return cursor, holds
