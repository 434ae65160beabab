"""A certificate per site, by SNI, through ``twistd prexy --workers 2``:
three sites with their own certificate files, each served its own (a
Python TLS client verifying the name, and ``openssl s_client
-servername``); an unknown name or none gets the [server] default, or an
unrecognized_name alert with ``tls_unknown = "refuse"``; HTTP/2 is still
negotiated by ALPN; a reload with a renewed site certificate serves it in
place while an open connection keeps working; a reload with an expired one
is refused and the running certificates stay; a renewed or moved [server]
certificate is served after a reload."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import ssl
import subprocess
from typing import Any

import pytest_twisted
from cryptography import x509
from twisted.internet import reactor, threads

from tests.pki import TestCA

from .conftest import Cleanups
from .origin import Origin, origin_site
from .twistd_support import Twistd, free_port, scratch_dir


class Setup:
    """A CA, a default certificate, three sites with their own files."""

    def __init__(self, cleanup: Cleanups, server: str = "") -> None:
        self.dir = scratch_dir("prexy-sni-")
        os.makedirs(os.path.join(self.dir, "sites.d"))
        os.makedirs(os.path.join(self.dir, "tls"))
        self.ca = TestCA()
        self.ca_file = self.ca.write(self.dir)
        self.origin = Origin()
        plain = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        cleanup(plain.stopListening)
        upstream = f"http://127.0.0.1:{plain.getHost().port}"
        self.issue("default", "default.test")
        for name, hosts in (("a", ["a.test"]), ("b", ["*.b.test"]), ("c", ["c.test", "www.c.test"])):
            self.issue(name, *hosts)
            with open(os.path.join(self.dir, "sites.d", f"{name}.toml"), "w") as f:
                f.write(f"[sites.{name}]\nupstream = '{upstream}'\nhosts = {hosts!r}\n"
                        f"tls_certificate = '../tls/{name}.crt'\ntls_key = '../tls/{name}.key'\n")
        self.port = free_port()
        self.config = os.path.join(self.dir, "prexy.toml")
        with open(self.config, "w") as f:
            f.write(f"include = 'sites.d/*.toml'\n[server]\nlisten = ['ssl:{self.port}:interface=127.0.0.1']\n"
                    f"access_log = 'off'\ntls_certificate = 'tls/default.crt'\ntls_key = 'tls/default.key'\n{server}")

    def issue(self, stem: str, *names: str, **kw: Any) -> int:
        """(Re)issue ``stem``'s certificate; its serial number."""
        issued = self.ca.issue(*names, **kw)
        issued.write(os.path.join(self.dir, "tls"), stem)
        return int(issued.leaf.serial_number)

    def start(self, cleanup: Cleanups) -> Twistd:
        child = Twistd("--config", self.config, "--workers", "2")
        cleanup(child.stop)
        return child


class Client:
    """A blocking HTTPS client on one connection (run it in a thread)."""

    def __init__(self, port: int, name: str | None, ca: str | None, alpn: list[str] | None = None) -> None:
        if ca is not None and name is not None:
            context = ssl.create_default_context(cafile=ca)
        else:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if alpn:
            context.set_alpn_protocols(alpn)
        raw = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.sock = context.wrap_socket(raw, server_hostname=name)
        self.name = name
        der = self.sock.getpeercert(binary_form=True)
        assert der is not None
        self.cert = x509.load_der_x509_certificate(der)
        self.http = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        self.http.sock = self.sock

    @property
    def subject(self) -> str:
        return self.cert.subject.rfc4514_string()

    def get(self, path: str = "/hello") -> bytes:
        self.http.request("GET", path, headers={"Host": self.name or "default.test"})
        return self.http.getresponse().read()

    def close(self) -> None:
        self.sock.close()


def connect(port: int, name: str | None, ca: str | None = None, alpn: list[str] | None = None) -> Any:
    return threads.deferToThread(Client, port, name, ca, alpn)


def s_client(port: int, name: str | None, ca: str) -> Any:
    """``openssl s_client`` against the port; its output (stdout and stderr)."""
    args = ["openssl", "s_client", "-connect", f"127.0.0.1:{port}", "-CAfile", ca, "-brief"]
    args += ["-servername", name] if name else ["-noservername"]

    def run() -> str:
        done = subprocess.run(args, input=b"", capture_output=True, timeout=20)
        return (done.stdout + done.stderr).decode("utf-8", "replace")

    return threads.deferToThread(run)


@pytest_twisted.inlineCallbacks
def test_each_site_its_own_certificate(cleanup: Cleanups) -> Any:
    setup = Setup(cleanup)
    child = setup.start(cleanup)
    yield child.ready()
    for name, subject in (("a.test", "CN=a.test"), ("x.b.test", "CN=*.b.test"), ("www.c.test", "CN=c.test")):
        client = yield connect(setup.port, name, setup.ca_file)  # verifies the chain and the name
        assert client.subject == subject
        answer = yield threads.deferToThread(client.get)
        assert answer == b"hello world!"
        client.close()
        out = yield s_client(setup.port, name, setup.ca_file)
        assert f"Peer certificate: CN = {subject[3:]}" in out, out
        assert "Verification: OK" in out, out
    for name in ("nobody.test", None):
        client = yield connect(setup.port, name)
        assert client.subject == "CN=default.test", name
        client.close()
    out = yield s_client(setup.port, "nobody.test", setup.ca_file)
    assert "Peer certificate: CN = default.test" in out, out
    # HTTP/2 by ALPN, on a site's certificate and on the default one.
    for name in ("a.test", "nobody.test"):
        client = yield connect(setup.port, name, alpn=["h2", "http/1.1"])
        assert client.sock.selected_alpn_protocol() == "h2"
        client.close()


@pytest_twisted.inlineCallbacks
def test_refuse_unknown_names(cleanup: Cleanups) -> Any:
    setup = Setup(cleanup, server="tls_unknown = 'refuse'\n")
    child = setup.start(cleanup)
    yield child.ready()
    for name in ("nobody.test", None):
        try:
            yield connect(setup.port, name)
        except ssl.SSLError as exc:
            assert "UNRECOGNIZED_NAME" in str(exc), exc
        else:
            raise AssertionError(f"{name}: handshake not refused")
    out = yield s_client(setup.port, "nobody.test", setup.ca_file)
    assert "unrecognized name" in out, out
    client = yield connect(setup.port, "a.test", setup.ca_file)
    assert client.subject == "CN=a.test"
    assert (yield threads.deferToThread(client.get)) == b"hello world!"
    client.close()
    assert "Traceback" not in child.output()


@pytest_twisted.inlineCallbacks
def test_reload_swaps_a_site_certificate_in_place(cleanup: Cleanups) -> Any:
    """The renewed certificate of site a is served after a reload, done in
    place (the same workers); a connection opened before it keeps working;
    an expired certificate is then refused with its file and line, and
    the renewed one stays."""
    setup = Setup(cleanup)
    child = setup.start(cleanup)
    yield child.ready()
    workers = sorted(child.children())
    before = yield connect(setup.port, "a.test", setup.ca_file)
    assert (yield threads.deferToThread(before.get)) == b"hello world!"
    serial = setup.issue("a", "a.test")
    reloaded = child.notified("READY=1")
    os.kill(child.process.pid, signal.SIGHUP)
    yield reloaded
    assert "only sites changed; 2 worker(s) reload in place" in child.output()
    assert child.output().count("TLS: 4 certificate(s) ready, 1 new") == 2  # (a's, in each worker)
    assert sorted(child.children()) == workers
    for _ in range(4):  # (both workers)
        after = yield connect(setup.port, "a.test", setup.ca_file)
        assert after.cert.serial_number == serial
        after.close()
    other = yield connect(setup.port, "x.b.test", setup.ca_file)
    assert other.subject == "CN=*.b.test"
    other.close()
    assert (yield threads.deferToThread(before.get)) == b"hello world!"
    before.close()
    setup.issue("a", "a.test", valid_from=-10, valid_to=-1)
    refused = child.notified("READY=1")
    os.kill(child.process.pid, signal.SIGHUP)
    yield refused
    site_file = os.path.join(setup.dir, "sites.d", "a.toml")
    assert f"reload refused, keeping the running configuration: {site_file}:4: sites.a.tls_certificate:" in (
        child.output()
    )
    still = yield connect(setup.port, "a.test", setup.ca_file)
    assert still.cert.serial_number == serial
    still.close()


@pytest_twisted.inlineCallbacks
def test_reload_with_a_new_server_certificate(cleanup: Cleanups) -> Any:
    """The [server] certificate renewed in its files (in place: the same
    workers), then moved to other files (a new generation of workers):
    each reload serves the new default certificate, and the sites keep
    theirs."""
    setup = Setup(cleanup)
    child = setup.start(cleanup)
    yield child.ready()
    workers = sorted(child.children())
    serial = setup.issue("default", "default.test")
    reloaded = child.notified("READY=1")
    os.kill(child.process.pid, signal.SIGHUP)
    yield reloaded
    assert sorted(child.children()) == workers
    for _ in range(4):
        client = yield connect(setup.port, "nobody.test")
        assert client.cert.serial_number == serial
        client.close()
    serial = setup.issue("moved", "default.test")
    with open(setup.config) as f:
        text = f.read()
    with open(setup.config, "w") as f:
        f.write(text.replace("tls/default.", "tls/moved."))
    reloaded = child.notified("READY=1")
    os.kill(child.process.pid, signal.SIGHUP)
    yield reloaded
    assert "reload: starting worker generation 2" in child.output()
    for _ in range(4):
        client = yield connect(setup.port, "nobody.test")
        assert client.cert.serial_number == serial, child.output()[-3000:]
        client.close()
    client = yield connect(setup.port, "a.test", setup.ca_file)
    assert client.subject == "CN=a.test"
    client.close()
    assert "Traceback" not in child.output(), child.output()[-3000:]
