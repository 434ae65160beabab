"""Rules files: nginx ``replace_filter*`` directives read as nginx reads them.

The same files take nginx's ``proxy_redirect``, ``proxy_cookie_domain`` and
``proxy_cookie_path`` and Prexy's ``replace_filter_headers``
(``prexy.headerrules``); they end up in the rule set's ``headers``.

A rules file is a list of directives, each ended by ``;``::

    replace_filter 'www\\.example\\.com' 'www.example.nl' g;
    replace_filter_types text/html text/css;
    replace_filter_max_buffered_size 8k;
    replace_filter_last_modified keep;

Tokens follow nginx's ``ngx_conf_read_token``: bare, or quoted with ``'`` or
``"``; inside a token ``\\"`` ``\\'`` ``\\\\`` ``\\t`` ``\\r`` ``\\n`` become the
character itself and every other backslash pair is kept as it is (so ``\\d``
reaches the regex engine untouched); ``#`` outside a token starts a comment.

Every problem is a :class:`RulesError` naming the file, line and column and
the offending text, raised at load time so that no bad rule reaches a
response.  :func:`parse_rules` and :func:`load_rules` return a compiled
:class:`~prexy.substitution.ruleset.RuleSet`.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from prexy.headerrules import HeaderRulesBuilder, HeaderRulesConflict
from prexy.substitution.dialect import DeferredRegex, DialectError, parse_sregex
from prexy.substitution.template import TemplateError, compile_template

if TYPE_CHECKING:
    from prexy.substitution.ruleset import Rule, RuleSet

__all__ = [
    "FlagError",
    "RulesError",
    "Token",
    "clear_rules_cache",
    "compile_rule",
    "load_rules",
    "parse_rules",
    "parse_size",
    "tokenize",
]


class RulesError(ValueError):
    """A rules file the loader refuses.

    ``str()`` reads ``file:line:column: reason``; the attributes ``filename``,
    ``line``, ``column`` (both 1-based), ``text`` (the offending text) and
    ``reason`` are there for callers that format errors themselves.
    """

    def __init__(self, filename: str, line: int, column: int, text: str, reason: str) -> None:
        super().__init__(f"{filename}:{line}:{column}: {reason}")
        self.filename = filename
        self.line = line
        self.column = column
        self.text = text
        self.reason = reason


@dataclass(frozen=True)
class Token:
    """One unescaped token with where it started (1-based line and column)."""

    value: bytes
    line: int
    column: int
    quoted: bool
    raw: bytes

    def column_of(self, offset: int) -> int:
        """The column of byte ``offset`` of the unescaped value (same line)."""
        raw_offset = _raw_offset(self.raw, offset)
        return self.column + (1 if self.quoted else 0) + raw_offset


_UNESCAPE = {
    ord('"'): b'"',
    ord("'"): b"'",
    ord("\\"): b"\\",
    ord("t"): b"\t",
    ord("r"): b"\r",
    ord("n"): b"\n",
}
_SPACE = b" \t\r\n"


def _raw_offset(raw: bytes, offset: int) -> int:
    """Where byte ``offset`` of ``_unescape(raw)`` came from in ``raw``."""
    i = 0
    k = 0
    n = len(raw)
    while i < n and k < offset:
        i += 2 if raw[i] == 0x5C and i + 1 < n and raw[i + 1] in _UNESCAPE else 1
        k += 1
    return i


def _unescape(raw: bytes) -> bytes:
    out = bytearray()
    i = 0
    n = len(raw)
    while i < n:
        c = raw[i]
        if c == 0x5C and i + 1 < n and raw[i + 1] in _UNESCAPE:
            out += _UNESCAPE[raw[i + 1]]
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def tokenize(text: bytes, filename: str) -> Iterator[list[Token]]:
    """Yield the directives of ``text``, each as its list of tokens."""
    i = 0
    n = len(text)
    line = 1
    line_start = 0
    current: list[Token] = []

    def err(at: int, at_line: int, at_start: int, snippet: bytes, reason: str) -> RulesError:
        return RulesError(filename, at_line, at - at_start + 1, snippet.decode("latin-1"), reason)

    while i < n:
        c = text[i]
        if c == 0x0A:
            line += 1
            line_start = i + 1
            i += 1
            continue
        if c in _SPACE:
            i += 1
            continue
        if c == ord("#"):
            while i < n and text[i] != 0x0A:
                i += 1
            continue
        if c == ord(";"):
            if not current:
                raise err(i, line, line_start, b";", "unexpected ';'")
            yield current
            current = []
            i += 1
            continue
        if c in (ord("{"), ord("}")):
            raise err(
                i, line, line_start, bytes([c]), f"unexpected '{chr(c)}': blocks are not allowed"
            )
        start, tok_line, tok_start = i, line, line_start
        if c in (ord('"'), ord("'")):
            quote = c
            i += 1
            while True:
                if i >= n:
                    raise err(
                        start,
                        tok_line,
                        tok_start,
                        text[start:i][:40],
                        "unexpected end of file, expecting closing quote",
                    )
                ch = text[i]
                if ch == 0x5C and i + 1 < n:
                    if text[i + 1] == 0x0A:
                        line += 1
                        line_start = i + 2
                    i += 2
                    continue
                if ch == 0x0A:
                    line += 1
                    line_start = i + 1
                if ch == quote:
                    break
                i += 1
            raw = text[start + 1 : i]
            i += 1
            if i < n and text[i] not in _SPACE and text[i] not in b";{}":
                raise err(
                    i,
                    line,
                    line_start,
                    text[i : i + 1],
                    f"unexpected '{chr(text[i])}' after a quoted token",
                )
            current.append(Token(_unescape(raw), tok_line, start - tok_start + 1, True, raw))
            continue
        # A bare token ends at white space, ';' or '{' (unless the '{' follows
        # a '$', as in ${1}); quotes and '}' inside it are ordinary bytes.
        while i < n:
            ch = text[i]
            if ch == 0x5C and i + 1 < n:
                i += 2
                continue
            if ch in _SPACE or ch == ord(";"):
                break
            if ch == ord("{") and not (i > start and text[i - 1] == ord("$")):
                break
            i += 1
        raw = text[start:i]
        current.append(Token(_unescape(raw), tok_line, start - tok_start + 1, False, raw))
    if current:
        last = current[0]
        raise RulesError(
            filename,
            last.line,
            last.column,
            last.value.decode("latin-1"),
            "unexpected end of file, expecting ';'",
        )


_SIZE_UNITS = {b"": 1, b"k": 1024, b"K": 1024, b"m": 1024 * 1024, b"M": 1024 * 1024}


def parse_size(value: bytes) -> int | None:
    """Parse an nginx size (``8192``, ``8k``, ``1m``); None if invalid."""
    unit = value[-1:] if value[-1:] in (b"k", b"K", b"m", b"M") else b""
    digits = value[: len(value) - len(unit)]
    if not digits or not digits.isdigit():
        return None
    return int(digits) * _SIZE_UNITS[unit]


class FlagError(ValueError):
    """A ``replace_filter`` flag other than ``g`` and ``i``."""


def compile_rule(
    pattern: bytes,
    replacement: bytes,
    flags: bytes | str = b"",
    *,
    origin: str = "",
    checked: bool = False,
) -> Rule:
    """Compile one ``replace_filter PATTERN REPLACEMENT FLAGS`` directive.

    Raises FlagError, DialectError or TemplateError; :func:`parse_rules`
    turns them into RulesError.  Every pattern of the dialect is accepted:
    those ``regex`` cannot run in bounded time run on RE2 (see
    :mod:`.linear`).
    """
    from prexy.substitution.ruleset import Rule

    if isinstance(flags, str):
        flags = flags.encode("latin-1")
    caseless = False
    once = True
    for ch in flags:
        if ch == ord("i"):
            caseless = True
        elif ch == ord("g"):
            once = False
        else:
            raise FlagError(f"unknown flag '{chr(ch)}' in \"{flags.decode('latin-1')}\"")
    parsed = DeferredRegex(pattern, caseless) if checked else parse_sregex(pattern, caseless)
    template = compile_template(replacement)
    return Rule(
        pattern=pattern,
        replacement=replacement,
        caseless=caseless,
        once=once,
        parsed=parsed,
        template=template,
        origin=origin,
    )


def parse_rules(
    text: bytes | str, filename: str = "<rules>", *, lazy: bool = False, checked: bool = False
) -> RuleSet:
    """Parse and compile the rules file ``text``; raise RulesError if refused.
    The rule set is warmed (``transducer.warm``) before it is returned;
    with ``lazy`` it is parsed and checked only, its scanner compiled on
    first use (``RuleSet.build``).  ``checked``: these bytes were parsed and
    checked already (by a worker's master), so each pattern is parsed again
    only when the scanner is built (``DeferredRegex``)."""
    from prexy.substitution.ruleset import RuleSet
    from prexy.substitution.transducer import warm

    if isinstance(text, str):
        text = text.encode("utf-8")
    rules: list[Rule] = []
    types: list[str] = []
    max_buffered: int | None = None
    keep: bool | None = None
    headers = HeaderRulesBuilder()
    for tokens in tokenize(text, filename):
        name_tok = tokens[0]
        name = name_tok.value
        args = tokens[1:]

        def fail(tok: Token, reason: str) -> RulesError:
            return RulesError(filename, tok.line, tok.column, tok.value.decode("latin-1"), reason)

        if name == b"replace_filter":
            if len(args) not in (2, 3):
                raise fail(
                    name_tok,
                    f'invalid number of arguments in "replace_filter" '
                    f"(expected 2 or 3, got {len(args)})",
                )
            pat_tok, rep_tok = args[0], args[1]
            flags = args[2].value if len(args) == 3 else b""
            try:
                rules.append(
                    compile_rule(
                        pat_tok.value,
                        rep_tok.value,
                        flags,
                        origin=f"{filename}:{name_tok.line}",
                        checked=checked,
                    )
                )
            except FlagError as exc:
                raise fail(args[2], str(exc)) from None
            except DialectError as exc:
                col = pat_tok.column_of(exc.pos)
                raise RulesError(
                    filename,
                    pat_tok.line,
                    col,
                    pat_tok.value.decode("latin-1"),
                    f'bad regex "{pat_tok.value.decode("latin-1")}": '
                    f"{exc.reason} at offset {exc.pos}",
                ) from None
            except TemplateError as exc:
                col = rep_tok.column_of(exc.pos)
                raise RulesError(
                    filename,
                    rep_tok.line,
                    col,
                    rep_tok.value.decode("latin-1"),
                    f'bad replacement "{rep_tok.value.decode("latin-1")}": {exc.reason}',
                ) from None
        elif name == b"replace_filter_types":
            if not args:
                raise fail(name_tok, 'invalid number of arguments in "replace_filter_types"')
            for tok in args:
                value = tok.value.decode("latin-1").strip().lower()
                if not value or (value != "*" and "/" not in value):
                    raise fail(tok, f'invalid media type "{tok.value.decode("latin-1")}"')
                types.append(value)
        elif name == b"replace_filter_max_buffered_size":
            if len(args) != 1:
                raise fail(
                    name_tok, 'invalid number of arguments in "replace_filter_max_buffered_size"'
                )
            size = parse_size(args[0].value)
            if size is None:
                raise fail(args[0], f'invalid size "{args[0].value.decode("latin-1")}"')
            max_buffered = size
        elif name == b"replace_filter_last_modified":
            if len(args) != 1 or args[0].value not in (b"keep", b"clear"):
                tok = args[0] if args else name_tok
                raise fail(tok, 'replace_filter_last_modified takes "keep" or "clear"')
            keep = args[0].value == b"keep"
        elif not headers.directive(name_tok, args, fail):
            raise fail(name_tok, f'unknown directive "{name.decode("latin-1")}"')
    header_rules = headers.build()
    built = RuleSet.build(
        rules, types=types, max_buffered_size=max_buffered, keep_last_modified=keep, headers=header_rules,
        lazy=lazy,
    )
    return built if lazy else warm(built)


#: How many compiled rule sets :func:`load_rules` keeps (least recently used go).
RULES_CACHE_SIZE = 32

_cache: OrderedDict[tuple[object, ...], RuleSet] = OrderedDict()


def clear_rules_cache() -> None:
    """Forget every compiled rule set :func:`load_rules` keeps."""
    _cache.clear()


def _cached(key: tuple[object, ...], build: Callable[[], RuleSet]) -> RuleSet:
    ruleset = _cache.get(key)
    if ruleset is not None:
        _cache.move_to_end(key)
        return ruleset
    ruleset = build()
    _cache[key] = ruleset
    while len(_cache) > RULES_CACHE_SIZE:
        _cache.popitem(last=False)
    return ruleset


def load_rules(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> RuleSet:
    """Load one rules file, or several combined in the order given.

    Compiled rule sets are cached by the files' content (a SHA-256 per
    file, the order and the prefilter engine), so every site
    whose rules files hold the same text shares one compiled set, and a
    reload of unchanged files compiles nothing.  A file that does not load
    is not cached: it raises each time.  Rule origins (``file:line``) name
    the file that was compiled first.
    """
    from prexy.substitution import prefilter
    from prexy.substitution.ruleset import RuleSet
    from prexy.substitution.transducer import warm

    if isinstance(paths, (str, os.PathLike)):
        path_list = [paths]
    else:
        path_list = list(paths)
    files = []
    for path in path_list:
        name = os.fspath(path)
        try:
            with open(name, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise RulesError(name, 0, 0, name, f"cannot read rules file: {exc.strerror}") from None
        files.append((name, data))
    engine = prefilter.ENGINE
    digests = tuple(hashlib.sha256(data).digest() for _, data in files)
    sets = [
        _cached(("file", engine, digest), partial(parse_rules, data, name))
        for (name, data), digest in zip(files, digests, strict=True)
    ]
    if len(sets) == 1:
        return sets[0]
    try:
        return _cached(("files", engine, digests), lambda: warm(RuleSet.combine(sets)))
    except HeaderRulesConflict as exc:
        names = ", ".join(name for name, _ in files)
        raise RulesError(names, 0, 0, names, str(exc)) from None
