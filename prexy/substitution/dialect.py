"""The sregex regex dialect: parse it, check it, and translate it for ``regex``.

``replace_filter`` rules are written in the dialect of openresty's sregex
engine.  This module parses that dialect exactly as sregex's lexer and grammar
do (same accepted syntax, same refusals), builds a small syntax tree, and
emits an equivalent pattern for the ``regex`` package (bytes, ``.`` matching
newline, multi-line ``^``/``$``, ASCII classes and ASCII-only case folding).

The tree is also what the streaming transducer reasons about: the width of
what a pattern can consume (to bound the hold-back window), the bytes that
unbounded repeats can consume (to bound where a pending match can start), and
the shape check that refuses patterns a backtracking engine cannot run in
bounded time (nested unbounded repeats over overlapping alternatives).

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "PROBE_GROUP",
    "DialectError",
    "Node",
    "ParsedRegex",
    "backtracking_risk",
    "bounded_width",
    "can_match_empty",
    "check_pathological",
    "first_bytes",
    "has_empty_loop",
    "last_bytes",
    "leading_asserts",
    "to_settled_source",
    "trailing_asserts",
    "literal_prefix",
    "max_width",
    "min_width",
    "parse_sregex",
    "repeat_bytes",
    "set_source",
    "to_re2_source",
    "to_regex_source",
]

ALL_BYTES = frozenset(range(256))
_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DIGIT = frozenset(b"0123456789")
_SPACE = frozenset(b" \f\n\r\t")
_HSPACE = frozenset((0x09, 0x20, 0xA0))
#: A letter and its other case, one shared set per letter (a caseless rule
#: holds one per letter; thousands of rule sets per worker).
_CASE_PAIR = {c: frozenset((c, c ^ 0x20)) for c in (*range(0x41, 0x5B), *range(0x61, 0x7B))}
_VSPACE = frozenset((0x0A, 0x0B, 0x0C, 0x0D, 0x85))
_CLASS_ESCAPES: dict[int, frozenset[int]] = {
    ord("d"): _DIGIT,
    ord("D"): ALL_BYTES - _DIGIT,
    ord("w"): _WORD,
    ord("W"): ALL_BYTES - _WORD,
    ord("s"): _SPACE,
    ord("S"): ALL_BYTES - _SPACE,
    ord("h"): _HSPACE,
    ord("H"): ALL_BYTES - _HSPACE,
    ord("v"): _VSPACE,
    ord("V"): ALL_BYTES - _VSPACE,
}
# Escapes only valid outside a bracket class.
_OUTER_CLASS_ESCAPES: dict[int, frozenset[int]] = {
    ord("N"): ALL_BYTES - frozenset(b"\n"),
    ord("C"): ALL_BYTES,
}
_SIMPLE_CHARS = {
    ord("t"): 0x09,
    ord("n"): 0x0A,
    ord("r"): 0x0D,
    ord("f"): 0x0C,
    ord("a"): 0x07,
    ord("e"): 0x1B,
}
_ASSERT_ESCAPES = {ord("b"): "b", ord("B"): "B", ord("z"): "z", ord("A"): "A"}
_PUNCT = frozenset(c for c in range(0x20, 0x7F) if not chr(c).isalnum())
# Escaped punctuation is the punctuation itself; of the letters, sregex also
# passes ``\i`` and ``\M`` through (and ``\z`` ``\C`` inside a class).
_LITERAL_ESCAPES = _PUNCT | frozenset(b"iM")
_CLASS_LITERAL_ESCAPES = _PUNCT | frozenset(b"iMzC")
_SPECIAL = frozenset(b"|*+?():.^$")
_MAX_COUNT = 500


class DialectError(ValueError):
    """A pattern the sregex dialect refuses.

    ``pos`` is the byte offset in the pattern where the problem was found
    and ``reason`` says what is wrong.
    """

    def __init__(self, reason: str, pos: int) -> None:
        super().__init__(f"{reason} at pos {pos}")
        self.reason = reason
        self.pos = pos


# --- syntax tree -----------------------------------------------------------


@dataclass(frozen=True)
class Char:
    """One literal byte."""

    byte: int


@dataclass(frozen=True)
class Set:
    """One byte out of a set (classes, ``.``, ``\\d``, folded letters)."""

    members: frozenset[int]


@dataclass(frozen=True)
class Assert:
    """A zero-width assertion: ``bol eol A z b B``."""

    kind: str


@dataclass(frozen=True)
class Group:
    """A group; ``index`` is the capture number or ``None`` for ``(?:``."""

    index: int | None
    child: Node


@dataclass(frozen=True)
class Cat:
    """A concatenation."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    """An alternation, in priority order."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    """A quantified node; ``high`` is ``None`` when unbounded."""

    child: Node
    low: int
    high: int | None
    greedy: bool
    #: Written as ``{m,n}`` (sregex compiles ``x{1,}`` unlike ``x+``; see
    #: :mod:`.pikevm`); not part of the node's value.
    counted: bool = field(default=False, compare=False)


Node = Char | Set | Assert | Group | Cat | Alt | Repeat


@dataclass(frozen=True)
class ParsedRegex:
    """A parsed pattern: its tree, its number of capture groups, its flags."""

    tree: Node
    ngroups: int
    caseless: bool


# --- lexer and parser ------------------------------------------------------


class _Parser:
    """Recursive-descent parser mirroring sregex's yacc grammar and lexer."""

    def __init__(self, src: bytes, caseless: bool) -> None:
        if b"\x00" in src:
            raise DialectError("NUL byte in pattern", src.index(b"\x00"))
        self.src = src
        self.pos = 0
        self.caseless = caseless
        self.ngroups = 0

    # lexing helpers
    def _peek(self, off: int = 0) -> int:
        i = self.pos + off
        return self.src[i] if i < len(self.src) else 0

    def _read(self) -> int:
        c = self._peek()
        self.pos += 1
        return c

    def _bad(self, reason: str, at: int | None = None) -> DialectError:
        return DialectError(reason, self.pos if at is None else at)

    # grammar
    def parse(self) -> ParsedRegex:
        """Parse the whole pattern."""
        tree = self._alt()
        if self.pos < len(self.src):
            raise self._bad("syntax error: unmatched ')'")
        return ParsedRegex(tree, self.ngroups, self.caseless)

    def _alt(self) -> Node:
        items = [self._concat()]
        while self._peek() == ord("|") and self.pos < len(self.src):
            self.pos += 1
            items.append(self._concat())
        return items[0] if len(items) == 1 else Alt(tuple(items))

    def _concat(self) -> Node:
        items: list[Node] = []
        while self.pos < len(self.src):
            c = self._peek()
            if c in (ord("|"), ord(")")):
                break
            items.append(self._repeat())
        if len(items) == 1:
            return items[0]
        return Cat(tuple(items))

    def _quantifier(self) -> tuple[int, int | None] | None:
        """Lex a quantifier token at the cursor, or return None."""
        c = self._peek()
        if self.pos >= len(self.src):
            return None
        if c == ord("*"):
            self.pos += 1
            return (0, None)
        if c == ord("+"):
            self.pos += 1
            return (1, None)
        if c == ord("?"):
            self.pos += 1
            return (0, 1)
        if c == ord("{"):
            return self._counted()
        return None

    def _counted(self) -> tuple[int, int | None] | None:
        start = self.pos
        src = self.src
        i = start + 1

        def digits(j: int) -> tuple[int, int]:
            k = j
            while k < len(src) and 0x30 <= src[k] <= 0x39:
                k += 1
            return int(src[j:k]), k

        if not (i < len(src) and 0x30 <= src[i] <= 0x39):
            return None
        low, i = digits(i)
        high: int | None
        if i < len(src) and src[i] == ord("}"):
            high = low
            i += 1
        elif i < len(src) and src[i] == ord(","):
            i += 1
            if i < len(src) and src[i] == ord("}"):
                high = None
                i += 1
            elif i < len(src) and 0x30 <= src[i] <= 0x39:
                high, i = digits(i)
                if not (i < len(src) and src[i] == ord("}")):
                    return None
                i += 1
            else:
                return None
        else:
            return None
        if low >= _MAX_COUNT or (high is not None and high >= _MAX_COUNT):
            raise DialectError("counted repeat bound must be below 500", start)
        if high is not None and low > high:
            raise DialectError("counted repeat with min > max", start)
        self.pos = i
        return (low, high)

    def _repeat(self) -> Node:
        atom = self._atom()
        counted = self.pos < len(self.src) and self._peek() == ord("{")
        q = self._quantifier()
        if q is None:
            return atom
        greedy = True
        if self.pos < len(self.src) and self._peek() == ord("?"):
            self.pos += 1
            greedy = False
        # A second quantifier (possessive ``a*+``, ``a**``) is a syntax error.
        if self.pos < len(self.src) and (
            self._peek() in (ord("*"), ord("+"), ord("?"))
            or (self._peek() == ord("{") and self._lookahead_counted())
        ):
            raise self._bad("syntax error: nested quantifier (possessive or repeated)")
        return Repeat(atom, q[0], q[1], greedy, counted)

    def _lookahead_counted(self) -> bool:
        """Whether a counted quantifier starts at the cursor (cursor unmoved)."""
        save = self.pos
        try:
            return self._counted() is not None
        except DialectError:
            return True
        finally:
            self.pos = save

    def _atom(self) -> Node:
        start = self.pos
        c = self._read()
        if c == ord("("):
            if self._peek() == ord("?") and self.pos < len(self.src):
                if self._peek(1) == ord(":") and self.pos + 1 < len(self.src):
                    self.pos += 2
                    child = self._alt()
                    self._close(start)
                    return Group(None, child)
                kind = self.src[self.pos + 1 : self.pos + 3]
                raise DialectError(_why_group_refused(kind), start)
            if self._peek() == ord("*") and self.pos < len(self.src):
                raise DialectError("syntax error: (*VERB) not supported", start)
            self.ngroups += 1
            index = self.ngroups
            child = self._alt()
            self._close(start)
            return Group(index, child)
        if c in (ord("*"), ord("+"), ord("?")):
            raise DialectError("syntax error: quantifier without a subject", start)
        if c == ord("{") and self._counted_at(start):
            raise DialectError("syntax error: quantifier without a subject", start)
        if c == ord("."):
            return Set(ALL_BYTES)
        if c == ord("^"):
            return Assert("bol")
        if c == ord("$"):
            return Assert("eol")
        if c == ord("["):
            return self._fold_set(self._class(start))
        if c == ord("\\"):
            return self._escape(start)
        return self._char(c)

    def _counted_at(self, start: int) -> bool:
        """Whether a counted quantifier starts at ``start`` (cursor unmoved)."""
        save = self.pos
        self.pos = start
        try:
            return self._counted() is not None
        except DialectError:
            return True
        finally:
            self.pos = save

    def _close(self, start: int) -> None:
        if self.pos < len(self.src) and self._peek() == ord(")"):
            self.pos += 1
            return
        raise DialectError("syntax error: missing ')'", start)

    def _char(self, c: int) -> Node:
        if self.caseless and (0x41 <= c <= 0x5A or 0x61 <= c <= 0x7A):
            return Set(_CASE_PAIR[c])
        return Char(c)

    def _fold_set(self, node: Set) -> Set:
        return Set(_fold(node.members)) if self.caseless else node

    def _octal(self, first: int, limit_check: bool = True) -> int:
        num = first - 0x30
        count = 1
        while True:
            c = self._peek()
            if not (self.pos < len(self.src) and 0x30 <= c <= 0x37):
                return num
            num = num * 8 + (c - 0x30)
            self.pos += 1
            count += 1
            if count == 3:
                if num > 255:
                    raise self._bad("syntax error: octal escape above \\377")
                return num

    def _escape(self, start: int) -> Node:
        if self.pos >= len(self.src):
            raise DialectError("syntax error: trailing backslash", start)
        c = self._read()
        if not (0x20 <= c <= 0x7E):
            return Char(c)
        if c in _LITERAL_ESCAPES:
            return self._char(c)
        if 0x30 <= c <= 0x37:
            nxt = self._peek()
            if c != 0x30 and not (self.pos < len(self.src) and 0x30 <= nxt <= 0x37):
                raise DialectError("backreferences are not supported", start)
            return self._char(self._octal(c))
        if c in (0x38, 0x39):
            raise DialectError("backreferences are not supported", start)
        if c == ord("c"):
            if self.pos >= len(self.src):
                raise DialectError("syntax error: \\c at end of pattern", start)
            x = self._read()
            if 0x61 <= x <= 0x7A:
                x -= 32
            return self._char((x ^ 64) & 0xFF)
        if c == ord("o"):
            return self._char(self._o_escape(start, in_class=False))
        if c == ord("x"):
            return self._char(self._x_escape(start, in_class=False))
        if c in _ASSERT_ESCAPES:
            return Assert(_ASSERT_ESCAPES[c])
        if c in _CLASS_ESCAPES:
            return self._fold_set(Set(_CLASS_ESCAPES[c]))
        if c in _OUTER_CLASS_ESCAPES:
            return Set(_OUTER_CLASS_ESCAPES[c])
        if c in _SIMPLE_CHARS:
            return Char(_SIMPLE_CHARS[c])
        raise DialectError(_why_escape_refused(c), start)

    def _o_escape(self, start: int, in_class: bool) -> int:
        if self._read() != ord("{") or self.pos > len(self.src):
            raise DialectError("syntax error: \\o needs {digits}", start)
        num = 0
        count = 0
        while True:
            if self.pos >= len(self.src):
                raise DialectError("syntax error: unterminated \\o{", start)
            c = self._read()
            if 0x30 <= c <= 0x37:
                num = num * 8 + (c - 0x30)
            elif c == ord("}"):
                return num & 0xFF
            elif in_class:
                raise DialectError("syntax error: bad \\o{} escape", start)
            else:
                self.pos -= 1
                return num & 0xFF
            count += 1
            if count == 3:
                if self.pos >= len(self.src) or self._read() != ord("}"):
                    raise DialectError("syntax error: bad \\o{} escape", start)
                if num > 255:
                    raise DialectError("syntax error: octal escape above \\377", start)
                return num

    def _x_escape(self, start: int, in_class: bool) -> int:
        curly = False
        if self.pos < len(self.src) and self._peek() == ord("{"):
            curly = True
            self.pos += 1
        num = 0
        count = 0
        while True:
            at_end = self.pos >= len(self.src)
            c = 0 if at_end else self._peek()
            digit = _hexval(c) if not at_end else None
            if digit is not None:
                num = num * 16 + digit
                self.pos += 1
            elif curly:
                if at_end or c != ord("}"):
                    raise DialectError("syntax error: bad \\x{} escape", start)
                self.pos += 1
                return num
            elif at_end and in_class:
                raise DialectError("syntax error: unterminated class", start)
            else:
                return num
            count += 1
            if count == 2:
                if curly:
                    if self.pos >= len(self.src) or self._read() != ord("}"):
                        raise DialectError("syntax error: bad \\x{} escape", start)
                return num

    def _class(self, start: int) -> Set:
        negate = False
        if self.pos < len(self.src) and self._peek() == ord("^"):
            negate = True
            self.pos += 1
        ranges: list[list[int]] = []
        seen_dash = False
        no_dash = False
        n = 0
        while True:
            n += 1
            if self.pos >= len(self.src):
                raise DialectError("syntax error: unterminated character class", start)
            c = self._read()
            value: int | None = None
            if c == ord("]"):
                if n == 1:
                    value = c
                else:
                    if seen_dash:
                        ranges.append([0x2D, 0x2D])
                    break
            elif c == ord("\\"):
                if self.pos >= len(self.src):
                    raise DialectError("syntax error: unterminated character class", start)
                c = self._read()
                if 0x30 <= c <= 0x37:
                    value = self._octal(c)
                elif c == ord("c"):
                    if self.pos >= len(self.src):
                        raise DialectError("syntax error: \\c at end of pattern", start)
                    x = self._read()
                    if 0x61 <= x <= 0x7A:
                        x -= 32
                    value = (x ^ 64) & 0xFF
                elif c == ord("o"):
                    value = self._o_escape(start, in_class=True)
                elif c == ord("x"):
                    value = self._x_escape(start, in_class=True)
                elif c in _SIMPLE_CHARS:
                    value = _SIMPLE_CHARS[c]
                elif c == ord("b"):
                    value = 0x08
                elif not (0x20 <= c <= 0x7E) or c in _CLASS_LITERAL_ESCAPES:
                    value = c
                else:
                    members = _CLASS_ESCAPES.get(c)
                    if members is None:
                        raise DialectError(_why_escape_refused(c), self.pos - 2)
                    if seen_dash:
                        ranges.append([0x2D, 0x2D])
                        seen_dash = False
                    ranges.extend([m, m] for m in sorted(members))
                    no_dash = True
                    continue
            elif c == ord("-") and not seen_dash and ranges and not no_dash:
                seen_dash = True
                continue
            else:
                value = c
            # process_char
            assert value is not None
            if seen_dash:
                ranges[-1][1] = value
                if ranges[-1][1] < ranges[-1][0]:
                    raise DialectError("syntax error: range out of order in class", start)
                seen_dash = False
                no_dash = True
                continue
            no_dash = False
            ranges.append([value, value])
        members_set: set[int] = set()
        for lo, hi in ranges:
            members_set.update(range(lo, hi + 1))
        result = frozenset(members_set)
        if negate:
            # sregex folds the ranges before negating; so fold here, negate later.
            if self.caseless:
                result = _fold(result)
            return Set(ALL_BYTES - result)
        return Set(result)


def _hexval(c: int) -> int | None:
    if 0x30 <= c <= 0x39:
        return c - 0x30
    if 0x41 <= c <= 0x46:
        return c - 0x41 + 10
    if 0x61 <= c <= 0x66:
        return c - 0x61 + 10
    return None


def _fold(members: frozenset[int]) -> frozenset[int]:
    extra = {m ^ 0x20 for m in members if 0x41 <= m <= 0x5A or 0x61 <= m <= 0x7A}
    return members | extra


def _why_group_refused(kind: bytes) -> str:
    if kind[:1] in (b"=", b"!") or kind[:2] in (b"<=", b"<!"):
        return "look-around assertions are not supported"
    if kind[:1] in (b"<", b"P", b"'"):
        return "named groups are not supported"
    if kind[:1] == b">":
        return "atomic groups are not supported"
    if kind[:1] == b"#":
        return "comments are not supported"
    return "inline flags and (?...) extensions are not supported"


def _why_escape_refused(c: int) -> str:
    ch = chr(c)
    if ch in "GKZ":
        return f"\\{ch} is not supported"
    if ch in "pP":
        return "Unicode properties (\\p, \\P) are not supported"
    if ch in "kg":
        return "backreferences are not supported"
    return f"unknown escape \\{ch}"


def parse_sregex(pattern: bytes, caseless: bool = False) -> ParsedRegex:
    """Parse ``pattern`` in the sregex dialect; raise DialectError if refused."""
    parser = _Parser(pattern, caseless)
    # The grammar: a stray ')' at top level ends ``alt`` early.
    return parser.parse()


# --- emission for the ``regex`` package ------------------------------------

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
    out: list[str] = []
    _emit(tree, probe, caseless, out, _ASSERT_SRC, _AT_END, "")
    body = "".join(out)
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
    out: list[str] = []
    _emit(tree, False, caseless, out, _SETTLED_ASSERT_SRC, _AT_END, "")
    body = "".join(out)
    return f"(?i:{body})" if caseless else body


def to_re2_source(tree: Node, probe: bool = False) -> str:
    """The same pattern (or probe) as :func:`to_regex_source`, in RE2 syntax.

    Compile on Latin-1 text with ``(?sm)`` (:mod:`.linear` does): bytes stand
    for themselves, ``.`` takes a newline and ``^ $`` are line anchors.  RE2
    has Perl's leftmost-first priority, lazy repeats and ASCII ``\\b``, so
    both sources describe the same matches; RE2 finds them in linear time.
    """
    out: list[str] = []
    _emit(tree, probe, False, out, _RE2_ASSERT_SRC, _RE2_AT_END, _RE2_LOOP_END)
    return "".join(out)


def _letter_pair(members: frozenset[int]) -> int | None:
    """The lower-case letter when ``members`` is exactly {letter, LETTER}."""
    if len(members) != 2:
        return None
    lo, hi = sorted(members)
    if 0x41 <= lo <= 0x5A and hi == lo + 0x20:
        return hi
    return None


def _emit(
    node: Node,
    probe: bool,
    caseless: bool,
    out: list[str],
    asserts: dict[str, str],
    at_end: str,
    loop_end: str,
) -> None:
    if isinstance(node, (Char, Set)):
        if isinstance(node, Char):
            src = _byte_src(node.byte)
        else:
            letter = _letter_pair(node.members) if caseless else None
            src = chr(letter) if letter is not None else set_source(node.members)
        out.append(f"(?:{src}|{at_end})" if probe else src)
    elif isinstance(node, Assert):
        src = asserts[node.kind]
        if probe:
            # At the end of the buffer a path may have got there through an
            # empty "at end" atom, so no assertion can be trusted there.
            out.append(f"(?:{at_end}|{src})")
        else:
            out.append(src)
    elif isinstance(node, Group):
        out.append("(" if node.index is not None and not probe else "(?:")
        _emit(node.child, probe, caseless, out, asserts, at_end, loop_end)
        out.append(")")
    elif isinstance(node, Cat):
        for item in node.items:
            if isinstance(item, Alt):
                out.append("(?:")
                _emit(item, probe, caseless, out, asserts, at_end, loop_end)
                out.append(")")
            else:
                _emit(item, probe, caseless, out, asserts, at_end, loop_end)
    elif isinstance(node, Alt):
        for k, item in enumerate(node.items):
            if k:
                out.append("|")
            _emit(item, probe, caseless, out, asserts, at_end, loop_end)
    elif isinstance(node, Repeat):
        child = node.child
        if isinstance(child, (Char, Set)) or (isinstance(child, Group) and child.index is not None):
            _emit(child, probe, caseless, out, asserts, at_end, loop_end)
        else:
            out.append("(?:")
            _emit(child, probe, caseless, out, asserts, at_end, loop_end)
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
        if probe and loop_end and node.greedy and high is None:
            out.append(loop_end)
    else:  # pragma: no cover - exhaustive
        raise TypeError(node)


# --- analysis --------------------------------------------------------------


def max_width(node: Node) -> int | None:
    """The most bytes ``node`` can consume, or None if unbounded."""
    if isinstance(node, (Char, Set)):
        return 1
    if isinstance(node, Assert):
        return 0
    if isinstance(node, Group):
        return max_width(node.child)
    if isinstance(node, Cat):
        total = 0
        for item in node.items:
            w = max_width(item)
            if w is None:
                return None
            total += w
        return total
    if isinstance(node, Alt):
        best = 0
        for item in node.items:
            w = max_width(item)
            if w is None:
                return None
            best = max(best, w)
        return best
    if isinstance(node, Repeat):
        w = max_width(node.child)
        if w == 0:
            return 0
        if node.high is None or w is None:
            return None
        return w * node.high
    raise TypeError(node)  # pragma: no cover


def min_width(node: Node) -> int:
    """The fewest bytes a match of ``node`` consumes."""
    if isinstance(node, (Char, Set)):
        return 1
    if isinstance(node, Assert):
        return 0
    if isinstance(node, Group):
        return min_width(node.child)
    if isinstance(node, Cat):
        return sum(min_width(i) for i in node.items)
    if isinstance(node, Alt):
        return min(min_width(i) for i in node.items)
    if isinstance(node, Repeat):
        return node.low * min_width(node.child)
    raise TypeError(node)  # pragma: no cover


def bounded_width(node: Node) -> int:
    """Most bytes ``node`` can consume outside unbounded repeats."""
    if isinstance(node, (Char, Set)):
        return 1
    if isinstance(node, Assert):
        return 0
    if isinstance(node, Group):
        return bounded_width(node.child)
    if isinstance(node, Cat):
        return sum(bounded_width(i) for i in node.items)
    if isinstance(node, Alt):
        return max(bounded_width(i) for i in node.items)
    if isinstance(node, Repeat):
        if node.high is None:
            return 0
        return bounded_width(node.child) * node.high
    raise TypeError(node)  # pragma: no cover


def _consumable(node: Node) -> frozenset[int]:
    if isinstance(node, Char):
        return frozenset((node.byte,))
    if isinstance(node, Set):
        return node.members
    if isinstance(node, Assert):
        return frozenset()
    if isinstance(node, Group):
        return _consumable(node.child)
    if isinstance(node, Repeat):
        return _consumable(node.child)
    if isinstance(node, (Cat, Alt)):
        acc: frozenset[int] = frozenset()
        for item in node.items:
            acc |= _consumable(item)
        return acc
    raise TypeError(node)  # pragma: no cover


def repeat_bytes(node: Node) -> frozenset[int]:
    """Bytes that some unbounded repeat inside ``node`` can consume."""
    if isinstance(node, (Char, Set, Assert)):
        return frozenset()
    if isinstance(node, Group):
        return repeat_bytes(node.child)
    if isinstance(node, Repeat):
        if node.high is None:
            return _consumable(node.child)
        return repeat_bytes(node.child)
    if isinstance(node, (Cat, Alt)):
        acc: frozenset[int] = frozenset()
        for item in node.items:
            acc |= repeat_bytes(item)
        return acc
    raise TypeError(node)  # pragma: no cover


def _nullable(node: Node) -> bool:
    if isinstance(node, (Char, Set)):
        return False
    if isinstance(node, Assert):
        return True
    if isinstance(node, Group):
        return _nullable(node.child)
    if isinstance(node, Cat):
        return all(_nullable(i) for i in node.items)
    if isinstance(node, Alt):
        return any(_nullable(i) for i in node.items)
    if isinstance(node, Repeat):
        return node.low == 0 or _nullable(node.child)
    raise TypeError(node)  # pragma: no cover


def leading_asserts(node: Node) -> frozenset[str]:
    """Kinds of the assertions a match of ``node`` can test before it has
    consumed a byte (``^`` in ``^ +``, ``\\b`` in ``a?\\bc``)."""
    if isinstance(node, (Char, Set)):
        return frozenset()
    if isinstance(node, Assert):
        return frozenset((node.kind,))
    if isinstance(node, Group):
        return leading_asserts(node.child)
    if isinstance(node, Repeat):
        return leading_asserts(node.child) if node.high != 0 else frozenset()
    if isinstance(node, Alt):
        acc: frozenset[str] = frozenset()
        for item in node.items:
            acc |= leading_asserts(item)
        return acc
    if isinstance(node, Cat):
        acc = frozenset()
        for item in node.items:
            acc |= leading_asserts(item)
            if not _nullable(item):
                break
        return acc
    raise TypeError(node)  # pragma: no cover


def trailing_asserts(node: Node) -> frozenset[str]:
    """Kinds of the assertions a match of ``node`` can test after it has
    consumed its last byte (``$`` in ``\\s+$``, ``\\b`` in ``a\\b\\s*``)."""
    if isinstance(node, (Char, Set)):
        return frozenset()
    if isinstance(node, Assert):
        return frozenset((node.kind,))
    if isinstance(node, Group):
        return trailing_asserts(node.child)
    if isinstance(node, Repeat):
        return trailing_asserts(node.child) if node.high != 0 else frozenset()
    if isinstance(node, Alt):
        acc: frozenset[str] = frozenset()
        for item in node.items:
            acc |= trailing_asserts(item)
        return acc
    if isinstance(node, Cat):
        acc = frozenset()
        for item in reversed(node.items):
            acc |= trailing_asserts(item)
            if not _nullable(item):
                break
        return acc
    raise TypeError(node)  # pragma: no cover


def last_bytes(node: Node) -> frozenset[int]:
    """Bytes a non-empty match of ``node`` can end with."""
    return _edge_bytes(node, True)


def first_bytes(node: Node) -> frozenset[int]:
    """Bytes a non-empty match of ``node`` can start with."""
    return _edge_bytes(node, False)


def _edge_bytes(node: Node, last: bool) -> frozenset[int]:
    if isinstance(node, Char):
        return frozenset((node.byte,))
    if isinstance(node, Set):
        return node.members
    if isinstance(node, Assert):
        return frozenset()
    if isinstance(node, (Group, Repeat)):
        return _edge_bytes(node.child, last)
    if isinstance(node, Alt):
        acc: frozenset[int] = frozenset()
        for item in node.items:
            acc |= _edge_bytes(item, last)
        return acc
    if isinstance(node, Cat):
        acc = frozenset()
        for item in reversed(node.items) if last else node.items:
            acc |= _edge_bytes(item, last)
            if not _nullable(item):
                break
        return acc
    raise TypeError(node)  # pragma: no cover


def _unbounded_repeats(node: Node) -> list[Repeat]:
    found: list[Repeat] = []

    def walk(n: Node) -> None:
        if isinstance(n, Repeat):
            if n.high is None:
                found.append(n)
            walk(n.child)
        elif isinstance(n, Group):
            walk(n.child)
        elif isinstance(n, (Cat, Alt)):
            for i in n.items:
                walk(i)

    walk(node)
    return found


def _alts(node: Node) -> list[Alt]:
    found: list[Alt] = []

    def walk(n: Node) -> None:
        if isinstance(n, Alt):
            found.append(n)
            for i in n.items:
                walk(i)
        elif isinstance(n, (Group, Repeat)):
            walk(n.child)
        elif isinstance(n, Cat):
            for i in n.items:
                walk(i)

    walk(node)
    return found


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
                if _nullable(branch):
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
                if _consumable(a.child) & _consumable(b.child):
                    return "nested unbounded repeats that can consume the same bytes"
    for rep in _repeats(tree):
        if rep.high is not None and rep.high < 2:
            continue
        if _ambiguous_tail(rep.child):
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


def _repeats(node: Node) -> list[Repeat]:
    found: list[Repeat] = []

    def walk(n: Node) -> None:
        if isinstance(n, Repeat):
            found.append(n)
            walk(n.child)
        elif isinstance(n, Group):
            walk(n.child)
        elif isinstance(n, (Cat, Alt)):
            for i in n.items:
                walk(i)

    walk(node)
    return found


def _ambiguous_tail(body: Node) -> bool:
    """Whether some unbounded repeat in ``body`` can eat what follows it there.

    ``.*a`` is (``.`` eats ``a``): repeated, such a body can split its input
    in a number of ways that grows with a power of its length.  A repeat at
    the end of the body (``(a+)+``) is not: ``regex`` handles that shape.
    """
    if isinstance(body, Group):
        return _ambiguous_tail(body.child)
    if isinstance(body, Alt):
        return any(_ambiguous_tail(i) for i in body.items)
    if isinstance(body, Repeat):
        return _ambiguous_tail(body.child)
    if isinstance(body, Cat):
        items = body.items
        for k, item in enumerate(items):
            rest = items[k + 1 :]
            if rest:
                follow = first_bytes(Cat(rest))
                for r in _unbounded_repeats(item):
                    if _ends_item(r, item) and _consumable(r.child) & follow:
                        return True
            if _ambiguous_tail(item):
                return True
    return False


def _ends_item(rep: Repeat, item: Node) -> bool:
    """Whether ``rep`` can be the last thing ``item`` consumes."""
    if item is rep:
        return True
    if isinstance(item, Group):
        return _ends_item(rep, item.child)
    if isinstance(item, Alt):
        return any(_ends_item(rep, i) for i in item.items)
    if isinstance(item, Repeat):
        return _ends_item(rep, item.child)
    if isinstance(item, Cat):
        for k in range(len(item.items) - 1, -1, -1):
            if _ends_item(rep, item.items[k]):
                return True
            if not _nullable(item.items[k]):
                return False
    return False


def _is_within(inner: Node, outer: Repeat) -> bool:
    stack: list[Node] = [outer.child]
    while stack:
        n = stack.pop()
        if n is inner:
            return True
        if isinstance(n, (Group, Repeat)):
            stack.append(n.child)
        elif isinstance(n, (Cat, Alt)):
            stack.extend(n.items)
    return False


def literal_prefix(node: Node) -> bytes:
    """Bytes every match of ``node`` starts with (case-sensitive; may be empty)."""
    out = bytearray()
    _prefix(node, out)
    return bytes(out)


def _prefix(node: Node, out: bytearray, asserts: bool = True) -> bool:
    """Append ``node``'s fixed leading bytes to ``out``; True if all of it is
    fixed.  ``asserts``: whether a zero-width assertion counts as fixed (it
    adds no byte) or ends the fixed part."""
    if isinstance(node, Char):
        out.append(node.byte)
        return True
    if isinstance(node, Assert):
        return asserts
    if isinstance(node, Group):
        return _prefix(node.child, out, asserts)
    if isinstance(node, Cat):
        for item in node.items:
            if not _prefix(item, out, asserts):
                return False
        return True
    if isinstance(node, Repeat) and node.low >= 1:
        _prefix(node.child, out, asserts)
        return False
    return False


def pure_literal(node: Node) -> bytes | None:
    """The one byte string ``node`` matches, when it is nothing but literal
    bytes (groups allowed; no set, assertion, alternation or repeat), else
    None.  Folded letters of a caseless rule are sets, so they never count.

    Such a rule's leftmost non-overlapping matches from a position are those
    of ``bytes.split``: the scanner replaces them without a regex scan.
    """
    out = bytearray()
    if not _prefix(node, out, asserts=False) or not out:
        return None
    return bytes(out)


def can_match_empty(node: Node) -> bool:
    """Whether ``node`` has a match of length zero (assertions count as empty)."""
    return _nullable(node)


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
        (rep.high is None or rep.high > 1) and _nullable(rep.child) for rep in _repeats(node)
    )


def empty_loop_groups(node: Node) -> frozenset[int]:
    """Capture groups inside a repeat whose body can match empty.

    ``regex`` keeps the captures of a last iteration that matched empty;
    Perl and sregex drop that iteration.  The scanner corrects the captures
    of these groups (see ``scanner.Found.span``).
    """
    found: set[int] = set()

    def groups_in(n: Node) -> None:
        if isinstance(n, Group):
            if n.index is not None:
                found.add(n.index)
            groups_in(n.child)
        elif isinstance(n, Repeat):
            groups_in(n.child)
        elif isinstance(n, (Cat, Alt)):
            for i in n.items:
                groups_in(i)

    def walk(n: Node) -> None:
        if isinstance(n, Repeat):
            if _nullable(n.child):
                groups_in(n.child)
            walk(n.child)
        elif isinstance(n, Group):
            walk(n.child)
        elif isinstance(n, (Cat, Alt)):
            for i in n.items:
                walk(i)

    walk(node)
    return frozenset(found)
