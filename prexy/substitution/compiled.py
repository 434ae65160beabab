"""A rule set compiled for scanning: per-rule patterns and facts, built once.

For each rule: its pattern on the engine that runs it (``regex``; RE2 for
the rules ``regex`` cannot run in bounded time; the sregex-order VM where
only sregex's own thread order gives the module's answer), its hold-back
facts (:class:`~.reach.Reach`), its groups, and the shortcuts the cursors
take (a pure literal's bytes, a rule's fixed leading bytes); and for the
set, the multi-pattern prefilter or Hyperscan index, and caches per subset
of active rules.  The cursors (:mod:`.findcursors`, :mod:`.holdcursors`)
read it; :class:`~.scanner.RegexScanner` adds the choice of cursor.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

from collections.abc import Sequence

import regex

from prexy.substitution import hsindex, prefilter
from prexy.substitution.analysis import (
    backtracking_risk,
    can_match_empty,
    empty_loop_groups,
    first_bytes,
    pure_literal,
)
from prexy.substitution.emit import FLAGS, set_source, to_re2_source, to_regex_source
from prexy.substitution.linear import LinearError, LinearPattern
from prexy.substitution.pikevm import PikePattern, order_reason
from prexy.substitution.reach import FloorPlan, Reach, Where
from prexy.substitution.rulestream import Lead, RuleStream
from prexy.substitution.syntax import ParsedRegex

#: From this many active rules on, a multi-pattern prefilter picks the rules
#: to run on each buffer (see :mod:`.prefilter`).
FILTER_MIN_RULES = 2


#: A rule set with a rule on the sregex-order VM finds all its matches on one
#: VM program of its active rules, as the module does, up to this many rules
#: (above it, each rule on its own: see :class:`SetCursor`).
VM_SET_MAX = 64


#: How :class:`RegexScanner` picks the engine of each rule: ``auto`` puts on
#: RE2 exactly the rules ``regex`` cannot bound (``analysis.backtracking_risk``);
#: ``all`` and ``none`` force one engine.  Measured (16 KiB feeds,
#: median of 5 interleaved runs): every rule on RE2 took 1.01-1.13x the time
#: of ``auto`` on the realistic and synthetic 1-1000-rule sets.
LINEAR_MODES = ("auto", "all", "none")


def linear_reason(parsed: ParsedRegex, mode: str) -> str | None:
    """Why a rule runs on RE2 under ``mode``, or None."""
    if mode == "none":
        return None
    if mode == "all":
        return "every rule runs on RE2"
    if mode != "auto":
        raise ValueError(f"linear must be one of {LINEAR_MODES}, not {mode!r}")
    why = backtracking_risk(parsed.tree)
    return None if why is None else f"regex could backtrack: {why}"


class CompiledRules:
    """Per-rule patterns and facts of a rule set, and caches per rule subset."""

    def __init__(
        self, parsed: Sequence[ParsedRegex], engine: str | None = None, linear: str = "auto"
    ) -> None:
        self._ngroups = [p.ngroups for p in parsed]
        #: Per rule: why it runs on the linear engine (RE2), or None for
        #: ``regex``; and why RE2 could not take a rule that needs it.
        self.linear: list[str | None] = []
        self.linear_refused: dict[int, str] = {}
        self.sources: list[str] = []
        self.patterns: list[regex.Pattern[bytes] | LinearPattern | PikePattern] = []
        for k, p in enumerate(parsed):
            why = linear_reason(p, linear)
            if why is not None:
                source = to_re2_source(p.tree)
                try:
                    self.patterns.append(LinearPattern(source))
                except LinearError as exc:
                    self.linear_refused[k] = str(exc)
                    why = None
                else:
                    self.sources.append(source)
                    self.linear.append(why)
                    continue
            self.linear.append(None)
            self.sources.append(to_regex_source(p.tree, caseless=p.caseless))
            self.patterns.append(regex.compile(self.sources[-1].encode("latin-1"), FLAGS))
        #: Per rule: why its matches (and its hold-back probe's answers,
        #: ``Reach.use_vm``) come from the sregex-order VM (see
        #: :mod:`.pikevm`), or None.
        self.vm = [order_reason(p) for p in parsed]
        #: Whether any rule is on the VM (most sets have none: no per-feed test).
        self._any_vm = any(v is not None for v in self.vm)
        self._parsed = list(parsed)
        self._set_patterns: dict[tuple[int, ...], PikePattern] = {}
        for k, why_vm in enumerate(self.vm):
            if why_vm is not None:
                self.patterns[k] = PikePattern(parsed[k])
        #: Per rule: its match widths when it is exact (see hsindex.exact_widths).
        self.widths = [hsindex.exact_widths(p) for p in parsed]
        self.reaches = [
            Reach(p, w is not None, why is not None)
            for p, w, why in zip(parsed, self.widths, self.linear, strict=True)
        ]
        for k, why_vm in enumerate(self.vm):
            if why_vm is not None:
                pattern = self.patterns[k]
                assert isinstance(pattern, PikePattern)
                self.reaches[k].use_vm(pattern)
        # (A rule on the VM is searched anew from each position, as the
        # module restarts there: see RuleStream.)
        self._empty_ok = [can_match_empty(p.tree) or v is not None for p, v in zip(parsed, self.vm, strict=True)]
        self._loops = [empty_loop_groups(p.tree) for p in parsed]
        #: Per rule: the bytes it matches when it is a pure literal.
        self.words = [pure_literal(p.tree) for p in parsed]
        #: Per rule: its literal when it has no groups either (see RuleStream).
        self._finds = [w if p.ngroups == 0 else None for w, p in zip(self.words, parsed, strict=True)]
        #: Per rule: the fixed bytes all its matches start with, when it is
        #: scanned by ``finditer`` (see RuleStream.next_from).
        self._leads = [
            Lead(r.prefix) if r.prefix and f is None and not e else None
            for r, f, e in zip(self.reaches, self._finds, self._empty_ok, strict=True)
        ]
        self._plans: dict[tuple[int, ...], FloorPlan] = {}
        #: The multi-pattern prefilter (None: every rule scans every buffer).
        self.engine = prefilter.ENGINE if engine is None else engine
        self.filter: prefilter.RuleFilter | None = None
        #: With the ``hyperscan`` engine: where all rules match, in one scan.
        self.index: hsindex.MatchIndex | None = None
        if len(parsed) >= FILTER_MIN_RULES and self.engine == "hyperscan":
            self.index = hsindex.MatchIndex(parsed, self.widths)
        elif len(parsed) >= FILTER_MIN_RULES and self.engine != "none":
            self.filter = prefilter.make_filter(parsed, self.engine)
        self._masks: dict[tuple[int, ...], list[bool]] = {}
        # Compile now what a scan may need, so that no request pays for it
        # (and no scan timeout counts it): the probes of the rules that are
        # not exact (exact ones need none).
        for reach in self.reaches:
            if reach.seqs is None:
                reach.probe  # noqa: B018 - compiled on first access
        # For the hold-back question: rules that cannot match empty get past
        # the end only through one of their first bytes (see RuleHoldCursor).
        self.tail_keys: list[bytes | frozenset[int] | None] = []
        for p, r in zip(parsed, self.reaches, strict=True):
            if can_match_empty(p.tree):
                self.tail_keys.append(None)
            elif len(r.prefix) >= 2:
                self.tail_keys.append(r.prefix[:8])
            else:
                self.tail_keys.append(first_bytes(p.tree))
        self._tail_patterns: dict[frozenset[int], regex.Pattern[bytes]] = {}

    @property
    def ngroups(self) -> list[int]:
        """Per rule: its number of capture groups."""
        return self._ngroups

    @property
    def empty_ok(self) -> list[bool]:
        """Per rule: whether it may match the empty string (an assertion
        counts as empty), or runs on the sregex-order VM."""
        return self._empty_ok

    @property
    def loops(self) -> list[frozenset[int]]:
        """Per rule: its groups inside repeats that can match empty."""
        return self._loops

    def stream(
        self, buf: bytes, timeout: float | None, rule: int, start: int = 0, last: int | None = None
    ) -> RuleStream:
        """A fresh match stream of one rule over ``buf`` (no match starts
        before ``start`` nor after ``last``)."""
        return RuleStream(
            buf, timeout, self.patterns[rule], self._empty_ok[rule], start, self._finds[rule], self._leads[rule],
            len(buf) if last is None else last, rule,
        )

    def mask(self, active: Sequence[int]) -> list[bool]:
        """Per rule, whether it is in ``active`` (cached per subset)."""
        key = tuple(active)
        mask = self._masks.get(key)
        if mask is None:
            if len(self._masks) >= 64:  # many rule subsets: stay bounded
                self._masks.clear()
            mask = self._masks[key] = [False] * len(self.patterns)
            for rule in key:
                mask[rule] = True
        return mask

    def tail_pattern(self, members: frozenset[int]) -> regex.Pattern[bytes]:
        """A backward search for one byte of ``members`` (compiled once per set)."""
        pat = self._tail_patterns.get(members)
        if pat is None:
            src = "(?r)" + set_source(members)
            pat = self._tail_patterns[members] = regex.compile(src.encode("latin-1"), FLAGS)
        return pat

    def floor_plan(self, active: Sequence[int]) -> FloorPlan:
        """How to find the floors of ``active`` rules (cached per rule subset)."""
        key = tuple(active)
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        walk_index: dict[frozenset[int], int] = {}
        walks: list[tuple[Reach, int]] = []
        groups: dict[tuple[Where, bytes | frozenset[int] | None], list[int]] = {}
        for rule in key:
            r = self.reaches[rule]
            where: Where
            if r.width is not None:
                where = (0, r.width, 0)
            elif r.other is None:
                where = (1, 0, 0)
            else:
                j = walk_index.get(r.eaten)
                if j is None:
                    j = walk_index[r.eaten] = len(walks)
                    walks.append((r, 0))
                k = r.bounded + 1
                other, need = walks[j]
                walks[j] = (other, max(need, k + 1))
                where = (2, j, k)
            groups.setdefault((where, self.tail_keys[rule]), []).append(rule)
        if len(self._plans) >= 64:  # many rule subsets: stay bounded
            self._plans.clear()
        plan = self._plans[key] = FloorPlan(walks, groups)
        return plan

    def runs_as_set(self, rules: Sequence[int]) -> bool:
        """Whether ``rules`` (several, one of them flagged) run as one VM program."""
        return self._any_vm and 1 < len(rules) <= VM_SET_MAX and any(self.vm[r] is not None for r in rules)

    def set_pattern(self, rules: Sequence[int]) -> PikePattern:
        """The module's one program of ``rules`` (cached per rule subset)."""
        key = tuple(rules)
        pattern = self._set_patterns.get(key)
        if pattern is None:
            if len(self._set_patterns) >= 16:
                self._set_patterns.clear()
            pattern = self._set_patterns[key] = PikePattern(*(self._parsed[r] for r in key))
        return pattern
