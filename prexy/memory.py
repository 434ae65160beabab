"""How a serving process has the C allocator hand freed memory back.

A worker allocates and frees bodies of every size from a few hundred
bytes to megabytes, all day (decoded objects, compressed copies, ranges,
rewritten chunks).  glibc keeps what a process frees for its next
allocations: the heap's free top above a threshold goes back to the
system, but pages freed between blocks still in use stay resident, so a
process's resident memory creeps up long after what it keeps (its memos,
bounded in bytes) stopped growing.  :func:`trim` (``malloc_trim(0)``)
hands every whole free page of every arena back; a serving process calls
it every :data:`TRIM_INTERVAL` seconds.  It takes about a millisecond on
a heap of 75 MB, and leaves the allocator's own sizing alone.

Fixing glibc's thresholds instead (``M_MMAP_THRESHOLD``,
``M_TRIM_THRESHOLD``: setting either turns its dynamic sizing off) keeps
the resident memory flat too, but makes every body above the threshold a
mapping of its own, faulted in page by page: measured in memory, a hit of
a 200 KB page went from 80-94 us to 260-580 us.  Only the number of
arenas is fixed (:func:`tune_malloc`: two, the reactor's thread and the
thread pool's), which costs nothing there.

A variable ``MALLOC_*`` the operator set wins (glibc reads it at start);
on a C library without ``mallopt`` or ``malloc_trim`` nothing changes.
Pure: no Twisted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from typing import Any

__all__ = ["TRIM_INTERVAL", "trim", "tune_malloc"]

#: Seconds between two :func:`trim` calls of a serving process.
TRIM_INTERVAL = 30.0

#: mallopt(3) parameters and the values given them.
_M_ARENA_MAX = -8
_SETTINGS = (("MALLOC_ARENA_MAX", _M_ARENA_MAX, 2),)


def _libc() -> Any:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None)
    except OSError:
        return None


_LIBC = _libc()


def tune_malloc(environ: dict[str, str] | None = None) -> list[str]:
    """Apply the settings above that the environment does not set; the
    names of those applied (none where there is no ``mallopt``)."""
    environ = dict(os.environ) if environ is None else environ
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return []
    applied = []
    for variable, parameter, value in _SETTINGS:
        if variable in environ:
            continue
        if mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            applied.append(variable)
    return applied


def trim() -> bool:
    """Hand the allocator's free pages back to the system; True when it
    released some."""
    malloc_trim = getattr(_LIBC, "malloc_trim", None)
    return bool(malloc_trim is not None and malloc_trim(0))
