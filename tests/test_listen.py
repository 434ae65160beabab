"""ListeningService: listens on an endpoint while running, tells its port,
and reports a listen failure as Twisted's StreamServerEndpointService does.
All in memory: a fake endpoint hands out Deferreds the tests fire."""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService
from twisted.internet import defer
from twisted.internet.error import CannotListenError
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import MemoryReactor
from twisted.trial.unittest import SynchronousTestCase

from prexy.listen import ListenError, ListeningService, bind, listening_service


class FakePort:
    def __init__(self) -> None:
        self.listening = True

    def stopListening(self) -> None:
        self.listening = False


class FakeEndpoint:
    """``listen()`` returns the next Deferred of ``results`` (a fresh
    unfired one when there is none); every call is recorded."""

    def __init__(self, *results: defer.Deferred[Any]) -> None:
        self.results = list(results)
        self.calls: list[Any] = []
        self.cancelled = 0

    def listen(self, factory: Any) -> defer.Deferred[Any]:
        self.calls.append(factory)
        if self.results:
            return self.results.pop(0)

        def cancel(d: defer.Deferred[Any]) -> None:
            self.cancelled += 1

        return defer.Deferred(cancel)


FACTORY = Factory.forProtocol(Protocol)


class ListeningServiceTests(SynchronousTestCase):
    def test_listens_once_and_tells_the_port(self) -> None:
        """The parent's privileged start listens; the ordinary start after
        it does not listen again; ``when_listening`` fires with the port,
        before and after the listen succeeds."""
        pending: defer.Deferred[Any] = defer.Deferred()
        endpoint = FakeEndpoint(pending)
        svc = ListeningService(endpoint, FACTORY)
        parent = MultiService()
        svc.setServiceParent(parent)
        parent.privilegedStartService()
        early = svc.when_listening()
        self.assertNoResult(early)
        parent.startService()
        self.assertEqual(endpoint.calls, [FACTORY])
        port = FakePort()
        pending.callback(port)
        self.assertIs(self.successResultOf(early), port)
        self.assertIs(self.successResultOf(svc.when_listening()), port)

    def test_start_alone_listens(self) -> None:
        """Without a privileged start, ``startService`` listens."""
        port = FakePort()
        endpoint = FakeEndpoint(defer.succeed(port))
        svc = ListeningService(endpoint, FACTORY)
        svc.startService()
        self.assertTrue(svc.running)
        self.assertIs(self.successResultOf(svc.when_listening()), port)

    def test_immediate_failure_raises(self) -> None:
        """A listen that fails at once at the first start (a port in use)
        raises a ListenError out of the start, one line naming the endpoint
        and the OS's reason, so twistd refuses to start with it;
        ``when_listening`` then gives None."""
        error = CannotListenError("127.0.0.1", 80, OSError(98, "Address already in use"))
        svc = ListeningService(FakeEndpoint(defer.fail(error)), FACTORY, "tcp:80:interface=127.0.0.1")
        with self.assertRaises(ListenError) as info:
            svc.privilegedStartService()
        self.assertEqual(str(info.exception), "cannot listen on tcp:80:interface=127.0.0.1: Address already in use")
        self.assertIsNone(self.successResultOf(svc.when_listening()))

    def test_later_failure_is_logged(self) -> None:
        """A listen that fails later is logged, not raised; a restart that
        fails is logged too."""
        pending: defer.Deferred[Any] = defer.Deferred()
        error = CannotListenError("127.0.0.1", 80, OSError(98, "Address already in use"))
        svc = ListeningService(FakeEndpoint(pending, defer.fail(error)), FACTORY)
        svc.startService()
        waiting = svc.when_listening()
        pending.errback(error)
        self.assertEqual(len(self.flushLoggedErrors(CannotListenError)), 1)
        self.assertIsNone(self.successResultOf(waiting))
        self.successResultOf(svc.stopService())
        svc.startService()
        self.assertEqual(len(self.flushLoggedErrors(CannotListenError)), 1)

    def test_stop_closes_the_port_and_restart_listens_again(self) -> None:
        """Stopping stops listening (the Deferred fires once it did) and a
        second stop is harmless; starting again listens again."""
        first, second = FakePort(), FakePort()
        endpoint = FakeEndpoint(defer.succeed(first), defer.succeed(second))
        svc = ListeningService(endpoint, FACTORY)
        svc.startService()
        self.successResultOf(svc.stopService())
        self.assertFalse(first.listening)
        self.assertFalse(svc.running)
        self.successResultOf(svc.stopService())
        svc.startService()
        self.assertIs(self.successResultOf(svc.when_listening()), second)
        self.assertTrue(second.listening)

    def test_stop_cancels_a_listen_in_progress(self) -> None:
        """Stopping while the listen is pending cancels it, quietly."""
        endpoint = FakeEndpoint()
        svc = ListeningService(endpoint, FACTORY)
        svc.startService()
        waiting = svc.when_listening()
        self.successResultOf(svc.stopService())
        self.assertEqual(endpoint.cancelled, 1)
        self.assertIsNone(self.successResultOf(waiting))
        self.assertEqual(self.flushLoggedErrors(), [])

    def test_stop_before_start(self) -> None:
        """A service never started stops at once."""
        self.successResultOf(ListeningService(FakeEndpoint(), FACTORY).stopService())

    def test_endpoint_string(self) -> None:
        """``listening_service`` parses an endpoint string (as strports does)
        and listens on the given reactor."""
        reactor = MemoryReactor()
        svc = listening_service(reactor, "tcp:8123:interface=127.0.0.1", FACTORY)
        svc.startService()
        (port, factory, _backlog, interface) = reactor.tcpServers[0]
        self.assertEqual((port, factory, interface), (8123, FACTORY, "127.0.0.1"))
        self.assertIsNotNone(self.successResultOf(svc.when_listening()))


class SystemdBindTests(SynchronousTestCase):
    def test_missing_systemd_socket_is_a_listen_error(self) -> None:
        """A systemd: endpoint for a socket systemd did not pass (none here)
        is refused with the endpoint and what is missing."""
        with self.assertRaises(ListenError) as info:
            bind("systemd:domain=INET:index=2")
        self.assertIn("systemd:domain=INET:index=2: systemd passed no socket at index 2", str(info.exception))
        with self.assertRaises(ListenError) as info:
            bind("systemd:domain=INET:name=http")
        self.assertIn("systemd passed no socket named 'http'", str(info.exception))
        with self.assertRaises(ListenError) as info:
            bind("systemd:domain=INET")
        self.assertIn("no socket at index 0", str(info.exception))

    def test_family_is_the_sockets_own(self) -> None:
        """The family of systemd's socket is read from the socket, not taken
        from ``domain=``: ``ListenStream=80`` is a dual-stack IPv6 socket
        that configurations name ``domain=INET``, and adopting it as IPv4
        would garble every client address.  (A UNIX socket pair stands in
        for systemd's socket here.)"""
        import socket

        from prexy.listen import _systemd_socket

        one, other = socket.socketpair()
        self.addCleanup(one.close)
        self.addCleanup(other.close)
        sock = _systemd_socket("systemd:domain=INET:index=0", {"domain": "INET"}, one.fileno())
        self.addCleanup(sock.close)
        self.assertEqual(sock.family, socket.AF_UNIX)
        with self.assertRaises(ListenError) as info:
            _systemd_socket("systemd:domain=IPX:index=0", {"domain": "IPX"}, one.fileno())
        self.assertIn("unsupported domain IPX", str(info.exception))
