"""The admin endpoint: health, Prometheus metrics and reload.

Bound separately from the proxy ports (loopback by default) so it is never
reachable through a site.
"""

from __future__ import annotations

from typing import Any

from twisted.web import resource, server

from prexy.metrics import render


class AdminResource(resource.Resource):
    """``GET /health``, ``GET /metrics``, ``POST /reload``."""

    isLeaf = True

    def __init__(self, owner: Any) -> None:
        super().__init__()
        self.owner = owner

    def render(self, request: server.Request) -> bytes:
        path = request.path
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        if path == b"/health":
            return b"ok\n"
        if path == b"/metrics":
            request.setHeader(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")
            collect = getattr(self.owner, "collect_metrics", None)
            if collect is not None:
                return collect()
            return render([self.owner.metrics])
        if path == b"/reload":
            if request.method != b"POST":
                request.setResponseCode(405)
                request.setHeader(b"allow", b"POST")
                return b"use POST /reload\n"
            ok = self.owner.reload()
            if not ok:
                request.setResponseCode(409)
                return b"reload refused: the configuration has errors (see the log); the old one keeps serving\n"
            return b"reloaded\n"
        request.setResponseCode(404)
        return b"not found: try /health, /metrics, POST /reload\n"
