"""Per-site and per-rule counters: counted in each process, summed across them.

A process's :class:`Observer` is told of every finished request
(:meth:`Observer.answered`, which reads the request's own fields: see
:class:`Answered`) and of every finished rewrite (:meth:`Observer.rewritten`,
which reads the transducer's per-rule counts once per response, never per
match).  It keeps, per site, plain numbers and lists, and says which sites
changed since its last :meth:`Observer.report`: a worker sends that report
to its master every second, so what travels is bounded by the sites that
had traffic, not by the sites configured.

:class:`Aggregate` (the master's, or a single process's) keeps the last
report of each process and of the processes that ended, and answers the
views: a site's report (``/sites/NAME.json``), the live totals
(``/stats.json``) and the Prometheus families of the top sites.

Rules are numbered from 1 in their rule set's order (``RuleSet.rules``);
their counters are kept per rule set version (its ``digest``): a reload
that changes a site's rules starts them again.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

__all__ = [
    "Aggregate",
    "Answered",
    "LATENCY_BOUNDS",
    "NEVER_MATCHED_WINDOW",
    "Observer",
]

#: Upper bounds (seconds) of the total-time histograms; the last bucket
#: is +Inf.  From a cache hit (tenths of a millisecond) to a slow upstream.
LATENCY_BOUNDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
#: What a request was answered from, as the histograms and the cache
#: counts class it: hit (a hit, or a stale copy served in grace), miss
#: (fetched for the cache: a miss, a follower of one, stale-if-error),
#: pass (fetched without it: passed, hit-for-miss, or no cache at all).
LATENCY_CLASSES = ("hit", "miss", "pass")
_CLASS_OF = {
    "hit": 0, "grace": 0,
    "miss": 1, "collapsed": 1, "stale-if-error": 1,
}
#: A status code's class (index 1 for 1xx ... 5 for 5xx, 0 for the rest),
#: looked up (a status line's code has three digits).
_STATUS_CLASS = tuple(code // 100 if 100 <= code < 600 else 0 for code in range(1000))
#: Rules that have not fired in this many of the site's last rewritten
#: responses are listed as never matching.
NEVER_MATCHED_WINDOW = 1000
#: The last errors kept per site.
LAST_ERRORS = 10
#: Distinct URLs counted per site for its most requested ones (the dry
#: run's pages); past this, the least requested half is forgotten.
TOP_URLS = 256

_ZERO_LATENCY = len(LATENCY_BOUNDS) + 1


class Answered(Protocol):
    """What :meth:`Observer.answered` reads of a finished request (a
    ``ProxyRequest``, a hit answered on the connection, a refused head)."""

    site_name: str
    code: int
    sentLength: int  # noqa: N815 (twisted.web's name)
    cache_status: str
    started: float
    upstream_seconds: float | None
    bytes_in: int
    #: The transducer that rewrote the body, None when none ran.
    rewrite: Any
    method: bytes
    uri: bytes


class SiteCounters:
    """One site's counters in one process."""

    __slots__ = (
        "rewritten", "bytes_out", "bytes_in", "upstream_seconds", "upstream_count",
        "rewrite_seconds", "classes", "latency", "errors", "upstream_errors", "urls", "rewrite_latency",
        "latency_sums",
    )

    def __init__(self) -> None:
        #: Responses the site's rules ran on.
        self.rewritten = 0
        self.bytes_out = 0
        self.bytes_in = 0
        self.upstream_seconds = 0.0
        self.upstream_count = 0
        self.rewrite_seconds = 0.0
        #: Responses by status class: index 1 is 1xx ... 5 is 5xx (0: other).
        self.classes = [0] * 6
        #: Total-time histograms, one per ``LATENCY_CLASSES``.
        self.latency = [[0] * _ZERO_LATENCY for _ in LATENCY_CLASSES]
        self.errors: deque[dict[str, Any]] = deque(maxlen=LAST_ERRORS)
        self.upstream_errors = 0
        #: GET requests by URL, for the most requested ones (bounded).
        self.urls: dict[str, int] = {}
        #: Histogram of the rules' time per rewritten response.
        self.rewrite_latency = [0] * _ZERO_LATENCY
        #: The total-time histograms' sums (seconds).
        self.latency_sums = [0.0] * len(LATENCY_CLASSES)

    def as_list(self) -> list[Any]:
        """The counters as the report carries them: the requests and the
        cache results (what the latency histograms' classes count) made
        here from what ``Observer.answered`` counted."""
        return [
            sum(self.classes), self.rewritten, self.bytes_out, self.bytes_in, self.upstream_seconds,
            self.upstream_count, self.rewrite_seconds, list(self.classes),
            {kind: sum(counts) for kind, counts in zip(LATENCY_CLASSES, self.latency, strict=True)},
            [list(h) for h in self.latency], list(self.errors), self.upstream_errors,
            list(self.rewrite_latency), list(self.latency_sums),
        ]


class RuleCounters:
    """One site's per-rule counters in one process, for one version of its
    rule set.  Lists indexed by rule index (number - 1)."""

    __slots__ = (
        "digest", "labels", "rewritten", "matches", "responses", "bytes", "last", "fired_at", "bailouts", "timeouts",
    )

    def __init__(self, digest: str, labels: list[list[Any]]) -> None:
        n = len(labels)
        self.digest = digest
        #: Per rule: [file, line, pattern, flags].
        self.labels = labels
        #: Responses the rule set ran on (or would have: a rewrite skipped
        #: because no rule can match counts too).
        self.rewritten = 0
        self.matches = [0] * n
        self.responses = [0] * n
        self.bytes = [0] * n
        #: When each rule last fired (UNIX seconds; 0: never).
        self.last = [0.0] * n
        #: ``rewritten`` when each rule last fired (0: never).
        self.fired_at = [0] * n
        self.bailouts = [0] * n
        self.timeouts = [0] * n

    def as_dict(self, with_labels: bool) -> dict[str, Any]:
        out: dict[str, Any] = {
            "digest": self.digest, "rewritten": self.rewritten, "matches": list(self.matches),
            "responses": list(self.responses), "bytes": list(self.bytes), "last": list(self.last),
            "fired_at": list(self.fired_at), "bailouts": list(self.bailouts), "timeouts": list(self.timeouts),
        }
        if with_labels:
            out["labels"] = self.labels
        return out


def rule_labels(ruleset: Any) -> list[list[Any]]:
    """Per rule of ``ruleset``: [file, line, pattern, flags] (``origin`` is
    ``file:line``; a rule made without a file has file "" and line 0)."""
    labels: list[list[Any]] = []
    for rule in ruleset.rules:
        file, _, line = (rule.origin or "").rpartition(":")
        labels.append([file, int(line) if line.isdigit() else 0, rule.pattern.decode("latin-1"), rule.flags])
    return labels


class Observer:
    """One process's counters (see the module docstring).  ``tap``: where
    the records of the live request log go while someone reads it
    (``prexy.observe.tap``); None costs nothing."""

    def __init__(self) -> None:
        self.sites: dict[str, SiteCounters] = {}
        self.rules: dict[str, RuleCounters] = {}
        #: Sites whose rule counters changed since the last report (a
        #: site's own counters are compared with what was reported instead:
        #: nothing is marked per request).
        self.dirty: set[str] = set()
        self._reported: dict[str, int] = {}
        self.tap: Any = None
        # The rule sets whose labels went out in a report already.
        self._labelled: set[tuple[str, str]] = set()

    def _site(self, name: str) -> SiteCounters:
        counters = self.sites.get(name)
        if counters is None:
            counters = self.sites[name] = SiteCounters()
        return counters

    def answered(self, request: Answered, now: float) -> None:
        """A request finished (its answer's last byte was written).  Every
        request pays for this: what can be derived later (the requests,
        from the status classes; the cache results, from the histograms)
        is not counted here."""
        name = request.site_name
        s = self.sites.get(name)
        if s is None:
            s = self._site(name)
        code = request.code
        s.classes[_STATUS_CLASS[code]] += 1
        s.bytes_out += request.sentLength
        s.bytes_in += request.bytes_in
        took = now - request.started
        kind = _CLASS_OF.get(request.cache_status, 2)
        s.latency[kind][bisect_left(LATENCY_BOUNDS, took)] += 1
        s.latency_sums[kind] += took
        upstream = request.upstream_seconds
        if upstream is not None:
            s.upstream_seconds += upstream
            s.upstream_count += 1
        transducer = request.rewrite
        if transducer is not None:
            _rewritten_answer(s, request, transducer, code)
        if code >= 500:
            _error(s, request, code, now)
        if self.tap is not None:
            self.tap.offer(request, now)

    def rewritten(self, site_name: str, ruleset: Any, transducer: Any, now: float) -> None:
        """A response the site's rules ran on ended (``transducer``: the one
        that ran; None when the rewrite was skipped because no rule can
        match: the response counts, no rule fired)."""
        r = self.rules.get(site_name)
        digest = ruleset.digest
        if r is None or r.digest != digest:
            r = self.rules[site_name] = RuleCounters(digest, rule_labels(ruleset))
        r.rewritten += 1
        seq = r.rewritten
        self._site(site_name).rewritten += 1
        self.dirty.add(site_name)
        if transducer is None:
            return
        counts = transducer.rule_counts
        changed = transducer.rule_bytes
        matches, responses, replaced, last, fired_at = r.matches, r.responses, r.bytes, r.last, r.fired_at
        for rule in transducer.rules_matched:
            matches[rule] += counts[rule]
            responses[rule] += 1
            replaced[rule] += changed[rule]
            last[rule] = now
            fired_at[rule] = seq
        stopped = transducer.stopped_by
        if stopped is not None:
            if transducer.bailed_out:
                r.bailouts[stopped] += 1
            if transducer.timed_out:
                r.timeouts[stopped] += 1

    def report(self) -> dict[str, Any]:
        """The counters of the sites that changed since the last report
        (cumulative values: a lost report loses nothing)."""
        dirty, self.dirty = self.dirty, set()
        reported = self._reported
        for name, counters in self.sites.items():
            answered = sum(counters.classes)
            if reported.get(name) != answered:
                reported[name] = answered
                dirty.add(name)
        sites = {name: self.sites[name].as_list() for name in dirty if name in self.sites}
        rules: dict[str, Any] = {}
        for name in dirty:
            r = self.rules.get(name)
            if r is None:
                continue
            key = (name, r.digest)
            rules[name] = r.as_dict(key not in self._labelled)
            self._labelled.add(key)
        return {"sites": sites, "rules": rules}

    def top_urls(self, site_name: str, count: int) -> list[tuple[str, int]]:
        """The site's most requested URLs (rewritten GET 200s) here, most first."""
        s = self.sites.get(site_name)
        if s is None:
            return []
        return sorted(s.urls.items(), key=lambda kv: (-kv[1], kv[0]))[:count]


def _rewritten_answer(s: SiteCounters, request: Answered, transducer: Any, code: int) -> None:
    """The rewrite's time of an answer, and a rewritten page's URL among
    the most requested (the dry run's pages)."""
    spent = transducer.scan_seconds
    s.rewrite_seconds += spent
    s.rewrite_latency[bisect_left(LATENCY_BOUNDS, spent)] += 1
    if code == 200 and request.method == b"GET":
        urls = s.urls
        url = request.uri.decode("latin-1")
        urls[url] = urls.get(url, 0) + 1
        if len(urls) > TOP_URLS:
            _forget_half(urls)


def _error(s: SiteCounters, request: Answered, code: int, now: float) -> None:
    """An error answer among the site's last ones."""
    upstream = code in (502, 504) and request.upstream_seconds is None
    s.errors.append({
        "time": round(now, 3), "status": code, "url": request.uri.decode("latin-1"), "cache": request.cache_status,
        "kind": "upstream" if upstream else "status",
    })
    if upstream:
        s.upstream_errors += 1


def _forget_half(urls: dict[str, int]) -> None:
    """Keep the more requested half of ``urls`` (a bound on memory: a URL
    requested often comes back soon enough)."""
    keep = sorted(urls.items(), key=lambda kv: -kv[1])[: TOP_URLS // 2]
    urls.clear()
    urls.update(keep)


# -- the sum over processes ---------------------------------------------------


def _add_site(total: list[Any], part: Sequence[Any]) -> None:
    for i in range(7):
        total[i] += part[i]
    for i, v in enumerate(part[7]):
        total[7][i] += v
    cache = total[8]
    for k, v in part[8].items():
        cache[k] = cache.get(k, 0) + v
    for h, hv in zip(total[9], part[9], strict=True):
        for i, v in enumerate(hv):
            h[i] += v
    total[10].extend(part[10])
    total[11] += part[11]
    for i, v in enumerate(part[12]):
        total[12][i] += v
    for i, v in enumerate(part[13]):
        total[13][i] += v


def _empty_site() -> list[Any]:
    """What ``SiteCounters.as_list`` gives for a site with no traffic."""
    return [
        0, 0, 0, 0, 0.0, 0, 0.0, [0] * 6, {}, [[0] * _ZERO_LATENCY for _ in LATENCY_CLASSES], [], 0,
        [0] * _ZERO_LATENCY, [0.0] * len(LATENCY_CLASSES),
    ]


class RuleView:
    """One site's rule counters for one version of its rule set, summed
    over processes, with when (in the site's rewritten responses, over all
    processes) each rule last fired."""

    def __init__(self, digest: str, labels: list[list[Any]]) -> None:
        self.digest = digest
        self.labels = labels
        #: The last report of each process, and the sum of those that ended.
        self.parts: dict[Any, dict[str, Any]] = {}
        n = len(labels)
        self.retired: dict[str, Any] = {
            "rewritten": 0, "matches": [0] * n, "responses": [0] * n, "bytes": [0] * n, "last": [0.0] * n,
            "bailouts": [0] * n, "timeouts": [0] * n,
        }
        #: Per rule: the site's rewritten count (summed) when it last fired;
        #: -1: never.
        self.last_seq = [-1] * n

    def rewritten(self) -> int:
        return int(self.retired["rewritten"]) + sum(int(p["rewritten"]) for p in self.parts.values())

    def update(self, source: Any, part: dict[str, Any]) -> None:
        before = self.parts.get(source)
        self.parts[source] = part
        total = self.rewritten()
        fired_at = part["fired_at"]
        seen = before["fired_at"] if before is not None else None
        for rule, at in enumerate(fired_at):
            if at and (seen is None or seen[rule] != at):
                # It fired (rewritten - at) of this process's responses ago:
                # at least that many of the site's, so never later than this.
                self.last_seq[rule] = max(self.last_seq[rule], total - (int(part["rewritten"]) - at))

    def retire(self, source: Any) -> None:
        part = self.parts.pop(source, None)
        if part is None:
            return
        retired = self.retired
        retired["rewritten"] += part["rewritten"]
        for field in ("matches", "responses", "bytes", "bailouts", "timeouts"):
            for i, v in enumerate(part[field]):
                retired[field][i] += v
        for i, v in enumerate(part["last"]):
            retired["last"][i] = max(retired["last"][i], v)

    def summed(self) -> dict[str, Any]:
        n = len(self.labels)
        total: dict[str, Any] = {
            "matches": list(self.retired["matches"]), "responses": list(self.retired["responses"]),
            "bytes": list(self.retired["bytes"]), "last": list(self.retired["last"]),
            "bailouts": list(self.retired["bailouts"]), "timeouts": list(self.retired["timeouts"]),
        }
        for part in self.parts.values():
            for field in ("matches", "responses", "bytes", "bailouts", "timeouts"):
                values = part[field]
                column = total[field]
                for i in range(n):
                    column[i] += values[i]
            last = total["last"]
            for i, v in enumerate(part["last"]):
                if v > last[i]:
                    last[i] = v
        return total

    def never_matched(self, window: int) -> list[int]:
        """The numbers of the rules that fired in none of the site's last
        ``window`` rewritten responses (or never, when it had fewer)."""
        total = self.rewritten()
        span = min(window, total)
        return [i + 1 for i, seq in enumerate(self.last_seq) if seq < 0 or total - seq >= span > 0]


class Aggregate:
    """The counters of every process (see the module docstring).  A source
    is any hashable naming a process (a worker's pid, "self")."""

    def __init__(self, window: int = NEVER_MATCHED_WINDOW) -> None:
        self.window = window
        #: site -> source -> its last report of the site (``SiteCounters.as_list``).
        self.sites: dict[str, dict[Any, list[Any]]] = {}
        #: site -> the sum of the processes that ended.
        self.retired_sites: dict[str, list[Any]] = {}
        #: site -> digest -> its rule view; and the digest reported last.
        self.views: dict[str, dict[str, RuleView]] = {}
        self.current: dict[str, str] = {}
        self.started: float | None = None

    def update(self, source: Any, report: Mapping[str, Any]) -> None:
        """Take a process's report (``Observer.report``)."""
        for name, counters in report.get("sites", {}).items():
            self.sites.setdefault(name, {})[source] = counters
        for name, part in report.get("rules", {}).items():
            views = self.views.setdefault(name, {})
            digest = part["digest"]
            view = views.get(digest)
            if view is None:
                labels = part.get("labels")
                if labels is None:
                    continue  # the report that had them was lost; counted from the next process on
                view = views[digest] = RuleView(digest, labels)
            self.current[name] = digest
            for old in [d for d in views if d != digest]:
                # This process moved on from an older version of the rules:
                # what it counted there stays in that version's sums, and a
                # version nobody counts any more goes.
                views[old].retire(source)
                if not views[old].parts:
                    del views[old]
            view.update(source, part)

    def retire(self, source: Any) -> None:
        """A process ended: what it counted stays in the sums."""
        for name, parts in self.sites.items():
            counters = parts.pop(source, None)
            if counters is not None:
                _add_site(self.retired_sites.setdefault(name, _empty_site()), counters)
        for views in self.views.values():
            for view in views.values():
                view.retire(source)

    def site_total(self, name: str) -> list[Any]:
        total = _empty_site()
        retired = self.retired_sites.get(name)
        if retired is not None:
            _add_site(total, retired)
        for counters in self.sites.get(name, {}).values():
            _add_site(total, counters)
        return total

    def site_names(self) -> Iterable[str]:
        return self.sites.keys() | self.retired_sites.keys()

    def all_sites(self) -> list[Any]:
        """Every site's counters summed."""
        total = _empty_site()
        for name in self.site_names():
            _add_site(total, self.site_total(name))
        return total

    # -- the views ------------------------------------------------------------

    def site_report(self, name: str, now: float, rule_files: Sequence[str] = ()) -> dict[str, Any]:
        """``GET /sites/NAME.json`` (prexy/observe/README: the shape)."""
        t = self.site_total(name)
        cache = t[8]
        hit, miss, passed = cache.get("hit", 0), cache.get("miss", 0), cache.get("pass", 0)
        looked = hit + miss
        report: dict[str, Any] = {
            "site": name,
            "generated": round(now, 3),
            "rule_sets": list(rule_files),
            "rules": [],
            "never_matched": [],
            "window": self.window,
            "requests": t[0],
            "rewritten": t[1],
            "bytes_out": t[2],
            "bytes_in": t[3],
            "upstream_seconds": round(t[4], 6),
            "rewrite_seconds": round(t[6], 6),
            "errors_by_class": {"4xx": t[7][4], "5xx": t[7][5], "upstream": t[11]},
            "cache": {
                "hit": hit, "miss": miss, "pass": passed,
                "hit_rate": round(hit / looked, 4) if looked else None,
            },
            "latency": {"bounds": list(LATENCY_BOUNDS), **dict(zip(LATENCY_CLASSES, t[9], strict=True))},
            "last_errors": sorted(t[10], key=lambda e: e["time"])[-LAST_ERRORS:],
        }
        view = self.views.get(name, {}).get(self.current.get(name, ""))
        if view is not None:
            summed = view.summed()
            report["rules"] = [
                {
                    "number": i + 1, "file": label[0], "line": label[1], "pattern": label[2], "flags": label[3],
                    "matches": summed["matches"][i], "responses": summed["responses"][i],
                    "bytes_changed": summed["bytes"][i],
                    "last_fired": round(summed["last"][i], 3) if summed["last"][i] else None,
                    "bailouts": summed["bailouts"][i], "timeouts": summed["timeouts"][i],
                }
                for i, label in enumerate(view.labels)
            ]
            report["never_matched"] = view.never_matched(self.window)
        return report

    def stats(self, now: float, top: int = 50) -> dict[str, Any]:
        """``GET /stats.json``: totals, the top sites and the top rules."""
        totals = _empty_site()
        sites = []
        for name in self.site_names():
            t = self.site_total(name)
            _add_site(totals, t)
            cache = t[8]
            sites.append({
                "site": name, "requests": t[0], "hit": cache.get("hit", 0), "miss": cache.get("miss", 0),
                "errors": t[7][5], "bytes_out": t[2],
            })
        sites.sort(key=lambda s: (-s["requests"], s["site"]))
        rules = []
        for name, digest in self.current.items():
            view = self.views[name][digest]
            summed = view.summed()
            for i, label in enumerate(view.labels):
                rules.append({
                    "site": name, "number": i + 1, "file": label[0], "line": label[1],
                    "matches": summed["matches"][i], "responses": summed["responses"][i],
                })
        rules.sort(key=lambda r: (-r["matches"], r["site"], r["number"]))
        cache = totals[8]
        return {
            "time": round(now, 3),
            "started": round(self.started, 3) if self.started is not None else None,
            "requests": totals[0],
            "by_class": {f"{k}xx": totals[7][k] for k in range(1, 6)},
            "cache": {
                "hit": cache.get("hit", 0), "miss": cache.get("miss", 0), "pass": cache.get("pass", 0),
            },
            "bytes_out": totals[2],
            "upstream_errors": totals[11],
            "latency": {"bounds": list(LATENCY_BOUNDS), **dict(zip(LATENCY_CLASSES, totals[9], strict=True))},
            "sites": sites[:top],
            "rules": rules[:top],
        }

    def top_sites(self, k: int) -> tuple[list[tuple[str, list[Any]]], list[Any] | None]:
        """The ``k`` sites with the most requests and their totals, and the
        rest summed (None when there is no rest): what ``/metrics`` labels."""
        totals = [(name, self.site_total(name)) for name in self.site_names()]
        totals.sort(key=lambda nt: (-nt[1][0], nt[0]))
        head, rest = totals[:k], totals[k:]
        if not rest:
            return head, None
        other = _empty_site()
        for _, t in rest:
            _add_site(other, t)
        return head, other

    def rule_rows(self, names: Iterable[str]) -> list[tuple[str, int, list[Any], dict[str, Any], int]]:
        """Per rule of the sites ``names`` (their current rule sets): site,
        number, label, the summed counters and the rule's index."""
        rows = []
        for name in names:
            digest = self.current.get(name)
            if digest is None:
                continue
            view = self.views[name][digest]
            summed = view.summed()
            for i, label in enumerate(view.labels):
                rows.append((name, i + 1, label, summed, i))
        return rows
