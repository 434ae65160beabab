"""TLS on both sides, with real sockets: https upstreams are verified
(certificate chain and host name, via service-identity), and ssl: listen
endpoints serve with the certificate and key named in the config."""

from __future__ import annotations

import datetime
import os
import tempfile
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import defer, reactor, ssl
from twisted.internet.endpoints import SSL4ClientEndpoint
from twisted.internet.protocol import Factory
from twisted.trial.unittest import TestCase

from prexy.config import Config, SiteConfig, UpstreamURL, parse_config
from prexy.runtime import build_runtime
from prexy.service import ProxyService

from .origin import Origin, origin_site
from .test_service import RawClient, connect


def make_pki(directory: str) -> dict[str, str]:
    """A CA and a server certificate for DNS:localhost (not for 127.0.0.1)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Prexy test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {
        "ca": os.path.join(directory, "ca.pem"),
        "cert": os.path.join(directory, "cert.pem"),
        "key": os.path.join(directory, "key.pem"),
    }
    with open(paths["ca"], "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(paths["cert"], "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(paths["key"], "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths


class TLSTests(TestCase):
    timeout = 60

    def setUp(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="prexy-tls-")
        self.pki = make_pki(self.dir)
        with open(self.pki["key"]) as k, open(self.pki["cert"]) as c:
            server_cert = ssl.PrivateCertificate.loadPEM(k.read() + c.read())
        self.origin = Origin()
        self.tls_port = reactor.listenSSL(
            0, origin_site(self.origin), server_cert.options(), interface="127.0.0.1"
        )
        self.addCleanup(self.tls_port.stopListening)

    @defer.inlineCallbacks
    def proxy(self, upstream: str, ca: str | None) -> Any:
        config = Config(
            listen=("tcp:0:interface=127.0.0.1",),
            sites=(SiteConfig("t", UpstreamURL.parse(upstream), upstream_ca=ca),),
            default_site="t",
            access_log=None,
        )
        svc = ProxyService(reactor, config, build_runtime(config))
        svc.startService()
        self.addCleanup(svc.stopService)
        (port,) = yield svc.listening_ports()
        client = RawClient(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield connect(port.getHost().port, client)
        return bytes(client.data)

    @defer.inlineCallbacks
    def test_verified_upstream(self) -> Any:
        """With the site's CA, an https upstream whose name matches works."""
        answer = yield self.proxy(f"https://localhost:{self.tls_port.getHost().port}", self.pki["ca"])
        self.assertTrue(answer.endswith(b"hello world!"), answer[:200])

    @defer.inlineCallbacks
    def test_untrusted_upstream_is_502(self) -> Any:
        """A certificate from a CA nobody trusts: 502, no request reaches it."""
        answer = yield self.proxy(f"https://localhost:{self.tls_port.getHost().port}", None)
        self.assertTrue(answer.startswith(b"HTTP/1.1 502"), answer[:200])
        self.assertEqual(self.origin.requests, [])

    @defer.inlineCallbacks
    def test_wrong_host_name_is_502(self) -> Any:
        """A trusted certificate for another name (localhost vs 127.0.0.1): 502."""
        answer = yield self.proxy(f"https://127.0.0.1:{self.tls_port.getHost().port}", self.pki["ca"])
        self.assertTrue(answer.startswith(b"HTTP/1.1 502"), answer[:200])
        self.assertEqual(self.origin.requests, [])

    @defer.inlineCallbacks
    def test_ssl_listen_with_config_certificate(self) -> Any:
        """An ssl: listen endpoint uses tls_certificate/tls_key from the config."""
        plain = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        self.addCleanup(plain.stopListening)
        text = (
            f"[server]\nlisten = ['ssl:0:interface=127.0.0.1']\naccess_log = 'off'\n"
            f"tls_certificate = {self.pki['cert']!r}\ntls_key = {self.pki['key']!r}\n"
            f"[sites.t]\nupstream = 'http://127.0.0.1:{plain.getHost().port}'\n"
        )
        config = parse_config(text, os.path.join(self.dir, "p.toml"))
        svc = ProxyService(reactor, config, build_runtime(config))
        svc.startService()
        self.addCleanup(svc.stopService)
        (port,) = yield svc.listening_ports()
        with open(self.pki["ca"], "rb") as f:
            trust = ssl.Certificate.loadPEM(f.read())
        endpoint = SSL4ClientEndpoint(
            reactor, "127.0.0.1", port.getHost().port, ssl.optionsForClientTLS("localhost", trustRoot=trust)
        )
        client = RawClient(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield endpoint.connect(Factory.forProtocol(lambda: client))
        yield client.closed
        self.assertTrue(bytes(client.data).endswith(b"hello world!"), bytes(client.data)[:200])
