"""nginx configuration tokens, exactly as ``ngx_conf_read_token`` cuts them.

A map file is the body of an nginx ``map`` block: statements of whitespace
separated tokens ending in ``;``.  The rules reproduced here:

* whitespace is space, tab, CR and LF; ``#`` starts a comment only where a
  token could start (``/a#b`` is one token);
* a token starting with ``"`` or ``'`` runs to the matching unescaped quote
  and must be followed by whitespace, ``;``, ``{`` or ``)``;
* ``\\`` protects the next character from ending the token; ``${`` does not
  end a token either, any other ``{`` does;
* inside every token ``\\"`` ``\\'`` ``\\\\`` ``\\t`` ``\\r`` ``\\n`` are
  unescaped and any other backslash pair is kept as written.

The scan runs in one compiled regular expression so a 200,000-line map is
tokenised in well under a second.  Text is ``str`` holding one byte per
character (files are decoded as latin-1), as nginx compares bytes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from prexy.urlmap.errors import MapError

_TOKEN = re.compile(
    r"""
    (?P<ws>[ \t\r\n]+)
  | (?P<comment>\#[^\n]*)
  | (?P<semi>;)
  | (?P<lbrace>\{)
  | (?P<rbrace>\})
  | "(?P<dq>(?:[^"\\]|\\[\s\S])*)"
  | '(?P<sq>(?:[^'\\]|\\[\s\S])*)'
  | (?P<openquote>["'])
  | (?P<word>(?:\\[\s\S]|\$\{?|[^ \t\r\n;{\\$])+)
  | (?P<other>[\s\S])
    """,
    re.VERBOSE,
)

_WORD = r"(?:[^ \t\r\n;{}\"'#\\$]|\\[^\r\n]|\$\{?)(?:[^ \t\r\n;{\\$]++|\\[^\r\n]|\$\{?)*+"
# the common statement, "KEY VALUE;" on one line, in one step
_SIMPLE = re.compile(rf"([ \t\r\n]*)({_WORD})[ \t]+({_WORD})[ \t]*;")

_UNESCAPE = re.compile(r"""\\(["'\\tnr])""")
_UNESCAPED = {'"': '"', "'": "'", "\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_AFTER_QUOTE_OK = frozenset(" \t\r\n;{)")


def unescape(token: str) -> str:
    """Apply nginx's token unescaping: ``\\"`` ``\\'`` ``\\\\`` ``\\t`` ``\\r`` ``\\n``."""
    if "\\" not in token:
        return token
    return _UNESCAPE.sub(lambda m: _UNESCAPED[m.group(1)], token)


class Statement(NamedTuple):
    """One ``;``-terminated statement: its unescaped tokens and first line."""

    args: list[str]
    line: int


def statements(text: str, filename: str) -> Iterator[Statement]:
    """Yield the statements of one map file, raising :class:`MapError` on bad syntax."""
    args: list[str] = []
    first_line = 0
    line = 1
    pos = 0
    end = len(text)
    match = _TOKEN.match
    simple = _SIMPLE.match
    needs_unescape = _UNESCAPE.search
    while pos < end:
        if not args:
            s = simple(text, pos)
            while s is not None:
                ws, key, value = s.groups()
                line += ws.count("\n")
                if "\\" in key and needs_unescape(key):
                    key = unescape(key)
                if "\\" in value and needs_unescape(value):
                    value = unescape(value)
                yield Statement([key, value], line)
                pos = s.end()
                s = simple(text, pos)
            if pos >= end:
                break
        m = match(text, pos)
        assert m is not None  # the last alternative matches any character
        kind = m.lastgroup
        pos = m.end()
        if kind == "ws":
            line += m.group().count("\n")
            continue
        if kind == "word":
            tok = m.group()
            if not args:
                first_line = line
            if "\\" in tok:
                line += tok.count("\n")
                tok = unescape(tok)
            args.append(tok)
            continue
        if kind == "semi":
            if not args:
                raise MapError(filename, line, ";", "unexpected")
            yield Statement(args, first_line)
            args = []
            continue
        if kind == "dq" or kind == "sq":
            tok = m.group(kind)
            if not args:
                first_line = line
            line += tok.count("\n")
            if pos < end and text[pos] not in _AFTER_QUOTE_OK:
                raise MapError(filename, line, text[pos], "unexpected")
            args.append(unescape(tok))
            continue
        if kind == "comment":
            continue
        if kind == "openquote":
            raise MapError(
                filename, line + text.count("\n", pos), m.group(),
                'unexpected end of file, expecting ";" or "}"', "unbalanced quote",
            )
        if kind == "lbrace" or kind == "rbrace":
            raise MapError(filename, line, m.group(), "unexpected")
        # "other": a lone backslash at the very end of the file
        raise MapError(filename, line, m.group(), 'unexpected end of file, expecting ";" or "}"')
    if args:
        raise MapError(filename, line, " ".join(args), 'unexpected end of file, expecting ";" or "}"')
