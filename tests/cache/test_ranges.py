"""``prexy.cache.ranges``: which Range a stored object answers, and how."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.ranges import RangeAnswer, choose_range, part_of, range_of_stream

LM = b"Sun, 06 Nov 1994 08:49:37 GMT"


def NONE(name: bytes) -> bytes | None:  # noqa: N802 - a validator that knows none
    return None


def pick(value: bytes | None, length: int = 100, if_range: bytes | None = None,
         etag: bytes | None = b'"abc"', last_modified: bytes | None = LM) -> RangeAnswer | None:
    headers = [(b"host", b"a")]
    if value is not None:
        headers.append((b"range", value))
    if if_range is not None:
        headers.append((b"if-range", if_range))
    validators = {b"etag": etag, b"last-modified": last_modified}
    return choose_range(headers, length, validators.get)


class ChooseRangeTests(SynchronousTestCase):
    def test_forms(self) -> None:
        """first-last, first-, -suffix; a last past the end is cut."""
        self.assertEqual(pick(b"bytes=0-9"), RangeAnswer(206, 0, 9))
        self.assertEqual(pick(b"bytes=90-"), RangeAnswer(206, 90, 99))
        self.assertEqual(pick(b"bytes=-10"), RangeAnswer(206, 90, 99))
        self.assertEqual(pick(b"bytes=-1000"), RangeAnswer(206, 0, 99))
        self.assertEqual(pick(b"bytes=50-5000"), RangeAnswer(206, 50, 99))
        self.assertEqual(pick(b"Bytes = 1 - 2"), RangeAnswer(206, 1, 2))

    def test_unsatisfiable(self) -> None:
        self.assertEqual(pick(b"bytes=100-"), RangeAnswer(416))
        self.assertEqual(pick(b"bytes=-0"), RangeAnswer(416))
        self.assertEqual(RangeAnswer(416).content_range(100), b"bytes */100")
        self.assertEqual(RangeAnswer(206, 0, 9).content_range(100), b"bytes 0-9/100")

    def test_whole_object(self) -> None:
        """No Range, several ranges, other units, junk, last before first."""
        for value in (None, b"bytes=0-1,5-6", b"items=0-1", b"bytes=x-y", b"bytes=", b"bytes=-",
                      b"bytes=9-3", b"0-9"):
            self.assertIsNone(pick(value), value)

    def test_if_range(self) -> None:
        """A strong tag that matches, or the exact Last-Modified; else whole."""
        self.assertEqual(pick(b"bytes=0-0", if_range=b'"abc"'), RangeAnswer(206, 0, 0))
        self.assertIsNone(pick(b"bytes=0-0", if_range=b'"other"'))
        self.assertIsNone(pick(b"bytes=0-0", if_range=b'W/"abc"'))
        self.assertIsNone(pick(b"bytes=0-0", if_range=b'"abc"', etag=b'W/"abc"'))
        self.assertEqual(pick(b"bytes=0-0", if_range=LM), RangeAnswer(206, 0, 0))
        self.assertIsNone(pick(b"bytes=0-0", if_range=b"Mon, 07 Nov 1994 08:49:37 GMT"))
        self.assertIsNone(pick(b"bytes=0-0", if_range=LM, last_modified=None))

    @given(st.binary(max_size=30), st.integers(0, 1000))
    def test_never_raises_and_stays_inside(self, value: bytes, length: int) -> None:
        """Any Range value: None, a 416, or a range inside the object."""
        got = pick(value, length)
        if got is not None and got.status == 206:
            self.assertTrue(0 <= got.first <= got.last < length)


class RangeOfStreamTests(SynchronousTestCase):
    def test_part_of_a_streaming_whole(self) -> None:
        """The head the client gets and the span it is sent; None without
        a usable Range."""
        head = [(b"Content-Type", b"text/plain"), (b"Content-Length", b"100")]
        code, phrase, headers, span = range_of_stream([(b"range", b"bytes=10-19")], 100, NONE, head)
        self.assertEqual((code, phrase, span), (206, b"Partial Content", (10, 19)))
        self.assertEqual(headers, [(b"Content-Type", b"text/plain"), (b"Content-Range", b"bytes 10-19/100"),
                                   (b"Content-Length", b"10")])
        code, _, headers, span = range_of_stream([(b"range", b"bytes=500-")], 100, NONE, head)
        self.assertEqual((code, span, headers[-1]), (416, (100, 99), (b"Content-Length", b"0")))
        self.assertIsNone(range_of_stream([(b"host", b"a")], 100, NONE, head))
        self.assertIsNone(range_of_stream([(b"range", b"bytes=1-2,5-6")], 100, NONE, head))


class PartOfTests(SynchronousTestCase):
    @given(
        body=st.binary(max_size=300),
        first=st.integers(0, 320),
        size=st.integers(-1, 320),
        cuts=st.lists(st.integers(0, 300), max_size=8),
    )
    def test_pieces_join_to_the_span(self, body: bytes, first: int, size: int, cuts: list[int]) -> None:
        """However the body is cut into pieces, the parts of the pieces join
        to the span's bytes (none for an empty span)."""
        span = (first, first + size)
        edges = sorted({0, len(body), *(c for c in cuts if c <= len(body))})
        got = b"".join(part_of(span, a, body[a:b]) for a, b in zip(edges, edges[1:], strict=False))
        self.assertEqual(got, body[first : first + size + 1] if size >= 0 else b"")
