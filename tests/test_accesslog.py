"""The access log (``prexy.accesslog``): the combined format's line, byte
for byte, and the buffered file with its reopen."""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.address import IPv4Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from prexy.accesslog import AccessLog, clf_time, combined_line, combined_record
from prexy.proxy.headers import RequestHeaders
from tests.cases import tmp_dir


class Finished:
    """What the log reads of a finished request."""

    def __init__(self, **kw: Any) -> None:
        self.client: Any = IPv4Address("TCP", "10.0.0.7", 5555)
        self.method, self.uri, self.clientproto = b"GET", b"/a?b=1", b"HTTP/1.1"
        self.code, self.sentLength = 200, 1234
        self.requestHeaders = RequestHeaders.of([(b"User-Agent", b"curl/8"), (b"Referer", b"http://r/")])
        self.__dict__.update(kw)

    def getClientAddress(self) -> Any:  # noqa: N802
        return self.client


class LineTests(SynchronousTestCase):
    def test_combined(self) -> None:
        self.assertEqual(
            combined_record(Finished(), b"[05/Dec/2026:01:02:03 +0000]"),
            b'10.0.0.7 - - [05/Dec/2026:01:02:03 +0000] "GET /a?b=1 HTTP/1.1" 200 1234 "http://r/" "curl/8"\n',
        )

    def test_what_is_not_printable_is_escaped(self) -> None:
        """Quotes, backslashes, control and non-ASCII bytes in any field
        become ``\\xNN``; no body gives ``-``; HTTP/2 is written
        HTTP/2.0; a client without a host (a UNIX socket) is ``-``."""
        request = Finished(
            client=UNIXAddress(None), uri=b'/"q"\\\x00\xc3\xa9', clientproto=b"HTTP/2", code=404, sentLength=0,
            requestHeaders=RequestHeaders.of([(b"user-agent", b'a "b"\x7f')]),
        )
        self.assertEqual(
            combined_line(request, "[T]"),
            '- - - [T] "GET /\\x22q\\x22\\x5c\\x00\\xc3\\xa9 HTTP/2.0" 404 - "-" "a \\x22b\\x22\\x7f"',
        )

    def test_clf_time(self) -> None:
        self.assertEqual(clf_time(1_796_436_000.0), "[05/Dec/2026:02:00:00 +0000]")


class FileTests(SynchronousTestCase):
    def test_lines_are_buffered_flushed_and_reopened(self) -> None:
        """Lines wait in the buffer until ``flush`` (each second once
        started); ``reopen`` writes to a new file at the path (after
        logrotate moved the old one)."""
        path = str(tmp_dir(self) / "access.log")
        clock = Clock()
        clock.advance(1_796_436_000.0)
        log = AccessLog(clock, path)
        log.start()
        self.addCleanup(log.stop)
        log.log(Finished())
        with open(path, "rb") as f:
            self.assertEqual(f.read(), b"")
        clock.advance(1.0)
        with open(path, "rb") as f:
            self.assertEqual(f.read().count(b"[05/Dec/2026:02:00:00 +0000]"), 1)
        os.rename(path, path + ".1")
        log.reopen()
        log.log(Finished(code=304))
        log.flush()
        with open(path, "rb") as f:
            self.assertIn(b'"GET /a?b=1 HTTP/1.1" 304 1234', f.read())
