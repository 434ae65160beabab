"""Map values as nginx compiles them: text with ``$1``..``$9`` and ``$name``.

nginx turns a map value into a "complex value" (``ngx_http_script_compile``):

* ``$`` followed by a digit ``1``..``9`` is that capture of the regex that
  matched (one digit only: ``$10`` is capture 1 followed by ``0``);
* ``$name`` / ``${name}`` (letters, digits, ``_``) is a variable: a named
  capture of the matching regex, another map, or a request variable that
  the caller supplies; ``${1}`` is capture 1 (an extension: nginx 1.22
  reports an unknown variable "1"); other all-digit names (``$0``) are
  errors, as nginx knows no such variables;
* a ``$`` not followed by a name, or ``${`` without ``}``, is a load error.

A value without ``$`` stays a plain ``str``; others become a :class:`Template`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

__all__ = ["Template", "Value", "ValueSyntaxError", "compile_value", "render"]

_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


class ValueSyntaxError(ValueError):
    """A value nginx would refuse, with its reason."""


class MatchLike(Protocol):
    """What a template needs from a regex match: captures by number or name."""

    def group(self, __group: int | str) -> str | None: ...  # noqa: D102


Resolver = Callable[[str], "str | None"]


class Template:
    """A value with references: literal text, capture numbers and variable names.

    ``parts`` holds ``str`` (literal text), ``int`` (a capture number) and
    ``_Var`` (a variable name) in order.
    """

    __slots__ = ("parts", "text", "variables")

    def __init__(self, text: str, parts: tuple[str | int | _Var, ...]) -> None:
        self.text = text
        self.parts = parts
        self.variables = frozenset(p.name for p in parts if isinstance(p, _Var))

    def __repr__(self) -> str:
        return f"Template({self.text!r})"


class _Var:
    """A variable reference inside a template."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


Value = str | Template


def compile_value(text: str) -> Value:
    """Compile one map value; raise :class:`ValueSyntaxError` where nginx would."""
    if "$" not in text:
        return text
    parts: list[str | int | _Var] = []
    literal: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch != "$":
            literal.append(ch)
            i += 1
            continue
        i += 1
        if i == n:
            raise ValueSyntaxError("invalid variable name")
        if "1" <= text[i] <= "9":
            _flush(literal, parts)
            parts.append(int(text[i]))
            i += 1
            continue
        bracket = text[i] == "{"
        if bracket:
            i += 1
            if i == n:
                raise ValueSyntaxError("invalid variable name")
        start = i
        while i < n and text[i] in _NAME_CHARS:
            i += 1
        name = text[start:i]
        if bracket:
            if i < n and text[i] == "}":
                i += 1
            else:
                raise ValueSyntaxError(f'the closing bracket in "{name}" variable is missing')
        if not name:
            raise ValueSyntaxError("invalid variable name")
        _flush(literal, parts)
        if bracket and len(name) == 1 and "1" <= name <= "9":
            parts.append(int(name))  # ${1}: a capture (nginx 1.22 itself refuses it)
        elif name.isdigit():
            raise ValueSyntaxError(f'unknown "{name}" variable')  # $0, ${12}: no such variable
        else:
            parts.append(_Var(name))
    _flush(literal, parts)
    return Template(text, tuple(parts))


def _flush(literal: list[str], parts: list[str | int | _Var]) -> None:
    if literal:
        parts.append("".join(literal))
        literal.clear()


def render(
    value: Value,
    match: MatchLike | None,
    captures: frozenset[str],
    resolve: Resolver | None,
) -> str:
    """Expand ``value`` for one lookup.

    ``match`` is the winning regex match (``None`` for exact, wildcard and
    default answers); ``captures`` the names that are named groups of some
    regex in the map (they come from ``match`` or are empty); any other name
    is asked of ``resolve`` and is empty when it has no answer.
    """
    if type(value) is str:
        return value
    assert isinstance(value, Template)
    out: list[str] = []
    for part in value.parts:
        if type(part) is str:
            out.append(part)
        elif type(part) is int:
            if match is not None:
                try:
                    got = match.group(part)
                except IndexError:
                    got = None
                if got:
                    out.append(got)
        else:
            assert isinstance(part, _Var)
            name = part.name
            if name in captures:
                if match is not None:
                    try:
                        got = match.group(name)
                    except IndexError:
                        got = None
                    if got:
                        out.append(got)
            elif resolve is not None:
                got = resolve(name)
                if got:
                    out.append(got)
    return "".join(out)


def as_resolver(variables: Mapping[str, str] | Resolver | None) -> Resolver | None:
    """Accept a mapping or a callable for variable lookup; return a callable."""
    if variables is None or callable(variables):
        return variables
    mapping = variables
    return mapping.get
