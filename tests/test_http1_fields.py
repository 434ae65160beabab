"""prexy.http1's two readers of a response head's field lines: the
one-expression pass (``_fields_at_once``) gives exactly what the
line-by-line reader (``_fields_by_line``) gives, or declines and leaves the
head to it; the usual heads take the one-expression pass.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy import http1
from prexy.http1 import ResponseError, ResponseReader

#: Bytes that make field lines interesting: separators, every kind of
#: whitespace ``bytes.strip`` knows, a colon, letters and an obs-text byte.
_PIECES = st.sampled_from([b"a", b"B", b"-", b":", b" ", b"\t", b"\x0b", b"\x0c", b"\x1f", b"\xe9", b"x y",
                           b"Content-Length", b"content-length", b"Connection", b"Transfer-Encoding", b"12",
                           b"close", b"chunked", b"keep-alive"])
_RUN = st.lists(_PIECES, max_size=6).map(b"".join)
#: Field lines: mostly name, colon, value; some anything at all.
_LINE = st.one_of(st.tuples(_RUN, _RUN).map(b":".join), _RUN.filter(bool))
_LINES = st.lists(_LINE, max_size=8)

NGINX = (
    b"HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sat, 05 Dec 2026 00:00:00 GMT\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 12\r\nConnection: keep-alive"
)


def by_line(head: bytes) -> object:
    """What the line-by-line reader gives for ``head`` (or its error)."""
    lines = head.split(b"\r\n")
    try:
        return http1._fields_by_line(lines[1:], b"HTTP/1.1")
    except ResponseError as error:
        return error


class FieldsAtOnce(SynchronousTestCase):
    @given(_LINES)
    def test_same_as_line_by_line(self, lines: list[bytes]) -> None:
        """On any field lines (without CR, LF or NUL, which the head check
        refuses first), the one-expression pass gives the line reader's
        fields, names and framing fields, or declines: never other ones,
        and never a head the line reader refuses."""
        head = b"\r\n".join([b"HTTP/1.1 200 OK", *lines])
        fast = http1._fields_at_once(head, len(lines))
        if fast is not None:
            self.assertEqual(fast, by_line(head))

    def test_usual_heads_at_once(self) -> None:
        """An origin's usual head, with whitespace around values and
        repeated fields, is read in one pass."""
        for head in (
            NGINX,
            NGINX + b"\r\nSet-Cookie: a=1\r\nSet-Cookie:  b=2 \t\r\nX-Empty:\r\nVary: Accept-Encoding",
            b"HTTP/1.1 204 No Content",
        ):
            count = head.count(b"\r\n")
            fast = http1._fields_at_once(head, count)
            self.assertIsNotNone(fast, head)
            self.assertEqual(fast, by_line(head))

    def test_declines_what_it_does_not_read(self) -> None:
        """An obs-fold, a line without a colon, a name ending in
        whitespace and a value ending in VT go line by line."""
        for extra in (b"X-Fold: a\r\n  b", b"No colon here", b"Bad : name", b"X-Vt: a\x0b", b": empty name"):
            head = NGINX + b"\r\n" + extra
            self.assertIsNone(http1._fields_at_once(head, head.count(b"\r\n")), extra)

    def test_reader_errors_in_line_order(self) -> None:
        """A bad framing field before a bad line is the error reported, as
        when each line was checked in turn."""
        reader = ResponseReader()
        events = reader.receive_data(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\nBad line\r\n\r\n")
        self.assertEqual(events, [ResponseError("bad Content-Length b'x'")])
        reader = ResponseReader()
        events = reader.receive_data(b"HTTP/1.1 200 OK\r\nBad line\r\nContent-Length: x\r\n\r\n")
        self.assertEqual(events, [ResponseError("bad header line b'Bad line'")])
