"""The ClientHello reader: real hellos made by OpenSSL (the oracle for
what a client sends) read whole, byte by byte, split across records, with
trailing data; garbage and mutations give an outcome, never an exception."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from OpenSSL import SSL
from twisted.trial.unittest import SynchronousTestCase

from prexy.clienthello import ClientHelloReader, Hello, NotAHello


def client_hello(name: bytes | None = None, alpn: list[bytes] | None = None) -> bytes:
    """The first flight of an OpenSSL client (one record holding its ClientHello)."""
    context = SSL.Context(SSL.TLS_METHOD)
    if alpn:
        context.set_alpn_protos(alpn)
    connection = SSL.Connection(context, None)
    if name is not None:
        connection.set_tlsext_host_name(name)
    connection.set_connect_state()
    try:
        connection.do_handshake()
    except SSL.WantReadError:
        pass
    return connection.bio_read(1 << 16)


def refragment(flight: bytes, size: int) -> bytes:
    """The same handshake bytes in records of at most ``size`` bytes each."""
    body = flight[5:]
    out = b""
    for i in range(0, len(body), size):
        piece = body[i : i + size]
        out += flight[:3] + len(piece).to_bytes(2, "big") + piece
    return out


HELLO = client_hello(b"fr.shop.test", [b"h2", b"http/1.1"])
PLAIN = client_hello()


def read(*pieces: bytes, limit: int = 16384) -> Hello | NotAHello | None:
    reader = ClientHelloReader(limit)
    outcome = None
    for piece in pieces:
        outcome = reader.feed(piece)
    return outcome


class ReaderTests(SynchronousTestCase):
    def test_whole(self) -> None:
        """SNI and ALPN of an OpenSSL client's hello, read in one piece."""
        assert read(HELLO) == Hello(b"fr.shop.test", (b"h2", b"http/1.1"))

    def test_no_sni(self) -> None:
        assert read(PLAIN) == Hello(None, ())

    def test_acme_tls_alpn(self) -> None:
        """A TLS-ALPN-01 validation handshake says so in its ALPN."""
        assert read(client_hello(b"a.test", [b"acme-tls/1"])) == Hello(b"a.test", (b"acme-tls/1",))

    def test_byte_by_byte(self) -> None:
        """No outcome until the last byte of the hello; then the same one."""
        reader = ClientHelloReader()
        for i in range(len(HELLO) - 1):
            assert reader.feed(HELLO[i : i + 1]) is None, i
        assert reader.feed(HELLO[-1:]) == Hello(b"fr.shop.test", (b"h2", b"http/1.1"))

    def test_across_records(self) -> None:
        """The hello fragmented over records of 1, 7, 100 bytes (RFC 8446 5.1)."""
        for size in (1, 7, 100):
            flight = refragment(HELLO, size)
            assert read(flight) == Hello(b"fr.shop.test", (b"h2", b"http/1.1")), size
            assert read(*[flight[i : i + 3] for i in range(0, len(flight), 3)]) == read(HELLO), size

    def test_trailing_data(self) -> None:
        """Bytes after the hello (the client's early data, a second record)
        change nothing."""
        assert read(HELLO + b"\x17\x03\x03\x00\x05hello") == read(HELLO)
        reader = ClientHelloReader()
        reader.feed(HELLO)
        assert reader.feed(b"anything") == read(HELLO)

    def test_not_tls(self) -> None:
        """An HTTP request, an alert, an SSLv2 hello, a server hello: not a hello."""
        for data in (b"GET / HTTP/1.1\r\n\r\n", b"\x15\x03\x03\x00\x02\x02\x28",
                     b"\x80\x2e\x01\x00\x02", b"\x16\x03\x03\x00\x04\x02\x00\x00\x00",
                     b"\x16\x03\x03\x00\x00", b"\x16\x03\x03\x40\x01"):
            assert isinstance(read(data), NotAHello), data

    def test_bound(self) -> None:
        """A hello announcing more than the bound is refused at its header,
        before its bytes arrive."""
        assert isinstance(read(HELLO[:9], limit=100), NotAHello)
        assert read(HELLO[:9]) is None

    def test_short_fields(self) -> None:
        """A hello whose fields overrun it is not a hello (no exception)."""
        body = bytearray(HELLO)
        body[5 + 4 + 34] = 200  # the session id's length, past the message
        assert isinstance(read(bytes(body)), NotAHello)

    @given(st.lists(st.integers(min_value=1, max_value=64), max_size=80))
    def test_any_chunking(self, sizes: list[int]) -> None:
        """Any split of the bytes gives the outcome of the whole."""
        pieces, at = [], 0
        for size in sizes:
            pieces.append(HELLO[at : at + size])
            at += size
        pieces.append(HELLO[at:])
        assert read(*pieces) == read(HELLO)

    @given(st.lists(st.tuples(st.integers(min_value=0, max_value=len(HELLO) - 1), st.integers(0, 255)),
                    min_size=1, max_size=8),
           st.integers(min_value=0, max_value=len(HELLO)))
    def test_mutations_never_raise(self, changes: list[tuple[int, int]], cut: int) -> None:
        """Bytes changed and the input cut anywhere: an outcome or None, never an exception."""
        data = bytearray(HELLO)
        for at, value in changes:
            data[at] = value
        outcome = read(bytes(data[:cut]), bytes(data[cut:]))
        assert outcome is None or isinstance(outcome, (Hello, NotAHello))

    @given(st.binary(max_size=300))
    def test_garbage_never_raises(self, data: bytes) -> None:
        outcome = read(data)
        assert outcome is None or isinstance(outcome, (Hello, NotAHello))
