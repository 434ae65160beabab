"""``prexy.exchange.plan_passed``, the plan of an answer that a site
without rules or targeted fields passes (perhaps compressed) outside the
cache, is ``plan_head``'s plan for it: held equal on any head, method,
Accept-Encoding and compression settings, with ``plan_head`` as the
oracle.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.codec import Compression
from prexy.exchange import Mode, passes_as_it_came, plan_head, plan_passed

from .test_exchange import FakeHead

_FIELDS = st.sampled_from([
    (b"Content-Type", b"text/html; charset=utf-8"),
    (b"Content-Type", b"image/png"),
    (b"content-encoding", b"gzip"),
    (b"Content-Encoding", b"identity"),
    (b"Content-Encoding", b"br, x-custom"),
    (b"Cache-Control", b"public, no-transform"),
    (b"Cache-Control", b"max-age=60"),
    (b"Vary", b"Accept-Encoding"),
    (b"Vary", b"Cookie"),
    (b"Vary", b"*"),
    (b"ETag", b'"abc"'),
    (b"ETag", b'W/"w"'),
    (b"Last-Modified", b"Sat, 05 Dec 2026 00:00:00 GMT"),
    (b"Connection", b"close"),
    (b"Keep-Alive", b"timeout=5"),
    (b"Transfer-Encoding", b"chunked"),
    (b"Content-Length", b"300"),
    (b"Via", b"1.1 other"),
    (b"Server", b"nginx"),
])


def _never() -> Any:
    raise AssertionError("asked for the rules of a site that has none")


class PlanPassed(SynchronousTestCase):
    @given(
        st.sampled_from([101, 200, 203, 204, 206, 301, 304, 404, 500, 502]),
        st.lists(_FIELDS, max_size=8),
        st.sampled_from([None, 0, 12, 255, 256, 5000]),
        st.sampled_from([frozenset(), frozenset({b"keep-alive"})]),
        st.sampled_from([b"GET", b"HEAD", b"POST"]),
        st.sampled_from([None, [b"gzip"], [b"br;q=1, gzip;q=0.5"], [b"identity"], [b"*;q=0"], [b"zstd", b"gzip"]]),
        st.sampled_from([Compression(), Compression(enabled=False), Compression(min_length=0)]),
        st.booleans(),
        st.booleans(),
    )
    def test_same_as_plan_head(
        self, code: int, fields: list[tuple[bytes, bytes]], length: int | None, named: frozenset[bytes],
        method: bytes, accept_encoding: list[bytes] | None, compression: Compression, trailers: bool, in_hand: bool,
    ) -> None:
        """Whatever the head, the request and the settings: the same plan
        as ``plan_head`` makes with no rules, no cache context, no targeted
        fields and no header rule that applies."""
        head = FakeHead(code, fields, length, named)
        expected = plan_head(
            head, method=method, trailers=trailers, accept_encoding=accept_encoding, rules=None,
            compression=compression, applicable=_never, body_in_hand=in_hand, whole_max=100_000,
        )
        got = plan_passed(head, method=method, accept_encoding=accept_encoding, compression=compression)
        self.assertEqual(got, expected)

    def test_usual_answers(self) -> None:
        """A small answer passes with its length, a large HTML one is
        compressed for a client that takes gzip, a HEAD has no body."""
        small = FakeHead(200, [(b"Content-Type", b"text/plain"), (b"Content-Length", b"12")], 12)
        plan = plan_passed(small, method=b"GET", accept_encoding=None, compression=Compression())
        self.assertEqual((plan.mode, plan.headers), (Mode.PASS, [(b"Content-Type", b"text/plain"),
                                                                 (b"Content-Length", b"12")]))
        page = FakeHead(200, [(b"Content-Type", b"text/html")], 5000)
        plan = plan_passed(page, method=b"GET", accept_encoding=[b"gzip"], compression=Compression())
        self.assertEqual((plan.mode, plan.coding.coding), (Mode.COMPRESS, b"gzip"))
        plan = plan_passed(page, method=b"HEAD", accept_encoding=[b"gzip"], compression=Compression())
        self.assertIs(plan.mode, Mode.NO_BODY)

    def test_when_it_applies(self) -> None:
        """Only a site without rules or targeted fields, outside the cache,
        on an answer with no field a header rule changes."""
        lnames = [b"content-type", b"location"]
        self.assertTrue(passes_as_it_came(None, False, frozenset(), frozenset({b"refresh"}), lnames))
        self.assertFalse(passes_as_it_came(object(), False, frozenset(), frozenset(), lnames))
        self.assertFalse(passes_as_it_came(None, True, frozenset(), frozenset(), lnames))
        self.assertFalse(passes_as_it_came(None, False, frozenset({b"cdn-cache-control"}), frozenset(), lnames))
        self.assertFalse(passes_as_it_came(None, False, frozenset(), frozenset({b"location"}), lnames))
