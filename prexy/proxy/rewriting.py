"""The rewriting work of one worker process, shared fairly.

Every response being rewritten is a task of one ``task.Cooperator``: one
slice per step, steps of all tasks taken in turn, and at most WORK_BUDGET
of them per reactor turn (on the injected ``timer``), so light requests
never queue behind a heavy rewrite.  The tasks are
``prexy.proxy.forward.Exchange.slices``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet import task

from prexy.exchange import budget

#: The longest the rewriting of all responses may hold the reactor in one
#: turn before the other events get their turn (seconds).
WORK_BUDGET = 0.0003


class Rewriting:
    """The process's rewriting work: one ``task.Cooperator`` whose turns
    last at most WORK_BUDGET on ``timer`` and are scheduled on ``reactor``."""

    def __init__(self, reactor: Any, timer: Callable[[], float]) -> None:
        self.timer = timer
        self.cooperator = task.Cooperator(
            terminationPredicateFactory=lambda: budget(timer, WORK_BUDGET),
            scheduler=lambda work: reactor.callLater(0, work),
        )
        #: Responses with rewriting queued.
        self.busy = 0

    def start(self, exchange: Any) -> None:
        self.busy += 1
        exchange.task = self.cooperator.cooperate(exchange.slices())

        def over(result: object) -> None:
            self.busy -= 1
            exchange.work_drained()

        exchange.task.whenDone().addBoth(over)
