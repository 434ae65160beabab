"""A worker process of the pool: ``python -m prexy.worker SPEC``.

The master (:mod:`prexy.workers`) spawns one per slot with SPEC, a JSON
object: the prexy command line (``argv``, for the process list), the
listening sockets it inherits (``sockets``: descriptor, family, endpoint
description, TLS files), the control pipe (``control_fd``) and the master's
pid.  The worker runs a ``ProxyService`` on the inherited sockets, writes
``{"ready": true}`` and then its metrics every second to the pipe, drains
on SIGTERM and exits when the master dies.

The master's commands come on the worker's stdin, one JSON object a line,
some with a payload (``prexy.control.Commands``).  The first is
``{"configuration": G, "bytes": N}``: the configuration in force, parsed and
validated by the master, with the bytes of the rules, maps and certificates
it was validated with (``prexy.handoff``).  The worker parses no
configuration file and reads none from the disk, so it serves what its
master runs even if the files changed since, or no longer load.

Start-up is a handshake on the ordered pipe.  Once its runtime is built
the worker writes ``{"loaded": true}`` and serves only when the master
answers ``{"serve": true}``; a master that validated a reload meanwhile
hands it that configuration first (a ``reload`` command before ``serve``),
so a worker never starts serving an older configuration than the one in
force, and a reload never waits for a worker that is still starting.  A
worker that cannot take that configuration exits, and its master starts
another.  Commands other than ``reload`` that come before ``serve`` run
once it serves.

``{"reload": N, "bytes": M}`` with a new handoff reloads the configuration
in place (``ProxyService.reload``: only the rule sets and maps whose files
changed are loaded again; the unchanged sites stay the same objects, and
the process, its connections, its applicability memory and its compiled
rule sets stay) and answers ``{"reloaded": N, "ok": ..., "error": ...}``.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
from typing import Any

if __name__ == "__main__":
    # A worker's start (its modules, then its configuration) makes objects
    # that live as long as it does: the collector stays off until they are
    # frozen (``worker_main``), rather than traversing them as they come.
    gc.disable()

from twisted.internet.interfaces import IReadDescriptor  # noqa: E402
from twisted.python.failure import Failure  # noqa: E402
from zope.interface import implementer  # noqa: E402

from prexy import collector, handoff  # noqa: E402
from prexy.config import Config, ConfigError  # noqa: E402
from prexy.control import Commands, encode  # noqa: E402
from prexy.files import Snapshot  # noqa: E402
from prexy.handoff import Handoff  # noqa: E402
from prexy.listen import ListenSpec, tls_files  # noqa: E402
from prexy.runtime import Runtime, build_runtime  # noqa: E402
from prexy.service import ProxyService  # noqa: E402

#: Seconds between two metrics reports to the master.
METRICS_INTERVAL = 1.0


@implementer(IReadDescriptor)
class CommandReader:
    """Reads the master's commands, one JSON object a line with its payload
    (``prexy.control.Commands``), from a pipe (the worker's stdin) in the
    reactor, and hands each to ``command(message, payload)``.  ``commands``
    is the reader's state so far (what was read before the reactor ran)."""

    def __init__(self, reactor: Any, fd: int, command: Any, commands: Commands | None = None) -> None:
        self.reactor = reactor
        self.fd = fd
        self.command = command
        self._commands = commands if commands is not None else Commands()

    def fileno(self) -> int:
        return self.fd

    def logPrefix(self) -> str:
        return "master-commands"

    def doRead(self) -> Any:
        try:
            data = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return None
        except OSError as exc:
            return Failure(exc)
        if not data:
            return Failure(EOFError("the master closed the command pipe"))
        for message, payload in self._commands.feed(data):
            self.command(message, payload)
        return None

    def connectionLost(self, reason: Any) -> None:
        # The master is gone (PDEATHSIG ends this worker): stop reading.
        self.reactor.removeReader(self)


def _die_with_parent() -> None:
    """Ask the kernel to SIGTERM us if the master dies (Linux)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class Handed:
    """The configurations the master handed this worker, in order: each
    handoff is decoded against the one before (``prexy.handoff``)."""

    def __init__(self) -> None:
        self.base: Config | None = None

    def take(self, payload: bytes) -> Handoff:
        """The handoff ``payload`` carries; ``HandoffError`` when it is not one."""
        handed = handoff.decode(payload, self.base)
        self.base = handed.config
        return handed


def read_configuration(
    fd: int, commands: Commands, handed: Handed
) -> tuple[Handoff, list[tuple[dict[str, Any], bytes]]]:
    """Block until the master's first command, the configuration, has come
    on ``fd``; it, and the commands read after it.  ``SystemExit`` when the
    pipe ends first or the first command is not the configuration."""
    while True:
        data = os.read(fd, 1 << 20)
        if not data:
            raise SystemExit("prexy worker: the master sent no configuration")
        received = commands.feed(data)
        if received:
            (message, payload), *later = received
            if "configuration" not in message:
                raise SystemExit(f"prexy worker: expected the configuration first, got {sorted(message)}")
            try:
                return handed.take(payload), later
            except ValueError as exc:
                raise SystemExit(f"prexy worker: {exc}") from None


def read_until_serve(
    fd: int, commands: Commands, received: list[tuple[dict[str, Any], bytes]]
) -> tuple[list[tuple[dict[str, Any], bytes]], list[tuple[dict[str, Any], bytes]]]:
    """Block until the master says ``serve`` (the worker said ``loaded``):
    the commands before it and those after it, in order, ``received``
    (read already) first.  ``SystemExit`` when the pipe ends first."""
    queue = list(received)
    while True:
        for i, (message, _payload) in enumerate(queue):
            if "serve" in message:
                return queue[:i], queue[i + 1 :]
        data = os.read(fd, 1 << 20)
        if not data:
            raise SystemExit("prexy worker: the master closed the pipe before this worker served")
        queue += commands.feed(data)


def build(handed: Handoff) -> tuple[Runtime, dict[str, bytes]]:
    """The runtime and the ``ssl:`` listeners' key and certificate bytes of
    a configuration the master validated (its rule sets those the master
    handed over, or read, each pattern parsed when its set is first
    compiled: ``RuleSets``)."""
    config = handed.config
    runtime = build_runtime(config, files=handed.files, validated=True, given=handed.rulesets)
    return runtime, tls_files(config.listen_endpoints(), handed.files)


def worker_main(spec_json: str) -> None:
    """Entry point of a worker process."""
    spec = json.loads(spec_json)
    _die_with_parent()
    # From the start (loading thousands of sites takes seconds): reload is
    # the master's business, and SIGUSR1 waits for the service's handler.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if os.getppid() != spec["master_pid"]:
        sys.exit(1)  # the master died before we got here
    from prexy.memory import TRIM_INTERVAL, trim, tune_malloc

    tune_malloc()  # before the first body is allocated
    from twisted.internet import reactor as _reactor
    from twisted.logger import globalLogBeginner, textFileLogObserver

    reactor: Any = _reactor

    globalLogBeginner.beginLoggingTo([textFileLogObserver(sys.stderr)], redirectStandardIO=False)
    commands = Commands()
    handed = Handed()
    with collector.paused():
        first, later = read_configuration(0, commands, handed)
        try:
            runtime, tls = build(first)
        except ConfigError as exc:  # (the master validated these bytes with the same code)
            raise SystemExit(f"prexy worker: {exc}") from None
    inherited = [
        (ListenSpec(s["description"], s["family"], s["tls_key"], s["tls_cert"]), s["fd"]) for s in spec["sockets"]
    ]
    control_fd = spec["control_fd"]
    # The files are never read again: a reload comes with its own.
    svc = ProxyService(reactor, first.config, runtime, inherited=inherited, check_rules=False, files=Snapshot({}), tls=tls)
    del first, runtime
    collector.settle()  # (its configuration, loaded: left out of later collections)
    gc.enable()  # (off since the worker's modules were imported: ``__main__``)

    def send(message: dict[str, Any]) -> None:
        try:
            os.write(control_fd, encode(message))
        except OSError:
            # The master is gone: do not linger holding the port.
            reactor.callFromThread(lambda: svc.drain_and_stop(0))

    def report() -> None:
        svc.report_levels()
        send({"metrics": svc.metrics.snapshot(), "observed": svc.observer.report()})

    # The live log's records go to the master, which has the readers.
    svc.pump.deliver = lambda records, dropped: send({"log": records, "dropped": dropped})

    def command(message: dict[str, Any], payload: bytes) -> None:
        if isinstance(message.get("certificate"), str):  # the master stored it (prexy.acme)
            svc.certificate_stored(message["certificate"])
        if isinstance(message.get("no_certificate"), str):  # none for a handshake waiting (prexy.ondemand)
            svc.no_certificate(message["no_certificate"])
        if "log_filters" in message:  # the live log's readers changed (prexy.observe.tap)
            from prexy.observe.tap import LogFilter

            svc.pump.set_filters([LogFilter.from_dict(f) for f in message["log_filters"]])
            send({"log_filters_set": message.get("number")})
        if "ask" in message:  # the master's question, answered with its number
            number = message["ask"]
            if "top_urls" in message:
                urls = svc.observer.top_urls(str(message["top_urls"]), int(message.get("count") or 50))
                send({"answer": number, "urls": urls})
            elif "dry_run" in message:
                d = svc.dry_run(str(message["dry_run"]), payload, str(message.get("file") or "draft.rules"),
                                int(message.get("count") or 50), message.get("urls"))
                d.addCallback(lambda done: send({"answer": number, "status": done[0], "report": done[1]}))
                d.addErrback(lambda f: send({"answer": number, "status": 500, "report": {"error": f.getErrorMessage()}}))
        if "reload" in message:
            reload(message["reload"], payload)

    def reload(number: int, payload: bytes, serving: bool = True) -> bool:
        try:
            with collector.paused():
                new = handed.take(payload)
        except ValueError as exc:
            # Out of step with the master's handoffs: this worker ends (once
            # drained) and the master starts one with the whole configuration.
            send({"reloaded": number, "ok": False, "error": f"{exc}; this worker is replaced"})
            if not serving:
                raise SystemExit(f"prexy worker: {exc}") from None
            svc.drain_and_stop(svc.config.shutdown_timeout)
            return False
        ok = svc.reload(new.files, new.config)
        send({"reloaded": number, "ok": ok, "error": "" if ok else svc.last_reload_error})
        return ok

    if svc.certificates.on_demand is not None:  # the master issues (prexy.ondemand)
        svc.certificates.on_demand.request = lambda name: send({"obtain": name})

    # Loaded: the master answers "serve", after the configuration in force
    # if it reloaded meanwhile.
    send({"loaded": True, "pid": os.getpid()})
    before, after = read_until_serve(0, commands, later)
    kept = []
    for message, payload in before:
        if "reload" in message:
            if not reload(message["reload"], payload, serving=False):
                raise SystemExit(f"prexy worker: cannot take the configuration in force: {svc.last_reload_error}")
        else:
            kept.append((message, payload))

    def started() -> None:
        svc.startService()
        reactor.addReader(CommandReader(reactor, 0, command, commands))
        for message, payload in [*kept, *after]:  # (sent while this worker started)
            command(message, payload)
        cluster = svc.config.cluster
        if cluster is not None and svc.resource.cache is not None:  # PURGEs go to the master (prexy.cluster)
            from prexy.cluster.relay import WorkerRelay

            svc.resource.cache.announce = WorkerRelay(
                reactor, send, svc.resource.cache.events, cluster.confirm_timeout + 2.0
            )
        send({"ready": True, "pid": os.getpid()})
        from twisted.internet.task import LoopingCall

        LoopingCall(report).start(METRICS_INTERVAL, now=False)
        LoopingCall(trim).start(TRIM_INTERVAL, now=False)  # freed pages back to the system (prexy.memory)

    def on_term(*_: Any) -> None:
        reactor.callFromThread(lambda: svc.drain_and_stop(svc.config.shutdown_timeout))

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    reactor.callWhenRunning(started)

    def final_report() -> None:
        report()

    reactor.addSystemEventTrigger("before", "shutdown", final_report)
    reactor.run(installSignalHandlers=False)


if __name__ == "__main__":
    worker_main(sys.argv[1])
