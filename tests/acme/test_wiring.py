"""ACME wired into Prexy: the ``[acme]`` table and a site's ``tls =
"acme"`` checked with file, line and reason; HTTP-01 answered before any
site's routing or map; the SNI selection serving an ACME site's stored
certificate from a memo (read once, dropped when told), TLS-ALPN-01 for
its names; the metrics and health lines.  In memory: pyOpenSSL memory BIOs,
a StringTransport, no sockets."""

from __future__ import annotations

import os
import sys
from io import StringIO
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.acme.challenges import ChallengeRegistry, acme_identifier, tls_alpn01_certificate
from prexy.acme.service import health_lines, metric_lines
from prexy.acme.storage import Storage
from prexy.config import ConfigError, default_acme_storage, load_config
from prexy.runtime import build_runtime
from prexy.service import Options
from prexy.sni import ServerCertificates
from tests.pki import TestCA
from tests.proxy.support import Harness, parse_response
from tests.test_sni import NOW, Handshake, _Files

ACME = "[acme]\ndirectory = 'https://ca.test/dir'\nemail = 'ops@shop.test'\n"


class ConfigTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.f = _Files(self)

    def load(self, acme: str = ACME, site: str = "tls = 'acme'\n", hosts: list[str] | None = None) -> Any:
        self.f.site("shop", hosts if hosts is not None else ["shop.test", "*.shop.test"], extra=site)
        return load_config(self.f.main(sites="\n" + acme), now=NOW)

    def refused(self, key: str, reason: str, line: int, in_site: bool = False, **kw: Any) -> None:
        with self.assertRaises(ConfigError) as caught:
            self.load(**kw)
        error = caught.exception
        path = self.f.path("sites.d/shop.toml") if in_site else self.f.path("prexy.toml")
        assert (error.path, error.line, error.key) == (path, line, key), str(error)
        assert reason in error.reason, str(error)

    def test_good(self) -> None:
        """Relative files resolve against the config file; the site's hosts
        are what the issuer gets."""
        self.f.write("pebble.pem", "x")
        config = self.load(ACME + "ca_bundle = 'pebble.pem'\nstorage = 'state/acme'\nchallenges = ['tls-alpn-01']\n"
                           "ask = 'http://127.0.0.1:9/ask'\nper_domain_per_hour = 20\nconcurrent = 4\n")
        acme = config.acme
        assert acme.directory == "https://ca.test/dir"
        assert acme.email == "ops@shop.test"
        assert acme.ca_bundle == self.f.path("pebble.pem")
        assert acme.storage == self.f.path("state/acme")
        assert acme.challenges == ("tls-alpn-01",)
        assert acme.ask == "http://127.0.0.1:9/ask"
        assert (acme.per_domain_per_hour, acme.concurrent) == (20, 4)
        assert config.site("shop").acme
        assert config.acme_sites() == {"shop": ("shop.test", "*.shop.test")}

    def test_defaults(self) -> None:
        self.patch(os, "environ", {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"})
        acme = self.load().acme
        assert acme.challenges == ("http-01", "tls-alpn-01")
        assert acme.storage == default_acme_storage("")
        assert (acme.email, acme.ca_bundle, acme.ask) == ("ops@shop.test", None, None)

    def test_default_storage_beside_the_cache(self) -> None:
        self.patch(os, "environ", {k: v for k, v in os.environ.items() if k != "STATE_DIRECTORY"})
        assert default_acme_storage("/srv/prexy/cache") == "/srv/prexy/prexy-acme"
        assert default_acme_storage("/srv/prexy/cache/") == "/srv/prexy/prexy-acme"
        assert not default_acme_storage("").startswith("/dev/shm")

    def test_default_storage_under_systemd(self) -> None:
        """systemd's StateDirectory= (conf/prexy.service: /var/lib/prexy) first."""
        self.patch(os, "environ", {**os.environ, "STATE_DIRECTORY": "/var/lib/prexy:/var/lib/other"})
        assert default_acme_storage("/var/cache/prexy/store") == "/var/lib/prexy/acme"

    def test_site_errors(self) -> None:
        self.refused("sites.shop.tls", "the only value is \"acme\"", 4, True, site="tls = 'auto'\n")
        self.refused("sites.shop.tls", "needs an [acme] table", 4, True, acme="")
        self.refused("sites.shop.tls", "give it hosts", 4, True, hosts=[])
        self.f.issue("shop", "shop.test")
        self.refused("sites.shop.tls", "not both", 4, True,
                     site="tls = 'acme'\ntls_certificate = '../shop.crt'\ntls_key = '../shop.key'\n",
                     hosts=["shop.test"])

    def test_acme_removed_under_an_unchanged_site_file(self) -> None:
        """A reload reusing a parsed site file still checks it has its [acme]."""
        from prexy.config import ConfigMemo

        memo = ConfigMemo()
        self.f.site("shop", ["shop.test"], extra="tls = 'acme'\n")
        load_config(self.f.main(sites="\n" + ACME), memo, now=NOW)
        with self.assertRaises(ConfigError) as caught:
            load_config(self.f.main(), memo, now=NOW)
        assert (caught.exception.path, caught.exception.line, caught.exception.key) == (
            self.f.path("sites.d/shop.toml"), 4, "sites.shop.tls")

    def test_table_errors(self) -> None:
        # (the main file: [acme] on line 7, directory 8, email 9, the next 10)
        for acme, key, reason, line in (
            ("[acme]\nemail = 'a@b.test'\n", "acme", "missing key 'directory'", 7),
            ("[acme]\ndirectory = 'http://ca.test/dir'\n", "acme.directory", "https://", 8),
            ("[acme]\ndirectory = 'https://ca.test/dir'\nemail = 'nobody'\n", "acme.email", "not an e-mail", 9),
            (ACME + "ca_bundle = 'none.pem'\n", "acme.ca_bundle", "no such file", 10),
            (ACME + "challenges = ['dns-01']\n", "acme.challenges", "non-empty list", 10),
            (ACME + "challenges = []\n", "acme.challenges", "non-empty list", 10),
            (ACME + "challenges = ['http-01', 'http-01']\n", "acme.challenges", "twice", 10),
            (ACME + "ask = 'ftp://x'\n", "acme.ask", "http://", 10),
            (ACME + "concurrent = 0\n", "acme.concurrent", "1 or more", 10),
            (ACME + "per_domain_per_hour = 'many'\n", "acme.per_domain_per_hour", "must be a int", 10),
            (ACME + "renew = true\n", "acme.renew", "unknown key", 10),
        ):
            self.refused(key, reason, line, acme=acme)

    def test_check_says_it(self) -> None:
        self.f.site("shop", ["shop.test"], extra="tls = 'acme'\n")
        main = self.f.main(sites="\n" + ACME + "storage = 'st'\n")
        out = StringIO()
        self.patch(sys, "stdout", out)
        with self.assertRaises(SystemExit) as done:
            Options().parseOptions(["--config", main, "--check"])
        assert done.exception.code == 0
        assert f"1 on ACME (1 listed name(s), from https://ca.test/dir, stored in {self.f.path('st')})" in out.getvalue()


class Http01Tests(SynchronousTestCase):
    """The CA's request is answered before the site's routing, map or cache."""

    def test_answered_before_routing(self) -> None:
        h = Harness()
        registry = ChallengeRegistry(self.mktemp())
        registry.add_http01("tok-123_", "tok-123_.thumb")
        h.resource.challenges = registry
        _, client = h.send(b"GET /.well-known/acme-challenge/tok-123_ HTTP/1.1\r\nHost: anything.test\r\n\r\n")
        status, headers, body = parse_response(client.value())
        assert (status, body) == (200, b"tok-123_.thumb")
        assert (b"cache-control", b"no-store") in [(k.lower(), v) for k, v in headers]
        _, client = h.send(b"GET /.well-known/acme-challenge/unknown HTTP/1.1\r\nHost: x.test\r\n\r\n")
        assert parse_response(client.value())[0] == 404
        assert h.conns == []  # nothing went upstream

    def test_another_process_answers_from_the_files(self) -> None:
        """A worker's registry over the same directory reads what the issuing process wrote."""
        directory = self.mktemp()
        ChallengeRegistry(directory).add_http01("tok", "tok.thumb")
        h = Harness()
        h.resource.challenges = ChallengeRegistry(directory)
        _, client = h.send(b"GET /.well-known/acme-challenge/tok HTTP/1.1\r\nHost: x.test\r\n\r\n")
        assert parse_response(client.value())[2] == b"tok.thumb"

    def test_without_acme_the_path_is_proxied(self) -> None:
        h = Harness()
        h.send(b"GET /.well-known/acme-challenge/tok HTTP/1.1\r\nHost: x.test\r\n\r\n")
        assert len(h.conns) == 1


class SelectionTests(SynchronousTestCase):
    """A handshake for an ACME site's name gets its stored certificate."""

    def setUp(self) -> None:
        self.f = _Files(self)
        self.f.issue("own", "own.test")
        self.f.site("own", ["own.test"], "own")
        self.f.site("shop", ["shop.test", "www.shop.test"], extra="tls = 'acme'\n")
        self.storage_dir = self.f.path("acme")
        self.main = self.f.main(sites="\n" + ACME + "storage = 'acme'\n")
        self.storage = Storage(self.storage_dir)
        self.acme_ca = TestCA("ACME test CA")
        self.registry = ChallengeRegistry(os.path.join(self.storage_dir, "challenges"))
        self.certificates = ServerCertificates(alpn=True)
        self.certificates.use_acme(self.storage_dir, self.registry)
        self.certificates.update(build_runtime(load_config(self.main, now=NOW)))
        with open(self.f.path("default.crt"), "rb") as c, open(self.f.path("default.key"), "rb") as k:
            self.listener = self.certificates.listener(c.read(), k.read())

    def store(self, name: str, days: float = 30) -> int:
        issued = self.acme_ca.issue(name, valid_to=days)
        self.storage.save(name, issued.key_pem, issued.chain_pem)
        return int(issued.leaf.serial_number)

    def serial(self, name: bytes) -> int:
        cert = Handshake(self.listener, name).client.get_peer_certificate()
        assert cert is not None
        return int(cert.to_cryptography().serial_number)

    def test_stored_certificate_by_name(self) -> None:
        serial = self.store("shop.test")
        assert self.serial(b"shop.test") == serial
        assert Handshake(self.listener, b"shop.test").subject == "CN=shop.test"
        assert Handshake(self.listener, b"own.test").subject == "CN=own.test"

    def test_none_yet_gets_the_default(self) -> None:
        assert Handshake(self.listener, b"www.shop.test").subject == "CN=default.test"

    def test_read_once_then_from_memory(self) -> None:
        """No file read per handshake: the first reads, the others do not;
        neither does a name of another site, nor one no site serves."""
        self.store("shop.test")
        for _ in range(5):
            Handshake(self.listener, b"shop.test")
        for name in (b"own.test", b"nobody.test", None):
            Handshake(self.listener, name)
        assert self.certificates.acme.reads == 1

    def test_memo_dropped_when_told(self) -> None:
        """A renewed (or first) certificate is served once the issuing
        process says it stored it, not before."""
        assert Handshake(self.listener, b"shop.test").subject == "CN=default.test"
        first = self.store("shop.test")
        assert Handshake(self.listener, b"shop.test").subject == "CN=default.test"  # remembered: none
        self.certificates.acme.forget("shop.test")
        assert self.serial(b"shop.test") == first
        renewed = self.store("shop.test")
        assert self.serial(b"shop.test") == first
        self.certificates.acme.forget("SHOP.test.")
        assert self.serial(b"shop.test") == renewed
        assert self.certificates.acme.reads == 3

    def test_memo_bounded(self) -> None:
        self.certificates.acme.size = 1
        self.store("shop.test")
        self.store("www.shop.test")
        Handshake(self.listener, b"shop.test")
        Handshake(self.listener, b"www.shop.test")
        assert len(self.certificates.acme) == 1
        Handshake(self.listener, b"shop.test")
        assert self.certificates.acme.reads == 3

    def test_worker_told_by_its_master(self) -> None:
        """The master's ``{"certificate": NAME}`` command reaches the memo."""
        from prexy.service import ProxyService

        self.store("shop.test")
        Handshake(self.listener, b"shop.test")
        fake: Any = type("Fake", (), {"certificates": self.certificates})()
        ProxyService.certificate_stored(fake, "shop.test")
        assert len(self.certificates.acme) == 0

    def test_tls_alpn01(self) -> None:
        """A validation handshake for an ACME name gets the answer's
        certificate and agrees on acme-tls/1."""
        self.store("shop.test")
        cert_pem, key_pem = tls_alpn01_certificate("shop.test", "tok.thumb")
        self.registry.add_tls_alpn01("shop.test", cert_pem, key_pem)
        shake = Handshake(self.listener, b"shop.test", alpn=[b"acme-tls/1"])
        peer = shake.client.get_peer_certificate()
        assert peer is not None and acme_identifier(peer.to_cryptography()) is not None
        assert shake.client.get_alpn_proto_negotiated() == b"acme-tls/1"
        # (never for a name of another site)
        self.registry.add_tls_alpn01("own.test", cert_pem, key_pem)
        assert Handshake(self.listener, b"own.test", alpn=[b"acme-tls/1", b"http/1.1"]).subject == "CN=own.test"


class ReportTests(SynchronousTestCase):
    def test_metrics_and_health(self) -> None:
        health = {
            "earliest_expiry_days": {"shop": 59.5, 'we"ird': 1.0},
            "failing": {"x.shop.test": "x.shop.test: refused (rejectedIdentifier)"},
            "issuer": {"placed": 3, "issued": 2, "failed": {"refused": 1}, "limited": {"domain-rate": 4}},
        }
        lines = metric_lines(health)
        for line in ("prexy_acme_orders_total 3", "prexy_acme_issued_total 2",
                     'prexy_acme_failures_total{kind="refused"} 1', 'prexy_acme_limited_total{limit="domain-rate"} 4',
                     'prexy_acme_expiry_days{site="shop"} 59.500', 'prexy_acme_expiry_days{site="we\\"ird"} 1.000',
                     "prexy_acme_failing 1", "# TYPE prexy_acme_expiry_days gauge",
                     "# TYPE prexy_acme_issued_total counter"):
            assert line in lines, (line, lines)
        assert health_lines(health) == ["acme: x.shop.test failing: x.shop.test: refused (rejectedIdentifier)"]
        assert health_lines({"earliest_expiry_days": {}, "failing": {}}) == []


class _Acme:
    def __init__(self, health: dict[str, Any]) -> None:
        self.health = health

    def metric_lines(self) -> list[str]:
        return metric_lines(self.health)

    def health_lines(self) -> list[str]:
        return health_lines(self.health)


class AdminTests(SynchronousTestCase):
    """The admin endpoint of a process that issues (``--workers 0``)."""

    def render(self, path: bytes, acme: Any) -> bytes:
        from twisted.web.test.requesthelper import DummyRequest

        from prexy.admin import AdminResource
        from prexy.metrics import Metrics

        owner: Any = type("Owner", (), {"metrics": Metrics(), "cluster": None, "acme": acme})()
        request = DummyRequest([b""])
        request.path = path
        result = AdminResource(owner).render(request)
        assert isinstance(result, bytes)
        return result

    def test_health_names_the_failing(self) -> None:
        failing = _Acme({"earliest_expiry_days": {}, "failing": {"a.test": "a.test: refused (rejectedIdentifier)"}})
        assert self.render(b"/health", failing) == b"ok\nacme: a.test failing: a.test: refused (rejectedIdentifier)\n"
        assert self.render(b"/health", _Acme({"failing": {}})) == b"ok\n"
        assert self.render(b"/health", None) == b"ok\n"

    def test_metrics(self) -> None:
        acme = _Acme({"earliest_expiry_days": {"shop": 2.0}, "failing": {}, "issuer": {"placed": 1, "issued": 1}})
        text = self.render(b"/metrics", acme)
        assert b"prexy_bytes_out_total 0.0\n" in text
        assert b'prexy_acme_expiry_days{site="shop"} 2.000\n' in text
        assert b"prexy_acme_issued_total 1\n" in text
