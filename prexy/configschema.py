"""The keys a configuration file may hold, each declared once.

A :class:`Table` lists its :class:`Key` declarations: the key's name in the
file, the converter that checks the file's value and turns it into the
frozen value's (raising :class:`Invalid` with the reason), the field it
goes to, and the default when the file leaves it out.  ``Table.read``
refuses unknown keys, reports a missing required key or a key that means
nothing without another, and converts the keys present in declaration
order; each refusal goes through the context's ``err(key, reason)``, which
``prexy.config`` makes raise its ``ConfigError`` with the file and line.
Adding a key is one more ``Key`` in its table: the parser, the list of
allowed keys in the error message and :func:`walk` (with which a test
checks that every key is documented) all follow.

Pure: the standard library and attrs only; the tables themselves are
declared beside the values they fill (``prexy.config``,
``prexy.cluster.settings``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, Protocol

import attrs

__all__ = [
    "ABSENT",
    "Context",
    "Converter",
    "Invalid",
    "Key",
    "Nested",
    "Table",
    "check_type",
    "choice",
    "parse_size",
    "size",
    "strings",
    "typed",
    "walk",
]

SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
_SIZE = re.compile(r"\s*(\d+)\s*([kKmMgG]?)[bB]?\s*")


def parse_size(text: str | int) -> int:
    """``64M`` / ``8k`` / ``1g`` / ``1048576`` -> bytes (nginx-style units)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"negative size: {text}")
        return text
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a size: {text!r} (use a number with an optional k, M or G)")
    return int(m.group(1)) * SIZE_UNITS[m.group(2).lower()]


class Invalid(ValueError):
    """A value a converter refuses: ``reason`` says why; ``key`` is the
    dotted key the error names when it is not the converted key itself (an
    entry of a nested table)."""

    def __init__(self, reason: str, key: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.key = key


class Context(Protocol):
    """What a table is read in: ``err`` raises an error naming the key
    (dotted, from the file's top) and the reason; it never returns."""

    def err(self, key: str, reason: str) -> NoReturn: ...


#: ``(value from the file, context, dotted key) -> field value``; raises
#: :class:`Invalid`.  The context is the loader's (``prexy.config``): it
#: resolves file names and knows what earlier tables set.
Converter = Callable[[Any, Any, str], Any]

class _Absent:
    def __repr__(self) -> str:
        return "ABSENT"


#: A key without a declared default: absent from the file, its field keeps
#: the frozen class's own default.
ABSENT: Any = _Absent()


@attrs.frozen
class Key:
    """One key of a table."""

    #: Its name in the file.
    name: str
    #: Checks the file's value and returns the field's value.
    convert: Converter = attrs.field(repr=False)
    #: The field it sets (default: its name); a dotted ``part.field`` sets
    #: ``field`` of the value the table's builder makes for ``part`` (a
    #: site's ``cache.default_ttl``: its ``CachePolicy``'s ``default_ttl``).
    field: str = attrs.field(default=attrs.Factory(lambda self: self.name, takes_self=True))
    #: The field's value when the file leaves the key out (not converted);
    #: ABSENT: the frozen class's default.
    default: Any = ABSENT
    #: As ``default``, computed from the context when the table is read
    #: (what an earlier table set); may raise :class:`Invalid`.
    default_from: Callable[[Any], Any] | None = attrs.field(default=None, repr=False)
    #: The reason given when the key is missing; None: it is optional.
    required: str | None = None
    #: Another key of the table without which this one is refused.
    needs: str | None = None

    @property
    def table(self) -> Table | None:
        """The declaration of the key's value when that is a table of its own."""
        return self.convert.table if isinstance(self.convert, Nested) else None


@attrs.frozen
class Table:
    """The keys of one table of the file."""

    #: The table's dotted name in the file (``server``, ``sites.NAME``); a
    #: table read in two places (``compression``, a site's too) is named
    #: after the first; '' for the file's top level.
    name: str
    keys: tuple[Key, ...]
    #: The frozen class the keys' fields belong to (that a test can check
    #: each key lands on a field); None: a mix the loader assembles.
    target: type | None = None
    _index: dict[str, Key] = attrs.field(init=False, repr=False, eq=False)
    _allowed: str = attrs.field(init=False, repr=False, eq=False)
    _required: tuple[Key, ...] = attrs.field(init=False, repr=False, eq=False)
    _defaulted: tuple[Key, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        names = [key.name for key in self.keys]
        if len(set(names)) != len(names):
            raise ValueError(f"[{self.name}]: a key declared twice")
        object.__setattr__(self, "_index", {key.name: key for key in self.keys})
        object.__setattr__(self, "_allowed", ", ".join(names))
        object.__setattr__(self, "_required", tuple(key for key in self.keys if key.required is not None))
        object.__setattr__(self, "_defaulted", tuple(
            key for key in self.keys if key.default_from is not None or key.default is not ABSENT
        ))

    def key(self, name: str) -> Key:
        return self._index[name]

    def read(self, value: Any, ctx: Context, where: str) -> dict[str, Any]:
        """The fields a table of the file (``value``, found at the dotted
        key ``where``) gives: one per key present (converted in the file's
        order, so the first bad value in the file is the one reported), or
        with a default."""
        self.check_keys(value, ctx, where)
        for key in self._required:
            if key.name not in value:
                assert key.required is not None
                ctx.err(where, key.required)
        index = self._index
        out: dict[str, Any] = {}
        for name, raw in value.items():
            key = index[name]
            dotted = f"{where}.{name}" if where else name
            if key.needs is not None and key.needs not in value:
                ctx.err(dotted, f"has no effect without {key.needs!r}")
            try:
                out[key.field] = key.convert(raw, ctx, dotted)
            except Invalid as exc:
                ctx.err(exc.key or dotted, exc.reason)
        for key in self._defaulted:
            if key.name not in value:
                if key.default_from is None:
                    out[key.field] = key.default
                    continue
                try:
                    out[key.field] = key.default_from(ctx)
                except Invalid as exc:
                    ctx.err(exc.key or (f"{where}.{key.name}" if where else key.name), exc.reason)
        return out

    def check_keys(self, value: Any, ctx: Context, where: str) -> None:
        """Refuse ``value`` unless it is a table of declared keys only."""
        if not isinstance(value, dict):
            ctx.err(where, "must be a table")
        index = self._index
        for name in value:
            if name not in index:
                ctx.err(f"{where}.{name}" if where else name, f"unknown key (allowed: {self._allowed})")

    def convert(self, name: str, value: Any, ctx: Context, where: str) -> Any:
        """One key's value converted (a refusal through ``ctx.err``): what
        a loader that reads the table's keys in an order of its own calls."""
        dotted = f"{where}.{name}" if where else name
        try:
            return self._index[name].convert(value, ctx, dotted)
        except Invalid as exc:
            ctx.err(exc.key or dotted, exc.reason)


@attrs.frozen
class Nested:
    """A converter for a key whose value is a table of its own: read with
    ``table``'s keys, then ``build(fields, ctx, dotted key)`` makes the
    field's value.  With ``each``, the value is a table of named tables
    (``[sites.NAME]``), each of them read with ``table`` by ``build``
    (which gets the named tables as they are)."""

    table: Table
    build: Callable[[dict[str, Any], Any, str], Any] = attrs.field(repr=False)
    each: bool = False

    def __call__(self, value: Any, ctx: Any, key: str) -> Any:
        if self.each:
            if not isinstance(value, dict):
                raise Invalid("must be a table")
            return self.build(value, ctx, key)
        return self.build(self.table.read(value, ctx, key), ctx, key)


def walk(table: Table, prefix: str | None = None) -> Iterator[tuple[str, Key]]:
    """Every key ``table`` accepts, nested tables' keys included, with the
    dotted name of the table that holds it (``NAME`` for the name of one
    of a table of named tables: ``sites.NAME``)."""
    name = table.name if prefix is None else prefix
    for key in table.keys:
        yield name, key
        if isinstance(key.convert, Nested):
            inner = f"{name}.{key.name}" if name else key.name
            yield from walk(key.convert.table, f"{inner}.NAME" if key.convert.each else inner)


# -- converters ----------------------------------------------------------------


def check_type(value: Any, kind: type) -> Any:
    """``value`` if it is a ``kind`` (a whole number for a float, as a
    float; never a bool for anything but bool); else :class:`Invalid`."""
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise Invalid(f"must be a {kind.__name__}, got {value!r}")
    return value


def typed(
    kind: type, ok: Callable[[Any], bool] | None = None, reason: str = "",
    then: Callable[[Any, Any], Any] | None = None,
) -> Converter:
    """A value of type ``kind`` for which ``ok`` holds (else ``reason``),
    passed through ``then(value, ctx)`` when given."""

    def convert(value: Any, ctx: Any, key: str) -> Any:
        value = check_type(value, kind)
        if ok is not None and not ok(value):
            raise Invalid(reason)
        return value if then is None else then(value, ctx)

    return convert


def parsed(parse: Callable[[str], Any]) -> Converter:
    """A string made a value by ``parse``, whose ValueError is the reason."""

    def convert(value: Any, ctx: Any, key: str) -> Any:
        text = check_type(value, str)
        try:
            return parse(text)
        except ValueError as exc:
            raise Invalid(str(exc)) from None

    return convert


def size(ok: Callable[[int], bool] | None = None, reason: str = "") -> Converter:
    """A size (``parse_size``) for which ``ok`` holds (else ``reason``)."""

    def convert(value: Any, ctx: Any, key: str) -> int:
        try:
            got = parse_size(value)
        except ValueError as exc:
            raise Invalid(str(exc)) from None
        if ok is not None and not ok(got):
            raise Invalid(reason)
        return got

    return convert


def choice(values: tuple[Any, ...], reason: str) -> Converter:
    """One of ``values`` (compared with ``==``), else ``reason``."""

    def convert(value: Any, ctx: Any, key: str) -> Any:
        if value not in values:
            raise Invalid(reason)
        return value

    return convert


def strings(
    reason: str, ok: Callable[[str], bool] | None = None, one: bool = False, empty: bool = True,
) -> Converter:
    """A list of strings for which ``ok`` holds, as a tuple (a single
    string too when ``one``; not an empty list unless ``empty``); else
    ``reason``."""

    def convert(value: Any, ctx: Any, key: str) -> tuple[str, ...]:
        if one and isinstance(value, str):
            value = [value]
        if (
            not isinstance(value, list) or (not empty and not value)
            or not all(isinstance(v, str) and (ok is None or ok(v)) for v in value)
        ):
            raise Invalid(reason)
        return tuple(value)

    return convert
