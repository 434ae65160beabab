"""A Pike VM that runs a rule exactly as sregex, the module's engine, does.

sregex compiles a pattern to a small program (Russ Cox's instruction set:
CHAR/IN/ANY consume a byte; SPLIT, JMP, SAVE, ASSERT and MATCH do not) and
runs every thread of it in step over the input, in priority order: leftmost
start first, then Perl priority.  Two details of its VM make it differ from a
Perl (backtracking) engine and from RE2 on some patterns:

* A look-ahead assertion (``$``, ``\\z``, ``\\b``, ``\\B``) is not tested
  when a thread reaches it, but at the next step, with the next byte.  When
  it holds, the thread is added back for the *same* position with the
  previous step's tag, so it is dropped at any instruction that a thread
  already reached at that position (while the previous byte was read), even
  one of lower priority.  ``^\\s+|\\s+$`` shares its end (``SAVE 1``,
  ``MATCH``) between both alternatives: on ``!\\n     \\nabc`` the ``^\\s+``
  thread from the second line reaches the end first and the ``\\s+$`` match
  from the newline, Perl's answer, is lost; the module matches
  ``     \\n`` there.
* A SPLIT already visited at a step still sends a thread down its second
  branch when that branch was not visited (after a match cut the first
  branch's walk short).

:func:`compile_program` lays the program out as sregex's compiler does
(left-nested alternation, the ``.*?`` start loop, ``x{1,}`` as ``x x*`` but
``x+`` as a loop back, ``x{0,3}`` as ``x?x?x?``), and :class:`PikePattern`
runs it as ``sre_vm_pike_exec`` does on one buffer that ends the text, with
``^`` and ``\\b`` looking at the real byte before the scan's start.  Its
calling conventions are :class:`.linear.LinearPattern`'s (``search``,
``match``, ``finditer``), so the scanner uses it as a rule's pattern.

Only rules where this order can matter run here (:func:`order_reason`: an
instruction right after a look-ahead assertion can also be reached by a path
that does not pass it); every other rule gives the same matches on ``regex``
or RE2, which are much faster.  The VM is linear in the input (at most one
thread per instruction per step).  For speed, RE2 finds where a match can
start: a thread that started where no match of the pattern starts (in any
order) only holds instructions from which no match follows, so dropping the
threads of such starts, as sregex's own leading-byte skip does, changes
nothing; the VM jumps to the next start RE2 finds whenever it holds only the
threads of the current start.  And a match's span comes from a lazy DFA over
the VM's steps (:class:`_Lazy`: a step depends only on the thread list, the
previous step's tags, the byte and the class of the byte before, so each is
computed once and replayed); its groups, only when read, from the VM with
captures.  Measured on the realistic 20 KB page (``bench/bench_pikevm.py``):
``^\\s+|\\s+$`` at about 7 MB/s, against 3 MB/s for the plain VM and 30-55
MB/s for the same rule on ``regex`` in Perl's order.

Pure: imports no Twisted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prexy.substitution.emit import to_re2_source
from prexy.substitution.linear import LinearError, LinearPattern
from prexy.substitution.syntax import (
    ALL_BYTES,
    Alt,
    Assert,
    Cat,
    Char,
    Group,
    Node,
    ParsedRegex,
    Repeat,
    Set,
)

__all__ = ["PikeMatch", "PikePattern", "Program", "compile_program", "order_reason"]

# Opcodes (sregex's, with CHAR/IN/NOTIN/ANY folded into one byte-set test).
CONSUME = 0
MATCH = 1
JMP = 2
SPLIT = 3
SAVE = 4
ASSERT = 5

#: Assertions sregex tests when a thread reaches them (they look back).
LOOKBEHIND = frozenset(("bol", "A"))
#: Assertions sregex postpones to the next step (they look at the next byte).
LOOKAHEAD = frozenset(("eol", "z", "b", "B"))
_SYMBOL = {"eol": "$", "z": "\\z", "b": "\\b", "B": "\\B"}

_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

#: The program's first instructions: the ``.*?`` start loop, then ``SAVE 0``.
START = 0
LOOP_ANY = 1
BODY = 3


@dataclass
class _Ins:
    op: int
    x: int = -1
    y: int = -1
    arg: object = None


@dataclass(frozen=True)
class Program:
    """A compiled rule: per instruction its opcode, branch targets and
    argument (byte set, capture slot or assertion kind)."""

    ops: tuple[int, ...]
    xs: tuple[int, ...]
    ys: tuple[int, ...]
    args: tuple[object, ...]
    #: Per rule: its first capture group in the vector, its group count.
    bases: tuple[int, ...]
    ngroups: tuple[int, ...]


class _Emitter:
    """``sre_regex_emit_bytecode`` on the dialect's tree."""

    def __init__(self) -> None:
        self.code: list[_Ins] = []

    def _add(self, ins: _Ins) -> int:
        self.code.append(ins)
        return len(self.code) - 1

    def emit(self, node: Node) -> None:
        if isinstance(node, Char):
            self._add(_Ins(CONSUME, arg=frozenset((node.byte,))))
        elif isinstance(node, Set):
            self._add(_Ins(CONSUME, arg=node.members))
        elif isinstance(node, Assert):
            self._add(_Ins(ASSERT, arg=node.kind))
        elif isinstance(node, Group):
            if node.index is None:
                self.emit(node.child)
            else:
                self._add(_Ins(SAVE, arg=2 * node.index))
                self.emit(node.child)
                self._add(_Ins(SAVE, arg=2 * node.index + 1))
        elif isinstance(node, Cat):
            for item in node.items:
                self.emit(item)
        elif isinstance(node, Alt):
            self._alt(node.items)
        elif isinstance(node, Repeat):
            self._repeat(node)
        else:  # pragma: no cover - exhaustive
            raise TypeError(node)

    def _alt(self, items: tuple[Node, ...]) -> None:
        # The grammar is left-recursive: a|b|c is Alt(Alt(a, b), c).
        if len(items) == 1:
            self.emit(items[0])
            return
        split = self._add(_Ins(SPLIT))
        self.code[split].x = len(self.code)
        self._alt(items[:-1])
        jmp = self._add(_Ins(JMP))
        self.code[split].y = len(self.code)
        self.emit(items[-1])
        self.code[jmp].x = len(self.code)

    def _repeat(self, node: Repeat) -> None:
        child, low, high, greedy = node.child, node.low, node.high, node.greedy
        if not node.counted:
            if (low, high) == (0, None):
                self._star(child, greedy)
            elif (low, high) == (1, None):
                self._plus(child, greedy)
            elif (low, high) == (0, 1):
                self._quest(child, greedy)
            else:  # pragma: no cover - the parser makes only those three
                raise ValueError((low, high))
            return
        # sre_regex_desugar_counted_repetition: subj{low}, then subj* or
        # (subj?){high - low}, each copy compiled on its own.
        if (low, high) == (1, 1):
            self.emit(child)
            return
        for _ in range(low):
            self.emit(child)
        if high == low:
            return
        if high is None:
            self._star(child, greedy)
            return
        for _ in range(high - low):
            self._quest(child, greedy)

    def _star(self, child: Node, greedy: bool) -> None:
        split = self._add(_Ins(SPLIT))
        self.code[split].x = len(self.code)
        self.emit(child)
        self._add(_Ins(JMP, x=split))
        self.code[split].y = len(self.code)
        self._order(split, greedy)

    def _plus(self, child: Node, greedy: bool) -> None:
        first = len(self.code)
        self.emit(child)
        split = self._add(_Ins(SPLIT, x=first))
        self.code[split].y = len(self.code)
        self._order(split, greedy)

    def _quest(self, child: Node, greedy: bool) -> None:
        split = self._add(_Ins(SPLIT))
        self.code[split].x = len(self.code)
        self.emit(child)
        self.code[split].y = len(self.code)
        self._order(split, greedy)

    def _order(self, split: int, greedy: bool) -> None:
        if not greedy:
            ins = self.code[split]
            ins.x, ins.y = ins.y, ins.x


def compile_program(*parsed: ParsedRegex) -> Program:
    """``.*?(pattern)`` laid out as sregex lays it out (see the module doc).

    With several patterns, the module's program for a list of rules
    (``sre_regex_parse_multi``): ``.*?`` then ``(r0)|(r1)|...`` nested to
    the left, each with its own end (``MATCH`` says which rule) and its
    captures after the previous rules' (``Program.bases``)."""
    e = _Emitter()
    # CAT(STAR_lazy(DOT), TOPLEVEL(PAREN_0(pattern))), or the rules' ALT.
    e.code.append(_Ins(SPLIT, x=BODY, y=LOOP_ANY))
    e.code.append(_Ins(CONSUME, arg=ALL_BYTES))
    e.code.append(_Ins(JMP, x=START))
    bases: list[int] = []
    base = 0
    for p in parsed:
        bases.append(base)
        base += p.ngroups + 1

    def rule(k: int) -> None:
        e.code.append(_Ins(SAVE, arg=2 * bases[k]))
        start = len(e.code)
        e.emit(parsed[k].tree)
        if bases[k]:
            # The rule's own groups, numbered after the previous rules'.
            for ins in e.code[start:]:
                if ins.op == SAVE:
                    assert isinstance(ins.arg, int)
                    ins.arg += 2 * bases[k]
        e.code.append(_Ins(SAVE, arg=2 * bases[k] + 1))
        e.code.append(_Ins(MATCH, arg=k))

    def alt(n: int) -> None:
        if n == 1:
            rule(0)
            return
        split = len(e.code)
        e.code.append(_Ins(SPLIT, x=split + 1))
        alt(n - 1)
        jmp = len(e.code)
        e.code.append(_Ins(JMP))
        e.code[split].y = len(e.code)
        rule(n - 1)
        e.code[jmp].x = len(e.code)

    alt(len(parsed))
    code = e.code
    return Program(
        tuple(i.op for i in code),
        tuple(i.x for i in code),
        tuple(i.y for i in code),
        tuple(i.arg for i in code),
        tuple(bases),
        tuple(p.ngroups for p in parsed),
    )


def _closure(prog: Program, pc: int) -> set[int]:
    """Instructions a thread added at ``pc`` can visit without consuming a
    byte or passing a look-ahead assertion (``^`` and ``\\A`` assumed to hold)."""
    seen: set[int] = set()
    stack = [pc]
    ops, xs, ys, args = prog.ops, prog.xs, prog.ys, prog.args
    while stack:
        pc = stack.pop()
        if pc in seen:
            continue
        seen.add(pc)
        op = ops[pc]
        if op == JMP:
            stack.append(xs[pc])
        elif op == SPLIT:
            stack.append(xs[pc])
            stack.append(ys[pc])
        elif op == SAVE or (op == ASSERT and args[pc] in LOOKBEHIND):
            stack.append(pc + 1)
    return seen


def _has_lookahead(node: Node) -> bool:
    stack = [node]
    while stack:
        n = stack.pop()
        kind = type(n)
        if kind is Char or kind is Set:
            continue
        if kind is Assert:
            if n.kind in LOOKAHEAD:  # type: ignore[union-attr]
                return True
        elif kind is Cat or kind is Alt:
            stack.extend(n.items)  # type: ignore[union-attr]
        else:
            stack.append(n.child)  # type: ignore[union-attr]
    return False


def order_reason(parsed: ParsedRegex) -> str | None:
    """Why the rule must run on this VM to match as the module does, or None.

    That is when, in the compiled program, an instruction a thread reaches
    right after a look-ahead assertion can also be reached by a path that
    does not pass that assertion: then sregex's postponed test can drop the
    assertion's thread for one of lower priority (see the module doc).
    """
    if not _has_lookahead(parsed.tree):
        return None  # most rules: decided without compiling
    prog = compile_program(parsed)
    asserts = [pc for pc, op in enumerate(prog.ops) if op == ASSERT and prog.args[pc] in LOOKAHEAD]
    if not asserts:
        return None
    entries = [START]
    entries += [pc + 1 for pc, op in enumerate(prog.ops) if op == CONSUME]
    entries += [pc + 1 for pc in asserts]
    closures = {e: _closure(prog, e) for e in set(entries)}
    for a in asserts:
        after = closures[a + 1]
        for e, seen in closures.items():
            if e != a + 1 and after & seen:
                sym = _SYMBOL[str(prog.args[a])]
                return (
                    f"sregex's thread order: a path through {sym} can meet another path "
                    f"right after it (sregex tests {sym} one byte later and keeps the other)"
                )
    return None


class PikeMatch:
    """A match of :class:`PikePattern`, read as a ``regex`` match
    (``rule``: which of the program's rules matched).

    The span comes from the scan; the other groups, on first use, from the
    VM with captures run again from where the scan started (it finds the
    same match)."""

    __slots__ = ("string", "rule", "_span", "_caps", "_base", "_ngroups", "_again")

    def __init__(
        self, string: bytes, span: tuple[int, int], rule: int, base: int, ngroups: int,
        caps: tuple[int, ...] | None = None, again: Callable[[], _Found | None] | None = None,
    ) -> None:
        self.string = string
        self.rule = rule
        self._span = span
        self._caps = caps
        self._base = base
        self._ngroups = ngroups
        self._again = again

    def span(self, n: int = 0) -> tuple[int, int]:
        if n == 0:
            return self._span
        if n > self._ngroups:
            return (-1, -1)
        caps = self._caps
        if caps is None:
            assert self._again is not None
            found = self._again()
            assert found is not None and found[1] == self.rule
            caps = self._caps = found[0]
            k = 2 * self._base
            assert (caps[k], caps[k + 1]) == self._span, (caps, self._span)
        k = 2 * (self._base + n)
        start, end = caps[k], caps[k + 1]
        if start < 0 or end < 0:
            return (-1, -1)
        return (start, end)

    def start(self, n: int = 0) -> int:
        return self.span(n)[0]

    def end(self, n: int = 0) -> int:
        return self.span(n)[1]

    def spans(self, n: int = 0) -> list[tuple[int, int]]:
        span = self.span(n)
        return [] if span[0] < 0 else [span]

    def group(self, n: int = 0) -> bytes | None:
        start, end = self.span(n)
        return None if start < 0 else bytes(self.string[start:end])

    def marked(self) -> bool:
        """Never a probe's match (see :meth:`.linear.LinearMatch.marked`)."""
        return False


_Found = tuple[tuple[int, ...], int]


class PikePattern:
    """A rule compiled for the VM, with ``regex``'s calling conventions.

    Several rules make the module's one program for them (for tests: the
    scanner gives each rule its own).  ``timeout=`` is accepted and
    ignored: a scan is linear in its input.
    """

    __slots__ = ("program", "_starts", "_ncaps", "_parsed", "_reaches", "_lazy")

    def __init__(self, *parsed: ParsedRegex) -> None:
        self.program = compile_program(*parsed)
        self._parsed = parsed
        self._reaches: LinearPattern | None = None
        self._ncaps = 2 * sum(p.ngroups + 1 for p in parsed)
        #: Where a match can start (in any priority order): RE2's leftmost
        #: match.  None if RE2 cannot take the pattern: the VM then runs on
        #: every byte.
        self._starts: LinearPattern | None
        try:
            self._starts = LinearPattern("|".join(f"(?:{to_re2_source(p.tree)})" for p in parsed))
        except LinearError:
            self._starts = None
        self._lazy = _Lazy(self.program, self._starts)

    def _result(self, string: bytes, found: _Found | None) -> PikeMatch | None:
        if found is None:
            return None
        caps, rule = found
        base = self.program.bases[rule]
        return PikeMatch(string, (caps[2 * base], caps[2 * base + 1]), rule, base, self.program.ngroups[rule], caps)

    def _scanned(self, string: bytes, pos: int, end: int) -> PikeMatch | None:
        """The match from ``pos`` by the lazy DFA (:class:`_Lazy`), its
        groups read by the VM only if asked for."""
        found = self._lazy.scan(string, pos, end)
        if found is None:
            return None
        start, stop, rule = found
        prog = self.program
        if not prog.ngroups[rule]:
            return PikeMatch(string, (start, stop), rule, prog.bases[rule], 0)
        return PikeMatch(
            string, (start, stop), rule, prog.bases[rule], prog.ngroups[rule],
            again=lambda: self._exec(string, pos, end, True)[0],
        )

    def search(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> PikeMatch | None:
        end = len(string) if endpos is None else min(endpos, len(string))
        if end < len(string):
            string = string[:end]
        return self._scanned(string, max(pos, 0), end)

    def match(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> PikeMatch | None:
        """The match that starts at ``pos``: the program without its start
        loop (sregex has no anchored mode; this is its order from ``pos``)."""
        end = len(string) if endpos is None else min(endpos, len(string))
        return self._result(string, self._exec(string, max(pos, 0), end, False)[0])

    def finditer(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> Iterator[PikeMatch]:
        end = len(string) if endpos is None else min(endpos, len(string))
        if end < len(string):
            string = string[:end]
        while pos <= end:
            m = self._scanned(string, pos, end)
            if m is None:
                return
            yield m
            start, stop = m.span()
            pos = stop if stop > start else stop + 1

    def pending(self, string: bytes, pos: int, anchored: bool = False) -> int | None:
        """Where, running from ``pos`` over ``string`` with more bytes to
        come (sregex without ``eof``), the earliest thread still alive at
        the end started (the end itself while no match is found: a match
        may still start there); None when the VM has decided: a match that
        no thread of higher priority can replace, or none at all.
        ``anchored``: only the threads that start at ``pos``."""
        return self._exec(string, pos, len(string), not anchored, False)[1]

    def _reach_finder(self) -> LinearPattern | None:
        """RE2 for where some path either matches or runs off the end
        (the hold-back probe, ``emit.to_re2_source(probe=True)``)."""
        if self._reaches is None:
            try:
                self._reaches = LinearPattern(
                    "|".join(f"(?:{to_re2_source(p.tree, probe=True)})" for p in self._parsed)
                )
            except LinearError:
                return None
        return self._reaches

    def _exec(self, s: bytes, pos: int, end: int, unanchored: bool, eof: bool = True) -> tuple[_Found | None, int]:
        """``sre_vm_pike_exec`` on ``s[:end]`` from ``pos``: the capture
        vector of the match and its rule, or None; and with ``eof`` false
        (``end`` is not the end of the text) the start of the earliest
        thread alive at ``end``, or -1 (see :meth:`pending`)."""
        prog = self.program
        ops, xs, ys, args = prog.ops, prog.xs, prog.ys, prog.args
        if end < len(s):
            s = s[:end]  # the end of the text for RE2 too (``$``, ``\b``)
        if not unanchored:
            starts = None
        elif eof:
            starts = self._starts
        else:
            starts = self._reach_finder()
        if starts is not None:
            first = starts.search(s, pos, end)
            if first is None:
                return None, -1
            pos = first.start()
        marks = [0] * len(ops)
        tag = 1
        word = _WORD

        def add(lst: list[tuple[int, tuple[int, ...], bool]], pc: int, caps: tuple[int, ...], at: int,
                done: bool) -> _Found | None:
            # sre_vm_pike_add_thread, its recursion on an explicit stack.
            stack = [(pc, caps)]
            while stack:
                pc, caps = stack.pop()
                op = ops[pc]
                if marks[pc] == tag:
                    if op == SPLIT and marks[ys[pc]] != tag:
                        stack.append((ys[pc], caps))
                    continue
                marks[pc] = tag
                if op == CONSUME:
                    lst.append((pc, caps, False))
                elif op == SPLIT:
                    stack.append((ys[pc], caps))
                    stack.append((xs[pc], caps))
                elif op == JMP:
                    stack.append((xs[pc], caps))
                elif op == SAVE:
                    slot = args[pc]
                    assert isinstance(slot, int)
                    if slot < len(caps):
                        caps = caps[:slot] + (at,) + caps[slot + 1 :]
                    stack.append((pc + 1, caps))
                elif op == ASSERT:
                    kind = args[pc]
                    if kind == "bol":
                        if at == 0 or s[at - 1] == 10:
                            stack.append((pc + 1, caps))
                    elif kind == "A":
                        if at == 0:
                            stack.append((pc + 1, caps))
                    else:
                        # Postponed to the next step; \b and \B keep the
                        # class of the byte before.
                        lst.append((pc, caps, at > 0 and s[at - 1] in word))
                elif done:  # MATCH, reached while consuming
                    rule = args[pc]
                    assert isinstance(rule, int)
                    return caps, rule
                else:
                    lst.append((pc, caps, False))
            return None

        slots = [2 * b for b in prog.bases]

        def began(caps: tuple[int, ...]) -> int:
            # A thread has passed the start SAVE of exactly one rule.
            for k in slots:
                if caps[k] >= 0:
                    return caps[k]
            return -1

        clist: deque[tuple[int, tuple[int, ...], bool]] = deque()
        first_list: list[tuple[int, tuple[int, ...], bool]] = []
        unset = (-1,) * self._ncaps
        add(first_list, START if unanchored else BODY, unset, pos, False)
        clist.extend(first_list)
        matched: _Found | None = None
        sp = pos
        cand = pos  # a match can start here; none in [the last search, cand)
        while clist:
            if starts is not None and matched is None and sp > cand:
                head = clist[0]
                if head[0] == LOOP_ANY or began(head[1]) == sp:
                    # Only the threads of this start are alive: jump to the
                    # next place where a match can start.
                    nxt = starts.search(s, sp, end)
                    if nxt is None:
                        return None, -1
                    cand = nxt.start()
                    if cand > sp:
                        sp = cand
                        tag += 1
                        clist.clear()
                        first_list = []
                        add(first_list, START, unset, sp, False)
                        clist.extend(first_list)
            at_end = sp >= end
            if at_end and not eof:
                break
            tag += 1
            c = -1 if at_end else s[sp]
            nlist: list[tuple[int, tuple[int, ...], bool]] = []
            while clist:
                pc, caps, seen_word = clist.popleft()
                op = ops[pc]
                if op == CONSUME:
                    if at_end or c not in args[pc]:  # type: ignore[operator]
                        continue
                    found = add(nlist, pc + 1, caps, sp + 1, True)
                    if found is not None:
                        matched = found
                        clist.clear()
                        break
                elif op == ASSERT:
                    kind = args[pc]
                    if kind == "eol":
                        holds = at_end or c == 10
                    elif kind == "z":
                        holds = at_end
                    else:
                        differ = seen_word != (not at_end and c in word)
                        holds = differ if kind == "b" else not differ
                    if holds:
                        # assertion_hold: added back for this position with
                        # the previous step's tag, ahead of the rest.
                        tag -= 1
                        again: list[tuple[int, tuple[int, ...], bool]] = []
                        add(again, pc + 1, caps, sp, False)
                        tag += 1
                        clist.extendleft(reversed(again))
                else:  # MATCH
                    rule = args[pc]
                    assert isinstance(rule, int)
                    matched = caps, rule
                    clist.clear()
                    break
            clist.extend(nlist)
            if at_end:
                break
            sp += 1
        if eof or not clist:
            return matched, -1
        head = clist[0]
        return matched, (end if head[0] == LOOP_ANY else began(head[1]))


class _Reached:
    """A hold-back probe's answer, read as a marked ``regex`` probe match."""

    __slots__ = ("_at",)

    def __init__(self, at: int) -> None:
        self._at = at

    def start(self, n: int = 0) -> int:
        return self._at

    def group(self, n: object = 0) -> bytes:
        return b""  # every answer is marked (see reach.marked)


class PikeProbe:
    """The hold-back probe of a rule on the VM (``reach.reach_from``
    calls ``search`` and ``match``): a position whose match may change
    when more bytes arrive, by the VM's own order, not Perl's.

    ``search(buf, start)``: the leftmost such position from ``start``,
    running the VM from ``start`` and again after each match it decides
    (as a probe looks at every start); ``match(buf, i)``: ``i`` itself,
    when a thread started there is alive at the end.
    """

    __slots__ = ("_pattern",)

    def __init__(self, pattern: PikePattern) -> None:
        self._pattern = pattern

    def search(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> _Reached | None:
        n = len(string) if endpos is None else min(endpos, len(string))
        pattern = self._pattern
        while pos <= n:
            found, alive = pattern._exec(string, pos, n, True, False)
            if alive >= 0:
                return _Reached(alive)
            if found is None:
                return None
            caps, rule = found
            pos = caps[2 * pattern.program.bases[rule]] + 1
        return None

    def match(
        self, string: bytes, pos: int = 0, endpos: int | None = None, timeout: float | None = None
    ) -> _Reached | None:
        n = len(string) if endpos is None else min(endpos, len(string))
        alive = self._pattern._exec(string, pos, n, False, False)[1]
        return None if alive < 0 else _Reached(alive)


#: The class of the byte before a position, as the VM's look-behind sees
#: it: the start of the text, a newline, a word byte, another byte.
_AT_START, _NEWLINE, _WORDY, _OTHER = 0, 1, 2, 3
_CLASS = bytes(_NEWLINE if b == 10 else _WORDY if b in _WORD else _OTHER for b in range(256))

#: Where a thread's start comes from in a transition: a thread of the state
#: it left (index >= 0), this position, the next one, or none yet.
_HERE, _NEXT, _NONE = -1, -2, -3

#: Lazy DFA steps (transitions) kept per pattern before the cache starts
#: over: a few MB at most per rule, whatever the input.
MAX_STATES = 16384


class _State:
    """One step's thread list without captures: per thread its instruction
    and the class ``\\b``/``\\B`` saw before it, in priority order; the
    instructions the step that made it visited (sregex's previous tag); and
    the transitions found so far, by (byte, class of the byte before)."""

    __slots__ = ("threads", "visited", "trans")

    def __init__(self, threads: tuple[tuple[int, bool], ...], visited: frozenset[int]) -> None:
        self.threads = threads
        self.visited = visited
        self.trans: dict[int, tuple[_State, list[int], tuple[int, int, int] | None]] = {}


class _Lazy:
    """:meth:`PikePattern._exec` as a lazy DFA: the VM's step depends only
    on the thread list's instructions, the instructions visited by the step
    before (the tags), the byte and the class of the byte before it; so each
    step is computed once and replayed.  A thread keeps only where it
    started, which the transition says how to carry (from a parent, or this
    or the next position); captures are left to the VM when asked for."""

    __slots__ = ("program", "starts", "states", "_seeds", "_rule_of_slot", "_steps")

    def __init__(self, program: Program, starts: LinearPattern | None) -> None:
        self.program = program
        self.starts = starts
        self.states: dict[tuple[tuple[tuple[int, bool], ...], frozenset[int]], _State] = {}
        self._seeds: dict[int, tuple[_State, list[int]]] = {}
        #: SAVE slots that start a rule's match.
        self._rule_of_slot = frozenset(2 * b for b in program.bases)
        self._steps = 0

    def _intern(self, threads: tuple[tuple[int, bool], ...], visited: frozenset[int]) -> _State:
        key = (threads, visited)
        state = self.states.get(key)
        if state is None:
            self._steps += 1
            if self._steps >= MAX_STATES or len(self.states) >= MAX_STATES:
                # Start over: no state keeps its steps (a scan in progress
                # holds one), so the old ones can go.
                for old in self.states.values():
                    old.trans.clear()
                self.states.clear()
                self._seeds.clear()
                self._steps = 0
            state = self.states[key] = _State(threads, visited)
        return state

    def _step(
        self,
        threads: tuple[tuple[int, bool], ...],
        visited: frozenset[int],
        c: int,
        before: int,
        seed: bool = False,
    ) -> tuple[_State, list[int], tuple[int, int, int] | None]:
        """One step of ``sre_vm_pike_exec`` on byte ``c`` (-1: the end of
        the text), the byte before it of class ``before``; or with ``seed``
        the first add_thread at the program's start.

        Its ``add`` walks the program as :meth:`PikePattern._exec`'s does,
        carrying the thread's start instead of its capture vector: two
        copies of one walk, kept apart because each is the hot loop of its
        engine; ``test_pikevm.test_lazy_dfa_is_the_vm`` holds them equal."""
        prog = self.program
        ops, xs, ys, args = prog.ops, prog.xs, prog.ys, prog.args
        start_slots = self._rule_of_slot
        prev, cur = 1, 2
        marks = dict.fromkeys(visited, prev)
        tag = cur
        at_end = c < 0

        def add(lst: list[tuple[int, int, bool]], pc: int, origin: int, ahead: bool,
                done: bool) -> tuple[int, int, int] | None:
            # ``ahead``: the thread is added for the next position (the byte
            # before it is ``c``), else for this one.
            stack = [(pc, origin)]
            while stack:
                pc, origin = stack.pop()
                op = ops[pc]
                if marks.get(pc) == tag:
                    if op == SPLIT and marks.get(ys[pc]) != tag:
                        stack.append((ys[pc], origin))
                    continue
                marks[pc] = tag
                if op == CONSUME:
                    lst.append((pc, origin, False))
                elif op == SPLIT:
                    stack.append((ys[pc], origin))
                    stack.append((xs[pc], origin))
                elif op == JMP:
                    stack.append((xs[pc], origin))
                elif op == SAVE:
                    if args[pc] in start_slots:
                        origin = _NEXT if ahead else _HERE
                    stack.append((pc + 1, origin))
                elif op == ASSERT:
                    kind = args[pc]
                    back = (_NEWLINE if c == 10 else _WORDY if c in _WORD else _OTHER) if ahead else before
                    if kind == "bol":
                        if back in (_AT_START, _NEWLINE):
                            stack.append((pc + 1, origin))
                    elif kind == "A":
                        if back == _AT_START:
                            stack.append((pc + 1, origin))
                    else:
                        lst.append((pc, origin, back == _WORDY))
                elif done:
                    rule = args[pc]
                    assert isinstance(rule, int)
                    return origin, 1, rule
                else:
                    lst.append((pc, origin, False))
            return None

        nlist: list[tuple[int, int, bool]] = []
        matched: tuple[int, int, int] | None = None
        if seed:
            # ctx->tag = prog->tag + 1 for the first add; the step then
            # runs with the next tag, for which these are the previous ones.
            tag = prev
            add(nlist, START, _NONE, False, False)
        else:
            clist: deque[tuple[int, int, bool]] = deque(
                (pc, k, sw) for k, (pc, sw) in enumerate(threads)
            )
            while clist:
                pc, origin, seen_word = clist.popleft()
                op = ops[pc]
                if op == CONSUME:
                    if at_end or c not in args[pc]:  # type: ignore[operator]
                        continue
                    found = add(nlist, pc + 1, origin, True, True)
                    if found is not None:
                        matched = found
                        break
                elif op == ASSERT:
                    kind = args[pc]
                    if kind == "eol":
                        holds = at_end or c == 10
                    elif kind == "z":
                        holds = at_end
                    else:
                        differ = seen_word != (not at_end and c in _WORD)
                        holds = differ if kind == "b" else not differ
                    if holds:
                        tag = prev
                        again: list[tuple[int, int, bool]] = []
                        add(again, pc + 1, origin, False, False)
                        tag = cur
                        clist.extendleft(reversed(again))
                else:  # MATCH
                    rule = args[pc]
                    assert isinstance(rule, int)
                    matched = origin, 0, rule
                    break
        now = prev if seed else cur
        state = self._intern(
            tuple((pc, sw) for pc, _, sw in nlist),
            frozenset(pc for pc, t in marks.items() if t == now),
        )
        return state, [origin for _, origin, _ in nlist], matched

    def _seed(self, before: int) -> tuple[_State, list[int]]:
        seeded = self._seeds.get(before)
        if seeded is None:
            state, origins, _ = self._step((), frozenset(), -1, before, seed=True)
            seeded = self._seeds[before] = (state, origins)
        return seeded

    def scan(self, s: bytes, pos: int, end: int) -> tuple[int, int, int] | None:
        """The VM's match from ``pos`` in ``s[:end]`` (the end of the text):
        (start, end, rule), or None."""
        starts = self.starts
        if starts is not None:
            first = starts.search(s, pos, end)
            if first is None:
                return None
            pos = first.start()
        before = _AT_START if pos == 0 else _CLASS[s[pos - 1]]
        state, origins = self._seed(before)
        began = [pos if o == _HERE else -1 for o in origins]
        matched: tuple[int, int, int] | None = None
        sp = pos
        cand = pos
        while state.threads:
            if starts is not None and matched is None and sp > cand:
                if state.threads[0][0] == LOOP_ANY or began[0] == sp:
                    nxt = starts.search(s, sp, end)
                    if nxt is None:
                        return None
                    cand = nxt.start()
                    if cand > sp:
                        sp = cand
                        before = _CLASS[s[sp - 1]]
                        state, origins = self._seed(before)
                        began = [sp if o == _HERE else -1 for o in origins]
            c = -1 if sp >= end else s[sp]
            key = (c + 1) * 4 + before
            step = state.trans.get(key)
            if step is None:
                step = state.trans[key] = self._step(state.threads, state.visited, c, before)
                self._steps += 1
            state, origins, found = step
            if found is not None:
                origin, ahead, rule = found
                at = began[origin] if origin >= 0 else (sp if origin == _HERE else sp + 1)
                matched = (at, sp + ahead, rule)
            began = [
                began[o] if o >= 0 else sp + 1 if o == _NEXT else sp if o == _HERE else -1 for o in origins
            ]
            if c < 0:
                break
            before = _CLASS[c]
            sp += 1
        return matched
