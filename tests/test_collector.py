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

    def test_paused_settles_a_start(self) -> None:
        """``paused(settle=True)``: what the load made is frozen before the
        collector resumes (its first collection would traverse all of it);
        a load that fails freezes nothing."""
        self.addCleanup(gc.unfreeze)
        gc.enable()
        before = gc.get_freeze_count()
        with self.assertRaises(ZeroDivisionError), collector.paused(settle=True):
            1 / 0  # noqa: B018
        assert gc.get_freeze_count() == before
        with collector.paused(settle=True):
            kept = [[i] for i in range(100)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(kept)
