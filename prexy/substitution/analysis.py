"""What an sregex syntax tree can match, computed before any scan.

The streaming transducer reasons about a rule through its tree: the width
of what a pattern can consume (to bound the hold-back window), the bytes
that unbounded repeats can consume (to bound where a pending match can
start), the bytes and assertions at a match's edges, its fixed leading
bytes, and the shape check that refuses patterns a backtracking engine
cannot run in bounded time (nested unbounded repeats over overlapping
alternatives).

Each per-node computation is a :class:`~.syntax.Visitor`; the searches for
nodes of one kind iterate :func:`~.syntax.walk`.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

from prexy.substitution.syntax import (
    Alt,
    Assert,
    Cat,
    Char,
    Group,
    Node,
    Repeat,
    Set,
    Visitor,
    walk,
)

__all__ = [
    "backtracking_risk",
    "bounded_width",
    "can_match_empty",
    "check_pathological",
    "empty_loop_groups",
    "first_bytes",
    "has_empty_loop",
    "last_bytes",
    "leading_asserts",
    "literal_prefix",
    "max_width",
    "min_width",
    "pure_literal",
    "repeat_bytes",
    "trailing_asserts",
]

_NO_BYTES: frozenset[int] = frozenset()
_NO_ASSERTS: frozenset[str] = frozenset()


# --- widths ----------------------------------------------------------------


class _MaxWidth(Visitor[int | None]):
    """The most bytes a node can consume, or None if unbounded."""

    def visit_char(self, node: Char) -> int | None:
        return 1

    def visit_set(self, node: Set) -> int | None:
        return 1

    def visit_assert(self, node: Assert) -> int | None:
        return 0

    def visit_cat(self, node: Cat) -> int | None:
        total = 0
        for item in node.items:
            w = self.visit(item)
            if w is None:
                return None
            total += w
        return total

    def visit_alt(self, node: Alt) -> int | None:
        best = 0
        for item in node.items:
            w = self.visit(item)
            if w is None:
                return None
            best = max(best, w)
        return best

    def visit_repeat(self, node: Repeat) -> int | None:
        w = self.visit(node.child)
        if w == 0:
            return 0
        if node.high is None or w is None:
            return None
        return w * node.high


class _MinWidth(Visitor[int]):
    """The fewest bytes a match of a node consumes."""

    def visit_char(self, node: Char) -> int:
        return 1

    def visit_set(self, node: Set) -> int:
        return 1

    def visit_assert(self, node: Assert) -> int:
        return 0

    def visit_cat(self, node: Cat) -> int:
        return sum(map(self.visit, node.items))

    def visit_alt(self, node: Alt) -> int:
        return min(map(self.visit, node.items))

    def visit_repeat(self, node: Repeat) -> int:
        return node.low * self.visit(node.child)


class _BoundedWidth(_MinWidth):
    """The most bytes a node can consume outside unbounded repeats."""

    def visit_alt(self, node: Alt) -> int:
        return max(map(self.visit, node.items))

    def visit_repeat(self, node: Repeat) -> int:
        if node.high is None:
            return 0
        return self.visit(node.child) * node.high


_MAX_WIDTH = _MaxWidth()
_MIN_WIDTH = _MinWidth()
_BOUNDED_WIDTH = _BoundedWidth()


def max_width(node: Node) -> int | None:
    """The most bytes ``node`` can consume, or None if unbounded."""
    return _MAX_WIDTH.visit(node)


def min_width(node: Node) -> int:
    """The fewest bytes a match of ``node`` consumes."""
    return _MIN_WIDTH.visit(node)


def bounded_width(node: Node) -> int:
    """Most bytes ``node`` can consume outside unbounded repeats."""
    return _BOUNDED_WIDTH.visit(node)


# --- bytes and emptiness ---------------------------------------------------


class _Nullable(Visitor[bool]):
    """Whether a node has a match of length zero (assertions count as empty)."""

    def visit_char(self, node: Char) -> bool:
        return False

    def visit_set(self, node: Set) -> bool:
        return False

    def visit_assert(self, node: Assert) -> bool:
        return True

    def visit_cat(self, node: Cat) -> bool:
        return all(map(self.visit, node.items))

    def visit_alt(self, node: Alt) -> bool:
        return any(map(self.visit, node.items))

    def visit_repeat(self, node: Repeat) -> bool:
        return node.low == 0 or self.visit(node.child)


class _Consumable(Visitor[frozenset[int]]):
    """Every byte a node can consume."""

    def visit_char(self, node: Char) -> frozenset[int]:
        return frozenset((node.byte,))

    def visit_set(self, node: Set) -> frozenset[int]:
        return node.members

    def visit_assert(self, node: Assert) -> frozenset[int]:
        return _NO_BYTES

    def visit_repeat(self, node: Repeat) -> frozenset[int]:
        return self.visit(node.child)

    def visit_cat(self, node: Cat) -> frozenset[int]:
        acc: frozenset[int] = frozenset()
        for item in node.items:
            acc |= self.visit(item)
        return acc

    def visit_alt(self, node: Alt) -> frozenset[int]:
        acc: frozenset[int] = frozenset()
        for item in node.items:
            acc |= self.visit(item)
        return acc


class _RepeatBytes(_Consumable):
    """Bytes that some unbounded repeat inside a node can consume."""

    def visit_char(self, node: Char) -> frozenset[int]:
        return _NO_BYTES

    def visit_set(self, node: Set) -> frozenset[int]:
        return _NO_BYTES

    def visit_repeat(self, node: Repeat) -> frozenset[int]:
        if node.high is None:
            return _CONSUMABLE.visit(node.child)
        return self.visit(node.child)


class _EdgeBytes(_Consumable):
    """Bytes a non-empty match of a node can start with (``last``: end with)."""

    def __init__(self, last: bool) -> None:
        self.last = last

    def visit_cat(self, node: Cat) -> frozenset[int]:
        acc: frozenset[int] = frozenset()
        for item in reversed(node.items) if self.last else node.items:
            acc |= self.visit(item)
            if not _NULLABLE.visit(item):
                break
        return acc


class _EdgeAsserts(Visitor[frozenset[str]]):
    """Kinds of the assertions a match of a node can test before it has
    consumed a byte (``last``: after it has consumed its last byte)."""

    def __init__(self, last: bool) -> None:
        self.last = last

    def visit_char(self, node: Char) -> frozenset[str]:
        return _NO_ASSERTS

    def visit_set(self, node: Set) -> frozenset[str]:
        return _NO_ASSERTS

    def visit_assert(self, node: Assert) -> frozenset[str]:
        return frozenset((node.kind,))

    def visit_repeat(self, node: Repeat) -> frozenset[str]:
        return self.visit(node.child) if node.high != 0 else _NO_ASSERTS

    def visit_alt(self, node: Alt) -> frozenset[str]:
        acc: frozenset[str] = frozenset()
        for item in node.items:
            acc |= self.visit(item)
        return acc

    def visit_cat(self, node: Cat) -> frozenset[str]:
        acc: frozenset[str] = frozenset()
        for item in reversed(node.items) if self.last else node.items:
            acc |= self.visit(item)
            if not _NULLABLE.visit(item):
                break
        return acc


_NULLABLE = _Nullable()
_CONSUMABLE = _Consumable()
_REPEAT_BYTES = _RepeatBytes()
_FIRST_BYTES = _EdgeBytes(last=False)
_LAST_BYTES = _EdgeBytes(last=True)
_LEADING_ASSERTS = _EdgeAsserts(last=False)
_TRAILING_ASSERTS = _EdgeAsserts(last=True)


def can_match_empty(node: Node) -> bool:
    """Whether ``node`` has a match of length zero (assertions count as empty)."""
    return _NULLABLE.visit(node)


def repeat_bytes(node: Node) -> frozenset[int]:
    """Bytes that some unbounded repeat inside ``node`` can consume."""
    return _REPEAT_BYTES.visit(node)


def first_bytes(node: Node) -> frozenset[int]:
    """Bytes a non-empty match of ``node`` can start with."""
    return _FIRST_BYTES.visit(node)


def last_bytes(node: Node) -> frozenset[int]:
    """Bytes a non-empty match of ``node`` can end with."""
    return _LAST_BYTES.visit(node)


def leading_asserts(node: Node) -> frozenset[str]:
    """Kinds of the assertions a match of ``node`` can test before it has
    consumed a byte (``^`` in ``^ +``, ``\\b`` in ``a?\\bc``)."""
    return _LEADING_ASSERTS.visit(node)


def trailing_asserts(node: Node) -> frozenset[str]:
    """Kinds of the assertions a match of ``node`` can test after it has
    consumed its last byte (``$`` in ``\\s+$``, ``\\b`` in ``a\\b\\s*``)."""
    return _TRAILING_ASSERTS.visit(node)


# --- fixed leading bytes ---------------------------------------------------


class _Prefix(Visitor[bool]):
    """Appends a node's fixed leading bytes to ``out``; True if all of it is
    fixed.  ``asserts``: whether a zero-width assertion counts as fixed (it
    adds no byte) or ends the fixed part."""

    def __init__(self, out: bytearray, asserts: bool) -> None:
        self.out = out
        self.asserts = asserts

    def visit_char(self, node: Char) -> bool:
        self.out.append(node.byte)
        return True

    def visit_set(self, node: Set) -> bool:
        return False

    def visit_assert(self, node: Assert) -> bool:
        return self.asserts

    def visit_cat(self, node: Cat) -> bool:
        for item in node.items:
            if not self.visit(item):
                return False
        return True

    def visit_alt(self, node: Alt) -> bool:
        return False

    def visit_repeat(self, node: Repeat) -> bool:
        if node.low >= 1:
            self.visit(node.child)
        return False


def literal_prefix(node: Node) -> bytes:
    """Bytes every match of ``node`` starts with (case-sensitive; may be empty)."""
    out = bytearray()
    _Prefix(out, asserts=True).visit(node)
    return bytes(out)


def pure_literal(node: Node) -> bytes | None:
    """The one byte string ``node`` matches, when it is nothing but literal
    bytes (groups allowed; no set, assertion, alternation or repeat), else
    None.  Folded letters of a caseless rule are sets, so they never count.

    Such a rule's leftmost non-overlapping matches from a position are those
    of ``bytes.split``: the scanner replaces them without a regex scan.
    """
    out = bytearray()
    if not _Prefix(out, asserts=False).visit(node) or not out:
        return None
    return bytes(out)


# --- shapes that backtrack -------------------------------------------------


def _unbounded_repeats(node: Node) -> list[Repeat]:
    return [n for n in walk(node) if isinstance(n, Repeat) and n.high is None]


def _repeats(node: Node) -> list[Repeat]:
    return [n for n in walk(node) if isinstance(n, Repeat)]


def _alts(node: Node) -> list[Alt]:
    return [n for n in walk(node) if isinstance(n, Alt)]


def _is_within(inner: Node, outer: Repeat) -> bool:
    return any(n is inner for n in walk(outer.child))


def check_pathological(tree: Node) -> str | None:
    """Return why ``tree`` could backtrack exponentially, or None if it is safe.

    Refused: an unbounded repeat whose body (a) holds an alternation with two
    branches that can start with the same byte, or with an empty branch, or
    (b) holds two unbounded repeats that can consume a common byte (so one
    input splits between them in many ways); and any repeat of two or more
    iterations whose body holds an unbounded repeat that can also eat what
    follows it in the body (``(.*a){12}``: polynomial blow-up).
    ``(a|a)+$``, ``(a|ab)*c``, ``(\\w+\\d+)+`` and ``(.*a){12}`` are refused;
    ``(a+)+$``, ``(foo|bar)+``, ``(a+b+)+`` and ``.*a`` are accepted.
    """
    for rep in _unbounded_repeats(tree):
        body = rep.child
        for alt in _alts(body):
            seen: frozenset[int] = frozenset()
            for branch in alt.items:
                if _NULLABLE.visit(branch):
                    return "an unbounded repeat over an alternation with an empty branch"
                fb = first_bytes(branch)
                if seen & fb:
                    return "an unbounded repeat over overlapping alternatives"
                seen |= fb
        inner = _unbounded_repeats(body)
        for i, a in enumerate(inner):
            for b in inner[i + 1 :]:
                if _is_within(b, a):
                    continue
                if _CONSUMABLE.visit(a.child) & _CONSUMABLE.visit(b.child):
                    return "nested unbounded repeats that can consume the same bytes"
    for rep in _repeats(tree):
        if rep.high is not None and rep.high < 2:
            continue
        if _AMBIGUOUS_TAIL.visit(rep.child):
            return (
                "a repeated group holding an unbounded repeat that can also eat "
                "what follows it (each iteration can end in many places)"
            )
    return None


def backtracking_risk(tree: Node) -> str | None:
    """Why ``regex`` may need more than linear time on ``tree``, or None.

    :func:`check_pathological`'s shapes, and also any unbounded repeat that
    holds another one: ``regex`` handles ``(a+)+$`` without blowing up, but
    measured on lines of 999 ``a`` it ran at 0.9 MB/s, and timed
    out on lines ending in ``b``.  Such rules run on RE2 (:mod:`.linear`).
    """
    why = check_pathological(tree)
    if why is not None:
        return why
    for rep in _unbounded_repeats(tree):
        if _unbounded_repeats(rep.child):
            return "an unbounded repeat that holds another one"
    return None


class _Search(Visitor[bool]):
    """Whether something holds somewhere inside a node: never in a single
    byte or an assertion, in some branch of an alternation, in the body of a
    repeat; a subclass says what holds of a concatenation."""

    def visit_char(self, node: Char) -> bool:
        return False

    def visit_set(self, node: Set) -> bool:
        return False

    def visit_assert(self, node: Assert) -> bool:
        return False

    def visit_alt(self, node: Alt) -> bool:
        return any(map(self.visit, node.items))

    def visit_repeat(self, node: Repeat) -> bool:
        return self.visit(node.child)


class _AmbiguousTail(_Search):
    """Whether some unbounded repeat in a body can eat what follows it there.

    ``.*a`` is (``.`` eats ``a``): repeated, such a body can split its input
    in a number of ways that grows with a power of its length.  A repeat at
    the end of the body (``(a+)+``) is not: ``regex`` handles that shape.
    """

    def visit_cat(self, node: Cat) -> bool:
        items = node.items
        for k, item in enumerate(items):
            rest = items[k + 1 :]
            if rest:
                follow = first_bytes(Cat(rest))
                for r in _unbounded_repeats(item):
                    if _EndsItem(r).visit(item) and _CONSUMABLE.visit(r.child) & follow:
                        return True
            if self.visit(item):
                return True
        return False


_AMBIGUOUS_TAIL = _AmbiguousTail()


class _EndsItem(_Search):
    """Whether ``rep`` can be the last thing a node consumes."""

    def __init__(self, rep: Repeat) -> None:
        self.rep = rep

    def visit(self, node: Node) -> bool:
        return node is self.rep or super().visit(node)

    def visit_cat(self, node: Cat) -> bool:
        for k in range(len(node.items) - 1, -1, -1):
            if self.visit(node.items[k]):
                return True
            if not _NULLABLE.visit(node.items[k]):
                return False
        return False


# --- empty loop iterations -------------------------------------------------


def has_empty_loop(node: Node) -> bool:
    """Whether a repeat that can iterate twice has a body that can match empty.

    There the engines part ways: a backtracker (Perl, ``regex``) ends the
    loop at the iteration that matched empty, a Pike VM (RE2) drops that
    iteration and takes its next choice, so ``(?:.*?\\n*)*`` on ``\\n1``
    matches ``\\n`` on one and ``\\n1`` on the other.  sregex is a Pike VM
    with its own thread order; on such patterns it does not always agree
    with either.  Outside this shape the two engines agree.
    """
    return any(
        (rep.high is None or rep.high > 1) and _NULLABLE.visit(rep.child) for rep in _repeats(node)
    )


def empty_loop_groups(node: Node) -> frozenset[int]:
    """Capture groups inside a repeat whose body can match empty.

    ``regex`` keeps the captures of a last iteration that matched empty;
    Perl and sregex drop that iteration.  The scanner corrects the captures
    of these groups (see ``matches.Found.span``).
    """
    return frozenset(
        n.index
        for rep in _repeats(node)
        if _NULLABLE.visit(rep.child)
        for n in walk(rep.child)
        if isinstance(n, Group) and n.index is not None
    )
