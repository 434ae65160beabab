"""A certificate per site, chosen by SNI: host names matched as nginx's
``server_name`` (exact, then the longest leading wildcard), certificates
checked at load with the file, line and reason, carried by the master's
snapshot, and the handshake's certificate picked from the runtime (in
memory, through pyOpenSSL memory BIOs: no sockets)."""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import attrs
from cryptography import x509
from OpenSSL import SSL
from twisted.trial.unittest import SynchronousTestCase

from prexy.certs import covers, load_certificate
from prexy.config import ConfigError, ConfigMemo, load_config
from prexy.files import Recorder, Snapshot
from prexy.hostnames import HostTable, host_problem
from prexy.runtime import build_runtime
from prexy.service import Options
from prexy.sni import ServerCertificates
from tests.pki import TestCA

NOW = time.time()


class HostTableTests(SynchronousTestCase):
    def test_exact_then_longest_wildcard(self) -> None:
        """nginx's order: the exact name, then the longest leading wildcard;
        a wildcard matches any depth below its name, not the name itself."""
        table = HostTable([("shop.test", "exact"), ("*.shop.test", "short"), ("*.eu.shop.test", "long"),
                           ("www.eu.shop.test", "www")])
        assert table.get("shop.test") == "exact"
        assert table.get("a.shop.test") == "short"
        assert table.get("a.b.shop.test") == "short"
        assert table.get("fr.eu.shop.test") == "long"
        assert table.get("x.fr.eu.shop.test") == "long"
        assert table.get("eu.shop.test") == "short"
        assert table.get("www.eu.shop.test") == "www"
        assert table.get("other.test") is None
        assert table.get("test") is None
        assert table.get("") is None

    def test_case_and_trailing_dot(self) -> None:
        table = HostTable([("Shop.Test.", 1), ("*.B.test", 2)])
        assert table.get("SHOP.test.") == 1
        assert table.get("x.b.TEST.") == 2

    def test_first_entry_wins(self) -> None:
        assert HostTable([("a.test", 1), ("a.test", 2)]).get("a.test") == 1

    def test_host_problems(self) -> None:
        """Names, IP literals and ``*.`` wildcards pass; anything else is refused with why."""
        for good in ("shop.test", "localhost", "127.0.0.1", "[::1]", "*.shop.test", "a_b.test", "xn--bcher-kva.test"):
            assert host_problem(good) is None, good
        for bad, why in (("*.test", "two labels"), ("a.*.test", "first label"), ("*shop.test", "first label"),
                         ("**.shop.test", "first label"), ("shop.test:8080", "not a host name"),
                         ("bücher.test", "ASCII form"), ("-a.test", "not a host name")):
            problem = host_problem(bad)
            assert problem is not None and why in problem, (bad, problem)


class CoversTests(SynchronousTestCase):
    def test_rfc6125(self) -> None:
        """A SAN wildcard covers one whole left-most label; a wildcard host
        only the same wildcard; IP hosts only IP SANs."""
        names = ("shop.test", "*.eu.shop.test")
        assert covers(names, (), "shop.test")
        assert covers(names, (), "fr.eu.shop.test")
        assert not covers(names, (), "a.fr.eu.shop.test")
        assert not covers(names, (), "eu.shop.test")
        assert not covers(names, (), "www.shop.test")
        assert covers(names, (), "*.eu.shop.test")
        assert not covers(("*.eu.shop.test",), (), "*.shop.test")
        assert not covers(("a.shop.test",), (), "*.shop.test")
        assert covers((), ("127.0.0.1", "::1"), "127.0.0.1")
        assert covers((), ("::1",), "[::1]")
        assert not covers(("127.0.0.1",), (), "127.0.0.1")


class _Files:
    """A configuration directory: a CA, certificates, the main file and site files."""

    def __init__(self, test: SynchronousTestCase) -> None:
        self.dir = os.path.abspath(test.mktemp())
        os.makedirs(os.path.join(self.dir, "sites.d"))
        self.ca = TestCA()
        self.issue("default", "default.test")

    def issue(self, stem: str, *names: str, **kw: Any) -> None:
        self.ca.issue(*names, **kw).write(self.dir, stem)

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def write(self, name: str, text: str) -> str:
        with open(self.path(name), "w") as f:
            f.write(text)
        return self.path(name)

    def main(self, sites: str = "", server: str = "") -> str:
        return self.write(
            "prexy.toml",
            "include = 'sites.d/*.toml'\n[server]\nlisten = ['ssl:8443']\n"
            f"tls_certificate = 'default.crt'\ntls_key = 'default.key'\n{server}{sites}",
        )

    def site(self, name: str, hosts: list[str], stem: str | None = None, extra: str = "") -> str:
        text = f"[sites.{name}]\nupstream = 'http://{name}.origin'\nhosts = {hosts!r}\n"
        if stem:
            text += f"tls_certificate = '../{stem}.crt'\ntls_key = '../{stem}.key'\n"
        return self.write(f"sites.d/{name}.toml", text + extra)


class ValidationTests(SynchronousTestCase):
    """Bad certificates are refused at load with the file, the line of
    the key and the reason."""

    def setUp(self) -> None:
        self.f = _Files(self)
        self.main = self.f.main()

    def refused(self, key: str, reason: str, site_file: str, line: int) -> None:
        with self.assertRaises(ConfigError) as caught:
            load_config(self.main, now=NOW)
        error = caught.exception
        assert (error.path, error.line, error.key) == (site_file, line, key), str(error)
        assert reason in error.reason, str(error)

    def test_good_site_certificate(self) -> None:
        """Relative paths resolve against the site file; the certificate
        with its chain is in the SiteConfig."""
        self.f.issue("a", "a.test", "*.a.test")
        self.f.site("a", ["a.test", "*.a.test"], "a")
        site = load_config(self.main, now=NOW).site("a")
        assert site.tls_certificate == self.f.path("a.crt")
        assert site.tls_key == self.f.path("a.key")
        assert site.certificate is not None
        assert site.certificate.dns_names == ("a.test", "*.a.test")
        assert len(x509.load_pem_x509_certificates(site.certificate.chain_pem)) == 2

    def test_key_does_not_match(self) -> None:
        self.f.issue("a", "a.test")
        self.f.issue("other", "a.test")
        path = self.f.site("a", ["a.test"], extra="tls_certificate = '../a.crt'\ntls_key = '../other.key'\n")
        self.refused("sites.a.tls_key", "the key does not match the certificate", path, 5)

    def test_expired(self) -> None:
        self.f.issue("a", "a.test", valid_from=-10, valid_to=-1)
        path = self.f.site("a", ["a.test"], "a")
        self.refused("sites.a.tls_certificate", "certificate expired on", path, 4)

    def test_not_yet_valid(self) -> None:
        self.f.issue("a", "a.test", valid_from=2, valid_to=10)
        path = self.f.site("a", ["a.test"], "a")
        self.refused("sites.a.tls_certificate", "not valid before", path, 4)

    def test_does_not_cover_a_host(self) -> None:
        self.f.issue("a", "a.test", "*.a.test")
        path = self.f.site("a", ["a.test", "x.y.a.test"], "a")
        self.refused("sites.a.tls_certificate", "does not cover host 'x.y.a.test'", path, 4)

    def test_wildcard_host_needs_wildcard_name(self) -> None:
        self.f.issue("a", "www.a.test")
        path = self.f.site("a", ["*.a.test"], "a")
        self.refused("sites.a.tls_certificate", "does not cover host '*.a.test'", path, 4)

    def test_common_name_is_not_used(self) -> None:
        self.f.issue("a", common_name="a.test")
        path = self.f.site("a", ["a.test"], "a")
        self.refused("sites.a.tls_certificate", "(its subjectAltName: none)", path, 4)

    def test_not_pem(self) -> None:
        self.f.write("a.crt", "garbage\n")
        self.f.issue("b", "a.test")
        path = self.f.site("a", ["a.test"], extra="tls_certificate = '../a.crt'\ntls_key = '../b.key'\n")
        self.refused("sites.a.tls_certificate", f"{self.f.path('a.crt')}: not a PEM certificate", path, 4)
        self.f.write("a.key", "garbage\n")
        self.f.issue("a", "a.test")
        self.f.write("a.key", "garbage\n")
        path = self.f.site("a", ["a.test"], "a")
        self.refused("sites.a.tls_key", "not a PEM private key", path, 5)

    def test_missing_file_and_half_a_pair(self) -> None:
        path = self.f.site("a", ["a.test"], "nothing")
        self.refused("sites.a.tls_certificate", "no such file", path, 4)
        self.f.issue("a", "a.test")
        path = self.f.site("a", ["a.test"], extra="tls_certificate = '../a.crt'\n")
        self.refused("sites.a.tls_certificate", "needs tls_key too", path, 4)

    def test_needs_hosts(self) -> None:
        self.f.issue("a", "a.test")
        path = self.f.site("a", [], "a")
        self.refused("sites.a.tls_certificate", "give it hosts", path, 4)

    def test_bad_host(self) -> None:
        path = self.f.site("a", ["a.*.test"])
        self.refused("sites.a.hosts", "first label", path, 3)

    def test_server_certificate_checked(self) -> None:
        self.f.issue("default", "default.test", valid_from=-10, valid_to=-1)
        with self.assertRaises(ConfigError) as caught:
            load_config(self.main, now=NOW)
        assert (caught.exception.line, caught.exception.key) == (4, "server.tls_certificate"), str(caught.exception)
        assert "expired" in str(caught.exception)

    def test_tls_unknown(self) -> None:
        self.f.site("a", ["a.test"])
        assert load_config(self.main).tls_unknown == "default"
        self.main = self.f.main(server="tls_unknown = 'refuse'\n")
        assert load_config(self.main).tls_unknown == "refuse"
        self.main = self.f.main(server="tls_unknown = 'drop'\n")
        with self.assertRaisesRegex(ConfigError, r"prexy.toml:6: server.tls_unknown: must be 'default'"):
            load_config(self.main)

    def test_check(self) -> None:
        """``--check`` refuses with the file, line and reason, and counts
        the sites with their own certificate when all is well."""
        import io

        from prexy.service import ConfigRefused

        self.f.issue("a", "b.test")
        path = self.f.site("a", ["a.test"], "a")
        with self.assertRaises(ConfigRefused) as caught:
            Options().parseOptions(["--config", self.main, "--check"])
        assert str(caught.exception).startswith(f"{path}:4: sites.a.tls_certificate: "), str(caught.exception)
        assert "configuration test failed" in caught.exception.code  # type: ignore[operator]
        self.f.issue("a", "a.test")
        out = io.StringIO()
        self.patch(sys, "stdout", out)
        with self.assertRaises(SystemExit) as ok:
            Options().parseOptions(["--config", self.main, "--check"])
        assert ok.exception.code == 0
        assert "1 site(s) (1 site file(s) included), 1 with a certificate of its own" in out.getvalue()

    def test_worker_loads_without_the_time_check(self) -> None:
        """Without ``now`` (a worker loading what its master validated),
        an expired certificate still loads."""
        self.f.issue("a", "a.test", valid_from=-10, valid_to=-1)
        self.f.site("a", ["a.test"], "a")
        assert load_config(self.main).site("a").certificate is not None

    def test_memo_reads_renewed_certificate(self) -> None:
        """A reload with the site file unchanged but its certificate
        renewed (same paths) gives that site the new certificate, and
        leaves the other sites' values as they were."""
        self.f.issue("a", "a.test")
        self.f.site("a", ["a.test"], "a")
        self.f.site("b", ["b.test"])
        memo = ConfigMemo()
        first = load_config(self.main, memo, now=NOW)
        again = load_config(self.main, memo, now=NOW)
        assert again.site("a") is first.site("a")
        self.f.issue("a", "a.test")
        renewed = load_config(self.main, memo, now=NOW)
        assert renewed.site("a").certificate != first.site("a").certificate
        assert renewed.site("b") is first.site("b")
        self.f.issue("a", "a.test", valid_from=-10, valid_to=-1)
        with self.assertRaisesRegex(ConfigError, r"sites.d/a.toml:4: sites.a.tls_certificate: .*expired"):
            load_config(self.main, memo, now=NOW)


class SnapshotTests(SynchronousTestCase):
    def test_snapshot_carries_the_certificates(self) -> None:
        """The master's recorded load holds the certificate and key files:
        a worker loads the same certificates from the snapshot with the
        files gone."""
        f = _Files(self)
        f.issue("a", "a.test")
        f.site("a", ["a.test"], "a")
        main = f.main()
        recorder = Recorder()
        options = Options()
        options.files = recorder
        options.parseOptions(["--config", main])
        snapshot = Snapshot.decode(recorder.snapshot().encode())
        for name in ("a.crt", "a.key", "default.crt", "default.key"):
            assert f.path(name) in snapshot.contents, name
            os.remove(f.path(name))
        worker = Options()
        worker.check_rules = False
        worker.files = snapshot
        worker.parseOptions(["--config", main])
        assert worker.config.site("a").certificate == options.config.site("a").certificate
        assert worker.tls == options.tls


class Handshake:
    """One TLS handshake in memory against a listener's contexts."""

    def __init__(self, listener: Any, name: bytes | None, alpn: list[bytes] | None = None) -> None:
        self.server = SSL.Connection(listener.getContext(), None)
        self.server.set_accept_state()
        context = SSL.Context(SSL.TLS_CLIENT_METHOD)
        if alpn:
            context.set_alpn_protos(alpn)
        self.client = SSL.Connection(context, None)
        self.client.set_connect_state()
        if name is not None:
            self.client.set_tlsext_host_name(name)
        self.client_error: SSL.Error | None = None
        self.pump(handshake=True)

    def pump(self, handshake: bool = False) -> None:
        for _ in range(20):
            moved = False
            for side, other in ((self.client, self.server), (self.server, self.client)):
                if handshake:
                    try:
                        side.do_handshake()
                    except SSL.WantReadError:
                        pass
                    except SSL.Error as exc:
                        if side is self.client:
                            self.client_error = exc
                            return
                try:
                    data = side.bio_read(1 << 16)
                except SSL.WantReadError:
                    continue
                other.bio_write(data)
                moved = True
            if not moved and not handshake:
                return

    @property
    def subject(self) -> str:
        cert = self.client.get_peer_certificate()
        assert cert is not None, self.client_error
        return cert.to_cryptography().subject.rfc4514_string()

    def echo(self, data: bytes) -> bytes:
        """``data`` sent by the client, read by the server."""
        self.client.send(data)
        self.pump()
        return self.server.recv(1 << 16)


class SelectionTests(SynchronousTestCase):
    """Which certificate a handshake gets, by its server name."""

    def setUp(self) -> None:
        self.f = _Files(self)
        self.f.issue("a", "a.test")
        self.f.issue("b", "*.b.test")
        self.f.issue("deep", "*.deep.b.test")
        self.f.issue("w", "w.b.test")
        self.f.site("a", ["a.test"], "a")
        self.f.site("b", ["*.b.test"], "b")
        self.f.site("deep", ["*.deep.b.test"], "deep")
        self.f.site("w", ["w.b.test"], "w")
        self.f.site("plain", ["plain.test"])
        self.main = self.f.main()
        self.certificates = ServerCertificates(alpn=True)
        self.load()
        with open(self.f.path("default.crt"), "rb") as c, open(self.f.path("default.key"), "rb") as k:
            self.listener = self.certificates.listener(c.read(), k.read())

    def load(self, refuse: bool = False) -> None:
        self.runtime = build_runtime(load_config(self.main, now=NOW))
        self.certificates.update(self.runtime, refuse=refuse)

    def test_by_name(self) -> None:
        """Exact names, the longest wildcard, exact before wildcard."""
        for name, subject in ((b"a.test", "CN=a.test"), (b"A.TEST", "CN=a.test"), (b"x.b.test", "CN=*.b.test"),
                              (b"x.deep.b.test", "CN=*.deep.b.test"), (b"w.b.test", "CN=w.b.test")):
            assert Handshake(self.listener, name).subject == subject, name

    def test_unknown_and_no_name_get_the_default(self) -> None:
        for name in (b"nobody.test", b"b.test", None):
            assert Handshake(self.listener, name).subject == "CN=default.test", name

    def test_site_without_certificate_gets_the_default(self) -> None:
        assert Handshake(self.listener, b"plain.test").subject == "CN=default.test"

    def test_refuse(self) -> None:
        """``tls_unknown = "refuse"``: an unknown name or none gets an
        unrecognized_name alert; a served name (with or without its own
        certificate) still shakes hands."""
        counted: list[str] = []
        self.certificates._count = counted.append
        self.load(refuse=True)
        for name in (b"nobody.test", None):
            handshake = Handshake(self.listener, name)
            assert handshake.client_error is not None, name
            assert "unrecognized name" in str(handshake.client_error), handshake.client_error
        assert counted == ["prexy_tls_refused_total"] * 2
        assert Handshake(self.listener, b"a.test").subject == "CN=a.test"
        assert Handshake(self.listener, b"plain.test").subject == "CN=default.test"

    def test_alpn_and_chain_on_every_certificate(self) -> None:
        for name in (b"a.test", b"x.b.test", b"nobody.test"):
            handshake = Handshake(self.listener, name, [b"h2", b"http/1.1"])
            assert handshake.client.get_alpn_proto_negotiated() == b"h2", name
            assert len(handshake.client.get_peer_cert_chain() or []) == 2, name
        handshake = Handshake(self.listener, b"a.test", [b"http/1.1"])
        assert handshake.client.get_alpn_proto_negotiated() == b"http/1.1"

    def test_one_context_per_certificate(self) -> None:
        """Contexts are made at load, one per distinct certificate; a
        reload keeps the unchanged ones, makes the renewed one, and an
        open connection keeps working on its old context."""
        contexts = dict(self.certificates._contexts)
        assert len(contexts) == 5  # four sites' and the default
        before = Handshake(self.listener, b"a.test")
        old_serial = before.client.get_peer_certificate().to_cryptography().serial_number  # type: ignore[union-attr]
        self.f.issue("a", "a.test")
        self.load()
        after = Handshake(self.listener, b"a.test")
        new_serial = after.client.get_peer_certificate().to_cryptography().serial_number  # type: ignore[union-attr]
        assert new_serial != old_serial
        assert before.echo(b"still here") == b"still here"
        kept = {c: ctx for c, ctx in self.certificates._contexts.items() if c in contexts}
        assert len(kept) == 4 and all(contexts[c] is ctx for c, ctx in kept.items())

    def test_a_renewed_certificate_changes_that_site_alone(self) -> None:
        """Built from the previous runtime, only the site whose certificate
        was renewed is a new SiteRuntime; the others are kept as they were."""
        memo = ConfigMemo()
        first = build_runtime(load_config(self.main, memo, now=NOW))
        self.f.issue("b", "*.b.test")
        second = build_runtime(load_config(self.main, memo, now=NOW), previous=first)
        changed = [s.name for s, t in zip(first.sites, second.sites, strict=True) if s is not t]
        assert changed == ["b"]

    def test_request_host_uses_the_same_table(self) -> None:
        """A request's Host is looked up in the same table: wildcards route
        requests to their site too."""
        assert self.runtime.lookup(b"x.deep.b.test:443").name == "deep"
        assert self.runtime.lookup(b"w.b.test").name == "w"
        assert self.runtime.lookup(b"q.b.test").name == "b"
        assert self.runtime.lookup(b"nobody.test").name == self.runtime.default.name


class CertificateValueTests(SynchronousTestCase):
    def test_equal_by_bytes(self) -> None:
        issued = TestCA().issue("a.test")
        one = load_certificate(issued.chain_pem, issued.key_pem)
        two = load_certificate(issued.chain_pem, issued.key_pem)
        assert one == two and hash(one) == hash(two)
        assert attrs.evolve(one, key_pem=b"x") != one


class InProcessReloadTests(SynchronousTestCase):
    def test_reload_swaps_default_and_site_certificates(self) -> None:
        """A process serving alone (``--workers 0``) reloads renewed
        certificates, the [server] one and a site's, into its listener:
        the next handshakes get them."""
        from twisted.internet.testing import MemoryReactorClock

        from prexy.service import ProxyService

        f = _Files(self)
        f.issue("a", "a.test")
        f.site("a", ["a.test"], "a")
        options = Options()
        options.parseOptions(["--config", f.main(), "--workers", "0"])
        service = ProxyService(MemoryReactorClock(), options.config, options.runtime)
        [listener] = service.certificates._listeners.values()
        before = {name: Handshake(listener, name).client.get_peer_certificate() for name in (b"a.test", None)}
        f.issue("default", "default.test")
        f.issue("a", "a.test")
        assert service.reload(), service.last_reload_error
        for name, old in before.items():
            new = Handshake(listener, name).client.get_peer_certificate()
            assert new is not None and old is not None
            assert new.to_cryptography().serial_number != old.to_cryptography().serial_number, name
