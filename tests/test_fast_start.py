"""A start of thousands of sites: what the master's first load does to
be quick.  Its objects are frozen as the load ends (``collector``), not
traversed by the collector's next collection; a reload's are not."""

from __future__ import annotations

import gc
import os

from twisted.trial.unittest import SynchronousTestCase

from prexy.service import Options


def _write(directory: str, name: str, text: str) -> str:
    path = os.path.join(directory, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    return path


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
