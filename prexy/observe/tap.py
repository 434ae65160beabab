"""The live request log (``prexy log``, ``GET /log`` on the admin endpoint).

Nothing is recorded while nobody reads: a process's ``Observer.tap`` is
None then.  While readers are attached, each process holds a
:class:`Tap` with the union of their filters: a finished request that
passes one of them becomes an entry in a bounded ring: what the filters
read of it (:func:`entry_of`), and its record as one JSON line (the
fields ``RECORD_FIELDS`` lists, made by formatting, not by a JSON encoder:
a record costs a few microseconds).  The process hands the ring on every
tenth of a second (a worker over its pipe to the master, whose readers
filter the entries again and write their lines).  A ring
that fills drops the oldest records and counts them; so does a reader
whose connection does not keep up (:class:`Reader`): memory never grows
with a slow reader.

Filters come from the query of ``GET /log`` (:func:`parse_filter`):
``site``, ``status`` (``5xx``, ``4xx``, ``404``...), ``slower``
(``200ms``, ``1.5s``), ``miss``, ``rule`` (a rule number), ``url`` (a
regex searched in the path and query).  Anything else is refused.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["FilterError", "LogFilter", "LogHub", "Reader", "Tap", "entry_of", "parse_filter", "record_of", "with_line"]

#: Records a process holds between two hand-overs at most.
RING = 2048
#: Records a reader's connection may have waiting at most.
READER_BACKLOG = 4096
#: The fields of a record, in order.
RECORD_FIELDS = (
    "time", "site", "method", "url", "status", "protocol", "client", "cache", "upstream_first_byte", "rewrite",
    "total", "bytes_in", "bytes_out", "rules", "held", "bailout", "timeout",
)
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(us|ms|s|m)", re.IGNORECASE)
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_STATUS = re.compile(r"^([1-5])(?:xx|XX)$|^([1-5]\d\d)$")
_KNOWN = frozenset(("site", "status", "slower", "miss", "rule", "url"))


class FilterError(ValueError):
    """A ``/log`` query that cannot be a filter (said to the reader, 400)."""


class LogFilter:
    """Which records a reader wants (every condition given must hold)."""

    __slots__ = ("miss", "rule", "site", "slower", "status_class", "status_code", "url")

    def __init__(
        self, site: str | None = None, status_class: int | None = None, status_code: int | None = None,
        slower: float | None = None, miss: bool = False, rule: int | None = None, url: str | None = None,
    ) -> None:
        self.site = site
        self.status_class = status_class
        self.status_code = status_code
        self.slower = slower
        self.miss = miss
        self.rule = rule
        self.url = re.compile(url) if url is not None else None

    def as_dict(self) -> dict[str, Any]:
        """The filter as JSON (what a master sends its workers)."""
        return {
            "site": self.site, "status_class": self.status_class, "status_code": self.status_code,
            "slower": self.slower, "miss": self.miss, "rule": self.rule,
            "url": self.url.pattern if self.url is not None else None,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LogFilter:
        return cls(d.get("site"), d.get("status_class"), d.get("status_code"), d.get("slower"),
                   bool(d.get("miss")), d.get("rule"), d.get("url"))

    def matches(self, entry: Sequence[Any]) -> bool:
        """Whether the record of ``entry`` (:func:`entry_of`) passes."""
        if self.site is not None and entry[SITE] != self.site:
            return False
        status = entry[STATUS]
        if self.status_class is not None and status // 100 != self.status_class:
            return False
        if self.status_code is not None and status != self.status_code:
            return False
        if self.slower is not None and entry[TOTAL] < self.slower:
            return False
        if self.miss and entry[CACHE] != "miss":
            return False
        if self.rule is not None and self.rule not in entry[RULES]:
            return False
        return not (self.url is not None and self.url.search(entry[URL]) is None)


def parse_filter(query: Mapping[str, Sequence[str]]) -> LogFilter:
    """The filter a ``/log`` query asks for; :class:`FilterError` says
    what is wrong with one that cannot be."""
    unknown = sorted(set(query) - _KNOWN)
    if unknown:
        raise FilterError(f"unknown parameter(s): {', '.join(unknown)} (known: {', '.join(sorted(_KNOWN))})")
    one: dict[str, str] = {}
    for name, values in query.items():
        if len(values) != 1:
            raise FilterError(f"{name} given {len(values)} times")
        one[name] = values[0]
    status_class = status_code = None
    if "status" in one:
        m = _STATUS.match(one["status"])
        if m is None:
            raise FilterError(f"status {one['status']!r}: expected a class (5xx) or a code (404)")
        if m.group(1):
            status_class = int(m.group(1))
        else:
            status_code = int(m.group(2))
    slower = None
    if "slower" in one:
        slower = parse_duration(one["slower"])
    miss = False
    if "miss" in one:
        if one["miss"] not in ("", "1", "true", "yes"):
            raise FilterError(f"miss {one['miss']!r}: expected 1")
        miss = True
    rule = None
    if "rule" in one:
        if not one["rule"].isdigit() or int(one["rule"]) < 1:
            raise FilterError(f"rule {one['rule']!r}: expected a rule number (1, 2, ...)")
        rule = int(one["rule"])
    url = one.get("url")
    if url is not None:
        try:
            re.compile(url)
        except re.error as exc:
            raise FilterError(f"url {url!r}: {exc}") from None
    return LogFilter(one.get("site") or None, status_class, status_code, slower, miss, rule, url)


def parse_duration(text: str) -> float:
    """Seconds for ``200ms``, ``1.5s``, ``500us`` or ``1m``: a unit is
    required (a bare ``200`` could mean either).  The server's ``slower=``
    and ``prexy log --slower`` read durations with this."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise FilterError(f"{text!r} is not a duration: expected a number with ms or s (200ms, 1.5s; us and m too)")
    return float(m.group(1)) * _UNIT[m.group(2).lower()]


#: An entry: what the filters read of a record, and the record's JSON line.
SITE, STATUS, TOTAL, CACHE, RULES, URL, LINE = range(7)

_string = json.encoder.encode_basestring_ascii
_LINE = (
    '{"time":%.3f,"site":%s,"method":%s,"url":%s,"status":%d,"protocol":%s,"client":%s,"cache":%s,'
    '"upstream_first_byte":%s,"rewrite":%s,"total":%.6f,"bytes_in":%d,"bytes_out":%d,"rules":[%s],"held":%d,'
    '"bailout":%s,"timeout":%s}'
)


def entry_of(request: Any, now: float) -> list[Any]:
    """What the filters read of a finished request: [site, status, total
    seconds, cache, rule numbers, url, None]; the record's line is made
    (:func:`with_line`) only for an entry a filter passes.  ``request``
    gives what ``prexy.observe.stats.Answered`` lists, and ``clientproto``
    and ``getClientAddress()``."""
    transducer = request.rewrite
    return [
        request.site_name, request.code, now - request.started, request.cache_status,
        [i + 1 for i in transducer.rules_matched] if transducer is not None else [],
        request.uri.decode("latin-1"), None,
    ]


def with_line(entry: list[Any], request: Any, now: float) -> list[Any]:
    """``entry`` with its record's JSON line (``RECORD_FIELDS``, ASCII)."""
    transducer = request.rewrite
    upstream = request.upstream_seconds
    proto = request.clientproto
    client = getattr(request.getClientAddress(), "host", None)
    entry[LINE] = _LINE % (
        now, _string(entry[SITE]), _string(request.method.decode("latin-1")), _string(entry[URL]), entry[STATUS],
        '"HTTP/2.0"' if proto == b"HTTP/2" else _string(proto.decode("latin-1")), _string(client or "-"),
        _string(entry[CACHE]), f"{upstream:.6f}" if upstream is not None else "null",
        f"{transducer.scan_seconds:.6f}" if transducer is not None else "null", entry[TOTAL], request.bytes_in,
        request.sentLength, ",".join(map(str, entry[RULES])), transducer.max_held if transducer is not None else 0,
        "true" if transducer is not None and transducer.bailed_out else "false",
        "true" if transducer is not None and transducer.timed_out else "false",
    )
    return entry


def record_of(request: Any, now: float) -> dict[str, Any]:
    """The live log's record of a finished request, as a reader gets it."""
    record: dict[str, Any] = json.loads(with_line(entry_of(request, now), request, now)[LINE])
    return record


class Tap:
    """A process's side of the live log while readers are attached: the
    union of their filters, and the ring of records that passed one."""

    def __init__(self, filters: Iterable[LogFilter], ring: int = RING) -> None:
        self.filters = list(filters)
        self.records: deque[list[Any]] = deque(maxlen=ring)
        self.dropped = 0

    def offer(self, request: Any, now: float) -> None:
        entry = entry_of(request, now)
        for f in self.filters:
            if f.matches(entry):
                records = self.records
                if len(records) == records.maxlen:
                    self.dropped += 1
                records.append(with_line(entry, request, now))
                return

    def take(self) -> tuple[list[list[Any]], int]:
        """The records held and how many were dropped since the last take."""
        records, self.records = list(self.records), deque(maxlen=self.records.maxlen)
        dropped, self.dropped = self.dropped, 0
        return records, dropped


class Reader:
    """One ``/log`` reader: its filter, and what its connection can take.
    ``write(bytes)`` sends; ``paused()`` says the connection is not keeping
    up, when records are dropped (and counted, and said in the next line
    sent: ``{"dropped": N}``)."""

    def __init__(self, log_filter: LogFilter, write: Callable[[bytes], object], paused: Callable[[], bool]) -> None:
        self.filter = log_filter
        self._write = write
        self._paused = paused
        self.dropped = 0

    def deliver(self, entries: Iterable[Sequence[Any]], dropped: int = 0) -> None:
        """Send the records this reader wants (``entries``: as ``Tap.take``
        gives them; ``dropped``: records lost before they reached here that
        this reader might have wanted)."""
        self.dropped += dropped
        matches = self.filter.matches
        lines = [entry[LINE] for entry in entries if matches(entry)]
        if not lines and not self.dropped:
            return
        if self._paused():
            self.dropped += len(lines)
            return
        if self.dropped:
            lines.insert(0, json.dumps({"dropped": self.dropped}))
            self.dropped = 0
        self._write(("\n".join(lines) + "\n").encode("utf-8"))


class LogHub:
    """The live log's readers in the process that serves ``/log``: each
    record goes to the readers that want it; ``filters_changed(filters)``
    is told the readers' filters whenever one comes or goes (none: nobody
    reads, nothing need be recorded)."""

    def __init__(self, filters_changed: Callable[[list[LogFilter]], Any]) -> None:
        self.readers: list[Reader] = []
        self.filters_changed = filters_changed

    def filters(self) -> list[LogFilter]:
        return [r.filter for r in self.readers]

    def attach(self, reader: Reader) -> Any:
        """Add ``reader``; what ``filters_changed`` answers (the owner's
        word that every process records for it)."""
        self.readers.append(reader)
        return self.filters_changed(self.filters())

    def detach(self, reader: Reader) -> None:
        if reader in self.readers:
            self.readers.remove(reader)
            self.filters_changed(self.filters())

    def deliver(self, entries: Sequence[Sequence[Any]], dropped: int = 0) -> None:
        for reader in list(self.readers):
            reader.deliver(entries, dropped)
