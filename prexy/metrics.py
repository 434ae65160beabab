"""Counters and a latency histogram, rendered in Prometheus text format.

One ``Metrics`` per process; the admin endpoint renders it (and, with a
worker pool, the master sums what the workers report).  Pure Python, no
Twisted, cheap enough to touch on every request.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prexy.observe.stats import Aggregate

#: Upper bounds (seconds) of the upstream latency histogram buckets.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

HELP = {
    "prexy_requests_total": "Responses sent, by status code.",
    "prexy_upstream_errors_total": "Upstream failures, by kind (connect, timeout, error, mid-body).",
    "prexy_rewrite_bailouts_total": "Responses whose substitution stopped at max_buffered_size.",
    "prexy_rewrite_timeouts_total": "Responses whose substitution scan timed out.",
    "prexy_unknown_coding_total": "Responses the rules would rewrite that passed untouched: their content coding"
    " cannot be decoded, by coding.",
    "prexy_decode_errors_total": "Upstream bodies that failed to decode (corrupt or truncated; the client was reset),"
    " by coding.",
    "prexy_decode_trailing_garbage_total": "Upstream bodies with bytes after the end of their compressed stream"
    " (ignored; the body before them was served), by coding.",
    "prexy_map_hits_total": "Requests answered or rewritten by a URL map, by action.",
    "prexy_bytes_out_total": "Response body bytes written to clients.",
    "prexy_worker_restarts_total": "Worker processes restarted by the master.",
    "prexy_tls_on_demand_total": "Handshakes held for an on-demand certificate, by outcome (issued, refused,"
    " timed_out).",
    "prexy_cluster_published_total": "Invalidations (and reloads) this node added to the cluster's log, by kind.",
    "prexy_cluster_applied_total": "Invalidations (and reloads) of other nodes applied here, by kind.",
    "prexy_cluster_skipped_total": "Log entries not applied, by reason (own, seen, old-reload, malformed).",
    "prexy_cluster_queued_total": "Invalidations made while Redis was unreachable (published when it returns).",
    "prexy_cluster_outages_total": "Times this node lost Redis (one per outage, not per attempt).",
    "prexy_cluster_flushes_total": "Stores emptied because entries this node never read were trimmed.",
    "prexy_bytes_in_total": "Response body bytes received from upstreams.",
    "prexy_upstream_seconds": "Time to the upstream's response head (connect and first byte).",
    "prexy_cache_total": "Requests by what the cache did (hit, miss, pass, grace, collapsed, hit-for-miss,"
    " stale-if-error).",
    "prexy_requests_by_protocol_total": "Responses sent, by the client's protocol.",
    "prexy_rewrite_skipped_total": "Responses the rules would rewrite that passed untouched: no rule can match"
    " this version of the resource (the applicability memory).",
    "prexy_interim_responses_total": "1xx heads passed to clients, by status.",
    "prexy_tunnels_total": "Upgraded connections (WebSocket...) tunnelled to the upstream.",
    "prexy_tunnels_closed_total": "Tunnels ended, by who ended them.",
    "prexy_tunnel_bytes_total": "Bytes carried by tunnels, by direction.",
    "prexy_cache_compressed_total": "Cached objects stored compressed, by coding.",
    "prexy_cache_not_stored_total": "Answers not stored in the cache, by reason.",
    "prexy_cache_invalidations_total": "URLs invalidated by an unsafe method's answer.",
    "prexy_cache_purges_total": "PURGE requests that removed objects.",
    "prexy_cache_evictions_total": "Objects evicted from the cache store to make room (least recently used).",
    "prexy_cache_fetch_without_client_total": "Fetches that went on for the cache after their client left.",
    "prexy_cache_objects": "Objects in the cache store (shared by the workers).",
    "prexy_cache_bytes": "Bytes the cache store's pages use (what [cache] size bounds).",
    "prexy_cache_max_bytes": "The cache store's bound in bytes ([cache] size).",
    "prexy_memo_bytes": "Bytes each kind of memo holds ([cache] memo_size bounds their sum in each process): the"
    " store's objects decoded (objects), their compressed variants (variants), the hit path's answers (answers);"
    " summed over the processes.",
    "prexy_memo_max_bytes": "The memos' bound ([cache] memo_size), summed over the processes.",
    "prexy_applicability_bytes": "Bytes the rule-applicability memory holds, summed over the processes.",
    "prexy_applicability_max_bytes": "The rule-applicability memory's bound ([server] applicability_memory), summed"
    " over the processes.",
    "prexy_open_connections": "Client connections open.",
    "prexy_active_requests": "Requests being answered.",
    "prexy_workers": "Worker processes serving.",
    "prexy_worker_generation": "Generations of workers started (each reload that restarts them adds one).",
    "prexy_cluster_up": "1 when this node is linked to the cluster's Redis, else 0.",
    "prexy_cluster_queued": "Invalidations waiting for Redis to come back.",
    "prexy_cluster_dropped": "Invalidations dropped because the queue for Redis was full.",
    "prexy_site_requests_total": "Requests by site (the most requested sites; the rest as site=\"other\").",
    "prexy_site_responses_total": "Responses by site and status class.",
    "prexy_site_bytes_out_total": "Response body bytes sent to clients, by site.",
    "prexy_site_bytes_in_total": "Response body bytes received from upstreams, by site.",
    "prexy_site_cache_total": "Requests by site and what they were answered from (hit: the cache, grace"
    " included; miss: fetched for it; pass: fetched without it, or no cache).",
    "prexy_site_upstream_seconds_total": "Time to the upstreams' response heads, summed, by site.",
    "prexy_site_rewrite_seconds_total": "Time the rules took, summed, by site.",
    "prexy_site_rewritten_total": "Responses the site's rules ran on, by site.",
    "prexy_site_errors_total": "Error answers by site and class (4xx, 5xx; upstream: a 502 or 504 for a failed"
    " upstream).",
    "prexy_request_seconds": "Time from a request's head to its answer's last byte, by what the cache did"
    " (hit: from the cache; miss: fetched for it; pass: fetched, not cached).",
    "prexy_rewrite_seconds": "Time the rules took per rewritten response.",
    "prexy_rule_matches_total": "Substitutions made by each rule (numbered from 1 in its site's rule set).",
    "prexy_rule_responses_total": "Rewritten responses in which each rule fired.",
    "prexy_rule_bytes_changed_total": "Bytes of upstream bodies each rule's substitutions replaced.",
    "prexy_rule_bailouts_total": "Responses whose substitution stopped at max_buffered_size while this rule was"
    " matching.",
    "prexy_rule_timeouts_total": "Responses whose scan timed out on this rule.",
    "prexy_rule_last_fired_timestamp_seconds": "When each rule last fired (UNIX time; 0: never).",
    "prexy_process_cpu_seconds_total": "CPU time of each Prexy process (user and system).",
    "prexy_process_resident_memory_bytes": "Resident memory of each Prexy process.",
    "prexy_process_open_fds": "Open file descriptors of each Prexy process.",
    "prexy_process_memo_bytes": "Bytes each serving process's memos hold (at most [cache] memo_size): a process is"
    " past its warm-up once these stop growing.",
}

LabelKey = tuple[str, tuple[tuple[str, str], ...]]


class Metrics:
    """Process-local counters and histogram."""

    def __init__(self) -> None:
        self.counters: Counter[LabelKey] = Counter()
        self.bytes_out = 0
        self.bytes_in = 0
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS) + 1)
        self.latency_sum = 0.0
        self.latency_count = 0
        #: Levels this process reports (open connections...): summed over processes.
        self.gauges: dict[str, float] = {}
        #: Levels with labels (the memos' bytes by memo), summed the same way.
        self.levels: dict[LabelKey, float] = {}
        # The label keys of the counters every request bumps, made once.
        self._status_keys: dict[int, LabelKey] = {}
        self._protocol_keys: dict[bytes, LabelKey] = {}
        self._cache_keys: dict[str, LabelKey] = {}

    def count(self, name: str, amount: int = 1, **labels: str) -> None:
        self.counters[(name, tuple(sorted(labels.items())))] += amount

    def level(self, name: str, value: float, **labels: str) -> None:
        """Set a level with labels (``levels``)."""
        self.levels[(name, tuple(sorted(labels.items())))] = value

    def count_status(self, code: int) -> None:
        key = self._status_keys.get(code)
        if key is None:
            key = self._status_keys[code] = ("prexy_requests_total", (("status", str(code)),))
        self.counters[key] += 1

    def count_cache(self, result: str) -> None:
        """One request by what the cache did (``prexy_cache_total``)."""
        key = self._cache_keys.get(result)
        if key is None:
            key = self._cache_keys[result] = ("prexy_cache_total", (("result", result),))
        self.counters[key] += 1

    def count_answer(self, code: int, proto: bytes) -> None:
        """One finished request, by its status and by the client's protocol."""
        self.count_status(code)
        key = self._protocol_keys.get(proto)
        if key is None:
            label = "HTTP/2.0" if proto == b"HTTP/2" else proto.decode("latin-1")
            key = self._protocol_keys[proto] = ("prexy_requests_by_protocol_total", (("protocol", label),))
        self.counters[key] += 1

    def observe_upstream(self, seconds: float) -> None:
        self.latency_sum += seconds
        self.latency_count += 1
        # The first bucket whose bound is >= seconds; past every bound, +Inf.
        self.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1

    def snapshot(self) -> dict[str, object]:
        """A JSON-able copy (what a worker reports to the master)."""
        return {
            "counters": [[n, [list(kv) for kv in labels], v] for (n, labels), v in self.counters.items()],
            "bytes_out": self.bytes_out,
            "bytes_in": self.bytes_in,
            "latency_buckets": list(self.latency_buckets),
            "latency_sum": self.latency_sum,
            "latency_count": self.latency_count,
            "gauges": dict(self.gauges),
            "levels": [[n, [list(kv) for kv in labels], v] for (n, labels), v in self.levels.items()],
        }

    def merge(self, snapshot: Mapping[str, object], levels: bool = True) -> None:
        """Add a snapshot (from another process) into this one; without
        ``levels``, its counts only (a process that ended: what it counted
        stays, its levels went with it)."""
        snap: Any = snapshot
        for name, labels, value in snap["counters"]:
            self.counters[(name, tuple(tuple(kv) for kv in labels))] += value
        self.bytes_out += int(snap["bytes_out"])
        self.bytes_in += int(snap.get("bytes_in", 0))
        for i, v in enumerate(snap["latency_buckets"]):
            self.latency_buckets[i] += v
        self.latency_sum += float(snap["latency_sum"])
        self.latency_count += int(snap["latency_count"])
        if not levels:
            return
        for name, value in snap.get("gauges", {}).items():
            self.gauges[name] = self.gauges.get(name, 0.0) + value
        for name, labels, value in snap.get("levels", ()):
            key = (name, tuple(tuple(kv) for kv in labels))
            self.levels[key] = self.levels.get(key, 0.0) + value


def render(
    metrics: Iterable[Metrics],
    extra: Mapping[str, float] | None = None,
    observed: Aggregate | None = None,
    top_sites: int = 20,
    processes: Sequence[tuple[str, int | None]] = (),
    memo: Mapping[str, float] | None = None,
) -> bytes:
    """Prometheus text exposition of the sum of ``metrics``, the gauges
    ``extra``, the per-site and per-rule counters of ``observed`` (the
    ``top_sites`` most requested sites by name, the rest as ``other``), and
    the resource use of ``processes`` ((role, pid): the master's, the
    workers'), with the bytes each one's memos hold (``memo``, by role:
    see :func:`memo_held`), through ``prometheus_client``'s exposition."""
    from prometheus_client.exposition import generate_latest

    return generate_latest(_Collected(_families(metrics, extra, observed, top_sites, processes, memo or {})))


def memo_held(snapshot: Mapping[str, object]) -> float:
    """The bytes a process's memos hold, from its snapshot: its
    ``prexy_memo_bytes`` levels summed."""
    levels: Any = snapshot.get("levels", ())
    return float(sum(value for name, _labels, value in levels if name == "prexy_memo_bytes"))


class _Collected:
    """Families made already, as a registry gives them to the exposition."""

    def __init__(self, families: list[Any]) -> None:
        self._families = families

    def collect(self) -> list[Any]:
        return self._families


def _counter_name(name: str) -> str:
    """A counter family's name without ``_total`` (the exposition adds it)."""
    return name[: -len("_total")] if name.endswith("_total") else name


def _families(
    metrics: Iterable[Metrics], extra: Mapping[str, float] | None, observed: Aggregate | None, top_sites: int,
    processes: Sequence[tuple[str, int | None]], memo: Mapping[str, float],
) -> list[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    from prexy import __version__

    total = Metrics()
    for m in metrics:
        total.merge(m.snapshot())
    families: list[Any] = []
    info = GaugeMetricFamily("prexy_build_info", "Prexy's version (always 1).", labels=["version"])
    info.add_metric([__version__], 1)
    families.append(info)
    by_name: dict[str, list[tuple[tuple[tuple[str, str], ...], int]]] = {}
    for (name, labels), value in sorted(total.counters.items()):
        by_name.setdefault(name, []).append((labels, value))
    for name, rows in by_name.items():
        family = CounterMetricFamily(_counter_name(name), HELP.get(name, name), labels=[k for k, _ in rows[0][0]])
        for labels, value in rows:
            family.add_metric([v for _, v in labels], value)
        families.append(family)
    families.append(CounterMetricFamily("prexy_bytes_out", HELP["prexy_bytes_out_total"], value=total.bytes_out))
    families.append(CounterMetricFamily("prexy_bytes_in", HELP["prexy_bytes_in_total"], value=total.bytes_in))
    families.append(_histogram(
        HistogramMetricFamily, "prexy_upstream_seconds", HELP["prexy_upstream_seconds"], [],
        [([], LATENCY_BUCKETS, total.latency_buckets, total.latency_sum)],
    ))
    for gauge, amount in sorted({**total.gauges, **(extra or {})}.items()):
        families.append(GaugeMetricFamily(gauge, HELP.get(gauge, gauge), value=amount))
    levels: dict[str, list[tuple[tuple[tuple[str, str], ...], float]]] = {}
    for (name, labels), amount in sorted(total.levels.items()):
        levels.setdefault(name, []).append((labels, amount))
    for name, level_rows in levels.items():
        level = GaugeMetricFamily(name, HELP.get(name, name), labels=[k for k, _ in level_rows[0][0]])
        for labels, amount in level_rows:
            level.add_metric([v for _, v in labels], amount)
        families.append(level)
    if observed is not None:
        families.extend(_observed_families(observed, top_sites))
    if processes:
        families.extend(_process_families(processes, memo))
    return families


def _histogram(
    kind: Any, name: str, help_text: str, label_names: list[str],
    rows: Iterable[tuple[list[str], Sequence[float], Sequence[int], float]],
) -> Any:
    family = kind(name, help_text, labels=label_names)
    for labels, bounds, counts, total in rows:
        buckets: list[tuple[str, float]] = []
        cumulative = 0
        for bound, count in zip(bounds, counts, strict=False):
            cumulative += count
            buckets.append((repr(float(bound)), cumulative))
        cumulative += counts[-1]
        buckets.append(("+Inf", cumulative))
        family.add_metric(labels, buckets, total)
    return family


def _observed_families(observed: Aggregate, top_sites: int) -> list[Any]:
    """Per-site families (the top sites, the rest as ``other``), the
    total-time and rewrite-time histograms, and per-rule families of the
    top sites."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    from prexy.observe.stats import LATENCY_BOUNDS, LATENCY_CLASSES

    head, other = observed.top_sites(top_sites)
    rows = head + ([("other", other)] if other is not None else [])
    requests = CounterMetricFamily("prexy_site_requests", HELP["prexy_site_requests_total"], labels=["site"])
    responses = CounterMetricFamily(
        "prexy_site_responses", HELP["prexy_site_responses_total"], labels=["site", "class"],
    )
    sent = CounterMetricFamily("prexy_site_bytes_out", HELP["prexy_site_bytes_out_total"], labels=["site"])
    received = CounterMetricFamily("prexy_site_bytes_in", HELP["prexy_site_bytes_in_total"], labels=["site"])
    cache = CounterMetricFamily("prexy_site_cache", HELP["prexy_site_cache_total"], labels=["site", "result"])
    upstream = CounterMetricFamily(
        "prexy_site_upstream_seconds", HELP["prexy_site_upstream_seconds_total"], labels=["site"],
    )
    rewrite = CounterMetricFamily(
        "prexy_site_rewrite_seconds", HELP["prexy_site_rewrite_seconds_total"], labels=["site"],
    )
    rewritten = CounterMetricFamily("prexy_site_rewritten", HELP["prexy_site_rewritten_total"], labels=["site"])
    errors = CounterMetricFamily("prexy_site_errors", HELP["prexy_site_errors_total"], labels=["site", "class"])
    for name, t in rows:
        requests.add_metric([name], t[0])
        for k in range(1, 6):
            responses.add_metric([name, f"{k}xx"], t[7][k])
        sent.add_metric([name], t[2])
        received.add_metric([name], t[3])
        counts = t[8]
        for result in LATENCY_CLASSES:
            cache.add_metric([name, result], counts.get(result, 0))
        upstream.add_metric([name], t[4])
        rewrite.add_metric([name], t[6])
        rewritten.add_metric([name], t[1])
        errors.add_metric([name, "4xx"], t[7][4])
        errors.add_metric([name, "5xx"], t[7][5])
        errors.add_metric([name, "upstream"], t[11])
    families: list[Any] = [requests, responses, sent, received, cache, upstream, rewrite, rewritten, errors]
    everything = observed.all_sites()
    families.append(_histogram(
        HistogramMetricFamily, "prexy_request_seconds", HELP["prexy_request_seconds"], ["cache"],
        [([cls], LATENCY_BOUNDS, everything[9][i], everything[13][i]) for i, cls in enumerate(LATENCY_CLASSES)],
    ))
    families.append(_histogram(
        HistogramMetricFamily, "prexy_rewrite_seconds", HELP["prexy_rewrite_seconds"], [],
        [([], LATENCY_BOUNDS, everything[12], everything[6])],
    ))
    matches = CounterMetricFamily("prexy_rule_matches", HELP["prexy_rule_matches_total"], labels=["site", "rule"])
    fired = CounterMetricFamily("prexy_rule_responses", HELP["prexy_rule_responses_total"], labels=["site", "rule"])
    changed = CounterMetricFamily(
        "prexy_rule_bytes_changed", HELP["prexy_rule_bytes_changed_total"], labels=["site", "rule"],
    )
    bailouts = CounterMetricFamily("prexy_rule_bailouts", HELP["prexy_rule_bailouts_total"], labels=["site", "rule"])
    timeouts = CounterMetricFamily("prexy_rule_timeouts", HELP["prexy_rule_timeouts_total"], labels=["site", "rule"])
    last = GaugeMetricFamily(
        "prexy_rule_last_fired_timestamp_seconds", HELP["prexy_rule_last_fired_timestamp_seconds"],
        labels=["site", "rule"],
    )
    for site, number, _label, summed, i in observed.rule_rows(name for name, _ in head):
        labels = [site, str(number)]
        matches.add_metric(labels, summed["matches"][i])
        fired.add_metric(labels, summed["responses"][i])
        changed.add_metric(labels, summed["bytes"][i])
        bailouts.add_metric(labels, summed["bailouts"][i])
        timeouts.add_metric(labels, summed["timeouts"][i])
        last.add_metric(labels, summed["last"][i])
    families.extend([matches, fired, changed, bailouts, timeouts, last])
    return families


def _process_families(processes: Sequence[tuple[str, int | None]], memo: Mapping[str, float]) -> list[Any]:
    """CPU, memory and descriptors of each process, from ``/proc``
    (nothing where there is none), and the bytes its memos hold (where
    ``memo`` has its role)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    cpu = CounterMetricFamily("prexy_process_cpu_seconds", HELP["prexy_process_cpu_seconds_total"], labels=["process"])
    rss = GaugeMetricFamily(
        "prexy_process_resident_memory_bytes", HELP["prexy_process_resident_memory_bytes"], labels=["process"],
    )
    fds = GaugeMetricFamily("prexy_process_open_fds", HELP["prexy_process_open_fds"], labels=["process"])
    for role, pid in processes:
        if pid is None:
            continue
        used = process_usage(pid)
        if used is None:
            continue
        cpu.add_metric([role], used[0])
        rss.add_metric([role], used[1])
        fds.add_metric([role], used[2])
    held = GaugeMetricFamily("prexy_process_memo_bytes", HELP["prexy_process_memo_bytes"], labels=["process"])
    for role, _pid in processes:
        if role in memo:
            held.add_metric([role], memo[role])
    return [cpu, rss, fds, held]


def process_usage(pid: int) -> tuple[float, int, int] | None:
    """(CPU seconds, resident bytes, open descriptors) of ``pid``, from
    ``/proc``; None when it cannot be read."""
    import os

    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        page = os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return None
    # After the command: state is field 3, utime 14, stime 15, rss 24 (man 5 proc).
    return (int(fields[11]) + int(fields[12])) / ticks, int(fields[21]) * page, fds


def cache_gauges(store: Any) -> dict[str, float]:
    """The cache store's levels for ``/metrics`` (none without a store)."""
    if store is None:
        return {}
    try:
        stats = store.stats()
    except Exception:  # closed, or its directory went away: said in the log elsewhere
        return {}
    return {
        "prexy_cache_objects": float(stats["count"]),
        "prexy_cache_bytes": float(stats["bytes"]),
        "prexy_cache_max_bytes": float(stats["max_bytes"]),
    }
