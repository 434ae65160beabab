"""Compiled rule sets: built once per rules file, shared by every response.

A :class:`RuleSet` is immutable.  It holds the rules in directive order, the
media types the filter applies to, the buffer limit and the Last-Modified
policy, a short stable ``digest`` (for derived ETags and cache keys), and the
compiled scanner that every :class:`~prexy.substitution.transducer.Transducer`
built on it shares (``Transducer(ruleset)``: the transducer module imports
this one, never the other way round).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import regex

from prexy.headerrules import HeaderRules
from prexy.substitution import hsindex
from prexy.substitution.analysis import (
    can_match_empty,
    first_bytes,
    last_bytes,
    leading_asserts,
    pure_literal,
    trailing_asserts,
)
from prexy.substitution.byteclass import byte_class
from prexy.substitution.compiled import LINEAR_MODES, VM_SET_MAX, linear_reason
from prexy.substitution.emit import FLAGS, to_re2_source, to_regex_source, to_settled_source
from prexy.substitution.linear import LinearError, LinearPattern
from prexy.substitution.pikevm import order_reason
from prexy.substitution.scanner import RegexScanner
from prexy.substitution.syntax import ParsedRegex
from prexy.substitution.template import Template

__all__ = ["CompileError", "Rule", "RuleSet", "DEFAULT_MAX_BUFFERED_SIZE", "DEFAULT_TYPES"]

DEFAULT_MAX_BUFFERED_SIZE = 8192
DEFAULT_TYPES = frozenset({"text/html"})

#: Most strings one rule may give to :meth:`RuleSet.match_strings` (a
#: scheme-and-host rule gives two).
MATCH_STRINGS_PER_RULE = 4

#: The assertions whose "previous byte" the module takes from its register
#: at a restart (``\\A`` fails there, as it does anywhere past the start).
RESTART_KINDS = frozenset({"bol", "b", "B"})

#: The assertions sregex evaluates with the byte after them (postponed to
#: the next step of its VM): ``$``, ``\\z``, ``\\b``, ``\\B``.
LOOKAHEAD_KINDS = frozenset({"eol", "z", "b", "B"})


class CompileError(ValueError):
    """A rule the dialect accepted but its engine would not compile."""

    def __init__(self, rule: Rule, reason: str) -> None:
        self.rule = rule
        self.reason = reason
        super().__init__(f"{rule.origin or '<rules>'}: pattern '{rule.pattern.decode('latin-1')}': {reason}")


@dataclass(frozen=True)
class Rule:
    """One ``replace_filter`` directive, parsed and checked."""

    pattern: bytes
    replacement: bytes
    caseless: bool
    once: bool
    parsed: ParsedRegex = field(repr=False, compare=False)
    template: Template = field(repr=False, compare=False)
    origin: str = field(default="", compare=False)

    @property
    def file(self) -> str:
        """The file the rule was written in (from ``origin``; ``<rules>`` if unknown)."""
        where, sep, line = self.origin.rpartition(":")
        return where if sep and line.isdigit() else (self.origin or "<rules>")

    @property
    def line(self) -> int | None:
        """The rule's line in :attr:`file` (from ``origin``), if known."""
        _, sep, line = self.origin.rpartition(":")
        return int(line) if sep and line.isdigit() else None

    @property
    def flags(self) -> str:
        """The flags as written in canonical order (``g``, ``i``)."""
        return ("" if self.once else "g") + ("i" if self.caseless else "")


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


@dataclass(frozen=True)
class RuleSet:
    """The compiled rules of one site (one or more rules files, in order).

    Build with :meth:`build`, :meth:`combine`, or the loaders in
    ``prexy.substitution.rules``; create one transducer per response with
    ``Transducer(ruleset)``.
    """

    rules: tuple[Rule, ...]
    types: frozenset[str]
    max_buffered_size: int
    keep_last_modified: bool
    max_buffered_size_set: bool = field(default=False, compare=False)
    keep_last_modified_set: bool = field(default=False, compare=False)
    #: The file's response-header directives (``prexy.headerrules``).
    headers: HeaderRules = field(default_factory=HeaderRules.default, repr=False, compare=False)
    #: How :attr:`scanner` is built (``build``'s ``engine`` and ``linear``).
    engine: str | None = field(default=None, repr=False, compare=False)
    linear: str = field(default="auto", repr=False, compare=False)

    @classmethod
    def build(
        cls,
        rules: Sequence[Rule],
        *,
        types: Iterable[str] = (),
        max_buffered_size: int | None = None,
        keep_last_modified: bool | None = None,
        engine: str | None = None,
        linear: str = "auto",
        headers: HeaderRules | None = None,
        lazy: bool = False,
    ) -> RuleSet:
        """Compile ``rules`` into a rule set (text/html is always a type).

        ``engine`` names the multi-pattern prefilter (``prefilter.ENGINES``,
        or ``"none"``); the default is ``prefilter.ENGINE``.  ``linear``
        says which rules run on RE2 (``compiled.LINEAR_MODES``; by default
        exactly those ``regex`` cannot bound).  Both change speed only,
        never the output.  With ``lazy`` the scanner is compiled (and the
        set warmed) on first use rather than now.
        """
        rules = tuple(rules)
        if rules:
            if linear not in LINEAR_MODES:  # refused now, lazy or not (no rule parsed for it)
                raise ValueError(f"linear must be one of {LINEAR_MODES}, not {linear!r}")
        built = cls(
            rules=rules,
            types=DEFAULT_TYPES | frozenset(_media_type(t) for t in types),
            max_buffered_size=(
                DEFAULT_MAX_BUFFERED_SIZE if max_buffered_size is None else max_buffered_size
            ),
            keep_last_modified=bool(keep_last_modified),
            max_buffered_size_set=max_buffered_size is not None,
            keep_last_modified_set=keep_last_modified is not None,
            headers=headers if headers is not None else HeaderRules.default(),
            engine=engine,
            linear=linear,
        )
        if not lazy:
            built.warm()
        return built

    @cached_property
    def scanner(self) -> RegexScanner | None:
        """The compiled scanner every transducer on this set shares (None
        without rules).  Built on first use: a set made with ``lazy=True``
        costs its parse only until a response needs it (thousands
        of sites, most of them idle in any one worker)."""
        if not self.rules:
            return None
        return RegexScanner([r.parsed for r in self.rules], self.engine, self.linear)

    @property
    def compiled(self) -> bool:
        """Whether :attr:`scanner` has been built (always, for a set without rules)."""
        return not self.rules or "scanner" in self.__dict__

    def check_compiles(self) -> None:
        """Compile each rule's pattern on the engine it would run on, alone,
        without building the scanner (its prefilters and indexes are the
        expensive part): what ``--check`` adds to parsing, so a pattern the
        dialect accepts but the engine refuses is still refused at load.
        Raises ``CompileError`` naming the rule's origin (``file:line``).
        A pure literal (most of a clone's rules) is escaped bytes to either
        engine and is not compiled here."""
        for rule in self.rules:
            p = rule.parsed
            if pure_literal(p.tree) is not None:
                continue
            try:
                if linear_reason(p, self.linear) is not None:
                    try:
                        LinearPattern(to_re2_source(p.tree))
                        continue
                    except LinearError:
                        pass  # runs on regex instead, as the scanner does
                regex.compile(to_regex_source(p.tree, caseless=p.caseless).encode("latin-1"), FLAGS)
            except (regex.error, ValueError, OverflowError) as exc:
                raise CompileError(rule, str(exc)) from None

    def warm(self) -> None:
        """Compute now the per-rule facts every transducer reads, so that
        the first response does not pay for them (``build`` calls this;
        ``transducer.warm`` also rewrites a sample body, which the loaders
        in ``prexy.substitution.rules`` do)."""
        _ = self.rule_facts, self.global_literals, self.expansions, self.restart_facts, self.capturing, self.rule0_last_class

    def match_strings(self, limit: int, only: Iterable[int] | None = None) -> list[bytes]:
        """Every string that the exact rules matching only a few literal
        strings can match, in rule order, at most ``limit`` of them: a
        clone's ``(https?://)www\\.origin\\.com`` gives two, a caseless host
        name its lower-case spelling.  Rules with assertions, repeats
        without a bound, more than :data:`MATCH_STRINGS_PER_RULE` strings,
        or alternatives where one is a prefix of another give none.
        ``only``: just these rules (indexes).  ``transducer.warm`` rewrites
        a page made of them (this compiles the scanner)."""
        out: list[bytes] = []
        scanner = self.scanner
        if scanner is None:
            return out
        # The scanner expanded every exact rule when it was built (a rule
        # that is not exact has no expansion to remember).
        for i in range(len(self.rules)) if only is None else only:
            if len(out) >= limit:
                break
            seqs = scanner.reaches[i].seqs
            keys = hsindex.literal_keys(seqs) if seqs else None
            if keys and len(keys) <= MATCH_STRINGS_PER_RULE:
                out.extend(key for key, _caseless in keys[: limit - len(out)])
        return out

    def warm_sample(self) -> bytes:
        """A short body made of the rules' own leading bytes: rewriting it
        touches the compiled scanners' memory once (``transducer.warm``)."""
        if self.scanner is None:
            return b""
        return b" ".join(r.prefix for r in self.scanner.reaches if r.prefix)

    @classmethod
    def combine(cls, sets: Sequence[RuleSet], lazy: bool = False) -> RuleSet:
        """One rule set from several: rules in order, first setting wins
        (compiled on first use with ``lazy``)."""
        if len(sets) == 1:
            return sets[0]
        rules: list[Rule] = []
        types: set[str] = set()
        max_buffered: int | None = None
        keep: bool | None = None
        for s in sets:
            rules.extend(s.rules)
            types |= s.types
            if max_buffered is None and s.max_buffered_size_set:
                max_buffered = s.max_buffered_size
            if keep is None and s.keep_last_modified_set:
                keep = s.keep_last_modified
        return cls.build(
            rules, types=types, max_buffered_size=max_buffered, keep_last_modified=keep,
            headers=HeaderRules.combine([s.headers for s in sets]), lazy=lazy,
        )

    def engines(self) -> list[tuple[Rule, str, str]]:
        """Per rule: (the rule, the engine it runs on, why), as decided at
        load; ``regex`` unless the rule is on RE2 (:mod:`.linear`) or, where
        sregex's thread order can change its matches, on the sregex-order
        VM (``sregex-vm``, :mod:`.pikevm`)."""
        if not self.rules:
            return []
        # Without compiling a lazy set: the same choice its scanner makes.
        scanner = self.scanner if self.compiled else None
        linear, refused = (scanner.linear, scanner.linear_refused) if scanner is not None else self._plan
        out = []
        vms = scanner.vm if scanner is not None else [order_reason(r.parsed) for r in self.rules]
        # With a flagged rule, a set of a few rules finds all its matches on
        # one VM program, as the module (findcursors.SetCursor).
        together = 1 < len(self.rules) <= VM_SET_MAX and any(v is not None for v in vms)
        for k, rule in enumerate(self.rules):
            why = linear[k]
            vm = vms[k]
            if vm is not None:
                out.append((rule, "sregex-vm", vm + ("; with the whole rule set as one program" if together else "")))
            elif together:
                out.append((rule, "sregex-vm", "the rule set runs as one sregex program (a rule in it needs sregex's order)"))
            elif why is not None:
                out.append((rule, "re2", why))
            elif k in refused:
                out.append((rule, "regex", f"RE2 refused it ({refused[k]}); scans are time-limited"))
            else:
                out.append((rule, "regex", "runs in bounded time on regex"))
        return out

    @cached_property
    def _plan(self) -> tuple[list[str | None], dict[int, str]]:
        """Per rule, why it runs on RE2 (or None), and why RE2 refused the
        ones it should have run: ``RegexScanner``'s choice, made without
        compiling anything but the RE2 patterns."""
        linear: list[str | None] = []
        refused: dict[int, str] = {}
        for k, rule in enumerate(self.rules):
            why = linear_reason(rule.parsed, self.linear)
            if why is not None:
                try:
                    LinearPattern(to_re2_source(rule.parsed.tree))
                except LinearError as exc:
                    refused[k] = str(exc)
                    why = None
            linear.append(why)
        return linear, refused

    def explain(self) -> list[str]:
        """One line per rule: its number (index + 1, as every view names
        rules), where it was written, its pattern, its engine and why
        (``python -m prexy rewrite --explain``)."""
        return [
            f"{k} {rule.origin or '<rules>'}: '{rule.pattern.decode('latin-1')}' {rule.flags or '-'}: {engine}: {why}"
            for k, (rule, engine, why) in enumerate(self.engines(), 1)
        ]

    @property
    def all_types(self) -> bool:
        """True when ``*`` is among the types (the filter applies to all)."""
        return "*" in self.types

    def applies_to(self, content_type: str) -> bool:
        """Whether responses of ``content_type`` are rewritten (parameters ignored)."""
        if not self.rules:
            return False
        return self.all_types or _media_type(content_type) in self.types

    def applies_to_header(self, value: bytes | None) -> bool:
        """:meth:`applies_to` for a raw Content-Type value (None: absent),
        remembered per value: a site serves few distinct ones."""
        answers = self._type_answers
        known = answers.get(value)
        if known is None:
            known = self.applies_to((value or b"").decode("latin-1"))
            if len(answers) < 256:
                answers[value] = known
        return known

    @cached_property
    def _type_answers(self) -> dict[bytes | None, bool]:
        return {}

    @cached_property
    def digest(self) -> str:
        """A short stable hex hash of everything that decides the output."""
        h = hashlib.sha256()
        for r in self.rules:
            for part in (r.pattern, r.replacement, r.flags.encode()):
                h.update(len(part).to_bytes(4, "big"))
                h.update(part)
        h.update(b"|types|" + b",".join(sorted(t.encode("latin-1") for t in self.types)))
        h.update(b"|max|%d|keep|%d" % (self.max_buffered_size, self.keep_last_modified))
        return h.hexdigest()[:16]

    @cached_property
    def global_literals(self) -> list[bytes | None]:
        """Per rule: its fixed replacement when it is global, else None (the
        rules a transducer may replace in a tight loop)."""
        once, literals = self.rule_facts[:2]
        return [None if is_once else literal for is_once, literal in zip(once, literals, strict=True)]

    @cached_property
    def rule_facts(
        self,
    ) -> tuple[list[bool], list[bytes | None], list[Template], bool, tuple[int, ...]]:
        """What every transducer reads per rule, computed once per rule set.

        (once flags, fixed replacement or None, templates, whether any rule
        is global, all rule indexes).  With 1000 rules, building these per
        response cost more than scanning a small page.
        """
        rules = self.rules
        return (
            [r.once for r in rules],
            [r.template.literal if r.template.is_literal else None for r in rules],
            [r.template for r in rules],
            any(not r.once for r in rules),
            tuple(range(len(rules))),
        )

    @cached_property
    def capturing(self) -> bool:
        """Whether the module runs this rule set in its capturing mode: some
        replacement uses the matched bytes (``$&``, ``$N``), or a once-rule
        is among several rules.  That mode counts a match found so far
        among the held bytes (``Transducer._run``)."""
        if any(not r.template.is_literal for r in self.rules):
            return True
        return len(self.rules) > 1 and any(r.once for r in self.rules)

    @cached_property
    def settled_patterns(self) -> list[regex.Pattern[bytes] | None]:
        """Per rule whose match can end with a look-ahead assertion (``$
        \\z \\b \\B`` after its last byte), the rule with those assertions
        holding only where the byte after them is present (``to_settled_source``);
        None for the others.  The module's engine tests such an assertion
        with the next byte, so at the end of a buffer a match that needs one
        is not yet a match found so far (see ``Transducer._run``).

        Also None for a rule that runs on RE2: ``regex`` cannot bound it,
        and RE2 has no look-ahead; its whole match counts, as before."""
        out: list[regex.Pattern[bytes] | None] = []
        for r in self.rules:
            p = r.parsed
            if trailing_asserts(p.tree) & LOOKAHEAD_KINDS and linear_reason(p, self.linear) is None:
                out.append(regex.compile(
                    to_settled_source(p.tree, p.caseless).encode("latin-1"),
                    regex.DOTALL | regex.MULTILINE,
                ))
            else:
                out.append(None)
        return out

    @cached_property
    def restart_facts(self) -> tuple[frozenset[str], frozenset[int] | None] | None:
        """What the module's restart rule needs (see ``transducer``), or
        None when it cannot change anything: fewer than two rules, or no
        rule that tests ``^``, ``\\b`` or ``\\B`` before its first byte.

        (the kinds those rules test; the bytes their matches can start
        with, or None when one of them can match empty anywhere)."""
        if len(self.rules) < 2:
            return None
        kinds: set[str] = set()
        starts: set[int] = set()
        anywhere = False
        for rule in self.rules:
            tree = rule.parsed.tree
            found = leading_asserts(tree) & RESTART_KINDS
            if not found:
                continue
            kinds |= found
            if can_match_empty(tree):
                anywhere = True
            starts |= first_bytes(tree)
        if not kinds:
            return None
        return frozenset(kinds), None if anywhere else frozenset(starts)

    @cached_property
    def rule0_last_class(self) -> int | None:
        """The byte class (``byteclass.NONE``/``NEWLINE``/``WORD``) every
        match of rule 0 ends with, when there is one and rule 0 cannot match
        empty: then the restart rule's register needs no tracking, only
        whether rule 0 has matched."""
        if not self.rules:
            return None
        tree = self.rules[0].parsed.tree
        if can_match_empty(tree):
            return None
        classes = {byte_class(b) for b in last_bytes(tree)}
        return classes.pop() if len(classes) == 1 else None

    @cached_property
    def expansions(self) -> tuple[list[bool], dict[tuple[int, bytes], bytes]]:
        """Per rule, whether its replacement depends on the matched bytes
        alone (an exact rule: see ``hsindex.exact_widths``), and the
        expansions remembered for those, shared by the transducers."""
        widths = self.scanner.widths if self.scanner is not None else []
        return [w is not None for w in widths], {}
