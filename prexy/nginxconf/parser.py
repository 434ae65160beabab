"""nginx's configuration syntax: text to a tree of directives, and back.

The lexer is nginx's own (``ngx_conf_read_token`` in
``src/core/ngx_conf_file.c``), rule for rule, so that a file nginx accepts
gives the same tokens here and a file nginx refuses is refused with nginx's
reason, file and line:

- tokens are separated by spaces, tabs, CR and LF; ``;`` ends a directive,
  ``{`` opens its block, ``}`` closes the block;
- ``#`` at the start of a token comments to the end of the line;
- ``"..."`` and ``'...'`` are strings (the closing quote must be followed by
  a space, ``;``, ``{`` or ``)``); a backslash keeps the next character from
  ending the token, and ``\\"``, ``\\'``, ``\\\\``, ``\\t``, ``\\r``, ``\\n``
  are resolved (any other backslash is kept as written);
- ``{`` right after ``$`` belongs to the token (``${host}``); any other ``{``
  ends it and opens a block, so a regex such as ``~^/a{2}$`` must be quoted,
  in nginx as here;
- a ``)`` right after a closing quote starts a token of its own
  (``if ($a = "b")`` is ``($a``, ``=``, ``b``, ``)``), as ``if`` expects.

Variables are kept as text (``$host``).  ``include`` is followed by
:func:`load`, not by :func:`parse`.  The block of an OpenResty
``*_by_lua_block`` directive is Lua, not nginx syntax: it is refused with an
error that names the directive.
"""

from __future__ import annotations

import errno
import glob
import os
import re
from collections.abc import Iterable

import attrs

__all__ = ["Directive", "NginxConfigError", "dump", "load", "parse"]

# nginx reads a file through a 4096-byte buffer; a token that does not fit is refused.
_BUFFER = 4096
_SPACE = " \t\r\n"
_GLOB_CHARS = "*?["


@attrs.frozen
class Directive:
    """One directive: ``name args...;`` (``block`` is None) or
    ``name args... { ... }`` (``block`` is the tuple of the directives inside)."""

    name: str
    args: tuple[str, ...]
    block: tuple[Directive, ...] | None
    file: str
    line: int


class NginxConfigError(Exception):
    """A configuration nginx would refuse; ``str()`` reads as nginx's own message,
    ``REASON in FILE:LINE``."""

    def __init__(self, reason: str, file: str, line: int) -> None:
        super().__init__(reason, file, line)
        self.reason = reason
        self.file = file
        self.line = line

    def __str__(self) -> str:
        # line 0: the main file itself could not be read, which nginx says with no place
        if self.line == 0:
            return self.reason
        return f"{self.reason} in {self.file}:{self.line}"


# -- the lexer --------------------------------------------------------------

_OK, _BLOCK_START, _BLOCK_DONE, _FILE_DONE = range(4)


def _unescape(raw: str) -> str:
    """nginx's copy of a token: ``\\"`` ``\\'`` ``\\\\`` give the character,
    ``\\t`` ``\\r`` ``\\n`` the control character, any other backslash stays."""
    if "\\" not in raw:
        return raw
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        ch = raw[i]
        if ch == "\\" and i + 1 < n:
            nxt = raw[i + 1]
            if nxt in "\"'\\":
                out.append(nxt)
                i += 2
                continue
            if nxt in "trn":
                out.append({"t": "\t", "r": "\r", "n": "\n"}[nxt])
                i += 2
                continue
        out.append(ch)
        i += 1
    return "".join(out)


class _Lexer:
    """``ngx_conf_read_token``: each call to :meth:`statement` reads the tokens
    of one directive head and says how it ended."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self.pos = 0
        self.line = 1

    def error(self, reason: str, line: int | None = None) -> NginxConfigError:
        return NginxConfigError(reason, self.file, self.line if line is None else line)

    def statement(self) -> tuple[int, list[str], int]:
        """Returns (how it ended, the tokens, the line of the first token)."""
        text, n = self.text, len(self.text)
        args: list[str] = []
        first_line = self.line
        last_space = True
        need_space = False
        sharp_comment = False
        quoted = False
        d_quoted = False
        s_quoted = False
        variable = False
        start = 0
        start_line = self.line
        size = 0  # bytes of the token so far, for nginx's buffer limit
        pos = self.pos
        while True:
            if pos >= n:
                self.pos = pos
                if args or not last_space:
                    raise self.error('unexpected end of file, expecting ";" or "}"')
                return _FILE_DONE, args, first_line
            if not last_space:
                size += 1 if text[pos] < "\x80" else len(text[pos].encode("utf-8"))
                if size > _BUFFER:
                    self.pos = pos
                    if d_quoted or s_quoted:
                        q = '"' if d_quoted else "'"
                        raise self.error(
                            f'too long parameter, probably missing terminating "{q}" character',
                            start_line)
                    shown = text[start:start + 10]
                    raise self.error(f'too long parameter "{shown}..." started', start_line)
            ch = text[pos]
            pos += 1
            if ch == "\n":
                self.line += 1
                if sharp_comment:
                    sharp_comment = False
            if sharp_comment:
                continue
            if quoted:
                quoted = False
                continue
            if need_space:
                if ch in _SPACE:
                    last_space = True
                    need_space = False
                    continue
                if ch == ";":
                    self.pos = pos
                    return _OK, args, first_line
                if ch == "{":
                    self.pos = pos
                    return _BLOCK_START, args, first_line
                if ch == ")":
                    last_space = True
                    need_space = False
                else:
                    self.pos = pos
                    raise self.error(f'unexpected "{ch}"')
            if last_space:
                start = pos - 1
                start_line = self.line
                size = 1 if ch < "\x80" else len(ch.encode("utf-8"))
                if ch in _SPACE:
                    continue
                if not args:
                    first_line = self.line
                if ch in ";{":
                    self.pos = pos
                    if not args:
                        raise self.error(f'unexpected "{ch}"')
                    return (_BLOCK_START if ch == "{" else _OK), args, first_line
                if ch == "}":
                    self.pos = pos
                    if args:
                        raise self.error('unexpected "}"')
                    return _BLOCK_DONE, args, first_line
                if ch == "#":
                    sharp_comment = True
                    continue
                last_space = False
                if ch == "\\":
                    quoted = True
                elif ch == '"':
                    start += 1
                    d_quoted = True
                elif ch == "'":
                    start += 1
                    s_quoted = True
                elif ch == "$":
                    variable = True
                continue
            if ch == "{" and variable:
                continue
            variable = False
            if ch == "\\":
                quoted = True
                continue
            if ch == "$":
                variable = True
                continue
            found = False
            if d_quoted:
                if ch == '"':
                    d_quoted = False
                    need_space = True
                    found = True
            elif s_quoted:
                if ch == "'":
                    s_quoted = False
                    need_space = True
                    found = True
            elif ch in _SPACE or ch in ";{":
                last_space = True
                found = True
            if found:
                args.append(_unescape(text[start:pos - 1]))
                if ch == ";":
                    self.pos = pos
                    return _OK, args, first_line
                if ch == "{":
                    self.pos = pos
                    return _BLOCK_START, args, first_line


def _is_lua_block(name: str) -> bool:
    """OpenResty's content_by_lua_block, set_by_lua_block, ... whose blocks are Lua."""
    return name.endswith("_by_lua_block")


def _parse_block(lexer: _Lexer, inside: bool,
                 ends: dict[int, int] | None = None) -> tuple[Directive, ...]:
    """The directives up to the end of the file (or of the block when ``inside``);
    ``ends`` gets, for each ``include``, the line its ``;`` is on, where nginx
    reports the errors of an include."""
    out: list[Directive] = []
    while True:
        how, args, line = lexer.statement()
        if how == _FILE_DONE:
            if inside:
                raise lexer.error('unexpected end of file, expecting "}"')
            return tuple(out)
        if how == _BLOCK_DONE:
            if not inside:
                raise lexer.error('unexpected "}"')
            return tuple(out)
        name, rest = args[0], tuple(args[1:])
        if how == _OK:
            d = Directive(name, rest, None, lexer.file, line)
            if ends is not None and name == "include":
                ends[id(d)] = lexer.line
            out.append(d)
            continue
        if _is_lua_block(name):
            raise lexer.error(
                f'"{name}" is not supported: its block is Lua code, not nginx '
                "configuration (move the Lua code to a file and use the *_by_lua_file form)",
                line)
        opened = lexer.line
        block = _parse_block(lexer, True, ends)
        d = Directive(name, rest, block, lexer.file, line)
        if ends is not None and name == "include":
            ends[id(d)] = opened
        out.append(d)


def parse(text: str, file: str) -> tuple[Directive, ...]:
    """The directives of one configuration file's ``text`` (``include`` left as
    a directive); ``file`` is the name errors and directives carry.

    Raises :class:`NginxConfigError` where nginx would refuse the syntax."""
    return _parse_block(_Lexer(text, file), False)


# -- include ----------------------------------------------------------------

def _read(path: str, at: Directive | None, at_line: int) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        # nginx's words: open() fails on a missing file, pread() on a directory
        err = e.errno or 0
        step = "pread" if err == errno.EISDIR else "open"
        reason = f'{step}() "{path}" failed ({err}: {os.strerror(err)})'
        if at is None:
            raise NginxConfigError(reason, path, 0) from e
        raise NginxConfigError(reason, at.file, at_line) from e
    # nginx reads bytes; latin-1 keeps any byte as one character where the text is not UTF-8
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def load(path: str, prefix: str | None = None) -> tuple[Directive, ...]:
    """The file's directives with every ``include`` replaced by the directives of
    the files it names (globs expanded and sorted as nginx's ``glob()`` does;
    relative names resolved against ``prefix``, by default the main file's
    directory, as nginx resolves them against its configuration prefix).

    An include that matches nothing is allowed when it has a glob character
    (``*?[``) and refused otherwise, with nginx's ``open() ... failed`` message;
    an include loop is refused.  Each directive keeps the file and line it is
    written in."""
    main = os.path.abspath(path)
    base = os.path.abspath(prefix) if prefix is not None else os.path.dirname(main)
    return _load_file(main, base, (), None, 0)


def _load_file(path: str, base: str, chain: tuple[str, ...], at: Directive | None,
               at_line: int) -> tuple[Directive, ...]:
    """``path``'s directives, includes expanded; ``chain`` holds the files being
    read, outermost first (as written, to name them, and their real paths, to
    recognise one reached under another name)."""
    real = os.path.realpath(path)
    reals = [os.path.realpath(p) for p in chain]
    if real in reals:
        assert at is not None
        loop = " -> ".join(f'"{p}"' for p in (*chain[reals.index(real):], path))
        raise NginxConfigError(f"include loop: {loop}", at.file, at_line)
    ends: dict[int, int] = {}
    directives = _parse_block(_Lexer(_read(path, at, at_line), path), False, ends)
    return _expand(directives, base, (*chain, path), ends)


def _expand(directives: Iterable[Directive], base: str, chain: tuple[str, ...],
            ends: dict[int, int]) -> tuple[Directive, ...]:
    out: list[Directive] = []
    for d in directives:
        if d.name != "include":
            if d.block is not None:
                d = attrs.evolve(d, block=_expand(d.block, base, chain, ends))
            out.append(d)
            continue
        end = ends.get(id(d), d.line)
        if d.block is not None:
            raise NginxConfigError('directive "include" is not terminated by ";"', d.file, end)
        if len(d.args) != 1:
            raise NginxConfigError('invalid number of arguments in "include" directive',
                                   d.file, end)
        name = d.args[0]
        # nginx joins the prefix and the name as they are (no normalising), and so
        # do its messages
        full = name if os.path.isabs(name) else os.path.join(base, name)
        if not any(c in name for c in _GLOB_CHARS):
            out.extend(_load_file(full, base, chain, d, end))
            continue
        # glob() in the C locale with no flags: sorted bytewise, dot files not matched by *
        for match in sorted(glob.glob(full), key=lambda p: os.fsencode(p)):
            out.extend(_load_file(match, base, chain, d, end))
    return tuple(out)


# -- back to text -----------------------------------------------------------

_BARE = re.compile(r"[^\s;{}#\"'\\]+")


def _quote(word: str) -> str:
    """``word`` as a token that reads back as ``word``: bare when it can be,
    otherwise in double quotes with nginx's escapes."""
    if _BARE.fullmatch(word):
        return word
    escaped = (word.replace("\\", "\\\\").replace('"', '\\"')
               .replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


def dump(directives: Iterable[Directive], indent: str = "    ") -> str:
    """nginx configuration text for ``directives``, one directive a line (a block's
    ``}`` on a line of its own); ``parse(dump(x), f)`` gives back the same names,
    arguments and blocks."""
    lines: list[str] = []

    def emit(ds: Iterable[Directive], depth: int) -> None:
        pad = indent * depth
        for d in ds:
            head = " ".join(_quote(w) for w in (d.name, *d.args))
            if d.block is None:
                lines.append(f"{pad}{head};")
            else:
                lines.append(f"{pad}{head} {{")
                emit(d.block, depth + 1)
                lines.append(f"{pad}}}")

    emit(directives, 0)
    return "".join(line + "\n" for line in lines)

