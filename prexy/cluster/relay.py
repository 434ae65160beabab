"""A worker's invalidations through its node's master (a worker has no
Redis connection): :class:`WorkerRelay` sends a PURGE or ban to the master
over the control pipe, :func:`relay_worker_message` (in the master)
publishes it with the node's ``ClusterService`` and tells the worker the
verdict, a datagram on the worker's cache-events socket, which the relay's
answer waits for.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

from prexy.cluster.messages import BanScope, Invalidation, Kind
from prexy.cluster.node import QUEUED_NOTE, ClusterService, store_path

__all__ = ["WorkerRelay", "from_json", "relay_worker_message", "to_json", "verdict_key", "verdict_of"]

log = Logger()


def verdict_key(ticket: int, verdict: str) -> bytes:
    """The datagram the master sends a worker about its invalidation ``ticket``."""
    return b"\0prexy-cluster %d %s" % (ticket, verdict.encode("ascii"))


VERDICTS = {
    "all": b"cluster: applied by every live node\n",
    "some": b"cluster: not confirmed by every node in time (see the master's log)\n",
    "queued": QUEUED_NOTE,
}


def verdict_of(note: bytes) -> str:
    if note == QUEUED_NOTE:
        return "queued"
    return "all" if b"not confirmed" not in note else "some"


class WorkerRelay:
    """A worker's ``announce``: the invalidation goes to the master over
    the control pipe (``send``); the answer waits for the master's verdict,
    a datagram on this worker's cache-events socket (``events.wait``), at
    most ``timeout`` seconds."""

    def __init__(self, reactor: Any, send: Callable[[dict[str, Any]], None], events: Any, timeout: float) -> None:
        self.reactor = reactor
        self.send = send
        self.events = events
        self.timeout = timeout
        self.tickets = 0

    def __call__(self, invalidation: Invalidation) -> defer.Deferred[bytes]:
        self.tickets += 1
        ticket = self.tickets
        d: defer.Deferred[bytes] = defer.Deferred()
        forgets: list[Callable[[], None]] = []

        def settle(note: bytes) -> None:
            for forget in forgets:
                forget()
            if timer.active():
                timer.cancel()
            if not d.called:
                d.callback(note)

        for verdict, note in VERDICTS.items():
            forgets.append(self.events.wait(verdict_key(ticket, verdict), lambda note=note: settle(note)))
        timer = self.reactor.callLater(
            self.timeout, settle, b"cluster: no word from the master in %g s\n" % self.timeout
        )
        self.send({"cluster": to_json(invalidation), "ticket": ticket})
        return d


def to_json(invalidation: Invalidation) -> dict[str, Any]:
    out = {"kind": invalidation.kind.value, "site": invalidation.site,
           "subject": invalidation.subject.decode("latin-1")}
    if invalidation.kind is Kind.BAN:
        out.update(host=invalidation.host, host_regex=invalidation.host_regex, match=invalidation.scope.value)
    return out


def from_json(data: Any) -> Invalidation:
    """The inverse of :func:`to_json`; ValueError when it is not one."""
    if not isinstance(data, dict):
        raise ValueError("not an object")
    kind = Kind(data.get("kind"))
    site = data.get("site")
    subject = data.get("subject", "")
    host = data.get("host")
    host_regex = data.get("host_regex")
    scope = BanScope(data.get("match", BanScope.TARGET.value))
    if (site is not None and not isinstance(site, str)) or not isinstance(subject, str):
        raise ValueError("bad site or subject")
    if any(x is not None and not isinstance(x, str) for x in (host, host_regex)):
        raise ValueError("bad host or host_regex")
    return Invalidation(kind, site, subject.encode("latin-1"), host, scope, host_regex)


def tell_worker(path: str, datagram: bytes) -> None:
    """Send one datagram to a worker's events socket (lost if it is gone)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.sendto(datagram, path)
    except OSError:
        pass


def relay_worker_message(cluster: ClusterService, config: Any, pid: int | None, message: dict[str, Any]) -> None:
    """The master's side of :class:`WorkerRelay`: publish a worker's
    invalidation, then tell that worker the verdict."""
    path = store_path(config)
    try:
        invalidation = from_json(message["cluster"])
        ticket = int(message["ticket"])
    except (KeyError, TypeError, ValueError):
        log.warn("cluster: a worker sent a malformed invalidation: {m!r}", m=message)
        return
    d = cluster.publish(invalidation)
    if path is not None and pid is not None:
        sock = os.path.join(path + ".events", f"{pid}.sock")
        d.addCallback(lambda note: tell_worker(sock, verdict_key(ticket, verdict_of(note))))
    d.addErrback(lambda f: log.failure("cluster: publishing a worker's invalidation failed", f))
