"""``prexy.upgrade``: which requests are tunnelled and the 101 head."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from twisted.trial.unittest import SynchronousTestCase

from prexy.upgrade import protocol_name, tunnel_head, upgrade_request

WS = frozenset({b"websocket"})


def ask(headers: dict[bytes, list[bytes]], **kw: object) -> bytes | None:
    args: dict[str, object] = {"method": b"GET", "version": b"HTTP/1.1", "has_body": False, "allowed": WS}
    args.update(kw)
    return upgrade_request(headers, **args)  # type: ignore[arg-type]


UP = {b"connection": [b"Upgrade"], b"upgrade": [b"websocket"]}


class UpgradeRequestTests(SynchronousTestCase):
    def test_websocket(self) -> None:
        """The usual browser handshake is an upgrade; the value goes on as sent."""
        self.assertEqual(ask({b"connection": [b"keep-alive, Upgrade"], b"upgrade": [b"WebSocket"]}), b"WebSocket")

    def test_connection_token_in_a_second_header(self) -> None:
        self.assertEqual(ask({b"connection": [b"keep-alive", b" upgrade "], b"upgrade": [b"websocket"]}), b"websocket")

    def test_needs_both_headers(self) -> None:
        """Upgrade without the Connection token, or the token without Upgrade."""
        self.assertIsNone(ask({b"upgrade": [b"websocket"]}))
        self.assertIsNone(ask({b"connection": [b"upgrade"]}))
        self.assertIsNone(ask({b"connection": [b"upgraded"], b"upgrade": [b"websocket"]}))

    def test_only_http11_get_without_body(self) -> None:
        self.assertIsNone(ask(UP, method=b"POST"))
        self.assertIsNone(ask(UP, method=b"HEAD"))
        self.assertIsNone(ask(UP, version=b"HTTP/1.0"))
        self.assertIsNone(ask(UP, has_body=True))

    def test_allowed_protocols(self) -> None:
        """The first protocol named decides, without its version; none
        allowed means none tunnelled."""
        self.assertIsNone(ask({**UP, b"upgrade": [b"h2c"]}))
        self.assertEqual(ask({**UP, b"upgrade": [b"foo/2, websocket"]}, allowed=frozenset({b"foo"})), b"foo/2, websocket")
        self.assertIsNone(ask({**UP, b"upgrade": [b"h2c, websocket"]}))
        self.assertIsNone(ask(UP, allowed=frozenset()))

    def test_two_upgrade_headers_or_empty(self) -> None:
        self.assertIsNone(ask({**UP, b"upgrade": [b"websocket", b"websocket"]}))
        self.assertIsNone(ask({**UP, b"upgrade": [b" "]}))

    @given(st.dictionaries(st.sampled_from([b"connection", b"upgrade", b"host"]),
                           st.lists(st.binary(max_size=20), min_size=1, max_size=2)))
    def test_never_raises(self, headers: dict[bytes, list[bytes]]) -> None:
        """Any header values: an upgrade value or None, never an error."""
        result = ask(headers)
        self.assertTrue(result is None or protocol_name(result) in WS)


class TunnelHeadTests(SynchronousTestCase):
    def test_head(self) -> None:
        """End-to-end headers kept in order, hop-by-hop ones and those the
        upstream's Connection names dropped, then Connection and Upgrade."""
        head = tunnel_head(
            b"Switching Protocols",
            [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade, X-Hop"), (b"X-Hop", b"1"),
             (b"Sec-WebSocket-Accept", b"abc"), (b"Set-Cookie", b"a=1"), (b"Keep-Alive", b"timeout=5")],
            b"websocket",
        )
        self.assertEqual(
            head,
            b"HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: abc\r\nSet-Cookie: a=1\r\n"
            b"Connection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        )

    def test_no_phrase(self) -> None:
        self.assertTrue(tunnel_head(b"", [], None).startswith(b"HTTP/1.1 101 Switching Protocols\r\n"))

    def test_protocol_name(self) -> None:
        self.assertEqual(protocol_name(b" WebSocket/13 , x"), b"websocket")
