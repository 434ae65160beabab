"""The admin endpoint's HTML pages: one site's rules, cache and latency
(``site_page``, from the report of ``GET /sites/NAME.json``) and the list
of sites (``sites_index``, from the ``sites`` list of ``GET /stats.json``).

A page is one self-contained HTML5 document in UTF-8: its style inline,
its charts inline SVG drawn here, no script, no external asset at all.  It
carries a Content-Security-Policy that allows nothing but its own style
sheet (by hash) and ``data:`` images, so a browser refuses anything else
even if text got through unescaped.  The markup is also well-formed XML
(XHTML-compatible: every element closed, every attribute quoted), which
lets a test parse a whole page with an XML parser.

Every value from a report is escaped: rule patterns, URLs and site names
are operator or visitor text.  Control and bidirectional-formatting
characters are shown as escapes (``\\x01``, ``\\u202e``), never passed on.

Pure: no Twisted; the admin resource answers with what these return.
"""

from __future__ import annotations

import base64
import hashlib
import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

__all__ = [
    "CONTENT_SECURITY_POLICY",
    "INDEX_PATH",
    "site_page",
    "sites_index",
]

#: Where the list of sites is served; each site's page is under it.
INDEX_PATH = "/sites"

#: The cache classes of the latency histogram, in drawing order.
SERIES = ("hit", "miss", "pass")

_STYLE = """
:root{--fg:#1b1f24;--muted:#5b6470;--bg:#fff;--panel:#f5f7fa;--line:#d7dce2;
--hit:#1f77b4;--miss:#ff7f0e;--pass:#7f7f7f;--warn:#b3261e;--never:#fff4d6;--never-edge:#c98a00}
@media (prefers-color-scheme:dark){:root{--fg:#e6e9ed;--muted:#9aa4af;--bg:#15181c;
--panel:#1e2329;--line:#333b44;--never:#3a3120;--never-edge:#d9a420;--warn:#ff8a80}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1200px;padding:16px 24px 48px;color:var(--fg);background:var(--bg);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 24px;border-bottom:1px solid var(--line);
padding-bottom:8px}
h1{font-size:22px;margin:0}
h2{font-size:17px;margin:28px 0 8px}
nav a{margin-right:12px}
a{color:var(--hit)}
.muted,.generated{color:var(--muted)}
code,.mono{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:13px}
code{overflow-wrap:anywhere}
.stats{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:10px;margin:14px 0 0}
.stat{background:var(--panel);border:1px solid var(--line);border-radius:6px;padding:8px 12px}
.stat .label{display:block;color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.stat .value{display:block;font-size:20px;white-space:nowrap;font-variant-numeric:tabular-nums}
.stat .sub{display:block;color:var(--muted);font-size:12px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{border-bottom:1px solid var(--line);padding:5px 8px;text-align:left;vertical-align:top}
th{background:var(--panel);font-weight:600;white-space:nowrap}
td.n,th.n{text-align:right;white-space:nowrap}
tr.never-matched td{background:var(--never)}
tr.never-matched td:first-child{box-shadow:inset 4px 0 0 var(--never-edge)}
.badge{display:inline-block;margin:2px 0 0;padding:0 6px;border-radius:9px;font-size:11px;
white-space:nowrap;border:1px solid var(--never-edge);color:var(--fg)}
td.warn,.warn{color:var(--warn);font-weight:600}
td.origin{white-space:nowrap}
td.empty{color:var(--muted);text-align:center;padding:14px}
.when small{display:block;color:var(--muted)}
svg{display:block;max-width:100%;height:auto}
svg#latency{width:100%}
svg text{fill:var(--fg);font:11px system-ui,"DejaVu Sans",sans-serif}
svg .axis{stroke:var(--fg);stroke-width:1}
svg .grid{stroke:var(--line);stroke-width:1}
svg .hit{fill:var(--hit)}
svg .miss{fill:var(--miss)}
svg .pass{fill:var(--pass)}
svg .empty{fill:var(--line)}
svg .spark-bg{fill:var(--line)}
svg text.empty-note{fill:var(--muted);font-size:16px}
.swatch{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
.swatch.hit{background:var(--hit)}
.swatch.miss{background:var(--miss)}
.swatch.pass{background:var(--pass)}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:24px}
@media (max-width:800px){.cols{grid-template-columns:1fr}}
footer{margin-top:32px;color:var(--muted);font-size:12px}
"""

_STYLE_HASH = base64.b64encode(hashlib.sha256(_STYLE.encode("utf-8")).digest()).decode("ascii")

#: The policy a page carries in its ``<meta>``: its own style sheet and
#: ``data:`` images (the icon), nothing else: no script, no fetch, no form.
_META_POLICY = (
    f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; img-src data:; "
    "base-uri 'none'; form-action 'none'"
)

#: The same policy for a ``Content-Security-Policy`` response header, with
#: what only a header can say (no framing by another page).
CONTENT_SECURITY_POLICY = _META_POLICY + "; frame-ancestors 'none'"

# -- text ---------------------------------------------------------------------

#: Characters shown as escapes: C0 controls but tab and line feed, DEL and
#: the C1 controls, the bidirectional formatting characters, lone
#: surrogates (which UTF-8 cannot carry).
_HIDDEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _show(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def esc(value: Any) -> str:
    """``value`` as HTML text (or a quoted attribute value): markup
    characters escaped, invisible or reordering characters shown."""
    return html.escape(_HIDDEN.sub(_show, str(value)), quote=True)


def _num(value: Any) -> float | None:
    """A report's number, or None for what is absent or not a number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def count(value: Any) -> str:
    """A count with its thousands grouped (``1,234,567``); an em dash for
    what is absent."""
    n = _num(value)
    if n is None:
        return "—"
    if isinstance(n, float) and not n.is_integer():
        return f"{n:,.2f}"
    return f"{int(n):,}"


def compact(value: float) -> str:
    """A count in at most four characters or so, for chart axes (``950``,
    ``12k``, ``1.5M``)."""
    n = float(value)
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.3g}" if not n.is_integer() else f"{int(n)}"


def size(value: Any) -> str:
    """A byte count in binary units (``512 B``, ``1.2 MiB``)."""
    n = _num(value)
    if n is None:
        return "—"
    if abs(n) < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if abs(n) < 100 else f"{n:,.0f} {unit}"
    raise AssertionError("unreachable")


def duration(value: Any) -> str:
    """Seconds, in the unit that reads best (``830 µs``, ``12.3 ms``,
    ``4.25 s``, ``3 min 20 s``, ``5 h 02 min``)."""
    s = _num(value)
    if s is None:
        return "—"
    if s == 0:
        return "0 s"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 60:
        return f"{s:.3g} s"
    if s < 3600:
        m, rest = divmod(int(round(s)), 60)
        return f"{m} min {rest:02d} s"
    h, rest = divmod(int(round(s)) // 60, 60)
    return f"{h:,} h {rest:02d} min"


def percent(ratio: float | None) -> str:
    if ratio is None:
        return "—"
    return f"{ratio * 100:.1f} %"


def _ratio(part: Any, whole: Any) -> float | None:
    p, w = _num(part), _num(whole)
    if p is None or w is None or w <= 0:
        return None
    return p / w


def absolute(t: float) -> str:
    """A UNIX time as ``2026-12-05 02:51:07 UTC``."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(t: float, now: float) -> str:
    """How long before ``now`` the time ``t`` was (``just now``,
    ``12 s ago``, ``3 min ago``, ``5 h ago``, ``2 d ago``)."""
    d = now - t
    if d < 1:
        return "just now" if d > -1 else "in the future"
    if d < 60:
        return f"{int(d)} s ago"
    if d < 3600:
        return f"{int(d // 60)} min ago"
    if d < 86400:
        return f"{int(d // 3600)} h ago"
    return f"{int(d // 86400):,} d ago"


def _utc(t: float) -> datetime | None:
    """``t`` as a UTC datetime, or None when no calendar holds it."""
    try:
        return datetime.fromtimestamp(t, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def _when(t: Any, now: float | None, never: str = "never") -> str:
    """A ``<time>``: relative to ``now`` with the absolute time below it
    (only the time of day when it is the same day as ``now``)."""
    t = _num(t)
    if t is None:
        return f'<span class="muted">{esc(never)}</span>'
    stamp = _utc(t)
    if stamp is None:  # beyond the calendar: show the number
        return f'<span class="muted">{esc(t)}</span>'
    iso = stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    full = absolute(t)
    today = _utc(now) if now is not None else None
    if now is None or today is None:
        return f'<time datetime="{iso}">{esc(full)}</time>'
    same_day = today.date() == stamp.date()
    short = stamp.strftime("%H:%M:%S UTC") if same_day else full
    return f'<time datetime="{iso}" title="{esc(full)}">{esc(ago(t, now))}<small>{esc(short)}</small></time>'


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def site_href(name: Any) -> str:
    """The path of a site's page (its name percent-encoded whole)."""
    return f"{INDEX_PATH}/{quote(str(name), safe='')}"


# -- the document ---------------------------------------------------------------


def _document(title: str, body: Iterable[str]) -> bytes:
    head = (
        "<!DOCTYPE html>\n"
        '<html xmlns="http://www.w3.org/1999/xhtml" lang="en">\n<head>\n'
        '<meta charset="utf-8" />\n'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(_META_POLICY)}" />\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1" />\n'
        '<meta name="color-scheme" content="light dark" />\n'
        '<meta name="referrer" content="no-referrer" />\n'
        '<link rel="icon" href="data:," />\n'
        f"<title>{esc(title)}</title>\n"
        f"<style>{_STYLE}</style>\n"
        "</head>\n<body>\n"
    )
    return (head + "".join(body) + "</body>\n</html>\n").encode("utf-8")


def _stat(ident: str, label: str, value: str, sub: str = "", title: str = "") -> str:
    tip = f' title="{esc(title)}"' if title else ""
    extra = f'<span class="sub">{sub}</span>' if sub else ""
    return (
        f'<div class="stat" id="stat-{ident}"{tip}><span class="label">{esc(label)}</span>'
        f'<span class="value">{value}</span>{extra}</div>\n'
    )


def _summary(report: Mapping[str, Any]) -> str:
    requests = report.get("requests")
    rewritten = report.get("rewritten")
    cache = _map(report.get("cache"))
    upstream = report.get("upstream_seconds")
    rewrite = report.get("rewrite_seconds")
    errors = _map(report.get("errors_by_class"))
    # Answers with an error status; the other classes (an upstream
    # failure, answered with a 5xx too) are listed beside, not added.
    error_total = sum(
        n for n in (_num(v) for k, v in errors.items() if str(k).endswith("xx")) if n is not None
    )
    mean_upstream = _ratio(upstream, requests)
    mean_rewrite = _ratio(rewrite, rewritten)
    rewritten_share = _ratio(rewritten, requests)
    hit_rate = _num(cache.get("hit_rate"))
    error_parts = " · ".join(f"{esc(name)} {esc(count(n))}" for name, n in errors.items()) or "none"
    cells = [
        _stat("requests", "Requests", esc(count(requests))),
        _stat(
            "rewritten", "Rewritten", esc(count(rewritten)),
            f"{esc(percent(rewritten_share))} of requests" if rewritten_share is not None else "",
        ),
        _stat(
            "hit-rate", "Cache hit rate", esc(percent(hit_rate)),
            f"{esc(count(cache.get('hit')))} hits · {esc(count(cache.get('miss')))} misses",
        ),
        _stat(
            "bytes-out", "Bytes out", esc(size(report.get("bytes_out"))),
            f"{esc(size(report.get('bytes_in')))} in from upstream" if "bytes_in" in report else "",
            f"{count(report.get('bytes_out'))} bytes",
        ),
        _stat(
            "upstream", "Upstream time", esc(duration(upstream)),
            f"{esc(duration(mean_upstream))} mean per request" if mean_upstream is not None else "",
        ),
        _stat(
            "rewrite", "Rewrite time", esc(duration(rewrite)),
            f"{esc(duration(mean_rewrite))} mean per rewritten response" if mean_rewrite is not None else "",
        ),
        _stat("errors", "Error answers", esc(count(error_total)), error_parts),
    ]
    return '<section id="summary" class="stats">\n' + "".join(cells) + "</section>\n"


def _cache_total(cache: Mapping[str, Any]) -> int:
    return int(sum(n for n in (_num(cache.get(k)) for k in ("hit", "miss", "pass")) if n is not None))


# -- rules ------------------------------------------------------------------------


def _spark(value: Any, top: float) -> str:
    """A small bar of ``value`` against ``top``, beside a count."""
    n = _num(value) or 0
    width = max(1.0, 48 * n / top) if n > 0 and top > 0 else 0.0  # one match still shows
    return (
        '<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="48" height="6" '
        'viewBox="0 0 48 6" aria-hidden="true">'
        '<rect class="spark-bg" x="0" y="2" width="48" height="2" />'
        f'<rect class="hit" x="0" y="0" width="{width:.1f}" height="6" /></svg>'
    )


def _rules(report: Mapping[str, Any], now: float | None) -> str:
    rules = [r for r in _list(report.get("rules")) if isinstance(r, Mapping)]
    never = {n for n in _list(report.get("never_matched")) if _num(n) is not None}
    window = report.get("window")
    files = _list(report.get("rule_sets"))
    window_words = f"the last {count(window)} rewritten responses" if _num(window) is not None else "the window"
    badge_words = f"never matched in the last {count(window)}" if _num(window) is not None else "never matched"
    top = max((_num(r.get("matches")) or 0 for r in rules), default=0)

    out = ['<section id="rules-section">\n<h2>Rules</h2>\n<p class="muted">']
    if rules:
        out.append(
            f"{esc(count(len(rules)))} rule{'s' if len(rules) != 1 else ''} "
            f"from {esc(count(len(files)))} file{'s' if len(files) != 1 else ''}; "
            f'<span id="never-count">{esc(count(len(never)))}</span> never matched in {esc(window_words)}.'
        )
    else:
        out.append("This site has no rules.")
    out.append("</p>\n")
    if files:
        out.append('<ol id="rule-sets" class="mono">')
        out.extend(f"<li>{esc(f)}</li>" for f in files)
        out.append("</ol>\n")
    out.append(
        '<table id="rules">\n<thead><tr><th class="n">#</th><th>file:line</th><th>pattern</th>'
        '<th>flags</th><th class="n">matches</th><th class="n">responses</th>'
        '<th class="n">bytes changed</th><th>last fired</th><th class="n">bail-outs</th>'
        '<th class="n">timeouts</th></tr></thead>\n<tbody>\n'
    )
    if not rules:
        out.append('<tr class="empty"><td class="empty" colspan="10">No rules.</td></tr>\n')
    for rule in rules:
        number = rule.get("number")
        origin = f"{rule.get('file', '?')}:{rule.get('line', '?')}"
        is_never = _num(number) is not None and number in never
        classes = "rule never-matched" if is_never else "rule"
        badge = (
            f'<br /><span class="badge never" title="no match in {esc(window_words)}">{esc(badge_words)}</span>'
            if is_never else ""
        )
        bailouts, timeouts = rule.get("bailouts"), rule.get("timeouts")
        out.append(
            f'<tr class="{classes}" data-number="{esc(number)}" data-origin="{esc(origin)}">'
            f'<td class="n number">{esc(number)}</td>'
            f'<td class="origin mono">{esc(origin)}</td>'
            f'<td class="pattern"><code>{esc(rule.get("pattern", ""))}</code>{badge}</td>'
            f'<td class="flags mono">{esc(rule.get("flags") or "")}</td>'
            f'<td class="n matches">{esc(count(rule.get("matches")))} {_spark(rule.get("matches"), top)}</td>'
            f'<td class="n responses">{esc(count(rule.get("responses")))}</td>'
            f'<td class="n bytes-changed" title="{esc(count(rule.get("bytes_changed")))} bytes">'
            f'{esc(size(rule.get("bytes_changed")))}</td>'
            f'<td class="when last-fired">{_when(rule.get("last_fired"), now)}</td>'
            f'<td class="n bailouts{" warn" if _num(bailouts) else ""}">{esc(count(bailouts))}</td>'
            f'<td class="n timeouts{" warn" if _num(timeouts) else ""}">{esc(count(timeouts))}</td>'
            "</tr>\n"
        )
    out.append("</tbody>\n</table>\n</section>\n")
    return "".join(out)


# -- latency ------------------------------------------------------------------------


def bound_label(bound: float) -> str:
    """A bucket bound (seconds) as the axis writes it: milliseconds below
    a second (``0.5``, ``2.5``, ``250``), seconds above (``2.5 s``)."""
    if bound < 1:
        return f"{bound * 1e3:.4g}"
    return f"{bound:.4g} s"


def bucket_range(bounds: Sequence[float], i: int) -> str:
    """Bucket ``i``'s range in words (``2.5–5 ms``, ``≤ 1 ms``, ``> 10 s``)."""
    if not bounds:
        return "all"
    if i == len(bounds):
        return f"> {duration(bounds[-1])}"
    if i == 0:
        return f"≤ {duration(bounds[0])}"
    return f"{duration(bounds[i - 1])} – {duration(bounds[i])}"


def _latency_data(report: Mapping[str, Any]) -> tuple[list[float], dict[str, list[int]]]:
    """The histogram's bounds and its counts per series, each with one
    count per bucket (``len(bounds) + 1``).  Raises ValueError when the
    report's lists do not fit together."""
    latency = _map(report.get("latency"))
    bounds_raw = _list(latency.get("bounds"))
    bounds = [_num(b) for b in bounds_raw]
    if any(b is None for b in bounds):
        raise ValueError(f"latency.bounds holds a value that is not a number: {bounds_raw!r}")
    clean = [float(b) for b in bounds if b is not None]
    if any(b <= a for a, b in zip(clean, clean[1:], strict=False)):
        raise ValueError(f"latency.bounds do not increase: {clean!r}")
    buckets = len(clean) + 1
    series: dict[str, list[int]] = {}
    for name in SERIES:
        raw = latency.get(name)
        if raw is None:
            series[name] = [0] * buckets
            continue
        counts = [_num(c) for c in _list(raw)]
        if len(counts) != buckets or any(c is None or c < 0 for c in counts):
            raise ValueError(
                f"latency.{name} must hold {buckets} counts (one per bound and +Inf), not {raw!r}"
            )
        series[name] = [int(c) for c in counts if c is not None]
    return clean, series


def count_axis(peak: float) -> tuple[int, int]:
    """The step between the count axis's grid lines (1, 2 or 5 times a
    power of ten, never below 1: counts are whole) and the axis's top, a
    multiple of the step at or above ``peak``, with four steps or so."""
    step = 1
    while True:
        for factor in (1, 2, 5):
            if step * factor * 4 >= peak:
                top = max(step * factor, math.ceil(peak / (step * factor)) * step * factor)
                return step * factor, top
        step *= 10


def quantile_bound(bounds: Sequence[float], counts: Sequence[int], q: float) -> str:
    """The upper bound of the bucket holding quantile ``q`` (``≤ 25 ms``,
    ``> 10 s``), or an em dash with no requests."""
    total = sum(counts)
    if total <= 0:
        return "—"
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if seen >= rank and n > 0:
            return f"≤ {duration(bounds[i])}" if i < len(bounds) else f"> {duration(bounds[-1])}" if bounds else "—"
    return "—"


#: The histogram's drawing area (SVG user units).
_W, _H = 960, 320
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 16, 34, 50


def latency_svg(bounds: Sequence[float], series: Mapping[str, Sequence[int]]) -> str:
    """The latency histogram: a group of bars per bucket (hits, misses,
    passes side by side), bucket bounds labelled in milliseconds along the
    bottom (buckets evenly spaced: the bounds are log-spaced, so the axis
    is too), counts up the left."""
    buckets = len(bounds) + 1
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    group = plot_w / buckets
    bar = group * 0.8 / len(SERIES)
    peak = max((max(series[s], default=0) for s in SERIES), default=0)
    step, ymax = count_axis(peak)
    base = _TOP + plot_h
    out = [
        f'<svg id="latency" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" '
        f'width="{_W}" height="{_H}" role="img" aria-labelledby="latency-title" '
        f'data-buckets="{buckets}" data-peak="{peak}">',
        '<title id="latency-title">Latency histogram: requests per total-time bucket, '
        "hits, misses and passes</title>",
    ]
    # Horizontal grid lines and count labels.
    for value in range(0, ymax + 1, step):
        y = base - plot_h * value / ymax
        out.append(f'<line class="grid" x1="{_LEFT}" y1="{y:.1f}" x2="{_W - _RIGHT}" y2="{y:.1f}" />')
        out.append(f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{esc(compact(value))}</text>')
    # The bars.
    for i in range(buckets):
        x0 = _LEFT + group * i + group * 0.1
        for j, name in enumerate(SERIES):
            n = series[name][i]
            h = plot_h * n / ymax
            if n > 0:
                h = max(h, 1.0)  # a single request still shows
            out.append(
                f'<rect class="bar {name}" data-series="{name}" data-bucket="{i}" data-count="{n}" '
                f'x="{x0 + j * bar:.1f}" y="{base - h:.1f}" width="{bar:.1f}" height="{h:.1f}">'
                f"<title>{esc(name)}, {esc(bucket_range(bounds, i))}: {esc(count(n))}</title></rect>"
            )
    # Axes and bucket bounds, at the edges between the groups.
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{base}" x2="{_W - _RIGHT}" y2="{base}" />')
    out.append(f'<line class="axis" x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{base}" />')
    edges = ["0", *(bound_label(b) for b in bounds), "∞"]
    for k, label in enumerate(edges):
        x = _LEFT + group * k
        out.append(f'<line class="axis" x1="{x:.1f}" y1="{base}" x2="{x:.1f}" y2="{base + 5}" />')
        anchor = "start" if k == 0 else "end" if k == len(edges) - 1 else "middle"
        out.append(f'<text class="bound" x="{x:.1f}" y="{base + 18}" text-anchor="{anchor}">{esc(label)}</text>')
    out.append(
        f'<text x="{_LEFT + plot_w / 2:.1f}" y="{_H - 8}" text-anchor="middle">'
        "total time, ms (bucket upper bounds, log-spaced)</text>"
    )
    # The legend.
    totals = {name: sum(series[name]) for name in SERIES}
    x = _LEFT
    for name in SERIES:
        out.append(f'<rect class="{name}" x="{x}" y="10" width="12" height="12" />')
        label = f"{name} ({count(totals[name])})"
        out.append(f'<text class="legend" x="{x + 17}" y="20">{esc(label)}</text>')
        x += 40 + 8 * len(label)
    if peak == 0:
        out.append(
            f'<text class="empty-note" x="{_LEFT + plot_w / 2:.1f}" y="{_TOP + plot_h / 2:.1f}" '
            'text-anchor="middle">no requests yet</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _latency(report: Mapping[str, Any]) -> str:
    bounds, series = _latency_data(report)
    rows = []
    for name in SERIES:
        counts = series[name]
        rows.append(
            f'<tr class="{name}"><td><span class="swatch {name}"></span>{esc(name)}</td>'
            f'<td class="n">{esc(count(sum(counts)))}</td>'
            + "".join(f'<td class="n">{esc(quantile_bound(bounds, counts, q))}</td>' for q in (0.5, 0.9, 0.99))
            + "</tr>\n"
        )
    buckets = "".join(
        f'<tr><td>{esc(bucket_range(bounds, i))}</td>'
        + "".join(f'<td class="n">{esc(count(series[name][i]))}</td>' for name in SERIES)
        + "</tr>\n"
        for i in range(len(bounds) + 1)
    )
    return (
        '<section id="latency-section">\n<h2>Latency</h2>\n'
        + latency_svg(bounds, series)
        + '<table id="latency-summary">\n<thead><tr><th>cache</th><th class="n">requests</th>'
        '<th class="n">p50</th><th class="n">p90</th><th class="n">p99</th></tr></thead>\n<tbody>\n'
        + "".join(rows)
        + "</tbody>\n</table>\n"
        '<details><summary>Counts per bucket</summary>\n<table id="latency-buckets">\n'
        '<thead><tr><th>total time</th><th class="n">hit</th><th class="n">miss</th>'
        '<th class="n">pass</th></tr></thead>\n<tbody>\n'
        + buckets
        + "</tbody>\n</table>\n</details>\n</section>\n"
    )


# -- cache and errors ------------------------------------------------------------


def _cache(report: Mapping[str, Any]) -> str:
    cache = _map(report.get("cache"))
    total = _cache_total(cache)
    rows = []
    bar = []
    x = 0.0
    for name in ("hit", "miss", "pass"):
        n = _num(cache.get(name))
        share = _ratio(n, total)
        rows.append(
            f'<tr class="{name}" data-count="{esc(count(n))}"><td><span class="swatch {name}"></span>'
            f'{esc(name)}</td><td class="n">{esc(count(n))}</td><td class="n">{esc(percent(share))}</td></tr>\n'
        )
        if share:
            bar.append(f'<rect class="{name}" x="{x:.2f}" y="0" width="{share * 400:.2f}" height="14" />')
            x += share * 400
    rows.append(
        f'<tr class="total"><th>total</th><td class="n">{esc(count(total))}</td><td class="n"></td></tr>\n'
        '<tr class="hit-rate"><th>hit rate <small class="muted">(hits / hits + misses)</small></th>'
        f'<td class="n" colspan="2">'
        f'{esc(percent(_num(cache.get("hit_rate"))))}</td></tr>\n'
    )
    if not bar:
        bar.append('<rect class="empty" x="0" y="0" width="400" height="14" />')
    return (
        '<section id="cache-section">\n<h2>Cache</h2>\n'
        '<svg id="cache-bar" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 400 14" width="400" '
        'height="14" aria-hidden="true">' + "".join(bar) + "</svg>\n"
        '<table id="cache">\n<thead><tr><th>answer</th><th class="n">requests</th>'
        '<th class="n">share</th></tr></thead>\n<tbody>\n' + "".join(rows) + "</tbody>\n</table>\n</section>\n"
    )


def _newest_first(error: Mapping[str, Any]) -> tuple[bool, float]:
    t = _num(error.get("time"))
    return (t is None, -(t or 0))


def _errors(report: Mapping[str, Any], now: float | None) -> str:
    errors = [e for e in _list(report.get("last_errors")) if isinstance(e, Mapping)]
    # Newest first; those without a time last, in the order given.
    errors.sort(key=_newest_first)
    out = [
        '<section id="errors-section">\n<h2>Last errors</h2>\n<table id="errors">\n'
        '<thead><tr><th>when</th><th class="n">status</th><th>kind</th><th>cache</th>'
        "<th>URL</th></tr></thead>\n<tbody>\n"
    ]
    if not errors:
        out.append('<tr class="empty"><td class="empty" colspan="5">No errors recorded.</td></tr>\n')
    for e in errors:
        status = e.get("status")
        cls = f"s{str(status)[:1]}xx" if _num(status) is not None else "s-"
        out.append(
            f'<tr class="error {esc(cls)}"><td class="when">{_when(e.get("time"), now, "—")}</td>'
            f'<td class="n status{" warn" if cls == "s5xx" else ""}">{esc(status if status is not None else "—")}</td>'
            f'<td class="kind">{esc(e.get("kind", "—"))}</td><td class="cache">{esc(e.get("cache", "—"))}</td>'
            f'<td class="url"><code>{esc(e.get("url", ""))}</code></td></tr>\n'
        )
    out.append("</tbody>\n</table>\n</section>\n")
    return "".join(out)


# -- pages ------------------------------------------------------------------------


def site_page(report: Mapping[str, Any]) -> bytes:
    """The HTML page of one site, from its JSON report (``GET
    /sites/NAME.json``): a summary, the rules table (never-matching rules
    marked), the latency histogram, the cache counters and the last
    errors.  Raises ValueError for a report whose latency lists do not
    fit together; other keys missing show as an em dash."""
    site = report.get("site", "?")
    generated = _num(report.get("generated"))
    latency = _latency(report)  # first: its ValueError before any work
    header = (
        f'<header><h1>Site <span id="site-name">{esc(site)}</span></h1>'
        f'<span class="generated">generated {_when(generated, None, "at an unknown time")}</span>'
        f'<nav><a href="{esc(INDEX_PATH)}">all sites</a>'
        f'<a href="{esc(site_href(site))}.json">JSON</a></nav></header>\n'
    )
    body = [
        header,
        _summary(report),
        _rules(report, generated),
        latency,
        '<div class="cols">\n',
        _cache(report),
        _errors(report, generated),
        "</div>\n",
        '<footer>Counters are cumulative since Prexy started; reload the page for new figures. '
        "Times are UTC.</footer>\n",
    ]
    return _document(f"{site} — Prexy", body)


def sites_index(sites: Sequence[Mapping[str, Any]], generated: float | None = None) -> bytes:
    """The list of sites (the ``sites`` of ``GET /stats.json``, highest
    requests first), each linked to its page."""
    rows = []
    for entry in sites:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("site", "?")
        hit, miss = entry.get("hit"), entry.get("miss")
        hits_and_misses = (_num(hit) or 0) + (_num(miss) or 0)
        errors = entry.get("errors")
        rows.append(
            f'<tr class="site" data-site="{esc(name)}"><td><a href="{esc(site_href(name))}">{esc(name)}</a></td>'
            f'<td class="n requests">{esc(count(entry.get("requests")))}</td>'
            f'<td class="n hit">{esc(count(hit))}</td><td class="n miss">{esc(count(miss))}</td>'
            f'<td class="n hit-rate">{esc(percent(_ratio(hit, hits_and_misses)))}</td>'
            f'<td class="n errors{" warn" if _num(errors) else ""}">{esc(count(errors))}</td>'
            f'<td class="n bytes-out" title="{esc(count(entry.get("bytes_out")))} bytes">'
            f'{esc(size(entry.get("bytes_out")))}</td></tr>\n'
        )
    if not rows:
        rows.append('<tr class="empty"><td class="empty" colspan="7">No sites have had requests yet.</td></tr>\n')
    body = [
        '<header><h1>Sites</h1>'
        + (f'<span class="generated">generated {_when(generated, None)}</span>' if generated is not None else "")
        + "</header>\n",
        '<table id="sites">\n<thead><tr><th>site</th><th class="n">requests</th><th class="n">hits</th>'
        '<th class="n">misses</th><th class="n" title="hits / (hits + misses)">hit rate</th>'
        '<th class="n">errors</th><th class="n">bytes out</th></tr></thead>\n<tbody>\n',
        *rows,
        "</tbody>\n</table>\n",
        "<footer>Counters are cumulative since Prexy started. Times are UTC.</footer>\n",
    ]
    return _document("Sites — Prexy", body)
