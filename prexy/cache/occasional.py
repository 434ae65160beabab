"""The store for a process that uses it now and then: mapped only while in use.

A worker reads the store on every request and keeps it open.  The master
uses it only for the operator's and the fleet's invalidations (a PURGE, a
ban, emptying it) and for the levels ``/metrics`` shows.  A ban scans every
object, so a store kept open by the master would count in its resident
memory every page of the store's file a scan ever read (up to the map's
size, twice the store's), though those pages are the workers' and are not
the master's own.  :class:`OccasionalStore` opens the store for each call
and closes it once no call is in progress, so the master maps its file
only while it works on it.  Calls may come from several threads (the
reactor's thread pool runs bans and purges): a lock keeps the count of
calls in progress and the opening and closing in step.  Pure: no Twisted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["OccasionalStore"]


class OccasionalStore:
    """The store's invalidations and levels (``purge_url``, ``ban``,
    ``clear``, ``stats``), each with the store opened by ``open`` for the
    call and closed after the last call in progress."""

    def __init__(self, open: Callable[[], Any]) -> None:
        self._open = open
        self._lock = threading.Lock()
        self._store: Any = None
        self._users = 0
        #: How many times the store was opened (for tests and curiosity).
        self.opened = 0

    @property
    def is_open(self) -> bool:
        return self._store is not None

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            if self._store is None:
                self._store = self._open()
                self.opened += 1
            self._users += 1
            store = self._store
        try:
            return getattr(store, name)(*args)
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._store = None
                    store.close()

    def purge_url(self, site: str, url: bytes) -> int:
        return int(self._call("purge_url", site, url))

    def ban(self, ban: Any) -> int:
        return int(self._call("ban", ban))

    def clear(self) -> None:
        self._call("clear")

    def stats(self) -> dict[str, int]:
        return dict(self._call("stats"))

    def close(self) -> None:
        """Nothing stays open between calls; here for the store's interface."""
