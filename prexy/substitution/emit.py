"""Writing an sregex syntax tree out as a ``regex`` or an RE2 pattern.

The pattern written means what the tree means under sregex's rules when it
is compiled with ``.`` matching newline and multi-line ``^``/``$`` (bytes
for ``regex``, Latin-1 text for RE2); with ``probe`` set it is the
hold-back probe the scanner runs at the end of a buffer.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

import regex

from prexy.substitution.syntax import (
    ALL_BYTES,
    Alt,
    Assert,
    Cat,
    Char,
    Group,
    Node,
    Repeat,
    Set,
    Visitor,
)

__all__ = [
    "FLAGS",
    "PROBE_GROUP",
    "set_source",
    "to_re2_source",
    "to_regex_source",
    "to_settled_source",
]

#: The flags every pattern written here is compiled with (by ``regex``).
FLAGS = regex.DOTALL | regex.MULTILINE

_ALNUM = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")

_ALNUM = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def _byte_src(b: int) -> str:
    return chr(b) if b in _ALNUM else f"\\x{b:02x}"


def set_source(members: frozenset[int]) -> str:
    """``regex`` syntax for one byte out of ``members`` (DOTALL assumed)."""
    if members == ALL_BYTES:
        return "."  # DOTALL is always on
    if len(members) == 1:
        return _byte_src(next(iter(members)))
    negate = len(members) > 128
    body = ALL_BYTES - members if negate else members
    parts: list[str] = []
    values = sorted(body)
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j == i:
            parts.append(f"\\x{values[i]:02x}")
        else:
            parts.append(f"\\x{values[i]:02x}-\\x{values[j]:02x}")
        i = j + 1
    if not parts:
        return "[^\\x00-\\xff]" if not negate else "."
    return ("[^" if negate else "[") + "".join(parts) + "]"


_ASSERT_SRC = {"bol": "^", "eol": "$", "A": "\\A", "z": "\\Z", "b": "\\b", "B": "\\B"}


PROBE_GROUP = "e"
_AT_END = f"(?=\\Z)(?P<{PROBE_GROUP}>)"

#: RE2 syntax differs in three places: the end of the text is ``\z`` (RE2
#: has no look-ahead); a probe marks with plain groups, since RE2 keeps only
#: the first of several groups of one name (the probe keeps no other group);
#: and case folding is left to the sets the parser folded (RE2's own
#: ``(?i)`` on Latin-1 text also folds letters such as é/É, which the module
#: does not).
_RE2_ASSERT_SRC = dict(_ASSERT_SRC, z="\\z")
_RE2_AT_END = "\\z()"
#: And one difference of meaning: at the end of the buffer, ``regex`` lets a
#: greedy unbounded loop take one more iteration that matches empty there
#: (through the probe's marks), RE2 never repeats a loop on empty input.
#: So after such a loop an RE2 probe offers the mark itself, where that
#: iteration would have been tried: before leaving the loop.
_RE2_LOOP_END = f"(?:{_RE2_AT_END})?"


def to_regex_source(tree: Node, probe: bool = False, caseless: bool = False) -> str:
    """Emit ``regex`` syntax for ``tree`` (compile with DOTALL | MULTILINE).

    With ``probe`` set, the pattern is the hold-back probe: at the end of the
    buffer every byte-consuming atom and every assertion may instead match
    empty there and set the group named ``PROBE_GROUP``, so any path that
    reaches the end succeeds there, marked.  The first success of the probe (in priority order) then
    tells whether a path of higher priority than the real match ran off the
    end of the buffer, i.e. whether the match must wait for more data.
    Capture groups are not kept in the probe.

    With ``caseless`` (the rule's ``i`` flag; its letters are already folded
    into two-letter sets by the parser) the pattern is wrapped in ``(?i:...)``
    and those sets are written as plain letters, which keeps ``regex``'s
    literal fast path; on bytes ``regex`` folds ASCII letters only, and every
    other set is already closed under folding, so the meaning is unchanged.
    """
    body = _Emitter(probe, caseless, _ASSERT_SRC, _AT_END, "").source(tree)
    return f"(?i:{body})" if caseless else body


#: Look-ahead assertions that hold only where the byte after them is there
#: (they fail at the end of the buffer; elsewhere they mean what they did).
_SETTLED_ASSERT_SRC = dict(
    _ASSERT_SRC,
    eol="(?=\\n)",
    z="(?!)",
    b="(?:(?<=\\w)(?=\\W)|(?<!\\w)(?=\\w))",
    B="(?:(?<=\\w)(?=\\w)|(?<!\\w)(?=\\W))",
)


def to_settled_source(tree: Node, caseless: bool = False) -> str:
    """:func:`to_regex_source`, but ``$ \\z \\b \\B`` fail at the end of the
    buffer: the matches sregex has completed before it sees the next byte."""
    body = _Emitter(False, caseless, _SETTLED_ASSERT_SRC, _AT_END, "").source(tree)
    return f"(?i:{body})" if caseless else body


def to_re2_source(tree: Node, probe: bool = False) -> str:
    """The same pattern (or probe) as :func:`to_regex_source`, in RE2 syntax.

    Compile on Latin-1 text with ``(?sm)`` (:mod:`.linear` does): bytes stand
    for themselves, ``.`` takes a newline and ``^ $`` are line anchors.  RE2
    has Perl's leftmost-first priority, lazy repeats and ASCII ``\\b``, so
    both sources describe the same matches; RE2 finds them in linear time.
    """
    return _Emitter(probe, False, _RE2_ASSERT_SRC, _RE2_AT_END, _RE2_LOOP_END).source(tree)


def _letter_pair(members: frozenset[int]) -> int | None:
    """The lower-case letter when ``members`` is exactly {letter, LETTER}."""
    if len(members) != 2:
        return None
    lo, hi = sorted(members)
    if 0x41 <= lo <= 0x5A and hi == lo + 0x20:
        return hi
    return None


class _Emitter(Visitor[None]):
    """Writes a tree's pattern source into ``out``, node by node.

    ``asserts``: the source of each assertion kind; ``at_end``: what a probe
    matches instead of an atom at the end of the buffer; ``loop_end``: what
    an RE2 probe offers after a greedy unbounded loop (see _RE2_LOOP_END).
    """

    def __init__(
        self, probe: bool, caseless: bool, asserts: dict[str, str], at_end: str, loop_end: str
    ) -> None:
        self.probe = probe
        self.caseless = caseless
        self.asserts = asserts
        self.at_end = at_end
        self.loop_end = loop_end
        self.out: list[str] = []

    def source(self, tree: Node) -> str:
        """The whole pattern of ``tree``."""
        self.visit(tree)
        return "".join(self.out)

    def _atom(self, src: str) -> None:
        self.out.append(f"(?:{src}|{self.at_end})" if self.probe else src)

    def visit_char(self, node: Char) -> None:
        self._atom(_byte_src(node.byte))

    def visit_set(self, node: Set) -> None:
        letter = _letter_pair(node.members) if self.caseless else None
        self._atom(chr(letter) if letter is not None else set_source(node.members))

    def visit_assert(self, node: Assert) -> None:
        src = self.asserts[node.kind]
        if self.probe:
            # At the end of the buffer a path may have got there through an
            # empty "at end" atom, so no assertion can be trusted there.
            self.out.append(f"(?:{self.at_end}|{src})")
        else:
            self.out.append(src)

    def visit_group(self, node: Group) -> None:
        self.out.append("(" if node.index is not None and not self.probe else "(?:")
        self.visit(node.child)
        self.out.append(")")

    def visit_cat(self, node: Cat) -> None:
        for item in node.items:
            if isinstance(item, Alt):
                self.out.append("(?:")
                self.visit(item)
                self.out.append(")")
            else:
                self.visit(item)

    def visit_alt(self, node: Alt) -> None:
        for k, item in enumerate(node.items):
            if k:
                self.out.append("|")
            self.visit(item)

    def visit_repeat(self, node: Repeat) -> None:
        out = self.out
        child = node.child
        if isinstance(child, (Char, Set)) or (isinstance(child, Group) and child.index is not None):
            self.visit(child)
        else:
            out.append("(?:")
            self.visit(child)
            out.append(")")
        low, high = node.low, node.high
        if (low, high) == (0, None):
            q = "*"
        elif (low, high) == (1, None):
            q = "+"
        elif (low, high) == (0, 1):
            q = "?"
        elif high is None:
            q = f"{{{low},}}"
        elif low == high:
            q = f"{{{low}}}"
        else:
            q = f"{{{low},{high}}}"
        out.append(q if node.greedy else q + "?")
        if self.probe and self.loop_end and node.greedy and high is None:
            out.append(self.loop_end)
