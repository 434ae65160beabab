"""A bounded map of what this process decoded or built from the store.

Each worker keeps, for the objects it served last, what it would
otherwise make again on every hit (the decoded object, its answer's
serialized head): up to ``budget`` bytes, least recently used out
first, entries larger than an eighth of the budget never kept.  The
store stays the truth: an entry is used only when the store says its
object is the one the entry was made from (the caller keeps that
version in the entry and compares it), so a purge, a ban, an expiry or
another worker's new copy is seen at once, and nothing needs to be
invalidated here.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Generic, TypeVar

__all__ = ["Memo"]

_K = TypeVar("_K")
_V = TypeVar("_V")


class Memo(Generic[_K, _V]):
    """Up to ``budget`` bytes of entries (each ``put`` says its size),
    least recently used out first."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self._items: OrderedDict[_K, tuple[_V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: _K) -> _V | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: _K, value: _V, size: int) -> None:
        """Keep ``value`` (``size`` bytes) under ``key``, replacing what
        was there; an entry over an eighth of the budget is not kept."""
        items = self._items
        old = items.pop(key, None)
        if old is not None:
            self.used -= old[1]
        if size > self.budget // 8:
            return
        items[key] = (value, size)
        self.used += size
        while self.used > self.budget:
            _, (_, dropped) = items.popitem(last=False)
            self.used -= dropped

    def clear(self) -> None:
        self._items.clear()
        self.used = 0


def body_size(value: Any) -> int:
    """An object's memory in a memo: its body, plus a little for its head."""
    return len(value.body) + 512
