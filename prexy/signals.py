"""The signals a Prexy process answers, installed the same way by the master
(:mod:`prexy.workers`) and by a serving process (:mod:`prexy.service`).

Each handler only schedules its work on the reactor (``callFromThread`` is
safe from a signal handler).  SIGUSR1's default action would end the
process, so it is always handled; twistd's own SIGUSR1 handler, when it set
one (``--logfile FILE``: it rotates that file), still runs after ours."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

__all__ = ["install"]


def install(reactor: Any, reopen_logs: Callable[[], object], reload: Callable[[], object] | None = None) -> None:
    """SIGUSR1 calls ``reopen_logs`` on ``reactor``; with ``reload``, SIGHUP
    calls it (a worker has none: it reloads on its master's command)."""
    if reload is not None:
        signal.signal(signal.SIGHUP, lambda *_: reactor.callFromThread(reload))
    previous = signal.getsignal(signal.SIGUSR1)

    def on_usr1(signum: int, frame: Any) -> None:
        reactor.callFromThread(reopen_logs)
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGUSR1, on_usr1)
