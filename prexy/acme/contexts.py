"""The ACME sites' certificates on a process's ``ssl:`` listeners.

A worker never orders: at a handshake for a name of a ``tls = "acme"``
site it reads that name's certificate from the machine's storage (the one
file, :meth:`prexy.acme.storage.Storage.load`) the first time, makes its
OpenSSL context and keeps it in a small memo bounded to the most recently
used names, so the handshakes that follow read nothing from disk.  A name
with no certificate yet is remembered too (the handshake goes on with the
default certificate, and the next one does not look again).  When the
issuing process stores a certificate (first issue or renewal) it says so
(the master's ``{"certificate": NAME}`` command to its workers, or the
manager's watcher in a single process): :meth:`AcmeContexts.forget` drops
the name, and the next handshake reads the new file.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.logger import Logger

from prexy.acme.policy import BadName, normalize_name
from prexy.acme.storage import Storage, StorageError
from prexy.certs import Certificate, CertificateError, load_certificate

log = Logger()

#: What the memo holds for a name with no usable certificate.
_NONE: Any = None


class AcmeContexts:
    """Contexts of the stored certificates, by name, made by ``make``
    (:meth:`prexy.sni.ServerCertificates.context`); at most ``size`` names
    remembered."""

    def __init__(self, storage: Path | str, make: Callable[[Certificate], Any], size: int = 1000) -> None:
        self.storage = Storage(storage)
        self.make = make
        self.size = size
        self._memo: OrderedDict[str, Any] = OrderedDict()
        #: Files read (the memo's misses): what a test and a curious
        #: operator look at.
        self.reads = 0

    def context(self, name: str | bytes) -> Any:
        """The context of ``name``'s stored certificate, None when there is
        none (or it cannot be used: logged, remembered as none)."""
        try:
            key = normalize_name(name)
        except BadName:
            return None
        if key in self._memo:
            self._memo.move_to_end(key)
            return self._memo[key]
        found = self._read(key)
        self._memo[key] = found
        while len(self._memo) > self.size:
            self._memo.popitem(last=False)
        return found

    def _read(self, name: str) -> Any:
        self.reads += 1
        try:
            stored = self.storage.load(name)
            if stored is None:
                return _NONE
            context = self.make(load_certificate(stored.chain_pem, stored.key_pem))
        except (StorageError, CertificateError) as e:
            log.error("ACME: the stored certificate of {name} cannot be served: {reason}", name=name, reason=str(e))
            return _NONE
        log.info("ACME: serving the stored certificate of {name}", name=name)
        return context

    def forget(self, name: str) -> None:
        """``name``'s certificate changed: read it again at its next handshake."""
        try:
            self._memo.pop(normalize_name(name), None)
        except BadName:
            pass

    def clear(self) -> None:
        self._memo.clear()

    def __len__(self) -> int:
        return len(self._memo)
