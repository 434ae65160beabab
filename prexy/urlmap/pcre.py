"""Translate an nginx map regex (PCRE2 syntax) for the ``regex`` package, and
find the literals every match must contain.

nginx compiles map regexes with PCRE2 on bytes, without UTF, UCP, multiline
or dotall; ``~*`` adds caseless.  The translation targets ``regex`` with
``V1 | ASCII`` (``V1`` gives PCRE's scoped inline flags) and rewrites what
``regex`` reads differently: ``\\Q..\\E``, ``\\x{..}``, ``\\o{..}``, ``\\e``,
``\\cX``, ``\\h``/``\\v``/``\\R``/``\\N``, ``\\Z``, ``\\k<name>``, ``(?'n'..)``,
``{,n}`` (a literal in PCRE2 10.42), PCRE's backreference-or-octal rule, and
character classes (emitted canonically so ``regex``'s set operators never
trigger).  Options the ``regex`` package lacks are applied by the parser:
``(?x)``, ``(?U)``, ``(?n)``, ``(?^)``; start-of-pattern limits such as
``(*LIMIT_MATCH=n)`` are dropped.  Syntax errors PCRE2 10.42 (nginx 1.22 on
Debian) reports are raised as :class:`RegexSyntaxError`, including a
lookbehind branch without a fixed length; so are the few PCRE features
whose meaning cannot be reproduced: ``(*UTF)``, ``(*UCP)``, newline
conventions, ``(?J)``.

An item list describes the pattern for the analysis: each literal character,
zero-width assertion, or anything else ("break"), with the output pieces it
became; groups without alternation or quantifier are transparent.

Alongside the pattern it produces what the index needs:

* ``anchored``: the literal text every match starts with when the pattern
  begins with ``^`` (or ``\\A``) and has no top-level ``|``;
* ``split``: when the pattern starts with a plainly written literal (right
  after ``^``, or with ``floating`` set, at the very start), the offset in
  the translated pattern where the rest begins, so maps whose regexes
  differ only in that literal share one compiled "rest";
* ``required``: the longest literal any match must contain, and
  ``secondary`` the longest one outside the anchored literal;
* ``skeleton``: the translated pattern with each run of literal characters
  collapsed to one ``a``; it compiles exactly when the pattern does, so
  100,000 regexes of a few shapes are validated with a few compilations.

Literals are lower-cased (ASCII) for caseless regexes.  Anything unusual
(``i``/``m`` inline options, recursion, conditionals, verbs, branch reset,
``\\G``) turns the analysis off: such a regex is simply always a candidate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "RegexSyntaxError", "TailCache", "Translated", "ascii_lower", "literal_text", "split_prefix",
    "translate",
]

ASCII_LOWER_TABLE = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(text: str) -> str:
    """Lower-case ASCII letters only, as nginx's ``ngx_tolower`` does."""
    if text.isascii():
        return text.lower()
    return text.translate(ASCII_LOWER_TABLE)


class RegexSyntaxError(ValueError):
    """The pattern is not valid PCRE (or uses a PCRE feature not supported)."""

    def __init__(self, reason: str, offset: int) -> None:
        self.reason = reason
        self.offset = offset
        super().__init__(f"{reason} at offset {offset}")


class Translated(NamedTuple):
    """A translated pattern and what the index may use about it."""

    pattern: str
    skeleton: str | None
    group_names: tuple[str, ...]
    anchored: str
    split: int | None
    split_literal: str
    required: str
    secondary: str = ""
    floating: bool = False  # split without ^: the literal may be anywhere in the key


_LIT, _ZERO, _BREAK = 0, 1, 2
_MARK = object()  # a literal character in the skeleton

_POSIX: dict[str, list[tuple[int, int]]] = {
    "alpha": [(0x41, 0x5A), (0x61, 0x7A)],
    "digit": [(0x30, 0x39)],
    "alnum": [(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)],
    "upper": [(0x41, 0x5A)],
    "lower": [(0x61, 0x7A)],
    "space": [(0x09, 0x0D), (0x20, 0x20)],
    "blank": [(0x09, 0x09), (0x20, 0x20)],
    "cntrl": [(0x00, 0x1F), (0x7F, 0x7F)],
    "graph": [(0x21, 0x7E)],
    "print": [(0x20, 0x7E)],
    "punct": [(0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)],
    "xdigit": [(0x30, 0x39), (0x41, 0x46), (0x61, 0x66)],
    "word": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
    "ascii": [(0x00, 0x7F)],
}
_NOOP_VERBS = frozenset({
    "NO_AUTO_POSSESS", "NO_DOTSTAR_ANCHOR", "NO_JIT", "NO_START_OPT", "LIMIT_MATCH",
    "LIMIT_DEPTH", "LIMIT_HEAP", "LIMIT_RECURSION", "LF", "BSR_UNICODE",
})
_UNSUPPORTED_VERBS = frozenset({
    "UTF", "UTF8", "UCP", "CR", "CRLF", "ANYCRLF", "ANY", "NUL", "BSR_ANYCRLF", "NOTEMPTY",
    "NOTEMPTY_ATSTART",
})
_HSPACE = [(0x09, 0x09), (0x20, 0x20), (0xA0, 0xA0)]
_VSPACE = [(0x0A, 0x0D), (0x85, 0x85)]
_MAXCHAR = 0x10FFFF
_SIMPLE_ESCAPES = {"a": "\x07", "e": "\x1b", "f": "\x0c", "n": "\n", "r": "\r", "t": "\t"}
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/_-")
_HEX = frozenset("0123456789abcdefABCDEF")
_OCT = frozenset("01234567")
_DIGITS = frozenset("0123456789")
_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_NAME_CHARS = _NAME_START | _DIGITS


def _char(code: int) -> str:
    """A code point as an unambiguous escape, usable inside and outside classes."""
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _emit_literal(ch: str) -> str:
    if ch in _PLAIN:
        return ch
    return _char(ord(ch))


def _complement(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in sorted(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= _MAXCHAR:
        out.append((nxt, _MAXCHAR))
    return out


def _ranges_text(ranges: list[tuple[int, int]]) -> str:
    return "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges)


class _Parser:
    """One pass over a PCRE pattern: emit the translation, collect literal facts."""

    def __init__(self, src: str, caseless: bool) -> None:
        self.src = src
        self.caseless = caseless
        self.pos = 0
        self.out: list[str] = []
        self.skel: list[object] = []
        self.groups = 0
        self.names: list[str] = []
        self.opaque = False  # literal analysis unsafe
        self.no_skeleton = False
        self.lookbehind = 0
        self.extended = False  # (?x): whitespace and # comments ignored
        self.ungreedy = False  # (?U): quantifiers lazy unless followed by ?
        self.no_capture = False  # (?n): plain ( does not capture
        self.quoted_start = -1
        self.top_alternation = False

    # -- helpers ------------------------------------------------------------

    def error(self, msg: str) -> RegexSyntaxError:
        """A syntax error at the current offset."""
        return RegexSyntaxError(msg, self.pos)

    def peek(self, k: int = 0) -> str:
        """The character ``k`` ahead, or ``""`` past the end."""
        i = self.pos + k
        return self.src[i] if i < len(self.src) else ""

    def emit(self, text: str) -> None:
        """Append non-literal output (verbatim in the skeleton too)."""
        self.out.append(text)
        self.skel.append(text)

    def emit_literal(self, ch: str, items: list[tuple[int, str, int, int, bool]], direct: bool) -> None:
        """Emit one literal character and record it for the literal analysis."""
        before = len(self.out)
        self.out.append(_emit_literal(ch))
        self.skel.append(self.out[-1] if self.lookbehind else _MARK)
        items.append((_LIT, ascii_lower(ch) if self.caseless else ch, before, len(self.out), direct))

    # -- structure ----------------------------------------------------------

    def parse(self) -> list[tuple[int, str, int, int, bool]]:
        """Parse the whole pattern; return the top-level items."""
        items = self.alternation(top=True)
        if self.pos < len(self.src):
            raise self.error("unmatched closing parenthesis")
        return items or []

    def alternation(
        self, top: bool = False, marks: list[int] | None = None
    ) -> list[tuple[int, str, int, int, bool]] | None:
        """Parse branches until ``)`` or the end; return the items if there is one branch.

        Option settings made inside last until the end of this group (later
        branches included, as in PCRE).  ``marks`` collects the output index
        of each ``|`` of this level.
        """
        saved = self.options()
        branches = 0
        items: list[tuple[int, str, int, int, bool]] = []
        while True:
            branch: list[tuple[int, str, int, int, bool]] = []
            self.sequence(branch, top)
            branches += 1
            if branches == 1:
                items = branch
            if self.peek() == "|":
                self.pos += 1
                if marks is not None:
                    marks.append(len(self.out))
                self.emit("|")
                if top:
                    self.top_alternation = True
                continue
            break
        self.set_options(saved)
        return items if branches == 1 else None

    def options(self) -> tuple[bool, bool, bool]:
        """The option settings the parser itself applies: x, U, n."""
        return (self.extended, self.ungreedy, self.no_capture)

    def set_options(self, saved: tuple[bool, bool, bool]) -> None:
        """Restore option settings at the end of a group."""
        self.extended, self.ungreedy, self.no_capture = saved

    def sequence(self, items: list[tuple[int, str, int, int, bool]], top: bool) -> None:
        """Parse one branch up to ``|``, ``)`` or the end."""
        src = self.src
        last: tuple[int, int] | None = None  # (first item, first output piece) of the last atom
        while self.pos < len(src):
            ch = src[self.pos]
            if ch == "|" or ch == ")":
                return
            if self.extended and ch in " \t\n\r\x0b\x0c":
                self.pos += 1
                continue
            if self.extended and ch == "#":
                nl = src.find("\n", self.pos)
                self.pos = len(src) if nl < 0 else nl + 1
                continue
            quant = self.read_quantifier()
            if quant:
                if last is None:
                    raise self.error("quantifier does not follow a repeatable item")
                self.apply_quantifier(quant, items, *last)
                last = None
                continue
            start_items = len(items)
            before = len(self.out)
            self.quoted_start = -1
            self.atom(items, top)
            if self.quoted_start >= 0:
                # a quantifier after \Q..\E applies to its last character only
                last = (self.quoted_start, items[-1][2])
            elif len(self.out) > before:
                last = (start_items, before)

    def read_quantifier(self) -> str:
        """Consume and return a quantifier at the current position, or return ``""``."""
        src = self.src
        ch = self.peek()
        quant = ""
        if ch in ("*", "+", "?"):
            quant = ch
            self.pos += 1
        elif ch == "{":
            end = self.pos + 1
            while end < len(src) and src[end] in _DIGITS:
                end += 1
            lo = src[self.pos + 1:end]
            if lo and end < len(src) and src[end] == "}":
                quant = src[self.pos:end + 1]
                self.pos = end + 1
            elif lo and end < len(src) and src[end] == ",":
                end2 = end + 1
                while end2 < len(src) and src[end2] in _DIGITS:
                    end2 += 1
                if end2 < len(src) and src[end2] == "}":
                    hi = src[end + 1:end2]
                    if hi and int(hi) < int(lo):
                        self.pos = end2
                        raise self.error("numbers out of order in {} quantifier")
                    quant = src[self.pos:end2 + 1]
                    self.pos = end2 + 1
        if quant[:1] == "{" and any(int(n) > 65535 for n in quant[1:-1].split(",") if n):
            raise self.error("number too big in {} quantifier")
        if quant and self.peek() in ("+", "?"):
            quant += self.peek()
            self.pos += 1
        return quant

    def apply_quantifier(
        self, quant: str, items: list[tuple[int, str, int, int, bool]], start_items: int, before: int
    ) -> None:
        """Attach a quantifier to the last atom, which stops being a fixed literal."""
        # the quantified atom is no longer a fixed literal
        if self.skel and self.skel[-1] is _MARK:
            self.skel[-1] = "a"
        if self.ungreedy:
            # (?U) swaps greedy and lazy; possessive stays possessive
            if len(quant) > 1 and quant[-1] == "?":
                quant = quant[:-1]
            elif not (len(quant) > 1 and quant[-1] == "+"):
                quant += "?"
        self.emit(quant)
        del items[start_items:]
        items.append((_BREAK, "", before, len(self.out), False))

    def atom(self, items: list[tuple[int, str, int, int, bool]], top: bool) -> None:
        """Parse one atom (not its quantifier)."""
        src = self.src
        ch = src[self.pos]
        if ch == "\\":
            self.escape(items, top)
        elif ch == "[":
            before = len(self.out)
            self.char_class()
            items.append((_BREAK, "", before, len(self.out), False))
        elif ch == "(":
            self.group(items, top)
        elif ch == "^" or ch == "$":
            self.pos += 1
            before = len(self.out)
            self.emit(ch)
            items.append((_ZERO, ch, before, len(self.out), top))
        elif ch == ".":
            self.pos += 1
            before = len(self.out)
            self.emit(".")
            items.append((_BREAK, "", before, len(self.out), False))
        elif ch in "*+?":
            raise self.error("quantifier does not follow a repeatable item")
        else:
            self.pos += 1
            self.emit_literal(ch, items, top)

    def escape(self, items: list[tuple[int, str, int, int, bool]], top: bool) -> None:
        """Parse a backslash sequence outside a class."""
        src = self.src
        self.pos += 1
        if self.pos >= len(src):
            raise self.error("\\ at end of pattern")
        ch = src[self.pos]
        self.pos += 1
        before = len(self.out)
        if ch == "Q":
            end = src.find("\\E", self.pos)
            stop = len(src) if end < 0 else end
            for lit in src[self.pos:stop]:
                self.quoted_start = len(items)
                self.emit_literal(lit, items, top)
            self.pos = len(src) if end < 0 else end + 2
            return
        if ch == "E":
            return
        code = self.char_escape(ch, in_class=False)
        if code is not None:
            self.emit_literal(chr(code), items, top)
            return
        if ch in "dDwWsS":
            self.emit("\\" + ch)
        elif ch in "hHvV":
            ranges = _HSPACE if ch in "hH" else _VSPACE
            neg = "^" if ch.isupper() else ""
            self.emit(f"[{neg}{_ranges_text(ranges)}]")
        elif ch == "R":
            self.emit("(?>\\x0d\\x0a|[\\x0a-\\x0d\\x85])")
        elif ch == "N":
            if self.peek() == "{":
                raise self.error("\\N{name} is not supported")
            self.emit("[^\\x0a]")
        elif ch == "X":
            self.emit("\\X")
        elif ch == "C":
            self.emit("(?s:.)")
        elif ch in "pP":
            if self.peek() == "{":
                end = src.find("}", self.pos)
                if end < 0:
                    raise self.error("malformed \\P or \\p sequence")
                prop = src[self.pos - 2:end + 1]
                self.pos = end + 1
            else:
                if self.pos >= len(src):
                    raise self.error("malformed \\P or \\p sequence")
                prop = src[self.pos - 2:self.pos + 1]
                self.pos += 1
            self.emit(prop)
        elif ch in "bBAzGK":
            if ch == "G":
                self.opaque = True  # \G depends on where matching starts: no split
            self.emit("\\" + ch)
            items.append((_ZERO, ch, before, len(self.out), False))
            return
        elif ch == "Z":
            self.emit("(?=\\x0a?\\z)")
            items.append((_ZERO, ch, before, len(self.out), False))
            return
        elif ch in _DIGITS:
            self.backref_or_octal(ch, items, top)
            return
        elif ch == "g":
            self.g_escape()
        elif ch == "k":
            self.k_escape()
        else:
            raise self.error("unrecognized character follows \\")
        items.append((_BREAK, "", before, len(self.out), False))

    def char_escape(self, ch: str, in_class: bool) -> int | None:
        """Escapes that stand for one character; ``None`` if ``ch`` is not one."""
        src = self.src
        if ch in _SIMPLE_ESCAPES:
            return ord(_SIMPLE_ESCAPES[ch])
        if in_class and ch == "b":
            return 0x08
        if not ch.isascii() or not ch.isalnum():
            return ord(ch)
        if ch == "x":
            if self.peek() == "{":
                end = src.find("}", self.pos)
                digits = src[self.pos + 1:end] if end >= 0 else ""
                if end < 0 or not digits or any(c not in _HEX for c in digits):
                    raise self.error("non-hex character in \\x{} (closing brace missing?)")
                self.pos = end + 1
                code = int(digits, 16)
            else:
                end = self.pos
                while end < len(src) and end < self.pos + 2 and src[end] in _HEX:
                    end += 1
                code = int(src[self.pos:end], 16) if end > self.pos else 0
                self.pos = end
            if code > _MAXCHAR:
                raise self.error("character code point value in \\x{} or \\o{} is too large")
            return code
        if ch == "o":
            end = src.find("}", self.pos)
            digits = src[self.pos + 1:end] if self.peek() == "{" and end >= 0 else ""
            if not digits or any(c not in _OCT for c in digits):
                raise self.error("missing opening brace after \\o or non-octal character")
            self.pos = end + 1
            code = int(digits, 8)
            if code > _MAXCHAR:
                raise self.error("character code point value in \\x{} or \\o{} is too large")
            return code
        if ch == "c":
            if self.pos >= len(src) or not src[self.pos].isascii() or not src[self.pos].isprintable():
                raise self.error("\\c must be followed by a printable ASCII character")
            code = ord(src[self.pos].upper()) ^ 0x40
            self.pos += 1
            return code
        if ch == "0":
            end = self.pos
            while end < len(src) and end < self.pos + 2 and src[end] in _OCT:
                end += 1
            code = int("0" + src[self.pos:end], 8)
            self.pos = end
            return code
        if in_class and ch in _OCT:
            end = self.pos
            while end < len(src) and end < self.pos + 2 and src[end] in _OCT:
                end += 1
            code = int(ch + src[self.pos:end], 8)
            self.pos = end
            return code
        return None

    def backref_or_octal(self, first: str, items: list[tuple[int, str, int, int, bool]], top: bool) -> None:
        """PCRE's rule for ``\\<digits>``: a backreference, else an octal character."""
        src = self.src
        start = self.pos - 1
        end = self.pos
        while end < len(src) and src[end] in _DIGITS:
            end += 1
        number = int(src[start:end])
        if number < 10 or first in "89" or number <= self.groups:
            self.pos = end
            self.backref_number(number)
            return
        # octal: up to three octal digits, the rest are literal digits
        end = start
        while end < len(src) and end < start + 3 and src[end] in _OCT:
            end += 1
        if end == start:
            self.pos = start + 1
            self.backref_number(number)
            return
        self.pos = end
        self.emit_literal(chr(int(src[start:end], 8)), items, top)

    def backref_number(self, number: int) -> None:
        """Emit a numbered backreference, delimited so following digits stay literal."""
        self.emit(f"(?:\\g<{number}>)")
        self.no_skeleton = True  # validity depends on the group count

    def g_escape(self) -> None:
        """``\\g`` forms: backreferences by number or name, or subroutine calls."""
        src = self.src
        ch = self.peek()
        if ch in ("<", "'"):
            self.opaque = True
            self.no_skeleton = True
            close = ">" if ch == "<" else "'"
            end = src.find(close, self.pos + 1)
            if end < 0:
                raise self.error("\\g is not followed by a braced, angle-bracketed, or quoted name/number")
            ref = src[self.pos + 1:end]
            self.pos = end + 1
            self.emit(f"(?{ref})" if ref.lstrip("+-").isdigit() else f"(?&{ref})")
            return
        if ch == "{":
            end = src.find("}", self.pos)
            if end < 0:
                raise self.error("\\g is not followed by a braced, angle-bracketed, or quoted name/number")
            ref = src[self.pos + 1:end]
            self.pos = end + 1
        else:
            end = self.pos
            if end < len(src) and src[end] in "+-":
                end += 1
            while end < len(src) and src[end] in _DIGITS:
                end += 1
            ref = src[self.pos:end]
            self.pos = end
        if not ref:
            raise self.error("a numbered reference must not be zero")
        if ref.lstrip("+-").isdigit():
            number = int(ref)
            if ref.startswith("-"):
                number = self.groups + 1 + number
            elif ref.startswith("+"):
                raise self.error("\\g{+n} is not supported")
            if number <= 0:
                raise self.error("a numbered reference must not be zero")
            self.backref_number(number)
        else:
            self.backref_name(ref)

    def k_escape(self) -> None:
        """``\\k<name>`` / ``\\k'name'`` / ``\\k{name}`` backreferences."""
        src = self.src
        opener = self.peek()
        close = {"<": ">", "'": "'", "{": "}"}.get(opener)
        if close is None:
            raise self.error("\\k is not followed by a braced, angle-bracketed, or quoted name")
        end = src.find(close, self.pos + 1)
        if end < 0:
            raise self.error("syntax error in subpattern name (missing terminator?)")
        name = src[self.pos + 1:end]
        self.pos = end + 1
        self.backref_name(name)

    def backref_name(self, name: str) -> None:
        """Emit a named backreference."""
        self.check_name(name)
        self.emit(f"(?P={name})")
        self.no_skeleton = True

    def check_name(self, name: str) -> None:
        """PCRE's rules for group names."""
        if not name or name[0] not in _NAME_START or any(c not in _NAME_CHARS for c in name):
            raise self.error("subpattern name expected")
        if len(name) > 32:
            raise self.error("subpattern name is too long (maximum 32 code units)")

    def group(self, items: list[tuple[int, str, int, int, bool]], top: bool) -> None:
        """Parse a parenthesised construct starting at ``(``."""
        src = self.src
        before = len(self.out)
        self.pos += 1
        kind = "capture"
        name = ""
        if self.peek() == "*":
            end = src.find(")", self.pos)
            if end < 0:
                raise self.error("missing closing parenthesis")
            verb = src[self.pos:end]
            name = verb[1:].split("=", 1)[0]
            if name.isupper() and name.replace("_", "").isalpha():
                if name in _NOOP_VERBS and before == 0:
                    self.pos = end + 1  # an optimisation or limit: no effect on the answer
                    return
                if name in _UNSUPPORTED_VERBS:
                    raise self.error(f"({verb}) is not supported")
            self.opaque = True
            self.no_skeleton = True
            self.pos = end + 1
            self.emit(f"({verb})")
            items.append((_BREAK, "", before, len(self.out), False))
            return
        if self.peek() == "?":
            self.pos += 1
            ch = self.peek()
            if ch == "#":
                end = src.find(")", self.pos)
                if end < 0:
                    raise self.error("missing ) at end of (?# comment")
                self.pos = end + 1
                return
            if ch == ":":
                kind, opener = "plain", "(?:"
                self.pos += 1
            elif ch == ">":
                kind, opener = "plain", "(?>"
                self.pos += 1
            elif ch == "|":
                kind, opener = "reset", "(?|"
                self.pos += 1
                self.opaque = True
                self.no_skeleton = True
            elif ch in ("=", "!"):
                kind, opener = "look", "(?" + ch
                self.pos += 1
            elif ch == "<" and self.peek(1) in ("=", "!"):
                kind, opener = "lookbehind", "(?<" + self.peek(1)
                self.pos += 2
            elif ch == "<" or ch == "'" or (ch == "P" and self.peek(1) == "<"):
                if ch == "P":
                    self.pos += 1
                close = ">" if self.peek() == "<" else "'"
                end = src.find(close, self.pos + 1)
                if end < 0:
                    raise self.error("syntax error in subpattern name (missing terminator?)")
                name = src[self.pos + 1:end]
                self.check_name(name)
                if name in self.names:
                    raise self.error("two named subpatterns have the same name (PCRE2_DUPNAMES not set)")
                self.pos = end + 1
                kind, opener = "capture", f"(?P<{name}>"
            elif ch == "P" and self.peek(1) == "=":
                end = src.find(")", self.pos)
                if end < 0:
                    raise self.error("syntax error in subpattern name (missing terminator?)")
                ref = src[self.pos + 2:end]
                self.pos = end + 1
                self.backref_name(ref)
                items.append((_BREAK, "", before, len(self.out), False))
                return
            elif ch == "P" and self.peek(1) == ">" or ch == "&" or ch == "R" or ch in _DIGITS or ch in "+-" and self.peek(1) in _DIGITS:
                end = src.find(")", self.pos)
                if end < 0:
                    raise self.error("missing closing parenthesis")
                ref = src[self.pos:end]
                self.pos = end + 1
                if ref.startswith("P>"):
                    ref = "&" + ref[2:]
                self.opaque = True
                self.no_skeleton = True
                self.emit(f"(?{ref})")
                items.append((_BREAK, "", before, len(self.out), False))
                return
            elif ch == "(":
                self.opaque = True
                self.no_skeleton = True
                self.pos += 1
                if self.peek() == "?":
                    # an assertion condition: (?(?=...)yes|no)
                    self.emit("(?")
                    self.pos -= 1
                    self.group([], False)
                else:
                    end = src.find(")", self.pos)
                    if end < 0:
                        raise self.error("malformed number or name after (?(")
                    cond = src[self.pos:end]
                    self.pos = end + 1
                    if cond[:1] in ("<", "'"):
                        cond = cond[1:-1]
                    self.emit(f"(?({cond})")
                self.alternation()
                if self.peek() != ")":
                    raise self.error("missing closing parenthesis")
                self.pos += 1
                self.emit(")")
                items.append((_BREAK, "", before, len(self.out), False))
                return
            else:
                # inline options: (?imnsxJU-imnsxJU), (?^...), or with ":" a group
                end = self.pos
                while end < len(src) and src[end] not in ":)":
                    end += 1
                if end >= len(src):
                    raise self.error("missing closing parenthesis")
                spec = src[self.pos:end]
                reset = spec.startswith("^")
                if reset:
                    spec = spec[1:]
                on, dash, off = spec.partition("-")
                if (
                    (not spec and not reset)
                    or any(c not in "imnsxJU" for c in on + off)
                    or "-" in off
                    or (reset and dash)
                ):
                    raise self.error("unrecognized character after (? or (?-")
                if "J" in on:
                    # PCRE numbers duplicate-named groups apart; regex merges them
                    raise self.error("(?J) duplicate group names are not supported")
                if reset or set(on + off) & set("im"):
                    self.opaque = True  # literals' case or anchoring may change
                saved = self.options()
                if reset:
                    self.extended = self.no_capture = False
                for letter, value in [(c, True) for c in on] + [(c, False) for c in off]:
                    if letter == "x":
                        self.extended = value
                    elif letter == "U":
                        self.ungreedy = value
                    elif letter == "n":
                        self.no_capture = value
                emit_on = "".join(sorted({c for c in on if c in "ims"}))
                emit_off = "".join(sorted({c for c in off if c in "ims"} | (set("ims") - set(on) if reset else set())))
                flags = emit_on + ("-" + emit_off if emit_off else "")
                self.pos = end + 1
                if src[end] == ")":
                    if flags:
                        self.emit(f"(?{flags})")
                    items.append((_BREAK, "", before, len(self.out), False))
                    return
                self.emit(f"(?{flags}:" if flags else "(?:")
                self.alternation()
                self.set_options(saved)
                if self.peek() != ")":
                    raise self.error("missing closing parenthesis")
                self.pos += 1
                self.emit(")")
                items.append((_BREAK, "", before, len(self.out), False))
                return
        else:
            opener = "("
            if self.no_capture:
                kind, opener = "plain", "(?:"
        if kind == "capture":
            self.groups += 1
            if name:
                self.names.append(name)
        if kind == "lookbehind":
            self.lookbehind += 1
        self.emit(opener)
        body_start = len(self.out)
        marks: list[int] = []
        inner = self.alternation(marks=marks)
        if kind == "lookbehind":
            self.lookbehind -= 1
            self.check_lookbehind(body_start, marks)
        if self.peek() != ")":
            raise self.error("missing closing parenthesis")
        self.pos += 1
        self.emit(")")
        if kind in ("look", "lookbehind"):
            items.append((_ZERO, "", before, len(self.out), False))
        elif inner is None or kind == "reset":
            items.append((_BREAK, "", before, len(self.out), False))
        else:
            # a group with one branch: its literals join the sequence,
            # but not as plain text of this level (no textual split through it)
            items.extend((k, c, b, a, False) for k, c, b, a, _ in inner)

    def check_lookbehind(self, body_start: int, marks: list[int]) -> None:
        """PCRE2 (10.42, as in nginx) wants each top-level branch of a lookbehind
        to have a fixed length; ``regex`` would accept any.  Python's ``re``
        computes widths the same way, so each branch is checked with it;
        branches ``re`` cannot read are left to ``regex``."""
        bounds = [body_start, *[m + 1 for m in marks]]
        ends = [*marks, len(self.out)]
        for start, end in zip(bounds, ends, strict=True):
            branch = "".join(self.out[start:end])
            try:
                re.compile(f"(?<={branch})", re.ASCII)
            except re.error as exc:
                if "fixed-width" in str(exc):
                    raise self.error("lookbehind assertion is not fixed length") from None

    def no_range_after_set(self) -> None:
        """PCRE2 refuses a hyphen after a class escape or POSIX class unless it ends the class."""
        if self.peek() == "-" and self.peek(1) not in ("]", ""):
            raise self.error("invalid range in character class")

    def char_class(self) -> None:
        """Parse ``[...]`` with PCRE's rules and emit it canonically."""
        src = self.src
        if self.peek(1) in (":", ".", "=") and src.find(self.peek(1) + "]", self.pos + 2) >= 0:
            end = src.find(self.peek(1) + "]", self.pos + 2)
            if "]" not in src[self.pos + 2:end]:
                raise self.error("POSIX named classes are supported only within a class")
        self.pos += 1
        negate = False
        if self.peek() == "^":
            negate = True
            self.pos += 1
        members: list[str] = []
        ranges: list[tuple[int, int]] = []
        first = True
        pending: int | None = None  # last single character, may start a range

        def flush() -> None:
            nonlocal pending
            if pending is not None:
                ranges.append((pending, pending))
                pending = None

        while True:
            if self.pos >= len(src):
                raise self.error("missing terminating ] for character class")
            ch = src[self.pos]
            if ch == "]" and not first:
                self.pos += 1
                break
            first = False
            if ch == "[" and self.peek(1) in (":", ".", "="):
                close = src.find(self.peek(1) + "]", self.pos + 2)
                if close >= 0:
                    if self.peek(1) != ":":
                        raise self.error("POSIX collating elements are not supported")
                    name = src[self.pos + 2:close]
                    neg = name.startswith("^")
                    name = name.lstrip("^")
                    if name not in _POSIX:
                        raise self.error("unknown POSIX class name")
                    self.pos = close + 2
                    flush()
                    rs = _POSIX[name]
                    members.append(_ranges_text(_complement(rs) if neg else rs))
                    self.no_range_after_set()
                    continue
            code: int | None
            if ch == "\\":
                self.pos += 1
                if self.pos >= len(src):
                    raise self.error("\\ at end of pattern")
                esc = src[self.pos]
                self.pos += 1
                if esc == "Q":
                    end = src.find("\\E", self.pos)
                    stop = len(src) if end < 0 else end
                    for lit in src[self.pos:stop]:
                        flush()
                        pending = ord(lit)
                    self.pos = len(src) if end < 0 else end + 2
                    continue
                if esc == "E":
                    continue
                if esc in "dDwWsS":
                    flush()
                    members.append("\\" + esc)
                    self.no_range_after_set()
                    continue
                if esc in "hHvV":
                    flush()
                    rs = _HSPACE if esc in "hH" else _VSPACE
                    members.append(_ranges_text(_complement(rs) if esc.isupper() else rs))
                    self.no_range_after_set()
                    continue
                if esc in "pP":
                    flush()
                    if self.peek() == "{":
                        end = src.find("}", self.pos)
                        if end < 0:
                            raise self.error("malformed \\P or \\p sequence")
                        members.append(src[self.pos - 2:end + 1])
                        self.pos = end + 1
                    else:
                        members.append(src[self.pos - 2:self.pos + 1])
                        self.pos += 1
                    continue
                code = self.char_escape(esc, in_class=True)
                if code is None:
                    raise self.error("escape sequence is invalid in character class")
            else:
                self.pos += 1
                code = ord(ch)
            # a range?
            if pending is not None and code == ord("-") and ch == "-":
                nxt = self.peek()
                if nxt and nxt != "]":
                    lo = pending
                    pending = None
                    hi_code: int | None
                    if nxt == "\\":
                        self.pos += 1
                        esc = self.peek()
                        self.pos += 1
                        if esc in "dDwWsShHvVpP" or esc == "":
                            raise self.error("invalid range in character class")
                        hi_code = self.char_escape(esc, in_class=True)
                        if hi_code is None:
                            raise self.error("escape sequence is invalid in character class")
                    elif nxt == "[" and self.peek(1) == ":":
                        raise self.error("invalid range in character class")
                    else:
                        self.pos += 1
                        hi_code = ord(nxt)
                    if hi_code < lo:
                        raise self.error("range out of order in character class")
                    ranges.append((lo, hi_code))
                    continue
            flush()
            pending = code
        flush()
        body = _ranges_text(ranges) + "".join(members)
        self.emit(("[^" if negate else "[") + body + "]")


@dataclass
class _Parsed:
    """The raw result of one parse, before the literal analysis."""

    out: list[str]
    skel: list[object]
    items: list[tuple[int, str, int, int, bool]]
    names: tuple[str, ...]
    opaque: bool
    no_skeleton: bool
    top_alternation: bool


def _parse(pattern: str, caseless: bool) -> _Parsed:
    parser = _Parser(pattern, caseless)
    items = parser.parse()
    return _Parsed(
        parser.out, parser.skel, items, tuple(parser.names),
        parser.opaque, parser.no_skeleton, parser.top_alternation,
    )


# "^" and a run of plain literal characters: the common start of map regexes
_FAST_PREFIX = re.compile(r"(\^?)((?:[^\\\[\](){}|^$.*+?#\s]|\\[^A-Za-z0-9\s])+)")
_ATOM = re.compile(r"\\.|.", re.DOTALL)
_UNESCAPE = re.compile(r"\\(.)", re.DOTALL)
_ESCAPE_TABLE = {c: _char(c) for c in range(256) if chr(c) not in _PLAIN}
_ALL_PLAIN = re.compile(r"[A-Za-z0-9/_\-]*").fullmatch

def translate(pattern: str, caseless: bool, cache: TailCache | None = None) -> Translated:
    """Translate one map regex (without its ``~``/``~*``) and analyse it.

    Patterns that start with plain literal text (after an optional ``^``)
    are parsed from where the literal ends; ``cache`` (shared over one load)
    keeps those parses, so regexes differing only in that literal cost one
    parse.
    """
    split = split_prefix(pattern)
    if split is None:
        return _finish(_parse(pattern, caseless), caseless)
    anchored, lit_src, tail = split
    offset = len(pattern) - len(tail)
    key = (tail, caseless)
    facts = cache.get(key) if cache is not None else None
    if facts is None:
        try:
            facts = _TailFacts(_parse(tail, caseless))
        except RegexSyntaxError as exc:
            raise RegexSyntaxError(exc.reason, exc.offset + offset) from None
        if cache is not None:
            cache[key] = facts
    return facts.complete(literal_text(lit_src), caseless, anchored)


def split_prefix(pattern: str) -> tuple[bool, str, str] | None:
    """``(anchored, literal source, tail)`` when ``pattern`` is an optional ``^``,
    plain literal text, then the tail.

    A quantifier at the start of the tail takes the last literal character
    with it.  ``None`` when the pattern does not start that way.
    """
    m = _FAST_PREFIX.match(pattern)
    if m is None:
        return None
    anchored = m.group(1) == "^"
    lit_src = m.group(2)
    tail = pattern[m.end():]
    if tail[:1] in ("*", "+", "?", "{"):
        atoms = _ATOM.findall(lit_src)
        if len(atoms) < 2:
            return None
        lit_src = "".join(atoms[:-1])
        tail = atoms[-1] + tail
    return anchored, lit_src, tail


def literal_text(lit_src: str) -> str:
    """The characters a literal run written in PCRE stands for (escapes removed)."""
    return _UNESCAPE.sub(r"\1", lit_src) if "\\" in lit_src else lit_src


class _TailFacts:
    """What ``^`` + literal + this tail translates to, for any literal."""

    __slots__ = (
        "out", "skeleton", "floating_skeleton", "names", "analysed", "lead", "lead_text",
        "lead_out", "best_rest",
    )

    def __init__(self, parsed: _Parsed) -> None:
        self.out = "".join(parsed.out)
        self.names = parsed.names
        self.skeleton: str | None = None
        self.floating_skeleton: str | None = None
        if not parsed.no_skeleton:
            # the prefix literal's mark merges with a leading mark of the tail
            pieces = parsed.skel[1:] if parsed.skel[:1] == [_MARK] else parsed.skel
            self.floating_skeleton = _collapse([_MARK, *pieces])
            self.skeleton = "^" + self.floating_skeleton
        self.analysed = not parsed.opaque and not parsed.top_alternation
        lead: list[str] = []
        lead_text: list[str] = []
        textual = True
        lead_out = 0
        items = parsed.items
        i = 0
        while i < len(items):
            kind, ch, _before, after, direct = items[i]
            if kind == _LIT:
                lead.append(ch)
                if textual and direct:
                    lead_text.append(ch)
                    lead_out = after
                else:
                    textual = False
            elif kind == _ZERO:
                textual = False
            else:
                break
            i += 1
        self.lead = "".join(lead)
        self.lead_text = "".join(lead_text)
        self.lead_out = sum(len(piece) for piece in parsed.out[:lead_out])
        self.best_rest = _longest_run(items[i:])

    def complete(self, literal: str, caseless: bool, anchored: bool = True) -> Translated:
        """The translation of [``^``] + ``literal`` + this tail."""
        escaped = literal if _ALL_PLAIN(literal) else literal.translate(_ESCAPE_TABLE)
        if anchored:
            pattern = "^" + escaped + self.out
            skeleton = self.skeleton
        else:
            pattern = escaped + self.out
            skeleton = self.floating_skeleton
        if not self.analysed:
            return Translated(pattern, skeleton, self.names, "", None, "", "")
        folded = ascii_lower(literal) if caseless else literal
        lead = folded + self.lead
        required = lead if len(lead) >= len(self.best_rest) else self.best_rest
        return Translated(
            pattern=pattern,
            skeleton=skeleton,
            group_names=self.names,
            anchored=lead if anchored else "",
            split=(1 if anchored else 0) + len(escaped) + self.lead_out,
            split_literal=folded + self.lead_text,
            required=required,
            secondary=self.best_rest if anchored else "",
            floating=not anchored,
        )


TailCache = dict[tuple[str, bool], _TailFacts]


def _collapse(skel: list[object]) -> str:
    """Join skeleton pieces, each run of literal marks becoming one ``a``."""
    parts: list[str] = []
    prev_mark = False
    for piece in skel:
        if piece is _MARK:
            if not prev_mark:
                parts.append("a")
            prev_mark = True
        else:
            assert isinstance(piece, str)
            parts.append(piece)
            prev_mark = False
    return "".join(parts)


def _longest_run(items: list[tuple[int, str, int, int, bool]]) -> str:
    """The longest run of literals not broken by a non-literal (zero-width items do not break)."""
    run: list[str] = []
    best = ""
    for kind, ch, _b, _a, _d in items:
        if kind == _LIT:
            run.append(ch)
        elif kind == _BREAK:
            joined = "".join(run)
            if len(joined) > len(best):
                best = joined
            run = []
    joined = "".join(run)
    return joined if len(joined) > len(best) else best


def _finish(parsed: _Parsed, caseless: bool) -> Translated:
    items = parsed.items
    skeleton = None if parsed.no_skeleton else _collapse(parsed.skel)
    anchored = ""
    split: int | None = None
    split_literal = ""
    required = ""
    secondary = ""
    if not parsed.opaque and not parsed.top_alternation:
        # anchored literal: ^ at the very start, then literals (zero-width items skipped)
        if items and items[0][0] == _ZERO and items[0][1] in ("^", "A"):
            lit: list[str] = []
            textual = True
            text_chars: list[str] = []
            split_at = 0
            lead_len = 0
            for kind, ch, _before, after, direct in items[1:]:
                if kind == _BREAK:
                    break
                lead_len += 1
                if kind == _LIT:
                    lit.append(ch)
                    if textual and direct:
                        text_chars.append(ch)
                        split_at = after
                    else:
                        textual = False
                else:
                    textual = False
            anchored = "".join(lit)
            if text_chars and items[0][2] == 0 and items[0][3] == 1:
                split = sum(len(piece) for piece in parsed.out[:split_at])
                split_literal = "".join(text_chars)
            if anchored:
                secondary = _longest_run(items[1 + lead_len:])
        required = _longest_run(items)
    return Translated(
        pattern="".join(parsed.out),
        skeleton=skeleton,
        group_names=parsed.names,
        anchored=anchored,
        split=split,
        split_literal=split_literal,
        required=required,
        secondary=secondary,
    )
