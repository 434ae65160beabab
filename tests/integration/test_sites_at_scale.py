"""Sites in a folder of their own files, through ``twistd -n prexy --config``:
``include``, ``--check`` naming a site file's line, and a reload
after one site's rules changed that the workers take in place, for that
site only."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.threads import deferToThread

from .conftest import Cleanups
from .origin import Origin, listen_origin, origin_site
from .test_service import RawClient, connect
from .twistd_support import TWISTD, Twistd, body_of, child_env, free_port, scratch_dir

SITES = ("a", "b", "c")


@defer.inlineCallbacks
def start(main: str, cleanup: Cleanups) -> Any:
    """``twistd prexy --config main``, serving."""
    child = Twistd("--config", main)
    cleanup(child.stop)
    yield child.ready()
    return child


def check(main: str) -> defer.Deferred[subprocess.CompletedProcess[str]]:
    """``twistd prexy --config main --check``, run."""
    args = [sys.executable, "-c", TWISTD, "prexy", "--config", main, "--check"]
    return deferToThread(subprocess.run, args, capture_output=True, text=True, env=child_env(), timeout=60)


class TestSitesFolder:
    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        self.origin = Origin()
        port = reactor.listenTCP(0, origin_site(self.origin), interface="127.0.0.1")
        cleanup(port.stopListening)
        upstream = f"http://127.0.0.1:{port.getHost().port}"
        self.dir = scratch_dir("prexy-sites-test-")
        cleanup(shutil.rmtree, self.dir, True)
        os.mkdir(os.path.join(self.dir, "sites.d"))
        os.mkdir(os.path.join(self.dir, "rules"))
        self.port = free_port()
        self.main = self.write("prexy.toml", (
            'include = "sites.d/*.toml"\n'
            f'[server]\nlisten = ["tcp:{self.port}:interface=127.0.0.1"]\nworkers = 2\n'
            'access_log = "off"\nshutdown_timeout = 2\n'
        ))
        # a and c hold the same rules (one compiled set between them), b its own.
        for name in SITES:
            self.write(f"rules/{name}.rules", self.rules("a" if name == "c" else name))
            self.write(f"sites.d/{name}.toml", (
                f'# site {name}\n[sites.{name}]\nhosts = ["{name}.test"]\n'
                f'upstream = "{upstream}"\nrules = "../rules/{name}.rules"\n'
            ))

    def write(self, name: str, text: str) -> str:
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    @staticmethod
    def rules(word: str, verb: str = "HELLO") -> str:
        return f"replace_filter 'hello' '{verb} {word}' g;\nreplace_filter_types text/plain;\n"

    @defer.inlineCallbacks
    def get(self, host: str) -> Any:
        client = RawClient(f"GET /hello HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        yield connect(self.port, client)
        return bytes(client.data)

    @defer.inlineCallbacks
    def bodies(self, rounds: int = 6) -> Any:
        """Each site's answer, asked ``rounds`` times (so both workers answer)."""
        out: dict[str, set[bytes]] = {}
        for name in SITES:
            answers = yield defer.gatherResults([self.get(f"{name}.test") for _ in range(rounds)])
            out[name] = {body_of(a) for a in answers}
        return out

    def start(self) -> defer.Deferred[Twistd]:
        return start(self.main, self.cleanup)

    def check(self) -> defer.Deferred[subprocess.CompletedProcess[str]]:
        return check(self.main)

    @pytest_twisted.inlineCallbacks
    def test_check_validates_every_site_file(self) -> Any:
        """``--check`` reads the included files: ok with their sites counted;
        an error in one names that file and line."""
        done = yield self.check()
        assert done.returncode == 0, done.stderr
        assert "3 site(s)" in done.stdout
        bad = self.write("sites.d/b.toml", '[sites.b]\nhosts = ["b.test"]\nupstream = "ftp://b"\n')
        done = yield self.check()
        assert done.returncode == 1
        assert f"{bad}:3: sites.b.upstream: must be an http:// or https:// URL" in done.stderr
        bad_rules = self.write("rules/b.rules", "\nreplace_filter 'x' 'y' q;\n")
        self.write("sites.d/b.toml", '[sites.b]\nhosts = ["b.test"]\nupstream = "http://b"\nrules = "../rules/b.rules"\n')
        done = yield self.check()
        assert done.returncode == 1
        assert f"{bad_rules}:2: column" in done.stderr

    @pytest_twisted.inlineCallbacks
    def test_reload_of_one_site_in_place(self) -> Any:
        """Each site rewrites with its own rules; after site b's rules file
        changes, a reload (SIGHUP) is taken in place by the same workers,
        parses that one file only, and changes b's answers only."""
        child = yield self.start()
        workers = sorted(child.children())
        assert len(workers) == 2
        before = yield self.bodies()
        assert before == {"a": {b"HELLO a world!"}, "b": {b"HELLO b world!"}, "c": {b"HELLO a world!"}}
        self.write("rules/b.rules", self.rules("b", "BYE"))
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        after = yield self.bodies()
        assert after == {"a": {b"HELLO a world!"}, "b": {b"BYE b world!"}, "c": {b"HELLO a world!"}}
        assert sorted(child.children()) == workers
        output = child.output()
        assert "only sites changed; 2 worker(s) reload in place" in output
        assert output.count("1 rules file(s) parsed, 1 rule set(s) new") == 2  # once per worker

    @pytest_twisted.inlineCallbacks
    def test_reload_adds_a_site_and_refuses_a_broken_file(self) -> Any:
        """A new site file is served after a reload; a broken one is refused
        with its own file and line, and the running sites stay."""
        child = yield self.start()
        self.write("sites.d/d.toml", self.read("sites.d/a.toml").replace("sites.a", "sites.d").replace("a.test", "d.test"))
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        answer = yield self.get("d.test")
        assert body_of(answer) == b"HELLO a world!"
        bad = self.write("sites.d/e.toml", '[sites.e]\nhosts = ["a.test"]\nupstream = "http://e"\n')
        refused = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield refused
        assert f"{bad}:2: sites.e.hosts: host 'a.test' already belongs to site 'a'" in child.output()
        after = yield self.bodies(2)
        assert after == {"a": {b"HELLO a world!"}, "b": {b"HELLO b world!"}, "c": {b"HELLO a world!"}}

    @pytest_twisted.inlineCallbacks
    def test_a_server_change_starts_new_workers(self) -> Any:
        """A change outside the sites (here a timeout) still starts a new
        generation of workers, which serve the same sites."""
        child = yield self.start()
        workers = set(child.children())
        with open(self.main, "a") as f:
            f.write("[timeouts]\nconnect = 3\n")
        reloaded = child.notified("READY=1")
        os.kill(child.process.pid, signal.SIGHUP)
        yield reloaded
        assert "reload: starting worker generation 2" in child.output()
        assert set(child.children()) - workers
        after = yield self.bodies(2)
        assert after["b"] == {b"HELLO b world!"}

    def read(self, name: str) -> str:
        with open(os.path.join(self.dir, name)) as f:
            return f.read()


class TestManyRulesFiles:
    """Enough rules files for the master's start to check them in forked
    children while it reads the site files (``prexy.forked``; on a machine
    with two CPUs or more): every site serves its own rules through
    ``--workers 2`` (the workers take the rule sets the master parsed), and
    a broken file among them is refused with its file and line."""

    COUNT = 40

    @pytest.fixture(autouse=True)
    def served(self, cleanup: Cleanups) -> None:
        self.cleanup = cleanup
        self.origin, upstream = listen_origin(cleanup)
        self.dir = scratch_dir("prexy-many-rules-test-")
        cleanup(shutil.rmtree, self.dir, True)
        os.mkdir(os.path.join(self.dir, "sites.d"))
        os.mkdir(os.path.join(self.dir, "rules"))
        self.port = free_port()
        self.main = os.path.join(self.dir, "prexy.toml")
        with open(self.main, "w") as f:
            f.write('include = "sites.d/*.toml"\n'
                    f'[server]\nlisten = ["tcp:{self.port}:interface=127.0.0.1"]\nworkers = 2\n'
                    'access_log = "off"\nshutdown_timeout = 2\n')
        for k in range(self.COUNT):
            self.rules(k, f"replace_filter 'hello' 'HELLO {k}' g;\nreplace_filter_types text/plain;\n")
            with open(os.path.join(self.dir, "sites.d", f"s{k:02d}.toml"), "w") as f:
                f.write(f'[sites.s{k}]\nhosts = ["s{k}.test"]\nupstream = "{upstream}"\n'
                        f'rules = "../rules/s{k}.rules"\n')

    def rules(self, k: int, text: str) -> str:
        path = os.path.join(self.dir, "rules", f"s{k}.rules")
        with open(path, "w") as f:
            f.write(text)
        return path

    @pytest_twisted.inlineCallbacks
    def test_each_site_its_own_rules(self) -> Any:
        child = yield start(self.main, self.cleanup)
        for k in (0, 17, 33, self.COUNT - 1):
            client = RawClient(f"GET /hello HTTP/1.1\r\nHost: s{k}.test\r\nConnection: close\r\n\r\n".encode())
            yield connect(self.port, client)
            assert body_of(bytes(client.data)) == f"HELLO {k} world!".encode()
        assert "Traceback" not in child.output()

    @pytest_twisted.inlineCallbacks
    def test_a_broken_file_named_with_its_line(self) -> Any:
        bad = self.rules(33, "replace_filter 'hello' 'x' g;\n\nreplace_filter '(unclosed' 'x' g;\n")
        self.rules(35, "replace_filter 'hello' 'x' q;\n")  # (a later site's error: not the one reported)
        done = yield check(self.main)
        assert done.returncode == 1
        assert f"{bad}:3: column" in done.stderr and "s35.rules" not in done.stderr
