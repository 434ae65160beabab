"""The challenge answers: the registry by token and by name (in memory and
through its directory for another process), strict tokens, the TLS-ALPN-01
certificate's acmeIdentifier, the HTTP-01 resource, and the ALPN callback
in a real in-memory TLS handshake (the answer alone for ``acme-tls/1``,
the listener's own certificate and protocols for everyone else)."""

from __future__ import annotations

import hashlib

from cryptography import x509
from OpenSSL import SSL
from twisted.trial.unittest import SynchronousTestCase
from twisted.web.test.requesthelper import DummyRequest

from prexy.acme.challenges import (
    ACME_IDENTIFIER,
    ACME_TLS_ALPN,
    ChallengeRegistry,
    acme_identifier,
    check_token,
    tls_alpn01_certificate,
)
from prexy.acme.web import ChallengeResource, alpn_selector, http01_response, servername_callback
from tests.acme.certs import throwaway_rsa
from tests.cases import tmp_dir

TOKEN = "LkTLmjIUss77lwssAlM7SqURO8pPufk7_Ajwjmp3pys"
KEYAUTH = TOKEN + ".thumbprint"


class RegistryTests(SynchronousTestCase):
    def test_http01(self) -> None:
        registry = ChallengeRegistry()
        self.assertIsNone(registry.http01(TOKEN))
        registry.add_http01(TOKEN, KEYAUTH)
        self.assertEqual(registry.http01(TOKEN.encode()), KEYAUTH)
        self.assertEqual(len(registry), 1)
        registry.remove_http01(TOKEN)
        self.assertIsNone(registry.http01(TOKEN))
        self.assertEqual(len(registry), 0)

    def test_tokens(self) -> None:
        for bad in ["", "../x", "a/b", "a.b", "a b", b"\xff", "x" * 257]:
            self.assertIsNone(check_token(bad), repr(bad))
        self.assertRaises(ValueError, ChallengeRegistry().add_http01, "../etc", KEYAUTH)

    def test_shared_through_directory(self) -> None:
        """What one process registers, another with the same directory
        answers; removed, it answers no more."""
        d = tmp_dir(self)
        writer, reader = ChallengeRegistry(d), ChallengeRegistry(d)
        cert, key = tls_alpn01_certificate("shop.example", KEYAUTH)
        writer.add_http01(TOKEN, KEYAUTH)
        writer.add_tls_alpn01("Shop.Example", cert, key)
        self.assertEqual(reader.http01(TOKEN), KEYAUTH)
        answer = reader.tls_alpn01(b"shop.example")
        assert answer is not None
        self.assertEqual((answer.cert_pem, answer.key_pem), (cert, key))
        self.assertIsNone(reader.http01("../" + TOKEN))
        self.assertIsNone(reader.tls_alpn01("../shop.example"))
        writer.remove_http01(TOKEN)
        writer.remove_tls_alpn01("shop.example")
        self.assertIsNone(reader.http01(TOKEN))
        self.assertIsNone(reader.tls_alpn01("shop.example"))
        self.assertEqual(sorted(p.name for p in d.rglob("*") if p.is_file()), [])


class TlsAlpnCertificateTests(SynchronousTestCase):
    def test_identifier(self) -> None:
        """The certificate names the domain alone and carries the critical
        acmeIdentifier with the SHA-256 of the key authorization."""
        cert_pem, _ = tls_alpn01_certificate("shop.example", KEYAUTH)
        cert = x509.load_pem_x509_certificate(cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        self.assertEqual(san.get_values_for_type(x509.DNSName), ["shop.example"])
        self.assertTrue(cert.extensions.get_extension_for_oid(ACME_IDENTIFIER).critical)
        self.assertEqual(acme_identifier(cert), hashlib.sha256(KEYAUTH.encode()).digest())

    def test_no_identifier(self) -> None:
        cert = x509.load_pem_x509_certificate(throwaway_rsa()[0])
        self.assertIsNone(acme_identifier(cert))


class Http01Tests(SynchronousTestCase):
    def setUp(self) -> None:
        self.registry = ChallengeRegistry()
        self.registry.add_http01(TOKEN, KEYAUTH)

    def test_response(self) -> None:
        prefix = b"/.well-known/acme-challenge/"
        self.assertEqual(http01_response(self.registry, prefix + TOKEN.encode()), (200, KEYAUTH.encode()))
        self.assertEqual(http01_response(self.registry, prefix + TOKEN.encode() + b"?x=1"), (200, KEYAUTH.encode()))
        self.assertEqual(http01_response(self.registry, prefix + b"other")[0], 404)  # type: ignore[index]
        self.assertEqual(http01_response(self.registry, prefix + b"../../etc/passwd")[0], 404)  # type: ignore[index]
        self.assertIsNone(http01_response(self.registry, b"/index.html"))
        self.assertIsNone(http01_response(self.registry, b"/.well-known/acme-challengeX"))

    def test_resource(self) -> None:
        resource = ChallengeResource(self.registry)
        request = DummyRequest([b".well-known", b"acme-challenge", TOKEN.encode()])
        request.path = b"/.well-known/acme-challenge/" + TOKEN.encode()
        self.assertEqual(resource.render(request), KEYAUTH.encode())
        self.assertEqual(request.responseCode, 200)
        self.assertEqual(request.responseHeaders.getRawHeaders(b"content-type"), [b"text/plain"])
        missing = DummyRequest([])
        missing.path = b"/.well-known/acme-challenge/nope"
        self.assertEqual(resource.render(missing), b"no such ACME challenge\n")
        self.assertEqual(missing.responseCode, 404)


def handshake(server_ctx: SSL.Context, sni: bytes, protocols: list[bytes], rsa_first: bool = False) -> tuple[x509.Certificate, bytes]:
    """A TLS handshake in memory; the certificate and protocol the client
    got.  ``rsa_first``: TLS 1.2 with RSA suites preferred to ECDSA ones (a
    client that would get the listener's RSA certificate if the answer
    were merely added beside it)."""
    client_ctx = SSL.Context(SSL.TLS_CLIENT_METHOD)
    if rsa_first:
        client_ctx.set_max_proto_version(SSL.TLS1_2_VERSION)
        client_ctx.set_cipher_list(b"ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES128-GCM-SHA256")
    client_ctx.set_alpn_protos(protocols)
    client = SSL.Connection(client_ctx, None)
    client.set_tlsext_host_name(sni)
    client.set_connect_state()
    server = SSL.Connection(server_ctx, None)
    server.set_accept_state()
    for _ in range(20):
        for conn in (client, server):
            try:
                conn.do_handshake()
            except SSL.WantReadError:
                pass
        for a, b in ((client, server), (server, client)):
            try:
                data = a.bio_read(65536)
            except SSL.WantReadError:
                continue
            b.bio_write(data)
        peer = client.get_peer_certificate(as_cryptography=True)
        if peer is not None and client.get_alpn_proto_negotiated() is not None and server.get_alpn_proto_negotiated() is not None:
            try:
                client.do_handshake()
                return peer, client.get_alpn_proto_negotiated()
            except SSL.WantReadError:
                pass
    raise AssertionError("no handshake")


class AlpnTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.registry = ChallengeRegistry()
        cert_pem, key = throwaway_rsa()
        self.ctx = SSL.Context(SSL.TLS_SERVER_METHOD)
        self.ctx.use_certificate(x509.load_pem_x509_certificate(cert_pem))
        self.ctx.use_privatekey(key)
        self.ctx.set_alpn_select_callback(alpn_selector([b"h2", b"http/1.1", ACME_TLS_ALPN]))
        self.ctx.set_tlsext_servername_callback(servername_callback(self.registry))
        answer_cert, answer_key = tls_alpn01_certificate("shop.example", KEYAUTH)
        self.registry.add_tls_alpn01("shop.example", answer_cert, answer_key)

    def test_validation_handshake(self) -> None:
        """acme-tls/1 for a name with an answer: the answer alone, whatever
        the client prefers."""
        for rsa_first in (False, True):
            peer, protocol = handshake(self.ctx, b"shop.example", [ACME_TLS_ALPN], rsa_first)
            self.assertEqual(protocol, ACME_TLS_ALPN)
            self.assertEqual(acme_identifier(peer), hashlib.sha256(KEYAUTH.encode()).digest())

    def test_unknown_name(self) -> None:
        """acme-tls/1 for a name without an answer: no protocol agreed, no
        answer served."""
        peer, protocol = handshake(self.ctx, b"other.example", [ACME_TLS_ALPN])
        self.assertEqual(protocol, b"")
        self.assertIsNone(acme_identifier(peer))

    def test_ordinary_handshake(self) -> None:
        """A name without an answer: the listener's certificate and protocols."""
        for rsa_first in (False, True):
            peer, protocol = handshake(self.ctx, b"www.example", [b"http/1.1", b"h2"], rsa_first)
            self.assertEqual(protocol, b"h2")
            self.assertEqual(peer.subject.rfc4514_string(), "CN=default")
            self.assertIsNone(acme_identifier(peer))
        _, protocol = handshake(self.ctx, b"www.example", [b"http/1.1"])
        self.assertEqual(protocol, b"http/1.1")

    def test_ordinary_handshake_during_validation(self) -> None:
        """While an answer is registered for a name, a handshake for it
        without acme-tls/1 gets the answer and agrees on no protocol (the
        server-name callback cannot see ALPN; see servername_callback)."""
        peer, protocol = handshake(self.ctx, b"shop.example", [b"h2"])
        self.assertEqual(protocol, b"")
        self.assertIsNotNone(acme_identifier(peer))

    def test_otherwise(self) -> None:
        """A name without an answer goes to the listener's own callback."""
        seen: list[bytes | None] = []
        self.ctx.set_tlsext_servername_callback(servername_callback(self.registry, lambda c: seen.append(c.get_servername())))
        handshake(self.ctx, b"www.example", [b"h2"])
        handshake(self.ctx, b"shop.example", [ACME_TLS_ALPN])
        self.assertEqual(seen, [b"www.example"])
