"""``UpstreamResponse.end_to_end`` picks the passing fields by the head's
shape, remembered once per shape: the same fields as filtering each head
anew (hypothesis, none, one or many kept, repeated shapes), and a bounded
memo.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.exchange import RESPONSE_DROP
from prexy.proxy import upstream_api
from prexy.proxy.upstream_api import UpstreamResponse

_NAMES = st.sampled_from([b"Server", b"Date", b"Content-Length", b"connection", b"Keep-Alive", b"Via",
                          b"X-Hop", b"Transfer-Encoding", b"ETag", b"Set-Cookie"])


def response(pairs: list[tuple[bytes, bytes]], named: frozenset[bytes]) -> UpstreamResponse:
    return UpstreamResponse(200, b"OK", b"HTTP/1.1", pairs, [n.lower() for n, _ in pairs], named, None, 0.0, 0.0,
                            None)  # type: ignore[arg-type]


class EndToEnd(SynchronousTestCase):
    @given(
        st.lists(st.tuples(_NAMES, st.binary(max_size=4)), max_size=8),
        st.sampled_from([frozenset(), frozenset({b"x-hop"}), frozenset({b"keep-alive", b"etag"})]),
        st.sampled_from([RESPONSE_DROP, frozenset(), frozenset({b"server"})]),
    )
    def test_same_as_filtering(
        self, pairs: list[tuple[bytes, bytes]], named: frozenset[bytes], drop: frozenset[bytes],
    ) -> None:
        """The fields kept are those not in ``drop`` nor named in
        Connection, in order, the first time a shape is seen and after."""
        expected = [(n, v) for n, v in pairs if n.lower() not in drop and n.lower() not in named]
        for _ in range(2):
            self.assertEqual(response(pairs, named).end_to_end(drop), expected)
        other = [(n, v + b"!") for n, v in pairs]  # the same shape, other values
        self.assertEqual(response(other, named).end_to_end(drop),
                         [(n, v) for n, v in other if n.lower() not in drop and n.lower() not in named])

    def test_bounded(self) -> None:
        """Past SHAPES shapes the memo starts afresh."""
        for i in range(upstream_api.SHAPES * 2 + 3):
            pairs = [(b"X-%d" % i, b"v"), (b"Content-Length", b"1")]
            self.assertEqual(response(pairs, frozenset()).end_to_end(RESPONSE_DROP), [(b"X-%d" % i, b"v")])
            self.assertLessEqual(len(upstream_api._PICKS), upstream_api.SHAPES)
