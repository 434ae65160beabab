"""The access log's lines (pure: no Twisted): combined (nginx's and
Apache's), JSON lines, or a format of nginx's ``log_format`` variables
(``FORMAT_VARIABLES``) compiled once (:func:`compile_format`); and the
budget of log lines an outsider can cause (:class:`LogBudget`).
:mod:`prexy.accesslog` writes them.
"""


from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

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


def _header(name: bytes) -> Callable[[Any, float], bytes]:
    def value(request: Any, now: float) -> bytes:
        values = request.requestHeaders.getRawHeaders(name)
        return _escape(values[0]) if values else b"-"

    return value


def _client(request: Any, now: float) -> bytes:
    host = getattr(request.getClientAddress(), "host", None)
    return host.encode("ascii", "backslashreplace") if host else b"-"


def _protocol(request: Any) -> bytes:
    proto: bytes = request.clientproto
    return b"HTTP/2.0" if proto == b"HTTP/2" else _escape(proto)


def _seconds(value: float | None) -> bytes:
    return b"%.3f" % value if value is not None else b"-"


def _rules(request: Any) -> bytes:
    transducer = request.rewrite
    if transducer is None or not transducer.rules_matched:
        return b"-"
    return b",".join(b"%d" % (i + 1) for i in sorted(transducer.rules_matched))


def iso_time(seconds: float) -> str:
    """``2026-12-05T03:04:05.123+00:00`` (UTC, milliseconds)."""
    t = time.gmtime(seconds)
    ms = int(seconds * 1000) % 1000
    return (f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
            f".{ms:03d}+00:00")


#: nginx's ``log_format`` variables Prexy writes (and its own):
#: name -> what it gives for (request, now).
FORMAT_VARIABLES: dict[str, Callable[[Any, float], bytes]] = {
    "remote_addr": _client,
    "remote_user": lambda r, now: b"-",
    "time_local": lambda r, now: clf_time(now)[1:-1].encode("ascii"),
    "time_iso8601": lambda r, now: iso_time(now).encode("ascii"),
    "msec": lambda r, now: b"%.3f" % now,
    "request": lambda r, now: b"%s %s %s" % (_escape(r.method), _escape(r.uri), _protocol(r)),
    "request_method": lambda r, now: _escape(r.method),
    "request_uri": lambda r, now: _escape(r.uri),
    "server_protocol": lambda r, now: _protocol(r),
    "status": lambda r, now: b"%d" % r.code,
    "body_bytes_sent": lambda r, now: b"%d" % r.sentLength,
    "http_referer": _header(b"referer"),
    "http_user_agent": _header(b"user-agent"),
    "host": _header(b"host"),
    "site": lambda r, now: _escape(r.site_name.encode("utf-8", "backslashreplace")),
    "request_time": lambda r, now: b"%.3f" % max(0.0, now - r.started),
    "upstream_header_time": lambda r, now: _seconds(r.upstream_seconds),
    "upstream_cache_status": lambda r, now: r.cache_status.upper().encode("ascii") if r.cache_status != "-" else b"-",
    "upstream_bytes_received": lambda r, now: b"%d" % r.bytes_in,
    "prexy_rules": lambda r, now: _rules(r),
    "prexy_rewrite_time": lambda r, now: _seconds(r.rewrite.scan_seconds if r.rewrite is not None else None),
}
_VARIABLE = re.compile(r"\$(?:\{([a-z0-9_]+)\}|([a-z0-9_]+))")


class FormatError(ValueError):
    """A log format that cannot be compiled (the configuration says where)."""


def compile_format(text: str) -> Callable[[Any, float], bytes]:
    """The line maker of an nginx-style format (``$status``, ``${host}``,
    ``$http_NAME`` for any request header); a variable Prexy does not know
    raises :class:`FormatError` naming it."""
    pieces: list[bytes | Callable[[Any, float], bytes]] = []
    pos = 0
    for m in _VARIABLE.finditer(text):
        if m.start() > pos:
            pieces.append(text[pos : m.start()].encode("utf-8"))
        name = m.group(1) or m.group(2)
        getter = FORMAT_VARIABLES.get(name)
        if getter is None and name.startswith("http_"):
            getter = _header(name[len("http_") :].replace("_", "-").encode("ascii"))
        if getter is None:
            known = ", ".join("$" + k for k in sorted(FORMAT_VARIABLES))
            raise FormatError(f"unknown variable ${name} (known: {known}, and $http_NAME)")
        pieces.append(getter)
        pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:].encode("utf-8"))
    parts = tuple(pieces)

    def line(request: Any, now: float) -> bytes:
        return b"".join([p if isinstance(p, bytes) else p(request, now) for p in parts]) + b"\n"

    return line


#: The fields of a ``json`` line, in order.
JSON_FIELDS = (
    "time", "remote_addr", "site", "host", "method", "uri", "protocol", "status", "body_bytes_sent",
    "referer", "user_agent", "request_time", "upstream_header_time", "cache", "upstream_bytes_received",
    "rules", "rewrite_time",
)


def json_line(request: Any, now: float) -> bytes:
    """One JSON object and a newline (``JSON_FIELDS``; times in seconds
    with milliseconds, the timestamp ISO 8601 in UTC)."""
    headers = request.requestHeaders
    host = headers.getRawHeaders(b"host")
    referer = headers.getRawHeaders(b"referer")
    agent = headers.getRawHeaders(b"user-agent")
    address = getattr(request.getClientAddress(), "host", None)
    transducer = request.rewrite
    upstream = request.upstream_seconds
    record = {
        "time": iso_time(now),
        "remote_addr": address or "-",
        "site": request.site_name,
        "host": host[0].decode("latin-1") if host else None,
        "method": request.method.decode("latin-1"),
        "uri": request.uri.decode("latin-1"),
        "protocol": _protocol(request).decode("ascii"),
        "status": request.code,
        "body_bytes_sent": request.sentLength,
        "referer": referer[0].decode("latin-1") if referer else None,
        "user_agent": agent[0].decode("latin-1") if agent else None,
        "request_time": round(max(0.0, now - request.started), 3),
        "upstream_header_time": round(upstream, 3) if upstream is not None else None,
        "cache": request.cache_status,
        "upstream_bytes_received": request.bytes_in,
        "rules": [i + 1 for i in sorted(transducer.rules_matched)] if transducer is not None else [],
        "rewrite_time": round(transducer.scan_seconds, 3) if transducer is not None else None,
    }
    return json.dumps(record, ensure_ascii=True, separators=(",", ":")).encode("ascii") + b"\n"


def line_maker(log_format: str) -> Callable[[Any, float], bytes] | None:
    """What writes a line of ``log_format``: None for ``combined`` (the
    log's own fast path), :func:`json_line`, or a compiled format."""
    if log_format == "combined":
        return None
    if log_format == "json":
        return json_line
    return compile_format(log_format)
