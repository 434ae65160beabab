"""Listening sockets for a worker pool: bound once by the master, adopted by
every worker.

The master turns each ``--listen`` endpoint string into a non-blocking
listening socket (or takes the one systemd passed), so the port never closes
while workers come and go; workers adopt the file descriptors they inherit.
A blocking listening fd would hang idle workers inside accept() and make them
ignore SIGTERM (see shared/docs/findings.md), hence non-blocking.

Without workers, :class:`ListeningService` listens on an endpoint itself and
says on which port.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
from twisted.application import service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python.failure import Failure

from prexy.endpoints import split_endpoint

log = Logger()


class ListenError(Exception):
    """An endpoint that cannot be bound or is not supported by the pool.
    Its message is one line naming the endpoint and the reason."""


def _reason(exc: BaseException) -> str:
    """Why a listen failed, in a few words: the OS's reason (``Address
    already in use``) rather than the exception's whole representation."""
    inner = getattr(exc, "socketError", None)  # twisted's CannotListenError
    if isinstance(inner, BaseException):
        exc = inner
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


@attrs.frozen
class ListenSpec:
    """What a worker needs to adopt one inherited listening socket."""

    description: str
    family: str  # "INET", "INET6" or "UNIX"
    tls_key: str | None = None
    tls_cert: str | None = None

    @property
    def address_family(self) -> int:
        return {"INET": socket.AF_INET, "INET6": socket.AF_INET6, "UNIX": socket.AF_UNIX}[self.family]


def bind(desc: str) -> tuple[ListenSpec, socket.socket]:
    """Bind (or take from systemd) the socket an endpoint string describes."""
    kind, args, kw = split_endpoint(desc)
    backlog = int(kw.get("backlog", "1024"))
    tls_key = tls_cert = None
    if kind in ("tcp", "tcp6", "ssl"):
        if not args:
            raise ListenError(f"{desc}: no port")
        try:
            port = int(args[0])
        except ValueError:
            raise ListenError(f"{desc}: bad port {args[0]!r}") from None
        interface = kw.get("interface", "::" if kind == "tcp6" else "")
        family = socket.AF_INET6 if kind == "tcp6" or ":" in interface else socket.AF_INET
        if kind == "ssl":
            tls_key = kw.get("privateKey")
            tls_cert = kw.get("certKey", tls_key)
            if not tls_key:
                raise ListenError(f"{desc}: ssl needs privateKey=")
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((interface, port))
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            raise ListenError(f"cannot listen on {desc}: {_reason(exc)}") from None
        fam = "INET6" if family == socket.AF_INET6 else "INET"
    elif kind == "unix":
        if not args:
            raise ListenError(f"{desc}: no path")
        path = args[0]
        clear_stale_unix_socket(desc, path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(backlog)
        except OSError as exc:
            sock.close()
            raise ListenError(f"cannot listen on {desc}: {_reason(exc)}") from None
        fam = "UNIX"
    elif kind == "systemd":
        fd = _systemd_fd(desc, args, kw)
        sock = _systemd_socket(desc, kw, fd)
        fam = _FAMILY_NAMES[sock.family]
    else:
        raise ListenError(f"{desc}: unsupported endpoint type {kind!r}")
    sock.setblocking(False)
    os.set_inheritable(sock.fileno(), True)
    return ListenSpec(desc, fam, tls_key, tls_cert), sock


def clear_stale_unix_socket(desc: str, path: str) -> None:
    """Remove the UNIX socket left at ``path`` by a process that is gone, as
    a restart must; refuse (``ListenError``) when a process still listens
    there, or when ``path`` is not a socket: neither is ours to remove."""
    import stat

    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ListenError(f"cannot listen on {desc}: {_reason(exc)}") from None
    if not stat.S_ISSOCK(mode):
        raise ListenError(f"cannot listen on {desc}: {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: a stale socket
        return
    finally:
        probe.close()
    raise ListenError(f"cannot listen on {desc}: Address already in use")


_FAMILY_NAMES = {socket.AF_INET: "INET", socket.AF_INET6: "INET6", socket.AF_UNIX: "UNIX"}


def _systemd_socket(desc: str, kw: dict[str, str], fd: int) -> socket.socket:
    """A socket object for (a duplicate of) systemd's descriptor ``fd``.

    Its address family is the socket's own, not ``domain=``: systemd makes
    ``ListenStream=80`` a dual-stack IPv6 socket, and a worker that adopted
    it as IPv4 (the ``domain=INET`` most configurations say) would read
    every client address wrongly.  ``domain=`` is only checked to be a
    known name."""
    domain = kw.get("domain", "INET").upper()
    if domain not in ("INET", "INET6", "UNIX"):
        raise ListenError(f"{desc}: unsupported domain {domain}")
    sock = socket.socket(fileno=os.dup(fd))
    if sock.family not in _FAMILY_NAMES or sock.type != socket.SOCK_STREAM:
        sock.close()
        raise ListenError(f"{desc}: systemd's socket is not a TCP or UNIX stream socket")
    return sock


def _systemd_fd(desc: str, args: list[str], kw: dict[str, str]) -> int:
    """The descriptor systemd passed for ``desc``, found by Twisted's own
    ``systemd:`` endpoint parser: it reads LISTEN_FDS/LISTEN_FDNAMES once,
    when twisted.internet.endpoints is imported, and removes them from the
    environment, so nobody else can read them after it.  The endpoint it
    makes is only asked for its descriptor (``fileno``), never listened on,
    hence no reactor."""
    if "name" not in kw and "index" not in kw:
        desc += ":index=0"
    try:
        endpoint: Any = serverFromString(None, desc)
    except KeyError:
        raise ListenError(f"{desc}: systemd passed no socket named {kw.get('name')!r}") from None
    except IndexError:
        raise ListenError(f"{desc}: systemd passed no socket at index {kw.get('index', '0')}") from None
    except (ValueError, AttributeError) as exc:
        raise ListenError(f"{desc}: {exc}") from None
    return int(endpoint.fileno)


def adopt(
    reactor: Any, spec: ListenSpec, fd: int, factory: Any, pem: Mapping[str, bytes] | None = None,
    certificates: Any = None, default: tuple[str, str] | None = None,
) -> Any:
    """Start listening on an inherited socket in a worker (TLS when the spec
    has a key: from ``pem``, the key's and certificate's bytes by path, when
    given, else from their files; ``default``: the key's and certificate's
    paths in force, when they moved since the master bound the socket; the
    sites' certificates by SNI from ``certificates``, a
    ``prexy.sni.ServerCertificates``, which knows the listener by the
    spec's description); the worker's copy of the fd is closed after
    adoption."""
    if spec.tls_key:
        key, cert = default or (spec.tls_key, spec.tls_cert or spec.tls_key)
        if pem is not None:
            factory = tls_factory_pem(factory, pem[key], pem[cert], certificates, spec.description)
        else:
            factory = tls_factory(factory, key, cert, certificates, spec.description)
    port = reactor.adoptStreamPort(fd, spec.address_family, factory)
    os.close(fd)
    accept_one_per_wakeup(port)
    return port


def tls_factory(factory: Any, key: str, cert: str | None, certificates: Any = None, name: Any = None) -> Any:
    """``factory`` behind TLS with ``key`` and ``cert`` (PEM files) as the
    default certificate: see :func:`tls_factory_pem`."""
    with open(key, "rb") as f:
        key_pem = f.read()
    if cert is None or cert == key:
        cert_pem = key_pem
    else:
        with open(cert, "rb") as f:
            cert_pem = f.read()
    return tls_factory_pem(factory, key_pem, cert_pem, certificates, name)


def tls_factory_pem(factory: Any, key: bytes, cert: bytes, certificates: Any = None, name: Any = None) -> Any:
    """``factory`` behind TLS, ``key`` and ``cert`` (PEM bytes, the chain
    after the certificate) the default certificate; each handshake's
    server name picks a site's certificate from ``certificates`` (a
    ``prexy.sni.ServerCertificates``; without one, the default serves
    every name; ``name`` is what it knows this listener by).  ALPN offers
    h2 when the factory says it speaks it (``factory.alpn``)."""
    from twisted.protocols.tls import TLSMemoryBIOFactory

    from prexy.sni import ServerCertificates

    if certificates is None:
        certificates = ServerCertificates(alpn=bool(getattr(factory, "alpn", False)))
    contexts = certificates.listener(cert, key, name)
    if certificates.on_demand is not None:  # (the ClientHello read first: prexy.ondemand)
        return certificates.on_demand.factory(contexts, factory)
    return TLSMemoryBIOFactory(contexts, False, factory)


def tls_files(endpoints: Iterable[str], files: Any) -> dict[str, bytes]:
    """The PEM key and certificate files the ``ssl:`` endpoints name, by
    path, read through ``files`` (``prexy.files``) and checked to load;
    ``ConfigError`` naming the file when one does not."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from prexy.config import ConfigError

    def private_key(data: bytes) -> Any:
        return load_pem_private_key(data, None)

    out: dict[str, bytes] = {}
    for desc in endpoints:
        kind, _args, kw = split_endpoint(desc)
        if kind != "ssl" or not kw.get("privateKey"):
            continue
        key = kw["privateKey"]
        for path, load, what in (
            (key, private_key, "private key (unencrypted)"),
            (kw.get("certKey", key), x509.load_pem_x509_certificate, "certificate"),
        ):
            try:
                data = out[path] if path in out else files.read(path)
            except OSError as exc:
                raise ConfigError(path, None, None, f"cannot read ({desc}): {exc.strerror}") from None
            try:
                load(data)
            except (ValueError, TypeError) as exc:
                raise ConfigError(path, None, None, f"not a PEM {what}: {exc}") from None
            out[path] = data
    return out


def accept_one_per_wakeup(port: Any) -> None:
    """Make a listening port take one connection each time it is readable.

    Twisted's port accepts up to ``numberAccepts`` connections per wakeup
    (100 to start with, growing).  With several workers on one shared
    socket, the worker that wakes first would then take a whole burst of
    new connections (a load generator opening 50 at once) and leave the
    others idle for the life of those keep-alive connections.  One accept
    per wakeup, as nginx does without ``multi_accept``, lets every idle
    worker take its turn: a busy worker returns to its event loop less
    often, so it takes fewer.
    """
    accept_burst = port.doRead

    def do_read() -> Any:
        port.numberAccepts = 1
        return accept_burst()

    port.doRead = do_read


class ListeningService(service.Service):
    """Listens with ``factory`` on ``endpoint`` while running, and tells
    (:meth:`when_listening`) the port it listens on.

    Twisted's ``StreamServerEndpointService`` as ``strports.service`` makes
    it, but with the port reachable through public API, and restartable:

    * the first start listens (in ``privilegedStartService`` when the
      parent calls it, so before twistd drops privileges); a listen that
      fails there and then (a port in use) raises :class:`ListenError`, one
      line naming ``description`` (the endpoint string) and the reason, so
      twistd refuses to start with it; a failure that comes later, or on a
      restart, is logged (a cancelled listen is not);
    * ``stopService`` cancels a listen still in progress, stops listening,
      and returns a Deferred that fires once the port is closed; stopping
      twice, or before starting, is harmless.
    """

    def __init__(self, endpoint: Any, factory: Any, description: str | None = None) -> None:
        self.endpoint = endpoint
        self.factory = factory
        #: The endpoint as configured, for messages.
        self.description = description if description is not None else repr(endpoint)
        #: The listen in progress or done (None before a start, after a stop).
        self._listening: defer.Deferred[Any] | None = None
        #: Once it settled: the port, or None when the listen failed.
        self._outcome: list[Any] = []
        self._waiting: list[defer.Deferred[Any]] = []
        self._raise_synchronously = True

    def privilegedStartService(self) -> None:
        super().privilegedStartService()
        self._listen()

    def startService(self) -> None:
        super().startService()
        if self._listening is None:
            self._listen()

    def _listen(self) -> None:
        self._outcome = []
        raised: list[Failure] = []

        def failed(failure: Failure) -> None:
            if self._raise_synchronously:
                raised.append(failure)
            elif not failure.check(defer.CancelledError):
                log.failure("cannot listen on {endpoint}", failure, endpoint=self.description)
            return None

        listening = self.endpoint.listen(self.factory)
        self._listening = listening
        listening.addErrback(failed)
        listening.addCallback(self._settled)
        self._raise_synchronously = False
        if raised:
            error = raised[0].value
            reason = _reason(error) if error is not None else "unknown error"
            raise ListenError(f"cannot listen on {self.description}: {reason}")

    def _settled(self, port: Any) -> Any:
        self._outcome = [port]
        waiting, self._waiting = self._waiting, []
        for d in waiting:
            d.callback(port)
        return port

    def when_listening(self) -> defer.Deferred[Any]:
        """A Deferred firing with the listening port once the service
        listens, or with None when the listen failed or was cancelled."""
        if self._outcome:
            return defer.succeed(self._outcome[0])
        d: defer.Deferred[Any] = defer.Deferred()
        self._waiting.append(d)
        return d

    def stopService(self) -> defer.Deferred[None]:
        listening, self._listening = self._listening, None
        if listening is None:
            super().stopService()
            return defer.succeed(None)
        listening.cancel()

        def stop_listening(port: Any) -> Any:
            return port.stopListening() if port is not None else None

        def stopped(result: Any) -> Any:
            super(ListeningService, self).stopService()
            return result

        d = self.when_listening()
        d.addCallback(stop_listening)
        d.addBoth(stopped)
        return d


def listening_service(
    reactor: Any, description: str, factory: Any, certificates: Any = None, pem: Mapping[str, bytes] | None = None
) -> ListeningService:
    """A :class:`ListeningService` for an endpoint string (as
    ``strports.service`` takes).  An ``ssl:`` endpoint listens on TCP
    behind :func:`tls_factory_pem` (its key and certificate from ``pem`` by
    path when given, else from their files), as a worker's adopted socket
    does: Twisted's ``ssl:`` strings have neither ALPN nor SNI."""
    kind, args, kw = split_endpoint(description)
    if kind == "ssl" and args and "privateKey" in kw:
        from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint

        interface = kw.get("interface", "")
        tcp = TCP6ServerEndpoint if ":" in interface else TCP4ServerEndpoint
        endpoint = tcp(reactor, int(args[0]), backlog=int(kw.get("backlog", 50)), interface=interface)
        key, cert = kw["privateKey"], kw.get("certKey", kw["privateKey"])
        if pem is not None and key in pem and cert in pem:
            wrapped = tls_factory_pem(factory, pem[key], pem[cert], certificates, description)
        else:
            wrapped = tls_factory(factory, key, cert, certificates, description)
        return ListeningService(endpoint, wrapped, description)
    if kind == "systemd":
        # The socket's own family (see _systemd_socket), not domain='s.
        from twisted.internet.endpoints import AdoptedStreamServerEndpoint

        sock = _systemd_socket(description, kw, _systemd_fd(description, args, kw))
        family = sock.family
        fd = sock.detach()
        return ListeningService(AdoptedStreamServerEndpoint(reactor, fd, family), factory, description)
    if kind == "unix" and args:
        clear_stale_unix_socket(description, args[0])
    return ListeningService(serverFromString(reactor, description), factory, description)

