"""``prexy.control``: the master/worker pipes' JSON lines read back whole
at any chunking, with lines that are not JSON objects skipped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.control import JsonLines, encode

MESSAGES = [{"ready": True}, {"metrics": {"a": [1, 2]}}, {"reloaded": 3, "error": "x\ny"}, {"cluster": {"kind": "purge"}}]


class JsonLinesTests(SynchronousTestCase):
    def test_whole(self) -> None:
        """Every message of one write, in order."""
        self.assertEqual(JsonLines().feed(b"".join(map(encode, MESSAGES))), MESSAGES)

    def test_byte_by_byte(self) -> None:
        """One byte at a time: each message comes out with its newline."""
        lines = JsonLines()
        got = [m for b in b"".join(map(encode, MESSAGES)) for m in lines.feed(bytes((b,)))]
        self.assertEqual(got, MESSAGES)

    def test_not_objects_are_skipped(self) -> None:
        """Garbage, a JSON list or number, and an empty line are skipped;
        the messages around them are not lost; a partial line waits."""
        data = b"nonsense\n[1, 2]\n7\n\n" + encode({"ready": True}) + b'{"metri'
        lines = JsonLines()
        self.assertEqual(lines.feed(data), [{"ready": True}])
        self.assertEqual(lines.feed(b'cs": 1}\n'), [{"metrics": 1}])

    @given(st.lists(st.integers(0, 400), max_size=12))
    def test_any_chunking(self, cuts: list[int]) -> None:
        """Cut anywhere, the messages come out whole and in order."""
        data = b"".join(map(encode, MESSAGES)) + b"junk\n" + encode({"end": 1})
        edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
        lines = JsonLines()
        got = [m for a, b in zip(edges, edges[1:], strict=False) for m in lines.feed(data[a:b])]
        self.assertEqual(got, [*MESSAGES, {"end": 1}])
