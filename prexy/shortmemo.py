"""Memoised pure functions whose memory has a bound in bytes.

``functools.lru_cache(maxsize=N)`` bounds the answers it keeps by count,
not by size: a function of a request's target or a header's value,
remembered for 4,096 values each up to the 8 KB a request line or a
header line may hold, keeps 32 MB a process, and a client inventing long
values fills it.  :func:`short_memo` remembers only answers for short
arguments (at most :data:`LONGEST` bytes): the values a site's traffic
repeats (its URLs, Host values, Vary and Accept-Encoding values) are
short, and a long one is computed each time, as it would be on a miss.
So each memo holds at most ``maxsize`` entries of a few hundred bytes.
Pure: no Twisted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["LONGEST", "short_memo"]

#: The longest argument (bytes, or the bytes of a tuple's members) whose
#: answer is remembered.
LONGEST = 512

_F = TypeVar("_F", bound=Callable[..., Any])


def short_memo(maxsize: int, arg: int = -1, longest: int = LONGEST) -> Callable[[_F], _F]:
    """``functools.lru_cache(maxsize)`` for calls whose argument number
    ``arg`` (bytes or str, or a tuple of them) is at most ``longest``
    bytes long; other calls are computed and not remembered.  The other
    arguments must be short by nature (a method, a site's name).  The
    memo is ``.memo`` (``cache_info()``, ``cache_clear()``)."""

    def wrap(fn: _F) -> _F:
        memo = functools.lru_cache(maxsize=maxsize)(fn)

        def call(*args: Any) -> Any:
            value = args[arg]
            if len(value) > longest or (type(value) is tuple and sum(map(len, value)) > longest):
                return fn(*args)
            return memo(*args)

        functools.update_wrapper(call, fn)
        call.memo = memo  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return wrap
