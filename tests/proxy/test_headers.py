"""The request and response header tables (``prexy.proxy.headers``)
against a plain model: a list of (name, value) pairs read without regard
to the names' case, in any order of operations."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.proxy.headers import RequestHeaders, ResponseHeaders, raw_header_dict

NAMES = st.sampled_from([b"Content-Length", b"content-length", b"X-A", b"x-a", b"Via", b"Set-Cookie", "X-A"])
VALUES = st.sampled_from([b"1", b"two", b"", "s"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), NAMES, VALUES),
        st.tuples(st.just("set"), NAMES, st.lists(VALUES, max_size=3)),
        st.tuples(st.just("remove"), NAMES, st.none()),
    ),
    max_size=12,
)


def b(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else x


class ResponseHeadersTests(SynchronousTestCase):
    @given(OPS, NAMES)
    @settings(max_examples=300)
    def test_as_the_model(self, ops: list[tuple[str, object, object]], probe: bytes | str) -> None:
        table = ResponseHeaders()
        model: list[tuple[bytes, bytes]] = []
        for op, name, arg in ops:
            low = b(name).lower()  # type: ignore[arg-type]
            if op == "add":
                table.addRawHeader(name, arg)  # type: ignore[arg-type]
                model.append((b(name), b(arg)))  # type: ignore[arg-type]
            elif op == "set":
                table.setRawHeaders(name, arg)  # type: ignore[arg-type]
                at = next((i for i, (n, _) in enumerate(model) if n.lower() == low), len(model))
                rest = [p for p in model[at:] if p[0].lower() != low]
                model[at:] = [(b(name), b(v)) for v in arg] + rest  # type: ignore[arg-type, union-attr]
            else:
                table.removeHeader(name)  # type: ignore[arg-type]
                model = [p for p in model if p[0].lower() != low]
        self.assertEqual(table.pairs, model)
        self.assertEqual(list(table.getAllRawHeaders()), [(n, [v]) for n, v in model])
        want = [v for n, v in model if n.lower() == b(probe).lower()]
        self.assertEqual(table.getRawHeaders(probe), want or None)
        self.assertEqual(table.hasHeader(probe), bool(want))


class RequestHeadersTests(SynchronousTestCase):
    def test_of_groups_by_lower_case_name_in_order(self) -> None:
        table = RequestHeaders.of([(b"Host", b"a"), (b"X-A", b"1"), (b"x-a", b"2"), (b"Accept", b"b")])
        self.assertEqual(table.raw, {b"host": [b"a"], b"x-a": [b"1", b"2"], b"accept": [b"b"]})
        self.assertEqual(table.getRawHeaders(b"X-A"), [b"1", b"2"])
        self.assertEqual(raw_header_dict(table), table.raw)
        self.assertIsNot(raw_header_dict(table), table.raw)  # a copy: callers may change theirs
        table.setRawHeaders(b"Host", [b"b"])
        table.removeHeader(b"accept")
        table.addRawHeader("X-B", "3")
        self.assertEqual(list(table.getAllRawHeaders()), [(b"host", [b"b"]), (b"x-a", [b"1", b"2"]), (b"x-b", [b"3"])])
        self.assertFalse(table.hasHeader(b"Accept"))
