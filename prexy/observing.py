"""The Twisted side of the operator's view (:mod:`prexy.observe`).

:class:`TapPump` runs in every serving process: while the live log has
readers it gives the process's ``Observer`` a tap with their filters and
hands its records on every tenth of a second; with none, there is no tap
and no timer.  :class:`OperatorView` is the admin endpoint's owner's part
(a pool's master, or a process alone): the sum of the processes'
counters (``Aggregate``) and the live log's readers (``LogHub``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.task import LoopingCall

from prexy.observe.stats import Aggregate, Observer
from prexy.observe.tap import LogFilter, LogHub, Tap

#: Seconds between two hand-overs of a process's tapped records.
PUMP_INTERVAL = 0.1

Deliver = Callable[[list[list[Any]], int], object]


class TapPump:
    """Taps ``observer`` while filters are set, and hands what it recorded
    to ``deliver(records, dropped)``."""

    def __init__(self, reactor: Any, observer: Observer, deliver: Deliver) -> None:
        self.reactor = reactor
        self.observer = observer
        self.deliver = deliver
        self._loop: LoopingCall | None = None

    def set_filters(self, filters: Sequence[LogFilter]) -> None:
        """Record what passes one of ``filters``; none: stop recording."""
        if filters:
            self.observer.tap = Tap(filters)
            if self._loop is None:
                self._loop = LoopingCall(self.pump)
                self._loop.clock = self.reactor
                self._loop.start(PUMP_INTERVAL, now=False)
            return
        self.pump()
        self.observer.tap = None
        if self._loop is not None:
            if self._loop.running:
                self._loop.stop()
            self._loop = None

    def pump(self) -> None:
        tap = self.observer.tap
        if tap is None:
            return
        records, dropped = tap.take()
        if records or dropped:
            self.deliver(records, dropped)

    def stop(self) -> None:
        self.set_filters(())


class OperatorView:
    """The counters summed over processes and the live log's readers, for
    the admin endpoint.  ``set_filters(filters)`` reaches the processes (a
    master sends them to its workers; a process alone taps itself) and
    may return a Deferred that fires once they all record with them."""

    def __init__(self, set_filters: Callable[[list[LogFilter]], Any], window: int, started: float) -> None:
        self.aggregate = Aggregate(window)
        self.aggregate.started = started
        self.hub = LogHub(set_filters)
