"""The access log, written through a buffer.

twisted.web's default access log goes through the legacy logging system and
costs tens of microseconds per request; this writes each line into a buffered
file that is flushed at least once a second (and at shutdown), and reopens
the file on ``reopen()`` (SIGUSR1, for logrotate).  ``-`` means standard
output (systemd's journal).  Its lines (``[server] access_log_format``) are
made by :mod:`prexy.logformat`.
"""

from __future__ import annotations

import os
import sys
from typing import IO, Any

from prexy.logformat import clf_time, combined_record, line_maker


class AccessLog:
    """A buffered combined-format access log."""

    def __init__(self, reactor: Any, path: str, log_format: str = "combined") -> None:
        self.reactor = reactor
        self.path = path
        #: The line's maker; None: combined (the line made with its time string made once a second).
        self.make = line_maker(log_format)
        self._file: IO[bytes] | None = None
        self._second = -1
        self._when = b""
        self._flusher: Any = None
        self.open()

    def open(self) -> None:
        if self.path == "-":
            stdout: Any = sys.__stdout__
            self._file = open(os.dup(stdout.fileno()), "ab", buffering=65536)
        else:
            self._file = open(self.path, "ab", buffering=65536)

    def start(self) -> None:
        from twisted.internet.task import LoopingCall

        self._flusher = LoopingCall(self.flush)
        self._flusher.clock = self.reactor
        self._flusher.start(1.0, now=False)

    def log(self, request: Any) -> None:
        now = self.reactor.seconds()
        if self.make is not None:
            assert self._file is not None
            self._file.write(self.make(request, now))
            return
        second = int(now)
        if second != self._second:
            self._second = second
            self._when = clf_time(second).encode("ascii")
        assert self._file is not None
        self._file.write(combined_record(request, self._when))

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def reopen(self) -> None:
        """Close and reopen the file (after logrotate moved it)."""
        self.close()
        self.open()

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            self._file.close()
            self._file = None

    def stop(self) -> None:
        if self._flusher is not None and self._flusher.running:
            self._flusher.stop()
        self.close()
