"""On-demand certificates at the handshake: the peek in front of an ``ssl:``
listener's TLS protocol holds a new name's ClientHello until the issuing
process answers (or the bound passes, on a Clock), lets every other
connection through at once, asks once per name, and hands the TLS layer
every byte unchanged.  In memory: real TLS through pyOpenSSL on both sides
over a StringTransport, a fake issuing process."""

from __future__ import annotations

import os
from typing import Any

from OpenSSL import SSL
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy.acme.storage import Storage
from prexy.clienthello import Hello
from prexy.config import load_config
from prexy.ondemand import OnDemand, PeekingProtocol
from prexy.runtime import build_runtime
from prexy.sni import ServerCertificates
from tests.pki import TestCA
from tests.test_clienthello import client_hello
from tests.test_sni import NOW, _Files

ACME = "[acme]\ndirectory = 'https://ca.test/dir'\nask = 'http://ask.test/'\nstorage = 'acme'\n"


class _Echo(Protocol):
    def dataReceived(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


class Client:
    """A TLS client in memory against one server protocol over a StringTransport."""

    def __init__(self, factory: Any, name: bytes | None, alpn: list[bytes] | None = None) -> None:
        context = SSL.Context(SSL.TLS_CLIENT_METHOD)
        if alpn:
            context.set_alpn_protos(alpn)
        self.tls = SSL.Connection(context, None)
        self.tls.set_connect_state()
        if name is not None:
            self.tls.set_tlsext_host_name(name)
        self.server = factory.buildProtocol(None)
        self.transport = StringTransport()
        self.server.makeConnection(self.transport)
        self.pump()

    def pump(self) -> None:
        for _ in range(10):
            try:
                self.tls.do_handshake()
            except SSL.WantReadError:
                pass
            try:
                data = self.tls.bio_read(1 << 16)
            except SSL.WantReadError:
                data = b""
            if data:
                self.server.dataReceived(data)
            back = self.transport.value()
            self.transport.clear()
            if back:
                self.tls.bio_write(back)
            elif not data:
                return

    @property
    def subject(self) -> str | None:
        cert = self.tls.get_peer_certificate()
        return None if cert is None else cert.to_cryptography().subject.rfc4514_string()


class OnDemandTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.f = _Files(self)
        self.f.issue("own", "own.test", "*.own.test")
        self.f.site("own", ["own.test", "*.own.test"], "own")
        self.f.site("shop", ["shop.test", "*.shop.test"], extra="tls = 'acme'\n")
        self.storage = Storage(self.f.path("acme"))
        main = self.f.main(sites="\n" + ACME)
        self.certificates = ServerCertificates()
        self.certificates.use_acme(self.f.path("acme"))
        self.certificates.update(build_runtime(load_config(main, now=NOW)))
        self.clock = Clock()
        from prexy.metrics import Metrics

        self.metrics = Metrics()
        self.on_demand = self.certificates.on_demand = OnDemand(self.clock, self.certificates, timeout=10.0,
                                                                count=self.metrics.count)
        self.asked: list[str] = []
        self.on_demand.request = self.asked.append
        with open(self.f.path("default.crt"), "rb") as c, open(self.f.path("default.key"), "rb") as k:
            listener = self.certificates.listener(c.read(), k.read())
        self.factory = self.on_demand.factory(listener, Factory.forProtocol(_Echo))
        self.factory._clock = self.clock  # (TLS writes are sent at the next turn of this clock)
        self.acme_ca = TestCA("ACME test CA")

    def store(self, name: str) -> None:
        issued = self.acme_ca.issue(name)
        self.storage.save(name, issued.key_pem, issued.chain_pem)

    def test_candidates(self) -> None:
        """Only a name under an ACME site's wildcard, with nothing stored,
        waits; not a listed name, another site's, an unserved one, none, a
        TLS-ALPN-01 validation, nor a name whose certificate is stored."""
        self.store("de.shop.test")
        candidate = self.on_demand.candidate
        assert candidate(Hello(b"FR.shop.test.")) == "fr.shop.test"
        assert candidate(Hello(b"a.b.shop.test", (b"h2",))) == "a.b.shop.test"
        for hello in (Hello(b"shop.test"), Hello(b"x.own.test"), Hello(b"x.nobody.test"), Hello(None),
                      Hello(b"fr.shop.test", (b"acme-tls/1",)), Hello(b"de.shop.test"), Hello(b"bad name.shop.test")):
            assert candidate(hello) is None, hello
        self.on_demand.request = None
        assert candidate(Hello(b"fr.shop.test")) is None

    def test_plain_name_passes_at_once(self) -> None:
        """A name that needs nothing: the handshake completes with no
        request and no clock advanced."""
        client = Client(self.factory, b"x.own.test")
        assert client.subject == "CN=own.test"
        assert self.asked == []
        client = Client(self.factory, None)
        assert client.subject == "CN=default.test"

    def test_waits_then_serves_the_new_certificate(self) -> None:
        """The hello is held (transport paused) until the answer; then the
        handshake goes on and serves what was stored meanwhile."""
        client = Client(self.factory, b"fr.shop.test")
        assert self.asked == ["fr.shop.test"]
        assert client.subject is None and client.transport.producerState == "paused"
        assert isinstance(client.server, PeekingProtocol) and client.server.waiting_for == "fr.shop.test"
        self.store("fr.shop.test")
        self.certificates.acme.forget("fr.shop.test")
        self.on_demand.answered("fr.shop.test", True)
        assert client.transport.producerState == "producing"
        client.pump()
        assert client.subject == "CN=fr.shop.test"
        self.tls_echo(client)

    def tls_echo(self, client: Client) -> None:
        client.tls.send(b"ping")
        client.pump()
        self.clock.advance(0)
        client.pump()
        assert client.tls.recv(100) == b"ping"

    def test_refused_gets_the_default(self) -> None:
        client = Client(self.factory, b"fr.shop.test")
        self.on_demand.answered("fr.shop.test", False)
        client.pump()
        assert client.subject == "CN=default.test"
        assert self.on_demand.counts["refused"] == 1
        assert self.metrics.counters[("prexy_tls_on_demand_total", (("outcome", "refused"),))] == 1

    def test_a_refusal_is_kept_for_a_while(self) -> None:
        """A refused name's next handshakes go on at once with the default,
        without asking again, for ``REFUSED_FOR`` seconds; then it is asked
        about again.  Only refusals are kept (a timed-out order may still
        come), and at most ``REFUSED_KEPT`` names."""
        from prexy import ondemand

        Client(self.factory, b"fr.shop.test")
        self.on_demand.answered("fr.shop.test", False)
        again = Client(self.factory, b"fr.shop.test")
        again.pump()
        assert again.subject == "CN=default.test"
        assert self.asked == ["fr.shop.test"]
        self.clock.advance(ondemand.REFUSED_FOR)
        Client(self.factory, b"fr.shop.test")
        assert self.asked == ["fr.shop.test", "fr.shop.test"]
        Client(self.factory, b"de.shop.test")
        self.clock.advance(self.on_demand.timeout)  # timed out: not kept
        Client(self.factory, b"de.shop.test")
        assert self.asked.count("de.shop.test") == 2
        self.patch(ondemand, "REFUSED_KEPT", 2)
        for name in ("a", "b", "c"):
            self.on_demand._waiting[name] = ([], self.clock.callLater(1, lambda: None))
            self.on_demand.answered(name, False)
        assert list(self.on_demand._refused) == ["b", "c"]

    def test_bound(self) -> None:
        """No answer: the handshake goes on with the default at the bound, not before."""
        client = Client(self.factory, b"fr.shop.test")
        self.clock.advance(9.9)
        client.pump()
        assert client.subject is None
        self.clock.advance(0.1)
        client.pump()
        assert client.subject == "CN=default.test"
        assert self.on_demand.counts["timed_out"] == 1
        self.on_demand.answered("fr.shop.test", True)  # (late: nothing left to release)

    def test_one_request_per_name(self) -> None:
        """Three handshakes for one name, one for another: two requests;
        one answer releases its three."""
        clients = [Client(self.factory, b"fr.shop.test") for _ in range(3)]
        other = Client(self.factory, b"de.shop.test")
        assert self.asked == ["fr.shop.test", "de.shop.test"]
        self.on_demand.answered("fr.shop.test", False)
        assert self.metrics.counters[("prexy_tls_on_demand_total", (("outcome", "refused"),))] == 3
        for client in clients:
            client.pump()
            assert client.subject == "CN=default.test"
        other.pump()
        assert other.subject is None
        self.on_demand.answered("de.shop.test", False)
        other.pump()
        assert other.subject == "CN=default.test"

    def test_lost_while_waiting(self) -> None:
        """A client gone while it waits: the TLS protocol is told; the
        answer later touches nothing."""
        client = Client(self.factory, b"fr.shop.test")
        lost: list[Failure] = []
        inner = client.server.inner
        inner.connectionLost = lost.append
        client.server.connectionLost(Failure(ConnectionError("gone")))
        assert len(lost) == 1
        self.on_demand.answered("fr.shop.test", True)
        assert client.transport.value() == b""

    def test_garbage_handed_on(self) -> None:
        """Bytes that are not a ClientHello reach the TLS layer unchanged at
        once: it closes the connection, as without the peek."""
        server = self.factory.buildProtocol(None)
        transport = StringTransport()
        server.makeConnection(transport)
        server.dataReceived(b"GET / HTTP/1.1\r\n\r\n")
        assert transport.disconnecting
        assert self.asked == []

    def test_pieces(self) -> None:
        """A hello in pieces: held until whole, then handed on whole."""
        hello = client_hello(b"x.own.test")
        server = self.factory.buildProtocol(None)
        seen: list[bytes] = []
        server.inner.dataReceived = seen.append
        server.makeConnection(StringTransport())
        for i in range(len(hello) - 1):
            server.dataReceived(hello[i : i + 1])
        assert seen == []
        server.dataReceived(hello[-1:] + b"more")
        server.dataReceived(b"after")
        assert seen == [hello + b"more", b"after"]

    def test_off_without_a_request(self) -> None:
        """With on-demand off (no issuing process to ask) the listener's
        protocols are the TLS protocols themselves: no peek, no cost."""
        self.on_demand.request = None
        assert not isinstance(self.factory.buildProtocol(None), PeekingProtocol)


class ServiceTests(SynchronousTestCase):
    def test_config(self) -> None:
        """``[acme] on_demand_timeout``: 10 s by default, a number of seconds."""
        f = _Files(self)
        f.site("shop", ["*.shop.test"], extra="tls = 'acme'\n")
        config = load_config(f.main(sites="\n" + ACME), now=NOW)
        assert config.acme is not None and config.acme.on_demand_timeout == 10.0
        config = load_config(f.main(sites="\n" + ACME + "on_demand_timeout = 2.5\n"), now=NOW)
        assert config.acme is not None and config.acme.on_demand_timeout == 2.5
        from prexy.config import ConfigError

        for bad in ("0", "'10'", "true", "61"):
            with self.assertRaises(ConfigError) as caught:
                load_config(f.main(sites="\n" + ACME + f"on_demand_timeout = {bad}\n"), now=NOW)
            assert caught.exception.key == "acme.on_demand_timeout", str(caught.exception)
        assert os.path.isdir(f.dir)


class _Manager:
    """The certificate manager as the master's on-demand answer sees it."""

    def __init__(self, ask: bool) -> None:
        from prexy.acme.policy import NamePolicy

        self.policy = NamePolicy.of({"shop": ["shop.test", "*.shop.test"], "plain": ["plain.test"]}, ask=ask)
        self.obtained: list[str] = []
        self.issued: Any = object()

    def decide(self, name: str) -> Any:
        return self.policy.decide(name)

    def obtain(self, name: str) -> Any:
        from twisted.internet.defer import succeed

        self.obtained.append(name)
        return succeed(self.issued)


class MasterTests(SynchronousTestCase):
    """The issuing process's answer to a handshake's request."""

    def answer(self, manager: _Manager, name: str) -> bool:
        from prexy.acme.service import AcmeService

        fake: Any = type("Fake", (), {"manager": manager})()
        return bool(self.successResultOf(AcmeService.on_demand(fake, name)))

    def test_only_names_under_a_wildcard_reach_the_manager(self) -> None:
        """A name no wildcard host matches (no site's, a listed one, a bad
        one) is refused before the manager sees it: no storage, no ask, no order."""
        manager = _Manager(ask=True)
        for name in ("x.nobody.test", "plain.test", "shop.test", "a b.shop.test"):
            assert not self.answer(manager, name), name
        assert manager.obtained == []
        assert self.answer(manager, "FR.shop.test")
        assert manager.obtained == ["fr.shop.test"]
        manager.issued = None
        assert not self.answer(manager, "de.shop.test")

    def test_without_ask_none_on_demand(self) -> None:
        manager = _Manager(ask=False)
        assert not self.answer(manager, "fr.shop.test")
        assert manager.obtained == []
