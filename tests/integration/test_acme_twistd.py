"""Automatic certificates through ``twistd prexy --workers 2`` with
Debian's ``pebble`` validating for real: the master orders the listed
host of a ``tls = "acme"`` site at start, pebble's HTTP-01 request reaches
the workers on Prexy's own plain listener (answered before any routing),
the workers serve the stored certificate by SNI (a Python TLS client
verifying it against pebble's root), an unknown name gets the [server]
default certificate and no order, /metrics counts the issuance.  The wait
for the certificate is the master's systemd status line."""

from __future__ import annotations

import os
import socket
import ssl
import urllib.request
from typing import Any

import pytest
import pytest_twisted
import requests
from cryptography import x509
from twisted.internet import reactor, threads

from tests.pki import TestCA

from .conftest import Cleanups
from .origin import Origin, origin_site
from .pebble import CHALLTESTSRV, PEBBLE, start_pebble
from .twistd_support import Twistd, free_port, scratch_dir

pytestmark = pytest.mark.skipif(
    PEBBLE is None or CHALLTESTSRV is None, reason="needs pebble and pebble-challtestsrv (Debian: apt-get install pebble)"
)


def handshake(port: int, name: str, cafile: str | None) -> tuple[x509.Certificate, bytes]:
    """A TLS handshake for ``name`` (verified against ``cafile`` when
    given), then GET /hello on it: the peer's certificate and the answer."""
    if cafile is not None:
        context = ssl.create_default_context(cafile=cafile)
    else:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=15) as raw:
        with context.wrap_socket(raw, server_hostname=name) as sock:
            der = sock.getpeercert(binary_form=True)
            assert der is not None
            sock.sendall(f"GET /hello HTTP/1.1\r\nHost: {name}\r\nConnection: close\r\n\r\n".encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
    return x509.load_der_x509_certificate(der), answer


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode("utf-8")


@pytest_twisted.inlineCallbacks
def test_listed_host_issued_at_start_and_served_by_the_workers(cleanup: Cleanups) -> Any:
    directory = scratch_dir("prexy-acme-twistd-")
    plain, tls, admin = free_port(), free_port(), free_port()
    pebble = yield start_pebble(cleanup, http_port=plain, tls_port=tls)
    ca = TestCA()
    ca.issue("default.test").write(directory, "default")
    origin = Origin()
    upstream = reactor.listenTCP(0, origin_site(origin), interface="127.0.0.1")
    cleanup(upstream.stopListening)
    config = os.path.join(directory, "prexy.toml")
    with open(config, "w") as f:
        f.write(
            f"[server]\nlisten = ['tcp:{plain}:interface=127.0.0.1', 'ssl:{tls}:interface=127.0.0.1']\n"
            f"admin = 'tcp:{admin}:interface=127.0.0.1'\naccess_log = 'off'\n"
            "tls_certificate = 'default.crt'\ntls_key = 'default.key'\n"
            f"[acme]\ndirectory = '{pebble.directory}'\nca_bundle = '{pebble.ca_bundle}'\n"
            "email = 'ops@example.com'\nstorage = 'acme'\n"
            f"[sites.shop]\nupstream = 'http://127.0.0.1:{upstream.getHost().port}'\n"
            "hosts = ['shop.test']\ntls = 'acme'\n"
        )
    child = Twistd("--config", config, "--workers", "2")
    cleanup(child.stop)
    stored = child.notified("STATUS=ACME certificate stored: shop.test", 60)
    yield child.ready()
    yield stored
    root = yield threads.deferToThread(requests.get, pebble.roots_url, verify=pebble.ca_bundle, timeout=5)
    root_file = os.path.join(directory, "pebble-root.pem")
    with open(root_file, "wb") as f:
        f.write(root.content)
    # Verified against pebble's root, for the name, over and over (the
    # shared port hands the connections to either worker).
    for _ in range(6):
        cert, answer = yield threads.deferToThread(handshake, tls, "shop.test", root_file)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == ["shop.test"]
        assert answer.endswith(b"hello world!"), answer
    # Each worker read the file once at most: the handshakes after came from memory.
    assert 1 <= child.output().count("ACME: serving the stored certificate of shop.test") <= 2, child.output()
    # A name no site serves: the default certificate, no order.
    cert, _ = yield threads.deferToThread(handshake, tls, "nobody.test", None)
    assert cert.subject.rfc4514_string() == "CN=default.test"
    metrics = yield threads.deferToThread(fetch, f"http://127.0.0.1:{admin}/metrics")
    assert "prexy_acme_orders_total 1\n" in metrics, metrics
    assert "prexy_acme_issued_total 1\n" in metrics, metrics
    assert 'prexy_acme_expiry_days{site="shop"}' in metrics, metrics
    health = yield threads.deferToThread(fetch, f"http://127.0.0.1:{admin}/health")
    assert health == "ok\n"
    assert os.path.exists(os.path.join(directory, "acme", "certs", "shop.test.pem"))
