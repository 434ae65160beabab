"""The master's store: opened for each call, closed once none is in progress."""

from __future__ import annotations

from typing import Any

from twisted.trial import unittest

from prexy.cache.bans import Ban
from prexy.cache.occasional import OccasionalStore
from prexy.cache.store import Store
from tests.cache.test_store import FakeClock, key, meta
from tests.cases import tmp_dir


class _Recording:
    """A store that records its calls and its closing; ``during`` runs
    inside a call (another thread's call arriving meanwhile)."""

    def __init__(self, log: list[str], during: Any = None) -> None:
        self.log = log
        self.during = during

    def ban(self, ban: Any) -> int:
        self.log.append("ban")
        if self.during is not None:
            self.during()
        return 3

    def purge_url(self, site: str, url: bytes) -> int:
        self.log.append(f"purge {site} {url!r}")
        return 1

    def clear(self) -> None:
        self.log.append("clear")

    def stats(self) -> dict[str, int]:
        self.log.append("stats")
        return {"count": 2}

    def close(self) -> None:
        self.log.append("close")


class OccasionalStoreTests(unittest.TestCase):
    def test_each_call_opens_and_closes(self) -> None:
        log: list[str] = []

        def open_store() -> _Recording:
            log.append("open")
            return _Recording(log)

        store = OccasionalStore(open_store)
        self.assertFalse(store.is_open)
        self.assertEqual(store.ban(object()), 3)
        self.assertEqual(store.purge_url("a", b"/x"), 1)
        store.clear()
        self.assertEqual(store.stats(), {"count": 2})
        self.assertEqual(
            log,
            ["open", "ban", "close", "open", "purge a b'/x'", "close",
             "open", "clear", "close", "open", "stats", "close"],
        )
        self.assertFalse(store.is_open)
        self.assertEqual(store.opened, 4)

    def test_a_call_in_progress_keeps_it_open_for_another(self) -> None:
        log: list[str] = []
        store: OccasionalStore

        def nested() -> None:
            self.assertTrue(store.is_open)
            store.stats()
            self.assertTrue(store.is_open)  # the ban is still in progress

        def open_store() -> _Recording:
            log.append("open")
            return _Recording(log, during=nested)

        store = OccasionalStore(open_store)
        store.ban(object())
        self.assertEqual(log, ["open", "ban", "stats", "close"])
        self.assertEqual(store.opened, 1)

    def test_closed_after_a_failing_call(self) -> None:
        log: list[str] = []

        class Failing(_Recording):
            def clear(self) -> None:
                raise RuntimeError("disk gone")

        store = OccasionalStore(lambda: Failing(log))
        self.assertRaises(RuntimeError, store.clear)
        self.assertEqual(log, ["close"])
        self.assertFalse(store.is_open)

    def test_a_real_store_between_calls(self) -> None:
        """What one call did is there for the next call, and for a store
        opened after (LMDB refuses a second open in one process, so the
        writer here closes before the master's calls)."""
        path = str(tmp_dir(self) / "cache")
        clock = FakeClock()
        worker = Store.open(path, 4 * 1024 * 1024, clock=clock)
        for i in range(3):
            url = b"a.test/p%d" % i
            worker.put(key(url), meta(url), b"body")
        worker.close()
        master = OccasionalStore(lambda: Store.open(path, 4 * 1024 * 1024, clock=clock))
        self.assertEqual(master.stats()["count"], 3)
        self.assertFalse(master.is_open)
        self.assertEqual(master.ban(Ban("site", target="^/p1$", host="a.test")), 1)
        self.assertFalse(master.is_open)
        self.assertEqual(master.purge_url("site", b"a.test/p2"), 1)
        self.assertEqual(master.stats()["count"], 1)
        self.assertEqual(master.opened, 4)
        after = Store.open(path, 4 * 1024 * 1024, clock=clock)
        self.addCleanup(after.close)
        self.assertEqual(after.stats()["count"], 1)
        self.assertIsNotNone(after.get(key(b"a.test/p0")))
