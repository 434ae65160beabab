"""Reading map files into a :class:`~prexy.urlmap.index.UrlMap`.

Statements are handled as ``ngx_http_map`` handles them, in order:

* ``hostnames;`` switches wildcard keys on for the entries that follow (and
  the dropping of one trailing dot of looked-up keys); ``volatile;`` is
  accepted and ignored;
* ``include FILE;`` splices another file, relative to the including file;
  shell wildcards are expanded in sorted order; include cycles are errors;
* ``default VALUE;`` sets the default (twice is an error);
* ``~REGEX VALUE;`` / ``~*REGEX VALUE;`` add a regex (a bad regex is an error
  now, not at lookup time);
* anything else is an exact key (a leading ``\\`` is dropped, so
  ``\\default`` is the key ``default``); a key already present is an error,
  "conflicting parameter", as nginx refuses it too.

Files are read as bytes and decoded as latin-1: one character per byte, like
nginx.  Every error is a :class:`~prexy.urlmap.errors.MapError` with file and
line.
"""

from __future__ import annotations

import gc
import glob
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import regex

from prexy.urlmap.errors import MapError
from prexy.urlmap.index import REGEX_FLAGS, RegexEntry, SourceFile, UrlMap, source_digest
from prexy.urlmap.lexer import statements
from prexy.urlmap.pcre import (
    RegexSyntaxError,
    TailCache,
    ascii_lower,
    literal_text,
    split_prefix,
    translate,
)
from prexy.urlmap.values import Template, Value, ValueSyntaxError, compile_value

__all__ = ["load_map", "parse_map"]

_GLOB_CHARS = frozenset("*?[")
_UNSEEN: Any = object()
_FLAGS = int(REGEX_FLAGS)
_CASELESS_FLAGS = int(REGEX_FLAGS | regex.IGNORECASE)


def load_map(path: str | os.PathLike[str], files: Any = None) -> UrlMap:
    """Read the map file at ``path`` (and what it includes) into a :class:`UrlMap`.

    ``files`` reads them when given (``prexy.files.IFiles``: ``read``,
    ``status`` with an ``mtime``, ``glob``), else the file system."""
    filename = os.fspath(path)
    with _gc_paused():
        builder = _Builder(files)
        builder.read_file(filename, filename, 0)
        return builder.build()


def parse_map(text: str, filename: str = "<map>", base_dir: str | None = None) -> UrlMap:
    """Build a :class:`UrlMap` from map text; includes resolve against
    ``base_dir`` (default: the directory of ``filename``)."""
    if base_dir is None:
        base_dir = os.path.dirname(filename)
    with _gc_paused():
        builder = _Builder()
        builder.parse_text(text, filename, base_dir)
        return builder.build()


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a map is built.

    A load allocates hundreds of thousands of objects that all stay alive
    and form no cycles; collections in between only rescan them (about 15%
    of the load time for 200,000 entries).  The collector is restored as
    it was, even if the load fails.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Builder:
    """Accumulates entries in file order, with nginx's conflict rules."""

    def __init__(self, files: Any = None) -> None:
        self.files = files
        self.hostnames = False
        self.default: Value | None = None
        self.exact: dict[str, Value] = {}
        self.head_dot: dict[str, Value] = {}
        self.head_star: dict[str, Value] = {}
        self.tail: dict[str, Value] = {}
        self.regexes: list[RegexEntry] = []
        self.index_keys: list[tuple[str, str]] = []
        self.sources: list[SourceFile] = []
        self.values: dict[str, Value] = {}
        self.skeletons: dict[tuple[str, bool], str] = {}  # skeleton -> "" or error
        self.rests: dict[tuple[str, bool], Any] = {}
        self.tail_cache: TailCache = {}
        # per (tail, caseless): what every "^literal" + tail regex shares, or
        # None when such regexes take the general path
        self.shapes: dict[tuple[str, bool, bool], tuple[Any, str, str, str] | None] = {}
        self.captures: set[str] = set()
        self.variables: set[str] = set()
        self.stack: list[str] = []

    # -- files ----------------------------------------------------------------

    def read_file(self, path: str, where: str, line: int) -> None:
        """Read one file (included from ``where``:``line``), refusing include cycles."""
        real = os.path.realpath(path)
        if real in self.stack:
            chain = " -> ".join([*self.stack[self.stack.index(real):], real])
            raise MapError(where, line, path, "include cycle", chain)
        try:
            if self.files is None:
                with open(path, "rb") as f:
                    data = f.read()
                    mtime = os.fstat(f.fileno()).st_mtime_ns / 1e9  # as prexy.files.FileStatus.mtime
            else:
                status = self.files.status(path)
                data = self.files.read(path)
                mtime = status.mtime if status is not None else 0.0
        except OSError as exc:
            raise MapError(where, line, path, "cannot open", exc.strerror or str(exc)) from None
        self.sources.append(SourceFile(path, mtime, hashlib.sha256(data).digest()))
        self.stack.append(real)
        try:
            self.parse_text(data.decode("latin-1"), path, os.path.dirname(path))
        finally:
            self.stack.pop()

    def parse_text(self, text: str, filename: str, base_dir: str) -> None:
        """Apply every statement of one file's text."""
        for args, line in statements(text, filename):
            self.statement(args, line, filename, base_dir)

    # -- statements -----------------------------------------------------------

    def statement(self, args: list[str], line: int, filename: str, base_dir: str) -> None:
        """Apply one statement, as ``ngx_http_map`` does."""
        if len(args) == 1 and args[0] == "hostnames":
            self.hostnames = True
            return
        if len(args) == 1 and args[0] == "volatile":
            return
        if len(args) != 2:
            raise MapError(filename, line, " ".join(args), "invalid number of the map parameters")
        key, text = args
        if key == "include":
            self.include(text, filename, line, base_dir)
            return
        value = self.values.get(text)
        if value is None:
            value = self.new_value(text, filename, line)
        if key == "default":
            if self.default is not None:
                raise MapError(filename, line, key, "duplicate default map parameter")
            self.default = value
            return
        if key.startswith("~"):
            self.add_regex(key, value, filename, line)
            return
        if key.startswith("\\"):
            key = key[1:]
        self.add_key(key, value, filename, line)

    def new_value(self, text: str, filename: str, line: int) -> Value:
        """Compile a value not seen before (values are shared by text)."""
        try:
            value = compile_value(text)
        except ValueSyntaxError as exc:
            raise MapError(filename, line, text, str(exc)) from None
        if isinstance(value, Template):
            self.variables.update(value.variables)
        self.values[text] = value
        return value

    def include(self, name: str, filename: str, line: int, base_dir: str) -> None:
        """Splice the named file(s), relative to the including file."""
        path = os.path.join(base_dir, name)
        if _GLOB_CHARS.intersection(name):
            # the directory's entries change when matching files come or go
            directory = os.path.dirname(path) or "."
            if self.files is None:
                try:
                    self.sources.append(SourceFile(directory, os.stat(directory).st_mtime, source_digest(directory)))
                except OSError:
                    pass
                found = sorted(glob.glob(path))
            else:
                status = self.files.status(directory)
                if status is not None:
                    self.sources.append(SourceFile(directory, status.mtime, source_digest(directory, self.files)))
                found = self.files.glob(path)
            for each in found:
                self.read_file(each, filename, line)
            return
        self.read_file(path, filename, line)

    def add_key(self, key: str, value: Value, filename: str, line: int) -> None:
        """``ngx_hash_add_key``: exact keys, and with ``hostnames`` the wildcards."""
        if self.hostnames:
            stars = key.count("*")
            if stars > 1 or ".." in key or "\0" in key:
                raise MapError(filename, line, key, "invalid hostname or wildcard")
            if len(key) > 1 and key[0] == ".":
                base = ascii_lower(key[1:])
                # ".example.com" also claims the exact name "example.com"
                if base in self.exact or base in self.head_dot or base in self.head_star:
                    raise MapError(filename, line, key, "conflicting parameter")
                self.head_dot[base] = value
                return
            if len(key) > 2 and key.startswith("*."):
                base = ascii_lower(key[2:])
                # "*.example.com" and ".example.com" share nginx's name "example.com"
                if base in self.head_star or base in self.head_dot:
                    raise MapError(filename, line, key, "conflicting parameter")
                self.head_star[base] = value
                return
            if len(key) > 2 and key.endswith(".*"):
                base = ascii_lower(key[:-2])
                if base in self.tail:
                    raise MapError(filename, line, key, "conflicting parameter")
                self.tail[base] = value
                return
            if stars:
                raise MapError(filename, line, key, "invalid hostname or wildcard")
        low = ascii_lower(key)
        if low in self.exact or low in self.head_dot:
            raise MapError(filename, line, key, "conflicting parameter")
        self.exact[low] = value

    def add_regex(self, source: str, value: Value, filename: str, line: int) -> None:
        """Add a ``~``/``~*`` entry: translate, validate now, share compiled rests."""
        caseless = source.startswith("~*")
        pattern = source[2:] if caseless else source[1:]
        if pattern.startswith("(?i)"):
            # a leading (?i) is the caseless option for the whole pattern
            caseless = True
            pattern = pattern[4:]
        split = split_prefix(pattern)
        shape: tuple[str, bool, bool] | None = None
        if split is not None:
            anchored, lit_src, tail = split
            shape = (tail, caseless, anchored)
            known = self.shapes.get(shape, _UNSEEN)
            if known is not None and known is not _UNSEEN:
                # seen this tail before: validated, translated, rest compiled
                rest, lead, lead_text, best_rest = known
                literal = literal_text(lit_src)
                if caseless:
                    literal = ascii_lower(literal)
                self.regexes.append(RegexEntry(
                    source, filename, line, caseless, value, None, rest,
                    literal + lead_text if lead_text else literal, not anchored,
                ))
                leading = literal + lead if lead else literal
                if anchored:
                    self.index_keys.append((leading, best_rest))
                else:
                    self.index_keys.append(("", leading if len(leading) >= len(best_rest) else best_rest))
                return
        try:
            tr = translate(pattern, caseless, self.tail_cache)
        except RegexSyntaxError as exc:
            raise MapError(filename, line, source, "invalid regex", str(exc)) from None
        flags = _CASELESS_FLAGS if caseless else _FLAGS
        self.validate(tr.pattern, tr.skeleton, flags, caseless, source, filename, line)
        self.captures.update(tr.group_names)
        rest = None
        literal = ""
        if tr.split is not None:
            rest_text = tr.pattern[tr.split:]
            rest_key = (rest_text, caseless)
            rest = self.rests.get(rest_key)
            if rest is None:
                try:
                    rest = regex.compile(rest_text, flags)
                except regex.error:
                    rest = False  # the rest alone is not a pattern: no sharing
                self.rests[rest_key] = rest
            if rest is False:
                rest = None
            else:
                # share the string object with the prefix index key when equal
                literal = tr.anchored if tr.anchored == tr.split_literal else tr.split_literal
        if shape is not None and shape not in self.shapes:
            facts = self.tail_cache.get((shape[0], shape[1]))
            usable = rest is not None and facts is not None and facts.analysed
            self.shapes[shape] = (
                (rest, facts.lead, facts.lead_text, facts.best_rest)
                if usable and facts is not None else None
            )
        self.regexes.append(RegexEntry(
            source, filename, line, caseless, value,
            None if rest is not None else tr.pattern, rest, literal, tr.floating,
        ))
        self.index_keys.append((tr.anchored, tr.secondary if tr.anchored else tr.required))

    def validate(
        self, pattern: str, skeleton: str | None, flags: int, caseless: bool,
        source: str, filename: str, line: int,
    ) -> None:
        """Fail now if the pattern does not compile; shapes seen before are free."""
        if skeleton is not None:
            known = self.skeletons.get((skeleton, caseless))
            if known == "":
                return
            if known is None:
                try:
                    regex.compile(skeleton, flags)
                except regex.error:
                    pass  # the real pattern below gives the real message
                else:
                    self.skeletons[(skeleton, caseless)] = ""
                    return
        try:
            regex.compile(pattern, flags)
        except regex.error as exc:
            raise MapError(filename, line, source, "invalid regex", _engine_message(exc)) from None

    def build(self) -> UrlMap:
        """Freeze what was read into a :class:`UrlMap`."""
        default: Value = self.default if self.default is not None else ""
        return UrlMap(
            exact=self.exact,
            head_dot=self.head_dot,
            head_star=self.head_star,
            tail=self.tail,
            regexes=self.regexes,
            index_keys=self.index_keys,
            hostnames=self.hostnames,
            default=default,
            source_files=self.sources,
            captures=frozenset(self.captures),
            variables=frozenset(self.variables - self.captures),
        )


def _engine_message(exc: regex.error) -> str:
    msg = getattr(exc, "msg", None) or str(exc)
    return str(msg)
