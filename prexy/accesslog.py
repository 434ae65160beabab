"""Access log in combined log format, written through a buffer.

twisted.web's default access log goes through the legacy logging system and
costs tens of microseconds per request; this writes each line into a buffered
file that is flushed at least once a second (and at shutdown), and reopens
the file on ``reopen()`` (SIGUSR1, for logrotate).  ``-`` means standard
output (systemd's journal).
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_SAFE = bytes(range(0x20, 0x7F)).replace(b'"', b"").replace(b"\\", b"")


def _escape(value: bytes) -> bytes:
    """Quote-safe, printable ASCII for a log field."""
    if value.translate(None, _SAFE):  # something outside the safe set
        out = []
        for byte in value:
            if 0x20 <= byte < 0x7F and byte not in (0x22, 0x5C):
                out.append(chr(byte))
            else:
                out.append(f"\\x{byte:02x}")
        return "".join(out).encode("ascii")
    return value


class LogBudget:
    """At most ``lines`` log lines per ``window`` seconds, for lines an
    outsider can cause (a refused request head): past that they are only
    counted, and the next line that may be written says how many were left
    out.  ``now`` is passed in."""

    def __init__(self, lines: int = 10, window: float = 1.0) -> None:
        self.lines = lines
        self.window = window
        self._window_start = float("-inf")
        self._used = 0
        self.suppressed = 0

    def take(self, now: float) -> int | None:
        """None: do not log.  Else log, and say how many lines were left
        out since the last one written."""
        if now - self._window_start >= self.window:
            self._window_start = now
            self._used = 0
        if self._used >= self.lines:
            self.suppressed += 1
            return None
        self._used += 1
        left_out, self.suppressed = self.suppressed, 0
        return left_out


def clf_time(seconds: float) -> str:
    """``[30/Nov/2026:04:22:05 +0000]`` for a UNIX time (UTC)."""
    t = time.gmtime(seconds)
    return f"[{t.tm_mday:02d}/{_MONTHS[t.tm_mon - 1]}/{t.tm_year}:{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} +0000]"


def combined_record(request: Any, when: bytes) -> bytes:
    """One combined-log-format line, newline included, for a finished
    request (ASCII: what is not printable is escaped)."""
    host = getattr(request.getClientAddress(), "host", None)
    proto = request.clientproto
    headers = request.requestHeaders
    referer = headers.getRawHeaders(b"referer")
    agent = headers.getRawHeaders(b"user-agent")
    sent = request.sentLength
    return b'%s - - %s "%s %s %s" %d %s "%s" "%s"\n' % (
        host.encode("ascii", "backslashreplace") if host else b"-", when,
        _escape(request.method), _escape(request.uri), b"HTTP/2.0" if proto == b"HTTP/2" else _escape(proto),
        request.code, b"%d" % sent if sent else b"-",
        _escape(referer[0]) if referer else b"-", _escape(agent[0]) if agent else b"-",
    )


def combined_line(request: Any, when: str) -> str:
    """:func:`combined_record` as text, without its newline."""
    return combined_record(request, when.encode("ascii")).decode("ascii")[:-1]


class AccessLog:
    """A buffered combined-format access log."""

    def __init__(self, reactor: Any, path: str) -> None:
        self.reactor = reactor
        self.path = path
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
