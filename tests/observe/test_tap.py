"""The live request log's filters, records, rings and readers."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.observe.tap import (
    FilterError,
    LogFilter,
    LogHub,
    Reader,
    Tap,
    entry_of,
    parse_duration,
    parse_filter,
    record_of,
    with_line,
)


class Address:
    host = "192.0.2.7"


class Request:
    def __init__(self, site: str = "shop", code: int = 200, uri: bytes = b"/a?b=1", cache: str = "miss",
                 started: float = 10.0, rules: set[int] | None = None) -> None:
        self.site_name = site
        self.code = code
        self.sentLength = 20
        self.cache_status = cache
        self.started = started
        self.upstream_seconds = 0.0125
        self.bytes_in = 18
        self.method = b"GET"
        self.uri = uri
        self.clientproto = b"HTTP/2"
        self.rewrite: Any = None
        if rules is not None:
            self.rewrite = type("T", (), {
                "scan_seconds": 0.001, "rules_matched": rules, "max_held": 7, "bailed_out": False,
                "timed_out": True,
            })()

    def getClientAddress(self) -> Address:  # noqa: N802
        return Address()


def record(**kw: Any) -> dict[str, Any]:
    now = kw.pop("now", 10.25)
    return record_of(Request(**kw), now)


def entry(**kw: Any) -> list[Any]:
    """What the filters read of a request, with its line."""
    now = kw.pop("now", 10.25)
    request = Request(**kw)
    return with_line(entry_of(request, now), request, now)


class FilterTests(SynchronousTestCase):
    def test_parse(self) -> None:
        f = parse_filter({"site": ["shop"], "status": ["5xx"], "slower": ["200ms"], "miss": ["1"], "rule": ["3"],
                          "url": ["^/a"]})
        self.assertEqual(f.as_dict(), {"site": "shop", "status_class": 5, "status_code": None, "slower": 0.2,
                                       "miss": True, "rule": 3, "url": "^/a"})
        self.assertEqual(LogFilter.from_dict(f.as_dict()).as_dict(), f.as_dict())
        self.assertEqual(parse_filter({"status": ["404"]}).status_code, 404)
        self.assertEqual(parse_duration("1.5s"), 1.5)

    def test_refused(self) -> None:
        for query, says in (
            ({"sight": ["x"]}, "unknown parameter(s): sight"),
            ({"status": ["6xx"]}, "expected a class"),
            ({"status": ["20"]}, "expected a class"),
            ({"slower": ["fast"]}, "expected a number with ms or s"),
            ({"rule": ["0"]}, "expected a rule number"),
            ({"rule": ["x"]}, "expected a rule number"),
            ({"url": ["("]}, "url '('"),
            ({"miss": ["maybe"]}, "expected 1"),
            ({"site": ["a", "b"]}, "site given 2 times"),
        ):
            with self.assertRaises(FilterError) as caught:
                parse_filter(query)
            self.assertIn(says, str(caught.exception))

    def test_matches(self) -> None:
        r = entry(rules={0, 2}, code=503, cache="miss")
        self.assertTrue(parse_filter({}).matches(r))
        self.assertTrue(parse_filter({"rule": ["3"]}).matches(r))
        self.assertFalse(parse_filter({"rule": ["2"]}).matches(r))
        self.assertTrue(parse_filter({"status": ["5xx"]}).matches(r))
        self.assertFalse(parse_filter({"status": ["4xx"]}).matches(r))
        self.assertFalse(parse_filter({"status": ["502"]}).matches(r))
        self.assertTrue(parse_filter({"slower": ["200ms"]}).matches(r))
        self.assertFalse(parse_filter({"slower": ["300ms"]}).matches(r))
        self.assertTrue(parse_filter({"miss": ["1"]}).matches(r))
        self.assertFalse(parse_filter({"miss": ["1"]}).matches(entry(cache="hit")))
        self.assertTrue(parse_filter({"url": [r"b=\d"]}).matches(r))
        self.assertFalse(parse_filter({"site": ["other"]}).matches(r))

    @given(st.sampled_from(["5xx", "4xx", "404", "200"]), st.integers(100, 599))
    def test_status_filter(self, status: str, code: int) -> None:
        matched = parse_filter({"status": [status]}).matches(entry(code=code))
        expected = code // 100 == int(status[0]) if status.endswith("xx") else code == int(status)
        self.assertEqual(matched, expected)


class RecordTests(SynchronousTestCase):
    def test_fields(self) -> None:
        r = record(rules={2, 0})
        self.assertEqual(r, {
            "time": 10.25, "site": "shop", "method": "GET", "url": "/a?b=1", "status": 200,
            "protocol": "HTTP/2.0", "client": "192.0.2.7", "cache": "miss", "upstream_first_byte": 0.0125,
            "rewrite": 0.001, "total": 0.25, "bytes_in": 18, "bytes_out": 20, "rules": [1, 3], "held": 7,
            "bailout": False, "timeout": True,
        })
        plain = record()
        self.assertEqual((plain["rules"], plain["rewrite"], plain["held"]), ([], None, 0))


class TapTests(SynchronousTestCase):
    def test_ring_drops_the_oldest_and_counts(self) -> None:
        tap = Tap([parse_filter({"status": ["5xx"]})], ring=3)
        for i in range(5):
            tap.offer(Request(code=500, uri=b"/%d" % i), 11.0)
        tap.offer(Request(code=200), 11.0)  # no reader wants it
        records, dropped = tap.take()
        self.assertEqual([json.loads(r[-1])["url"] for r in records], ["/2", "/3", "/4"])
        self.assertEqual(dropped, 2)
        self.assertEqual(tap.take(), ([], 0))


class ReaderTests(SynchronousTestCase):
    def test_slow_reader_loses_records_not_memory(self) -> None:
        written: list[bytes] = []
        paused = [False]
        reader = Reader(parse_filter({"site": ["shop"]}), written.append, lambda: paused[0])
        reader.deliver([entry(uri=b"/1"), entry(site="other")])
        paused[0] = True
        reader.deliver([entry(uri=b"/2"), entry(uri=b"/3")])
        paused[0] = False
        reader.deliver([entry(uri=b"/4")], dropped=1)
        lines = [json.loads(line) for chunk in written for line in chunk.splitlines()]
        self.assertEqual(lines[0]["url"], "/1")
        self.assertEqual(lines[1], {"dropped": 3})
        self.assertEqual(lines[2]["url"], "/4")
        self.assertEqual(len(lines), 3)

    def test_hub_tells_the_filters(self) -> None:
        told: list[list[Any]] = []
        hub = LogHub(told.append)
        a = Reader(parse_filter({"rule": ["1"]}), lambda b: None, lambda: False)
        b = Reader(parse_filter({}), lambda b: None, lambda: False)
        hub.attach(a)
        hub.attach(b)
        hub.detach(a)
        hub.detach(a)
        hub.detach(b)
        self.assertEqual([len(f) for f in told], [1, 2, 1, 0])
