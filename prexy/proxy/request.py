"""The client side of the proxy on twisted.web: the request class (the
connection and the site are ``prexy.proxy.site``'s, the HTTP/2 stream
``prexy.proxy.h2connection``'s) and the stand-in for a client that left.

Both are ``prexy.proxy.client.IClient``, all the exchange and the cache
layer see of a client.  Everything a response does goes through
twisted.web's public request API (``setResponseCode``, ``responseHeaders``,
``write``, ``registerProducer``, ``finish``, ``notifyFinish``), which
Prexy's HTTP/2 stream serves too; what twisted.web has no API for
(trailers, 1xx heads, a reset, a head and body in one send) goes to the
channel's ``IClientChannel`` methods, one call each, never a probe.
"""

from __future__ import annotations

import io
import tempfile
import warnings
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from twisted.logger import Logger
from twisted.python.failure import Failure
from twisted.web import server
from twisted.web.http import NO_BODY_CODES, datetimeToString, toChunk
from twisted.web.http_headers import Headers
from twisted.web.iweb import INonQueuedRequestFactory
from zope.interface import implementer, provider

from prexy.config import Timeouts
from prexy.errorpages import ErrorPages, phrase
from prexy.errorpages import error_answer as error_page
from prexy.headervars import HeaderLookup, RequestVars
from prexy.metrics import Metrics
from prexy.observe.stats import Observer
from prexy.proxy.client import NONE, IClient, IClientChannel
from prexy.proxy.headers import RequestHeaders, ResponseHeaders
from prexy.requesthead import Head
from prexy.runtime import SiteRuntime

_log = Logger("prexy")

#: Request bodies up to this size are spooled in memory, larger ones to disk.
SPOOL_IN_MEMORY = 1024 * 1024

def start_response(request: IClient, code: int, phrase: bytes | None, headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Set the status and the header pairs (in order, repeated names kept)."""
    request.setResponseCode(code, phrase or None)
    fields = request.responseHeaders
    if type(fields) is ResponseHeaders:
        fields.extend(headers)
        return
    add = fields.addRawHeader
    for name, value in headers:
        add(name, value)


def plain_answer(request: IClient, code: int, body: bytes) -> None:
    """Answer with a short text/plain body and finish."""
    request.setResponseCode(code)
    request.setHeader(b"Content-Type", b"text/plain; charset=utf-8")
    request.setHeader(b"Content-Length", b"%d" % len(body))
    request.write(body)
    request.finish()


def request_vars(request: IClient, site: SiteRuntime) -> RequestVars:
    """The header directives' variables for this request (``RequestVars.of``)."""
    values = request.requestHeaders.getRawHeaders(b"host")
    return client_vars(
        site, values[0] if values else b"", request.isSecure(), request.getHost(), request.getClientAddress(),
        request.method, request.uri, request.clientproto, _HeaderValues(request.requestHeaders),
    )


def client_vars(
    site: SiteRuntime, http_host: bytes, secure: bool, local: Any, client: Any,
    method: bytes, uri: bytes, protocol: bytes, headers: HeaderLookup,
) -> RequestVars:
    """The header directives' variables from a request's parts: its Host
    value (b"" if none), whether it came over TLS, the local and the
    client's address, its method, target, protocol and header lookup."""
    return RequestVars.of(
        http_host=http_host, secure=secure,
        local_host=str(getattr(local, "host", "localhost")), local_port=getattr(local, "port", 0),
        proxy_host=site.config.upstream.host_header,
        remote_host=str(getattr(client, "host", "") or ""), remote_port=getattr(client, "port", None),
        method=method, uri=uri, protocol=protocol, headers=headers,
    )


class _HeaderValues:
    """A request's headers read in place by ``$http_NAME`` (only the names
    a directive asks for), instead of copying every header per answer."""

    __slots__ = ("headers",)

    def __init__(self, headers: Headers) -> None:
        self.headers = headers

    def get(self, name: bytes) -> Sequence[bytes] | None:
        return self.headers.getRawHeaders(name)


def edit_head(
    request: IClient, site: SiteRuntime, code: int, headers: list[tuple[bytes, bytes]], own: bool = False,
) -> list[tuple[bytes, bytes]]:
    """An answer's head with the site's ``add_header`` and
    ``proxy_hide_header`` applied (``prexy.headeredits``); ``own``: Prexy's
    own error answer.  ``headers`` itself when the site has none."""
    edits = site.header_rules.edits
    if not (edits.always if own else edits.responds):
        return headers
    return edits.respond(headers, code, request_vars(request, site), own)


def error_answer(request: IClient, status: int, pages: ErrorPages | None, site: SiteRuntime | None = None) -> None:
    """Prexy's own answer ``status`` (an upstream failure, a refused
    request...): the site's page for it, else the generic body, never the
    reason (that goes to the log), with the ``site``'s ``add_header ...
    always``.  Whatever head was being prepared for the upstream's answer
    is dropped: nothing of it was sent."""
    content_type, body = error_page(status, pages)
    request.reset_head()
    request.setResponseCode(status, phrase(status))
    request.setHeader(b"Content-Type", content_type)
    request.setHeader(b"Content-Length", b"%d" % len(body))
    if site is not None:
        start_response(request, status, phrase(status), edit_head(request, site, status, [], own=True))
    request.write(body)
    request.finish()


class SiteOfRequest(Protocol):
    """What a ``ProxyRequest`` reads of its site (``prexy.proxy.site.ProxySite``)."""

    max_request_body: int
    reactor: Any
    metrics: Metrics
    observer: Observer
    active_requests: int
    resource: Any
    timeouts: Timeouts

    def log(self, request: Any) -> None: ...


@implementer(IClient)
@provider(INonQueuedRequestFactory)
class ProxyRequest(server.Request):
    """A client's request on any of its channels (``IClientChannel``:
    HTTP/1.x ``ProxyChannel``, HTTP/2 ``StreamChannel``) that spools its
    body with a size limit, skips twisted.web's default headers (the
    upstream's Server, Date and Content-Type pass through unchanged) and
    its argument parsing, and can end its answer with trailer fields."""

    defaultContentType = None
    #: The client went away before the response was complete.
    gone = False
    #: What the client can be sent (``prexy.proxy.client.Capabilities``):
    #: nothing but a head and a body until the request line is in.
    trailers = NONE.trailers
    interim = NONE.interim
    tunnel = NONE.tunnel
    detached = False
    _rejected = False
    _body_seen = 0
    _counted = False
    #: The exchange serving this request (told when the client goes).
    exchange: Any = None
    #: The cache's lookup made by the HTTP/1.x hit path (``IClient.looked``).
    looked: Any = None
    #: What the HTTP/1.x channel's head check found (``prexy.requesthead``).
    head: Head | None = None
    # What the request did (IClient's, for prexy.observe), and when it began.
    site_name = "-"
    cache_status = "-"
    upstream_seconds: float | None = None
    bytes_in = 0
    rewrite: Any = None
    started = 0.0
    has_body = False
    #: The head went out and no body follows it (HEAD, 204, 304).
    _no_body = False
    site: Any  # the ProxySite (prexy.proxy.site), which imports this module
    #: The connection or stream (None once the connection is lost); twisted.web
    #: says an HTTPChannel, which an HTTP/2 stream is not.
    channel: IClientChannel  # type: ignore[assignment]

    def __init__(self, channel: Any, queued: object = None) -> None:
        # ``queued``: what twisted.web's HTTP/2 stream passes (always False).
        # The state twisted.web's Request.__init__ sets (and Componentized's),
        # without the two Headers tables it would build only to have them
        # replaced here, and without its form parsing (never done).
        self.notifications: list[Any] = []
        self.channel = channel
        self.client = channel.getPeer()
        self.host = channel.getHost()
        self.transport = channel.transport
        self.queued = False
        self._parsePOSTFormSubmission = False
        self._adapterCache: dict[str, Any] = {}
        self.received_cookies: dict[bytes, bytes] = {}
        self.cookies: list[bytes] = []
        self.responseHeaders = ResponseHeaders()  # type: ignore[assignment]
        #: Filled by the channel (the HTTP/1.x one sets a table built from
        #: the parsed head at once).
        self.requestHeaders = RequestHeaders()  # type: ignore[assignment]
        self._trailers: list[tuple[bytes, bytes]] = []
        self.proxy_site: SiteOfRequest = channel.site

    # -- the request body ----------------------------------------------------------

    def gotLength(self, length: int | None) -> None:
        # Every channel calls this once the head is in: None for a length
        # not known in advance (chunked, an HTTP/2 stream still open).
        self.has_body = length is None or length > 0
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
        self.channel.body_too_large(self)

    def site_pages(self) -> ErrorPages:
        """The error pages of the site this request's Host names."""
        return self._site().config.error_pages

    def _site(self) -> SiteRuntime:
        """The site this request's Host names."""
        hosts = self.requestHeaders.getRawHeaders(b"host")
        site: SiteRuntime = self.proxy_site.resource.runtime.lookup(hosts[0] if hosts else None)
        return site

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
        can = self.channel.capabilities(version)
        self.trailers, self.interim, self.tunnel = can.trailers, can.interim, can.tunnel
        self.path = path.split(b"?", 1)[0]
        self.process()

    def process(self) -> None:
        """Render without twisted.web's default Server and Date headers."""
        site = self.proxy_site
        site.active_requests += 1
        self._counted = True
        self.started = site.reactor.seconds()
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
            self.abort()
        else:
            site = self._site()
            error_answer(self, 500, site.config.error_pages, site)
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

    def write_interim(self, code: int, phrase: bytes, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """A 1xx head before the answer's own (where ``interim``)."""
        channel = self.channel
        if channel is not None and not self.startedWriting:
            channel.write_interim(code, phrase, headers)

    def write_whole(self, body: bytes) -> None:
        """Write the head and all of the body in one send: the channel
        holds its writes meanwhile (a cache hit)."""
        channel = self.channel
        if channel is None:
            self.write(body)  # (the client left: twisted.web drops it)
            return
        channel.hold_writes()
        try:
            self.write(body)
        finally:
            channel.release_writes()

    def abort(self) -> None:
        """Reset the client connection, or its HTTP/2 stream (never a clean
        end of a broken body)."""
        channel = self.channel
        if channel is not None:
            channel.abortConnection()

    def unregisterProducer(self) -> None:
        if self.channel is not None:  # (once the connection is lost there is nobody to tell)
            super().unregisterProducer()
        self.producer = None

    def add_trailer(self, name: bytes, value: bytes) -> None:
        """A trailer field, sent after the last chunk (chunked responses
        only; announce it with a ``Trailer`` header)."""
        self._trailers.append((name, value))

    def reset_head(self) -> None:
        """Forget the response head set so far (status, header fields,
        trailers): another answer replaces it before anything was sent."""
        assert not self.startedWriting, "the head went out already"
        self.responseHeaders = ResponseHeaders()  # type: ignore[assignment]
        self._trailers = []
        self.setResponseCode(200)

    def write(self, data: bytes) -> None:
        """twisted.web's ``Request.write`` in one step: the first write
        sends the head (chunked framing for an HTTP/1.1 answer with a body
        and no Content-Length), then ``data``.  twisted.web goes through
        ``server.Request.write`` (a default Content-Type, which the proxy
        never sets, and a content encoder it never has) and reads the
        header table three times; the fields are asked for once here."""
        if self._no_body:
            return  # a HEAD's answer, a 204 or 304: the head is all
        if self.finished:
            raise RuntimeError("Request.write called on a request after Request.finish was called.")
        if self._disconnected:
            return  # the client left: twisted.web drops it too (finish raises)
        if not self.startedWriting:
            self.startedWriting = 1
            version = self.clientproto
            code = self.code
            headers = self.responseHeaders
            bodiless = self.method == b"HEAD" or code in NO_BODY_CODES
            if version == b"HTTP/1.1" and not bodiless and not headers.hasHeader(b"content-length"):
                headers.setRawHeaders(b"Transfer-Encoding", [b"chunked"])
                self.chunked = 1
            if self.lastModified is not None:
                if headers.hasHeader(b"Last-Modified"):
                    _log.info("Warning: last-modified specified both in header list and lastModified attribute.")
                else:
                    headers.setRawHeaders(b"Last-Modified", [datetimeToString(self.lastModified)])
            if self.etag is not None:
                headers.setRawHeaders(b"ETag", [self.etag])
            if self.cookies:
                headers.setRawHeaders(b"Set-Cookie", self.cookies)
            self.channel.writeHeaders(version, b"%d" % code, self.code_message, headers)
            if bodiless:
                self._no_body = True
                return
        self.sentLength += len(data)
        if data:
            if self.chunked:
                self.channel.writeSequence(toChunk(data))
            else:
                self.channel.write(data)

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
                if self._trailers:
                    # The channel's own end (an HTTP/2 stream's last HEADERS
                    # frame); HTTP/1.x has no place for them after a length.
                    self.channel.send_trailers(self._trailers)
        elif last:
            self.write(last)  # (after the client left: twisted.web drops it)
        self.exchange = None
        channel = self.channel
        site = self.proxy_site
        metrics = site.metrics
        metrics.count_answer(self.code, self.clientproto)
        self._uncount()
        # twisted.web's Request.finish (server.Request's adds only its
        # content encoder, which the proxy never has).
        if self._disconnected:
            raise RuntimeError(
                "Request.finish called on a request after its connection was lost; "
                "use Request.notifyFinish to keep track of this."
            )
        if self.finished:
            warnings.warn("Warning! request.finish called twice.", stacklevel=2)
            return
        if self.chunked:
            channel.write(b"0\r\n\r\n")  # the last chunk and the end
        site.log(self)  # the access log (twisted.web: the channel's factory, the same site)
        site.observer.answered(self, site.reactor.seconds())
        self.finished = 1
        if not self.queued:
            self._cleanup()


@implementer(IClient)
class DetachedRequest:
    """The client of a fetch with nobody to answer: a background refresh
    (stale-while-revalidate), or a miss that goes on for the cache and its
    followers after its own client left.  What it is sent goes nowhere;
    the fetched body goes only into the cache.

    It takes what an HTTP/1.1 client takes except a 1xx head or a tunnel
    (so a refresh stores what a miss stores), and keeps the original
    request's target, header fields and addresses: the original loses its
    connection, and with it its answer to ``isSecure``."""

    detached = True
    trailers = True
    interim = False
    tunnel = False
    method = b"GET"
    clientproto = b"HTTP/1.1"
    content = None
    has_body = False
    channel = None
    gone = False
    startedWriting = False
    finished = False
    exchange: Any = None
    looked: Any = None
    sentLength = 0
    code = 200
    site_name = "-"
    cache_status = "-"
    upstream_seconds: float | None = None
    bytes_in = 0
    rewrite: Any = None

    def __init__(self, original: Any) -> None:
        self.uri: bytes = original.uri
        self.requestHeaders: Headers = original.requestHeaders
        self.responseHeaders = ResponseHeaders()
        self.proxy_site: Any = original.proxy_site
        self.client = original.getClientAddress()
        self.secure: bool = original.isSecure()
        self.host = original.getHost()

    def getClientAddress(self) -> Any:
        return self.client

    def getHost(self) -> Any:
        return self.host

    def isSecure(self) -> bool:
        return self.secure

    def getHeader(self, key: bytes) -> bytes | None:
        values = self.requestHeaders.getRawHeaders(key)
        return values[-1] if values else None

    def setResponseCode(self, code: int, message: bytes | None = None) -> None:
        self.code = code

    def setHeader(self, name: bytes, value: bytes) -> None:
        pass

    def reset_head(self) -> None:
        self.responseHeaders = ResponseHeaders()

    def write_interim(self, code: int, phrase: bytes, headers: Any) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.startedWriting = True

    def write_whole(self, body: bytes) -> None:
        self.startedWriting = True

    def add_trailer(self, name: bytes, value: bytes) -> None:
        pass

    def registerProducer(self, producer: Any, streaming: bool) -> None:
        pass

    def unregisterProducer(self) -> None:
        pass

    def finish(self, last: bytes = b"") -> None:
        self.finished = True

    def abort(self) -> None:
        pass
