"""The operator's views as text: the admin endpoint's JSON in, lines out.

Pure functions, no I/O: ``prexy log``'s line per request record
(:func:`format_record`), ``prexy top``'s screen from two ``/stats.json``
snapshots (:func:`render_top`), ``prexy hist``'s latency histogram
(:func:`render_hist`), the dry run's report (:func:`render_report`), and
the checks of the command-line filters (:func:`parse_status`,
:func:`check_regex`; durations and the error are :mod:`prexy.observe.tap`'s).  Rates are differences between
two snapshots of cumulative counters over the time between them; a counter
that went back (Prexy restarted) or a site or rule missing from the older
snapshot has no rate (``-``), never a made-up one.

Everything a client or an upstream controls (URLs, site names, patterns)
is printed with its control characters escaped: a URL holding an escape
sequence must not drive the operator's terminal.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any

import attrs

from prexy.observe.tap import FilterError, parse_duration

__all__ = [
    "FilterError",
    "Rates",
    "check_regex",
    "clean",
    "cut",
    "dropped_note",
    "duration_param",
    "format_record",
    "parse_duration",
    "parse_status",
    "rates",
    "render_hist",
    "render_report",
    "render_top",
]


# -- filters -----------------------------------------------------------------


def duration_param(seconds: float) -> str:
    """A duration as the admin endpoint's ``slower`` parameter: in ms."""
    return f"{seconds * 1000:.6f}".rstrip("0").rstrip(".") + "ms"


_STATUS = re.compile(r"([1-5])xx|([1-5]\d\d)")


def parse_status(text: str) -> str:
    """A status filter: a class (``5xx``) or one status (``404``), normalised."""
    value = text.strip().lower()
    if _STATUS.fullmatch(value) is None:
        raise FilterError(f"{text!r} is not a status filter (a class such as 5xx, or a status such as 404)")
    return value


def check_regex(text: str) -> str:
    """``text`` when it compiles as a regular expression."""
    try:
        re.compile(text)
    except re.error as exc:
        raise FilterError(f"{text!r} is not a regular expression: {exc}") from None
    return text


# -- text helpers --------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(value: Any) -> str:
    """``value`` as text on one line: control characters (escape sequences,
    newlines) written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def cut(text: str, width: int) -> str:
    """``text`` in ``width`` columns at most; a cut one ends with ``~``."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: width - 1] + "~"


def cut_left(text: str, width: int) -> str:
    """``text`` in ``width`` columns, its start cut (``~`` marks it): the end
    of a file's path says most."""
    if width <= 0:
        return ""
    return text if len(text) <= width else "~" + text[len(text) - width + 1 :]


def _ms(seconds: Any) -> str:
    """Seconds as milliseconds, ``-`` when unknown."""
    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
        return "-"
    ms = seconds * 1000
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


def _si(value: float) -> str:
    """A rate or count in few columns: 950, 12.3k, 4.5M, 1.2G."""
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.1f}" if value != int(value) else f"{int(value)}"


def _rate(value: float | None) -> str:
    return "-" if value is None else _si(round(value, 1))


def _clock(when: Any, tz: tzinfo | None, ms: bool = True) -> str:
    if not isinstance(when, int | float):
        return "--:--:--.---" if ms else "--:--:--"
    moment = datetime.fromtimestamp(when, tz)
    return moment.strftime("%H:%M:%S") + (f".{moment.microsecond // 1000:03d}" if ms else "")


# -- prexy log -------------------------------------------------------------------


def format_record(record: Mapping[str, Any], tz: tzinfo | None = None) -> str:
    """One request record (``/log``'s JSON) as one line::

        12:00:00.123 shop GET /a?b=1 200 miss upstream=12.3ms rewrite=2.10ms
            total=20.1ms in=20480 out=20511 rules=1,3 held=0 BAILOUT TIMEOUT

    (one line; the marks at the end only when set).  ``tz``: the clock's
    zone (the local one by default)."""
    rules = record.get("rules")
    rules = rules if isinstance(rules, list) else []
    parts = [
        _clock(record.get("time"), tz),
        clean(record.get("site", "-")),
        clean(record.get("method", "-")),
        clean(record.get("url", "-")),
        clean(record.get("status", "-")),
        clean(record.get("cache", "-")),
        f"upstream={_ms(record.get('upstream_first_byte'))}ms",
        f"rewrite={_ms(record.get('rewrite'))}ms",
        f"total={_ms(record.get('total'))}ms",
        f"in={clean(record.get('bytes_in', '-'))}",
        f"out={clean(record.get('bytes_out', '-'))}",
        "rules=" + (",".join(clean(n) for n in rules) if rules else "-"),
        f"held={clean(record.get('held', 0))}",
    ]
    if record.get("bailout"):
        parts.append("BAILOUT")
    if record.get("timeout"):
        parts.append("TIMEOUT")
    return " ".join(parts)


def dropped_note(value: Mapping[str, Any]) -> str | None:
    """The note for a ``{"dropped": N}`` line of the stream, else None."""
    if set(value) == {"dropped"}:
        n = value["dropped"]
        return f"{clean(n)} record{'' if n == 1 else 's'} dropped: this reader fell behind"
    return None


# -- rates between two /stats.json snapshots -----------------------------------------


def _count(snapshot: Mapping[str, Any], *path: str) -> float:
    value: Any = snapshot
    for key in path:
        value = value.get(key, {}) if isinstance(value, Mapping) else {}
    return float(value) if isinstance(value, int | float) else 0.0


@attrs.frozen
class Rates:
    """Per-second rates between two snapshots (None: no rate to give)."""

    elapsed: float | None
    requests: float | None
    by_class: dict[str, float | None]
    cache: dict[str, float | None]
    bytes_out: float | None
    upstream_errors: float | None
    #: Hits among the interval's cache lookups, hits and misses (as the
    #: admin JSON's ``hit_rate``; passes and requests with no cache are
    #: not lookups); None without any.
    hit_rate: float | None


_CLASSES = ("2xx", "3xx", "4xx", "5xx")
_CACHE = ("hit", "miss", "pass")


def rates(prev: Mapping[str, Any] | None, cur: Mapping[str, Any]) -> Rates:
    """The rates between ``prev`` and ``cur`` (all None without ``prev``, or
    when time or the request count went back: another process answers)."""
    elapsed = _count(cur, "time") - _count(prev, "time") if prev is not None else 0.0
    if prev is None or elapsed <= 0 or _count(cur, "requests") < _count(prev, "requests"):
        return Rates(None, None, dict.fromkeys(_CLASSES), dict.fromkeys(_CACHE), None, None, None)

    def per_second(*path: str) -> float | None:
        delta = _count(cur, *path) - _count(prev, *path)
        return delta / elapsed if delta >= 0 else None

    cache = {k: per_second("cache", k) for k in _CACHE}
    hits, misses = cache["hit"], cache["miss"]
    looked = hits + misses if hits is not None and misses is not None else 0.0
    return Rates(
        elapsed,
        per_second("requests"),
        {k: per_second("by_class", k) for k in _CLASSES},
        cache,
        per_second("bytes_out"),
        per_second("upstream_errors"),
        hits / looked if hits is not None and looked > 0 else None,
    )


def _overall_hit_rate(cur: Mapping[str, Any]) -> float | None:
    looked = _count(cur, "cache", "hit") + _count(cur, "cache", "miss")
    return _count(cur, "cache", "hit") / looked if looked else None


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _rows_by_key(snapshot: Mapping[str, Any] | None, field: str, key: Any) -> dict[Any, Mapping[str, Any]]:
    rows = snapshot.get(field) if snapshot is not None else None
    if not isinstance(rows, list):
        return {}
    return {key(row): row for row in rows if isinstance(row, Mapping)}


def _delta_rate(row: Mapping[str, Any], old: Mapping[str, Any] | None, field: str, elapsed: float | None) -> float | None:
    if old is None or elapsed is None:
        return None
    delta = _count(row, field) - _count(old, field)
    return delta / elapsed if delta >= 0 else None


# -- prexy top ---------------------------------------------------------------


def _uptime(seconds: float) -> str:
    """``3d 04:05:06``, ``04:05:06``."""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {clock}" if days else clock


def render_top(
    prev: Mapping[str, Any] | None, cur: Mapping[str, Any], width: int = 80, height: int = 24,
    source: str = "", interval: float | None = None, tz: tzinfo | None = None,
) -> list[str]:
    """``prexy top``'s screen: totals and rates (the uptime too when the
    snapshot says when the server ``started``; the hit rate is hits among
    hits and misses, as the admin JSON's ``hit_rate``), then the sites by
    requests per second and the rules by matches per second, as many of
    each as ``height`` rows hold; no line longer than ``width``."""
    r = rates(prev, cur)
    every = f"  every {interval:g}s" if interval else ""
    started = cur.get("started")
    up = ""
    if isinstance(started, int | float) and not isinstance(started, bool):
        up = f"  up {_uptime(_count(cur, 'time') - started)}"
    head = [
        f"prexy top  {clean(source)}  {_clock(cur.get('time'), tz, ms=False)}{up}{every}".rstrip(),
        f"requests  {_rate(r.requests)}/s  total {_si(_count(cur, 'requests'))}"
        f"   hit rate {_percent(r.hit_rate)} (since start {_percent(_overall_hit_rate(cur))})",
        "cache/s   " + "  ".join(f"{k} {_rate(r.cache[k])}" for k in _CACHE),
        "status/s  " + "  ".join(f"{k} {_rate(r.by_class[k])}" for k in _CLASSES)
        + f"  upstream errors {_rate(r.upstream_errors)}",
        f"bytes out {_rate(r.bytes_out)}B/s  total {_si(_count(cur, 'bytes_out'))}B",
    ]
    if r.elapsed is None:
        head.append("(rates after the next poll)")
    lines = [cut(line, width) for line in head]

    prev_sites = _rows_by_key(prev, "sites", lambda row: row.get("site"))
    sites = []
    for row in _rows_by_key(cur, "sites", lambda row: row.get("site")).values():
        old = prev_sites.get(row.get("site"))
        req = _delta_rate(row, old, "requests", r.elapsed)
        hit = None
        if old is not None and req is not None:
            hits = _count(row, "hit") - _count(old, "hit")
            looked = hits + _count(row, "miss") - _count(old, "miss")
            hit = hits / looked if looked > 0 and hits >= 0 else None
        sites.append((req, hit, _delta_rate(row, old, "errors", r.elapsed),
                      _delta_rate(row, old, "bytes_out", r.elapsed), row))
    sites.sort(key=lambda s: (s[0] is not None, s[0] or 0.0, _count(s[4], "requests")), reverse=True)

    def rule_key(row: Mapping[str, Any]) -> tuple[Any, Any]:
        return (row.get("site"), row.get("number"))

    prev_rules = _rows_by_key(prev, "rules", rule_key)
    rules = []
    for row in _rows_by_key(cur, "rules", rule_key).values():
        old = prev_rules.get(rule_key(row))
        rules.append((_delta_rate(row, old, "matches", r.elapsed), _delta_rate(row, old, "responses", r.elapsed), row))
    rules.sort(key=lambda s: (s[0] is not None, s[0] or 0.0, _count(s[2], "matches")), reverse=True)

    # Rows left for the two tables: a blank line and a title each.
    room = height - len(lines) - 4
    if room < 2:
        return lines[: max(height, 1)]
    n_sites = min(len(sites), max(room // 2, room - len(rules)))
    n_rules = min(len(rules), room - n_sites)
    name_width = max(4, min(max((len(clean(s[4].get("site", ""))) for s in sites), default=4), max(8, width // 4)))

    lines.append("")
    lines.append(cut(f"{'SITE':<{name_width}} {'REQ/S':>8} {'HIT%':>7} {'ERR/S':>8} {'OUT B/S':>8} {'REQUESTS':>9}",
                     width))
    for req, hit, err, out, row in sites[:n_sites]:
        name = cut(clean(row.get("site", "-")), name_width)
        lines.append(cut(f"{name:<{name_width}} {_rate(req):>8} {_percent(hit):>7} {_rate(err):>8} "
                         f"{_rate(out):>8} {_si(_count(row, 'requests')):>9}", width))
    if not sites:
        lines.append("(no site has answered yet)")
    lines.append("")
    site_width = max(4, min(max((len(clean(s[2].get("site", ""))) for s in rules), default=4), max(8, width // 5)))
    title = f"{'RULE':>4} {'SITE':<{site_width}} {'MATCH/S':>8} {'RESP/S':>8} {'MATCHES':>9} FILE:LINE"
    lines.append(cut(title, width))
    for match, resp, row in rules[:n_rules]:
        left = (f"{clean(row.get('number', '-')):>4} {cut(clean(row.get('site', '-')), site_width):<{site_width}} "
                f"{_rate(match):>8} {_rate(resp):>8} {_si(_count(row, 'matches')):>9} ")
        where = f"{clean(row.get('file', '?'))}:{clean(row.get('line', '?'))}"
        lines.append(cut(left + cut_left(where, max(width - len(left), 12)), width))
    if not rules:
        lines.append("(no rule has matched yet)")
    return lines[:height]


# -- prexy hist -------------------------------------------------------------


def _bucket_counts(snapshot: Mapping[str, Any] | None, kind: str, n: int) -> list[float]:
    latency = snapshot.get("latency") if snapshot is not None else None
    values = latency.get(kind) if isinstance(latency, Mapping) else None
    if not isinstance(values, list) or len(values) != n:
        return [0.0] * n
    return [float(v) if isinstance(v, int | float) else 0.0 for v in values]


def _bound_label(bound: float | None) -> str:
    """A bucket's upper bound in ms (``+Inf`` for the last)."""
    if bound is None:
        return "+Inf"
    ms = bound * 1000
    return f"{ms:g}" if ms < 10000 else f"{ms / 1000:g}k"


def _nice_scale(peak: float, rows: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50... requests a row that fits
    ``peak`` in ``rows`` rows."""
    scale = 1
    while scale * rows < peak:
        for step in (2, 5 / 2, 2):
            scale = int(scale * step)
            if scale * rows >= peak:
                break
    return scale


def _percentile(counts: Sequence[float], bounds: Sequence[float], fraction: float) -> str:
    total = sum(counts)
    if total <= 0:
        return "-"
    running = 0.0
    for i, c in enumerate(counts):
        running += c
        if running >= fraction * total:
            return f"<={_bound_label(bounds[i])}ms" if i < len(bounds) else f">{_bound_label(bounds[-1])}ms"
    return "-"


def render_hist(
    prev: Mapping[str, Any] | None, cur: Mapping[str, Any], width: int = 80, height: int = 24,
    source: str = "", tz: tzinfo | None = None,
) -> list[str]:
    """``prexy hist``'s screen: the latency of the requests answered between
    the two snapshots (all since start without ``prev``), one column group
    per bucket of ``latency.bounds`` (log-spaced: the x axis is), hits drawn
    ``|`` above misses and passes ``#`` (as varnishhist draws them), the
    y axis scaled so the tallest bar fits ``height``."""
    latency = cur.get("latency")
    raw_bounds = latency.get("bounds") if isinstance(latency, Mapping) else None
    bounds = [float(b) for b in raw_bounds if isinstance(b, int | float)] if isinstance(raw_bounds, list) else []
    n = len(bounds) + 1
    hits = _bucket_counts(cur, "hit", n)
    misses = [a + b for a, b in zip(_bucket_counts(cur, "miss", n), _bucket_counts(cur, "pass", n), strict=True)]
    since = "since start"
    elapsed = _count(cur, "time") - _count(prev, "time") if prev is not None else 0.0
    if prev is not None and elapsed > 0:
        old_hits = _bucket_counts(prev, "hit", n)
        old_misses = [a + b for a, b in zip(_bucket_counts(prev, "miss", n), _bucket_counts(prev, "pass", n),
                                            strict=True)]
        d_hits = [a - b for a, b in zip(hits, old_hits, strict=True)]
        d_misses = [a - b for a, b in zip(misses, old_misses, strict=True)]
        if min(d_hits + d_misses, default=0) >= 0:  # else counters went back: show all since start
            hits, misses, since = d_hits, d_misses, f"last {elapsed:.1f}s"
    totals = [h + m for h, m in zip(hits, misses, strict=True)]
    total = sum(totals)
    every = " ".join(f"p{int(p * 100)} {_percentile(totals, bounds, p)}" for p in (0.5, 0.9, 0.99))
    head = [
        f"prexy hist  {clean(source)}  {_clock(cur.get('time'), tz, ms=False)}  {since}: {int(total)} requests",
        f"| {int(sum(hits))} hits   # {int(sum(misses))} misses and passes",
    ]
    rows = height - len(head) - 3  # the scale line, the axis and its labels
    if not bounds or rows < 2:
        head.append("(no latency histogram to show)" if not bounds else "(the terminal is too small)")
        return [cut(line, width) for line in head][:max(height, 1)]
    peak = max(totals, default=0.0)
    scale = _nice_scale(peak, rows)
    head.append(f"one row = {scale} request{'s' if scale != 1 else ''}   {every}")
    head = [cut(line, width) for line in head]

    gutter = len(str(scale * rows)) + 1
    column = max(1, min(12, (width - gutter - 1) // n))
    bar = max(1, column - 1)
    heights = []
    for h, m in zip(hits, misses, strict=True):
        tall = min(rows, math.ceil((h + m) / scale)) if h + m > 0 else 0
        low = min(tall, math.ceil(m / scale)) if m > 0 else 0
        if h > 0 and tall == low and tall < rows:
            tall += 1
        elif h > 0 and tall == low and low > 0:
            low -= 1
        heights.append((low, tall))
    lines = list(head)
    for level in range(rows, 0, -1):
        label = str(scale * level) if level in (rows, (rows + 1) // 2) else ""
        cells = []
        for low, tall in heights:
            ch = "#" if level <= low else "|" if level <= tall else " "
            cells.append(ch * bar + " " * (column - bar))
        lines.append(cut(f"{label:>{gutter - 1}} " + "".join(cells).rstrip(), width))
    lines.append(cut(" " * (gutter - 1) + "+" + "-" * (column * n), width))
    labels = [" "] * (gutter + column * n + 8)
    for i in range(n):
        text = _bound_label(bounds[i]) if i < len(bounds) else ">" + _bound_label(bounds[-1])
        start = gutter + i * column
        if all(c == " " for c in labels[max(0, start - 1): start + len(text)]):
            labels[start: start + len(text)] = list(text)
    lines.append(cut(("".join(labels).rstrip() + "  ms"), width))
    return lines


# -- prexy rules diff ----------------------------------------------------------


def _rule_table(rows: Any) -> list[str]:
    if not isinstance(rows, list) or not rows:
        return ["    (no rules)"]
    out = [f"    {'RULE':>4} {'OCCURRENCES':>11} {'PAGES':>5}  FILE:LINE  PATTERN"]
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        out.append(
            f"    {clean(row.get('number', '-')):>4} {clean(row.get('occurrences', 0)):>11} "
            f"{clean(row.get('pages', 0)):>5}  {clean(row.get('file', '?'))}:{clean(row.get('line', '?'))}  "
            f"{clean(row.get('pattern', ''))}"
        )
    return out


def render_report(report: Mapping[str, Any]) -> str:
    """A dry run's JSON report (``POST /sites/NAME/dry-run``) as text."""
    lines = [
        f"dry run on site {clean(report.get('site', '?'))}: {clean(report.get('pages', 0))} pages asked, "
        f"{clean(report.get('fetched', 0))} fetched, {clean(report.get('changed', 0))} changed by the draft"
    ]
    failed = report.get("failed") or []
    if failed:
        lines.append("not fetched: " + ", ".join(
            f"{clean(f.get('url', '?'))} ({clean(f.get('error', '?'))})" for f in failed if isinstance(f, Mapping)))
    rules = report.get("rules")
    rules = rules if isinstance(rules, Mapping) else {}
    never = report.get("never_matching")
    never = never if isinstance(never, Mapping) else {}
    for side in ("current", "draft"):
        lines.append("")
        lines.append(f"{side} rules:")
        lines.extend(_rule_table(rules.get(side)))
        numbers = never.get(side) or []
        lines.append("    matching nothing: " + (", ".join(clean(n) for n in numbers) if numbers else "none"))
    diffs = report.get("diffs") or []
    if diffs:
        lines.append("")
        lines.append("first differences:")
        for diff in diffs:
            if not isinstance(diff, Mapping):
                continue
            lines.append(f"  {clean(diff.get('url', '?'))}")
            lines.extend(f"    {clean(line)}" for line in diff.get("lines") or [])
    return "\n".join(lines) + "\n"

