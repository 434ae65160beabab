"""Debian's ``pebble`` (an ACME test CA) and ``pebble-challtestsrv`` (its
DNS: every name resolves to 127.0.0.1) as children of a test, on free
loopback ports, in a scratch directory; each is ready when its log says so
and is killed at cleanup."""

from __future__ import annotations

import datetime
import json
import os
import shutil
from typing import Any

from cryptography.hazmat.primitives import serialization
from twisted.internet import defer, protocol, reactor

from tests.pki import self_signed

from .conftest import Cleanups
from .twistd_support import free_port, listening, scratch_dir

PEBBLE = shutil.which("pebble") or ("/usr/bin/pebble" if os.path.exists("/usr/bin/pebble") else None)
CHALLTESTSRV = shutil.which("pebble-challtestsrv") or (
    "/usr/bin/pebble-challtestsrv" if os.path.exists("/usr/bin/pebble-challtestsrv") else None
)


def bounded(d: defer.Deferred[Any], seconds: float, what: str) -> defer.Deferred[Any]:
    """``d``, failing with ``what`` after ``seconds``."""
    timer = reactor.callLater(seconds, lambda: d.called or d.errback(AssertionError(f"no {what} in {seconds} s")))
    return d.addBoth(lambda v: (timer.active() and timer.cancel(), v)[1])


class Child(protocol.ProcessProtocol):
    """A child process whose ``ready`` fires when ``marker`` appears in its
    output (stdout and stderr together), ``ended`` when it exits."""

    def __init__(self, argv: list[str], marker: bytes, env: dict[str, str], cwd: str) -> None:
        self.argv = argv
        self.marker = marker
        self.output = b""
        self.ready: defer.Deferred[None] = defer.Deferred()
        self.ended: defer.Deferred[None] = defer.Deferred()
        reactor.spawnProcess(self, argv[0], argv, env=env, path=cwd, childFDs={0: "w", 1: "r", 2: "r"})

    def outReceived(self, data: bytes) -> None:
        self.output += data
        if self.marker in self.output and not self.ready.called:
            self.ready.callback(None)

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        if not self.ready.called:
            self.ready.errback(AssertionError(f"{self.argv[0]} exited: {self.output.decode(errors='replace')}"))
        self.ended.callback(None)

    def stop(self) -> defer.Deferred[None]:
        if not self.ended.called:
            self.transport.signalProcess("KILL")
        return bounded(self.ended, 10, f"{self.argv[0]} exit")


def _https_identity(directory: str) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and localhost (pebble's
    HTTPS): its file (also the CA bundle to trust) and its key's file."""
    cert, key = self_signed(
        "pebble under test", dns=("localhost",), ips=("127.0.0.1",), ca=True,
        valid_for=datetime.timedelta(days=1), backdate=datetime.timedelta(minutes=5),
    )
    cert_path = os.path.join(directory, "https.pem")
    key_path = os.path.join(directory, "https-key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


class Pebble:
    """pebble and its DNS, validating HTTP-01 on ``http_port`` and
    TLS-ALPN-01 on ``tls_port`` of 127.0.0.1 (every name resolves there).

    ``directory``: the ACME directory URL; ``ca_bundle``: the file to trust
    for its HTTPS; ``roots_url``: where pebble serves the root of the chains
    it issues (fresh at each start)."""

    def __init__(
        self,
        cleanup: Cleanups,
        *,
        http_port: int,
        tls_port: int,
        blocked: tuple[str, ...] = (),
        validity: int | None = None,
    ) -> None:
        assert PEBBLE is not None and CHALLTESTSRV is not None
        self.dir = scratch_dir("prexy-pebble-")
        self.port = free_port()
        self.management = free_port()
        self.dns = free_port()
        self.dns_management = free_port()
        self.ca_bundle, key_path = _https_identity(self.dir)
        config: dict[str, Any] = {
            "listenAddress": f"127.0.0.1:{self.port}",
            "managementListenAddress": f"127.0.0.1:{self.management}",
            "certificate": self.ca_bundle,
            "privateKey": key_path,
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": False,
            "domainBlocklist": list(blocked),
        }
        if validity is not None:
            config["certificateValidityPeriod"] = validity
        self.config = os.path.join(self.dir, "pebble.json")
        with open(self.config, "w") as f:
            json.dump({"pebble": config}, f)
        self.children: list[Child] = []
        cleanup(self.stop)

    @property
    def directory(self) -> str:
        return f"https://127.0.0.1:{self.port}/dir"

    @property
    def roots_url(self) -> str:
        return f"https://127.0.0.1:{self.management}/roots/0"

    @defer.inlineCallbacks
    def start(self) -> Any:
        assert PEBBLE is not None and CHALLTESTSRV is not None
        dns = Child(
            [CHALLTESTSRV, "-dns01", f"127.0.0.1:{self.dns}", "-http01", "", "-https01", "", "-tlsalpn01", "",
             "-management", f"127.0.0.1:{self.dns_management}", "-defaultIPv6", ""],
            b"Starting management server",
            env={},
            cwd=self.dir,
        )
        self.children.append(dns)
        yield bounded(dns.ready, 15, "pebble-challtestsrv readiness line")
        env = {
            # Validate at once, never reject a good nonce, never reuse an
            # authorization: each order is validated for real, quickly.
            "PEBBLE_VA_NOSLEEP": "1",
            "PEBBLE_WFE_NONCEREJECT": "0",
            "PEBBLE_AUTHZREUSE": "0",
        }
        ca = Child(
            [PEBBLE, "-config", self.config, "-dnsserver", f"127.0.0.1:{self.dns}"],
            b"ACME directory available at",
            env=env,
            cwd=self.dir,
        )
        self.children.append(ca)
        yield bounded(ca.ready, 15, "pebble readiness line")
        # pebble logs its directory's URL just before it binds the port.
        yield listening(self.port, 5)

    @defer.inlineCallbacks
    def stop(self) -> Any:
        while self.children:
            yield self.children.pop().stop()

    def output(self) -> str:
        return "\n".join(c.output.decode(errors="replace") for c in self.children)


@defer.inlineCallbacks
def start_pebble(cleanup: Cleanups, **kwargs: Any) -> Any:
    """A started :class:`Pebble` (a Deferred of it)."""
    pebble = Pebble(cleanup, **kwargs)
    yield pebble.start()
    return pebble
