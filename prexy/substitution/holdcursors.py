"""The hold-back cursors: where could a match still need more bytes.

:class:`RuleHoldCursor` asks the rules one by one, above their floors and
where their leading bytes are, lower bounds first so that with many rules
few are ever probed; :class:`EventHoldCursor` takes its lower bounds from a
Hyperscan index's tail trie; :class:`SetHoldCursor` asks the module's one VM
program.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

import bisect
import collections
import heapq
from collections.abc import Mapping, Sequence

from prexy.substitution.compiled import CompiledRules
from prexy.substitution.matches import Found, RuleTimeout
from prexy.substitution.pikevm import PikeProbe
from prexy.substitution.reach import Reach, Where, reach_from

#: Hold-back heap entries: a rule's exact reach, or a lower bound of it.
EXACT = -1
BOUND = -2


#: Near the end of a buffer, up to this many positions are matched against
#: all literal prefixes at once (see ``_Trie``) to skip rules' probes.
TRIE_SPAN = 512


class RuleHoldCursor:
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
        scanner: CompiledRules,
        active: Sequence[int],
    ) -> None:
        n = self._begin(buf, timeout, scanner)
        plan = scanner.floor_plan(active)
        # Walking back from the end over bytes that a rule's unbounded repeats
        # may eat, count the others: at most ``bounded`` of them fit in one
        # path.  One walk serves all rules whose repeats eat the same bytes.
        # (This walk, the tail test below and MatchIndex.begun run patterns
        # of byte sets without repeats, linear in the bytes they cross: no
        # timeout, whose CPU-clock reads cost more than such a search;
        # see the .reach module.)
        all_marks: list[list[int]] = []
        for walker, need in plan.walks:
            all_marks.append(walker.marks(buf, pos, n, need))

        def floor_of(where: Where) -> int:
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
        relevant: set[tuple[bytes, Where]] = set()
        end_rule: int | None = None
        low_literal = lowest(plan.lowest_literal)
        if n - low_literal <= TRIE_SPAN:
            places = plan.trie.places(buf, low_literal)
        else:  # a long stretch: every literal group may reach from its floor
            places = {key: [] for key in plan.literal}
        # Many literal groups share a floor computation (``where``): with
        # 1000 rules this loop runs for dozens of keys per buffer.
        floor_cache: dict[Where, int] = {}
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
                    m = scanner.tail_pattern(members).search(buf, floor, n)
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

    def _begin(self, buf: bytes, timeout: float | None, scanner: CompiledRules) -> int:
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
        try:
            return reach_from(self._reach[rule], self._buf, max(start, self._floors[rule]), self._timeout)
        except TimeoutError as exc:
            raise RuleTimeout(rule) from exc

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


class EventHoldCursor(RuleHoldCursor):
    """:class:`RuleHoldCursor` with its lower bounds from the match index: for
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
        scanner: CompiledRules,
        active: Sequence[int],
        candidates: Mapping[int, int],
        plan: IndexPlan | None = None,
        lasts: Mapping[int, int] | None = None,
    ) -> None:
        """``candidates``: the prefilter's rules that may match in
        ``buf[pos:]`` (:attr:`.hsindex.Events.candidates` of the same buffer
        and position); ``plan``: what the index asks of ``active`` rules,
        worked out once per body (:class:`IndexPlan`); ``lasts``: the same
        scan's :attr:`.hsindex.Events.lasts`, when known (see
        :func:`below_floor`)."""
        n = self._begin(buf, timeout, scanner)
        index = scanner.index
        assert index is not None
        if plan is None:
            plan = IndexPlan(scanner, active)
        mask = plan.mask
        if lasts and (plan.long_rules or plan.unbounded):
            candidates = below_floor(buf, pos, candidates, lasts, plan.long_rules + plan.unbounded, scanner.reaches)
        # The few unbounded rules of the index's scan (MatchIndex.alive), when
        # one of them has begun to match; then the bounded rules: one group
        # entry per trie node that may be alive.
        heap: list[tuple[int, int, int]] = []
        if plan.long_rules:
            # (Those that have not begun reach exactly the end: see _end_rule.)
            kept, cut, _ = index.begun(buf, pos, candidates, plan.long_rules)
            if kept:
                heap = [(s, rule, BOUND) for rule, s in index.alive(buf, pos).items() if mask is None or mask[rule]]
            else:  # only cut heads: the rules' probes from there
                heap = [(s, rule, BOUND) for s, rule in cut]
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
        # Unbounded rules that have not begun to match reach exactly the
        # end; the rule-by-rule cursor is for the others (MatchIndex.begun).
        # A rule whose head only the end cuts is probed from there.
        first_end: int | None = None
        self._rest: RuleHoldCursor | None = None
        if plan.unbounded:
            unbounded, cut, first_end = index.begun(buf, pos, candidates, plan.unbounded)
            heap.extend((s, rule, BOUND) for s, rule in cut)
            if unbounded:
                self._rest = RuleHoldCursor(buf, pos, timeout, scanner, unbounded)
        if len(heap) > 1:
            heapq.heapify(heap)
        #: No path starting below ``floor`` can run off the end.
        self.floor = heap[0][0] if heap else n
        if self._rest is not None:
            self.floor = min(self.floor, self._rest.floor)
        self._floors: dict[int, int] = collections.defaultdict(int)
        self._groups = groups
        self._heap = heap
        # Every rule bounded here may still start a match at the very end.
        first = plan.first_bounded
        if first_end is not None and (first is None or first_end < first):
            first = first_end
        self._end_rule = first

    def hold_point(self, lo: int, found: Found | None) -> int | None:
        """See :meth:`RuleHoldCursor.hold_point`: the nearer of the trie's and
        the unbounded rules' answers."""
        mine = super().hold_point(lo, found)
        if self._rest is None:
            return mine
        theirs = self._rest.hold_point(lo, found)
        if mine is None:
            return theirs
        return mine if theirs is None else min(mine, theirs)


def below_floor(
    buf: bytes,
    pos: int,
    candidates: Mapping[int, int],
    lasts: Mapping[int, int],
    rules: Sequence[int],
    reaches: Sequence[Reach],
) -> Mapping[int, int]:
    """``candidates`` less those of the unbounded ``rules`` whose last
    possible start (``lasts``) lies below their floor, so that no match of
    theirs begun in ``buf[pos:]`` can still be running at its end.

    A rule whose unbounded repeats do not eat some bytes (``Reach.other``)
    consumes at most ``Reach.bounded`` of them: a path that reaches the end
    begins above the ``bounded + 1``-th such byte from the end (the floor
    of :class:`RuleHoldCursor`).  One backward search above the last
    start says whether it does; if not, the rule is asked only about a
    head cut by the end, as one that has not begun (``MatchIndex.begun``),
    instead of by a rule-by-rule cursor built for the buffer.  (A page
    whose paragraphs carry ``data-price="..."`` begins that rule in every
    feed: 16 KiB feeds of the othersite pages at 100 rules built one such
    cursor per feed, 25 us each, and now none; 16 KiB feeds / whole
    1.64-1.99x -> 1.53-1.79x there.)
    """
    n = len(buf)
    kept: dict[int, int] | None = None
    for rule in rules:
        last = lasts.get(rule)
        if last is None or rule not in candidates:
            continue
        r = reaches[rule]
        if r.other is None or r.width is not None:
            continue
        if r.floor_mark(buf, max(pos, last + 1), n) < 0:
            continue  # the floor is at or below the last start
        if kept is None:
            kept = dict(candidates)
        del kept[rule]
    return candidates if kept is None else kept


class IndexPlan:
    """What the hold-back question asks of a Hyperscan index for one set
    of active rules, worked out once per body instead of once per buffer:
    the mask, and the index's rule lists filtered by it."""

    __slots__ = ("mask", "long_rules", "unbounded", "first_bounded")

    def __init__(self, scanner: CompiledRules, active: Sequence[int]) -> None:
        index = scanner.index
        assert index is not None
        mask = None if len(active) == len(scanner.patterns) else scanner.mask(active)
        #: Per rule, whether it is active; None when all are.
        self.mask = mask
        #: The active unbounded rules of the index's prefix-closure scan.
        self.long_rules = tuple(r for r in index.long_rules if mask is None or mask[r])
        #: The active unbounded rules of the rule-by-rule cursor.
        self.unbounded = tuple(r for r in index.unbounded if mask is None or mask[r])
        #: The first active rule the index bounds (it may start a match at
        #: the very end of any buffer), or None.
        self.first_bounded = next((r for r in index.bounded_rules if mask is None or mask[r]), None)


class SetHoldCursor:
    """The hold-back question for :class:`SetCursor`: the rules' own floor
    (no path from below it reaches the end, whatever the order), then the
    program run without the end of the text (``pikevm.PikeProbe``)."""

    __slots__ = ("floor", "_probe", "_buf")

    def __init__(self, scanner: CompiledRules, buf: bytes, pos: int, timeout: float | None, rules: Sequence[int]) -> None:
        self.floor = RuleHoldCursor(buf, pos, timeout, scanner, rules).floor
        self._probe = PikeProbe(scanner.set_pattern(rules))
        self._buf = buf

    def hold_point(self, lo: int, found: Found | None) -> int | None:
        """See :meth:`HoldCursor.hold_point`."""
        reached = self._probe.search(self._buf, max(lo, self.floor))
        if reached is None:
            return None
        at = reached.start()
        return at if found is None or at <= found.start else None
