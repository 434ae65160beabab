"""The access log (``prexy.accesslog``, its lines ``prexy.logformat``): the combined format's line, byte
for byte, and the buffered file with its reopen."""

from __future__ import annotations

import os
from typing import Any

from twisted.internet.address import IPv4Address, UNIXAddress
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from prexy.accesslog import AccessLog
from prexy.logformat import clf_time, combined_line, combined_record
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


class FormatTests(SynchronousTestCase):
    """``[server] access_log_format``: nginx-style variables, and JSON lines."""

    def finished(self, **kw: Any) -> Finished:
        rewrite = type("T", (), {"rules_matched": {0, 2}, "scan_seconds": 0.0021})()
        fields = RequestHeaders.of([(b"Host", b"shop.test"), (b"User-Agent", b'c "x"'), (b"X-Id", b"7")])
        base = dict(site_name="shop", started=100.0, upstream_seconds=0.0123, cache_status="miss", bytes_in=900,
                    rewrite=rewrite, requestHeaders=fields)
        base.update(kw)
        return Finished(**base)

    def test_nginx_variables(self) -> None:
        from prexy.logformat import compile_format

        line = compile_format(
            '$remote_addr [$time_local] $host $site "$request" $status $body_bytes_sent rt=$request_time'
            ' uht=$upstream_header_time cs=$upstream_cache_status rules=$prexy_rules rw=$prexy_rewrite_time'
            ' in=$upstream_bytes_received ${http_x_id} "$http_user_agent" $msec $time_iso8601'
        )
        self.assertEqual(
            line(self.finished(), 100.25),
            b'10.0.0.7 [01/Jan/1970:00:01:40 +0000] shop.test shop "GET /a?b=1 HTTP/1.1" 200 1234 rt=0.250'
            b' uht=0.012 cs=MISS rules=1,3 rw=0.002 in=900 7 "c \\x22x\\x22" 100.250 1970-01-01T00:01:40.250+00:00\n',
        )
        plain = line(self.finished(rewrite=None, upstream_seconds=None, cache_status="-",
                                   requestHeaders=RequestHeaders.of([])), 100.0)
        self.assertIn(b"+0000] - shop \"GET", plain)
        self.assertIn(b"uht=- cs=- rules=- rw=-", plain)

    def test_unknown_variable(self) -> None:
        from prexy.logformat import FormatError, compile_format

        with self.assertRaises(FormatError) as caught:
            compile_format("$status $upstream_response_time")
        self.assertIn("unknown variable $upstream_response_time", str(caught.exception))

    def test_json(self) -> None:
        import json

        from prexy.logformat import JSON_FIELDS, json_line

        record = json.loads(json_line(self.finished(clientproto=b"HTTP/2"), 100.2505))
        self.assertEqual(tuple(record), JSON_FIELDS)
        self.assertEqual(record["time"], "1970-01-01T00:01:40.250+00:00")
        self.assertEqual((record["protocol"], record["rules"], record["request_time"]), ("HTTP/2.0", [1, 3], 0.251))
        self.assertEqual(record["user_agent"], 'c "x"')

    def test_the_file_takes_the_format(self) -> None:
        import json

        clock = Clock()
        clock.advance(100.5)
        path = os.path.join(tmp_dir(self), "access.log")
        log = AccessLog(clock, path, "json")
        log.log(self.finished())
        log.close()
        with open(path, "rb") as f:
            self.assertEqual(json.loads(f.read())["site"], "shop")

    def test_config_refuses_a_bad_format(self) -> None:
        from prexy.config import ConfigError, parse_config

        text = '[server]\naccess_log_format = "$status $nope"\n[sites.a]\nupstream = "http://127.0.0.1:1"\n'
        with self.assertRaises(ConfigError) as caught:
            parse_config(text, "/etc/prexy/prexy.toml")
        self.assertIn("prexy.toml:2", str(caught.exception))
        self.assertIn("unknown variable $nope", str(caught.exception))
