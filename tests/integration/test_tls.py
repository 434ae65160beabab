"""TLS on both sides, with real sockets: https upstreams are verified
(certificate chain and host name, via service-identity), and ssl: listen
endpoints serve with the certificate and key named in the config."""

from __future__ import annotations

import datetime
import os
from typing import Any

import pytest
import pytest_twisted
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from twisted.internet import defer, reactor, ssl
from twisted.internet.endpoints import SSL4ClientEndpoint
from twisted.internet.protocol import Factory

from prexy.config import Config, SiteConfig, UpstreamURL, parse_config

from .conftest import Cleanups, Proxy
from .origin import Origin, origin_site
from .test_service import RawClient, connect
from .twistd_support import scratch_dir


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


class TLSOrigin:
    """A CA, a certificate for localhost, and an origin serving it."""

    def __init__(self, cleanup: Cleanups) -> None:
        self.dir = scratch_dir("prexy-tls-")
        self.pki = make_pki(self.dir)
        with open(self.pki["key"]) as k, open(self.pki["cert"]) as c:
            server_cert = ssl.PrivateCertificate.loadPEM(k.read() + c.read())
        self.origin = Origin()
        self.tls_port = reactor.listenSSL(0, origin_site(self.origin), server_cert.options(), interface="127.0.0.1")
        cleanup(self.tls_port.stopListening)


@pytest.fixture
def tls(cleanup: Cleanups) -> TLSOrigin:
    return TLSOrigin(cleanup)


@defer.inlineCallbacks
def through_proxy(proxy: Proxy, upstream: str, ca: str | None) -> Any:
    config = Config(
        listen=("tcp:0:interface=127.0.0.1",),
        sites=(SiteConfig("t", UpstreamURL.parse(upstream), upstream_ca=ca),),
        default_site="t",
        access_log=None,
    )
    yield proxy.start(config)
    client = RawClient(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    yield connect(proxy.port, client)
    return bytes(client.data)


@pytest_twisted.inlineCallbacks
def test_verified_upstream(tls: TLSOrigin, proxy: Proxy) -> Any:
    """With the site's CA, an https upstream whose name matches works."""
    answer = yield through_proxy(proxy, f"https://localhost:{tls.tls_port.getHost().port}", tls.pki["ca"])
    assert answer.endswith(b"hello world!"), answer[:200]


@pytest_twisted.inlineCallbacks
def test_untrusted_upstream_is_502(tls: TLSOrigin, proxy: Proxy) -> Any:
    """A certificate from a CA nobody trusts: 502, no request reaches it."""
    answer = yield through_proxy(proxy, f"https://localhost:{tls.tls_port.getHost().port}", None)
    assert answer.startswith(b"HTTP/1.1 502"), answer[:200]
    assert tls.origin.requests == []


@pytest_twisted.inlineCallbacks
def test_wrong_host_name_is_502(tls: TLSOrigin, proxy: Proxy) -> Any:
    """A trusted certificate for another name (localhost vs 127.0.0.1): 502."""
    answer = yield through_proxy(proxy, f"https://127.0.0.1:{tls.tls_port.getHost().port}", tls.pki["ca"])
    assert answer.startswith(b"HTTP/1.1 502"), answer[:200]
    assert tls.origin.requests == []


@pytest_twisted.inlineCallbacks
def test_ssl_listen_with_config_certificate(tls: TLSOrigin, proxy: Proxy, cleanup: Cleanups) -> Any:
    """An ssl: listen endpoint uses tls_certificate/tls_key from the config."""
    plain = reactor.listenTCP(0, origin_site(tls.origin), interface="127.0.0.1")
    cleanup(plain.stopListening)
    text = (
        f"[server]\nlisten = ['ssl:0:interface=127.0.0.1']\naccess_log = 'off'\n"
        f"tls_certificate = {tls.pki['cert']!r}\ntls_key = {tls.pki['key']!r}\n"
        f"[sites.t]\nupstream = 'http://127.0.0.1:{plain.getHost().port}'\n"
    )
    config = parse_config(text, os.path.join(tls.dir, "p.toml"))
    yield proxy.start(config)
    with open(tls.pki["ca"], "rb") as f:
        trust = ssl.Certificate.loadPEM(f.read())
    endpoint = SSL4ClientEndpoint(
        reactor, "127.0.0.1", proxy.port, ssl.optionsForClientTLS("localhost", trustRoot=trust)
    )
    client = RawClient(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    yield endpoint.connect(Factory.forProtocol(lambda: client))
    yield client.closed
    assert bytes(client.data).endswith(b"hello world!"), bytes(client.data)[:200]


@pytest_twisted.inlineCallbacks
def test_restarted_workers_trust_the_validated_ca(tls: TLSOrigin, cleanup: Cleanups) -> Any:
    """Through ``twistd prexy --workers 2``: the site's CA file replaced by
    garbage without a reload, then every worker killed: the replacements
    trust the CA the master validated and the https upstream still answers."""
    import signal

    from .twistd_support import Twistd, free_port

    port = free_port()
    config = os.path.join(tls.dir, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f"[server]\nlisten = ['tcp:{port}:interface=127.0.0.1']\naccess_log = 'off'\nworkers = 2\n"
            f"[sites.t]\nupstream = 'https://localhost:{tls.tls_port.getHost().port}'\n"
            f"upstream_ca = {tls.pki['ca']!r}\n"
        )
    child = Twistd("--config", config)
    cleanup(child.stop)
    yield child.ready()

    @defer.inlineCallbacks
    def get() -> Any:
        client = RawClient(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield connect(port, client)
        return bytes(client.data)

    assert (yield get()).endswith(b"hello world!")
    with open(tls.pki["ca"], "wb") as f:
        f.write(b"not a certificate\n")
    for victim in child.children():
        replaced = child.notified("READY=1", seconds=15)
        os.kill(victim, signal.SIGKILL)
        yield replaced
    answers = yield defer.gatherResults([get() for _ in range(6)])
    assert all(a.endswith(b"hello world!") for a in answers), answers[0][:300]


@pytest_twisted.inlineCallbacks
def test_restarted_workers_serve_the_validated_certificate(tls: TLSOrigin, cleanup: Cleanups) -> Any:
    """Through ``twistd prexy --workers 2`` with an ssl: listener: the key
    and certificate overwritten with garbage, SIGHUP is refused naming the
    file, then every worker killed: the replacements serve TLS with the key
    and certificate the master validated."""
    import signal

    from .twistd_support import Twistd, free_port

    plain = reactor.listenTCP(0, origin_site(tls.origin), interface="127.0.0.1")
    cleanup(plain.stopListening)
    port = free_port()
    config = os.path.join(tls.dir, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f"[server]\nlisten = ['ssl:{port}:interface=127.0.0.1']\naccess_log = 'off'\nworkers = 2\n"
            f"tls_certificate = {tls.pki['cert']!r}\ntls_key = {tls.pki['key']!r}\n"
            f"[sites.t]\nupstream = 'http://127.0.0.1:{plain.getHost().port}'\n"
        )
    child = Twistd("--config", config)
    cleanup(child.stop)
    yield child.ready()
    with open(tls.pki["ca"], "rb") as f:
        trust = ssl.Certificate.loadPEM(f.read())

    @defer.inlineCallbacks
    def get() -> Any:
        endpoint = SSL4ClientEndpoint(reactor, "127.0.0.1", port, ssl.optionsForClientTLS("localhost", trustRoot=trust))
        client = RawClient(b"GET /hello HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        yield endpoint.connect(Factory.forProtocol(lambda: client))
        yield client.closed
        return bytes(client.data)

    assert (yield get()).endswith(b"hello world!")
    for name in ("key", "cert"):
        with open(tls.pki[name], "wb") as f:
            f.write(b"garbage\n")
    refused = child.notified("READY=1")
    os.kill(child.process.pid, signal.SIGHUP)
    yield refused
    assert (
        f"reload refused, keeping the running configuration: {config}:5: server.tls_certificate: "
        f"{tls.pki['cert']}: not a PEM certificate" in child.output()
    )
    for victim in child.children():
        replaced = child.notified("READY=1", seconds=15)
        os.kill(victim, signal.SIGKILL)
        yield replaced
    answers = yield defer.gatherResults([get() for _ in range(6)])
    assert all(a.endswith(b"hello world!") for a in answers), answers[0][:300]
