"""The client side of the proxy on twisted.web: the request class (the
connection and the site are ``prexy.proxy.site``'s).

Everything a response does goes through twisted.web's public request API
(``setResponseCode``, ``responseHeaders``, ``write``, ``registerProducer``,
``finish``, ``notifyFinish``), which Twisted's HTTP/2 stream implements
too.  Two things twisted.web has no API for live here, each behind one
function: response trailers (``ProxyRequest.finish``) and resetting the
client connection (``abort_client``).
"""

from __future__ import annotations

import io
import tempfile
from collections.abc import Iterable
from typing import Any, Protocol

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.http import HTTPChannel
from twisted.web.http_headers import Headers
from twisted.web.iweb import INonQueuedRequestFactory
from zope.interface import provider

from prexy.config import Timeouts
from prexy.errorpages import ErrorPages, phrase
from prexy.errorpages import error_answer as error_page
from prexy.metrics import Metrics
from prexy.requesthead import Head

_log = Logger("prexy")

#: Request bodies up to this size are spooled in memory, larger ones to disk.
SPOOL_IN_MEMORY = 1024 * 1024

#: Client protocols whose answers can end with trailer fields (an HTTP/1.1
#: chunked body; an HTTP/2 stream, whose request says ``HTTP/2``) and be
#: preceded by 1xx heads (``write_interim`` on the channel).
TRAILERS_OVER = frozenset({b"HTTP/1.1", b"HTTP/2"})


def start_response(request: Any, code: int, phrase: bytes | None, headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Set the status and the header pairs (in order, repeated names kept)."""
    request.setResponseCode(code, phrase or None)
    add = request.responseHeaders.addRawHeader
    for name, value in headers:
        add(name, value)


def write_whole(request: Any, body: bytes) -> None:
    """Write the head and all of the body: in one send on Prexy's HTTP/1.1
    connection (a cache hit), through the request's own writes elsewhere."""
    channel: Any = getattr(request, "channel", None)
    if isinstance(channel, HTTPChannel) and hasattr(channel, "hold_writes"):
        held: Any = channel  # prexy.proxy.site.ProxyChannel
        held.hold_writes()
        try:
            request.write(body)
        finally:
            held.release_writes()
    else:
        request.write(body)


def plain_answer(request: Any, code: int, body: bytes) -> None:
    """Answer with a short text/plain body and finish."""
    request.setResponseCode(code)
    request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
    request.setHeader(b"Content-Length", b"%d" % len(body))
    request.write(body)
    request.finish()


def error_answer(request: Any, status: int, pages: ErrorPages | None) -> None:
    """Prexy's own answer ``status`` (an upstream failure, a refused
    request...): the site's page for it, else the generic body, never the
    reason (that goes to the log).  Whatever head was being prepared for
    the upstream's answer is dropped: nothing of it was sent."""
    content_type, body = error_page(status, pages)
    request.reset_head()
    request.setResponseCode(status, phrase(status))
    request.setHeader(b"Content-Type", content_type)
    request.setHeader(b"Content-Length", b"%d" % len(body))
    request.write(body)
    request.finish()


def abort_client(request: Any) -> None:
    """Reset the client connection, or its HTTP/2 stream (never a clean end
    of a broken body)."""
    channel = getattr(request, "channel", None)
    if channel is not None and not isinstance(channel, HTTPChannel) and hasattr(channel, "abortConnection"):
        channel.abortConnection()  # an HTTP/2 stream: RST_STREAM
        return
    transport = getattr(channel, "transport", None)
    if transport is not None:
        transport.abortConnection()


class SiteOfRequest(Protocol):
    """What a ``ProxyRequest`` reads of its site (``prexy.proxy.site.ProxySite``)."""

    max_request_body: int
    reactor: Any
    metrics: Metrics
    active_requests: int
    resource: Any
    timeouts: Timeouts

    def served(self, channel: Any) -> None: ...


@provider(INonQueuedRequestFactory)
class ProxyRequest(server.Request):
    """A request that spools its body with a size limit, skips twisted.web's
    default headers (the upstream's Server, Date and Content-Type pass
    through unchanged) and its argument parsing, and can end a chunked
    response with trailer fields."""

    defaultContentType = None
    #: The client went away before the response was complete.
    gone = False
    _rejected = False
    _body_seen = 0
    _counted = False
    #: The exchange serving this request (told when the client goes).
    exchange: Any = None
    #: (target, host) for forwarding later (a coalesced waiter).
    prexy_forward: tuple[bytes, bytes | None] = (b"/", None)
    #: What the channel's head check found (``prexy.requesthead``).
    head: Head | None = None
    site: Any  # the ProxySite (prexy.proxy.site), which imports this module

    def __init__(self, channel: Any, queued: object = None) -> None:
        # ``queued``: what twisted.web's HTTP/2 stream passes (always False).
        super().__init__(channel)
        self._trailers: list[tuple[bytes, bytes]] = []
        self.proxy_site: SiteOfRequest = channel.site

    # -- the request body ----------------------------------------------------------

    def gotLength(self, length: int | None) -> None:
        limit = self.proxy_site.max_request_body
        if length is not None and length > limit:
            self._reject_too_large()
            return
        if length is not None and length <= SPOOL_IN_MEMORY:
            self.content = io.BytesIO()
        else:
            self.content = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)

    def handleContentChunk(self, data: bytes) -> None:
        if self._rejected:
            return
        self._body_seen += len(data)
        if self._body_seen > self.proxy_site.max_request_body:
            self._reject_too_large()
            return
        content: Any = self.content
        content.write(data)

    def _reject_too_large(self) -> None:
        """413 before the body is read (twisted.web would read it whole)."""
        self._rejected = True
        self.content = io.BytesIO()
        if not isinstance(self.channel, HTTPChannel):
            # An HTTP/2 stream (its length may come before the stream is
            # set up): the answer through the request in the next turn, then
            # the stream is reset (the rest of the body is not read).
            self.proxy_site.reactor.callLater(0, self._answer_too_large_h2)
            return
        content_type, body = error_page(413, self._site_pages())
        self.channel.write(
            b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: %s\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (content_type, len(body), body)
        )
        self.proxy_site.metrics.count("prexy_requests_total", status="413")
        self.channel.loseConnection()

    def _answer_too_large_h2(self) -> None:
        if self.finished or self.channel is None:
            return
        self.proxy_site.metrics.count("prexy_requests_total", status="413")
        content_type, body = error_page(413, self._site_pages())
        self.setResponseCode(413)
        self.setHeader(b"Content-Type", content_type)
        self.setHeader(b"Content-Length", b"%d" % len(body))
        self.write(body)
        stream: Any = self.channel
        stream.abortConnection()

    def _site_pages(self) -> ErrorPages:
        """The error pages of the site this request's Host names."""
        hosts = self.requestHeaders.getRawHeaders(b"host")
        pages: ErrorPages = self.proxy_site.resource.runtime.lookup(hosts[0] if hosts else None).config.error_pages
        return pages

    # -- processing -------------------------------------------------------------------

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        """twisted.web's requestReceived without its argument parsing: a
        proxy forwards the target and the body as bytes, so it never fills
        ``args`` from the query (work for nothing on every request) or from
        a form body (which twisted.web reads whole into memory, and answers
        400 itself when a multipart body does not parse)."""
        if self._rejected:
            return  # already answered 413; the connection is closing
        head = self.head
        if head is not None:
            # The target in origin-form; an absolute-form target's authority
            # wins over the Host header (RFC 9112 3.2.2).
            path = head.target
            if head.replace_host and head.host is not None:
                self.requestHeaders.setRawHeaders(b"host", [head.host])
        content: Any = self.content
        content.seek(0, 0)
        self.args = {}
        self.method, self.uri = command, path
        self.clientproto = version
        self.path = path.split(b"?", 1)[0]
        self.process()

    def process(self) -> None:
        """Render without twisted.web's default Server and Date headers."""
        site = self.proxy_site
        site.active_requests += 1
        self._counted = True
        self.site = site
        self.prepath = []
        self.postpath = []
        try:
            self.render(site.resource)
        except BaseException:
            self.processingFailed(Failure())

    def processingFailed(self, reason: Failure) -> Failure:
        """An exception while routing the request: logged with its
        traceback; the client gets a 500 (the site's page, else a generic
        body, never the traceback), or a reset once its answer began."""
        _log.failure("internal error while routing {uri}", reason, uri=self.uri.decode("latin-1"))
        if self.finished or self.gone:
            return reason
        if self.startedWriting:
            abort_client(self)
        else:
            error_answer(self, 500, self._site_pages())
        return reason

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.proxy_site.active_requests -= 1

    def connectionLost(self, reason: Failure) -> None:
        exchange = self.exchange
        if not self.finished:
            self.gone = True
            self._uncount()
        super().connectionLost(reason)
        if exchange is not None and not self.finished:
            exchange.client_gone(reason)

    # -- the response -------------------------------------------------------------------

    def add_trailer(self, name: bytes, value: bytes) -> None:
        """A trailer field, sent after the last chunk (chunked responses
        only; announce it with a ``Trailer`` header)."""
        self._trailers.append((name, value))

    def reset_head(self) -> None:
        """Forget the response head set so far (status, header fields,
        trailers): another answer replaces it before anything was sent."""
        assert not self.startedWriting, "the head went out already"
        self.responseHeaders = Headers()
        self._trailers = []
        self.setResponseCode(200)

    def finish(self, last: bytes = b"") -> None:
        """End the response; ``last``: its last body bytes, which go out
        in the same write as the end of a chunked body."""
        if not self.finished and not self.gone:
            if not self.startedWriting:
                self.write(b"")  # the head, so that framing is decided
            if self.chunked and (last or self._trailers):
                # twisted.web ends a chunked body with an empty trailer
                # section, in a write of its own; write the last chunk, the
                # end and our trailer section at once instead.
                fields = b"".join(b"%s: %s\r\n" % pair for pair in self._trailers)
                chunk = b"%x\r\n%s\r\n0\r\n" % (len(last), last) if last else b"0\r\n"
                self.sentLength += len(last)
                self.channel.write(chunk + fields + b"\r\n")
                self.chunked = False
            else:
                if last:
                    self.write(last)
                if self._trailers and hasattr(self.channel, "send_trailers"):
                    self.channel.send_trailers(self._trailers)  # an HTTP/2 stream: a last HEADERS frame
        elif last:
            self.write(last)  # (after the client left: twisted.web drops it)
        self.exchange = None
        self.proxy_site.served(self.channel)
        metrics = self.proxy_site.metrics
        metrics.count_status(self.code)
        metrics.count_protocol(self.clientproto)
        self._uncount()
        super().finish()


class DetachedRequest:
    """Stands in for a client in a background refresh: the fetched body only
    goes into the cache."""

    channel = None
    gone = False
    startedWriting = False
    finished = False
    content = None
    code = 200
    exchange: Any = None

    def __init__(self, original: Any) -> None:
        self.method = b"GET"
        self.uri = original.uri
        self.requestHeaders = original.requestHeaders
        self.responseHeaders = Headers()
        self.clientproto = b"HTTP/1.1"
        self.client = original.getClientAddress()
        self.secure = original.isSecure()
        self.host = original.getHost()

    def getClientAddress(self) -> Any:
        return self.client

    def getHost(self) -> Any:
        return self.host

    def isSecure(self) -> bool:
        return self.secure

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code

    def setHeader(self, name: bytes, value: bytes) -> None:
        pass

    def add_trailer(self, name: bytes, value: bytes) -> None:
        pass

    def reset_head(self) -> None:
        self.responseHeaders = Headers()

    def write(self, data: bytes) -> None:
        self.startedWriting = True

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def finish(self, last: bytes = b"") -> None:
        self.finished = True
