"""Automatic certificates through ``twistd prexy --workers 2`` with
Debian's ``pebble`` validating for real: the master orders the listed
host of a ``tls = "acme"`` site at start, pebble's HTTP-01 request reaches
the workers on Prexy's own plain listener (answered before any routing),
the workers serve the stored certificate by SNI (a Python TLS client
verifying it against pebble's root), an unknown name gets the [server]
default certificate and no order, /metrics counts the issuance; with
``--workers 0`` the process issues itself and a host added at reload is
ordered then; a renewal reaches the workers (the master's command on the
control pipe); TLS-ALPN-01 alone is answered on Prexy's ssl: listener;
a name under a wildcard host is issued on demand at its first handshake
once the ask server says yes (and not when it says no, nor asked at all
for a name no site serves).  The wait for a certificate is the issuing process's systemd STATUS line."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import time
import urllib.request
from typing import Any

import pytest
import pytest_twisted
import requests
from cryptography import x509
from twisted.internet import defer, reactor, threads
from twisted.web import resource, server

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


class Setup:
    """pebble validating on Prexy's plain and TLS ports, an origin, a
    default certificate and a config whose site ``shop`` is on ACME."""

    def __init__(self, cleanup: Cleanups, validity: int | None = None) -> None:
        self.cleanup = cleanup
        self.validity = validity
        self.dir = scratch_dir("prexy-acme-twistd-")
        self.plain, self.tls, self.admin = free_port(), free_port(), free_port()
        TestCA().issue("default.test").write(self.dir, "default")
        self.config = os.path.join(self.dir, "prexy.toml")

    @defer.inlineCallbacks
    def start(self) -> Any:
        self.pebble = yield start_pebble(self.cleanup, http_port=self.plain, tls_port=self.tls, validity=self.validity)
        upstream = reactor.listenTCP(0, origin_site(Origin()), interface="127.0.0.1")
        self.cleanup(upstream.stopListening)
        self.upstream = f"http://127.0.0.1:{upstream.getHost().port}"

    def write(self, hosts: list[str], acme: str = "") -> None:
        with open(self.config, "w") as f:
            f.write(
                f"[server]\nlisten = ['tcp:{self.plain}:interface=127.0.0.1', 'ssl:{self.tls}:interface=127.0.0.1']\n"
                f"admin = 'tcp:{self.admin}:interface=127.0.0.1'\naccess_log = 'off'\n"
                "tls_certificate = 'default.crt'\ntls_key = 'default.key'\n"
                f"[acme]\ndirectory = '{self.pebble.directory}'\nca_bundle = '{self.pebble.ca_bundle}'\n"
                f"email = 'ops@example.com'\nstorage = 'acme'\n{acme}"
                f"[sites.shop]\nupstream = '{self.upstream}'\nhosts = {hosts!r}\ntls = 'acme'\n"
            )

    @defer.inlineCallbacks
    def root(self) -> Any:
        """pebble's root (fresh at each start), from its management API, as a file."""
        root = yield threads.deferToThread(requests.get, self.pebble.roots_url, verify=self.pebble.ca_bundle, timeout=5)
        path = os.path.join(self.dir, "pebble-root.pem")
        with open(path, "wb") as f:
            f.write(root.content)
        return path

    def metrics(self) -> Any:
        return threads.deferToThread(fetch, f"http://127.0.0.1:{self.admin}/metrics")


@pytest_twisted.inlineCallbacks
def test_listed_host_issued_at_start_and_served_by_the_workers(cleanup: Cleanups) -> Any:
    setup = Setup(cleanup)
    yield setup.start()
    setup.write(["shop.test"])
    directory, tls, admin = setup.dir, setup.tls, setup.admin
    child = Twistd("--config", setup.config, "--workers", "2")
    cleanup(child.stop)
    stored = child.notified("STATUS=ACME certificate stored: shop.test", 60)
    yield child.ready()
    yield stored
    root_file = yield setup.root()
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
    metrics = yield setup.metrics()
    assert "prexy_acme_orders_total 1\n" in metrics, metrics
    assert "prexy_acme_issued_total 1\n" in metrics, metrics
    assert 'prexy_acme_expiry_days{site="shop"}' in metrics, metrics
    health = yield threads.deferToThread(fetch, f"http://127.0.0.1:{admin}/health")
    assert health == "ok\n"
    assert os.path.exists(os.path.join(directory, "acme", "certs", "shop.test.pem"))


@pytest_twisted.inlineCallbacks
def test_one_process_and_a_host_added_at_reload(cleanup: Cleanups) -> Any:
    """With --workers 0 the process issues itself; a host added by a
    reload is ordered then, the one it had is not ordered again."""
    setup = Setup(cleanup)
    yield setup.start()
    setup.write(["shop.test"])
    child = Twistd("--config", setup.config, "--workers", "0")
    cleanup(child.stop)
    stored = child.notified("STATUS=ACME certificate stored: shop.test", 60)
    yield child.ready()
    yield stored
    setup.write(["shop.test", "www.shop.test"])
    stored = child.notified("STATUS=ACME certificate stored: www.shop.test", 60)
    os.kill(child.process.pid, signal.SIGHUP)
    yield stored
    root_file = yield setup.root()
    for name in ("shop.test", "www.shop.test"):
        cert, answer = yield threads.deferToThread(handshake, setup.tls, name, root_file)
        assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName) == [name]
        assert answer.endswith(b"hello world!"), answer
    metrics = yield setup.metrics()
    assert "prexy_acme_orders_total 2\n" in metrics, metrics
    assert "prexy_acme_issued_total 2\n" in metrics, metrics


@pytest_twisted.inlineCallbacks
def test_renewal_reaches_the_workers(cleanup: Cleanups) -> Any:
    """A 10-second certificate renewed by the master (at two thirds of its
    life) is what the workers serve next: the master's command on the
    control pipe dropped the context they kept."""
    setup = Setup(cleanup, validity=10)
    yield setup.start()
    setup.write(["shop.test"])
    child = Twistd("--config", setup.config, "--workers", "2")
    cleanup(child.stop)
    stored = child.notified("STATUS=ACME certificate stored: shop.test", 60)
    yield child.ready()
    yield stored
    renewed = child.notified("STATUS=ACME certificate stored: shop.test", 30)
    root_file = yield setup.root()
    first = set()
    for _ in range(4):
        cert, _answer = yield threads.deferToThread(handshake, setup.tls, "shop.test", root_file)
        first.add(cert.serial_number)
    assert len(first) == 1
    yield renewed
    for _ in range(4):
        cert, answer = yield threads.deferToThread(handshake, setup.tls, "shop.test", root_file)
        assert cert.serial_number not in first
        assert answer.endswith(b"hello world!"), answer
    metrics = yield setup.metrics()
    assert "prexy_acme_issued_total 2\n" in metrics, metrics


@pytest_twisted.inlineCallbacks
def test_tls_alpn01_answered_by_the_workers(cleanup: Cleanups) -> Any:
    """With TLS-ALPN-01 alone, pebble's validation handshake (ALPN
    acme-tls/1 for the name) reaches a worker on Prexy's ssl: listener."""
    setup = Setup(cleanup)
    yield setup.start()
    setup.write(["shop.test"], acme="challenges = ['tls-alpn-01']\n")
    child = Twistd("--config", setup.config, "--workers", "2")
    cleanup(child.stop)
    stored = child.notified("STATUS=ACME certificate stored: shop.test", 60)
    yield child.ready()
    yield stored
    root_file = yield setup.root()
    cert, answer = yield threads.deferToThread(handshake, setup.tls, "shop.test", root_file)
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == ["shop.test"]
    assert answer.endswith(b"hello world!"), answer


class AskServer(resource.Resource):
    """The ask check's endpoint: 200 for the names ``allowed``, 404 for
    any other; the names asked, in order."""

    isLeaf = True

    def __init__(self, allowed: set[str]) -> None:
        super().__init__()
        self.allowed = allowed
        self.asked: list[str] = []

    def render_GET(self, request: Any) -> bytes:
        name = request.args.get(b"domain", [b""])[0].decode("ascii", "replace")
        self.asked.append(name)
        request.setResponseCode(200 if name in self.allowed else 404)
        return b"yes" if name in self.allowed else b"no"


def timed_handshake(port: int, name: str, cafile: str | None) -> tuple[float, x509.Certificate, bytes]:
    started = time.monotonic()
    cert, answer = handshake(port, name, cafile)
    return time.monotonic() - started, cert, answer


@pytest.mark.parametrize("workers", ["2", "0"])
@pytest_twisted.inlineCallbacks
def test_on_demand_at_the_first_handshake(cleanup: Cleanups, workers: str) -> Any:
    """``hosts = ["*.shop.test"]``: the first handshake for fr.shop.test
    waits for its certificate, ordered by the master once the ask server
    says yes, and gets it (verified against pebble's root) in under 3 s;
    both workers serve it next; four handshakes at once for another new
    name make one question and one order.  A name the ask server refuses
    gets the default certificate and no order; a name no site serves, the
    default and no question to the ask server at all.  With --workers 0
    the process asks its own manager."""
    setup = Setup(cleanup)
    yield setup.start()
    ask = AskServer({"fr.shop.test"})
    listening = reactor.listenTCP(0, server.Site(ask), interface="127.0.0.1")
    cleanup(listening.stopListening)
    setup.write(["*.shop.test"], acme=f"ask = 'http://127.0.0.1:{listening.getHost().port}/check'\n")
    child = Twistd("--config", setup.config, "--workers", workers)
    cleanup(child.stop)
    yield child.ready()
    root_file = yield setup.root()
    took, cert, answer = yield threads.deferToThread(timed_handshake, setup.tls, "fr.shop.test", root_file)
    print(f"--workers {workers}: first handshake for fr.shop.test, certificate issued on demand: {took:.2f} s")
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == ["fr.shop.test"]
    assert answer.endswith(b"hello world!"), answer
    assert took < 3.0, took
    assert ask.asked == ["fr.shop.test"]
    for _ in range(4):  # (either worker)
        cert, _answer = yield threads.deferToThread(handshake, setup.tls, "fr.shop.test", root_file)
        assert cert.subject.rfc4514_string() == "CN=fr.shop.test"
    # Four at once for a new name: one question, one order, all served it.
    ask.allowed.add("de.shop.test")
    results = yield defer.gatherResults(
        [threads.deferToThread(handshake, setup.tls, "de.shop.test", root_file) for _ in range(4)])
    assert {cert.subject.rfc4514_string() for cert, _answer in results} == {"CN=de.shop.test"}
    assert ask.asked == ["fr.shop.test", "de.shop.test"]
    # Refused by the ask server: the default certificate, no order.
    took, cert, _answer = yield threads.deferToThread(timed_handshake, setup.tls, "no.shop.test", None)
    print(f"first handshake for no.shop.test, refused by the ask check: {took:.2f} s")
    assert cert.subject.rfc4514_string() == "CN=default.test"
    assert ask.asked == ["fr.shop.test", "de.shop.test", "no.shop.test"]
    # No site serves it: the default, and not even a question.
    cert, _answer = yield threads.deferToThread(handshake, setup.tls, "x.nobody.test", None)
    assert cert.subject.rfc4514_string() == "CN=default.test"
    assert ask.asked == ["fr.shop.test", "de.shop.test", "no.shop.test"]
    metrics = yield setup.metrics()
    assert "prexy_acme_orders_total 2\n" in metrics, metrics
    assert "prexy_acme_issued_total 2\n" in metrics, metrics
    assert not os.path.exists(os.path.join(setup.dir, "acme", "certs", "no.shop.test.pem"))
