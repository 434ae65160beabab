"""ClusterService, the Twisted shell, against an in-memory Redis on a Clock:
two nodes share purges and bans, a publisher's answer waits for the other
live node's acknowledgement, a node cut off keeps serving, logs the outage
once, retries on the backoff schedule, queues what it publishes and, when
Redis returns, reads what it missed before publishing its queue; a
restarted node replays only what it has not seen; trimmed history empties
the store; a start without Redis is held at most start_wait; the on_live
hooks run, subscribed, before ready and after each reconnect, bounded;
and any script of publications, cuts and returns converges (hypothesis)."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet import defer
from twisted.internet.task import Clock
from twisted.logger import globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer

from prexy.cluster.core import Phase
from prexy.cluster.messages import Invalidation
from prexy.cluster.node import (
    COMMAND_TIMEOUT,
    HEARTBEAT,
    ON_LIVE_WAIT,
    ClusterService,
    IClusterTarget,
    PositionFile,
)
from prexy.cluster.settings import ClusterConfig, RedisAddress
from prexy.metrics import Metrics
from tests.cases import tmp_dir
from tests.cluster.fakeredis import FakeNet, FakeRedis

PURGE = Invalidation.purge("s", b"h/a")
BAN = Invalidation.ban(None, "^h/b")


@implementer(IClusterTarget)
class Target:
    """Records what the node applies."""

    def __init__(self) -> None:
        self.applied: list[Invalidation] = []
        self.flushes = 0

    def apply(self, invalidation: Invalidation) -> defer.Deferred[Any]:
        self.applied.append(invalidation)
        return defer.succeed(None)

    def flush(self) -> defer.Deferred[Any]:
        self.flushes += 1
        return defer.succeed(None)


class Node:
    def __init__(self, test: SynchronousTestCase, name: str, server: FakeRedis, clock: Clock, directory: str,
                 **settings: Any) -> None:
        self.net = FakeNet(server)
        self.target = Target()
        self.metrics = Metrics()
        self.settings = ClusterConfig(RedisAddress(host="fake"), name, **settings)
        self.position = PositionFile(os.path.join(directory, f"{name}.position"))
        self.service = ClusterService(clock, self.settings, self.target, self.metrics, self.position,
                                      connect_to=self.net.connect)

    def counter(self, name: str, **labels: str) -> int:
        return self.metrics.counters[(name, tuple(sorted(labels.items())))]


class NodeCase(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000)
        self.server = FakeRedis(self.clock)
        self.dir = tmp_dir(self)
        self.logged: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.logged.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.logged.append)

    def node(self, name: str, **settings: Any) -> Node:
        node = Node(self, name, self.server, self.clock, self.dir, **settings)
        self.addCleanup(lambda: node.service.running and node.service.stopService())
        return node

    def flush(self, *nodes: Node) -> None:
        for _ in range(20):
            for node in nodes:
                node.net.flush()

    def start(self, *nodes: Node) -> None:
        for node in nodes:
            node.service.startService()
        self.flush(*nodes)

    def warnings(self, text: str) -> int:
        return sum(1 for e in self.logged if text in str(e.get("log_format", "")))


class ClusterServiceTests(NodeCase):
    def test_purge_reaches_the_other_node_and_is_confirmed(self) -> None:
        """A's purge is applied by B; A's answer waits for B's ack."""
        a, b = self.node("a"), self.node("b")
        self.start(a, b)
        self.assertIs(a.service.core.phase, Phase.LIVE)
        self.assertIsNone(self.successResultOf(b.service.ready))
        note = a.service.publish(PURGE)
        self.assertNoResult(note)
        self.flush(a, b)
        self.assertEqual(b.target.applied, [PURGE])
        self.assertEqual(a.target.applied, [], "a node never applies its own entry again")
        self.assertEqual(self.successResultOf(note), b"cluster: applied by all 1 other node(s)\n")
        self.assertEqual(b.counter("prexy_cluster_applied_total", kind="purge"), 1)
        self.assertEqual(a.counter("prexy_cluster_skipped_total", reason="own"), 1)
        self.assertEqual(b.position.load(), a.service.core.position)
        self.assertIn("cluster: live", a.service.health())
        self.assertEqual(a.service.gauges()["prexy_cluster_up"], 1.0)

    def test_alone_is_confirmed_at_once(self) -> None:
        a = self.node("a")
        self.start(a)
        note = a.service.publish(BAN)
        self.flush(a)
        self.assertEqual(self.successResultOf(note), b"cluster: applied by all 0 other node(s)\n")

    def test_silent_node_not_waited_for_long(self) -> None:
        """A live node that does not ack: the answer comes after confirm_timeout, naming it."""
        a, b = self.node("a", confirm_timeout=0.5), self.node("b")
        self.start(a, b)
        b.net.refuse = True
        b.net.drop_all()
        self.flush(a, b)
        note = a.service.publish(BAN)
        self.flush(a)
        self.assertNoResult(note)
        self.clock.advance(0.5)
        self.assertEqual(self.successResultOf(note), b"cluster: applied by 0 of 1 other node(s); not confirmed: b\n")

    def test_outage_logged_once_backoff_and_catch_up(self) -> None:
        """B cut off: one warning however many attempts, attempts on the
        backoff schedule, its own purge queued; back: B applies A's ban it
        missed, then publishes its queued purge, which A applies."""
        a, b = self.node("a"), self.node("b")
        self.start(a, b)
        b.net.refuse = True
        b.net.drop_all()
        self.flush(a, b)
        self.assertIs(b.service.core.phase, Phase.DOWN)
        self.assertEqual(self.successResultOf(b.service.publish(PURGE)),
                         b"cluster: Redis unreachable: applied here, published when it returns\n")
        self.flush(a)
        a.service.publish(BAN)
        self.flush(a)
        attempts = []
        for _ in range(6):
            delay = self.clock.getDelayedCalls()
            pending = [c for c in delay if c.func == b.service._attempt]  # the retry timer
            self.assertEqual(len(pending), 1)
            attempts.append(round(pending[0].getTime() - self.clock.seconds(), 3))
            self.clock.advance(pending[0].getTime() - self.clock.seconds())
            self.flush(a, b)
        self.assertEqual(attempts, [0.25, 0.5, 1.0, 2.0, 4.0, 8.0])
        self.assertEqual(self.warnings("unreachable"), 1)
        self.assertEqual(b.counter("prexy_cluster_outages_total"), 1)
        self.assertIn("down for", b.service.health())
        self.assertIn("1 queued", b.service.health())
        self.assertEqual(b.target.applied, [])
        b.net.refuse = False
        self.clock.advance(10.0)
        self.flush(a, b)
        self.assertIs(b.service.core.phase, Phase.LIVE)
        self.assertEqual(b.target.applied, [BAN])
        self.assertEqual(a.target.applied, [PURGE])
        self.assertEqual(self.warnings("back after"), 1)
        # The backoff starts over after a success.
        b.net.refuse = True
        b.net.drop_all()
        self.flush(b)
        pending = [c for c in self.clock.getDelayedCalls() if c.func == b.service._attempt]
        self.assertEqual(pending[0].getTime() - self.clock.seconds(), 0.25)

    def test_restart_replays_only_what_was_missed(self) -> None:
        """A node restarted with its position file reads only later entries;
        a reload in the log before it started is not applied."""
        a, b = self.node("a"), self.node("b")
        self.start(a, b)
        a.service.publish(PURGE)
        self.flush(a, b)
        stopped = b.service.stopService()
        self.flush(b)
        self.successResultOf(stopped)
        a.service.publish(BAN)
        a.service.publish(Invalidation.reload())
        self.flush(a)
        self.clock.advance(1.0)  # b was seen too long ago: not waited for
        b2 = self.node("b")
        b2.service.startService()
        self.assertNoResult(b2.service.ready)
        self.flush(a, b2)
        self.successResultOf(b2.service.ready)
        self.assertEqual(b2.target.applied, [BAN])
        self.assertEqual(b2.counter("prexy_cluster_skipped_total", reason="old-reload"), 1)
        # Once live, a reload is applied.
        a.service.publish(Invalidation.reload())
        self.flush(a, b2)
        self.assertEqual(b2.target.applied, [BAN, Invalidation.reload()])

    def test_trimmed_history_empties_the_store(self) -> None:
        """Entries past the node's position were trimmed: flush, then carry on."""
        a = self.node("a", max_entries=100)
        self.start(a)
        for i in range(150):
            a.service.publish(Invalidation.purge("s", b"%d" % i))
            self.flush(a)
        b = self.node("b")
        self.start(b)
        self.assertEqual(b.target.flushes, 1)
        self.assertEqual(b.counter("prexy_cluster_flushes_total"), 1)
        self.assertEqual(len(b.target.applied), len(self.server.streams[b"prexy:log"]))
        self.assertIs(b.service.core.phase, Phase.LIVE)

    def test_start_without_redis_waits_start_wait(self) -> None:
        """Redis unreachable at start: ready fires after start_wait, not before."""
        a = self.node("a", start_wait=3.0)
        a.net.refuse = True
        self.start(a)
        self.clock.advance(2.9)
        self.assertNoResult(a.service.ready)
        self.clock.advance(0.1)
        self.successResultOf(a.service.ready)
        self.assertEqual(self.warnings("not caught up"), 1)

    def test_unanswered_heartbeat_drops_the_connection(self) -> None:
        """Redis that stops answering (no reset): the heartbeat times out and
        the node goes down and retries."""
        a = self.node("a")
        self.start(a)
        self.clock.advance(HEARTBEAT)  # commands sent, never answered (no flush)
        self.clock.advance(COMMAND_TIMEOUT)
        self.flush(a)
        self.assertIs(a.service.core.phase, Phase.DOWN)
        self.clock.advance(0.25)
        self.flush(a)
        self.assertIs(a.service.core.phase, Phase.LIVE)

    def test_redis_error_on_publish_queues(self) -> None:
        """An XADD that fails puts the invalidation back in the queue."""
        a = self.node("a")
        self.start(a)
        note = a.service.publish(PURGE)
        a.net.refuse = True
        a.net.drop_all()
        self.assertEqual(self.successResultOf(note), b"cluster: Redis unreachable: applied here, published when it returns\n")
        self.assertEqual(list(a.service.core.queue), [PURGE])

    def test_stop(self) -> None:
        """Stopping leaves the table of live nodes (nobody waits for a node
        that stopped cleanly), closes the connections, retries no more."""
        a = self.node("a")
        self.start(a)
        self.assertIn(b"a", self.server.hashes[b"prexy:nodes"])
        d = a.service.stopService()
        self.flush(a)
        self.successResultOf(d)
        self.assertNotIn(b"a", self.server.hashes[b"prexy:nodes"])
        self.assertIs(a.service.core.phase, Phase.STOPPED)
        self.assertEqual(self.clock.getDelayedCalls(), [])


class OnLiveTests(NodeCase):
    """The on_live hooks (prexy.acme.fleet loads the pending challenge
    answers with one) run once the subscriber is subscribed, and ready
    waits for them, at most ON_LIVE_WAIT; they run again on each reconnect."""

    def setUp(self) -> None:
        super().setUp()
        self.subscribed_at_hook: list[bool] = []

    def hooked(self, node: Node) -> list[defer.Deferred[Any]]:
        calls: list[defer.Deferred[Any]] = []

        def hook() -> defer.Deferred[Any]:
            subscribed = {id(s) for s in self.server.subscribers.get(node.settings.channel.encode(), [])}
            mine = [s for c, s in node.net.connections if c is node.service.subscriber]
            self.subscribed_at_hook.append(len(mine) == 1 and id(mine[0]) in subscribed)
            d: defer.Deferred[Any] = defer.Deferred()
            calls.append(d)
            return d

        node.service.on_live.append(hook)
        return calls

    def test_ready_waits_for_the_hooks(self) -> None:
        a = self.node("a")
        calls = self.hooked(a)
        self.start(a)
        self.assertIs(a.service.core.phase, Phase.LIVE)
        self.assertEqual(len(calls), 1)
        self.assertEqual(self.subscribed_at_hook, [True])
        self.assertNoResult(a.service.ready)
        calls[0].callback(3)
        self.successResultOf(a.service.ready)
        self.assertEqual(self.warnings("going live"), 0)

    def test_failing_hook_logged_and_ready_anyway(self) -> None:
        a = self.node("a")
        calls = self.hooked(a)
        self.start(a)
        calls[0].errback(ConnectionError("Redis went away"))
        self.successResultOf(a.service.ready)
        self.assertEqual(self.warnings("going live"), 1)

    def test_slow_hook_bounded(self) -> None:
        """A hook that never answers holds ready ON_LIVE_WAIT seconds; the
        start_wait timer (longer) no longer warns once the node is live."""
        a = self.node("a", start_wait=ON_LIVE_WAIT + 1.0)
        self.hooked(a)
        self.start(a)
        self.clock.advance(ON_LIVE_WAIT - 0.1)
        self.assertNoResult(a.service.ready)
        self.clock.advance(0.1)
        self.successResultOf(a.service.ready)
        self.assertEqual(self.warnings("going live"), 1)
        self.clock.advance(5.0)
        self.assertEqual(self.warnings("not caught up"), 0)

    def test_hooks_run_again_after_a_reconnect(self) -> None:
        a = self.node("a")
        calls = self.hooked(a)
        self.start(a)
        calls[0].callback(None)
        a.net.drop_all()
        self.flush(a)
        self.assertIs(a.service.core.phase, Phase.DOWN)
        self.clock.advance(0.25)
        self.flush(a)
        self.assertIs(a.service.core.phase, Phase.LIVE)
        self.assertEqual(len(calls), 2)
        self.assertEqual(self.subscribed_at_hook, [True, True])


actions = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.integers(0, 1)),
        st.tuples(st.just("cut"), st.integers(0, 1)),
        st.tuples(st.just("restore"), st.integers(0, 1)),
        st.tuples(st.just("advance"), st.sampled_from([0.1, 0.5, 2.0, 7.0])),
    ),
    max_size=25,
)


class ConvergenceTests(SynchronousTestCase):
    @settings(max_examples=60, deadline=None)
    @given(actions)
    def test_every_invalidation_reaches_the_other_node(self, script: list[tuple[str, Any]]) -> None:
        """Whatever the order of publications, cuts, returns and waits, once
        Redis is back for both, each node has applied every invalidation the
        other made (at least once: applying again is harmless) and none of
        its own."""
        clock = Clock()
        clock.advance(1_700_000_000)
        server = FakeRedis(clock)
        directory = tempfile.mkdtemp(prefix="prexy-cluster-conv-")
        self.addCleanup(shutil.rmtree, directory, True)
        nodes = [Node(self, name, server, clock, directory) for name in "ab"]
        made: list[set[bytes]] = [set(), set()]

        def flush() -> None:
            for _ in range(20):
                for node in nodes:
                    node.net.flush()

        for node in nodes:
            node.service.startService()
        flush()
        for i, (action, arg) in enumerate(script):
            node = nodes[arg] if action != "advance" else None
            if action == "publish":
                subject = b"x/%d" % i
                made[arg].add(subject)
                node.service.publish(Invalidation.purge("s", subject))
            elif action == "cut":
                node.net.refuse = True
                node.net.drop_all()
            elif action == "restore":
                node.net.refuse = False
            else:
                clock.advance(arg)
            flush()
        for node in nodes:
            node.net.refuse = False
        for _ in range(40):
            clock.advance(1.0)
            flush()
        for me, other in ((0, 1), (1, 0)):
            applied = {inv.subject for inv in nodes[me].target.applied}
            self.assertEqual(applied, made[other])
        for node in nodes:
            stopped = node.service.stopService()
            flush()
            self.successResultOf(stopped)
