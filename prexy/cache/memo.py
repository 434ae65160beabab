"""Bounded maps of what this process decoded or built from the store.

Each worker keeps, for the objects it served last, what it would
otherwise make again on every hit: the decoded object (``Store``), the
compressed variant (``CacheLayer``), the answer's serialized head and
body (``HitPath``).  These are the parts (:class:`Memo`) of one byte
budget (:class:`Memos`, ``[cache] memo_size``): one least-recently-used
order over all of them, so a worker's memory for them has one bound
whatever its traffic asks of each, and the part a mix uses most gets the
room.  An entry larger than an eighth of the budget is never kept.

The store stays the truth: an entry is used only when the store says its
object is the one the entry was made from (the caller keeps that version
in the entry and compares it), so a purge, a ban, an expiry or another
worker's new copy is seen at once, and nothing needs to be invalidated
here.

Each entry is charged what it holds: its value's bytes as the caller
counts them (:func:`object_size` for a cached object: body, head fields,
the object itself) plus :data:`ENTRY` for the map's own bookkeeping and
the key's (:func:`key_size`).  Pure: no Twisted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

__all__ = ["ENTRY", "MEMO_SIZE", "Memo", "Memos", "key_size", "object_size"]

#: The default budget (``[cache] memo_size``): what the two body memos held
#: before they shared one (32M of objects, 16M of compressed variants);
#: the hit answers now keep their heads and no second copy of a body.
MEMO_SIZE = 48 * 1024 * 1024

_K = TypeVar("_K")
_V = TypeVar("_V")

#: Bytes of one entry's bookkeeping beside its value and key: the ordered
#: map's slot and node, the (part, key) pair, the (value, size, part)
#: record and its size (measured with tracemalloc: about 250 on CPython
#: 3.11; ``tests/cache/test_memo.py`` checks the charge covers it).
ENTRY = 320
#: A cached object beside its body and head fields: the instance (14
#: slots), its floats, the header list and the body's bytes header.
_OBJECT = 560
#: One (name, value) head field beside the bytes of both: the pair and
#: the two bytes objects' headers, and the list's slot.
_FIELD = 136


def object_size(obj: Any) -> int:
    """The memory of a cached object (``prexy.cache.store.CachedObject``):
    its body, its head fields, its site and URL, and the object itself."""
    headers: Sequence[tuple[bytes, bytes]] = obj.headers
    return (
        _OBJECT + len(obj.body) + len(obj.url) + len(obj.site) + len(obj.phrase)
        + sum(len(name) + len(value) for name, value in headers) + _FIELD * len(headers)
        + sum(len(name) + 40 for name in obj.vary)
    )


def key_size(key: Any, depth: int = 0) -> int:
    """The memory of a key: bytes and strings by their length, a tuple by
    its slots and its members'; others (None, booleans, numbers) as a
    small object."""
    if isinstance(key, (bytes, str)):
        return 40 + len(key)
    if isinstance(key, tuple) and depth < 3:
        return 40 + 8 * len(key) + sum(key_size(k, depth + 1) for k in key)
    return 32


class Memos:
    """One byte budget for several :class:`Memo` parts: one order, least
    recently used out first, whichever part it belongs to."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError("a memo budget is 0 or more bytes")
        self.budget = budget
        self.used = 0
        #: (part's name, key), or a part's own key -> (value, size, part),
        #: least recently used first.
        self._items: OrderedDict[Any, tuple[Any, int, Memo[Any, Any]]] = OrderedDict()
        #: The parts, in the order they were made (two of one name share
        #: their entries).
        self.parts: list[Memo[Any, Any]] = []

    def __len__(self) -> int:
        return len(self._items)

    def part(self, name: str, own_keys: bool = False) -> Memo[Any, Any]:
        """The part called ``name`` (made on first use; the same object
        after); ``own_keys``: see :class:`Memo`."""
        for known in self.parts:
            if known.name == name and type(known) is Memo:
                return known
        return Memo(self, name, own_keys)

    def resize(self, budget: int) -> None:
        """Take ``budget`` bytes from now on (a reload may change it): the
        least recently used entries go until the rest fits, and those over
        an eighth of it."""
        if budget < 0:
            raise ValueError("a memo budget is 0 or more bytes")
        if budget == self.budget:
            return
        self.budget = budget
        items = self._items
        for key in [k for k, (_, size, _) in items.items() if size > budget // 8]:
            _, size, part = items.pop(key)
            part.used -= size
            part.count -= 1
            self.used -= size
        self._shrink()

    def used_by(self) -> dict[str, int]:
        """Bytes each part holds, by name."""
        out: dict[str, int] = {}
        for part in self.parts:
            out[part.name] = out.get(part.name, 0) + part.used
        return out

    def _shrink(self) -> None:
        items = self._items
        while self.used > self.budget:
            _, (_, dropped, part) = items.popitem(last=False)
            part.used -= dropped
            part.count -= 1
            self.used -= dropped


class Memo(Generic[_K, _V]):
    """One part of a :class:`Memos` budget: a map whose entries each say
    their size (``put``).  ``Memo(budget)`` with a number makes a budget
    of its own.

    A part's keys go in the budget's one map paired with its name, so
    that two parts may use the same keys; ``own_keys`` says no other
    part of the budget can have a key of this part's shape (a worker's
    three: store keys, which are bytes; (key, coding) pairs; the hit
    path's 6-tuples), and its keys go in as they are (a lookup then
    makes no pair: 100 ns less)."""

    def __init__(self, budget: int | Memos, name: str = "memo", own_keys: bool = False) -> None:
        if not isinstance(budget, Memos):
            budget = Memos(budget)
            own_keys = True
        budget.parts.append(self)
        self.memos = budget
        self.name = name
        self.own_keys = own_keys
        #: Bytes this part's entries are charged, and how many there are.
        self.used = 0
        self.count = 0
        self._items = budget._items

    @property
    def budget(self) -> int:
        """The bytes the whole budget this part draws on allows."""
        return self.memos.budget

    def __len__(self) -> int:
        return self.count

    def get(self, key: _K) -> _V | None:
        full = key if self.own_keys else (self.name, key)
        item = self._items.get(full)
        if item is None:
            return None
        self._items.move_to_end(full)
        return item[0]

    def put(self, key: _K, value: _V, size: int) -> None:
        """Keep ``value`` under ``key``, replacing what was there; charged
        ``size`` bytes (what the value holds) plus the entry's own
        (:data:`ENTRY`) and the key's (:func:`key_size`).  An entry
        over an eighth of the budget is not kept (what it replaces goes)."""
        memos = self.memos
        items = self._items
        full = key if self.own_keys else (self.name, key)
        old = items.pop(full, None)
        if old is not None:
            old[2].used -= old[1]
            old[2].count -= 1
            memos.used -= old[1]
        size += ENTRY + key_size(key)
        if size > memos.budget // 8:
            return
        items[full] = (value, size, self)
        self.used += size
        self.count += 1
        memos.used += size
        if memos.used > memos.budget:
            memos._shrink()

    def pop(self, key: _K) -> None:
        """Drop the entry under ``key``, if any."""
        self._drop(key if self.own_keys else (self.name, key))

    def _drop(self, full: Any) -> None:
        old = self._items.pop(full, None)
        if old is not None:
            old[2].used -= old[1]
            old[2].count -= 1
            self.memos.used -= old[1]

    def clear(self) -> None:
        """Drop this part's entries (the others stay)."""
        name = self.name
        for full in [k for k, (_, _, part) in self._items.items() if part.name == name]:
            self._drop(full)
