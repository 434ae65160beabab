"""Memos of pure functions bounded in bytes (``prexy.shortmemo``): the
answers for long arguments (a request target or a header value up to the
8 KB a line may hold) are not remembered, so a client inventing long
values cannot make each worker keep the memos' count of them."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import accept_encoding_bucket, primary_key, variant_part
from prexy.requesthead import check_host, check_target
from prexy.shortmemo import LONGEST, short_memo


def kept_after(calls: Callable[[int], Any], count: int) -> int:
    """Bytes still allocated after ``calls(i)`` for ``i`` in ``range(count)``
    (their answers dropped)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            calls(i)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


class ShortMemoTests(SynchronousTestCase):
    def test_short_arguments_are_remembered_long_ones_computed(self) -> None:
        made: list[Any] = []

        @short_memo(8)
        def upper(value: bytes) -> bytes:
            made.append(value)
            return value.upper()

        short, long = b"a" * LONGEST, b"b" * (LONGEST + 1)
        self.assertEqual([upper(short), upper(short)], [short.upper()] * 2)
        self.assertEqual([upper(long), upper(long)], [long.upper()] * 2)
        self.assertEqual(made, [short, long, long])
        self.assertEqual(upper.memo.cache_info().currsize, 1)  # type: ignore[attr-defined]

    def test_a_tuple_counts_its_members_bytes(self) -> None:
        @short_memo(8)
        def joined(values: tuple[bytes, ...]) -> bytes:
            return b",".join(values)

        joined((b"x" * 300, b"y" * 212))
        joined((b"x" * 300, b"y" * 213))
        self.assertEqual(joined.memo.cache_info().currsize, 1)  # type: ignore[attr-defined]

    def test_the_other_argument_can_be_chosen(self) -> None:
        @short_memo(8, arg=1)
        def key(site: str, url: bytes) -> bytes:
            return site.encode() + url

        key("s" * 1000, b"/a")
        key("s", b"/" * 1000)
        self.assertEqual(key.memo.cache_info().currsize, 1)  # type: ignore[attr-defined]


class RequestPathMemoryTests(SynchronousTestCase):
    """The per-request memos keep little for long values: 2,000 distinct
    targets, Host values, URLs and Accept-Encoding values of 6 KB each
    leave under 1 MB allocated (remembered, they would be 12 MB each)."""

    def test_check_target(self) -> None:
        kept = kept_after(lambda i: check_target(b"GET", b"/%d?" % i + b"q" * 6000), 2000)
        self.assertLess(kept, 1 << 20)

    def test_check_host(self) -> None:
        kept = kept_after(lambda i: check_host(b"h%d." % i + b"a" * 6000), 2000)
        self.assertLess(kept, 1 << 20)

    def test_primary_key(self) -> None:
        kept = kept_after(lambda i: primary_key("site", b"host/%d?" % i + b"q" * 6000), 2000)
        self.assertLess(kept, 1 << 20)

    def test_variant_part_and_accept_encoding(self) -> None:
        kept = kept_after(lambda i: variant_part(b"GET", b"cookie=%d;" % i + b"c" * 6000, "v1"), 2000)
        self.assertLess(kept, 1 << 20)
        kept = kept_after(lambda i: accept_encoding_bucket([b"gzip, x%d, " % i + b"y" * 6000]), 2000)
        self.assertLess(kept, 1 << 20)

    def test_short_values_are_still_remembered(self) -> None:
        target = b"/a/short/path?x=1"
        self.assertIs(check_target(b"GET", target), check_target(b"GET", target))
