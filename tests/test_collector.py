"""``prexy.collector``: the collector is off while a load runs and as it
was after (an error included); ``settle`` leaves the objects alive then
out of later collections."""

from __future__ import annotations

import gc

from twisted.trial.unittest import SynchronousTestCase

from prexy import collector


class CollectorTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.addCleanup(gc.enable if gc.isenabled() else gc.disable)

    def test_paused_and_restored(self) -> None:
        gc.enable()
        with collector.paused():
            assert not gc.isenabled()
        assert gc.isenabled()
        with self.assertRaises(ZeroDivisionError), collector.paused():
            1 / 0  # noqa: B018
        assert gc.isenabled()
        gc.disable()
        with collector.paused():
            pass
        assert not gc.isenabled()  # (left off, as it was)

    def test_settle_freezes(self) -> None:
        self.addCleanup(gc.unfreeze)
        before = gc.get_freeze_count()
        kept = [[i] for i in range(100)]  # (tracked by the collector)
        collector.settle()
        assert gc.get_freeze_count() >= before + len(kept)
