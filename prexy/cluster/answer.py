"""The answer to a PURGE or a ban in a cluster: sent once the cluster's note
is known (every live node applied it, or the wait ran out, or Redis is away).

Kept apart from ``prexy.cluster.node`` so the proxy's cache layer can use it
without importing the Redis side."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.logger import Logger

log = Logger()


def answer_with_note(request: Any, note: defer.Deferred[bytes], text: bytes) -> Any:
    """Answer ``request`` with ``text`` and the cluster's note once ``note``
    fires (unless the client went away meanwhile); for a resource's
    ``render``: returns NOT_DONE_YET."""
    from twisted.web import server

    lost: list[bool] = []
    request.notifyFinish().addErrback(lambda _: lost.append(True))

    def answer(line: bytes) -> None:
        if lost or request.finished:
            return
        body = text + line
        request.setHeader(b"content-length", b"%d" % len(body))
        request.write(body)
        request.finish()

    note.addCallback(answer)
    note.addErrback(lambda f: log.failure("cluster: answering after an invalidation failed", f))
    return server.NOT_DONE_YET

