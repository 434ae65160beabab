"""Counters and a latency histogram, rendered in Prometheus text format.

One ``Metrics`` per process; the admin endpoint renders it (and, with a
worker pool, the master sums what the workers report).  Pure Python, no
Twisted, cheap enough to touch on every request.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

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
        # The label keys of the counters every request bumps, made once.
        self._status_keys: dict[int, LabelKey] = {}
        self._protocol_keys: dict[bytes, LabelKey] = {}
        self._cache_keys: dict[str, LabelKey] = {}

    def count(self, name: str, amount: int = 1, **labels: str) -> None:
        self.counters[(name, tuple(sorted(labels.items())))] += amount

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
        }

    def merge(self, snapshot: Mapping[str, object]) -> None:
        """Add a snapshot (from another process) into this one."""
        snap: Any = snapshot
        for name, labels, value in snap["counters"]:
            self.counters[(name, tuple(tuple(kv) for kv in labels))] += value
        self.bytes_out += int(snap["bytes_out"])
        self.bytes_in += int(snap.get("bytes_in", 0))
        for i, v in enumerate(snap["latency_buckets"]):
            self.latency_buckets[i] += v
        self.latency_sum += float(snap["latency_sum"])
        self.latency_count += int(snap["latency_count"])


def render(metrics: Iterable[Metrics], extra: Mapping[str, float] | None = None) -> bytes:
    """Prometheus text exposition of the sum of ``metrics``."""
    total = Metrics()
    for m in metrics:
        total.merge(m.snapshot())
    lines: list[str] = []
    by_name: dict[str, list[tuple[tuple[tuple[str, str], ...], int]]] = {}
    for (name, labels), value in sorted(total.counters.items()):
        by_name.setdefault(name, []).append((labels, value))
    for name, rows in by_name.items():
        lines.append(f"# HELP {name} {HELP.get(name, name)}")
        lines.append(f"# TYPE {name} counter")
        for labels, value in rows:
            label_text = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"{name}{{{label_text}}} {value}" if label_text else f"{name} {value}")
    lines.append(f"# HELP prexy_bytes_out_total {HELP['prexy_bytes_out_total']}")
    lines.append("# TYPE prexy_bytes_out_total counter")
    lines.append(f"prexy_bytes_out_total {total.bytes_out}")
    lines.append("# HELP prexy_bytes_in_total Response body bytes received from upstreams.")
    lines.append("# TYPE prexy_bytes_in_total counter")
    lines.append(f"prexy_bytes_in_total {total.bytes_in}")
    lines.append("# HELP prexy_upstream_seconds Time to the upstream's response head.")
    lines.append("# TYPE prexy_upstream_seconds histogram")
    cumulative = 0
    for bound, count in zip(LATENCY_BUCKETS, total.latency_buckets[:-1], strict=True):
        cumulative += count
        lines.append(f'prexy_upstream_seconds_bucket{{le="{bound}"}} {cumulative}')
    cumulative += total.latency_buckets[-1]
    lines.append(f'prexy_upstream_seconds_bucket{{le="+Inf"}} {cumulative}')
    lines.append(f"prexy_upstream_seconds_sum {total.latency_sum}")
    lines.append(f"prexy_upstream_seconds_count {total.latency_count}")
    for gauge, amount in (extra or {}).items():
        lines.append(f"# TYPE {gauge} gauge")
        lines.append(f"{gauge} {amount}")
    return ("\n".join(lines) + "\n").encode("utf-8")
