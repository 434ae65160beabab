"""Notices between the workers of one machine that a cache fetch is over.

A worker that finds another worker fetching a key (the store's claim) waits
for the object instead of fetching it again.  The fetching worker, when it
is done (stored or not), sends the key as one datagram to every worker's
UNIX socket in a shared directory (beside the store); a waiting worker
looks in the store when the notice arrives.  A notice can be lost (a full
socket buffer, a worker that started meanwhile), so a waiter also looks
again after ``fallback`` seconds, at most, growing up to ``MAX_FALLBACK``:
the wait is driven by the notice, and bounded without it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

from twisted.internet.protocol import DatagramProtocol
from twisted.logger import Logger

log = Logger()

SUFFIX = ".sock"
#: The longest a waiter goes without looking in the store.
MAX_FALLBACK = 1.0


class KeyEvents(DatagramProtocol):
    """This worker's end: announce keys, and wait for other workers' notices."""

    def __init__(self, reactor: Any, directory: str, name: str) -> None:
        self.reactor = reactor
        self.directory = directory
        self.path = os.path.join(directory, name + SUFFIX)
        self.waiters: dict[bytes, list[Callable[[], None]]] = {}
        self.port: Any = None

    def start(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        if os.path.exists(self.path):
            os.unlink(self.path)  # left by a worker of the same name that died
        self.port = self.reactor.listenUNIXDatagram(self.path, self)

    def stop(self) -> None:
        if self.port is not None:
            self.port.stopListening()
            self.port = None
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def announce(self, key: bytes) -> None:
        """Tell every other worker that the fetch of ``key`` is over."""
        if self.port is None:
            return
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            path = os.path.join(self.directory, name)
            if not name.endswith(SUFFIX) or path == self.path:
                continue
            try:
                self.port.write(key, path)
            except OSError as exc:
                if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    # Nobody listens there any more: a worker that is gone.
                    try:
                        os.unlink(path)
                    except OSError:
                        pass
                else:
                    log.warn("cache notice to {path} not sent: {why}", path=path, why=exc)

    def datagramReceived(self, datagram: bytes, addr: Any) -> None:
        for callback in self.waiters.pop(datagram, ()):
            callback()

    def wait(self, key: bytes, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once when a notice for ``key`` arrives; returns a
        function that forgets the wait."""
        self.waiters.setdefault(key, []).append(callback)

        def forget() -> None:
            callbacks = self.waiters.get(key)
            if callbacks is not None and callback in callbacks:
                callbacks.remove(callback)
                if not callbacks:
                    del self.waiters[key]

        return forget


class NoEvents:
    """Stands in when no notices are set up (tests, one process): waiters
    rely on their fallback looks alone."""

    def announce(self, key: bytes) -> None:
        pass

    def wait(self, key: bytes, callback: Callable[[], None]) -> Callable[[], None]:
        return lambda: None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass
