"""Byte classes: what ``^``, ``\\b`` and ``\\B`` ask of the byte before.

The module's engine keeps, across a restart after a match, only the class
of one byte (see the restart rule in :mod:`~prexy.substitution.transducer`):
a newline, a word byte (ASCII letter, digit or ``_``), or anything else.
Both the compiled rule set (which class every match of rule 0 ends with)
and the transducer (which class a restart sees) read this one table.
"""

from __future__ import annotations

__all__ = ["CLASS", "NEWLINE", "NONE", "WORD", "byte_class"]

NONE, NEWLINE, WORD = 0, 1, 2

#: The class of every byte value, indexed by the byte.
CLASS = bytes(
    NEWLINE if b == 0x0A else WORD if (chr(b).isascii() and (chr(b).isalnum() or b == 0x5F)) else NONE
    for b in range(256)
)


def byte_class(b: int) -> int:
    """The class of one byte for the restart rule."""
    return CLASS[b]
