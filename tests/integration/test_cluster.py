"""Nodes that act as one cache, with a real ``redis-server`` on loopback.

The Redis client alone (TCP and a UNIX socket), two ``ClusterService``s in
this process, and three ``twistd -n prexy`` nodes (own store, own ports, one
origin, one Redis): a PURGE on A is a miss on C right after its answer; a
ban sent while B is stopped is applied by B before it serves again; Redis
stopped and started under load fails no request, and the PURGE made while
it was away reaches the other nodes when it returns.  Every wait fires on
an event (a readiness line, READY=1, a message on the fleet's channel) and
is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, protocol, reactor
from twisted.internet.threads import deferToThread
from twisted.web.client import Agent, HTTPConnectionPool, readBody
from twisted.web.http_headers import Headers

from prexy.cluster.messages import Invalidation, parse_id
from prexy.cluster.node import ClusterService, PositionFile
from prexy.cluster.redis import RedisConnection, connect
from prexy.cluster.settings import ClusterConfig, RedisAddress
from prexy.config import parse_config
from prexy.metrics import Metrics
from prexy.runtime import build_runtime
from prexy.service import ProxyService

from .conftest import Cleanups
from .origin import Origin, origin_site
from .twistd_support import TWISTD, Twistd, child_env, free_port, scratch_dir

REDIS = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
pytestmark = [
    pytest.mark.skipif(REDIS is None, reason="needs redis-server (Debian: apt-get install redis-server)"),
    # twisted.web's readBody on a non-persistent pool's transport (not ours to change).
    pytest.mark.filterwarnings("ignore:Using readBody with a transport"),
]


def bounded(d: defer.Deferred[Any], seconds: float, what: str) -> defer.Deferred[Any]:
    """``d``, failing with ``what`` after ``seconds``."""
    timer = reactor.callLater(seconds, lambda: d.called or d.errback(AssertionError(f"no {what} in {seconds} s")))
    return d.addBoth(lambda v: (timer.active() and timer.cancel(), v)[1])


class RedisProcess(protocol.ProcessProtocol):
    """One ``redis-server`` child: ``ready`` fires on its readiness line,
    ``ended`` when it exits."""

    def __init__(self, port: int, unix: str | None) -> None:
        self.port = port
        self.output = b""
        self.ready: defer.Deferred[None] = defer.Deferred()
        self.ended: defer.Deferred[None] = defer.Deferred()
        args = [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--daemonize", "no", "--loglevel", "notice"]
        if unix:
            args += ["--unixsocket", unix, "--unixsocketperm", "700"]
        reactor.spawnProcess(self, REDIS, args, env={}, childFDs={0: "w", 1: "r", 2: "r"})

    def outReceived(self, data: bytes) -> None:
        self.output += data
        if b"Ready to accept connections" in self.output and not self.ready.called:
            self.ready.callback(None)

    errReceived = outReceived

    def processEnded(self, reason: Any) -> None:
        if not self.ready.called:
            self.ready.errback(AssertionError(f"redis-server exited: {self.output.decode(errors='replace')}"))
        self.ended.callback(None)

    def stop(self) -> defer.Deferred[None]:
        if not self.ended.called:
            self.transport.signalProcess("TERM")
        return bounded(self.ended, 15, "redis-server exit")


class Redis:
    """A redis-server on a free loopback port (and a UNIX socket), restartable."""

    def __init__(self, cleanup: Cleanups) -> None:
        self.port = free_port()
        self.dir = scratch_dir("prexy-redis-")
        self.unix = os.path.join(self.dir, "redis.sock")
        self.process: RedisProcess | None = None
        cleanup(lambda: self.process.stop() if self.process is not None else None)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> defer.Deferred[None]:
        self.process = RedisProcess(self.port, self.unix)
        return bounded(self.process.ready, 15, "redis-server readiness line")

    def stop(self) -> defer.Deferred[None]:
        assert self.process is not None
        return self.process.stop()


@pytest.fixture
def redis(cleanup: Cleanups) -> Any:
    server = Redis(cleanup)
    pytest_twisted.blockon(server.start())
    return server


class Channel:
    """The fleet's channel, watched from the test: ``until(check)`` fires
    when ``check()`` (a Deferred of bool, asked of Redis) holds, asking again
    on each message."""

    def __init__(self, commands: RedisConnection, messages: list[bytes]) -> None:
        self.commands = commands
        self.messages = messages
        self._waiting: list[defer.Deferred[None]] = []

    @classmethod
    @defer.inlineCallbacks
    def open(cls, url: str, cleanup: Cleanups, key: str = "prexy") -> Any:
        messages: list[bytes] = []
        address = RedisAddress.parse(url)
        commands = yield connect(reactor, address)
        channel = cls(commands, messages)

        def on_message(_: bytes, payload: bytes) -> None:
            messages.append(payload)
            waiting, channel._waiting = channel._waiting, []
            for d in waiting:
                d.callback(None)

        sub = yield connect(reactor, address, on_message)
        yield sub.command("SUBSCRIBE", f"{key}:events")
        cleanup(sub.abort)
        cleanup(commands.abort)
        return channel

    def next_message(self) -> defer.Deferred[None]:
        d: defer.Deferred[None] = defer.Deferred()
        self._waiting.append(d)
        return d

    @defer.inlineCallbacks
    def until(self, check: Callable[[], defer.Deferred[bool]], seconds: float, what: str) -> Any:
        deadline = reactor.seconds() + seconds
        while True:
            message = self.next_message()  # armed before asking: nothing slips between
            if (yield check()):
                return
            left = deadline - reactor.seconds()
            if left <= 0:
                raise AssertionError(f"no {what} in {seconds} s")
            yield bounded(message, left, what)

    def node_at_least(self, node: str, entry: tuple[int, int]) -> Callable[[], defer.Deferred[bool]]:
        """A check: ``node`` acknowledged the log up to ``entry``."""

        @defer.inlineCallbacks
        def check() -> Any:
            raw = yield self.commands.command("HGET", "prexy:nodes", node)
            return raw is not None and parse_id(raw.split(b" ")[0]) >= entry

        return check

    @defer.inlineCallbacks
    def last_entry(self) -> Any:
        reply = yield self.commands.command("XREVRANGE", "prexy:log", "+", "-", "COUNT", 1)
        return parse_id(reply[0][0]) if reply else None


# -- the client and the service in this process ---------------------------------------


@pytest_twisted.inlineCallbacks
def test_client_tcp_and_unix(redis: Redis, cleanup: Cleanups) -> Any:
    """Commands, error replies and pipelining against the real server, over
    TCP with a database number and over the UNIX socket."""
    for url in (f"redis://127.0.0.1:{redis.port}/3", f"unix://{redis.unix}?db=2"):
        c = yield connect(reactor, RedisAddress.parse(url))
        cleanup(c.abort)
        replies = yield defer.gatherResults([c.command("SET", "k", url), c.command("GET", "k"), c.command("PING")])
        assert replies == [b"OK", url.encode(), b"PONG"]
        with pytest.raises(Exception, match="WRONGTYPE"):
            yield c.command("XADD", "k", "*", "a", "b")
    c = yield connect(reactor, RedisAddress.parse(f"redis://127.0.0.1:{redis.port}/3"))
    cleanup(c.abort)
    assert (yield c.command("GET", "k")) == f"redis://127.0.0.1:{redis.port}/3".encode()


class Target:
    def __init__(self) -> None:
        self.applied: list[Invalidation] = []
        self.seen: defer.Deferred[None] = defer.Deferred()

    def apply(self, invalidation: Invalidation) -> defer.Deferred[Any]:
        self.applied.append(invalidation)
        if not self.seen.called:
            self.seen.callback(None)
        return defer.succeed(None)

    def flush(self) -> defer.Deferred[Any]:
        return defer.succeed(None)


@pytest_twisted.inlineCallbacks
def test_two_services(redis: Redis, cleanup: Cleanups) -> Any:
    """Two ClusterServices on the real server: a ban published by one is
    applied by the other before the publisher's answer."""
    tmp = scratch_dir("prexy-cluster-")
    services, targets = [], []
    for name in ("a", "b"):
        target = Target()
        svc = ClusterService(reactor, ClusterConfig(RedisAddress.parse(redis.url), name), target, Metrics(),
                             PositionFile(os.path.join(tmp, name)))
        svc.startService()
        cleanup(svc.stopService)
        services.append(svc)
        targets.append(target)
    yield bounded(defer.gatherResults([s.ready for s in services]), 10, "both services ready")
    note = yield bounded(services[0].publish(Invalidation.ban("t", "^x")), 10, "confirmation")
    assert note == b"cluster: applied by all 1 other node(s)\n"
    assert targets[1].applied == [Invalidation.ban("t", "^x")]
    assert targets[0].applied == []


@pytest_twisted.inlineCallbacks
def test_single_process_nodes(redis: Redis, cleanup: Cleanups) -> Any:
    """Two nodes with workers = 0 (one process each, the cluster service in
    the proxy's own process): a PURGE on X empties Y's store before X answers."""
    origin = Origin()
    origin_port = reactor.listenTCP(0, origin_site(origin), interface="127.0.0.1")
    cleanup(origin_port.stopListening)
    tmp = scratch_dir("prexy-cluster-inproc-")
    ports = {}
    for name in "xy":
        config = parse_config(
            f"[server]\nlisten = ['tcp:0:interface=127.0.0.1']\nworkers = 0\naccess_log = 'off'\n"
            f"[cache]\nsize = '16M'\npath = '{os.path.join(tmp, name)}'\n"
            f"[cluster]\nredis = '{redis.url}'\nnode = '{name}'\n"
            f"[sites.t]\nupstream = 'http://127.0.0.1:{origin_port.getHost().port}'\n",
            os.path.join(tmp, f"{name}.toml"),
        )
        svc = ProxyService(reactor, config, build_runtime(config))
        svc.startService()
        cleanup(svc.stopService)
        (port,) = yield svc.listening_ports()
        ports[name] = port.getHost().port
        yield bounded(svc.cluster.ready, 10, f"node {name} caught up")
    agent = Agent(reactor, pool=HTTPConnectionPool(reactor, persistent=False))

    @defer.inlineCallbacks
    def ask(name: str, method: bytes) -> Any:
        response = yield agent.request(method, b"http://127.0.0.1:%d/c/inproc" % ports[name],
                                       Headers({b"host": [b"t"]}))
        body = yield readBody(response)
        return (response.headers.getRawHeaders(b"cache-status") or [b""])[0], body

    for name in "xy":
        yield ask(name, b"GET")
        status, _ = yield ask(name, b"GET")
        assert hit(status), (name, status)
    _, body = yield ask("x", b"PURGE")
    assert body == b"purged 1 object(s)\ncluster: applied by all 1 other node(s)\n", body
    status, _ = yield ask("y", b"GET")
    assert status.startswith(b"prexy; fwd=uri-miss"), status


# -- three twistd nodes ----------------------------------------------------------------


class Fleet:
    """One origin, three ``twistd -n prexy`` nodes (a, b, c) on one Redis."""

    def __init__(self, cleanup: Cleanups, redis: Redis) -> None:
        self.cleanup = cleanup
        self.redis = redis
        self.origin = Origin()
        port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        cleanup(port.stopListening)
        self.origin_port = port.getHost().port
        self.dir = scratch_dir("prexy-fleet-")
        self.ports: dict[str, tuple[int, int]] = {}
        self.nodes: dict[str, Twistd] = {}
        pool = HTTPConnectionPool(reactor, persistent=False)
        self.agent = Agent(reactor, pool=pool, connectTimeout=10)

    def config(self, name: str) -> str:
        if name not in self.ports:
            self.ports[name] = (free_port(), free_port())
        port, admin = self.ports[name]
        path = os.path.join(self.dir, f"{name}.toml")
        with open(path, "w") as f:
            f.write(
                f"[server]\nlisten = ['tcp:{port}:interface=127.0.0.1']\nadmin = 'tcp:{admin}:interface=127.0.0.1'\n"
                f"workers = 1\naccess_log = 'off'\n"
                f"[cache]\nsize = '32M'\npath = '{os.path.join(self.dir, 'store-' + name)}'\n"
                f"[cluster]\nredis = '{self.redis.url}'\nnode = '{name}'\nstart_wait = 5\nconfirm_timeout = 3\n"
                f"[sites.t]\nupstream = 'http://127.0.0.1:{self.origin_port}'\n"
            )
        return path

    def start(self, name: str) -> defer.Deferred[None]:
        child = Twistd("--config", self.config(name))
        self.nodes[name] = child
        self.cleanup(child.stop)
        return child.ready(30)

    def stop(self, name: str) -> Any:
        child = self.nodes.pop(name)
        child.process.send_signal(signal.SIGTERM)
        return child.wait_exit(30)

    @defer.inlineCallbacks
    def request(self, name: str, method: bytes, path: bytes, admin: bool = False) -> Any:
        port = self.ports[name][1 if admin else 0]
        response = yield self.agent.request(
            method, b"http://127.0.0.1:%d%s" % (port, path), Headers({b"host": [b"t"]})
        )
        body = yield readBody(response)
        status = (response.headers.getRawHeaders(b"cache-status") or [b""])[0]
        return response.code, status, body


@pytest.fixture
def fleet(cleanup: Cleanups, redis: Redis) -> Fleet:
    fleet = Fleet(cleanup, redis)
    pytest_twisted.blockon(bounded(defer.gatherResults([fleet.start(n) for n in "abc"]), 60, "three nodes ready"))
    return fleet


def hit(status: bytes) -> bool:
    return status.startswith(b"prexy; hit")


@pytest_twisted.inlineCallbacks
def test_purge_on_a_is_a_miss_on_c_at_once(fleet: Fleet) -> Any:
    """PURGE on A, then at once GET on C: a miss; a ban on B's admin
    endpoint empties A and C; a cluster-wide reload reloads B and C."""
    for name in "abc":
        yield fleet.request(name, b"GET", b"/c/p")
        _, status, _ = yield fleet.request(name, b"GET", b"/c/p")
        assert hit(status), (name, status)
    code, _, body = yield fleet.request("a", b"PURGE", b"/c/p")
    assert code == 200 and b"purged 1 object(s)" in body, body
    assert b"cluster: applied by every live node" in body, body
    _, status, _ = yield fleet.request("c", b"GET", b"/c/p")
    assert status.startswith(b"prexy; fwd=uri-miss"), status
    _, status, _ = yield fleet.request("b", b"GET", b"/c/p")
    assert status.startswith(b"prexy; fwd=uri-miss"), status

    for name in "ac":
        yield fleet.request(name, b"GET", b"/c/q")
    code, _, body = yield fleet.request("b", b"POST", b"/ban?regex=/c/q$", admin=True)
    assert code == 200 and b"cluster: applied by all 2 other node(s)" in body, body
    for name in "ac":
        _, status, _ = yield fleet.request(name, b"GET", b"/c/q")
        assert status.startswith(b"prexy; fwd=uri-miss"), (name, status)

    # twistd prexy --config A --reload --cluster: every node reloads.
    reloaded = [fleet.nodes[n].notified("READY=1", 30) for n in "abc"]
    args = [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "prexy", "--config", fleet.config("a"),
            "--reload", "--cluster"]
    result = yield deferToThread(subprocess.run, args, capture_output=True, text=True, timeout=60, env=child_env())
    assert result.returncode == 0, result.stderr
    assert "reloaded" in result.stdout and "applied by all 2 other node(s)" in result.stdout, result.stdout
    yield defer.gatherResults(reloaded)

    code, _, body = yield fleet.request("a", b"GET", b"/health", admin=True)
    assert body.startswith(b"ok\ncluster: live, node a on redis://127.0.0.1:"), body


@pytest_twisted.inlineCallbacks
def test_stopped_node_applies_missed_ban_before_serving(fleet: Fleet) -> Any:
    """B stopped, a ban sent on A, B started: its first answer for the
    banned URL is a miss (it caught up before its workers served)."""
    yield fleet.request("b", b"GET", b"/c/banned")
    _, status, _ = yield fleet.request("b", b"GET", b"/c/banned")
    assert hit(status), status
    yield fleet.stop("b")
    code, _, body = yield fleet.request("a", b"POST", b"/ban?regex=/c/banned$", admin=True)
    assert code == 200 and b"cluster: applied by all 1 other node(s)" in body, body  # B left cleanly: not waited for
    yield fleet.start("b")
    _, status, _ = yield fleet.request("b", b"GET", b"/c/banned")
    assert status.startswith(b"prexy; fwd=uri-miss"), status
    assert "cluster: node b live" in fleet.nodes["b"].output()


@pytest_twisted.inlineCallbacks
def test_redis_restart_under_load(fleet: Fleet, redis: Redis, cleanup: Cleanups) -> Any:
    """Redis stopped and started while three clients keep asking every node:
    no request fails; the PURGE made on A meanwhile is answered at once
    (applied on A, queued) and reaches C when Redis is back."""
    for name in "abc":
        yield fleet.request(name, b"GET", b"/c/r")
    answers: list[int] = []
    failures: list[Any] = []
    running = [True]
    first: defer.Deferred[None] = defer.Deferred()

    @defer.inlineCallbacks
    def load(i: int) -> Any:
        n = 0
        while running[0] and n < 2000:
            name = "abc"[(i + n) % 3]
            n += 1
            try:
                code, _, _ = yield fleet.request(name, b"GET", b"/c/load%d" % (n % 7))
                answers.append(code)
                if not first.called:
                    first.callback(None)
                if code != 200:
                    failures.append((name, code))
            except Exception as exc:  # a refused or cut connection is a failure too
                failures.append((name, repr(exc)))

    loads = [load(i) for i in range(3)]
    yield bounded(first, 30, "a first answer under load")
    yield redis.stop()
    during = len(answers)
    code, _, body = yield fleet.request("a", b"PURGE", b"/c/r")
    assert code == 200 and b"purged 1 object(s)" in body and b"Redis unreachable" in body, body
    _, _, metrics = yield fleet.request("a", b"GET", b"/metrics", admin=True)
    assert b"prexy_cluster_up 0.0" in metrics and b"prexy_cluster_queued 1.0" in metrics
    _, _, health = yield fleet.request("a", b"GET", b"/health", admin=True)
    assert b"1 queued to publish" in health, health
    yield redis.start()
    channel = yield Channel.open(redis.url, cleanup)

    @defer.inlineCallbacks
    def published() -> Any:
        return (yield channel.last_entry()) is not None

    yield channel.until(published, 30, "A's queued PURGE in the log")
    entry = yield channel.last_entry()
    yield channel.until(channel.node_at_least("c", entry), 30, "C's ack of A's PURGE")
    _, status, _ = yield fleet.request("c", b"GET", b"/c/r")
    assert status.startswith(b"prexy; fwd=uri-miss"), status
    running[0] = False
    yield bounded(defer.gatherResults(loads), 30, "the load's end")
    assert not failures, failures[:5]
    assert len(answers) > during > 0
    output = fleet.nodes["a"].output()
    assert output.count("unreachable (") == 1, "an outage is logged once"
    assert "back after" in output


@pytest_twisted.inlineCallbacks
def test_bans_mean_the_same_on_every_node(fleet: Fleet, redis: Redis, cleanup: Cleanups) -> Any:
    """A ban on B's admin endpoint (regex on the path and query, host on its
    own) drops the same objects on A and C.  An entry an older node wrote
    (no ``match`` field: its regex was searched in the stored URL, host
    included) is replayed with that meaning."""
    for path in (b"/c/anchored", b"/c/legacy", b"/c/legacy2"):
        for name in "abc":
            yield fleet.request(name, b"GET", path)
            _, status, _ = yield fleet.request(name, b"GET", path)
            assert hit(status), (name, path, status)
    code, _, body = yield fleet.request("b", b"POST", b"/ban?regex=%5E/c/anchored$&host=t&site=t", admin=True)
    assert (code, body) == (200, b"banned 1 object(s)\ncluster: applied by all 2 other node(s)\n"), body
    for name in "ac":
        _, status, _ = yield fleet.request(name, b"GET", b"/c/anchored")
        assert status.startswith(b"prexy; fwd=uri-miss"), (name, status)

    channel = yield Channel.open(redis.url, cleanup)
    entries = []
    for subject in (b"^t/c/legacy$", b"^/c/legacy2$"):  # the second matched nothing where it was written
        raw = yield channel.commands.command("XADD", "prexy:log", "*", "kind", "ban", "node", "old", "at", "1.0",
                                             "site", "t", "subject", subject)
        entries.append(parse_id(raw))
        yield channel.commands.command("PUBLISH", "prexy:events", b"entry " + raw)
    for name in "ac":
        yield channel.until(channel.node_at_least(name, entries[-1]), 30, f"{name}'s ack of the older entries")
        _, status, _ = yield fleet.request(name, b"GET", b"/c/legacy")
        assert status.startswith(b"prexy; fwd=uri-miss"), (name, status)
        _, status, _ = yield fleet.request(name, b"GET", b"/c/legacy2")
        assert hit(status), (name, status)
    assert "cluster: ban t ^t/c/legacy$ (on the whole URL) from old" in fleet.nodes["a"].output()
