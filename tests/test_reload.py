"""Reload at scale: when only sites changed, the master hands its serving
workers the new configuration, parsed (``prexy.handoff``), over their
command pipe, and answers once every one has taken it; a worker still
starting is not waited for, and takes the configuration in force before it
serves (the ``loaded`` / ``serve`` handshake); any other change starts a
new generation as before."""

from __future__ import annotations

import json
import os
from typing import Any

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from prexy import handoff
from prexy.config import Config, SiteConfig, Timeouts, UpstreamURL
from prexy.control import Commands
from prexy.files import Snapshot
from prexy.worker import CommandReader, Handed
from prexy.workers import CONTROL_FD, MasterService, Validated, _WorkerProcess


def _config(*names: str, **changes: Any) -> Config:
    sites = tuple(SiteConfig(n, UpstreamURL.parse(f"http://{n}.origin")) for n in names)
    return attrs.evolve(Config(listen=("tcp:0",), sites=sites, default_site=names[0]), **changes)


class _Pipe:
    """The master's end of a worker's stdin: what was written to it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.written = b""
        self.signals: list[str | int] = []

    def write(self, data: bytes) -> None:
        self.written += data

    def signalProcess(self, name: str | int) -> None:
        self.signals.append(name)

    def commands(self) -> list[tuple[dict[str, Any], bytes]]:
        return Commands().feed(self.written)

    def messages(self) -> list[dict[str, Any]]:
        """The commands, without the payloads' sizes."""
        return [{k: v for k, v in message.items() if k != "bytes"} for message, _ in self.commands()]


class MasterReloadTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        self.loads = [_config("a", "b")]
        self.master = MasterService(self.reactor, self.load(None), ["--config", "x"], 2, self.load)
        self.spawned: list[int] = []
        self.patch(self.master, "_spawn", lambda generation, slot: self.spawned.append(generation))
        self.master.generation = 1
        self.workers = []
        for slot in range(2):
            w = _WorkerProcess(self.master, 1, slot)
            w.transport = _Pipe(100 + slot)  # type: ignore[assignment]
            w.pid = 100 + slot
            w.sent = self.master.config  # (handed at its start)
            w.serve_sent = w.ready = True
            self.workers.append(w)
        self.master.workers = list(self.workers)

    @staticmethod
    def snapshot_of(config: Config) -> Snapshot:
        """A stand-in for the files ``config`` was loaded from."""
        return Snapshot({"/etc/prexy.toml": repr(config).encode()})

    def load(self, argv: Any) -> Validated:
        return Validated(self.loads[-1], self.snapshot_of(self.loads[-1]))

    @staticmethod
    def say(worker: _WorkerProcess, message: dict[str, Any]) -> None:
        worker.childDataReceived(CONTROL_FD, json.dumps(message).encode() + b"\n")

    def answer(self, worker: _WorkerProcess, number: int, ok: bool = True, error: str = "") -> None:
        line = json.dumps({"reloaded": number, "ok": ok, "error": error}).encode() + b"\n"
        worker.childDataReceived(CONTROL_FD, line[:5])
        worker.childDataReceived(CONTROL_FD, line[5:])

    def test_sites_only_reload_in_place(self) -> None:
        """A reload that changes sites only sends every worker a reload
        command, starts no process, and fires True once all have answered."""
        self.loads.append(_config("a", "b", "c"))
        d = self.master.reload()
        assert [w.transport.messages() for w in self.workers] == [[{"reload": 1}], [{"reload": 1}]]  # type: ignore[union-attr]
        assert self.spawned == [] and self.master.generation == 1
        self.answer(self.workers[0], 1)
        self.assertNoResult(d)
        self.answer(self.workers[1], 1)
        assert self.successResultOf(d) is True
        assert self.master.config == self.loads[-1]

    def test_in_place_reload_carries_the_validated_files(self) -> None:
        """Each worker's reload command carries the configuration the master
        validated, parsed, and the snapshot of the files its runtime is
        built from (the workers never read the disk); the sites the worker
        holds already travel as references to its own objects.  The master
        keeps both for the workers it starts later."""
        before = self.master.config
        self.loads.append(attrs.evolve(before, sites=(*before.sites, _config("c").sites[0])))
        self.master.reload()
        expected = self.snapshot_of(self.loads[-1])
        for w in self.workers:
            [(message, payload)] = w.transport.commands()  # type: ignore[union-attr]
            assert message == {"reload": 1, "bytes": len(payload)}
            handed = handoff.decode(payload, before)
            assert handed.config == self.loads[-1] and handed.files == expected
            assert handed.config.sites[0] is before.sites[0] and handed.config.sites[1] is before.sites[1]
            assert w.sent is self.loads[-1]
        assert self.master.snapshot == expected and self.master.config is self.loads[-1]

    def test_a_refused_reload_keeps_the_snapshot_in_force(self) -> None:
        """A configuration that does not load leaves the master's snapshot
        as it was: what a restarted worker gets."""
        before = self.master.snapshot

        def broken(argv: Any) -> Validated:
            raise SystemExit("x.rules:1: bad")

        self.master.load = broken
        assert self.successResultOf(self.master.reload()) is False
        assert self.master.snapshot is before

    def test_a_refusing_worker_is_reported(self) -> None:
        """A worker that could not reload (it keeps its configuration) makes
        the reload answer False with its reason."""
        self.loads.append(_config("a", "c"))
        d = self.master.reload()
        self.answer(self.workers[0], 1, ok=False, error="x.rules:3: bad")
        self.answer(self.workers[1], 1)
        assert self.successResultOf(d) is False
        assert self.master.last_reload_error == "worker 100: x.rules:3: bad"

    def test_a_worker_that_dies_is_not_waited_for(self) -> None:
        """A worker ending before it answers is not waited for (its
        replacement loads the new files when it starts)."""
        self.loads.append(_config("a", "c"))
        d = self.master.reload()
        self.answer(self.workers[0], 1)
        self.master.stopping = True  # (no respawn timer in this test)
        self.master.worker_ended(self.workers[1], Failure(Exception("killed")))
        assert self.successResultOf(d) is True

    def test_a_starting_worker_is_not_waited_for(self) -> None:
        """A worker still starting (here the replacement of a killed one:
        it has not said ``loaded``) is neither sent the reload nor waited
        for, nor replaced: the reload answers once the serving workers
        have.  When it has loaded, the master hands it the configuration
        in force (against the one it started with) and then tells it to
        serve: the pipe is ordered, so it never serves the older one."""
        starting = self.workers[1]
        starting.ready = starting.serve_sent = False
        started_with = starting.sent
        self.loads.append(_config("a", "b", "c"))
        d = self.master.reload()
        assert starting.transport.written == b""  # type: ignore[union-attr]
        assert starting.transport.signals == [] and not starting.retiring  # type: ignore[union-attr]
        assert self.spawned == []
        self.answer(self.workers[0], 1)
        assert self.successResultOf(d) is True
        self.say(starting, {"loaded": True})
        [(reload, payload), (serve, _)] = starting.transport.commands()  # type: ignore[union-attr]
        assert reload == {"reload": 0, "bytes": len(payload)} and serve == {"serve": True}
        assert handoff.decode(payload, started_with).config == self.loads[-1]
        self.say(starting, {"loaded": True})  # (said twice: answered once)
        assert len(starting.transport.commands()) == 2  # type: ignore[union-attr]

    def test_a_worker_that_loaded_the_configuration_in_force_serves_at_once(self) -> None:
        """No reload while it started: ``serve`` is all it is sent."""
        starting = self.workers[1]
        starting.ready = starting.serve_sent = False
        self.say(starting, {"loaded": True})
        assert starting.transport.messages() == [{"serve": True}]  # type: ignore[union-attr]

    def test_a_new_generation_takes_an_in_place_reload_as_it_starts(self) -> None:
        """While a new generation starts, a sites-only reload is not sent to
        the old generation (which serves until then) nor to the starting
        workers: each takes the newest configuration when it has loaded,
        before it serves, and the reload answers once the generation
        serves."""
        self.loads.append(_config("a", "b", timeouts=Timeouts(connect=1)))
        generation = self.master.reload()
        new = []
        for slot in range(2):
            w = _WorkerProcess(self.master, 2, slot)
            w.transport = _Pipe(300 + slot)  # type: ignore[assignment]
            w.pid = 300 + slot
            w.sent = self.master.config
            new.append(w)
        self.master.workers += new
        first = self.master.config
        self.loads.append(_config("a", "b", "c", timeouts=Timeouts(connect=1)))
        d = self.master.reload()
        assert all(w.transport.written == b"" for w in [*new, *self.workers])  # type: ignore[union-attr]
        assert not any(w.retiring for w in new) and self.spawned == [2, 2]
        for w in new:
            self.say(w, {"loaded": True})
            [(reload, payload), (serve, _)] = w.transport.commands()  # type: ignore[union-attr]
            assert reload["reload"] == 0 and serve == {"serve": True}
            assert handoff.decode(payload, first).config == self.loads[-1]
        self.assertNoResult(d)
        for w in new:
            self.say(w, {"ready": True})
        assert self.successResultOf(d) is True and self.successResultOf(generation) is True
        assert all(w.retiring for w in self.workers)

    def test_overlapping_reloads_answer_each(self) -> None:
        """Two reloads in a row: each answers when its own command was answered."""
        self.loads.append(_config("a", "c"))
        first = self.master.reload()
        self.loads.append(_config("a", "d"))
        second = self.master.reload()
        for w in self.workers:
            self.answer(w, 1)
        assert self.successResultOf(first) is True
        self.assertNoResult(second)
        for w in self.workers:
            self.answer(w, 2)
        assert self.successResultOf(second) is True

    def test_other_changes_start_a_new_generation(self) -> None:
        """A server-level change (here a timeout) starts a new generation of
        workers, as before; no command is sent."""
        self.loads.append(_config("a", "b", timeouts=Timeouts(connect=1)))
        d = self.master.reload()
        assert self.spawned == [2, 2] and self.master.generation == 2
        assert all(w.transport.written == b"" for w in self.workers)  # type: ignore[union-attr]
        self.assertNoResult(d)

    def test_renewed_certificates_reload_in_place(self) -> None:
        """The same configuration with other key or certificate bytes (a
        renewal in the same files, then SIGHUP): the workers reload in
        place with the new snapshot (each swaps its listeners' default
        certificate); no new generation."""
        self.master.tls = {"/k.pem": b"old"}
        self.load = lambda argv: Validated(self.loads[-1], self.snapshot_of(self.loads[-1]), {"/k.pem": b"new"})  # type: ignore[method-assign]
        self.master.load = self.load
        self.master.reload()
        assert self.spawned == [] and self.master.generation == 1 and self.master.tls == {"/k.pem": b"new"}
        for w in self.workers:
            [(message, _payload)] = w.transport.commands()  # type: ignore[union-attr]
            assert message["reload"] == 1

    def test_a_refused_configuration_sends_nothing(self) -> None:
        """A configuration that does not load is refused by the master alone."""
        def broken(argv: Any) -> Validated:
            raise SystemExit("x.toml:2: sites.a.upstream: bad")

        self.master.load = broken
        assert self.successResultOf(self.master.reload()) is False
        assert all(w.transport.written == b"" for w in self.workers)  # type: ignore[union-attr]


class _SpawningReactor(MemoryReactorClock):
    """Starts no process: each spawned worker gets a ``_Pipe`` as stdin."""

    def __init__(self) -> None:
        super().__init__()
        self.spawned: list[_WorkerProcess] = []

    def spawnProcess(self, protocol: Any, executable: Any, args: Any, env: Any = None, path: Any = None,
                     uid: Any = None, gid: Any = None, usePTY: Any = 0, childFDs: Any = None) -> Any:
        pipe = _Pipe(200 + len(self.spawned))
        protocol.makeConnection(pipe)
        self.spawned.append(protocol)
        return pipe


class MasterSpawnTests(SynchronousTestCase):
    """What a worker the master starts loads: the snapshot in force."""

    def setUp(self) -> None:
        self.reactor = _SpawningReactor()
        self.configs = [_config("a", "b")]
        self.master = MasterService(self.reactor, self.load(None), ["--config", "x"], 1, self.load)
        self.master.generation = 1

    def load(self, argv: Any) -> Validated:
        return Validated(self.configs[-1], MasterReloadTests.snapshot_of(self.configs[-1]))

    def first_command(self, worker: _WorkerProcess) -> tuple[dict[str, Any], handoff.Handoff]:
        message, payload = worker.transport.commands()[0]  # type: ignore[union-attr]
        return message, handoff.decode(payload)

    def test_a_new_worker_gets_the_configuration_first(self) -> None:
        worker = self.master._spawn(1, 0)
        message, handed = self.first_command(worker)
        assert "configuration" in message and handed.files == self.master.snapshot
        assert handed.config == self.master.config

    def test_serving_once_the_first_workers_are_ready(self) -> None:
        """``serving`` (an ACME fleet node orders, and confirms the others'
        challenge answers, once it fires) waits for the first generation."""
        worker = self.master._spawn(1, 0)
        self.assertNoResult(self.master.serving)
        worker.ready = True
        self.master.worker_ready(worker)
        self.successResultOf(self.master.serving)

    def test_a_reload_while_the_first_worker_starts(self) -> None:
        """A reload while the first worker is still starting throws nothing
        away: the worker is kept, takes the new configuration when it has
        loaded (before ``serve``), and the pool serves once it is ready."""
        first = self.master._spawn(1, 0)
        self.configs.append(_config("a", "b", "c"))
        self.master.reload()
        assert not first.retiring and self.reactor.spawned == [first]
        MasterReloadTests.say(first, {"loaded": True})
        commands = first.transport.commands()  # type: ignore[union-attr]
        assert [sorted(message) for message, _ in commands] == [["bytes", "configuration"], ["bytes", "reload"],
                                                                 ["serve"]]
        handed = Handed()
        handed.take(commands[0][1])
        assert handed.take(commands[1][1]).config == self.configs[-1]
        self.assertNoResult(self.master.serving)
        MasterReloadTests.say(first, {"ready": True})
        self.successResultOf(self.master.serving)

    def test_a_replacement_gets_the_snapshot_in_force(self) -> None:
        """A worker that dies after an in-place reload is replaced by one
        that loads the reloaded snapshot (not the one it started with, not
        the disk); after a refused reload, the one still in force."""
        first = self.master._spawn(1, 0)
        first.ready = True
        self.configs.append(_config("a", "b", "c"))
        self.master.reload()
        expected = self.master.config
        assert self.master.snapshot == MasterReloadTests.snapshot_of(self.configs[-1])

        def broken(argv: Any) -> Validated:
            raise SystemExit("a.rules:1: bad")

        self.master.load = broken
        assert self.successResultOf(self.master.reload()) is False
        self.master.worker_ended(first, Failure(Exception("killed")))
        self.reactor.advance(60)
        replacement = self.reactor.spawned[-1]
        assert replacement is not first
        assert self.first_command(replacement)[1].config is not expected
        assert self.first_command(replacement)[1].config == expected


class _Reactor:
    def __init__(self) -> None:
        self.removed: list[Any] = []

    def removeReader(self, reader: Any) -> None:
        self.removed.append(reader)


class CommandReaderTests(SynchronousTestCase):
    """The worker's end: JSON lines from a pipe, whatever the reads' sizes."""

    def read_all(self, pieces: list[bytes]) -> tuple[list[dict[str, Any]], Any]:
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        got: list[dict[str, Any]] = []
        reactor = _Reactor()
        reader = CommandReader(reactor, r, lambda message, payload: got.append(message))
        result = None
        for piece in pieces:
            os.write(w, piece)
            result = reader.doRead()
            assert result is None
        os.close(w)
        result = reader.doRead()
        assert isinstance(result, Failure)
        reader.connectionLost(result)
        assert reactor.removed == [reader]
        return got, result

    @settings(max_examples=100, deadline=None)
    @given(st.data())
    def test_lines_in_any_pieces(self, data: st.DataObject) -> None:
        """Each whole line is one command, however the bytes are split;
        lines that are not JSON objects are skipped; a last unfinished line
        is never acted on."""
        text = b'{"reload": 1}\nnot json\n[1, 2]\n{"reload": 2, "x": "\\u00e9"}\n{"reload": 3'
        cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if text[a:b]]
        got, _ = self.read_all(pieces)
        assert got == [{"reload": 1}, {"reload": 2, "x": "\u00e9"}]

    def test_configuration_first(self) -> None:
        """A worker starts with the snapshot that comes first on its stdin;
        what follows it stays for the command reader; a pipe that ends
        first, or another command first, stops the worker with a message."""
        from prexy.control import encode
        from prexy.worker import read_configuration

        snapshot = Snapshot({"/etc/x.rules": b"replace_filter 'a' 'b';\n"})
        config = _config("a")
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        payload = handoff.encode(handoff.Handoff(config, snapshot))
        os.write(w, encode({"configuration": 1}, payload) + encode({"reload": 7}))
        handed = Handed()
        first, later = read_configuration(r, Commands(), handed)
        assert first.config == config and first.files == snapshot and later == [({"reload": 7}, b"")]
        assert handed.base is first.config
        os.write(w, encode({"reload": 1}))
        with self.assertRaises(SystemExit) as caught:
            read_configuration(r, Commands(), Handed())
        assert "expected the configuration first" in str(caught.exception)
        os.write(w, encode({"configuration": 1}, b"not a handoff"))
        with self.assertRaises(SystemExit) as caught:
            read_configuration(r, Commands(), Handed())
        assert "configuration handoff" in str(caught.exception)
        os.close(w)
        with self.assertRaises(SystemExit) as caught:
            read_configuration(r, Commands(), Handed())
        assert "sent no configuration" in str(caught.exception)

    def test_end_of_pipe(self) -> None:
        """The master closing the pipe ends the reader (removed from the reactor)."""
        got, result = self.read_all([])
        assert got == [] and result.check(EOFError)


class WorkerReloadTests(SynchronousTestCase):
    """What a worker's in-place reload keeps (``ProxyService.reload``)."""

    def test_files_are_taken_on_reload_only(self) -> None:
        """A map file edited on disk is not taken by any timer of the
        service: an hour passes on its clock (every timer due fires) and
        the runtime in force, with the old map, is the one it started with;
        a reload takes the edit."""
        from prexy.config import single_site_config
        from prexy.runtime import build_runtime
        from prexy.service import ProxyService

        tmp = self.mktemp()
        os.makedirs(tmp)
        map_path = os.path.join(tmp, "site.map")

        def write_map(text: str, stamp: float) -> None:
            with open(map_path, "w") as f:
                f.write(text)
            os.utime(map_path, (stamp, stamp))  # a different mtime, whatever the clock

        write_map("/old /new-one;\n", 1_000_000)
        config = single_site_config(["tcp:0:interface=127.0.0.1"], "http://o", map_path=map_path)
        reactor = MemoryReactorClock()
        service = ProxyService(reactor, config, build_runtime(config), check_rules=False)
        service.startService()
        self.addCleanup(service.stopService)
        runtime = service.runtime
        write_map("/old /new-two;\n", 2_000_000)
        reactor.pump([1.0] * 3600)
        assert service.runtime is runtime
        assert runtime.sites[0].urlmap.lookup("/old") == "/new-one"
        assert service.reload()
        assert service.runtime.sites[0].urlmap.lookup("/old") == "/new-two"

    def test_unchanged_sites_keep_everything(self) -> None:
        """After one site file's rules change, a reload swaps in a runtime in
        which every other site is the same SiteRuntime (compiled rule set,
        rules_version: their cache keys), the process's applicability memory
        is the same object, and only the changed site has a new rule set
        and rules_version; a broken file leaves all of it as it was."""
        from prexy.config import load_config
        from prexy.runtime import build_runtime
        from prexy.service import ProxyService

        tmp = self.mktemp()
        os.makedirs(os.path.join(tmp, "sites.d"))

        def write(name: str, text: str) -> None:
            with open(os.path.join(tmp, name), "w") as f:
                f.write(text)

        write("prexy.toml", 'include = "sites.d/*.toml"\n')
        for name in ("a", "b", "c"):
            write(f"{name}.rules", f"replace_filter 'x' '{name}' g;\n")
            write(f"sites.d/{name}.toml",
                  f'[sites.{name}]\nhosts = ["{name}.test"]\nupstream = "http://o"\nrules = "../{name}.rules"\n')
        config = load_config(os.path.join(tmp, "prexy.toml"))
        service = ProxyService(MemoryReactorClock(), config, build_runtime(config), check_rules=False)
        # Three rule sets (at most COMPILE_AHEAD): compiled before serving.
        assert all(s.rules.compiled for s in service.runtime.sites)
        before = {s.name: s for s in service.runtime.sites}
        for host in (b"a.test", b"b.test", b"c.test"):
            service.runtime.select(host)
        memory = service.resource.applicability
        write("b.rules", "replace_filter 'x' 'B' g;\n")
        assert service.reload()
        after = {s.name: s for s in service.runtime.sites}
        assert after["a"] is before["a"] and after["c"] is before["c"] and after["a"].rules.compiled
        assert after["b"].rules is not before["b"].rules
        assert after["b"].rules.compiled  # before the swap: its first request pays nothing
        assert after["b"].rules_version != before["b"].rules_version
        assert service.resource.applicability is memory
        runtime = service.runtime
        write("sites.d/c.toml", '[sites.c]\nupstream = "ftp://o"\n')
        assert not service.reload()
        assert service.runtime is runtime
        assert "sites.d/c.toml:2: sites.c.upstream" in service.last_reload_error
