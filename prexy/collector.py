"""Python's cyclic garbage collector around configuration loads.

Loading thousands of sites makes hundreds of thousands of objects that
live as long as the configuration; the collector, triggered by the
allocations themselves, traverses them again and again while they are
made, and on every later collection of the oldest generation.  Measured
on 10,000 sites of 20 rules (the master's load): 2.9 s of CPU with the
collector on, 2.4 s with it paused; a one-site reload after the start,
0.40 s, 0.21 s once the start's objects are frozen.

:func:`paused` holds the collector off while a load runs (what it leaves
to collect is collected at the next collection); :func:`settle` moves
every object alive at the end of a process's start into the permanent
generation (``gc.freeze``), which later collections skip; ``paused(settle=True)``
does it as the start's load ends, before the collector resumes (else its
first collection would traverse everything the load made, young as it is:
0.12 s of the master's start with 10,000 sites).  Freezing is
done once per process, at start: an object frozen then that a reload
replaces is freed when no longer referenced, but never collected if it
sits in a reference cycle, so only the start's objects (a bounded set)
are frozen, never a reload's.  No Twisted here.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused", "settle"]


@contextmanager
def paused(settle: bool = False) -> Iterator[None]:
    """The collector off inside (as it was, after).  ``settle``: the load
    inside is the process's start; what is alive when it ends without an
    error is frozen (:func:`settle`) before the collector resumes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        if settle:
            gc.freeze()
    finally:
        if enabled:
            gc.enable()


def settle() -> None:
    """The objects alive now (a process's configuration, at start) are
    left out of every later collection.  No collection first (one over
    the whole heap would cost a tenth of a second of the start): what the
    start left in cycles stays, once."""
    gc.freeze()
