"""The Twisted side of a cluster node: Redis connections driving ``NodeCore``.

``ClusterService`` keeps two connections to Redis: one for commands (XADD,
XREAD, HSET...) and one subscribed to the fleet's channel.  It reads the
log after its position when it connects (catching up), then whenever the
channel's doorbell rings; it applies each foreign message through its
:class:`IClusterTarget` (the node's store, its reload), saves its position
beside the store and acknowledges on the channel.  An invalidation made
here is published with XADD and a doorbell; the answer waits (at most
``confirm_timeout``) for the acknowledgements of the nodes seen alive.
Losing Redis is logged once; the node retries with backoff, queues what it
publishes meanwhile, and catches up (reads what it missed, then publishes
its queue) when Redis returns.

Each time the node goes live (at start and after every reconnect: its
subscriber is subscribed and it caught up) it runs its ``on_live`` hooks,
which load state kept in Redis that the channel's messages alone cannot
give a node that was not listening when they were sent (prexy.acme.fleet's
pending challenge answers); ``ready`` fires once they are done, or after
:data:`ON_LIVE_WAIT` seconds, so the workers spawned on ``ready`` start
with that state.

A worker process has no Redis connection: ``prexy.cluster.relay`` carries
its PURGEs to the master and the master's verdict back.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.internet.task import LoopingCall
from twisted.internet.threads import deferToThreadPool
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import Interface, implementer

from prexy.cache.bans import Ban, BanError
from prexy.cluster.core import (
    Backoff,
    Confirmations,
    NodeCore,
    Outcome,
    Phase,
    node_value,
    parse_nodes,
    parse_position,
)
from prexy.cluster.messages import (
    BanScope,
    Invalidation,
    Kind,
    Message,
    MessageError,
    StreamId,
    doorbell,
    format_id,
    parse_event,
    parse_id,
)
from prexy.cluster.redis import RedisConnection, RedisError, connect
from prexy.cluster.settings import ClusterConfig

log = Logger()

#: Entries read from the log at a time.
BATCH = 500
#: Seconds between heartbeats (position and liveness in ``KEY:nodes``, PING).
HEARTBEAT = 2.0
#: A node not seen for this long is not waited for.
LIVE_FOR = 3 * HEARTBEAT + 1.0
#: Seconds a command may take before the connection is presumed dead.
COMMAND_TIMEOUT = 5.0
#: Seconds ``ready`` waits for the ``on_live`` hooks at most.
ON_LIVE_WAIT = 5.0

QUEUED_NOTE = b"cluster: Redis unreachable: applied here, published when it returns\n"


class IClusterTarget(Interface):
    """What a node does with the invalidations of other nodes."""

    def apply(invalidation: Invalidation) -> defer.Deferred[Any]:
        """Apply one purge, ban or reload locally."""

    def flush() -> defer.Deferred[Any]:
        """Empty the store: entries this node never read were trimmed."""


@implementer(IClusterTarget)
class StoreTarget:
    """Applies invalidations to the node's store (once per node: every
    worker reads the one LMDB store) in the reactor's thread pool, and a
    reload by calling ``reload``."""

    def __init__(self, reactor: Any, store: Callable[[], Any], reload: Callable[[], Any]) -> None:
        self.reactor = reactor
        self.store = store
        self.reload = reload

    def _in_thread(self, f: Callable[..., Any], *args: Any) -> defer.Deferred[Any]:
        return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), f, *args)

    def apply(self, invalidation: Invalidation) -> defer.Deferred[Any]:
        if invalidation.kind is Kind.RELOAD:
            return defer.maybeDeferred(self.reload)
        store = self.store()
        if store is None:
            return defer.succeed(0)
        if invalidation.kind is Kind.PURGE:
            return self._in_thread(store.purge_url, invalidation.site, invalidation.subject)
        try:
            ban = store_ban(invalidation)
        except BanError as exc:
            log.warn("cluster: skipped {what}: {why}", what=invalidation.describe(), why=exc)
            return defer.succeed(0)
        return self._in_thread(store.ban, ban)

    def flush(self) -> defer.Deferred[Any]:
        store = self.store()
        return self._in_thread(store.clear) if store is not None else defer.succeed(None)


def store_ban(invalidation: Invalidation) -> Ban:
    """The store's :class:`Ban` for a ban entry: its regex on the path and
    query and its host selectors, as ``POST /ban`` made it, or, for an older node's
    entry, its regex on the stored URL as a whole.  BanError when it cannot
    be one."""
    regex = invalidation.regex or None
    if invalidation.scope is BanScope.KEY_URL:
        return Ban(invalidation.site, key_url=regex)
    return Ban(invalidation.site, target=regex, host=invalidation.host, host_regex=invalidation.host_regex)


class PositionFile:
    """The last log entry applied to a store, in a file beside it (a store
    and the position it has seen go together: a new store starts with none)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def load(self) -> StreamId | None:
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                return parse_position(f.read(64))
        except OSError:
            return None

    def save(self, position: StreamId) -> None:
        if self.path is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(format_id(position) + b"\n")
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warn("cluster: cannot save the position in {path}: {error}", path=self.path, error=exc)


class ClusterService(service.Service):
    """One node's membership in the fleet (see the module docstring).

    ``ready`` fires once the node may serve from its store: it caught up
    and its ``on_live`` hooks are done (or :data:`ON_LIVE_WAIT` passed),
    or ``start_wait`` passed without Redis.  ``publish(invalidation)``
    shares an invalidation already applied here; its Deferred fires with
    the line to add to the answer.
    """

    def __init__(
        self,
        reactor: Any,
        settings: ClusterConfig,
        target: IClusterTarget,
        metrics: Any,
        position: PositionFile,
        connect_to: Callable[..., defer.Deferred[RedisConnection]] | None = None,
    ) -> None:
        self.reactor = reactor
        self.settings = settings
        self.target = target
        self.metrics = metrics
        self.position = position
        self.connect_to = connect_to or (lambda on_message=None: connect(reactor, settings.redis, on_message))
        self.core = NodeCore(settings.node, position.load())
        self.confirmations = Confirmations(settings.node)
        self.backoff = Backoff()
        self.ready: defer.Deferred[None] = defer.Deferred()
        self.writer: RedisConnection | None = None
        self.subscriber: RedisConnection | None = None
        self._reading = False
        self._again = False
        #: Counts connections: a read begun on an older one ends quietly.
        self._link = 0
        self._retry: Any = None
        self._start_timer: Any = None
        self._waiters: dict[int, tuple[defer.Deferred[Outcome | None], Any]] = {}
        self._heartbeat = LoopingCall(self._beat)
        self._heartbeat.clock = reactor
        #: Others' messages on the fleet's channel (prexy.acme.fleet's
        #: challenge answers): each returns True for a message it handled.
        self.listeners: list[Callable[[bytes], bool]] = []
        #: Run each time the node goes live, once its subscriber is
        #: subscribed and before ``ready`` fires (prexy.acme.fleet's load of
        #: the pending challenge answers): each returns a Deferred; one that
        #: fails is logged, one that takes longer than ON_LIVE_WAIT is not
        #: waited for.
        self.on_live: list[Callable[[], defer.Deferred[Any]]] = []

    # -- lifecycle ------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self._start_timer = self.reactor.callLater(self.settings.start_wait, self._start_waited)
        self._attempt()

    def stopService(self) -> Any:
        super().stopService()
        self.core.move("stop")
        for timer in (self._retry, self._start_timer):
            if timer is not None and timer.active():
                timer.cancel()
        if self._heartbeat.running:
            self._heartbeat.stop()
        self._end_waits()
        connections = [c for c in (self.writer, self.subscriber) if c is not None and not c.closed.called]
        closing = defer.DeferredList([c.closed for c in connections])
        # A node that stops cleanly leaves the table of live nodes, so no
        # PURGE waits for it meanwhile.
        left: defer.Deferred[Any] = (
            self._timed(self.writer.command("HDEL", self.settings.nodes_key, self.settings.node), 1.0)
            if self.writer is not None else defer.succeed(None)
        )

        def close(_: Any) -> Any:
            for c in connections:
                c.abort()
            return closing

        return left.addBoth(close)

    def _start_waited(self) -> None:
        if not self.ready.called:
            log.warn(
                "cluster: not caught up with {redis} after {s:g} s; serving from the store anyway",
                redis=str(self.settings.redis), s=self.settings.start_wait,
            )
            self.ready.callback(None)

    def _fire_ready(self) -> None:
        if self._start_timer is not None and self._start_timer.active():
            self._start_timer.cancel()
        if not self.ready.called:
            self.ready.callback(None)

    # -- connecting -----------------------------------------------------------

    def _attempt(self) -> None:
        self._retry = None
        if self.core.phase is Phase.STOPPED:
            return
        self.core.move("connect")
        self._link += 1
        writer_d = self.connect_to()
        sub_d = self.connect_to(on_message=self._event)
        d = defer.gatherResults([writer_d, sub_d], consumeErrors=True)

        def opened(connections: list[RedisConnection]) -> Any:
            self.writer, self.subscriber = connections
            for c in connections:
                c.closed.addCallback(self._closed_cb, c)
            if self.core.phase is Phase.STOPPED:
                for c in connections:
                    c.abort()
                return None
            subscribed = self._timed(self.subscriber.command("SUBSCRIBE", self.settings.channel))
            info = self._timed(self.writer.command("XINFO", "STREAM", self.settings.stream))
            info.addErrback(lambda f: f.trap(RedisError) and None)  # no such key: nothing was ever sent
            return defer.gatherResults([subscribed, info], consumeErrors=True)

        def connected(results: list[Any] | None) -> Any:
            if results is None or self.core.phase is not Phase.CONNECTING:
                return None
            self.core.move("connected")
            max_deleted = _max_deleted(results[1])
            if self.core.gap(max_deleted):
                log.warn(
                    "cluster: invalidations this node never read were trimmed from the log; emptying the store"
                )
                self.metrics.count("prexy_cluster_flushes_total")
                flushed = self.target.flush()
                flushed.addCallback(lambda _: self._catch_up_from(max_deleted))
                return flushed
            self._read()
            return None

        d.addCallback(_unwrap_list).addCallback(opened).addCallback(connected)
        d.addErrback(self._down)

    def _catch_up_from(self, position: StreamId | None) -> None:
        """After a flush, nothing before ``position`` matters any more."""
        if position is not None:
            self.core.applied(position)
            self.position.save(position)
        self._read()

    def _closed_cb(self, _: None, connection: RedisConnection) -> None:
        self._closed(connection)

    def _closed(self, connection: RedisConnection) -> None:
        if connection in (self.writer, self.subscriber):
            self._down(Failure(ConnectionError("connection to Redis closed")))

    def _down(self, why: Failure) -> None:
        if self.core.phase in (Phase.STOPPED, Phase.DOWN):
            return
        writer, subscriber = self.writer, self.subscriber
        self.writer = self.subscriber = None
        for c in (writer, subscriber):
            if c is not None:
                c.abort()
        if self._heartbeat.running:
            self._heartbeat.stop()
        self._reading = False
        self._end_waits()
        if self.core.lost(self.reactor.seconds()):
            self.metrics.count("prexy_cluster_outages_total")
            log.warn(
                "cluster: Redis {redis} unreachable ({why}); serving and invalidating locally, "
                "retrying with backoff (logged once per outage)",
                redis=str(self.settings.redis), why=_reason(why),
            )
        self._retry = self.reactor.callLater(self.backoff.next(), self._attempt)

    def _timed(self, d: defer.Deferred[Any], seconds: float = COMMAND_TIMEOUT) -> defer.Deferred[Any]:
        return d.addTimeout(seconds, self.reactor)

    # -- reading the log ------------------------------------------------------

    def _read(self) -> None:
        writer = self.writer
        if writer is None or self.core.phase not in (Phase.CATCHING_UP, Phase.LIVE):
            return
        if self._reading:
            self._again = True
            return
        self._reading, self._again = True, False
        d = self._timed(writer.command("XREAD", "COUNT", BATCH, "STREAMS", self.settings.stream, self.core.read_from()))
        d.addCallback(self._entries)
        d.addCallback(self._read_done, self._link)
        d.addErrback(self._down)

    def _entries(self, reply: Any) -> defer.Deferred[int]:
        entries = reply[0][1] if reply else []
        received = self.core.received(entries)
        for reason, n in received.skipped.items():
            self.metrics.count("prexy_cluster_skipped_total", n, reason=reason)
        d: defer.Deferred[Any] = defer.succeed(None)
        for message in received.apply:
            d.addCallback(self._apply_cb, message)

        def applied(_: Any) -> int:
            moved = received.position is not None and received.position != self.core.position
            self.core.applied(received.position)
            if moved and self.core.position is not None:
                self.position.save(self.core.position)
                if self.core.phase is Phase.LIVE:
                    self._ack()
            return len(entries)

        return d.addCallback(applied)

    def _apply_cb(self, _: Any, message: Message) -> defer.Deferred[Any]:
        return self._apply(message)

    def _apply(self, message: Message) -> defer.Deferred[Any]:
        inv = message.invalidation
        log.info("cluster: {what} from {node}", what=inv.describe(), node=message.node)
        d = self.target.apply(inv)
        d.addCallback(lambda _: self.metrics.count("prexy_cluster_applied_total", kind=inv.kind.value))
        d.addErrback(lambda f: log.failure("cluster: applying {what} failed", f, what=inv.describe()))
        return d

    def _read_done(self, count: int, link: int) -> None:
        if link != self._link:
            return  # that connection is gone; the current one reads on its own
        self._reading = False
        if self.core.phase is Phase.STOPPED or self.writer is None:
            return
        if count >= BATCH or self._again:
            self._read()
        elif self.core.phase is Phase.CATCHING_UP:
            self._live()

    def _live(self) -> None:
        outage = self.core.caught_up(self.reactor.seconds())
        self.backoff.reset()
        queued = self.core.drain()
        if outage is not None:
            log.info(
                "cluster: Redis {redis} back after {s:.1f} s; caught up, publishing {n} queued invalidation(s)",
                redis=str(self.settings.redis), s=outage, n=len(queued),
            )
        else:
            log.info("cluster: node {node} live on {redis}", node=self.settings.node, redis=str(self.settings.redis))
        if self._start_timer is not None and self._start_timer.active():
            self._start_timer.cancel()  # from here on ON_LIVE_WAIT bounds the wait
        self._run_on_live().addCallback(lambda _: self._fire_ready())
        self._ack()  # the position it caught up to, for those waiting on it
        self._heartbeat.start(HEARTBEAT, now=False)
        for inv in queued:
            self._add(inv)

    def _run_on_live(self) -> defer.Deferred[None]:
        """Runs the ``on_live`` hooks; fires once each succeeded, failed
        (logged) or ran past :data:`ON_LIVE_WAIT`."""

        def hook_failed(f: Failure, hook: Callable[[], Any]) -> None:
            why = (f"not done within {ON_LIVE_WAIT:g} s" if f.check(defer.TimeoutError, defer.CancelledError)
                   else _reason(f))
            log.warn("cluster: going live: {hook} {why}; going on without it",
                     hook=getattr(hook, "__qualname__", repr(hook)), why=why)

        runs = []
        for hook in list(self.on_live):
            d = defer.maybeDeferred(hook).addTimeout(ON_LIVE_WAIT, self.reactor)
            runs.append(d.addErrback(hook_failed, hook))
        return defer.gatherResults(runs).addCallback(lambda _: None)

    def _event(self, channel: bytes, payload: bytes) -> None:
        for listener in self.listeners:
            if listener(payload):
                return
        try:
            kind, node, position = parse_event(payload)
        except MessageError:
            return
        if kind == "entry":
            self._read()
            return
        for ticket, outcome in self.confirmations.ack(node, position):
            self._settle(ticket, outcome)

    def _ack(self) -> None:
        writer = self.writer
        if writer is None:
            return
        value = node_value(self.core.position, self.reactor.seconds())
        d = self._timed(writer.command("HSET", self.settings.nodes_key, self.settings.node, value))
        d.addCallback(
            lambda _: writer.command(
                "PUBLISH", self.settings.channel, _ack_payload(self.settings.node, self.core.position)
            )
        )
        d.addErrback(self._down)

    def _beat(self) -> None:
        writer, subscriber = self.writer, self.subscriber
        if writer is None or subscriber is None:
            return
        value = node_value(self.core.position, self.reactor.seconds())
        beats = [
            self._timed(writer.command("HSET", self.settings.nodes_key, self.settings.node, value)),
            self._timed(subscriber.command("PING")),
        ]
        defer.gatherResults(beats, consumeErrors=True).addErrback(lambda f: self._down(_first(f)))

    # -- publishing -----------------------------------------------------------

    def publish(self, invalidation: Invalidation) -> defer.Deferred[bytes]:
        """Share an invalidation made (and applied) here; fires with the note
        for the answer once the live nodes confirmed it (or did not in
        time, or it was queued)."""
        if not self.core.local(invalidation):
            self.metrics.count("prexy_cluster_queued_total")
            if invalidation.kind is Kind.RELOAD:
                return defer.succeed(b"cluster: Redis unreachable: reloaded here only\n")
            return defer.succeed(QUEUED_NOTE)
        d: defer.Deferred[Any] = self._add(invalidation)
        d.addCallback(lambda outcome: outcome.note() if outcome is not None else QUEUED_NOTE)
        return d

    def _add(self, invalidation: Invalidation) -> defer.Deferred[Outcome | None]:
        writer = self.writer
        assert writer is not None
        now = self.reactor.seconds()
        message = Message(invalidation, self.settings.node, now)
        added = self._timed(
            writer.command("XADD", self.settings.stream, "MAXLEN", "~", self.settings.max_entries, "*",
                           *message.fields())
        )
        oldest = max(0, int((now - self.settings.keep) * 1000))
        writer.command("XTRIM", self.settings.stream, "MINID", "~", oldest).addErrback(lambda f: None)
        result: defer.Deferred[Outcome | None] = defer.Deferred()

        def added_as(raw_id: bytes) -> Any:
            entry = parse_id(raw_id)
            self.metrics.count("prexy_cluster_published_total", kind=invalidation.kind.value)
            writer.command("PUBLISH", self.settings.channel, doorbell(entry)).addErrback(lambda f: None)
            nodes = self._timed(writer.command("HGETALL", self.settings.nodes_key))
            nodes.addCallback(lambda flat: self._expect(entry, parse_nodes(flat or []), result))
            return nodes

        def failed(f: Failure) -> None:
            self.core.unsent([invalidation])
            if not result.called:
                result.callback(None)
            self._down(f)

        added.addCallback(added_as).addErrback(failed)
        return result

    def _expect(self, entry: StreamId, nodes: Any, result: defer.Deferred[Outcome | None]) -> None:
        ticket, outcome = self.confirmations.expect(entry, nodes, self.reactor.seconds(), LIVE_FOR)
        if outcome is not None:
            result.callback(outcome)
            return
        timer = self.reactor.callLater(self.settings.confirm_timeout, self._give_up, ticket)
        self._waiters[ticket] = (result, timer)

    def _give_up(self, ticket: int) -> None:
        outcome = self.confirmations.give_up(ticket)
        if outcome is not None:
            log.warn("cluster: not confirmed within {s:g} s by {nodes}", s=self.settings.confirm_timeout,
                     nodes=", ".join(outcome.missing))
            self._settle(ticket, outcome)

    def _settle(self, ticket: int, outcome: Outcome) -> None:
        waiter = self._waiters.pop(ticket, None)
        if waiter is None:
            return
        d, timer = waiter
        if timer.active():
            timer.cancel()
        d.callback(outcome)

    def _end_waits(self) -> None:
        for ticket, outcome in self.confirmations.forget_all():
            self._settle(ticket, outcome)

    # -- status ---------------------------------------------------------------

    def gauges(self) -> dict[str, float]:
        return {
            "prexy_cluster_up": 1.0 if self.core.phase is Phase.LIVE else 0.0,
            "prexy_cluster_queued": float(len(self.core.queue)),
            "prexy_cluster_dropped": float(self.core.dropped),
        }

    def health(self) -> str:
        """One line for ``/health``."""
        core = self.core
        where = f"node {self.settings.node} on {self.settings.redis}"
        if core.phase is Phase.LIVE:
            pos = format_id(core.position).decode() if core.position is not None else "start"
            return f"cluster: live, {where}, position {pos}"
        since = core.down_since
        for_ = f" for {self.reactor.seconds() - since:.0f} s" if since is not None else ""
        return (
            f"cluster: {core.phase.value}{for_}, {where}; serving, invalidations applied here, "
            f"{len(core.queue)} queued to publish"
        )


def _ack_payload(node: str, position: StreamId | None) -> bytes:
    from prexy.cluster.messages import ack

    return ack(node, position if position is not None else (0, 0))


def _max_deleted(info: Any) -> StreamId | None:
    """``max-deleted-entry-id`` from an XINFO STREAM reply (Redis 7), if any."""
    if not isinstance(info, list):
        return None
    for i in range(0, len(info) - 1, 2):
        if info[i] == b"max-deleted-entry-id":
            try:
                return parse_id(info[i + 1])
            except MessageError:
                return None
    return None


def _unwrap_list(results: list[Any]) -> list[Any]:
    return results


def _first(f: Failure) -> Failure:
    return f.value.subFailure if isinstance(f.value, defer.FirstError) else f


def _reason(f: Failure) -> str:
    f = _first(f)
    return f.getErrorMessage() or getattr(f.type, "__name__", "error")


def store_path(config: Any) -> str | None:
    """The node's cache store directory (None without a cache): the
    position file and the workers' event sockets live beside it."""
    if not config.cache_size:
        return None
    from prexy.cache.paths import default_cache_path

    path: str = config.cache_path or default_cache_path()
    return path


def node_service(reactor: Any, config: Any, metrics: Any, store: Callable[[], Any], reload: Callable[[], Any]) -> ClusterService:
    """The cluster service of a node's master (or of its single process)."""
    path = store_path(config)
    return ClusterService(
        reactor, config.cluster, StoreTarget(reactor, store, reload), metrics,
        PositionFile(path + ".cluster" if path is not None else None),
    )
