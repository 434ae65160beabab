"""``ProxyRequest`` writes its answer in one step of its own, not through
twisted.web's ``server.Request`` and ``http.Request``: the channel gets the
same calls in the same order (head, body, chunked framing, the end) as
twisted.web's own request makes, for any protocol version, method, status,
framing and body cut, held equal here with twisted.web's request as the
oracle.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase
from twisted.web import server

from prexy.metrics import Metrics
from prexy.observe.stats import Observer
from prexy.proxy.headers import ResponseHeaders
from prexy.proxy.request import ProxyRequest


class _Site:
    """What both requests read of their site."""

    _parsePOSTFormSubmission = False
    max_request_body = 1 << 20
    metrics = Metrics()
    observer = Observer()
    reactor = Clock()
    active_requests = 0

    def served(self, channel: Any) -> None:
        pass

    def log(self, request: Any) -> None:
        pass


class _Channel:
    """Records every call a request makes to write its answer."""

    transport = None
    factory = None

    def __init__(self) -> None:
        self.site = _Site()
        self.calls: list[tuple[Any, ...]] = []

    def getPeer(self) -> None:  # noqa: N802 (twisted's name)
        return None

    def getHost(self) -> None:  # noqa: N802
        return None

    def writeHeaders(self, version: bytes, code: bytes, reason: bytes, headers: Any) -> None:  # noqa: N802
        self.calls.append(("head", version, code, reason, list(headers.pairs)))

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def writeSequence(self, data: Any) -> None:  # noqa: N802
        self.calls.append(("write", b"".join(data)))

    def requestDone(self, request: Any) -> None:  # noqa: N802
        self.calls.append(("done",))


class _Twisted(server.Request):
    """twisted.web's request, with the proxy's header table and no default
    Content-Type (as ProxyRequest has)."""

    defaultContentType = None

    def __init__(self, channel: Any) -> None:
        super().__init__(channel)
        self.responseHeaders = ResponseHeaders()  # type: ignore[assignment]


def _answer(request: Any, version: bytes, method: bytes, code: int, length: bool, pieces: list[bytes]) -> None:
    request.method, request.clientproto = method, version
    request.setResponseCode(code)
    request.responseHeaders.addRawHeader(b"Content-Type", b"text/plain")
    if length:
        request.responseHeaders.addRawHeader(b"content-length", b"%d" % sum(map(len, pieces)))
    for piece in pieces:
        request.write(piece)
    request.finish()


class WriteLikeTwisted(SynchronousTestCase):
    @given(
        st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2"]),
        st.sampled_from([b"GET", b"HEAD", b"POST"]),
        st.sampled_from([200, 204, 206, 304, 404, 502]),
        st.booleans(),
        st.lists(st.binary(max_size=20), max_size=4),
    )
    def test_same_calls(self, version: bytes, method: bytes, code: int, length: bool, pieces: list[bytes]) -> None:
        """Head, body pieces and the end reach the channel as twisted.web's
        request sends them: chunked framing where HTTP/1.1 has a body and
        no length, nothing after the head of a HEAD, 204 or 304."""
        ours, theirs = _Channel(), _Channel()
        _answer(ProxyRequest(ours), version, method, code, length, pieces)
        _answer(_Twisted(theirs), version, method, code, length, pieces)
        self.assertEqual(ours.calls, theirs.calls)

    def test_write_after_finish_refused(self) -> None:
        """As twisted.web's: a write after finish is an error (except after
        a bodiless head, where writes are dropped)."""
        for cls in (ProxyRequest, _Twisted):
            request = cls(_Channel())
            _answer(request, b"HTTP/1.1", b"GET", 200, True, [b"ab"])
            self.assertRaises(RuntimeError, request.write, b"more")
            request = cls(_Channel())
            _answer(request, b"HTTP/1.1", b"HEAD", 200, True, [b"ab"])
            request.write(b"more")
