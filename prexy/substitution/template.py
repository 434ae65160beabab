"""Replacement templates of ``replace_filter``: ``$& $N ${N} $$`` (and ``$0``).

A template is compiled once at load time into a tuple of parts: literal bytes
and group numbers.  As in the nginx module, a replacement that contains no
reference at all is used verbatim (so a lone ``$$`` stays ``$$``); once it
contains a reference, ``$$`` is a literal ``$``.  A backslash is not special.
``$0`` is Prexy's extension for the whole match.  Any other ``$name`` is a
request variable, which the module resolves at run time and Prexy does not
have yet, so it is refused at load time, as is a lone ``$`` or an unclosed
``${``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Template", "TemplateError", "compile_template"]

_NAME = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_DIGITS = frozenset(b"0123456789")


class TemplateError(ValueError):
    """A replacement template the loader refuses; ``pos`` is the byte offset."""

    def __init__(self, reason: str, pos: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.pos = pos


@dataclass(frozen=True)
class Template:
    """A compiled replacement: literal ``bytes`` parts and ``int`` group numbers."""

    source: bytes
    parts: tuple[bytes | int, ...]

    @property
    def is_literal(self) -> bool:
        """True when the replacement does not depend on the match."""
        return all(isinstance(p, bytes) for p in self.parts)

    @property
    def literal(self) -> bytes:
        """The replacement bytes when ``is_literal`` (else undefined)."""
        return b"".join(p for p in self.parts if isinstance(p, bytes))

    def expand(self, group: Callable[[int], bytes]) -> bytes:
        """Fill the template; ``group(n)`` returns group ``n`` (b"" if unset)."""
        return b"".join(p if isinstance(p, bytes) else group(p) for p in self.parts)


def _has_reference(src: bytes) -> bool:
    """Whether ``src`` holds anything but ``$$`` pairs as ``$`` sequences."""
    i = 0
    while True:
        i = src.find(b"$", i)
        if i < 0:
            return False
        if src[i + 1 : i + 2] == b"$":
            i += 2
            continue
        return True


def compile_template(src: bytes) -> Template:
    """Compile ``src``; raise TemplateError for what the module refuses."""
    if not _has_reference(src):
        return Template(src, (src,) if src else ())
    parts: list[bytes | int] = []
    literal = bytearray()
    i = 0
    n = len(src)
    while i < n:
        c = src[i]
        if c != 0x24:  # '$'
            literal.append(c)
            i += 1
            continue
        start = i
        i += 1
        if i == n:
            raise TemplateError("a lone '$' at the end of the replacement", start)
        if src[i] == 0x24:
            literal.append(0x24)
            i += 1
            continue
        bracket = src[i] == ord("{")
        if bracket:
            i += 1
            if i == n:
                raise TemplateError("unclosed '${'", start)
        name_start = i
        if src[i] == ord("&"):
            if bracket:
                # The module reads ``${&}`` as an unclosed bracket; so do we.
                raise TemplateError("'${&}' is not supported, write '$&'", start)
            group = 0
            i += 1
        elif src[i] in _DIGITS:
            j = i
            while j < n and src[j] in _DIGITS:
                j += 1
            group = int(src[i:j])
            i = j
        else:
            j = i
            while j < n and src[j] in _NAME:
                j += 1
            if j == i:
                raise TemplateError("'$' not followed by a group or variable name", start)
            name = src[i:j].decode("latin-1")
            raise TemplateError(f"unknown variable '${name}'", start)
        if bracket:
            if i < n and src[i] == ord("}"):
                i += 1
            else:
                raise TemplateError(
                    f"the closing bracket in '${{{src[name_start:i].decode('latin-1')}' is missing",
                    start,
                )
        if literal:
            parts.append(bytes(literal))
            literal.clear()
        parts.append(group)
    if literal:
        parts.append(bytes(literal))
    return Template(src, tuple(parts))
