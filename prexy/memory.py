"""How a serving process asks the C allocator to hand memory back.

A worker allocates and frees bodies of every size from a few hundred
bytes to megabytes, all day (decoded objects, compressed copies, ranges,
rewritten chunks).  glibc serves those above its mmap threshold with
their own mappings, returned to the system when freed, but it raises
that threshold to the size of each such block freed (up to 32 MB): after
a while every body comes from the heap, where the holes freed bodies
leave are reused only by bodies that fit, and the process's resident
memory creeps up long after what it keeps (its memos) stopped growing.
:func:`tune_malloc` fixes the threshold at 64 KB (so the large bodies are
always mappings of their own), trims the heap's free top above 1 MB, and
keeps two arenas (the reactor's thread and the thread pool's).

A variable ``MALLOC_*_`` the operator set wins (glibc reads it at
start); on a C library without ``mallopt`` nothing changes.  Pure: no
Twisted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["tune_malloc"]

#: mallopt(3) parameters and the values given them.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_SETTINGS = (
    ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, 64 * 1024),
    ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, 1024 * 1024),
    ("MALLOC_ARENA_MAX", _M_ARENA_MAX, 2),
)


def tune_malloc(environ: dict[str, str] | None = None) -> list[str]:
    """Apply the settings above that the environment does not set; the
    names of those applied (none where there is no ``mallopt``)."""
    environ = dict(os.environ) if environ is None else environ
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return []
    applied = []
    for variable, parameter, value in _SETTINGS:
        if variable in environ:
            continue
        if mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            applied.append(variable)
    return applied
