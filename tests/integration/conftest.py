"""Shared fixtures of the real-socket tier (pytest with pytest-twisted).

``cleanup`` is the tier's ``addCleanup``: callables run last-in first-out
after the test, a Deferred result waited for with ``pytest_twisted.blockon``
(fixtures run in the reactor's greenlet).  The other fixtures register their
own teardown there, so a test that restarts a proxy mid-way still stops
every instance in reverse order of start.

Each test's ports (``free_port``) and scratch directories (``scratch_dir``)
are released and removed after every other teardown of the test.  The whole
session runs with a temporary directory of its own (``tests.tmpguard``):
whatever is left there at the end fails the session.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.logger import globalLogPublisher

from prexy.config import Config, SiteConfig, Timeouts, UpstreamURL
from prexy.runtime import build_runtime
from prexy.service import ProxyService
from tests.tmpguard import PrivateTmp, describe

from .origin import Origin, origin_site
from .twistd_support import release_ports, remove_scratch, reserved_ports, scratch_dirs

#: The session's own temporary directory (see pytest_configure).
_private: list[PrivateTmp] = []


def pytest_configure(config: pytest.Config) -> None:
    _private.append(PrivateTmp())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fails the session when its tests left anything in their temporary
    directory (pytest's own ``tmp_path`` base, which pytest manages, aside),
    then removes the directory."""
    release_ports()
    remove_scratch()
    if not _private:
        return
    private = _private.pop()
    left = private.leftovers(ignore=lambda name: name.startswith("pytest-of-"))
    private.close()
    if not left:
        return
    message = describe(left, private.path)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_sep("=", "temporary files left behind", red=True)
        reporter.write_line(message)
    else:
        sys.stderr.write(message + "\n")
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _test_resources() -> Iterator[None]:
    """Releases the ports reserved and removes the scratch directories made
    during the test, after all its other teardowns (an autouse fixture is
    set up first, so torn down last)."""
    ports, dirs = reserved_ports(), set(scratch_dirs())
    yield
    release_ports(reserved_ports() - ports)
    remove_scratch([d for d in scratch_dirs() if d not in dirs])


class Cleanups:
    def __init__(self) -> None:
        self._stack: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def __call__(self, f: Callable[..., Any], *args: Any) -> None:
        self._stack.append((f, args))

    def run(self) -> None:
        errors: list[BaseException] = []
        while self._stack:
            f, args = self._stack.pop()
            try:
                pytest_twisted.blockon(defer.maybeDeferred(f, *args))
            except BaseException as e:  # run them all, then report the first
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def cleanup() -> Iterator[Cleanups]:
    stack = Cleanups()
    yield stack
    stack.run()


@pytest.fixture
def logged_errors() -> Iterator[list[Any]]:
    """Failures logged during the test (what trial's flushLoggedErrors saw)."""
    failures: list[Any] = []

    def observe(event: dict[str, Any]) -> None:
        if "log_failure" in event:
            failures.append(event["log_failure"])

    globalLogPublisher.addObserver(observe)
    yield failures
    globalLogPublisher.removeObserver(observe)


class OriginServer:
    """An ``Origin`` listening on loopback."""

    def __init__(self, cleanup: Cleanups, site: Any = None) -> None:
        self.origin = Origin()
        self.port = reactor.listenTCP(0, site or origin_site(self.origin), interface="127.0.0.1")
        cleanup(self.port.stopListening)
        self.url = f"http://127.0.0.1:{self.port.getHost().port}"


@pytest.fixture
def origin_server(cleanup: Cleanups) -> OriginServer:
    return OriginServer(cleanup)


class Proxy:
    """A ``ProxyService`` in the test process; ``start`` again after ``stop``."""

    def __init__(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        self.service: ProxyService

    @defer.inlineCallbacks
    def start(self, config: Config) -> Any:
        self.service = ProxyService(reactor, config, build_runtime(config))
        self.service.startService()
        self.cleanup(self.service.stopService)
        (port,) = yield self.service.listening_ports()
        self.port = port.getHost().port
        return self

    def start_site(
        self, upstream: str, timeouts: Timeouts = Timeouts(), rules: tuple[str, ...] = (), **site: Any
    ) -> defer.Deferred[Any]:
        config = Config(
            listen=("tcp:0:interface=127.0.0.1",),
            sites=(SiteConfig("t", UpstreamURL.parse(upstream), rules=rules, **site),),
            default_site="t",
            timeouts=timeouts,
            access_log=None,
        )
        return self.start(config)

    def stop(self) -> Any:
        return self.service.stopService()


@pytest.fixture
def proxy(cleanup: Cleanups) -> Proxy:
    return Proxy(cleanup)

