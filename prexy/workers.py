"""Master and worker processes sharing the listening sockets.

``twistd prexy --workers N`` runs a master that binds every listen endpoint
(or takes systemd's sockets), starts N worker processes that adopt them, and
never touches a request itself: an idle worker takes the next connection from
the shared accept queue.

The master supervises: a worker that dies is restarted (with backoff when it
keeps dying); SIGTERM is forwarded and the master waits for the workers to
drain; SIGHUP (or the admin endpoint's ``POST /reload``) validates the whole
configuration first and, only if it loads, either has every worker reload
in place (when only sites changed: ``runtime.reloads_in_place``; a worker
loads again only the rules and maps whose files changed) or starts a new
generation of workers and retires the old one once the new one is ready;
either way no request is refused or cut.  Workers report readiness and metrics over a pipe; the
master's admin endpoint serves health, the summed metrics and reload.

A worker runs ``python -m prexy.worker SPEC`` (:mod:`prexy.worker`): SPEC
(JSON) carries the prexy command line, the inherited socket descriptors and
the control pipe.  It serves the configuration the master validated, never
one it reads from the disk, and parses no configuration file: the master
parses and validates the files once and hands every worker it starts
(``configuration``), and every worker that reloads in place (``reload``),
the validated ``Config`` itself with the bytes of the rules, maps and
certificates it was validated with (:mod:`prexy.handoff`; a reload's
handoff carries only the sites that changed, the others are references
to the worker's own).  The master keeps the configuration in force, so a
worker that replaces a dead one serves it, even when the files changed
since without a reload, or no longer load.

A worker's start is a handshake on its ordered command pipe: it says
``loaded`` once its runtime is built, and serves when the master answers
``serve``.  A reload in place is sent to the workers told to serve, and
answered once they have taken it; a worker still starting is neither sent
it nor waited for: when it says ``loaded``, the master hands it the
configuration in force (if it is not the one it started with) before
``serve``, so it never serves an older one, and no start is thrown away.

This module is the master's side only: it knows the command line as an
argument list and a function that turns one into a ``Validated``
configuration (``twistd prexy``'s options, passed in by ``prexy.service``),
so it does not import the service it supervises.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from twisted.application import service
from twisted.internet import defer, protocol
from twisted.logger import Logger

from prexy import handoff, signals
from prexy.config import Config
from prexy.control import JsonLines, encode
from prexy.files import Snapshot
from prexy.handoff import Handoff
from prexy.listen import ListenSpec, bind
from prexy.metrics import Metrics, cache_gauges, memo_held, render
from prexy.observe.stats import Aggregate
from prexy.observe.tap import LogFilter
from prexy.observing import OperatorView
from prexy.runtime import RuleSets, reloads_in_place

log = Logger()

CONTROL_FD = 3
FIRST_SOCKET_FD = 4
#: Restart backoff: a worker that lived less than this is "crashing".
HEALTHY_AFTER = 10.0
MAX_BACKOFF = 30.0
#: Seconds the master's ``serving`` waits for its first workers at most.
SERVING_WAIT = 60.0


@attrs.frozen
class Validated:
    """A configuration that loaded, with the files it loaded from."""

    config: Config
    #: Exactly the bytes (and file answers) its runtime was validated
    #: from: rules, maps, certificates (the main file and the site files
    #: are in ``config``, parsed).
    snapshot: Snapshot = attrs.field(eq=False)
    #: The ssl: listeners' key and certificate (PEM bytes by path).
    tls: dict[str, bytes] = attrs.field(factory=dict, eq=False)
    #: The rule sets its runtime loaded (``runtime.RuleSets``), which a new
    #: worker is handed parsed (``RuleSets.portable``).
    rulesets: RuleSets | None = attrs.field(default=None, eq=False)


def _global_reactor() -> Any:
    from twisted.internet import reactor

    return reactor


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def sd_notify(message: str) -> None:
    """Tell systemd (Type=notify) about our state; a no-op without NOTIFY_SOCKET."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(address)
            s.sendall(message.encode("utf-8"))
    except OSError as exc:
        log.warn("sd_notify failed: {error}", error=exc)


class _WorkerProcess(protocol.ProcessProtocol):
    """The master's view of one worker."""

    def __init__(self, master: MasterService, generation: int, slot: int) -> None:
        self.master = master
        self.generation = generation
        self.slot = slot
        #: The configuration last handed to it (what the next handoff is
        #: encoded against: ``prexy.handoff``).
        self.sent: Config | None = None
        #: Told to serve (it said ``loaded``); then ``ready`` once it serves.
        self.serve_sent = False
        self.ready = False
        self.retiring = False
        self.started_at = master.reactor.seconds()
        self.metrics: dict[str, Any] | None = None
        self.ended: defer.Deferred[None] = defer.Deferred()
        self._lines = JsonLines()
        self.pid: int | None = None

    def connectionMade(self) -> None:
        self.pid = self.transport.pid if self.transport is not None else None

    def childDataReceived(self, fd: int, data: bytes) -> None:
        if fd != CONTROL_FD:
            return
        for message in self._lines.feed(data):
            if message.get("loaded"):
                self.master.worker_loaded(self)
            if message.get("ready"):
                self.ready = True
                self.master.worker_ready(self)
            if "metrics" in message:
                self.metrics = message["metrics"]
            if "observed" in message:  # per-site and per-rule counters (prexy.observe)
                self.master.view.aggregate.update(self.pid, message["observed"])
            if "log_filters_set" in message:
                self.master._filters_settled(self, message["log_filters_set"])
            if "log" in message:  # the live log's records
                self.master.view.hub.deliver(message["log"], int(message.get("dropped", 0)))
            if "answer" in message:  # to the master's question (``MasterService.ask``)
                self.master.answered(message)
            if "reloaded" in message:
                self.master.worker_reloaded(self, message)
            if isinstance(message.get("obtain"), str):  # a handshake waits for a certificate (prexy.ondemand)
                self.master.obtain(self, message["obtain"])
            if "cluster" in message and self.master.cluster is not None:  # a PURGE to share (prexy.cluster)
                from prexy.cluster.relay import relay_worker_message

                relay_worker_message(self.master.cluster, self.master.config, self.pid, message)

    def processEnded(self, reason: Any) -> None:
        self.master.worker_ended(self, reason)
        self.ended.callback(None)

    def command(self, message: dict[str, Any], payload: bytes | None = None) -> None:
        """Send the worker a command (a line on its stdin, then the
        payload if any: ``prexy.worker``)."""
        if self.transport is not None:
            self.transport.write(encode(message, payload))

    def hand(self, message: dict[str, Any], config: Config, files: Snapshot,
             encoded: dict[int, tuple[Config | None, bytes]] | None = None,
             rulesets: RuleSets | None = None) -> None:
        """Send the worker a command with ``config`` and ``files`` as its
        handoff, encoded against the configuration it was handed last
        (``encoded``: handoffs of the same configuration already encoded,
        by the identity of their base); one that has none yet gets the
        rule sets of ``rulesets`` too."""
        encoded = {} if encoded is None else encoded
        base = self.sent
        known = encoded.get(id(base))
        if known is None or known[0] is not base:
            parsed = rulesets.portable() if base is None and rulesets is not None else {}
            known = encoded[id(base)] = (base, handoff.encode(Handoff(config, files, parsed), base))
        self.command(message, known[1])
        self.sent = config

    def signal(self, name: str | int) -> None:
        """Send the worker a signal ("TERM", "KILL"... or a number); nothing
        when it is gone already."""
        try:
            if self.transport is not None and self.transport.pid is not None:
                self.transport.signalProcess(name)
        except Exception:  # already gone
            pass


class _InPlaceReload:
    """One reload the workers do in place: who has still to answer, and
    what the refusals said.  ``done`` fires True when every worker reloaded,
    False when one refused (it keeps its configuration)."""

    def __init__(self, number: int, workers: Sequence[_WorkerProcess]) -> None:
        self.number = number
        self.waiting = set(workers)
        self.errors: list[str] = []
        self.done: defer.Deferred[bool] = defer.Deferred()

    def answered(self, worker: _WorkerProcess, ok: bool, error: str) -> None:
        if not ok:
            self.errors.append(f"worker {worker.pid}: {error}")
        self.gone(worker)

    def gone(self, worker: _WorkerProcess) -> None:
        """A worker answered or ended (its replacement starts with the new snapshot)."""
        self.waiting.discard(worker)
        if not self.waiting and not self.done.called:
            self.done.callback(not self.errors)


class MasterService(service.MultiService):
    """Binds the sockets, runs and supervises the workers, reloads.

    ``load(argv)`` turns the command line into a ``Validated``
    configuration (raising ``UsageError`` or ``SystemExit`` when it does
    not load): a reload calls it to validate everything before it starts a
    new generation.  ``validated`` is the configuration to start with, and
    the files it was validated from: what every worker loads.
    """

    def __init__(
        self,
        reactor: Any,
        validated: Validated,
        argv: Sequence[str],
        workers: int,
        load: Callable[[Sequence[str]], Validated],
    ) -> None:
        super().__init__()
        self.reactor = reactor
        config = self.config = validated.config
        #: The files the configuration in force was validated from.
        self.snapshot = validated.snapshot
        self.tls = validated.tls
        self.rulesets = validated.rulesets
        self.argv = list(argv)
        self.load = load
        self.count = workers
        self.generation = 0
        self.workers: list[_WorkerProcess] = []
        self.sockets: list[tuple[ListenSpec, socket.socket]] = []
        self.metrics = Metrics()
        self.retired_metrics = Metrics()
        #: The workers' per-site and per-rule counters summed, and the live
        #: log's readers (prexy.observe).
        self.view = OperatorView(self._log_filters, config.observe.never_matched_window, reactor.seconds())
        #: The live log's filters sent last (their number), the workers that
        #: have not said they record with them yet, and who waits for that.
        self._filters_sent = 0
        self._filters_pending: set[_WorkerProcess] = set()
        self._filters_waiting: list[defer.Deferred[None]] = []
        #: Questions to workers waiting for their answer, by number (``ask``).
        self._asked: dict[int, defer.Deferred[dict[str, Any]]] = {}
        self._ask_number = 0
        self.stopping = False
        self._backoff: dict[int, float] = {}
        self._reloading: defer.Deferred[bool] | None = None
        #: In-place reloads made while a new generation starts: in force
        #: once the newest generation serves (its workers take the newest
        #: configuration).
        self._generation_waiters: list[defer.Deferred[bool]] = []
        #: The configuration in force as handoffs, by their base (``_WorkerProcess.hand``).
        self._handoffs: dict[int, tuple[Config | None, bytes]] = {}
        self._in_place: dict[int, _InPlaceReload] = {}
        self._reload_number = 0
        self.last_reload_error = ""
        self._store: Any = None
        #: Fires once the first generation of workers is ready (or after
        #: SERVING_WAIT seconds): from then on a request to this node is
        #: answered, not held in the listening sockets' backlog.
        self.serving: defer.Deferred[None] = defer.Deferred()
        self._serving_timer: Any = None
        #: This node's link to the fleet (prexy.cluster), when [cluster] is set.
        self.cluster: Any = None
        self.announce: Any = None
        if config.cluster is not None:
            from prexy.cluster.node import node_service

            self.cluster = node_service(reactor, config, self.metrics, self.cache_store, self.reload)
            self.cluster.setServiceParent(self)
            self.announce = self.cluster.publish
        #: The one issuer of the machine's automatic certificates
        #: (prexy.acme.service.AcmeService): the workers read what it stores.
        self.acme: Any = None
        if config.acme is not None:
            from prexy.acme.service import acme_service, stored_line

            self.acme = acme_service(reactor, config.acme, config.acme_sites())
            self.acme.manager.watch(self.certificate_stored)
            self.acme.manager.watch(lambda name, stored: stored_line(name, stored, sd_notify))
            if self.cluster is not None:  # one order per name across the fleet
                # Its orders wait, and it confirms the others' challenge
                # answers, until its workers answer the CA's requests.
                self.acme.share_through(self.cluster, serving=self.serving)
        if config.admin:
            from prexy.admin import admin_service

            admin_service(reactor, config.admin, self).setServiceParent(self)

    # -- lifecycle -----------------------------------------------------------

    def privilegedStartService(self) -> None:
        for desc in self.config.listen_endpoints():
            self.sockets.append(bind(desc))
        super().privilegedStartService()

    def startService(self) -> None:
        if not self.sockets:
            self.privilegedStartService()
        super().startService()
        self.generation = 1
        self._serving_timer = self.reactor.callLater(SERVING_WAIT, self._fire_serving)

        def spawn(_: Any = None) -> None:
            if not self.stopping:
                for slot in range(self.count):
                    self._spawn(self.generation, slot)

        if self.cluster is not None:  # serve from the store once the node caught up
            self.cluster.ready.addCallback(spawn)
        else:
            spawn()
        if self.acme is not None:
            # Once the workers are on their way: the CA's validation
            # requests are answered by them (the sockets queue them).
            self.acme.setServiceParent(self)
        log.info(
            "prexy master {pid}: {n} worker(s) on {listen}",
            pid=os.getpid(),
            n=self.count,
            listen=", ".join(self.config.listen),
        )
        if hasattr(signal, "SIGHUP") and self.reactor is _global_reactor():
            self._install_signals()  # now: a signal while starting must not end us

    def _install_signals(self) -> None:
        # SIGUSR1 (logrotate's "reopen your logs") goes on to the workers,
        # which write the access log.
        signals.install(self.reactor, self.reopen_logs, self.reload)

    def reopen_logs(self) -> None:
        """Have every live worker reopen its access log (SIGUSR1)."""
        live = [w for w in self.workers if not w.ended.called]
        log.info("SIGUSR1: {n} worker(s) reopen their logs", n=len(live))
        for w in live:
            w.signal(signal.SIGUSR1)

    def stopService(self) -> Any:
        """Forward SIGTERM, wait for the workers to drain, then close."""
        self.stopping = True
        if self._serving_timer is not None and self._serving_timer.active():
            self._serving_timer.cancel()
        # Stop listening at once: the master's copy of each listening
        # socket would keep it open (the kernel accepting into the backlog)
        # until the last worker exits, so new connections would hang and be
        # reset instead of being refused and retried on another node.  The
        # workers close their copies as they start draining.
        for _spec, sock in self.sockets:
            sock.close()
        sd_notify("STOPPING=1")
        live = [w for w in self.workers]
        for w in live:
            w.signal("TERM")
        deadline = self.config.shutdown_timeout + 5

        def kill_stragglers() -> None:
            for w in live:
                if not w.ended.called:
                    log.warn("worker {pid} did not drain in time; killing it", pid=w.pid)
                    w.signal("KILL")

        timer = self.reactor.callLater(deadline, kill_stragglers)
        d = defer.gatherResults([w.ended for w in live])

        def done(_: Any) -> Any:
            if timer.active():
                timer.cancel()
            for _spec, sock in self.sockets:
                sock.close()
            return super(MasterService, self).stopService()

        d.addBoth(done)
        return d

    # -- workers -------------------------------------------------------------

    def _spawn(self, generation: int, slot: int) -> _WorkerProcess:
        worker = _WorkerProcess(self, generation, slot)
        child_fds: dict[int, Any] = {0: "w", 1: 1, 2: 2, CONTROL_FD: "r"}
        specs = []
        for i, (spec, sock) in enumerate(self.sockets):
            fd = FIRST_SOCKET_FD + i
            child_fds[fd] = sock.fileno()
            specs.append({"fd": fd, "family": spec.family, "description": spec.description,
                          "tls_key": spec.tls_key, "tls_cert": spec.tls_cert})
        spec_json = json.dumps(
            {
                "argv": self.argv,
                "control_fd": CONTROL_FD,
                "sockets": specs,
                "generation": generation,
                "slot": slot,
                "master_pid": os.getpid(),
            }
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("LISTEN_") and k != "NOTIFY_SOCKET"}
        self.reactor.spawnProcess(
            worker,
            sys.executable,
            [sys.executable, "-m", "prexy.worker", spec_json],
            env=env,
            childFDs=child_fds,
        )
        # Its configuration: the one in force, parsed (prexy.handoff).
        worker.hand({"configuration": generation}, self.config, self.snapshot, self._handoffs, self.rulesets)
        self.workers.append(worker)
        return worker

    def worker_loaded(self, worker: _WorkerProcess) -> None:
        """``worker`` built its runtime: it serves once told to.  A worker
        of the current generation handed another configuration than the one
        in force (a reload was validated while it started) is handed this
        one first; the pipe is ordered, so it takes it before it serves."""
        if worker.serve_sent or worker.ended.called:
            return
        if worker.generation == self.generation and not worker.retiring and worker.sent is not self.config:
            log.info("worker {pid} started with an earlier configuration: it takes the one in force before it serves",
                     pid=worker.pid)
            worker.hand({"reload": 0}, self.config, self.snapshot, self._handoffs, self.rulesets)
        worker.command({"serve": True})
        worker.serve_sent = True

    def worker_ready(self, worker: _WorkerProcess) -> None:
        log.info("worker {pid} (generation {g}) ready", pid=worker.pid, g=worker.generation)
        filters = self.view.hub.filters()
        if filters:  # the live log has readers: this worker records for them too
            worker.command({"log_filters": [f.as_dict() for f in filters]})
        current = [w for w in self.workers if w.generation == self.generation and not w.retiring]
        if worker.generation == self.generation and not worker.retiring and all(w.ready for w in current):
            # A complete new generation: retire every older one.
            for old in self.workers:
                if old.generation < self.generation and not old.retiring:
                    old.retiring = True
                    old.signal("TERM")
            if self._reloading is not None:
                d, self._reloading = self._reloading, None
                d.callback(True)
            self._generation_served(True)
            sd_notify("READY=1")
            self._fire_serving()

    def _generation_served(self, ok: bool) -> None:
        waiting, self._generation_waiters = self._generation_waiters, []
        for d in waiting:
            d.callback(ok)

    def _fire_serving(self) -> None:
        if self._serving_timer is not None and self._serving_timer.active():
            self._serving_timer.cancel()
        if not self.serving.called:
            self.serving.callback(None)

    def worker_ended(self, worker: _WorkerProcess, reason: Any) -> None:
        if worker in self.workers:
            self.workers.remove(worker)
        for pending in list(self._in_place.values()):
            pending.gone(worker)
        if worker.metrics:
            self.retired_metrics.merge(worker.metrics, levels=False)
        self.view.aggregate.retire(worker.pid)
        self._filters_settled(worker)
        if self.stopping or worker.retiring or worker.generation != self.generation:
            return
        lived = self.reactor.seconds() - worker.started_at
        backoff = self._backoff.get(worker.slot, 0.0)
        backoff = 0.0 if lived > HEALTHY_AFTER else min(MAX_BACKOFF, max(0.5, backoff * 2))
        self._backoff[worker.slot] = backoff
        self.metrics.count("prexy_worker_restarts_total")
        log.warn(
            "worker {pid} died ({why}); restarting in {delay:.1f}s",
            pid=worker.pid,
            why=reason.getErrorMessage(),
            delay=backoff,
        )
        generation = worker.generation
        self.reactor.callLater(backoff, self._respawn, generation, worker.slot)

    def certificate_stored(self, name: str, stored: Any) -> None:
        """Every live worker drops what it made of ``name``'s old
        certificate (or remembered of its absence)."""
        for w in self.workers:
            if not w.ended.called:
                w.command({"certificate": name})

    def obtain(self, worker: _WorkerProcess, name: str) -> None:
        """``worker`` has a handshake waiting for ``name``'s certificate:
        answered ``certificate`` once one is stored (every worker is told
        so too), else ``no_certificate``."""
        if self.acme is None:
            worker.command({"no_certificate": name})
            return

        def answer(issued: bool) -> None:
            if not worker.ended.called:
                worker.command({"certificate" if issued else "no_certificate": name})

        self.acme.on_demand(name).addCallback(answer).addErrback(
            lambda f: log.failure("on-demand certificate for {name}", f, name=name))

    def _respawn(self, generation: int, slot: int) -> None:
        if not self.stopping and generation == self.generation:
            self._spawn(generation, slot)

    # -- reload and admin ----------------------------------------------------

    def reload(self) -> Any:
        """Validate the configuration from the original command line; if it
        loads, have the workers reload in place when only sites changed
        (``runtime.reloads_in_place``), else start a new generation and
        retire the old one when it is ready.  Returns a Deferred firing True
        (switched) or False (refused, by the master or by a worker)."""
        sd_notify("RELOADING=1")
        try:
            validated = self.load(self.argv)
        except BaseException as exc:  # UsageError or SystemExit from a check
            self.last_reload_error = str(exc)
            log.error("reload refused, keeping the running configuration: {error}", error=str(exc))
            sd_notify("READY=1")
            return defer.succeed(False)
        config = validated.config
        if config.listen != self.config.listen:
            log.warn("reload: listen endpoints changed; they take effect on restart")
        if config.cluster != self.config.cluster:
            log.warn("reload: [cluster] changed; it takes effect on restart")
        if config.acme != self.config.acme:
            log.warn("reload: [acme] changed; it takes effect on restart")
        if self.acme is not None:
            self.acme.update(config.acme_sites())
        previous, self.config, self.snapshot = self.config, config, validated.snapshot
        self.rulesets = validated.rulesets
        self._handoffs = {}
        self.view.aggregate.window = config.observe.never_matched_window
        # Renewed certificates (the [server] one in the same files, or a
        # site's) are swapped in place by the workers, for the handshakes
        # that follow; certificates in other files are a changed [server]:
        # a new generation, which adopts the sockets with them.
        self.tls = validated.tls
        if reloads_in_place(previous, config):
            return self._reload_in_place()
        if self._reloading is not None:
            # A reload already in progress: supersede it.
            self._reloading.callback(True)
        self._reloading = defer.Deferred()
        self.generation += 1
        log.info("reload: starting worker generation {g}", g=self.generation)
        for slot in range(self.count):
            self._spawn(self.generation, slot)
        return self._reloading

    def _reload_in_place(self) -> Any:
        """Only sites changed: each worker of the current generation told to
        serve is handed the new configuration (the sites that changed, and
        the files' bytes: ``prexy.handoff``) and swaps it in, reusing the
        rule sets and maps whose files did not change; it keeps its
        connections, applicability memory and compiled rule sets.  A
        worker still starting is not waited for: it takes the
        configuration in force when it has loaded, before it serves
        (``worker_loaded``).  Fires True once every serving worker has
        reloaded (and, while a new generation starts, once it serves)."""
        self._reload_number += 1
        number = self._reload_number
        current = [w for w in self.workers if w.generation == self.generation and not w.retiring]
        workers = [w for w in current if w.serve_sent]
        for w in current:
            if not w.serve_sent:
                log.info("reload: worker {pid} is still starting; it takes this configuration before it serves",
                         pid=w.pid)
        pending = _InPlaceReload(number, workers)
        self._in_place[number] = pending
        log.info("reload: only sites changed; {n} worker(s) reload in place", n=len(workers))
        for w in workers:
            w.hand({"reload": number}, self.config, self.snapshot, self._handoffs, self.rulesets)

        def finished(ok: bool) -> bool:
            del self._in_place[number]
            if not ok:
                self.last_reload_error = "; ".join(pending.errors)
                log.error("reload refused by a worker, which keeps its configuration: {error}",
                          error=self.last_reload_error)
            sd_notify("READY=1")
            return ok

        if not workers:
            pending.done.callback(True)
        done: Any = pending.done
        if self._reloading is not None:  # the new generation, not serving yet, takes it as it starts
            served: defer.Deferred[bool] = defer.Deferred()
            self._generation_waiters.append(served)
            done = defer.gatherResults([pending.done, served]).addCallback(all)
        return done.addCallback(finished)

    def worker_reloaded(self, worker: _WorkerProcess, message: dict[str, Any]) -> None:
        pending = self._in_place.get(message.get("reloaded", -1))
        if pending is not None:
            pending.answered(worker, bool(message.get("ok")), str(message.get("error", "")))

    def cache_store(self) -> Any:
        """The shared store, for admin bans, the fleet's invalidations and
        the cache levels: opened by the master only while it uses it
        (:class:`~prexy.cache.occasional.OccasionalStore`), with the
        configuration in force."""
        if not self.config.cache_size:
            return None
        if self._store is None:
            from prexy.cache import Store
            from prexy.cache.occasional import OccasionalStore
            from prexy.cache.paths import default_cache_path

            def open_store() -> Any:
                config = self.config
                path = config.cache_path or default_cache_path()
                return Store.open(path, config.cache_size, clock=self.reactor.seconds)

            self._store = OccasionalStore(open_store)
        return self._store

    def observed(self) -> Aggregate:
        """The workers' counters, summed (as of their last reports)."""
        return self.view.aggregate

    def _log_filters(self, filters: list[LogFilter]) -> defer.Deferred[None]:
        """The live log's readers changed: every worker records for them
        (none: nothing is recorded).  Fires once every serving worker said
        it does (a reader's stream starts then: nothing it asked for is
        missed after its head)."""
        self._filters_sent += 1
        message = {"log_filters": [f.as_dict() for f in filters], "number": self._filters_sent}
        self._filters_pending = {w for w in self.workers if w.ready}
        for w in self._filters_pending:
            w.command(message)
        d: defer.Deferred[None] = defer.Deferred()
        self._filters_waiting.append(d)
        self._filters_settled(None)
        return d

    def _filters_settled(self, worker: _WorkerProcess | None, number: int | None = None) -> None:
        """``worker`` records with the filters ``number`` (or ended)."""
        if worker is not None and (number is None or number == self._filters_sent):
            self._filters_pending.discard(worker)
        if not self._filters_pending:
            waiting, self._filters_waiting = self._filters_waiting, []
            for d in waiting:
                d.callback(None)

    def ask(self, worker: _WorkerProcess, message: dict[str, Any], payload: bytes | None = None) -> Any:
        """Ask ``worker`` something it answers with ``{"answer": N, ...}``
        (``prexy.worker``): a Deferred of that answer; ``{"error": ...}``
        if the worker ends first."""
        self._ask_number += 1
        number = self._ask_number
        d: defer.Deferred[dict[str, Any]] = defer.Deferred()
        self._asked[number] = d
        worker.command({**message, "ask": number}, payload)

        def gone(_: object) -> None:
            if number in self._asked:
                self._asked.pop(number).callback({"error": "the worker ended before it answered"})

        worker.ended.addCallback(gone)
        return d

    def answered(self, message: dict[str, Any]) -> None:
        d = self._asked.pop(message.get("answer", -1), None)
        if d is not None:
            d.callback(message)

    @defer.inlineCallbacks
    def dry_run(self, site: str, draft: bytes, name: str, count: int) -> Any:
        """A dry run of ``draft`` on ``site`` (``ProxyService.dry_run``) on
        the pages its workers counted most requested, carried out by one of
        them: fires with (HTTP status, report)."""
        ready = [w for w in self.workers if w.ready and not w.retiring]
        if not ready:
            return 503, {"error": "no worker is serving"}
        answers = yield defer.gatherResults([self.ask(w, {"top_urls": site, "count": count}) for w in ready])
        counts: dict[str, int] = {}
        for answer in answers:
            for url, n in answer.get("urls", ()):
                counts[url] = counts.get(url, 0) + n
        urls = [url for url, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]
        answer = yield self.ask(
            ready[self._ask_number % len(ready)], {"dry_run": site, "file": name, "count": count, "urls": urls}, draft,
        )
        if "error" in answer and "status" not in answer:
            return 503, {"error": answer["error"]}
        return int(answer["status"]), answer["report"]

    def collect_metrics(self) -> bytes:
        """Prometheus text summed over the master, live and ended workers."""
        parts = [self.metrics, self.retired_metrics]
        for w in self.workers:
            if w.metrics:
                m = Metrics()
                m.merge(w.metrics)
                parts.append(m)
        extra = {
            "prexy_workers": float(sum(1 for w in self.workers if w.ready and not w.retiring)),
            "prexy_worker_generation": float(self.generation),
        }
        if self.cluster is not None:
            extra.update(self.cluster.gauges())
        extra.update(cache_gauges(self.cache_store()))
        processes = [("master", os.getpid())] + [(f"worker-{w.slot}", w.pid) for w in self.workers]
        memo = {f"worker-{w.slot}": memo_held(w.metrics) for w in self.workers if w.metrics}
        text = render(
            parts, extra, observed=self.view.aggregate, top_sites=self.config.observe.top_sites, processes=processes,
            memo=memo,
        )
        if self.acme is not None:
            text += ("\n".join(self.acme.metric_lines()) + "\n").encode("utf-8")
        return text
