"""The syntax tree of an sregex pattern, and the one way to walk it.

:mod:`.dialect` parses a ``replace_filter`` pattern into these nodes;
:mod:`.emit` writes them out for ``regex`` and RE2, :mod:`.analysis`
reasons about them, and :mod:`.pikevm`, :mod:`.hsindex` and
:mod:`.prefilter` compile them.  A walk that computes something per node
type is a :class:`Visitor` subclass (one method per node type); a walk that
only looks for nodes of some kind iterates :func:`walk`.  Both are for
compile time: no scan calls them.

Everything here is pure; nothing imports Twisted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = [
    "ALL_BYTES",
    "Alt",
    "Assert",
    "Cat",
    "Char",
    "Group",
    "Node",
    "ParsedRegex",
    "Repeat",
    "Set",
    "Visitor",
    "walk",
]

ALL_BYTES = frozenset(range(256))


@dataclass(frozen=True)
class Char:
    """One literal byte."""

    byte: int


@dataclass(frozen=True)
class Set:
    """One byte out of a set (classes, ``.``, ``\\d``, folded letters)."""

    members: frozenset[int]


@dataclass(frozen=True)
class Assert:
    """A zero-width assertion: ``bol eol A z b B``."""

    kind: str


@dataclass(frozen=True)
class Group:
    """A group; ``index`` is the capture number or ``None`` for ``(?:``."""

    index: int | None
    child: Node


@dataclass(frozen=True)
class Cat:
    """A concatenation."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    """An alternation, in priority order."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    """A quantified node; ``high`` is ``None`` when unbounded."""

    child: Node
    low: int
    high: int | None
    greedy: bool
    #: Written as ``{m,n}`` (sregex compiles ``x{1,}`` unlike ``x+``; see
    #: :mod:`.pikevm`); not part of the node's value.
    counted: bool = field(default=False, compare=False)


Node = Char | Set | Assert | Group | Cat | Alt | Repeat


@dataclass(frozen=True)
class ParsedRegex:
    """A parsed pattern: its tree, its number of capture groups, its flags."""

    tree: Node
    ngroups: int
    caseless: bool


T = TypeVar("T")

#: The visitor method of each node type.
_METHOD: dict[type, str] = {
    Char: "visit_char",
    Set: "visit_set",
    Assert: "visit_assert",
    Group: "visit_group",
    Cat: "visit_cat",
    Alt: "visit_alt",
    Repeat: "visit_repeat",
}


class Visitor(Generic[T]):
    """A computation over a tree, one method per node type.

    :meth:`visit` calls the method of the node's type; a method recurses by
    calling :meth:`visit` on the children it needs, in the order it needs
    them.  A group stands for its child unless a subclass says otherwise;
    every other node type must be handled.
    """

    def visit(self, node: Node) -> T:
        """The result for ``node``."""
        result: T = getattr(self, _METHOD[type(node)])(node)
        return result

    def visit_char(self, node: Char) -> T:
        raise NotImplementedError

    def visit_set(self, node: Set) -> T:
        raise NotImplementedError

    def visit_assert(self, node: Assert) -> T:
        raise NotImplementedError

    def visit_group(self, node: Group) -> T:
        return self.visit(node.child)

    def visit_cat(self, node: Cat) -> T:
        raise NotImplementedError

    def visit_alt(self, node: Alt) -> T:
        raise NotImplementedError

    def visit_repeat(self, node: Repeat) -> T:
        raise NotImplementedError


def walk(node: Node) -> Iterator[Node]:
    """``node`` and every node below it, parents first, children in order."""
    stack: list[Any] = [node]
    while stack:
        n = stack.pop()
        yield n
        if isinstance(n, (Group, Repeat)):
            stack.append(n.child)
        elif isinstance(n, (Cat, Alt)):
            stack.extend(reversed(n.items))
