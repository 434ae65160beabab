"""``prexy.control``: the master/worker pipes' JSON lines read back whole
at any chunking, with lines that are not JSON objects skipped; commands
with their payloads (binary, newlines included) too."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.control import Commands, JsonLines, encode

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


#: Commands down a worker's stdin: some with payloads (any bytes).
COMMANDS = [
    ({"configuration": 1}, b'{"not": "a command"}\n\x00\xff\n'),
    ({"reload": 1}, b""),
    ({"reload": 2}, bytes(range(256)) * 3),
]


class CommandsTests(SynchronousTestCase):
    def stream(self) -> bytes:
        return b"".join(encode(m, p if p else None) for m, p in COMMANDS) + b"junk\n" + encode({"end": 1})

    def expected(self) -> list[tuple[dict[str, object], bytes]]:
        return [({**m, "bytes": len(p)} if p else m, p) for m, p in COMMANDS] + [({"end": 1}, b"")]

    @given(st.lists(st.integers(0, 1200), max_size=12))
    def test_any_chunking(self, cuts: list[int]) -> None:
        """Cut anywhere (inside lines and payloads), every command comes out
        whole, in order, with its payload; a payload's newlines and JSON
        are not taken for commands."""
        data = self.stream()
        edges = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
        commands = Commands()
        got = [c for a, b in zip(edges, edges[1:], strict=False) for c in commands.feed(data[a:b])]
        self.assertEqual(got, self.expected())

    def test_byte_by_byte(self) -> None:
        commands = Commands()
        got = [c for b in self.stream() for c in commands.feed(bytes((b,)))]
        self.assertEqual(got, self.expected())

    def test_a_payload_waits_for_its_last_byte(self) -> None:
        commands = Commands()
        assert commands.feed(encode({"reload": 3}, b"abc")[:-1]) == []
        assert commands.feed(b"c") == [({"reload": 3, "bytes": 3}, b"abc")]

    def test_large_payload_in_pieces_is_linear(self) -> None:
        """Tens of megabytes in 64 KiB pieces (a pipe's reads) are read back
        whole; the buffer grows in place rather than being copied per read."""
        payload = bytes(range(256)) * (32 * 4096)  # 32 MiB
        data = encode({"configuration": 1}, payload)
        commands = Commands()
        got = []
        for offset in range(0, len(data), 65536):
            got += commands.feed(data[offset : offset + 65536])
        assert len(got) == 1 and got[0][1] == payload
