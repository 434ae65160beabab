"""The lookup side of a URL map: :class:`UrlMap` answers exactly as nginx's
``map`` would, without trying every regex.

nginx's order (``ngx_http_map_find``): exact keys (case-insensitive), then
with ``hostnames`` the longest ``*.example.com``/``.example.com`` mask, then
the longest ``www.example.*`` mask, then the regexes in file order (first
match wins, never tried on an empty key), then ``default``.

The regexes are indexed by what every match must contain:

* a literal prefix after ``^``: a dict from prefix to entry numbers; a key
  probes it once per distinct prefix length (a handful).  A prefix shared
  by more than 8 regexes (``^/item/(\\d+)-slug-N``) sends those that have
  another literal to the next kind;
* otherwise a literal somewhere in the match: up to 48 such regexes are
  checked with ``literal in key``; beyond that they are keyed by a rarely
  shared whole word of the literal (between URL punctuation), else the
  first 8 characters of a word, else an 8-character piece, and a key
  probes its own words (and, for the last kind, its pieces);
* regexes with nothing to index are candidates for every key.

Candidate lists are sorted by file position and merged, so they are tried in
file order and the first confirmed match is nginx's answer.  Regexes that
start with a plain literal (after ``^`` or not) and differ only in it share
one compiled "rest", matched from the end of the literal (for unanchored
ones, after each occurrence of the literal, leftmost first); others are
compiled on first use (their syntax was checked at load).  Lookup cost
depends on the key, not on the map's size.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

import regex

from prexy.urlmap.pcre import ASCII_LOWER_TABLE, ascii_lower
from prexy.urlmap.values import Resolver, Value, as_resolver, render

__all__ = ["MapLookup", "SourceFile", "UrlMap", "RegexEntry", "REGEX_FLAGS"]

REGEX_FLAGS = regex.V1 | regex.ASCII
_FLAGS = int(REGEX_FLAGS)
_CASELESS_FLAGS = int(REGEX_FLAGS | regex.IGNORECASE)


@dataclass(frozen=True)
class SourceFile:
    """A file the map was read from, its modification time and the SHA-256
    of its bytes when read (for a wildcard ``include``, also the directory
    searched: the digest of its sorted entry names).  ``current()`` says
    whether it still holds the same: a reload loads a map again only then."""

    path: str
    mtime: float
    digest: bytes = b""

    def current(self) -> bool:
        """Whether the file (or directory) still has the bytes (entries) it
        had when read; a file that cannot be read has not."""
        try:
            return source_digest(self.path) == self.digest
        except OSError:
            return False


def source_digest(path: str, files: Any = None) -> bytes:
    """SHA-256 of a file's bytes, or of a directory's sorted entry names;
    read through ``files`` when given (``prexy.files.IFiles``), else from
    the file system."""
    if files is not None:
        try:
            names = files.listdir(path)
        except NotADirectoryError:
            return hashlib.sha256(files.read(path)).digest()
        return hashlib.sha256("\0".join(names).encode("utf-8", "surrogateescape")).digest()
    if os.path.isdir(path):
        names = "\0".join(sorted(os.listdir(path)))
        return hashlib.sha256(names.encode("utf-8", "surrogateescape")).digest()
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


@dataclass(frozen=True)
class MapLookup:
    """What a lookup found: the value and which kind of entry gave it.

    ``kind`` is one of ``exact``, ``wildcard_head``, ``wildcard_dot``,
    ``wildcard_tail``, ``regex``, ``regex_caseless`` or ``default``; ``entry``
    is the matching key (lower-cased for exact and wildcard keys, as written
    for regexes); ``filename``/``line`` locate regex entries.
    """

    value: str
    kind: str
    entry: str
    filename: str = ""
    line: int = 0


class RegexEntry:
    """One ``~`` / ``~*`` entry, in file order.

    ``rest`` (shared) and ``literal`` (lower-cased for ``~*``) are set when
    the regex is ``^`` + a plain literal + a rest shared with other entries:
    it matches when the key starts with the literal and the rest matches
    from there.  Without ``^`` (``floating``) the literal is looked for
    anywhere, leftmost first.  Otherwise ``pattern`` is compiled on first use.
    """

    __slots__ = (
        "source", "filename", "line", "caseless", "value",
        "pattern", "compiled", "rest", "split", "literal", "floating",
    )

    def __init__(
        self,
        source: str,
        filename: str,
        line: int,
        caseless: bool,
        value: Value,
        pattern: str | None,
        rest: Any,
        literal: str,
        floating: bool = False,
    ) -> None:
        self.source = source
        self.filename = filename
        self.line = line
        self.caseless = caseless
        self.value = value
        self.pattern = pattern
        self.compiled: Any = None
        self.rest = rest
        self.literal = literal
        self.split = len(literal)
        self.floating = floating

    def search(self, key: str, low: str | None = None) -> Any:
        """The regex match on ``key`` (``low``: the key ASCII-lower-cased), or ``None``."""
        rest = self.rest
        if rest is not None:
            if self.floating:
                # the match starts at some occurrence of the literal: the
                # first occurrence the rest accepts is the leftmost match
                if self.caseless:
                    hay = low if low is not None else ascii_lower(key)
                else:
                    hay = key
                literal = self.literal
                start = hay.find(literal)
                while start >= 0:
                    m = rest.match(key, start + self.split)
                    if m is not None:
                        return m
                    start = hay.find(literal, start + 1)
                return None
            if self.caseless:
                if low is None:
                    low = ascii_lower(key)
                if not low.startswith(self.literal):
                    return None
            elif not key.startswith(self.literal):
                return None
            return rest.match(key, self.split)
        compiled = self.compiled
        if compiled is None:
            flags = _CASELESS_FLAGS if self.caseless else _FLAGS
            compiled = self.compiled = regex.compile(self.pattern, flags)
        return compiled.search(key)


_GRAM = 8
_EXACT = object()  # _find's marker: an exact key answered
_DEFAULT = object()  # _find's marker: nothing matched
_CROWDED = 8  # prefix bucket size above which entries move to the piece index
_MIN_SECONDARY = 3  # shortest other literal worth moving for
_SCAN_MAX = 48  # up to this many literal-indexed regexes are scanned with "in"
_SORT_MAX = 256  # candidate lists this short are merged by sorting, longer ones lazily


class _PrefixIndex:
    """Regexes keyed by the literal every match starts with."""

    __slots__ = ("table", "lengths")

    def __init__(self, table: dict[str, list[int]]) -> None:
        self.table = table
        self.lengths = tuple(sorted({len(k) for k in table}))

    def probe(self, key: str, out: list[list[int]]) -> None:
        """Append the buckets of every indexed prefix ``key`` starts with."""
        table = self.table
        size = len(key)
        for n in self.lengths:
            if n > size:
                break
            hit = table.get(key[:n])
            if hit is not None:
                out.append(hit)


class _GramIndex:
    """Regexes keyed by a literal every match contains.

    Up to ``_SCAN_MAX`` of them are simply checked with ``literal in key``
    (a C substring search each).  More are keyed through the "words" of the
    literal, the runs between URL punctuation: a word that is preceded and
    followed by punctuation inside the literal (``legacy`` in
    ``/legacy-page``) is a whole word of any key containing the literal,
    and a last word of 8 or more characters starts a word of such a key.
    So each regex is keyed by its least shared whole word or, failing
    that, by the first 8 characters of a word; a key looks up its own ~10
    words both ways.  Literals with neither (no punctuation) are keyed by
    any 8-character piece, found by probing every position of the key.
    The cost depends on the key's length, not on the number of regexes.
    """

    __slots__ = ("words", "starts", "table", "lengths", "scan")

    def __init__(self, entries: list[tuple[int, str]]) -> None:
        """``entries`` are ``(entry number, literal)`` in file order."""
        self.words: dict[str, list[int]] = {}
        self.starts: dict[str, list[int]] = {}
        self.table: dict[str, list[int]] = {}
        self.scan: tuple[tuple[str, int], ...] | None = None
        if len(entries) <= _SCAN_MAX:
            self.scan = tuple((literal, order) for order, literal in entries)
        else:
            inners: list[list[str]] = []
            heads: list[list[str]] = []
            for _order, literal in entries:
                words = _split_words(literal)
                inner = [w for w in words[1:-1] if w]
                head = [w[:_GRAM] for w in inner]
                if len(words) > 1 and len(words[-1]) >= _GRAM:
                    head.append(words[-1][:_GRAM])
                inners.append(inner)
                heads.append(head)
            word_counts = Counter(w for inner in inners for w in set(inner))
            head_counts = Counter(h for head in heads for h in set(head))
            for (order, literal), inner, head in zip(entries, inners, heads, strict=True):
                best = min(inner, key=word_counts.__getitem__, default="")
                if best and word_counts[best] <= _CROWDED:
                    _add(self.words, best, order)
                    continue
                best = min(head, key=head_counts.__getitem__, default="")
                if best and head_counts[best] <= _CROWDED:
                    _add(self.starts, best, order)
                    continue
                # no word start few literals share: a piece anywhere
                _add(self.table, _choose_piece(literal, self.table), order)
        self.lengths = tuple(sorted({len(k) for k in self.table}))

    def probe(self, key: str, out: list[list[int]]) -> None:
        """Append the entry lists that may match ``key`` (each list in file order)."""
        if self.scan is not None:
            hits = [order for literal, order in self.scan if literal in key]
            if hits:
                out.append(hits)
            return
        words = self.words
        starts = self.starts
        if words or starts:
            seen_words: set[str] = set()
            seen_starts: set[str] = set()
            for word in _split_words(key):
                if word not in seen_words:
                    seen_words.add(word)
                    hit = words.get(word)
                    if hit is not None:
                        out.append(hit)
                start = word[:_GRAM]
                if start not in seen_starts:
                    seen_starts.add(start)
                    hit = starts.get(start)
                    if hit is not None:
                        out.append(hit)
        table = self.table
        if not table:
            return
        seen_pieces: set[str] = set()
        size = len(key)
        for n in self.lengths:
            for i in range(size - n + 1):
                piece = key[i:i + n]
                hit = table.get(piece)
                if hit is not None and piece not in seen_pieces:
                    seen_pieces.add(piece)
                    out.append(hit)


_split_words = re.compile(r"""[\s/?&=.\-_~%+;,:@!$'()*\[\]#"<>^`{|}\\]+""").split


def _add(table: dict[str, list[int]], key: str, order: int) -> None:
    """Append entry ``order`` to the bucket of ``key`` (entries come in file order)."""
    bucket = table.get(key)
    if bucket is None:
        table[key] = [order]
    else:
        bucket.append(order)


class UrlMap:
    """An immutable, loaded map: ``lookup(key)`` gives nginx's value for ``key``.

    Build one with :func:`prexy.urlmap.load_map` or
    :func:`prexy.urlmap.parse_map`.  ``entry_count`` counts the entries (not
    ``default``); ``source_files`` lists every file read, with its digest, so
    a caller can tell whether they changed; ``variables`` names the variables values refer
    to that are not captures (the caller supplies them at lookup).
    """

    __slots__ = (
        "_exact", "_head_dot", "_head_star", "_tail", "_regexes", "_prefix_cs",
        "_prefix_ci", "_gram_cs", "_gram_ci", "_always", "_captures", "_only_prefix",
        "hostnames", "default", "entry_count", "source_files", "variables", "_frozen",
    )

    _exact: dict[str, Value]
    _head_dot: dict[str, Value]
    _head_star: dict[str, Value]
    _tail: dict[str, Value]
    _regexes: list[RegexEntry]
    _prefix_cs: _PrefixIndex | None
    _prefix_ci: _PrefixIndex | None
    _gram_cs: _GramIndex | None
    _gram_ci: _GramIndex | None
    _always: list[int]
    _only_prefix: _PrefixIndex | None
    _captures: frozenset[str]
    hostnames: bool
    default: Value
    entry_count: int
    source_files: tuple[SourceFile, ...]
    variables: frozenset[str]

    def __init__(
        self,
        *,
        exact: dict[str, Value],
        head_dot: dict[str, Value],
        head_star: dict[str, Value],
        tail: dict[str, Value],
        regexes: list[RegexEntry],
        index_keys: list[tuple[str, str]],
        hostnames: bool,
        default: Value,
        source_files: Iterable[SourceFile],
        captures: frozenset[str],
        variables: frozenset[str],
    ) -> None:
        """Build the index; ``index_keys[i]`` says how regex ``i`` can be indexed.

        Each is ``(anchored, literal)``: the literal every match starts with
        (or ``""``) and another literal every match contains (or ``""``);
        a regex with neither is a candidate for every key.
        """
        set_ = object.__setattr__
        set_(self, "_exact", exact)
        set_(self, "_head_dot", head_dot)
        set_(self, "_head_star", head_star)
        set_(self, "_tail", tail)
        set_(self, "_regexes", regexes)
        set_(self, "hostnames", hostnames)
        set_(self, "default", default)
        set_(self, "source_files", tuple(source_files))
        set_(self, "_captures", captures)
        set_(self, "variables", variables)
        set_(self, "entry_count", len(exact) + len(head_dot) + len(head_star) + len(tail) + len(regexes))
        prefix: tuple[dict[str, list[int]], dict[str, list[int]]] = ({}, {})
        grams: tuple[list[tuple[int, str]], list[tuple[int, str]]] = ([], [])
        always: list[int] = []
        rest: list[int] = []  # entries not indexed by prefix, in file order
        crowded: list[list[int]] = []
        for i, (anchored, _other) in enumerate(index_keys):
            if anchored:
                table = prefix[1 if regexes[i].caseless else 0]
                bucket = table.get(anchored)
                if bucket is None:
                    table[anchored] = [i]
                else:
                    bucket.append(i)
                    if len(bucket) == _CROWDED + 1:
                        crowded.append(bucket)
            else:
                rest.append(i)
        # a crowded prefix (many regexes like ^/item/(\d+)-slug) would be a
        # linear walk: move those with another literal to the piece index
        if crowded:
            moved: list[int] = []
            for bucket in crowded:
                moved.extend(i for i in bucket if len(index_keys[i][1]) >= _MIN_SECONDARY)
                bucket[:] = [i for i in bucket if len(index_keys[i][1]) < _MIN_SECONDARY]
            for table in prefix:
                for anchored in [a for a, bucket in table.items() if not bucket]:
                    del table[anchored]
            rest = sorted(rest + moved)
        for i in rest:
            literal = index_keys[i][1]
            if literal:
                grams[1 if regexes[i].caseless else 0].append((i, literal))
            else:
                always.append(i)
        set_(self, "_prefix_cs", _PrefixIndex(prefix[0]) if prefix[0] else None)
        set_(self, "_prefix_ci", _PrefixIndex(prefix[1]) if prefix[1] else None)
        set_(self, "_gram_cs", _GramIndex(grams[0]) if grams[0] else None)
        set_(self, "_gram_ci", _GramIndex(grams[1]) if grams[1] else None)
        set_(self, "_always", always)
        only = self._prefix_cs
        if self._prefix_ci is not None or self._gram_cs is not None or self._gram_ci is not None:
            only = None
        set_(self, "_only_prefix", None if always else only)
        set_(self, "_frozen", True)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("UrlMap is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("UrlMap is immutable")

    def __repr__(self) -> str:
        files = ", ".join(f.path for f in self.source_files[:1])
        return f"<UrlMap {self.entry_count} entries from {files or '<text>'}>"

    # -- lookup ---------------------------------------------------------------

    def lookup(self, key: str, variables: Mapping[str, str] | Resolver | None = None) -> str:
        """The value nginx's map gives for ``key`` (``""`` when nothing matches
        and there is no default).  ``variables`` supplies non-capture
        variables used in values (a mapping or a callable returning ``None``
        for unknown names)."""
        value, m, _entry = self._find(key)
        if type(value) is str:
            return value
        return render(value, m, self._captures, as_resolver(variables))

    def match(self, key: str, variables: Mapping[str, str] | Resolver | None = None) -> MapLookup:
        """Like :meth:`lookup`, also saying which entry answered."""
        value, m, entry = self._find(key)
        text = render(value, m, self._captures, as_resolver(variables))
        if isinstance(entry, RegexEntry):
            kind = "regex_caseless" if entry.caseless else "regex"
            return MapLookup(text, kind, entry.source, entry.filename, entry.line)
        if entry is _EXACT:
            if self.hostnames and key.endswith("."):
                key = key[:-1]
            return MapLookup(text, "exact", ascii_lower(key))
        if entry is _DEFAULT:
            return MapLookup(text, "default", "default")
        assert isinstance(entry, tuple)
        return MapLookup(text, entry[0], entry[1])

    def _find(self, key: str) -> tuple[Value, Any, RegexEntry | tuple[str, str] | object]:
        """(value, regex match or None, the entry: a RegexEntry, a wildcard's
        (kind, mask), or the markers ``_EXACT`` / ``_DEFAULT``)."""
        if self.hostnames and key.endswith("."):
            key = key[:-1]
        low = key.lower() if key.isascii() else key.translate(ASCII_LOWER_TABLE)
        value = self._exact.get(low)
        if value is not None:
            return value, None, _EXACT
        if key and self.hostnames:
            found = self._wildcard(low)
            if found is not None:
                kind, name, value = found
                return value, None, (kind, name)
        if key and self._regexes:
            regexes = self._regexes
            only = self._only_prefix
            if only is not None:
                # the common case, one case-sensitive prefix index: probe it inline
                candidates: Iterable[int] = ()
                table = only.table
                size = len(key)
                for n in only.lengths:
                    if n > size:
                        break
                    hit = table.get(key[:n])
                    if hit is not None:
                        candidates = hit if not candidates else sorted([*candidates, *hit])
            else:
                candidates = self._candidates(key, low)
            for order in candidates:
                entry = regexes[order]
                m = entry.search(key, low)
                if m is not None:
                    return entry.value, m, entry
        return self.default, None, _DEFAULT

    def _wildcard(self, low: str) -> tuple[str, str, Value] | None:
        head_dot = self._head_dot
        head_star = self._head_star
        if head_dot or head_star:
            value = head_dot.get(low)
            if value is not None:
                return "wildcard_dot", "." + low, value
            i = low.find(".")
            while i >= 0:
                suffix = low[i + 1:]
                value = head_dot.get(suffix)
                if value is not None:
                    return "wildcard_dot", "." + suffix, value
                value = head_star.get(suffix)
                if value is not None:
                    return "wildcard_head", "*." + suffix, value
                i = low.find(".", i + 1)
        tail = self._tail
        if tail:
            i = low.rfind(".")
            while i > 0:
                head = low[:i]
                value = tail.get(head)
                if value is not None:
                    return "wildcard_tail", head + ".*", value
                i = low.rfind(".", 0, i)
        return None

    def _candidates(self, key: str, low: str) -> Iterable[int]:
        """Entry numbers that may match, in file order (a lazy merge of the
        index hits; in the common case the one hit list itself)."""
        first: list[int] | None = None
        more: list[list[int]] | None = None
        size = len(key)
        for index, probe in (
            (self._prefix_cs, key),
            (self._prefix_ci, low),
        ):
            if index is None:
                continue
            table = index.table
            for n in index.lengths:
                if n > size:
                    break
                hit = table.get(probe[:n])
                if hit is not None:
                    if first is None:
                        first = hit
                    elif more is None:
                        more = [first, hit]
                    else:
                        more.append(hit)
        grams: list[list[int]] = []
        if self._gram_cs is not None:
            self._gram_cs.probe(key, grams)
        if self._gram_ci is not None:
            self._gram_ci.probe(low, grams)
        if self._always:
            grams.append(self._always)
        if grams:
            if more is None:
                more = [first] if first is not None else []
            more.extend(grams)
        if more is not None:
            if sum(map(len, more)) <= _SORT_MAX:
                return sorted(chain.from_iterable(more))
            return heapq.merge(*more)
        return first if first is not None else ()


def _choose_piece(literal: str, table: dict[str, list[int]]) -> str:
    """Pick the piece of ``literal`` to index by: of a few evenly spaced
    pieces of ``_GRAM`` characters, the one with the fewest entries so far."""
    if len(literal) <= _GRAM:
        return literal
    last = len(literal) - _GRAM
    best = literal[last:]
    best_count = len(table.get(best, ()))
    for start in (0, last // 2, last // 3, (2 * last) // 3):
        piece = literal[start:start + _GRAM]
        count = len(table.get(piece, ()))
        if count < best_count:
            best, best_count = piece, count
    return best
