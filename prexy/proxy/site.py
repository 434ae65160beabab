"""The site every listener serves: ``ProxySite``, the factory of the
HTTP/1.x connections (``prexy.proxy.h1connection.ProxyChannel``) and,
through ``prexy.proxy.http2``, of HTTP/2 ones.  The request they make is
``prexy.proxy.request.ProxyRequest``.
"""

from __future__ import annotations

import weakref
from typing import Any

from twisted.logger import Logger
from twisted.web import server

from prexy.config import Limits, Timeouts
from prexy.errorpages import ErrorPages
from prexy.h2settings import H2Settings
from prexy.logformat import LogBudget
from prexy.metrics import Metrics
from prexy.observe.stats import Observer
from prexy.proxy.h1connection import ProxyChannel, refusal_answer
from prexy.proxy.hitpath import HitPath
from prexy.proxy.request import ProxyRequest
from prexy.requesthead import Refusal

__all__ = ["ProxyChannel", "ProxySite", "refusal_answer"]

_log = Logger("prexy")


class ProxySite(server.Site):
    """The HTTP factory for the proxy: our request class, access log in
    combined log format, request body limit, and the open connections for
    a graceful stop."""

    requestFactory = ProxyRequest  # type: ignore[assignment]
    #: HTTP/1.1 only for now: twisted.web's default wraps the channel to
    #: offer HTTP/2 when h2 is installed, which the proxy does not use yet.
    protocol = ProxyChannel  # type: ignore[assignment]
    noisy = False

    def __init__(
        self,
        resource: Any,
        max_request_body: int,
        metrics: Metrics,
        log_path: str | None = None,
        reactor: Any = None,
        timeout: float = 75.0,
        limits: Limits = Limits(),
        timeouts: Timeouts = Timeouts(),
        observer: Observer | None = None,
    ) -> None:
        super().__init__(resource, logPath=log_path, timeout=timeout, reactor=reactor)
        self.max_request_body = max_request_body
        self.metrics = metrics
        #: Per-site and per-rule counters, and the live log (prexy.observe).
        self.observer: Observer = observer if observer is not None else resource.observer
        #: Head sizes and client deadlines for new connections (a reload
        #: replaces them).
        self.limits = limits
        self.timeouts = timeouts
        self._refusals_log = LogBudget()
        #: Fresh cache hits answered on the HTTP/1.x connection (None: off).
        self.hits: HitPath | None = HitPath(resource)
        self.active_requests = 0
        #: connection -> when it was accepted (an HTTP/1.x channel says
        #: itself whether it has answered a request: ``served``)
        self._channels: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()

    #: The limits of HTTP/2 connections (``[http2]``; a reload replaces them).
    h2_settings = H2Settings()

    def buildProtocol(self, addr: Any) -> Any:
        # (A TLS listener that offers HTTP/2 builds its connections through
        # prexy.proxy.http2.NegotiatedFactory instead.)
        return self.http1_channel(addr)

    def http1_channel(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        self._channels[protocol] = self.reactor.seconds()
        return protocol

    def http2_connection(self) -> Any:
        """An HTTP/2 connection serving this site (``prexy.proxy.http2``)."""
        from prexy.proxy.http2 import http2_connection

        connection = http2_connection(self)
        self._channels[connection] = self.reactor.seconds()
        return connection

    def refused(self, channel: Any, refusal: Refusal) -> None:
        """A head was refused: count it, and log one line (at most ten a
        second; the rest are counted in the next line)."""
        self.metrics.count_status(refusal.status)
        left_out = self._refusals_log.take(self.reactor.seconds())
        if left_out is None:
            return
        peer = getattr(channel.getPeer(), "host", "unix")
        more = f" ({left_out} more not logged)" if left_out else ""
        _log.info(
            "refused a request from {peer}: {status} {reason}{more}",
            peer=peer, status=refusal.status, reason=refusal.reason, more=more,
        )

    def error_pages(self) -> ErrorPages:
        """The pages of answers made before a site is chosen (a refused
        request head): the default site's, as nginx's default server
        answers a request it cannot route."""
        pages: ErrorPages = self.resource.runtime.default.config.error_pages
        return pages

    def open_connections(self) -> int:
        """Client connections still open."""
        return sum(1 for channel in list(self._channels) if getattr(channel.transport, "connected", False))

    def close_idle_connections(self, fresh_grace: float = 2.0) -> None:
        """Graceful shutdown: make busy connections close after their
        response, close idle keep-alive ones, and give connections accepted
        moments ago ``fresh_grace`` seconds to send their first request."""
        now = self.reactor.seconds()
        for channel, created in list(self._channels.items()):
            transport = channel.transport
            if transport is None:
                continue
            channel.drain(not channel.served and now - created < fresh_grace)
