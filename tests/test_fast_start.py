"""A start of thousands of sites: what the master's first load does to
be quick.  Its objects are frozen as the load ends (``collector``), not
traversed by the collector's next collection; a reload's are not.  Its
rules files are checked by forked children while the site files load
(``prexy.forked``), and what it builds is what the serial load builds,
errors included."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy import service
from prexy.config import Config, ConfigError, load_config
from prexy.files import Recorder
from prexy.forked import Pool
from prexy.runtime import RuleSets, Runtime, build_runtime, precheck_rules, rules_checker
from prexy.service import Options
from prexy.substitution.ruleset import CompileError, RuleSet
from tests.test_handoff import write


def _write(directory: str, name: str, text: str) -> str:
    return write(os.path.join(directory, name), text)


class StartFreezeTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.addCleanup(gc.enable if gc.isenabled() else gc.disable)
        self.addCleanup(gc.unfreeze)
        gc.enable()
        tmp = self.mktemp()
        _write(tmp, "rules/a.rules", "replace_filter 'a' 'b' g;\n")
        self.main = _write(tmp, "prexy.toml", '[server]\nlisten = ["tcp:0"]\nworkers = 0\n'
                           '[sites.a]\nupstream = "http://127.0.0.1:1"\nrules = "rules/a.rules"\n')

    def test_twistd_start_is_frozen(self) -> None:
        """Options parsed as twistd's sub-command (it has a parent): the
        load's objects are frozen before the collector resumes."""
        options = Options()
        options.parent = {}  # (twistd's ServerOptions)
        gc.unfreeze()
        options.parseOptions(["--config", self.main])
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0

    def test_other_loads_are_not(self) -> None:
        """Options on their own (a test, ``--check`` from code) and a reload
        (a previous runtime) freeze nothing."""
        gc.unfreeze()
        first = Options()
        first.parseOptions(["--config", self.main])
        assert gc.get_freeze_count() == 0
        reload = Options()
        reload.parent = {}
        reload.previous = first.runtime
        reload.parseOptions(["--config", self.main])
        assert gc.isenabled()
        assert gc.get_freeze_count() == 0


def _site_files(tmp: str, sites: int, distinct: int, broken: dict[int, str] | None = None) -> str:
    """A main file including ``sites`` site files, each naming the shared
    rules and one of ``distinct`` rules files (``broken``: set number ->
    an extra line for that set's file); the main file's path."""
    _write(tmp, "rules/shared.rules", "replace_filter_types text/css;\nreplace_filter 'shared' 'SHARED' g;\n")
    for k in range(distinct):
        extra = (broken or {}).get(k, "")
        _write(tmp, f"rules/set-{k}.rules",
               f"# set {k}\nreplace_filter '(https?:)//www\\.site{k}\\.com' '$1//www.site{k}.nl' g;\n"
               f"replace_filter 'site{k}' 'SITE{k}' gi;\n{extra}")
    for i in range(sites):
        _write(tmp, f"sites.d/s{i:03d}.toml",
               f'[sites.s{i}]\nhosts = ["s{i}.test"]\nupstream = "http://127.0.0.1:1"\n'
               f'rules = ["../rules/shared.rules", "../rules/set-{i % distinct}.rules"]\n')
    return _write(tmp, "prexy.toml", 'include = "sites.d/*.toml"\n[server]\nlisten = ["tcp:0"]\nworkers = 2\n')


def _load(main: str, pool: Pool[Any] | None) -> tuple[Config, Runtime, Recorder]:
    files = Recorder()
    config = load_config(main, files=files, now=None, rules_named=pool.submit if pool is not None else None)
    checked = pool.results() if pool is not None else None
    return config, build_runtime(config, check=True, files=files, given=checked), files


def _pool() -> Pool[Any]:
    return Pool(rules_checker(), 1, alone=lambda: True)


def _refusing(real: Callable[[RuleSet], None]) -> Callable[[RuleSet], None]:
    """``check_compiles``, refusing a pattern ``regex`` would not compile
    (one that says so: the dialect accepts every pattern it refuses)."""

    def check(ruleset: RuleSet) -> None:
        for rule in ruleset.rules:
            if rule.pattern == b"refused":
                raise CompileError(rule, "too big")
        real(ruleset)

    return check


class PrecheckedLoadTests(SynchronousTestCase):
    """A start checks the rules files in forked children (``prexy.forked``)
    while the site files load; what it builds is what the serial load
    builds, errors included."""

    def setUp(self) -> None:
        self.tmp = self.mktemp()
        self.patch(RuleSet, "check_compiles", _refusing(RuleSet.check_compiles))

    def test_same_configuration_and_runtime(self) -> None:
        """Config, rule sets (their rules' origins too), the contents
        checked and the files recorded: the same with children as
        without."""
        main = _site_files(self.tmp, 120, 40)
        pool = _pool()
        self.addCleanup(pool.close)
        config, runtime, files = _load(main, pool)
        assert pool.own < 41  # (the children took their share: forked)
        serial_config, serial, serial_files = _load(main, None)
        assert config == serial_config
        assert len(runtime.sites) == len(serial.sites) == 120
        for site, other in zip(runtime.sites, serial.sites, strict=True):
            assert site.config == other.config
            assert site.rules == other.rules and site.rules is not None and other.rules is not None
            assert [r.origin for r in site.rules.rules] == [r.origin for r in other.rules.rules]
            assert site.rules.types == other.rules.types
            assert site.rules_version == other.rules_version
        assert runtime.rulesets is not None and serial.rulesets is not None
        assert runtime.rulesets._checked == serial.rulesets._checked
        assert runtime.rulesets.parsed == serial.rulesets.parsed == 41
        assert files.snapshot().encode() == serial_files.snapshot().encode()
        # The patterns parse when the scanner is built, as a worker's do.
        rules = runtime.sites[5].rules
        assert rules is not None and rules.scanner is not None
        assert runtime.linear_rules() == serial.linear_rules()

    def test_errors_as_the_serial_load_reports_them(self) -> None:
        """A refused pattern and a dialect error in two files: the error of
        the first in the sites' order is reported, with its file and line,
        exactly as without children."""
        broken = {33: "replace_filter 'refused' 'x' g;\n", 7: "replace_filter '(unclosed' 'x' g;\n"}
        main = _site_files(self.tmp, 120, 40, broken)
        errors = []
        for pool in (_pool(), None):
            if pool is not None:
                self.addCleanup(pool.close)
            with self.assertRaises(ConfigError) as caught:
                _load(main, pool)
            errors.append(str(caught.exception))
        assert errors[0] == errors[1]
        assert "set-7.rules:4" in errors[0]
        del broken[7]
        main = _site_files(self.tmp, 120, 40, broken)
        errors = []
        for pool in (_pool(), None):
            with self.assertRaises(ConfigError) as caught:
                _load(main, pool)
            errors.append(str(caught.exception))
        assert errors[0] == errors[1]
        assert "set-33.rules:4" in errors[0] and "too big" in errors[0]

    def test_a_file_changed_since_its_check_is_checked_again(self) -> None:
        """A child's result is taken only for the very bytes read here: a
        file that changed since is parsed and checked here."""
        path = _write(self.tmp, "a.rules", "replace_filter 'a' 'b' g;\n")
        digest, checked = precheck_rules(path)
        store = RuleSets(check=True, given={path: (digest, checked)})
        assert store.load((path,)) is checked
        assert RuleSets(validated=True, given={path: (digest, checked)}).load((path,)) is checked
        _write(self.tmp, "a.rules", "replace_filter 'refused' 'b' g;\n")
        store = RuleSets(check=True, given={path: (digest, checked)})
        with self.assertRaises(ConfigError) as caught:
            store.load((path,))
        assert (caught.exception.path, caught.exception.line) == (path, 1)
        assert RuleSets(validated=True, given={path: (digest, checked)}).load((path,)) is not checked

    def test_rules_named_as_soon_as_parsed(self) -> None:
        """``load_config`` tells the rules files of each included file as
        it is parsed, before any site is checked, and those of the main
        file's own sites as they are checked."""
        main = _site_files(self.tmp, 3, 2)
        with open(main, "a") as f:
            f.write('[sites.inline]\nupstream = "http://127.0.0.1:1"\nrules = "rules/set-1.rules"\n')
        told: list[str] = []
        load_config(main, rules_named=told.append)
        rules = os.path.join(os.path.dirname(os.path.abspath(main)), "rules")
        expected = [os.path.join(rules, name) for name in ("shared.rules", "set-0.rules", "set-1.rules")]
        # The included files' as they are parsed (each name once), then
        # every site's as it is checked: the main file's own first.
        assert told[:3] == expected
        assert told[3:] == [expected[2], *expected[:2], expected[0], expected[2], *expected[:2]]


class _Recording(Pool[Any]):
    made: list[_Recording] = []

    def __init__(self, work: Callable[[str], Any], children: int, min_items: int = 32, alone: Any = None) -> None:
        super().__init__(work, 1, min_items, alone=lambda: True)
        _Recording.made.append(self)


class OptionsPoolTests(SynchronousTestCase):
    """``twistd prexy``'s start uses a pool; other loads do not; a small
    configuration forks nothing."""

    def setUp(self) -> None:
        self.addCleanup(gc.enable if gc.isenabled() else gc.disable)
        self.addCleanup(gc.unfreeze)
        _Recording.made = []
        self.patch(service, "Pool", _Recording)
        self.tmp = self.mktemp()

    def test_start_forks(self) -> None:
        main = _site_files(self.tmp, 80, 40)
        options = Options()
        options.parent = {}
        options.parseOptions(["--config", main])
        plain = Options()
        plain.parseOptions(["--config", main])
        assert len(_Recording.made) == 1 and _Recording.made[0].own < 41
        assert options.config == plain.config
        assert [s.rules for s in options.runtime.sites] == [s.rules for s in plain.runtime.sites]
        assert not _Recording.made[0].children  # (reaped)

    def test_small_configuration_forks_nothing(self) -> None:
        main = _site_files(self.tmp, 20, 10)
        options = Options()
        options.parent = {}
        options.parseOptions(["--config", main])
        assert len(_Recording.made) == 1 and not _Recording.made[0].forked
        assert _Recording.made[0].own == 0


class MasterHandsRuleSetsTests(SynchronousTestCase):
    """The master hands a worker it starts the rule sets it parsed, and a
    worker that reloads in place none (it keeps its own)."""

    def test_new_workers_only(self) -> None:
        from prexy.handoff import decode
        from prexy.service import ConfigLoader
        from prexy.workers import MasterService
        from tests.test_reload import MasterReloadTests, _SpawningReactor

        tmp = self.mktemp()
        main = _site_files(tmp, 4, 2)
        loader = ConfigLoader()
        argv = ["--config", main]
        reactor = _SpawningReactor()
        master = MasterService(reactor, loader(argv), argv, 1, loader)
        master.generation = 1
        worker = master._spawn(1, 0)
        message, payload = worker.transport.commands()[0]  # type: ignore[union-attr]
        handed = decode(payload)
        rules = os.path.join(os.path.dirname(os.path.abspath(main)), "rules")
        assert sorted(handed.rulesets) == [os.path.join(rules, n) for n in ("set-0.rules", "set-1.rules",
                                                                               "shared.rules")]
        MasterReloadTests.say(worker, {"loaded": True})
        worker.ready = True
        _write(tmp, "sites.d/s000.toml", '[sites.s0]\nhosts = ["s0.test"]\nupstream = "http://127.0.0.1:2"\n'
                                          'rules = ["../rules/shared.rules"]\n')
        master.reload()
        commands = worker.transport.commands()  # type: ignore[union-attr]
        assert "reload" in commands[-1][0]
        assert decode(commands[-1][1], handed.config).rulesets == {}


class WorkerCollectorTests(SynchronousTestCase):
    """``python -m prexy.worker`` runs its imports with the collector off
    (the start's objects are frozen once it is over, then it is on again);
    importing the module anywhere else leaves it alone."""

    def test_off_from_the_start(self) -> None:
        import json
        import subprocess
        import sys

        # (A master pid that is not its parent: the worker exits at once,
        # before its start is over.)
        spec = json.dumps({"master_pid": -1})
        code = ("import gc, runpy, sys\n"
                f"sys.argv = ['prexy.worker', {spec!r}]\n"
                "try:\n    runpy.run_module('prexy.worker', run_name='__main__')\n"
                "except SystemExit:\n    print('enabled' if gc.isenabled() else 'disabled')\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert done.stdout.strip() == "disabled", done.stderr
        import prexy.worker  # noqa: F401

        assert gc.isenabled()
