"""``prexy.forked.Pool``: work on items in forked children while the caller
goes on.  What comes back is what the work gives in this process; an item
whose work raises is missing (the caller redoes it and reports it); a
child that dies costs nothing but time (this process does its items); no
child is forked for a few items, without a CPU to spare or beside other
threads; every child is reaped."""

from __future__ import annotations

import os
import threading

from twisted.trial.unittest import SynchronousTestCase

from prexy import forked
from prexy.forked import Pool

PARENT = os.getpid()


def square(item: str) -> tuple[str, int, int]:
    """The item's number squared, and the process that worked on it."""
    if item.startswith("bad"):
        raise ValueError(item)
    return item, int(item) ** 2, os.getpid()


def dies(item: str) -> tuple[str, int, int]:
    """``square``, but a child handed item 7 dies on it."""
    if item == "7" and os.getpid() != PARENT:
        os._exit(3)
    return square(item)


#: The read end of a pipe a child waits on before its first item (``gated``).
_gate: list[int] = []


def gated(item: str) -> tuple[str, int, int]:
    """``square``, but a child waits until the test writes to the gate
    before it works on its first item (it reads no more items meanwhile)."""
    if os.getpid() != PARENT and _gate:
        os.read(_gate.pop(), 1)
    return square(item)


def _alone() -> bool:
    return True


class PoolTests(SynchronousTestCase):
    def pool(self, work=square, children: int = 2, min_items: int = 4) -> Pool:  # type: ignore[no-untyped-def]
        pool = Pool(work, children, min_items, alone=_alone)
        self.addCleanup(pool.close)
        return pool

    def assert_reaped(self, pids: list[int]) -> None:
        for pid in pids:
            self.assertRaises(ChildProcessError, os.waitpid, pid, os.WNOHANG)

    def test_results_are_the_work(self) -> None:
        """Every item's result, as the work gives it, whoever worked on it;
        each item once, however often it was submitted."""
        pool = self.pool()
        items = [str(n) for n in range(60)]
        for item in items + items[:10]:
            pool.submit(item)
        assert pool.forked
        pids = [child.pid for child in pool.children]
        found = pool.results()
        assert {k: v[:2] for k, v in found.items()} == {item: (item, int(item) ** 2) for item in items}
        # (Which process did which item depends on the scheduler: the
        # children from the first, this process from the last.)
        assert {v[2] for v in found.values()} <= {PARENT, *pids}
        self.assert_reaped(pids)

    def test_raising_items_are_missing(self) -> None:
        """An item whose work raised is not in the results: the caller does
        it again, and reports its error as it would without a pool."""
        pool = self.pool()
        items = [str(n) for n in range(20)] + ["bad1", "bad2"]
        for item in items:
            pool.submit(item)
        found = pool.results()
        assert set(found) == {str(n) for n in range(20)}

    def test_a_dead_child_costs_nothing(self) -> None:
        """A child that dies: this process does what it held."""
        pool = self.pool(dies, children=1)
        items = [str(n) for n in range(40)]
        for item in items:
            pool.submit(item)
        pids = [child.pid for child in pool.children]
        found = pool.results()
        assert set(found) == set(items)
        assert found["7"][2] == PARENT
        self.assert_reaped(pids)

    def test_few_items_fork_nothing(self) -> None:
        """Below ``min_items`` nothing is forked and the results are empty:
        the caller's own path does every item."""
        pool = self.pool(min_items=10)
        for n in range(9):
            pool.submit(str(n))
        assert not pool.forked
        assert pool.results() == {}

    def test_no_child_to_fork(self) -> None:
        """No CPU to spare (``for_this_machine`` on one CPU: no child
        wanted), or another thread running: nothing is forked."""
        self.patch(forked, "available_cpus", lambda: 1)
        single = Pool.for_this_machine(square, min_items=2)
        beside = Pool(square, 2, 2)  # (the default: no other thread may run)
        started = threading.Event()
        stop = threading.Event()
        thread = threading.Thread(target=lambda: (started.set(), stop.wait()))
        thread.start()
        self.addCleanup(thread.join)
        self.addCleanup(stop.set)
        started.wait()
        for n in range(10):
            single.submit(str(n))
            beside.submit(str(n))
        assert not single.forked and not beside.forked
        assert single.results() == {} and beside.results() == {}

    def test_close_without_results(self) -> None:
        """``close`` (the caller failed first) ends and reaps the children."""
        pool = self.pool()
        for n in range(30):
            pool.submit(str(n))
        pids = [child.pid for child in pool.children]
        assert pids
        pool.close()
        self.assert_reaped(pids)
        assert pool.results() == {}
        pool.submit("31")  # (taken no more)
        assert not pool.forked

    def test_items_after_the_fork(self) -> None:
        """Items submitted after the pool forked go to the children too."""
        pool = self.pool(children=1, min_items=2)
        pool.submit("1")
        pool.submit("2")
        assert pool.forked
        for n in range(3, 50):
            pool.submit(str(n))
        found = pool.results()
        assert set(found) == {str(n) for n in range(1, 50)}

    def test_more_items_than_a_pipe_holds(self) -> None:
        """Items beyond what a child's pipe holds wait here (``submit``
        never blocks) and are done by this process if no child took them."""
        gate, opener = os.pipe()
        self.addCleanup(os.close, gate)
        self.addCleanup(os.close, opener)
        _gate[:] = [gate]
        self.addCleanup(_gate.clear)
        pool = self.pool(work=gated, children=1)
        items = [str(n).rjust(200, "0") for n in range(12000)]  # (2.4 MB of names)
        for item in items:
            pool.submit(item)
        # (The child holds at most a read's 64 KB while it waits.)
        assert pool.children[0].unsent  # (the pipe is full)
        os.write(opener, b"x")
        found = pool.results()
        assert set(found) == set(items)
