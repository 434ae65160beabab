"""The sregex regex dialect: parse it exactly as sregex does, or refuse it.

``replace_filter`` rules are written in the dialect of openresty's sregex
engine.  This module parses that dialect exactly as sregex's lexer and grammar
do (same accepted syntax, same refusals) into the syntax tree of
:mod:`.syntax`.  :mod:`.emit` writes the tree out for ``regex`` and RE2 (bytes,
``.`` matching newline, multi-line ``^``/``$``, ASCII classes and ASCII-only
case folding); :mod:`.analysis` reasons about it for the streaming transducer.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

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

__all__ = ["DeferredRegex", "DialectError", "parse_sregex"]

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


class DeferredRegex(ParsedRegex):
    """A pattern parsed and checked already, by another process from the
    same bytes (a worker's master validated the rules file): it is parsed
    again when its tree is first needed (its rule set's scanner is built
    on the first request for a site using it), not when the file loads.
    Equal to, and hashed as, the ``ParsedRegex`` it stands for."""

    def __init__(self, pattern: bytes, caseless: bool = False) -> None:  # (no dataclass fields set)
        object.__setattr__(self, "_pattern", pattern)
        object.__setattr__(self, "caseless", caseless)
        object.__setattr__(self, "_parsed", None)

    def _parse(self) -> ParsedRegex:
        parsed: ParsedRegex | None = self.__dict__["_parsed"]
        if parsed is None:
            parsed = parse_sregex(self.__dict__["_pattern"], self.caseless)
            object.__setattr__(self, "_parsed", parsed)
        return parsed

    @property
    def tree(self) -> Node:
        return self._parse().tree

    @property
    def ngroups(self) -> int:
        return self._parse().ngroups

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ParsedRegex):
            return NotImplemented
        return (self.tree, self.ngroups, self.caseless) == (other.tree, other.ngroups, other.caseless)

    def __hash__(self) -> int:
        return hash((self.tree, self.ngroups, self.caseless))
